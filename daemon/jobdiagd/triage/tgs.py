"""TGS (tokens/s/device) trend analysis: the proactive check and pattern table (rules TGS-1 to TGS-7), pure.

Baseline = steps 5–15 after the first step, recent = the last 10 steps, both without
checkpoint-adjacent steps; degraded when recent is more than `threshold_pct` below.
When the step lines carry no `Tokens/s/device` (2023-era logs) the rate 1/seconds
stands in for it, so percentages keep their meaning.

Pattern rules TGS-3 to TGS-7 (docs/rules.md, decisions marked there). Real step times jitter by
a few percent and have one-off outliers, so every rule works on a rolling median whose width
grows with the run (5–15 steps) and on least-squares fits, never on single steps:
- low episodes: runs where the smoothed TGS is more than `threshold_pct` below baseline, with
  hysteresis (a run ends only when it is back within half the threshold) and a minimum length
  (half the smoothing window); episodes closer than the window are one episode;
- `phased`: two or more low episodes separated by a recovery, or one episode with two
  distinct levels (> 2×threshold/3 apart) that a slide does not explain;
- `gradual`: a steady slide — a "flat, then a straight decline" fit (the decline over at
  least two smoothing windows, worth at least the threshold) explains the series as well as
  a single step does;
- `constant-drop`: one shift to a lower level that stays there (no trend inside it) and covers
  most of the run (starts in the first half) — every step slower by the same delta, the RDMA
  signature;
- `one-time`: one shift that never recovers but starts late in an otherwise healthy run, or
  keeps sinking after it;
- `periodic`: slow steps only at checkpoint/eval-adjacent steps (k·P, k·P+1) — expected, never
  degradation — or, when the period is unknown, isolated spikes (1–2 steps) recurring at one
  interval at least three times. The profiler window (configured, or the profiler
  activation/deactivation steps the log printed) is a one-off: excluded from the baseline,
  the recent window and the spikes, it never makes a pattern.
"""

from __future__ import annotations

import statistics

from jobdiagd.model.kinds import TgsPattern
from jobdiagd.model.records import StepRecord
from jobdiagd.model.triage import CheckpointConfig, TgsAnalysis

BASELINE_FROM, BASELINE_TO = 5, 15
RECENT = 10
SMOOTH = 5  # the smallest smoothing window
SMOOTH_MAX = 15
FIT_CANDIDATES = 32  # change points tried by the step / slide fits (even spacing)


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
    """`baseline_steps` counts from the first step of the run; defaults per rule TGS-1 (5–15, 10)."""
    b_from, b_to = baseline_steps
    series, metric = _series(steps)
    none = TgsAnalysis.no_trend(metric)
    if not series:
        return none
    first = steps[0].step
    steady = [(k, v) for k, v in series if k - first >= b_from]
    clean = [(k, v) for k, v in steady if not ckpt.adjacent(k)]
    base_vals = [v for k, v in clean if b_from <= k - first <= b_to]
    if len(base_vals) < 3:
        return TgsAnalysis.no_trend(metric, "not enough steps for a baseline")
    baseline = statistics.fmean(base_vals)
    recent_vals = [v for _, v in clean[-recent_steps:]]
    recent = statistics.fmean(recent_vals)
    change = (recent - baseline) / baseline * 100.0
    degraded = change < -threshold_pct

    med = statistics.median(v for _, v in clean) if clean else baseline
    spikes = _periodic_spikes(steady, ckpt, med)

    keys = [k for k, _ in clean]
    shape = _shape([v for _, v in clean], baseline, threshold_pct)
    pattern = TgsPattern.NONE
    rng: tuple[int, int] | None = None
    magnitude: str | None = None
    if shape is not None and (degraded or shape[0] == TgsPattern.PHASED):
        pattern, a, b = shape
        rng = (keys[a], keys[b])
        low_vals = [v for _, v in clean[a : b + 1]]
        level = statistics.fmean(low_vals[-RECENT:]) if degraded else min(_rolling_median(low_vals, SMOOTH))
        pct = (level - baseline) / baseline * 100.0
        magnitude = f"{_fmt(baseline, metric)} → {_fmt(level, metric)}, {pct:+.0f}%"
    elif spikes and not degraded:
        pattern = TgsPattern.PERIODIC
    if pattern in (TgsPattern.NONE, TgsPattern.PERIODIC) and degraded:
        # The recent steps are low but no episode or slide shows in the smoothed series (a short
        # run): the decline is spread out.
        pattern = TgsPattern.GRADUAL
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


def _window(n: int) -> int:
    """The smoothing window: 5 steps for short runs, up to 15 for long ones (odd)."""
    w = max(SMOOTH, min(SMOOTH_MAX, n // 20))
    return w if w % 2 else w + 1


def _shape(vals: list[float], baseline: float, thr_pct: float) -> tuple[TgsPattern, int, int] | None:
    """(pattern, first index, last index) of the degradation in `vals`, or None when the
    smoothed series never stays below the threshold."""
    n = len(vals)
    if n < SMOOTH:
        return None
    w = _window(n)
    smooth = _rolling_median(vals, w)
    thr = baseline * thr_pct / 100.0
    episodes = _episodes(smooth, baseline - thr, baseline - thr / 2, gap=w, min_len=w)
    if not episodes:
        return None
    if len(episodes) >= 2:
        return (TgsPattern.PHASED, episodes[0][0], episodes[-1][1])
    a, b = episodes[0]
    slide = _slide(vals, w)
    if slide is not None:
        start, drop = slide
        if drop >= thr:
            return (TgsPattern.GRADUAL, min(start, a), b)
    seg = vals[a : b + 1]
    if len(seg) >= 2 * w:
        # Two distinct levels inside the episode (a slide was ruled out above) are phases too.
        c, l1, l2, _ = _best_step(seg, w)
        if abs(l1 - l2) > thr * 2 / 3:
            return (TgsPattern.PHASED, a, b)
    # One sustained shift: most of the run degraded at one level is the RDMA-style constant
    # drop; a shift late in an otherwise healthy run, or one that keeps sinking, is one-time.
    trend = _line_drop(seg)
    flat = abs(trend) < thr / 2
    return (TgsPattern.CONSTANT_DROP if flat and a < n / 2 else TgsPattern.ONE_TIME, a, b)


def _candidates(n: int, margin: int) -> list[int]:
    lo, hi = margin, n - margin
    if hi <= lo:
        return []
    step = max(1, (hi - lo) // FIT_CANDIDATES)
    return list(range(lo, hi, step))


def _prefix(vals: list[float]) -> tuple[list[float], list[float]]:
    s, q = [0.0], [0.0]
    for v in vals:
        s.append(s[-1] + v)
        q.append(q[-1] + v * v)
    return s, q


def _sse(s: list[float], q: list[float], i: int, j: int) -> float:
    """Sum of squared deviations from their mean of vals[i:j]."""
    m = j - i
    if m <= 0:
        return 0.0
    tot = s[j] - s[i]
    return (q[j] - q[i]) - tot * tot / m


def _best_step(vals: list[float], margin: int) -> tuple[int, float, float, float]:
    """The best single change point (two levels): (index, level before, level after, SSE)."""
    s, q = _prefix(vals)
    n = len(vals)
    best = (0, s[n] / n, s[n] / n, _sse(s, q, 0, n))
    for c in _candidates(n, margin):
        sse = _sse(s, q, 0, c) + _sse(s, q, c, n)
        if sse < best[3]:
            best = (c, (s[c] - s[0]) / c, (s[n] - s[c]) / (n - c), sse)
    return best


class _Fits:
    """Prefix sums of a series for O(1) least-squares fits at any change point."""

    def __init__(self, vals: list[float]) -> None:
        self.n = len(vals)
        self.s, self.q = _prefix(vals)
        self.iv = [0.0]  # prefix sums of i * v
        for i, v in enumerate(vals):
            self.iv.append(self.iv[-1] + i * v)

    def hinge(self, c: int) -> tuple[float, float]:
        """Fit of "flat, then a straight line from index c" (x = max(0, i - c)): (slope, SSE)."""
        n, s, q = self.n, self.s, self.q
        m = n - c
        sx = m * (m - 1) / 2
        sxx = (m - 1) * m * (2 * m - 1) / 6
        sxv = (self.iv[n] - self.iv[c]) - c * (s[n] - s[c])
        sv, svv = s[n], q[n]
        vxx = sxx - sx * sx / n
        vvv = svv - sv * sv / n
        if vxx <= 0:
            return 0.0, vvv
        slope = (sxv - sx * sv / n) / vxx
        return slope, max(0.0, vvv - slope * slope * vxx)


def _slide(vals: list[float], w: int) -> tuple[int, float] | None:
    """A steady slide: (start index, total drop) when a "flat, then a straight decline over at
    least two smoothing windows" fit explains `vals` at least as well as one step does."""
    n = len(vals)
    min_run = max(2 * w, 10)
    if n < min_run + 2:
        return None
    fits = _Fits(vals)
    best: tuple[int, float, float] | None = None
    for c in [0, *_candidates(n - min_run, w)]:
        slope, sse = fits.hinge(c)
        if slope < 0 and (best is None or sse < best[2]):
            best = (c, slope, sse)
    if best is None:
        return None
    _, _, _, step_sse = _best_step(vals, w)
    c, slope, sse = best
    if sse > step_sse:
        return None
    return c, -slope * (n - 1 - c)


def _line_drop(vals: list[float]) -> float:
    """How much a least-squares line through `vals` falls over their length (negative: rises)."""
    slope, _ = _Fits(vals).hinge(0)
    return -slope * (len(vals) - 1)


def _rolling_median(vals: list[float], w: int) -> list[float]:
    if len(vals) < w:
        return list(vals)
    half = w // 2
    out = []
    for i in range(len(vals)):
        lo, hi = max(0, i - half), min(len(vals), i + half + 1)
        out.append(statistics.median(vals[lo:hi]))
    return out


def _episodes(
    smooth: list[float], enter: float, leave: float, *, gap: int, min_len: int
) -> list[tuple[int, int]]:
    """Runs (indices) where `smooth` is low: a run starts below `enter` and ends only above
    `leave` (hysteresis); runs separated by fewer than `gap` steps merge; shorter than
    `min_len`, a run is a spike, not an episode."""
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for i, v in enumerate(smooth):
        if start is None and v < enter:
            start = i
        elif start is not None and v > leave:
            runs.append((start, i - 1))
            start = None
    if start is not None:
        runs.append((start, len(smooth) - 1))
    merged: list[tuple[int, int]] = []
    for r in runs:
        if merged and r[0] - merged[-1][1] - 1 < gap:
            merged[-1] = (merged[-1][0], r[1])
        else:
            merged.append(r)
    return [r for r in merged if r[1] - r[0] + 1 >= min_len]


def _periodic_spikes(steady: list[tuple[int, float]], ckpt: CheckpointConfig, med: float) -> tuple[int, ...]:
    """Slow steps at checkpoint/eval-adjacent steps; with no period known, isolated spikes
    recurring at one interval. The profiler window never counts."""
    if ckpt.period or ckpt.eval_period or any(s > 0 for s in ckpt.saves):
        return tuple(k for k, v in steady if ckpt.periodic(k) and v < med * 0.75)
    return _regular_spikes([(k, v) for k, v in steady if not ckpt.profiled(k)], med)


def _regular_spikes(series: list[tuple[int, float]], med: float) -> tuple[int, ...]:
    slow = [k for k, v in series if v < med * 0.75]
    # Spike events: runs of consecutive slow steps; a run longer than 2 steps is a window
    # (a profiler, a stall), not a periodic spike.
    events: list[list[int]] = []
    for k in slow:
        if events and k - events[-1][-1] == 1:
            events[-1].append(k)
        else:
            events.append([k])
    if len(events) < 3 or any(len(e) > 2 for e in events):
        return ()
    gaps = {b[0] - a[0] for a, b in zip(events, events[1:], strict=False)}
    if len(gaps) != 1 or min(gaps) < 3:
        return ()
    return tuple(slow)
