"""The log-mtime monitor sites used before jobdiagd, modelled honestly, and what faster detection saved (rule GP-7).

That monitor (docs/log-formats.md, "The monitor people use today") polls every 60 s and calls a
job hung when its Slurm log's mtime — the last line of any kind — is older than 1800 s. A hang
whose log keeps getting chatter (NCCL warnings, Ray's buffered output) is never caught by it.

Model: after the last step, the log's mtime is the time of the latest line written; the monitor
fires at the first moment the log has been silent for `threshold_s`, plus half a poll interval
on average (the poll's phase is unknown). Lines without a timestamp are placed at the time of
the dated line before them (the replay's virtual clock): that can only lengthen the silences,
so the monitor is never made to look slower than it was. A silence that outlasts the job —
the monitor would fire after the run ended — means it would not have caught the hang.

Saved per hang = (when the monitor would have fired, or the run's end if it would not have)
minus jobdiagd's page, times the run's GPUs, never below 0: the stall the same reaction time
would have cut. When the monitor would not have fired at all this is a lower bound (the job
would have run on until something else ended it), and it is marked so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from jobdiagd.goodput.ledger import Run

THRESHOLD_S = 1800.0
POLL_S = 60.0


def monitor_fire_at(
    writes: Iterable[float],
    *,
    after: float,
    until: float,
    threshold_s: float = THRESHOLD_S,
    poll_s: float = POLL_S,
) -> float | None:
    """When the mtime monitor would fire for a stall that began at `after` (the last step's line,
    itself a write) in a run that ended at `until`; None: it would not have before the end.
    `writes`: the times of the log's lines, in file order."""
    last = after
    for t in writes:
        if t <= after:
            continue
        if t - last > threshold_s:
            return last + threshold_s + poll_s / 2
        last = max(last, t)
    fire = last + threshold_s + poll_s / 2
    return fire if fire <= until else None


@dataclass(frozen=True, slots=True)
class Saving:
    run: str
    gpus: int
    stall_start: float
    detected_at: float
    monitor_at: float | None  # None: the monitor would not have fired before the run ended
    saved_s: float

    @property
    def lower_bound(self) -> bool:
        return self.monitor_at is None

    @property
    def saved_gpu_hours(self) -> float:
        return self.saved_s * self.gpus / 3600.0


def saving(run: Run) -> Saving | None:
    """What jobdiagd's page saved on one hung run against the mtime monitor (None: not a hang,
    or jobdiagd's page time is unknown)."""
    f = run.facts
    if not f.hang or run.detected_at is None:
        return None
    origin = f.last_step_at if f.last_step_at is not None else f.stall_origin
    if origin is None:
        origin = run.start
    baseline = f.monitor_at if f.monitor_at is not None else run.end
    return Saving(
        run=f.key,
        gpus=f.gpus,
        stall_start=origin,
        detected_at=run.detected_at,
        monitor_at=f.monitor_at,
        saved_s=max(0.0, min(baseline, run.end) - run.detected_at),
    )


@dataclass(frozen=True, slots=True)
class DetectionSummary:
    hangs: int
    with_page: int  # jobdiagd's page time known (incident store or replay)
    latencies_s: tuple[float, ...]  # last step -> page, per hang with a page
    monitor_latencies_s: tuple[float, ...]  # last step -> the monitor's firing, where it would fire
    monitor_missed: int  # hangs the monitor would not have caught before the run ended
    saved_gpu_hours: float
    saved_is_lower_bound: bool

    def to_dict(self) -> dict[str, object]:
        return {
            "hangs": self.hangs,
            "with_page": self.with_page,
            "page_latency_s": _quantiles(self.latencies_s),
            "monitor_latency_s": _quantiles(self.monitor_latencies_s),
            "monitor_missed": self.monitor_missed,
            "saved_gpu_hours": round(self.saved_gpu_hours, 3),
            "saved_is_lower_bound": self.saved_is_lower_bound,
        }


def _quantiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    v = sorted(values)
    return {
        "median": round(v[len(v) // 2], 1),
        "max": round(v[-1], 1),
        "n": len(v),
    }


def summarize(runs: Iterable[Run]) -> DetectionSummary:
    hangs = [r for r in runs if r.facts.hang]
    savings = [s for r in hangs if (s := saving(r)) is not None]
    return DetectionSummary(
        hangs=len(hangs),
        with_page=len(savings),
        latencies_s=tuple(s.detected_at - s.stall_start for s in savings),
        monitor_latencies_s=tuple(s.monitor_at - s.stall_start for s in savings if s.monitor_at is not None),
        monitor_missed=sum(1 for s in savings if s.monitor_at is None),
        saved_gpu_hours=sum(s.saved_gpu_hours for s in savings),
        saved_is_lower_bound=any(s.lower_bound for s in savings),
    )
