"""Plain data passed between detectors, the incident book, the outbox and the notifiers."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast, get_args

from jobdiagd.model.kinds import IncidentKind

Severity = Literal["info", "warning", "critical"]
# "update": the incident's state changed without news from the job (acked, muted, unmuted): chat
# transports edit the incident's message in place; line-oriented notifiers may show it as a line.
Event = Literal["open", "remind", "resolve", "report", "notice", "update"]

SEVERITIES: tuple[Severity, ...] = get_args(Severity)
EVENTS: tuple[Event, ...] = get_args(Event)
SEVERITY_RANK: Mapping[Severity, int] = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True, slots=True)
class Finding:
    """What one detector concluded about one job on one tick.

    `resolved=True` says the condition named by `kind` has cleared (e.g. steps resumed);
    `summary` then describes the recovery ("steps resumed at step 412").
    `details` must be JSON-serialisable: it is stored and shown to people.
    """

    detector: str
    job_id: str
    kind: IncidentKind
    severity: Severity
    summary: str
    details: Mapping[str, Any] = field(default_factory=dict)
    evidence: tuple[str, ...] = ()
    at_step: int | None = None
    resolved: bool = False
    # Stamped by the engine from the job (not by detectors): routing and buttons need them.
    owner: str | None = None  # Slurm user owning the job
    ray: bool = False  # RAY=1 job: a per-job Prometheus exists (Diagnose button, GPU strip)
    # Plot inputs (bounded, JSON-ready) for the incident's picture; only on the finding that opens.
    plot: Mapping[str, Any] | None = None
    # The failure class the finding is about (a failure finding's root cause), as data: `details`
    # is for people and its labels may change.
    failure_class: str | None = None
    # The GPUs confirmed the hang (the early page, rule HANG-GPU): the service pages it without
    # asking them again. `details` carries the same news for people ("GPU-confirmed").
    gpu_confirmed: bool = False


@dataclass(frozen=True, slots=True)
class Notification:
    """One message for people; `id` is the idempotency key used by the outbox and notifiers.

    `title` names the condition ("hang on job 123"); notifiers show `event` themselves
    (OPEN / STILL / RESOLVED ...), so titles do not repeat it.
    """

    id: str
    job_id: str
    kind: str
    event: Event
    title: str
    body: str  # markdown
    created_at: float
    severity: Severity = "info"
    incident_id: str | None = None
    owner: str | None = None  # Slurm user of the job, for routing (an owner's own chat)
    # The incident as it was when this was enqueued (Incident fields + "muted_until"/"muted_by"),
    # so a chat transport renders the edit of the incident's message from the outbox alone,
    # after a restart too. None for reports and notices.
    incident: Mapping[str, Any] | None = None
    plot: Mapping[str, Any] | None = None  # picture inputs (open of hang/TGS incidents)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"), default=_plain)

    @classmethod
    def from_json(cls, text: str) -> Notification:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("notification JSON must be an object")
        event = raw["event"]
        severity = raw.get("severity", "info")
        if event not in EVENTS or severity not in SEVERITIES:
            raise ValueError(f"bad event/severity in stored notification: {event!r}/{severity!r}")
        incident_id = raw.get("incident_id")
        owner = raw.get("owner")
        incident = raw.get("incident")
        plot = raw.get("plot")
        return cls(
            id=str(raw["id"]),
            job_id=str(raw["job_id"]),
            kind=str(raw["kind"]),
            event=cast(Event, event),
            title=str(raw["title"]),
            body=str(raw["body"]),
            created_at=float(raw["created_at"]),
            severity=cast(Severity, severity),
            incident_id=None if incident_id is None else str(incident_id),
            owner=None if owner is None else str(owner),
            incident=incident if isinstance(incident, dict) else None,
            plot=plot if isinstance(plot, dict) else None,
        )


def _plain(value: Any) -> Any:
    # Mappings held in frozen dataclasses may be MappingProxyType; tuples are lists anyway.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class Incident:
    """One condition (job_id, kind) from its first finding to its resolution."""

    id: str  # "<job_id>:<kind>:<seq>"
    job_id: str
    kind: str
    seq: int
    detector: str
    severity: Severity
    summary: str
    opened_at: float
    last_seen_at: float
    first_step: int | None = None
    last_step: int | None = None
    # None until people were told: an incident opened while muted is announced when the mute ends.
    announced_at: float | None = None
    last_notified_at: float | None = None
    reminders_sent: int = 0
    acked_at: float | None = None
    acked_by: str | None = None
    resolved_at: float | None = None
    resolution: str | None = None
    # From the finding that opened it; kept for the incident's life so alert labels stay stable.
    owner: str | None = None
    ray: bool = False

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None


@dataclass(frozen=True, slots=True)
class Mute:
    """Silence notifications for one job (kind="*": every kind; job_id="*": every job) until `until`."""

    job_id: str
    kind: str
    until: float
    created_at: float
    by: str | None = None

    def covers(self, job_id: str, kind: str, now: float) -> bool:
        return now < self.until and self.job_id in ("*", job_id) and self.kind in ("*", kind)


@dataclass(frozen=True, slots=True)
class DaemonCondition:
    """Something wrong with the daemon itself (an input failing, a job's log unreadable) while it lasts.

    Not an incident: it has no history in the store; it is derived afresh from the daemon's state
    (what `jobdiagd status` shows) each time it is needed, so it ends when that state clears.
    Identity: `name` plus `job_id`/`component` ("source-failing" of component "squeue").
    """

    name: str
    severity: Severity
    summary: str
    description: str = ""
    job_id: str | None = None
    component: str | None = None
    since: float | None = None
