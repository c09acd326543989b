"""What the Alertmanager notifier posts, from plain data: labels, annotations, times, conditions."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from jobdiagd.alerts.outbox import Outbox
from jobdiagd.alerts.store import AlertStore
from jobdiagd.model.alerts import DaemonCondition, Incident, Notification
from jobdiagd.notifiers.alertmanager import (
    MAX_DESCRIPTION,
    AlertOptions,
    alert_name,
    condition_alert,
    incident_alert,
    incident_labels,
    iso,
    rejected_for_good,
    resolved_alert,
    watchdog_alert,
)
from jobdiagd.service.alert_sync import conditions_from_status

T0 = 1_800_000_000.0
OPTS = AlertOptions(cluster="frontier", instance="login1", resend_interval=60.0)


def incident(**kw: object) -> Incident:
    base = Incident(
        id="812:hang:3",
        job_id="812",
        kind="hang",
        seq=3,
        detector="hang",
        severity="critical",
        summary="no step since step 316 for 12 min",
        opened_at=T0,
        last_seen_at=T0 + 30,
        owner="alice",
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def note(inc: Incident, body: str, event: str = "open") -> Notification:
    return Notification(
        f"{inc.id}:{event}",
        inc.job_id,
        inc.kind,
        event,
        "t",
        body,
        T0,
        inc.severity,
        inc.id,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("hang", "JobdiagdHang"),
        ("failure", "JobdiagdFailure"),
        ("tgs-degradation", "JobdiagdTgsDegradation"),
        ("source-failing", "JobdiagdSourceFailing"),
        ("odd__kind 2", "JobdiagdOddKind2"),
    ],
)
def test_alertname_is_the_kind_in_camel_case(kind: str, name: str) -> None:
    assert alert_name(kind) == name


def test_labels_hold_only_what_both_daemons_of_a_pair_agree_on() -> None:
    mine = incident()
    # The other daemon of an HA pair numbered its incidents differently and saw it a tick later.
    theirs = incident(id="812:hang:1", seq=1, opened_at=T0 + 15, last_seen_at=T0 + 40, summary="other text")
    assert (
        incident_labels(mine, OPTS)
        == incident_labels(theirs, OPTS)
        == {
            "alertname": "JobdiagdHang",
            "cluster": "frontier",
            "job_id": "812",
            "kind": "hang",
            "severity": "critical",
            "owner": "alice",
            "source": "jobdiagd",
        }
    )
    assert "owner" not in incident_labels(incident(owner=None), OPTS)  # unknown: absent, not ""


def test_an_open_incident_is_valid_for_four_intervals_and_starts_when_it_opened() -> None:
    inc = incident(acked_at=T0 + 100, acked_by="bob")
    body = "no step since step 316 for 12 min\n\n- **detector**: hang\n\n```text\nNCCL WARN\n```"
    a = incident_alert(
        inc, note(inc, body), replace(OPTS, runbook_url="https://wiki/jd#{kind}-{cluster}"), T0 + 500
    )
    assert a["startsAt"] == iso(T0) and a["endsAt"] == iso(T0 + 500 + 240)
    ann = a["annotations"]
    assert ann["summary"] == "hang on job 812: no step since step 316 for 12 min"
    assert ann["description"] == body and ann["incident_id"] == "812:hang:3"
    assert ann["runbook_url"] == "https://wiki/jd#hang-frontier"
    assert ann["acknowledged_by"] == f"bob at {iso(T0 + 100)}"
    assert "generatorURL" not in a


def test_a_resolved_incident_ends_at_its_resolution_with_the_resolution_text() -> None:
    inc = incident(resolved_at=T0 + 720, resolution="steps resumed at step 317 after 12 min")
    a = incident_alert(inc, None, OPTS, T0 + 9999)
    assert (a["startsAt"], a["endsAt"]) == (iso(T0), iso(T0 + 720))
    assert a["labels"]["severity"] == "critical"
    assert a["annotations"]["summary"] == "hang on job 812 resolved: steps resumed at step 317 after 12 min"


def test_a_long_triage_is_cut_and_says_so() -> None:
    inc = incident()
    a = incident_alert(inc, note(inc, "x" * 50_000), OPTS, T0)
    desc = a["annotations"]["description"]
    assert len(desc) <= MAX_DESCRIPTION and desc.endswith("(cut at 4000 of 50000 characters)")


def test_generator_url_names_the_job() -> None:
    a = incident_alert(incident(), None, replace(OPTS, generator_url="https://g/d?var-job={job_id}"), T0)
    assert a["generatorURL"] == "https://g/d?var-job=812"


def test_resolved_alert_never_ends_before_it_starts() -> None:
    a = resolved_alert({"alertname": "X"}, T0 + 10, T0)
    assert a["startsAt"] == a["endsAt"] == iso(T0 + 10)


def test_daemon_alerts_carry_the_instance_and_the_watchdog_always_fires() -> None:
    c = DaemonCondition("monitoring-blind", "warning", "job 9: log unreadable", "cannot read: /x", job_id="9")
    a = condition_alert(c, OPTS, T0)
    assert a["labels"] == {
        "alertname": "JobdiagdMonitoringBlind",
        "cluster": "frontier",
        "instance": "login1",
        "job_id": "9",
        "severity": "warning",
        "source": "jobdiagd",
    }
    w = watchdog_alert(OPTS, T0)
    assert w["labels"]["alertname"] == "JobdiagdWatchdog" and w["labels"]["severity"] == "none"
    assert w["endsAt"] == iso(T0 + 240)


@pytest.mark.parametrize(
    ("status", "for_good"),
    [
        (400, True),
        (413, True),
        (422, True),
        (401, False),
        (403, False),
        (404, False),
        (429, False),
        (500, False),
        (503, False),
        (302, False),
    ],
)
def test_only_content_rejections_drop_a_message(status: int, for_good: bool) -> None:
    assert rejected_for_good(status) is for_good


def test_conditions_from_the_status_snapshot() -> None:
    healthy = {"tick_seconds": 15, "started_at": T0, "last_tick_at": T0 + 100, "last_tick_ok": True}
    assert conditions_from_status(healthy, T0 + 110) == []
    status = {
        **healthy,
        "sources": {
            "squeue": {"failing": True, "failing_since": T0 + 50, "last_error": "exit 1: no controller"},
            "outputs": {"failing": False},
        },
        "jobs": [{"job_id": "7", "blind": ["/o/7.log"]}, {"job_id": "8", "blind": []}],
        "notifiers": {
            "telegram": {"failing": True, "failing_since": T0 + 60, "last_error": "HTTP 502"},
            "alertmanager": {"failing": True, "failing_since": T0 + 60, "last_error": "down"},
        },
    }
    got = conditions_from_status(status, T0 + 110, skip_notifiers=("alertmanager",))
    assert [(c.name, c.job_id, c.component, c.severity) for c in got] == [
        ("source-failing", None, "squeue", "warning"),
        ("monitoring-blind", "7", None, "warning"),
        ("notifier-failing", None, "telegram", "warning"),
    ]
    assert got[0].since == T0 + 50 and "no controller" in got[0].description
    assert "/o/7.log" in got[1].description
    stale = conditions_from_status({**healthy, "last_tick_ok": False}, T0 + 200)
    assert [(c.name, c.severity) for c in stale] == [("unhealthy", "critical")]
    assert "last tick" in stale[0].description


def test_one_incident_by_id_open_or_resolved(tmp_path: Path) -> None:
    store = AlertStore.in_state_dir(tmp_path)
    done = incident(resolved_at=T0 + 60, resolution="job ended (CANCELLED) after 1 min")
    store.save_incidents([done])
    assert store.load_incident("812:hang:3") == done and store.load_incidents() == []
    assert store.load_incident("812:hang:33") is None
    store.close()


def test_latest_text_of_an_incident_ignores_its_neighbours(tmp_path: Path) -> None:
    store = AlertStore.in_state_dir(tmp_path)
    box = Outbox(store, ["alertmanager"])
    a1, a10 = incident(id="12:hang:1", job_id="12"), incident(id="12:hang:10", job_id="12")
    box.enqueue(
        [
            replace(note(a1, "first"), created_at=T0),
            replace(note(a1, "second", "remind"), id="12:hang:1:remind:1", created_at=T0 + 60),
            replace(note(a10, "other incident"), created_at=T0 + 120),
            replace(note(a1, "resumed", "resolve"), id="12:hang:1:resolve", created_at=T0 + 180),
        ],
        T0,
    )
    latest = box.latest_for_incident("12:hang:1")
    assert latest is not None and latest.body == "second"
    assert box.latest_for_incident("12:hang:2") is None
    store.close()
