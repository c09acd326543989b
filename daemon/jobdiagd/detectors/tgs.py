"""TGS-trend detector: triage's TGS analysis (`triage.tgs.analyze_tgs`) run online, one incident per episode.

An episode opens when the recent TGS (last 10 clean steps) is more than `drop_pct` below the
steps-5–15 baseline, with the pattern, step range and magnitude triage would report; it
stays open (re-emitted every tick) until the TGS is back within half the threshold, on the
recent mean and on the median of the last 30 clean steps (hysteresis, so a noisy job hovering
near the threshold is one episode, not many). Checkpoint
spikes are excluded by the analysis itself. The analysis is recomputed every
`RECOMPUTE_STEPS` new steps but at most every `RECOMPUTE_S` per job (staggered), on the first
64 and last 512 steps: a trend over 10-step windows cannot change faster than that, and
200 long jobs must fit in one tick.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from jobdiagd.config import Config
from jobdiagd.detectors.base import (
    DetectorSpec,
    NoData,
    Outcome,
    RefreshRation,
    StatusPart,
    WatchedJob,
    resolved_finding,
    staggered,
)
from jobdiagd.model.alerts import Finding
from jobdiagd.model.kinds import IncidentKind
from jobdiagd.model.records import StepRecord
from jobdiagd.model.triage import TgsAnalysis
from jobdiagd.triage.tgs import BASELINE_FROM, RECENT, analyze_tgs

NAME = "tgs"
KIND = IncidentKind.TGS_DEGRADATION
RECOMPUTE_STEPS = 5
# ... and at most this often per job (staggered per job so 200 jobs do not all recompute in one tick).
RECOMPUTE_S = 120.0
MAX_PER_TICK = 10


EARLY = 64  # the baseline lives in steps 5-15 after the first
LATE = 512


def window(steps: list[StepRecord]) -> list[StepRecord]:
    """Online, the analysis sees the first `EARLY` and the last `LATE` steps: the baseline and the
    recent window are exact, an episode's range is clipped to the last 512 steps (the job-end
    report re-runs triage on everything)."""
    if len(steps) <= EARLY + LATE:
        return steps
    return steps[:EARLY] + steps[-LATE:]


@dataclass
class TrendMemo:
    """The last TGS analysis of a job and whether an episode is open (the detector keeps one per job)."""

    last_step: int
    analysis: TgsAnalysis
    episode: bool
    at: float


def _recent_median(
    steps: list[StepRecord], view: WatchedJob, a: TgsAnalysis, b_from: int, n: int
) -> float | None:
    """Median throughput of the last `n` clean steps (checkpoint/eval/profiler steps left out)."""
    ckpt = view.checkpoint()
    first = steps[0].step if steps else 0
    clean = [s for s in steps if s.step - first >= b_from and not ckpt.adjacent(s.step)]
    if a.metric == "tokens/s/device":
        vals = [s.tgs for s in clean if s.tgs]
    else:
        vals = [1.0 / s.seconds for s in clean if s.seconds]
    recent = [v for v in vals[-n:] if v is not None]
    return statistics.median(recent) if recent else None


def _confirmed(
    steps: list[StepRecord], view: WatchedJob, a: TgsAnalysis, drop_pct: float, b_from: int, recent_n: int
) -> bool:
    """Online guard: the *median* of the recent window must be low too.

    Triage's recent mean is right for a finished job, but live, one or two slow steps (a
    recompilation, a profiler step) inside the last 10 drag the mean down for a while and
    would open an episode that vanishes a few steps later.
    """
    if a.baseline is None:
        return False
    med = _recent_median(steps, view, a, b_from, recent_n)
    return med is not None and med < a.baseline * (1 - drop_pct / 100.0)


def _recovered(
    steps: list[StepRecord], view: WatchedJob, a: TgsAnalysis, drop_pct: float, b_from: int, recent_n: int
) -> bool:
    """An open episode ends when throughput is back within half the threshold -- on the recent
    mean and on the median of 3x the recent window, so a noisy job hovering near the threshold
    (a +-20% jitter around a slightly lower level) stays one episode instead of flapping."""
    if a.baseline is None or a.change_pct is None:
        return True
    if a.change_pct <= -drop_pct / 2:
        return False
    med = _recent_median(steps, view, a, b_from, 3 * recent_n)
    return med is None or med >= a.baseline * (1 - drop_pct / 200.0)


class TgsDetector:
    name = NAME
    on_data = False
    on_gpu_check = False

    def __init__(
        self,
        drop_pct: float = 10.0,
        baseline_steps: tuple[int, int] = (BASELINE_FROM, 15),
        recent_steps: int = RECENT,
    ) -> None:
        self.drop_pct = drop_pct
        self.baseline_steps = baseline_steps
        self.recent_steps = recent_steps
        self._ration = RefreshRation(MAX_PER_TICK)
        self._memo: dict[str, TrendMemo] = {}  # job -> the last analysis and its episode state

    def forget(self, key: str) -> None:
        self._memo.pop(key, None)

    def trend_state(self, key: str) -> TrendMemo | None:
        """The job's last analysis (None before its first)."""
        return self._memo.get(key)

    def status(self, view: WatchedJob, now: float) -> StatusPart | None:
        memo = self._memo.get(view.key)
        a = memo.analysis if memo is not None else None
        if memo is None or a is None or a.baseline is None:
            return idle_status(view)
        return {"tgs": {"degraded": memo.episode, "pattern": a.pattern, "change_pct": a.change_pct}}

    def _due(self, memo: TrendMemo, last: int, now: float, ended: bool) -> bool:
        if ended:
            return last != memo.last_step
        if last - memo.last_step < RECOMPUTE_STEPS or now - memo.at < RECOMPUTE_S:
            return False
        return self._ration.spend(now)  # optional work: at most MAX_PER_TICK recomputes a tick

    def check(self, view: WatchedJob, now: float) -> Outcome:
        last = view.last_step
        if last is None:
            return NoData("no steps yet")
        memo = self._memo.get(view.key)
        if memo is None or self._due(memo, last, now, view.ended):
            steps = window(view.sorted_steps())
            if not steps:
                return NoData("no step record")
            a = analyze_tgs(
                steps,
                view.checkpoint(),
                threshold_pct=self.drop_pct,
                baseline_steps=self.baseline_steps,
                recent_steps=self.recent_steps,
            )
            episode = memo.episode if memo is not None else False
            if a.degraded and _confirmed(
                steps, view, a, self.drop_pct, self.baseline_steps[0], self.recent_steps
            ):
                episode = True
            elif _recovered(steps, view, a, self.drop_pct, self.baseline_steps[0], self.recent_steps):
                episode = False
            # First analysis: back-date it by a per-job offset to spread later recomputes.
            at = now if memo is not None else staggered(now, view.key, RECOMPUTE_S)
            memo = TrendMemo(last, a, episode, at)
            self._memo[view.key] = memo
        a = memo.analysis
        if a.baseline is None:
            return NoData(a.note or "no TGS baseline yet")
        if not memo.episode:
            back = f"TGS back to {a.recent:g} {a.metric} ({a.change_pct:+.0f}% vs baseline) at step {memo.last_step}"
            return [resolved_finding(NAME, view.key, KIND, back, memo.last_step)]
        rng = a.range or f"…–{memo.last_step}"
        summary = f"TGS {a.magnitude or f'{a.change_pct:+.0f}%'} over steps {rng} ({a.pattern})"
        details = {
            "pattern": a.pattern,
            "step range": rng,
            "magnitude": a.magnitude,
            f"baseline (steps {self.baseline_steps[0]}–{self.baseline_steps[1]})": f"{a.baseline:g} {a.metric}",
            f"recent (last {self.recent_steps} steps)": f"{a.recent:g} {a.metric}",
            "change": f"{a.change_pct:+.1f}%",
            "runbook": "tgs-degradation: extract the TGS timeline, check TSDB Playbook 6 (network) / 7 (contention)",
        }
        return [Finding(NAME, view.key, KIND, "warning", summary, details, at_step=memo.last_step)]


def idle_status(view: WatchedJob) -> StatusPart:
    return {"tgs": None}


def _factory(cfg: Config) -> TgsDetector:
    t = cfg.detectors.tgs
    return TgsDetector(t.drop_pct, (t.baseline_first_step, t.baseline_last_step), t.recent_steps)


SPEC = DetectorSpec(
    NAME,
    True,
    _factory,
    "TGS (tokens/s/device) slide vs the steps 5–15 baseline: pattern, step range, magnitude",
    idle_status,
)
