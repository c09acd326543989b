"""The incident book: findings in, open/remind/resolve notifications out; one incident per (job, kind)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from jobdiagd.config import IncidentsConfig
from jobdiagd.durations import rounded_duration
from jobdiagd.model.alerts import SEVERITY_RANK, Event, Finding, Incident, Mute, Notification, Severity
from jobdiagd.model.kinds import IncidentKind

ALL = "*"


def render_finding_body(finding: Finding) -> str:
    """Markdown body for a finding: summary, a short fact list, and the evidence lines verbatim."""
    lines = [finding.summary, ""]
    lines.append(f"- **detector**: {finding.detector}")
    if finding.at_step is not None:
        lines.append(f"- **step**: {finding.at_step}")
    for key, value in finding.details.items():
        lines.append(f"- **{key}**: {value}")
    if finding.evidence:
        lines += ["", "```text", *finding.evidence, "```"]
    return "\n".join(lines).strip()


_FACT = re.compile(r"^- \*\*(.+?)\*\*: (.*)\Z")


@dataclass(frozen=True, slots=True)
class FindingBody:
    """A body `render_finding_body` wrote, read back: what a chat page rearranges for a phone."""

    summary: str
    facts: tuple[tuple[str, str], ...]  # (label, value as written), in the finding's order
    evidence: tuple[str, ...] = ()


def parse_finding_body(body: str) -> FindingBody | None:
    """The summary, facts and evidence of a finding's body; None for any other text (a
    resolution, a notice): the caller then shows it as it is."""
    head, sep, rest = body.partition("\n\n")
    if not sep or not head.strip() or "\n" in head:
        return None
    facts: list[tuple[str, str]] = []
    evidence: list[str] = []
    lines = rest.splitlines()
    i = 0
    while i < len(lines) and (m := _FACT.match(lines[i])) is not None:
        facts.append((m.group(1), m.group(2)))
        i += 1
    if not facts:
        return None
    tail = lines[i:]
    if tail:
        if tail[:2] != ["", "```text"] or tail[-1] != "```":
            return None
        evidence = tail[2:-1]
    return FindingBody(head, tuple(facts), tuple(evidence))


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed since the last `take_changes()`: what the store must persist."""

    incidents: list[Incident]
    mutes: list[Mute] | None  # None: mutes unchanged


class IncidentBook:
    """In-memory incident state; every method takes `now`, none reads a clock or does I/O."""

    def __init__(
        self,
        *,
        reminder_interval: float,
        max_reminders: int = 0,
        notify_resolve: bool = True,
        incidents: Iterable[Incident] = (),
        seqs: Mapping[tuple[str, str], int] | None = None,
        mutes: Iterable[Mute] = (),
    ) -> None:
        if reminder_interval <= 0:
            raise ValueError("reminder_interval must be > 0")
        self.reminder_interval = reminder_interval
        self.max_reminders = max_reminders
        self.notify_resolve = notify_resolve
        self._open: dict[tuple[str, str], Incident] = {}
        self._seqs: dict[tuple[str, str], int] = dict(seqs or {})
        for inc in incidents:
            if inc.is_open:
                self._open[(inc.job_id, inc.kind)] = inc
            key = (inc.job_id, inc.kind)
            self._seqs[key] = max(self._seqs.get(key, 0), inc.seq)
        self._mutes: dict[tuple[str, str], Mute] = {(m.job_id, m.kind): m for m in mutes}
        # What other parts of the daemon show in an incident's message (recovery's countdown),
        # by incident id: merged into `snapshot`, never stored with the incident (the owner of
        # the knowledge sets it again after a restart).
        self._notes: dict[str, dict[str, Any]] = {}
        self._dirty: dict[str, Incident] = {}
        self._mutes_dirty = False

    @classmethod
    def from_config(
        cls,
        cfg: IncidentsConfig,
        *,
        incidents: Iterable[Incident] = (),
        seqs: Mapping[tuple[str, str], int] | None = None,
        mutes: Iterable[Mute] = (),
    ) -> IncidentBook:
        return cls(
            reminder_interval=cfg.reminder_interval_seconds,
            max_reminders=cfg.max_reminders,
            notify_resolve=cfg.notify_resolve,
            incidents=incidents,
            seqs=seqs,
            mutes=mutes,
        )

    # -- queries ---------------------------------------------------------

    def get(self, job_id: str, kind: str) -> Incident | None:
        return self._open.get((job_id, kind))

    def open_incidents(self) -> list[Incident]:
        return sorted(self._open.values(), key=lambda i: (i.opened_at, i.id))

    def active_mutes(self, now: float) -> list[Mute]:
        return [m for m in self._mutes.values() if m.until > now]

    def is_muted(self, job_id: str, kind: str, now: float) -> bool:
        return any(m.covers(job_id, kind, now) for m in self._mutes.values())

    def take_changes(self) -> Changes:
        changes = Changes(
            list(self._dirty.values()), list(self._mutes.values()) if self._mutes_dirty else None
        )
        self._dirty.clear()
        self._mutes_dirty = False
        return changes

    def requeue(self, changes: Changes) -> None:
        """Put back changes whose persistence failed, so the next commit writes them."""
        for inc in changes.incidents:
            self._dirty.setdefault(inc.id, inc)
        if changes.mutes is not None:
            self._mutes_dirty = True

    # -- findings --------------------------------------------------------

    def observe_all(self, findings: Iterable[Finding], now: float) -> list[Notification]:
        out: list[Notification] = []
        for finding in findings:
            out += self.observe(finding, now)
        return out

    def observe(self, finding: Finding, now: float) -> list[Notification]:
        key = (finding.job_id, finding.kind)
        inc = self._open.get(key)
        muted = self.is_muted(finding.job_id, finding.kind, now)
        if finding.resolved:
            if inc is None:
                return []
            text = f"{finding.summary or 'condition cleared'} after {rounded_duration(now - inc.opened_at)}"
            step = finding.at_step if finding.at_step is not None else inc.last_step
            return self._resolve(inc, now, text, step, muted)

        if inc is None:
            seq = self._seqs.get(key, 0) + 1
            self._seqs[key] = seq
            inc = Incident(
                id=f"{finding.job_id}:{finding.kind}:{seq}",
                job_id=finding.job_id,
                kind=finding.kind,
                seq=seq,
                detector=finding.detector,
                severity=finding.severity,
                summary=finding.summary,
                opened_at=now,
                last_seen_at=now,
                first_step=finding.at_step,
                last_step=finding.at_step,
                owner=finding.owner,
                ray=finding.ray,
            )
            if muted:
                self._put(inc)
                return []
            return [self._announce(inc, finding, now)]

        escalated = SEVERITY_RANK[finding.severity] > SEVERITY_RANK[inc.severity]
        inc = replace(
            inc,
            last_seen_at=now,
            summary=finding.summary,
            severity=finding.severity if escalated else inc.severity,
            last_step=finding.at_step if finding.at_step is not None else inc.last_step,
            owner=inc.owner or finding.owner,  # the first owner known stays (stable alert labels)
            ray=finding.ray or inc.ray,
        )
        if muted:
            self._put(inc)
            return []
        if inc.announced_at is None:
            # Opened during a mute that has since ended: people have not heard of it yet.
            return [self._announce(inc, finding, now)]
        if escalated:
            inc = replace(inc, last_notified_at=now)
            self._put(inc)
            return [
                self._note(
                    inc,
                    "remind",
                    f"{inc.id}:escalate:{inc.severity}",
                    f"{inc.kind} on job {inc.job_id} (now {inc.severity})",
                    render_finding_body(finding),
                    now,
                )
            ]
        last = inc.last_notified_at if inc.last_notified_at is not None else inc.opened_at
        reminders_left = self.max_reminders == 0 or inc.reminders_sent < self.max_reminders
        if inc.acked_at is None and reminders_left and now - last >= self.reminder_interval:
            n = inc.reminders_sent + 1
            inc = replace(inc, reminders_sent=n, last_notified_at=now)
            self._put(inc)
            return [
                self._note(
                    inc,
                    "remind",
                    f"{inc.id}:remind:{n}",
                    f"{inc.kind} on job {inc.job_id} (open {rounded_duration(now - inc.opened_at)})",
                    render_finding_body(finding),
                    now,
                )
            ]
        self._put(inc)
        return []

    def job_ended(self, job_id: str, now: float, state: str) -> list[Notification]:
        """Resolve every open incident of a job that left the queue; its job-specific mutes go too."""
        out: list[Notification] = []
        for inc in [i for i in self.open_incidents() if i.job_id == job_id]:
            muted = self.is_muted(job_id, inc.kind, now)
            text = f"job ended ({state}) after {rounded_duration(now - inc.opened_at)}"
            out += self._resolve(inc, now, text, inc.last_step, muted)
        for key in [k for k in self._mutes if k[0] == job_id]:
            del self._mutes[key]
            self._mutes_dirty = True
        return out

    # -- people ----------------------------------------------------------

    def ack(self, job_id: str, kind: str, now: float, by: str | None = None) -> Incident | None:
        """Stop reminders for the open incident; its resolution is still announced."""
        inc = self._open.get((job_id, kind))
        if inc is None:
            return None
        if inc.acked_at is None:
            inc = replace(inc, acked_at=now, acked_by=by)
            self._put(inc)
        return inc

    def covering_mute(self, job_id: str, kind: str, now: float) -> Mute | None:
        """The mute silencing (job_id, kind) now, the one ending last when several do."""
        live = [m for m in self._mutes.values() if m.covers(job_id, kind, now)]
        return max(live, key=lambda m: m.until) if live else None

    def updates(self, incidents: Iterable[Incident], reason: str, now: float) -> list[Notification]:
        """`update` notifications (edit the incident's message in place) for announced incidents."""
        out: list[Notification] = []
        for inc in incidents:
            if inc.announced_at is None:
                continue  # nobody has a message to edit yet
            out.append(
                self._note(
                    inc,
                    "update",
                    f"{inc.id}:update:{reason}:{int(now * 1000)}",
                    f"{inc.kind} on job {inc.job_id}",
                    reason,
                    now,
                )
            )
        return out

    def mute(self, job_id: str, kind: str, until: float, now: float, by: str | None = None) -> Mute:
        """Silence (job_id, kind) until `until`; "*" for either means every job / every kind."""
        if until <= now:
            raise ValueError("mute must end in the future")
        mute = Mute(job_id=job_id, kind=kind, until=until, created_at=now, by=by)
        self._mutes[(job_id, kind)] = mute
        self._prune_mutes(now)
        self._mutes_dirty = True
        return mute

    def unmute(self, job_id: str, kind: str, now: float) -> bool:
        removed = self._mutes.pop((job_id, kind), None) is not None
        self._prune_mutes(now)
        self._mutes_dirty = True
        return removed

    # -- internals -------------------------------------------------------

    def _prune_mutes(self, now: float) -> None:
        for key in [k for k, m in self._mutes.items() if m.until <= now]:
            del self._mutes[key]

    def _put(self, inc: Incident) -> None:
        key = (inc.job_id, inc.kind)
        if inc.is_open:
            self._open[key] = inc
        else:
            self._open.pop(key, None)
        self._dirty[inc.id] = inc

    def _announce(self, inc: Incident, finding: Finding, now: float) -> Notification:
        inc = replace(inc, announced_at=now, last_notified_at=now)
        self._put(inc)
        return self._note(
            inc,
            "open",
            f"{inc.id}:open",
            f"{inc.kind} on job {inc.job_id}",
            render_finding_body(finding),
            now,
            finding.plot,
        )

    def _resolve(
        self, inc: Incident, now: float, text: str, step: int | None, muted: bool
    ) -> list[Notification]:
        inc = replace(inc, resolved_at=now, resolution=text, last_seen_at=now, last_step=step)
        self._put(inc)
        if inc.announced_at is None:
            return []
        if muted or not self.notify_resolve:
            # No news for people, but the incident's chat message must not stay "open": an
            # `update` edits it in place (silently) and sends nothing else.
            return [self._note(inc, "update", f"{inc.id}:resolve", f"{inc.kind} on job {inc.job_id}", text, now)]
        return [self._note(inc, "resolve", f"{inc.id}:resolve", f"{inc.kind} on job {inc.job_id}", text, now)]

    def annotate(self, incident_id: str, key: str, value: Mapping[str, Any] | None) -> None:
        """Show `value` (JSON-ready) under `key` in the incident's snapshots from now on; None
        removes it. Only a key the incident's fields do not use."""
        if key in Incident.__dataclass_fields__ or key in ("muted_until", "muted_by"):
            raise ValueError(f"{key!r} is an incident field")
        notes = self._notes.setdefault(incident_id, {})
        if value is None:
            notes.pop(key, None)
            if not notes:
                del self._notes[incident_id]
        else:
            notes[key] = dict(value)

    def snapshot(self, inc: Incident, now: float) -> dict[str, Any]:
        """The incident as a chat message shows it: its fields plus the mute covering it (and
        what `annotate` added)."""
        snap: dict[str, Any] = asdict(inc)
        mute = self.covering_mute(inc.job_id, inc.kind, now) if inc.is_open else None
        snap["muted_until"] = mute.until if mute is not None else None
        snap["muted_by"] = mute.by if mute is not None else None
        snap.update(self._notes.get(inc.id, {}))
        return snap

    def _note(
        self,
        inc: Incident,
        event: Event,
        nid: str,
        title: str,
        body: str,
        now: float,
        plot: Mapping[str, Any] | None = None,
    ) -> Notification:
        return Notification(
            id=nid,
            job_id=inc.job_id,
            kind=inc.kind,
            event=event,
            title=title,
            body=body,
            created_at=now,
            severity="info" if event in ("resolve", "update") else inc.severity,
            incident_id=inc.id,
            owner=inc.owner,
            incident=self.snapshot(inc, now),
            plot=dict(plot) if plot is not None else None,
        )


def make_report(
    job_id: str,
    kind: str,
    key: str,
    title: str,
    body: str,
    now: float,
    owner: str | None = None,
    plot: Mapping[str, Any] | None = None,
) -> Notification:
    """A one-off report (e.g. a job-end summary); `key` makes its id stable so a retry is not a repeat.
    `plot`: its picture's inputs (the weekly goodput digest's), rendered when it is sent."""
    return Notification(
        id=f"report:{job_id}:{kind}:{key}",
        job_id=job_id,
        kind=kind,
        event="report",
        title=title,
        body=body,
        created_at=now,
        owner=owner,
        plot=plot,
    )


def make_notice(key: str, title: str, body: str, now: float, *, severity: Severity = "info") -> Notification:
    """A daemon-level notice not tied to a job (source down, config reloaded)."""
    return Notification(
        id=f"notice:{key}",
        job_id="",
        kind=IncidentKind.NOTICE,
        event="notice",
        title=title,
        body=body,
        created_at=now,
        severity=severity,
    )
