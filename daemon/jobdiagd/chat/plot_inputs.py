"""The pictures' inputs from what the daemon knows: step history, checkpoint config, incident, GPU strip; pure.

Decisions where the issue is silent:
- Throughput is tokens/s/device when at least half the steps carry it, else 1/seconds in
  steps/s: the rule of `triage.tgs`, so the picture shows the metric the alert talks about.
- Checkpoint marks: the configured period's multiples plus every save the log showed (the
  initial save at step 0 included); evals every `eval_interval` steps. Only marks between the
  first step and the projected step are produced, at most `MAX_MARKS` (the newest).
- The projected step is the hang detector's: last step + (now - when it was read) // steady
  step time; the TGS slide starts at the analysis' low-episode range, the baseline window is
  steps 5-15 after the first step (rule TGS-1), both in absolute step numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from jobdiagd.durations import rounded_duration
from jobdiagd.model.kinds import TgsPattern
from jobdiagd.model.plotdata import (
    HostSeries,
    HostStrip,
    IncidentMarks,
    MarkKind,
    PowerBands,
    PowerStrip,
    StepChart,
    StepPoint,
    StripPanel,
)
from jobdiagd.model.records import StepRecord
from jobdiagd.model.triage import CheckpointConfig, TgsAnalysis
from jobdiagd.triage.tgs import BASELINE_FROM, BASELINE_TO
from jobdiagd.tsdb.settings import GpuProfile, Thresholds
from jobdiagd.tsdb.slow_host import RULES, SlowHostVerdict

MAX_MARKS = 400
MAX_STRIP_PANELS = 3
SUBTITLE_CHARS = 120  # a picture's subtitle line (chat.plots wraps at 125)
TITLE_MAX = 64

HistoryItem = StepRecord | StepPoint | tuple[int, float | None, float | None]


def step_points(history: Iterable[HistoryItem]) -> tuple[tuple[StepPoint, ...], str]:
    """(points sorted by step, throughput unit) from step records, points or (step, s, tokens/s) tuples."""
    raw: dict[int, StepPoint] = {}
    for item in history:
        if isinstance(item, StepRecord):
            p = StepPoint(item.step, item.seconds, item.tgs)
        elif isinstance(item, StepPoint):
            p = item
        else:
            step, secs, tps = item
            p = StepPoint(int(step), secs, tps)
        raw.setdefault(p.step, p)  # the first copy of a step wins, as in the parser
    points = [raw[k] for k in sorted(raw)]
    with_tps = sum(1 for p in points if p.tokens_per_s is not None and p.tokens_per_s > 0)
    if not points or with_tps >= len(points) / 2:
        return tuple(points), "tokens/s/device"
    rate = tuple(StepPoint(p.step, p.seconds, 1.0 / p.seconds if p.seconds else None) for p in points)
    return rate, "steps/s"


def checkpoint_steps(ckpt: CheckpointConfig, lo: int, hi: int, limit: int = MAX_MARKS) -> tuple[int, ...]:
    """Checkpoint steps in [lo, hi]: multiples of the period and the saves the log showed."""
    marks = {s for s in ckpt.saves if lo <= s <= hi}
    if ckpt.period and hi >= lo:
        first = max(ckpt.period, math.ceil(lo / ckpt.period) * ckpt.period)
        # Only the newest `limit` multiples: a million-step job must not build a million marks.
        first = max(first, (hi // ckpt.period - limit + 1) * ckpt.period)
        marks.update(range(first, hi + 1, ckpt.period))
    return tuple(sorted(marks)[-limit:])


def eval_steps(eval_period: int | None, lo: int, hi: int, limit: int = MAX_MARKS) -> tuple[int, ...]:
    if not eval_period or eval_period <= 0 or hi < lo:
        return ()
    first = max(eval_period, math.ceil(lo / eval_period) * eval_period)
    first = max(first, (hi // eval_period - limit + 1) * eval_period)
    return tuple(range(first, hi + 1, eval_period))


def projected_step(
    last_step: int | None, last_step_at: float | None, now: float, step_time_s: float | None
) -> int | None:
    """Where training should be by `now` (the hang detector's projection)."""
    if last_step is None or last_step_at is None or not step_time_s or step_time_s <= 0:
        return None
    return last_step + max(0, int((now - last_step_at) // step_time_s))


def chart_title(job_id: str, job_name: str | None, what: str) -> str:
    """'Hang · job 4242 JAX-llama2-70b', cut to fit one line of the picture."""
    title = f"{what} · job {job_id}" + (f" {job_name}" if job_name else "")
    return title if len(title) <= TITLE_MAX else title[: TITLE_MAX - 1] + "…"


def hang_chart(
    history: Iterable[HistoryItem],
    ckpt: CheckpointConfig,
    *,
    title: str,
    last_step: int | None,
    projected: int | None,
    stalled_s: float | None,
    step_time_s: float | None,
    eval_interval: int | None = None,
    incident_id: str | None = None,
) -> StepChart:
    points, unit = step_points(history)
    if last_step is None and points:
        last_step = points[-1].step
    lo = points[0].step if points else 0
    hi = max(x for x in (last_step, projected, points[-1].step if points else None, 0) if x is not None)
    facts = []
    if stalled_s is not None:
        facts.append(f"no step for {rounded_duration(stalled_s)}")
    if last_step is not None:
        facts.append(f"last step {last_step:,}")
    if projected is not None and last_step is not None and projected > last_step:
        facts.append(f"expected ≈ {projected:,} by now")
    if step_time_s:
        facts.append(f"steady {step_time_s:.3g} s/step")
    if incident_id:
        facts.append(f"incident {incident_id}")
    marks = IncidentMarks(
        MarkKind.HANG, last_step, projected_step=projected, stalled_s=stalled_s, step_time_s=step_time_s
    )
    evals = eval_interval if eval_interval is not None else ckpt.eval_period
    return _step_chart(title, points, marks, unit=unit, facts=facts, ckpt=ckpt, steps=(lo, hi), evals=evals)


def tgs_chart(
    history: Iterable[HistoryItem],
    ckpt: CheckpointConfig,
    analysis: TgsAnalysis,
    *,
    title: str,
    baseline_steps: tuple[int, int] = (BASELINE_FROM, BASELINE_TO),
    eval_interval: int | None = None,
    incident_id: str | None = None,
) -> StepChart:
    """`baseline_steps` counts from the first step, as `analyze_tgs` does."""
    points, unit = step_points(history)
    lo = points[0].step if points else 0
    hi = points[-1].step if points else 0
    start = analysis.range_steps[0] if analysis.range_steps else None
    facts = []
    if analysis.magnitude:
        facts.append(f"TGS {analysis.magnitude}")
    elif analysis.change_pct is not None:
        facts.append(f"TGS {analysis.change_pct:+.0f}%")
    if analysis.range:
        facts.append(f"steps {analysis.range}")
    if analysis.pattern and analysis.pattern != TgsPattern.NONE:
        facts.append(analysis.pattern)
    if incident_id:
        facts.append(f"incident {incident_id}")
    marks = IncidentMarks(
        MarkKind.TGS,
        start,
        baseline=analysis.baseline,
        degraded=analysis.recent,
        change_pct=analysis.change_pct,
        baseline_steps=(lo + baseline_steps[0], lo + baseline_steps[1]) if points else None,
        pattern=analysis.pattern if analysis.pattern != TgsPattern.NONE else None,
    )
    unit = analysis.metric if points else unit
    evals = eval_interval if eval_interval is not None else ckpt.eval_period
    return _step_chart(title, points, marks, unit=unit, facts=facts, ckpt=ckpt, steps=(lo, hi), evals=evals)


def _step_chart(
    title: str,
    points: tuple[StepPoint, ...],
    marks: IncidentMarks,
    *,
    unit: str,
    facts: list[str],
    ckpt: CheckpointConfig,
    steps: tuple[int, int],
    evals: int | None,
) -> StepChart:
    """What every step chart shares: checkpoint and eval marks over `steps`, the facts subtitle."""
    lo, hi = steps
    period = f" (every {ckpt.period:,} steps)" if ckpt.period else ""
    return StepChart(
        title=title,
        points=points,
        marks=marks,
        checkpoints=checkpoint_steps(ckpt, lo, hi),
        evals=eval_steps(evals, lo, hi),
        subtitle=" · ".join(facts) or None,
        throughput_unit=unit,
        checkpoint_label=f"checkpoint{period}",
        eval_label=f"eval (every {evals:,} steps)" if evals else "eval",
    )


def power_bands(profile: GpuProfile, thresholds: Thresholds | None = None) -> PowerBands:
    th = thresholds or Thresholds()
    return PowerBands(
        gpu_model=profile.name,
        idle_max_w=profile.idle_power_max_w,
        busy_wait_w=(profile.busy_wait_power_min_w, profile.busy_wait_power_max_w),
        train_w=(profile.train_power_min_w, profile.train_power_max_w),
        busy_util_pct=th.busy_util_pct,
    )


def power_strip(
    power: Sequence[HostSeries],
    util: Sequence[HostSeries],
    bands: PowerBands,
    *,
    title: str,
    start: float,
    end: float,
    last_step: int | None = None,
    last_step_at: float | None = None,
    notes: Sequence[str] = (),
) -> PowerStrip:
    """The strip with the incident's start (when the last step was read) marked."""
    label = f"last step {last_step:,} read" if last_step is not None else "stall began"
    return PowerStrip(
        title=title,
        power=tuple(power),
        util=tuple(util),
        bands=bands,
        start=start,
        end=end,
        since=last_step_at,
        since_label=label,
        notes=tuple(notes),
    )


def host_strip(
    series: Mapping[str, Sequence[HostSeries]],
    verdict: SlowHostVerdict,
    *,
    title: str,
    start: float,
    end: float,
) -> HostStrip:
    """The slow-host strip of a TGS slide: GPU power first, then each metric a named host stands out
    on (at most `MAX_STRIP_PANELS` panels); with no host named, GPU power and utilization (a
    uniform slide shows as every host moving together)."""
    roles = ["power"]
    for d in verdict.deviations:
        if d.role not in roles:
            roles.append(d.role)
    if not verdict.hosts:
        roles.append("util")
    panels = tuple(
        StripPanel(RULES[role].label, RULES[role].unit, tuple(series[role]))
        for role in roles
        if role in RULES and series.get(role)
    )[:MAX_STRIP_PANELS]
    # The subtitle (two lines) carries the verdict; the evidence is repeated in the picture only
    # when the subtitle cannot hold it.
    long = len(verdict.summary) > 2 * SUBTITLE_CHARS
    notes = tuple(f"{h}: {ln}" for h in verdict.hosts for ln in verdict.evidence.get(h, ())) if long else ()
    return HostStrip(
        title=title,
        panels=panels,
        named=verdict.hosts,
        start=start,
        end=end,
        subtitle=verdict.summary,
        notes=notes,
    )
