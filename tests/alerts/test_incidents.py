"""Incident book: open -> remind -> resolve, ack, mute, one incident per (job, kind); all with a fake clock."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from jobdiagd.alerts.incidents import IncidentBook, parse_finding_body, render_finding_body
from jobdiagd.alerts.store import AlertStore
from jobdiagd.durations import rounded_duration
from jobdiagd.model.alerts import Finding

T0 = 1_800_000_000.0
HOUR = 3600.0


def hang(
    job: str = "123", step: int = 316, severity: str = "critical", resolved: bool = False, summary: str = ""
) -> Finding:
    return Finding(
        detector="hang",
        job_id=job,
        kind="hang",
        severity=severity,  # type: ignore[arg-type]
        summary=summary or ("steps resumed" if resolved else f"no step since step {step}"),
        details={"expected_step": 400},
        evidence=(f"completed step: {step}, seconds: 31.2",),
        at_step=step,
        resolved=resolved,
    )


def tgs(job: str = "123") -> Finding:
    return Finding("tgs", job, "tgs-degradation", "warning", "TGS 3290 -> 2520 (-23%)")


def book(**kw: object) -> IncidentBook:
    return IncidentBook(reminder_interval=HOUR, **kw)  # type: ignore[arg-type]


def test_open_remind_resolve() -> None:
    b = book()
    [n] = b.observe(hang(), T0)
    assert (n.event, n.id, n.severity) == ("open", "123:hang:1:open", "critical")
    assert n.title == "hang on job 123"
    assert "no step since step 316" in n.body and "completed step: 316" in n.body

    # Still hung, before the interval: silence.
    assert b.observe(hang(), T0 + 15) == []
    assert b.observe(hang(), T0 + HOUR - 1) == []
    [r] = b.observe(hang(), T0 + HOUR)
    assert (r.event, r.id) == ("remind", "123:hang:1:remind:1")
    assert "open 60 min" in r.title
    # The next reminder counts from the last one, not from the opening.
    assert b.observe(hang(), T0 + 2 * HOUR - 1) == []
    [r2] = b.observe(hang(), T0 + 2 * HOUR)
    assert r2.id == "123:hang:1:remind:2"

    [done] = b.observe(
        hang(step=317, resolved=True, summary="steps resumed at step 317"), T0 + 2 * HOUR + 12 * 60
    )
    assert done.event == "resolve"
    assert done.title == "hang on job 123"  # the notifier shows the event; the title names the condition
    assert done.body == "steps resumed at step 317 after 2 h 12 min"
    assert b.get("123", "hang") is None
    assert b.open_incidents() == []
    # A second resolve, or a resolve for something never open, says nothing.
    assert b.observe(hang(resolved=True), T0 + 3 * HOUR) == []


def test_one_incident_per_job_and_kind() -> None:
    b = book()
    assert len(b.observe(hang("1"), T0)) == 1
    assert b.observe(hang("1"), T0 + 1) == []
    assert len(b.observe(hang("2"), T0 + 2)) == 1
    assert len(b.observe(tgs("1"), T0 + 3)) == 1
    assert sorted((i.job_id, i.kind) for i in b.open_incidents()) == [
        ("1", "hang"),
        ("1", "tgs-degradation"),
        ("2", "hang"),
    ]


def test_reopen_after_resolve_gets_new_incident_id() -> None:
    b = book()
    b.observe(hang(), T0)
    b.observe(hang(resolved=True), T0 + 60)
    [n] = b.observe(hang(), T0 + 120)
    assert n.id == "123:hang:2:open"
    assert n.incident_id == "123:hang:2"


def test_ack_stops_reminders_but_not_resolution() -> None:
    b = book()
    b.observe(hang(), T0)
    inc = b.ack("123", "hang", T0 + 10, by="alice")
    assert inc is not None and inc.acked_by == "alice"
    assert b.observe(hang(), T0 + 5 * HOUR) == []
    [n] = b.observe(hang(resolved=True), T0 + 6 * HOUR)
    assert n.event == "resolve"
    assert b.ack("123", "hang", T0 + 7 * HOUR) is None  # nothing open


def test_escalation_notifies_once_even_when_acked() -> None:
    b = book()
    b.observe(hang(severity="warning"), T0)
    b.ack("123", "hang", T0 + 1)
    [n] = b.observe(hang(severity="critical"), T0 + 60)
    assert (n.event, n.id, n.severity) == ("remind", "123:hang:1:escalate:critical", "critical")
    assert b.observe(hang(severity="critical"), T0 + 120) == []
    assert b.observe(hang(severity="warning"), T0 + 180) == []
    assert b.get("123", "hang").severity == "critical"  # type: ignore[union-attr]


def test_mute_suppresses_then_unmute_announces() -> None:
    b = book()
    b.mute("123", "*", until=T0 + HOUR, now=T0)
    assert b.observe(hang(), T0 + 10) == []
    assert b.get("123", "hang") is not None  # tracked while muted
    assert b.observe(tgs("999"), T0 + 10) != []  # another job is not muted
    b.unmute("123", "*", T0 + 20)
    [n] = b.observe(hang(), T0 + 30)
    assert n.event == "open"
    assert n.created_at == T0 + 30


def test_mute_expires_by_itself() -> None:
    b = book()
    b.mute("123", "hang", until=T0 + 100, now=T0)
    assert b.observe(hang(), T0 + 50) == []
    assert b.observe(tgs(), T0 + 50) != []  # only the muted kind
    [n] = b.observe(hang(), T0 + 100)
    assert n.event == "open"


def test_resolution_of_unannounced_incident_is_silent() -> None:
    b = book()
    b.mute("*", "hang", until=T0 + HOUR, now=T0)
    b.observe(hang(), T0 + 1)
    assert b.observe(hang(resolved=True), T0 + 2 * HOUR) == []
    assert b.open_incidents() == []


def test_muted_open_incident_sends_no_reminders() -> None:
    b = book()
    b.observe(hang(), T0)
    b.mute("123", "*", until=T0 + 10 * HOUR, now=T0 + 1)
    assert b.observe(hang(), T0 + 5 * HOUR) == []
    # Resolved while muted: no page, only a silent edit of the incident's chat message.
    (edit,) = b.observe(hang(resolved=True), T0 + 6 * HOUR)
    assert edit.event == "update" and edit.severity == "info"
    assert edit.incident is not None and edit.incident["resolved_at"] == T0 + 6 * HOUR


def test_job_end_resolves_all_incidents_of_the_job() -> None:
    b = book()
    b.observe(hang("1"), T0)
    b.observe(tgs("1"), T0)
    b.observe(hang("2"), T0)
    b.mute("1", "other", until=T0 + 10 * HOUR, now=T0)
    notes = b.job_ended("1", T0 + 30 * 60, "CANCELLED")
    assert sorted(n.kind for n in notes) == ["hang", "tgs-degradation"]
    assert all(n.event == "resolve" and n.body == "job ended (CANCELLED) after 30 min" for n in notes)
    assert [i.job_id for i in b.open_incidents()] == ["2"]
    assert b.active_mutes(T0) == []


def test_max_reminders() -> None:
    b = book(max_reminders=1)
    b.observe(hang(), T0)
    assert len(b.observe(hang(), T0 + HOUR)) == 1
    assert b.observe(hang(), T0 + 5 * HOUR) == []


def test_resolve_notifications_can_be_turned_off() -> None:
    b = book(notify_resolve=False)
    b.observe(hang(), T0)
    assert [n.event for n in b.observe(hang(resolved=True), T0 + 60)] == ["update"]  # edit, no page
    assert b.open_incidents() == []


def test_state_survives_a_reload() -> None:
    b = book()
    b.observe(hang(), T0)
    b.observe(hang(), T0 + HOUR)
    b.mute("7", "*", until=T0 + 10 * HOUR, now=T0)
    changes = b.take_changes()
    assert [i.reminders_sent for i in changes.incidents] == [1]
    assert changes.mutes is not None
    assert b.take_changes().incidents == []  # taken once

    again = IncidentBook(reminder_interval=HOUR, incidents=changes.incidents, mutes=changes.mutes)
    # Same incident, same reminder count: the next reminder id does not repeat the old one.
    assert again.observe(hang(), T0 + HOUR + 1) == []
    [r] = again.observe(hang(), T0 + 2 * HOUR)
    assert r.id == "123:hang:1:remind:2"
    assert again.is_muted("7", "x", T0 + 1)


def test_format_duration() -> None:
    assert [rounded_duration(s) for s in (5, 89, 90, 12 * 60, 89 * 60, 90 * 60, 3 * 86400 + 7200)] == [
        "5 s",
        "89 s",
        "2 min",
        "12 min",
        "89 min",
        "1 h 30 min",
        "3 d 2 h",
    ]


def test_the_owner_of_the_opening_finding_stays_with_the_incident(tmp_path: Path) -> None:
    b = book()
    b.observe(replace(hang(), owner="dave"), T0)
    b.observe(replace(hang(), owner="someone-else"), T0 + 60)  # labels built from it must not change
    (inc,) = b.open_incidents()
    assert inc.owner == "dave"
    store = AlertStore.in_state_dir(tmp_path)
    store.save_incidents(b.take_changes().incidents)
    store.close()
    reloaded = AlertStore.in_state_dir(tmp_path)
    assert [i.owner for i in reloaded.load_incidents()] == ["dave"]
    reloaded.close()


def test_a_finding_body_reads_back_as_its_summary_facts_and_evidence() -> None:
    f = replace(hang(), details={"triage": "a hang: all ranks wait", "last step": 316, "note": "a: b"})
    parsed = parse_finding_body(render_finding_body(f))
    assert parsed is not None
    assert parsed.summary == "no step since step 316"
    assert parsed.facts == (
        ("detector", "hang"),
        ("step", "316"),
        ("triage", "a hang: all ranks wait"),
        ("last step", "316"),
        ("note", "a: b"),
    )
    assert parsed.evidence == ("completed step: 316, seconds: 31.2",)
    no_evidence = parse_finding_body(render_finding_body(replace(f, evidence=())))
    assert no_evidence is not None and no_evidence.evidence == ()
    # Anything else is not a finding's body: a resolution, a notice, a body edited by hand.
    for other in ("steps resumed at step 40", "`x` cannot be read.\n\nno facts here", "", "a\n\n- b"):
        assert parse_finding_body(other) is None
