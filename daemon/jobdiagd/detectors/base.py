"""The detector interface and registry: pure per-tick checks `(WatchedJob, now) -> outcome`, registered by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from jobdiagd.alerts.incidents import IncidentBook
from jobdiagd.config import Config
from jobdiagd.logs.state import LogState
from jobdiagd.model.alerts import Finding
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.records import StepRecord
from jobdiagd.model.triage import CheckpointConfig, TriageResult
from jobdiagd.sources.slurm_parse import SlurmJob
from jobdiagd.triage.stall import StallPolicy


class WatchedJob(Protocol):
    """What a detector reads of one watched job: the daemon's (and the backtest's) per-job view,
    `service.jobs.JobView`, seen from below. Times are on the daemon's clock (when a line was
    read). Detectors only read it, except `memo`: per-detector scratch values, keyed by detector.
    """

    @property
    def key(self) -> str: ...
    @property
    def ref(self) -> JobRef: ...
    @property
    def first_seen(self) -> float: ...
    @property
    def slurm(self) -> SlurmJob | None: ...
    @property
    def main(self) -> LogState | None: ...
    @property
    def states(self) -> list[LogState]: ...
    @property
    def blind(self) -> dict[str, str]: ...
    @property
    def ended(self) -> bool: ...
    @property
    def end_state(self) -> str | None: ...
    @property
    def final(self) -> TriageResult | None: ...
    @property
    def marker_at(self) -> float | None: ...
    @property
    def last_step(self) -> int | None: ...
    @property
    def last_step_at(self) -> float | None: ...
    @property
    def memo(self) -> dict[str, Any]: ...

    def version_steps(self) -> int: ...
    def total_steps(self) -> int | None: ...
    def checkpoint(self) -> CheckpointConfig: ...
    def sorted_steps(self) -> list[StepRecord]: ...
    def analysis(self, now: float, policy: StallPolicy | None = None) -> TriageResult: ...


@dataclass(frozen=True, slots=True)
class NoData:
    """The detector had nothing to judge this tick (no steps yet, job pending...). Not an error."""

    reason: str


@dataclass(frozen=True, slots=True)
class Report:
    """A one-off message (the job-end triage report); the engine sends it with `pipeline.report`."""

    job_id: str
    kind: str
    key: str
    title: str
    body: str


Outcome = Sequence[Finding | Report] | NoData


class Detector(Protocol):
    """`check` must not do I/O or read the clock: everything comes from the view and `now`."""

    @property
    def name(self) -> str: ...

    def check(self, view: WatchedJob, now: float) -> Outcome: ...


Factory = Callable[[Config], Detector]


@dataclass(frozen=True, slots=True)
class DetectorInfo:
    name: str  # as in [detectors.<name>]
    default: bool
    factory: Factory
    description: str


_REGISTRY: dict[str, DetectorInfo] = {}


def register(name: str, default: bool, factory: Factory, description: str = "") -> None:
    """node_exporter-style registration; a second registration under one name is a bug."""
    if name in _REGISTRY:
        raise ValueError(f"detector {name!r} registered twice")
    _REGISTRY[name] = DetectorInfo(name, default, factory, description)


def registered() -> list[DetectorInfo]:
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def enabled_names(cfg: Config) -> list[str]:
    """Config decides where it has a section for the detector; otherwise the detector's default."""
    flags = cfg.detectors.enabled()
    return [d.name for d in registered() if flags.get(d.name, d.default)]


def build(cfg: Config) -> list[Detector]:
    names = set(enabled_names(cfg))
    return [d.factory(cfg) for d in registered() if d.name in names]


def keep_resolution(book: IncidentBook, f: Finding) -> bool:
    """Pass a resolution only for an open incident, and only with a step newer than the incident's.

    After a restart (or a lost arrival time) a detector may see "no stall" before it has read a
    new step; that must not close the incident. Shared by the engine and backtest.
    """
    if not f.resolved:
        return True
    inc = book.get(f.job_id, f.kind)
    if inc is None:
        return False
    return f.at_step is None or inc.last_step is None or f.at_step > inc.last_step
