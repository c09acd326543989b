"""TGS (tokens/s/device) trend analysis: the runbook's proactive check and pattern table, pure.

Baseline = steps 5–15 after the first step, recent = the last 10 steps, both without
checkpoint-adjacent steps; degraded when recent is more than `threshold_pct` below.
When the step lines carry no `Tokens/s/device` (2023-era logs) the rate 1/seconds
stands in for it, so percentages keep their meaning.

Pattern rules (where the runbook's table leaves room, decided here):
- `periodic`: slow steps only at checkpoint-adjacent steps (k·P, k·P+1) — expected, never
  degradation. Also used for regularly spaced spikes when the period is unknown.
- low episodes are runs of steps whose 5-step rolling median is > threshold below baseline;
- `phased`: two or more low episodes separated by a recovery, or one episode with two
  distinct levels (> 2×threshold/3 apart);
- `gradual`: the decline is spread out (no single jump between adjacent 5-step windows
  accounts for half of it);
- `constant-drop`: one shift to a lower level that stays flat (coefficient of variation
  < 5%) and covers most of the run (starts in the first half of the steady-state steps) —
  every step slower by the same delta, the RDMA signature;
- `one-time`: one shift that never recovers but starts late in an otherwise healthy run,
  or does not settle at one flat level (a component that partially failed at that moment).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from jobdiagd.model.records import StepRecord
from jobdiagd.triage.progress import CheckpointConfig

BASELINE_FROM, BASELINE_TO = 5, 15
RECENT = 10
SMOOTH = 5


@dataclass(frozen=True, slots=True)
class TgsAnalysis:
    baseline: float | None
    recent: float | None
    change_pct: float | None
    degraded: bool
    pattern: str
    range: str | None
    range_steps: tuple[int, int] | None
    magnitude: str | None
    metric: str
    periodic_steps: tuple[int, ...]
    note: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "baseline": self.baseline,
            "recent": self.recent,
            "change_pct": self.change_pct,
            "degraded": self.degraded,
            "pattern": self.pattern,
            "range": self.range,
            "magnitude": self.magnitude,
            "metric": self.metric,
        }


def _series(steps: list[StepRecord]) -> tuple[list[tuple[int, float]], str]:
    with_tgs = [(s.step, s.tgs) for s in steps if s.tgs is not None and s.tgs > 0]
    if steps and len(with_tgs) >= len(steps) / 2:
        return [(k, v) for k, v in with_tgs if v is not None], "tokens/s/device"
    rate = [(s.step, 1.0 / s.seconds) for s in steps if s.seconds]
    return rate, "steps/s"


def _fmt(v: float, metric: str) -> str:
    return f"{v:.0f}" if metric == "tokens/s/device" else f"{v:.4g}"


def analyze_tgs(
    steps: list[StepRecord],
    ckpt: CheckpointConfig,
    *,
    threshold_pct: float = 10.0,
    baseline_steps: tuple[int, int] = (BASELINE_FROM, BASELINE_TO),
    recent_steps: int = RECENT,
) -> TgsAnalysis:
    """`baseline_steps` counts from the first step of the run; the runbook's defaults (5–15, 10)."""
    b_from, b_to = baseline_steps
    series, metric = _series(steps)
    none = TgsAnalysis(None, None, None, False, "none", None, None, None, metric, ())
    if not series:
        return none
    first = steps[0].step
    steady = [(k, v) for k, v in series if k - first >= b_from]
    clean = [(k, v) for k, v in steady if not ckpt.adjacent(k)]
    base_vals = [v for k, v in clean if b_from <= k - first <= b_to]
    if len(base_vals) < 3:
        return TgsAnalysis(
            None, None, None, False, "none", None, None, None, metric, (), "not enough steps for a baseline"
        )
    baseline = statistics.fmean(base_vals)
    recent_vals = [v for _, v in clean[-recent_steps:]]
    recent = statistics.fmean(recent_vals)
    change = (recent - baseline) / baseline * 100.0
    degraded = change < -threshold_pct
    thr = baseline * (1 - threshold_pct / 100.0)

    # Checkpoint spikes: adjacent steps far below the clean median.
    med = statistics.median(v for _, v in clean) if clean else baseline
    spikes = tuple(k for k, v in steady if ckpt.adjacent(k) and v < med * 0.75)
    if not ckpt.period:
        spikes = _regular_spikes(steady, med)

    smooth = _rolling_median([v for _, v in clean], SMOOTH)
    keys = [k for k, _ in clean]
    episodes = _episodes([v < thr for v in smooth], gap=2)
    pattern = "none"
    rng: tuple[int, int] | None = None
    magnitude: str | None = None
    if episodes and (degraded or len(episodes) >= 2):
        a, b = episodes[0][0], episodes[-1][1]
        rng = (keys[a], keys[b])
        low_vals = [v for _, v in clean[a : b + 1]]
        level = statistics.fmean(low_vals[-RECENT:]) if degraded else min(low_vals)
        pct = (level - baseline) / baseline * 100.0
        magnitude = f"{_fmt(baseline, metric)} → {_fmt(level, metric)}, {pct:+.0f}%"
        pattern = _shape(smooth, episodes, clean, baseline, threshold_pct)
    elif spikes:
        pattern = "periodic"
    if pattern == "none" and degraded:
        pattern = "gradual"
        rng = (keys[0], keys[-1]) if keys else None
        magnitude = f"{_fmt(baseline, metric)} → {_fmt(recent, metric)}, {change:+.0f}%"
    return TgsAnalysis(
        baseline=round(baseline, 3),
        recent=round(recent, 3),
        change_pct=round(change, 1),
        degraded=degraded,
        pattern=pattern,
        range=f"{rng[0]}–{rng[1]}" if rng else None,
        range_steps=rng,
        magnitude=magnitude,
        metric=metric,
        periodic_steps=spikes,
    )


def _shape(
    smooth: list[float],
    episodes: list[tuple[int, int]],
    clean: list[tuple[int, float]],
    baseline: float,
    thr_pct: float,
) -> str:
    if len(episodes) >= 2:
        return "phased"
    a, b = episodes[0]
    vals = [v for _, v in clean[a : b + 1]]
    # Gradual: look at the whole steady series — is the decline spread out?
    total_drop = smooth[0] - smooth[-1] if smooth else 0.0
    jumps = [smooth[i] - smooth[i + SMOOTH] for i in range(0, max(0, len(smooth) - SMOOTH))]
    biggest = max(jumps, default=0.0)
    if total_drop > 0 and biggest < 0.5 * total_drop and a > 0 and _declining(smooth[:a]):
        return "gradual"
    # Two distinct levels inside one episode are phases too.
    if len(vals) >= 8:
        half = len(vals) // 2
        l1, l2 = statistics.median(vals[:half]), statistics.median(vals[half:])
        if abs(l1 - l2) > baseline * thr_pct / 100.0 * 2 / 3:
            if _declining(smooth[a : b + 1]) and biggest < 0.5 * total_drop:
                return "gradual"
            return "phased"
    cv = (
        statistics.pstdev(vals) / statistics.fmean(vals) if len(vals) >= 2 and statistics.fmean(vals) else 0.0
    )
    # One sustained shift: most of the run degraded at one flat level is the RDMA-style
    # constant drop; a shift late in an otherwise healthy run is a one-time event.
    return "constant-drop" if cv < 0.05 and a < len(smooth) / 2 else "one-time"


def _declining(vals: list[float]) -> bool:
    """A steady slide: the values trend down across the window (first third vs last third)."""
    if len(vals) < 6:
        return False
    third = len(vals) // 3
    return statistics.fmean(vals[:third]) > statistics.fmean(vals[-third:]) * 1.02


def _rolling_median(vals: list[float], w: int) -> list[float]:
    if len(vals) < w:
        return list(vals)
    half = w // 2
    out = []
    for i in range(len(vals)):
        lo, hi = max(0, i - half), min(len(vals), i + half + 1)
        out.append(statistics.median(vals[lo:hi]))
    return out


def _episodes(low: list[bool], *, gap: int) -> list[tuple[int, int]]:
    """Maximal runs of True (indices), merging runs separated by at most `gap` False values."""
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for i, flag in enumerate(low):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i - 1))
            start = None
    if start is not None:
        runs.append((start, len(low) - 1))
    merged: list[tuple[int, int]] = []
    for r in runs:
        if merged and r[0] - merged[-1][1] - 1 <= gap:
            merged[-1] = (merged[-1][0], r[1])
        else:
            merged.append(r)
    # A run of 1–2 steps is a spike, not an episode.
    return [r for r in merged if r[1] - r[0] + 1 >= 3]


def _regular_spikes(series: list[tuple[int, float]], med: float) -> tuple[int, ...]:
    slow = [k for k, v in series if v < med * 0.75]
    if len(slow) < 2:
        return ()
    gaps = {b - a for a, b in zip(slow, slow[1:], strict=False)}
    return tuple(slow) if len(gaps) == 1 else ()
