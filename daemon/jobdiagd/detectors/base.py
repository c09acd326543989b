"""The detector interface: judges `(WatchedJob, now) -> outcome` that own their per-job state and status."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from jobdiagd.alerts.incidents import IncidentBook
from jobdiagd.config import Config
from jobdiagd.logs.state import LogState
from jobdiagd.model.alerts import Finding
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.kinds import IncidentKind
from jobdiagd.model.records import StepRecord
from jobdiagd.model.triage import CheckpointConfig, StallKnowledge, TriageResult
from jobdiagd.sources.slurm_parse import SlurmJob
from jobdiagd.tsdb.gpu_hang import GpuVerdict


@dataclass(frozen=True, slots=True)
class EarlyMemo:
    """The GPU verdict the service obtained while `last_step` (read at `step_at`) was the newest step.

    The service's early page (or the backtest's) sets it on the view; the hang detector reads it.
    The read time tells a step apart from the same step number of a replaced log (a restart)."""

    last_step: int
    verdict: GpuVerdict
    step_at: float | None


class WatchedJob(Protocol):
    """What a detector reads of one watched job: the daemon's (and the backtest's) per-job view,
    `service.jobs.JobView`, seen from below. Times are on the daemon's clock (when a line was
    read). Detectors only read it; what they remember between ticks they keep themselves
    (`Detector.forget`).
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
    def gpu_check(self) -> EarlyMemo | None: ...

    def version_steps(self) -> int: ...
    def is_ray(self) -> bool: ...
    def total_steps(self) -> int | None: ...
    def checkpoint(self) -> CheckpointConfig: ...
    def sorted_steps(self) -> list[StepRecord]: ...
    def analysis(self, now: float, stall: StallKnowledge | None = None) -> TriageResult: ...


def early_memo(view: WatchedJob) -> EarlyMemo | None:
    """The service's GPU verdict for the job's current last step, if it has one."""
    memo = view.gpu_check
    if memo is not None and memo.last_step == view.last_step and memo.step_at == view.last_step_at:
        return memo
    return None


@dataclass(frozen=True, slots=True)
class NoData:
    """The detector had nothing to judge this tick (no steps yet, job pending...). Not an error."""

    reason: str


@dataclass(frozen=True, slots=True)
class Report:
    """A one-off message (the job-end triage report); the engine sends it with `pipeline.report`."""

    job_id: str
    kind: IncidentKind
    key: str
    title: str
    body: str


Outcome = Sequence[Finding | Report] | NoData
# A detector's part of a job's line in `jobdiagd status` (JSON-ready values, keys in display order).
StatusPart = Mapping[str, object]


class Detector(Protocol):
    """A judge of watched jobs. `check` must not do I/O or read the clock: everything comes from
    the view and `now`. What it remembers about a job between ticks it keeps itself, keyed by the
    job's key, until `forget(key)` (the job left the watch); a config reload builds new detectors,
    so nothing computed under the old settings survives it."""

    @property
    def name(self) -> str: ...

    @property
    def on_data(self) -> bool:
        """Reacts to new lines: runs on partial (file-event) ticks too, not only on full ticks."""
        ...

    @property
    def on_gpu_check(self) -> bool:
        """Runs on the partial tick the early page wakes when the GPUs confirm a hang."""
        ...

    def check(self, view: WatchedJob, now: float) -> Outcome: ...

    def forget(self, key: str) -> None: ...

    def status(self, view: WatchedJob, now: float) -> StatusPart | None:
        """This detector's columns of the job's status line (None: it shows nothing)."""
        ...


Factory = Callable[[Config], Detector]


@dataclass(frozen=True, slots=True)
class DetectorSpec:
    """What a detector module exports (`SPEC`) for the registry."""

    name: str  # as in [detectors.<name>]
    default: bool  # enabled when the config has no section for it
    factory: Factory
    description: str
    # The detector's status columns for a job while it is disabled (same keys as `status`).
    idle_status: Callable[[WatchedJob], StatusPart] | None = None


class DetectorRegistry:
    """The detectors a runner may build, by name (listed in one place, `detectors.CATALOG`)."""

    def __init__(self, specs: Sequence[DetectorSpec]) -> None:
        by_name: dict[str, DetectorSpec] = {}
        for spec in specs:
            if spec.name in by_name:
                raise ValueError(f"detector {spec.name!r} registered twice")
            by_name[spec.name] = spec
        self._specs = [by_name[k] for k in sorted(by_name)]

    def registered(self) -> list[DetectorSpec]:
        return list(self._specs)

    def enabled_names(self, cfg: Config) -> list[str]:
        """Config decides where it has a section for the detector; otherwise the detector's default."""
        flags = cfg.detectors.enabled()
        return [d.name for d in self._specs if flags.get(d.name, d.default)]

    def build(self, cfg: Config) -> list[Detector]:
        names = set(self.enabled_names(cfg))
        return [d.factory(cfg) for d in self._specs if d.name in names]

    def status(self, detectors: Sequence[Detector], view: WatchedJob, now: float) -> dict[str, object]:
        """Every registered detector's status columns for the job, in registry order (a disabled
        one shows its idle columns, so the status document has the same keys either way)."""
        running = {d.name: d for d in detectors}
        out: dict[str, object] = {}
        for spec in self._specs:
            det = running.get(spec.name)
            part = det.status(view, now) if det is not None else None
            if det is None and spec.idle_status is not None:
                part = spec.idle_status(view)
            if part:
                out.update(part)
        return out


class RefreshRation:
    """Optional recomputes (a cache refresh that may wait) allowed per tick: at most `per_tick`
    (the engine rotates the job order, so every job gets its turn)."""

    def __init__(self, per_tick: int) -> None:
        self.per_tick = per_tick
        self._tick: float | None = None
        self._spent = 0

    def spend(self, now: float) -> bool:
        if now != self._tick:
            self._tick, self._spent = now, 0
        if self._spent >= self.per_tick:
            return False
        self._spent += 1
        return True


def staggered(now: float, key: str, period: float) -> float:
    """A job's first cache time, back-dated by a per-job offset within `period`: many jobs' later
    refreshes spread over the period instead of all falling in one tick."""
    return now - zlib.crc32(key.encode()) % int(period)


def resolved_finding(name: str, key: str, kind: IncidentKind, summary: str, at_step: int | None = None) -> Finding:
    """The finding that closes a detector's open incident of `kind` for the job."""
    return Finding(name, key, kind, "info", summary, at_step=at_step, resolved=True)


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
