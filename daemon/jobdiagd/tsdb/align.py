"""Step <-> wall-clock alignment from raw tb_* samples (real samples only, staleness fills dropped)."""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from jobdiagd.tsdb.client import Series
from jobdiagd.tsdb.context import LogStep

TB_FIELDS: Mapping[str, str] = {
    "tb_step": "step",
    "tb_learning_loss": "loss",
    "tb_perf_step_time_seconds": "step_time",
    "tb_perf_per_device_tokens_per_sec": "tgs",
    "tb_learning_grad_norm": "grad_norm",
    "tb_learning_raw_grad_norm": "raw_grad_norm",
    "tb_learning_current_learning_rate": "lr",
    "tb_learning_moe_lb_loss": "moe_lb_loss",
}
FILL = "tb_metrics_plugin_staleness_fill"
TB_QUERY_NAMES = (*TB_FIELDS, FILL)


@dataclass(frozen=True)
class StepPoint:
    step: int
    t: float
    loss: float | None = None
    step_time: float | None = None
    tgs: float | None = None
    grad_norm: float | None = None
    raw_grad_norm: float | None = None
    lr: float | None = None
    moe_lb_loss: float | None = None


@dataclass(frozen=True)
class Timeline:
    points: tuple[StepPoint, ...]
    source: str  # "tsdb" | "log" | "none"
    fills_dropped: int = 0

    @property
    def empty(self) -> bool:
        return not self.points

    @property
    def first_step(self) -> int | None:
        return self.points[0].step if self.points else None

    @property
    def last_step(self) -> int | None:
        return self.points[-1].step if self.points else None

    @property
    def first_time(self) -> float | None:
        return self.points[0].t if self.points else None

    @property
    def last_time(self) -> float | None:
        return self.points[-1].t if self.points else None

    def time_of_step(self, step: int) -> float | None:
        """Wall-clock time at which `step` (or the first later step) completed."""
        steps = [p.step for p in self.points]
        i = bisect.bisect_left(steps, step)
        return self.points[i].t if i < len(self.points) else None

    def step_at(self, t: float) -> int | None:
        """Last step completed at or before `t`."""
        times = [p.t for p in self.points]
        i = bisect.bisect_right(times, t)
        return self.points[i - 1].step if i > 0 else None

    def median_step_time(self) -> float | None:
        vals = [p.step_time for p in self.points if p.step_time]
        if vals:
            return statistics.median(vals)
        gaps = [b.t - a.t for a, b in zip(self.points, self.points[1:], strict=False) if b.step == a.step + 1]
        return statistics.median(gaps) if gaps else None


def checkpoint_steps(steps: Iterable[int], period: int | None, async_ckpt: bool) -> set[int]:
    """Checkpoint steps plus the 1-2 steps after them whose times carry the save (runbook: checkpointing interference)."""
    if not period or period <= 0:
        return set()
    tail = 2 if async_ckpt else 1
    out: set[int] = set()
    for s in steps:
        if s > 0 and s % period == 0:
            out.update(range(s, s + tail + 1))
    return out


def steady_state(
    tl: Timeline,
    *,
    checkpoint_period: int | None,
    async_ckpt: bool,
    warmup_steps: int,
    start_step: int | None = None,
    end_step: int | None = None,
) -> list[StepPoint]:
    """Steps usable for steady-state figures: no warmup after the (re)start, no checkpoint steps."""
    if tl.empty:
        return []
    first = tl.first_step if tl.first_step is not None else 0
    lo = max(first + warmup_steps, start_step if start_step is not None else -1)
    hi = end_step if end_step is not None else (tl.last_step or 0)
    ck = checkpoint_steps((p.step for p in tl.points), checkpoint_period, async_ckpt)
    return [p for p in tl.points if lo <= p.step <= hi and p.step not in ck]


def _key(t: float) -> int:
    return round(t * 1000)


def timeline_from_series(series: Sequence[Series]) -> Timeline:
    """Join raw tb_* samples by timestamp; keep only those whose staleness fill is 0 (or absent)."""
    by_name: dict[str, Series] = {}
    for s in series:
        name = s.labels.get("__name__", "")
        # Training metrics come from rank 0 only; if several hosts emit, keep the richest series.
        if name and (name not in by_name or len(s.points) > len(by_name[name].points)):
            by_name[name] = s
    steps = by_name.get("tb_step")
    if steps is None or not steps.points:
        return Timeline((), "none")
    fill = {_key(t): v for t, v in by_name[FILL].points} if FILL in by_name else {}
    columns: dict[str, dict[int, float]] = {
        field: {_key(t): v for t, v in by_name[name].points}
        for name, field in TB_FIELDS.items()
        if name in by_name and field != "step"
    }
    points: list[StepPoint] = []
    seen: set[int] = set()
    dropped = 0
    for t, v in steps.points:
        k = _key(t)
        if fill.get(k, 0.0) != 0.0:
            dropped += 1
            continue
        if math.isnan(v):
            continue
        step = int(round(v))
        if step in seen:
            continue
        seen.add(step)

        def col(field: str, k: int = k) -> float | None:
            x = columns.get(field, {}).get(k)
            return x if x is not None else None

        points.append(
            StepPoint(
                step=step,
                t=t,
                loss=col("loss"),
                step_time=col("step_time"),
                tgs=col("tgs"),
                grad_norm=col("grad_norm"),
                raw_grad_norm=col("raw_grad_norm"),
                lr=col("lr"),
                moe_lb_loss=col("moe_lb_loss"),
            )
        )
    points.sort(key=lambda p: (p.t, p.step))
    return Timeline(tuple(points), "tsdb", dropped)


def timeline_from_log(steps: Sequence[LogStep]) -> Timeline:
    pts = sorted(
        (
            StepPoint(s.step, s.time, loss=s.loss, step_time=s.seconds, tgs=s.tgs)
            for s in steps
            if s.time is not None
        ),
        key=lambda p: p.t,
    )
    return Timeline(tuple(pts), "log" if pts else "none")


@dataclass(frozen=True)
class CrossCheck:
    status: str  # "verified" | "mismatch" | "unverifiable"
    detail: str
    compared: int = 0


def cross_check(tl: Timeline, log_steps: Sequence[LogStep], *, loss_tol: float = 0.002) -> CrossCheck:
    """Step numbers and losses in the TSDB must match the job log, or this is the wrong database."""
    if tl.source != "tsdb" or tl.empty:
        return CrossCheck("unverifiable", "no tb_step samples in the TSDB")
    logged = {s.step: s for s in log_steps if s.loss is not None}
    if not logged:
        return CrossCheck("unverifiable", "no step/loss lines in the log to compare with")
    tsdb = {p.step: p for p in tl.points if p.loss is not None}
    common = sorted(set(logged) & set(tsdb))
    if not common:
        return CrossCheck(
            "mismatch",
            f"TSDB steps {tl.first_step}-{tl.last_step} do not overlap log steps {min(logged)}-{max(logged)}",
        )
    bad = [s for s in common if abs((tsdb[s].loss or 0.0) - (logged[s].loss or 0.0)) > loss_tol]
    last = common[-1]
    if len(bad) > max(0, len(common) // 10):
        s = bad[-1]
        return CrossCheck(
            "mismatch",
            f"loss differs at {len(bad)}/{len(common)} common steps (step {s}: TSDB {tsdb[s].loss} vs log {logged[s].loss})",
            len(common),
        )
    return CrossCheck(
        "verified",
        f"step {last}: TSDB loss {tsdb[last].loss:.4f} = log loss {logged[last].loss:.4f} ({len(common)} steps compared)",
        len(common),
    )
