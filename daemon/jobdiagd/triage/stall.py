"""How long may a job go without a new step before it counts as stalled — one rule for
triage, the daemon's hang detector and backtest, so they can never disagree.

Budget = max(stall_factor × steady step time, min_stall_s), phase-aware:
- before the first step (startup, compilation, the pre-training barrier): `startup_s`;
- when the next step is slowed by a checkpoint save (the save step k·P and the one after
  it, k·P+2 too for asynchronous saves, or a save the log showed), an eval (`eval_interval`)
  or the profiler window -- the checkpoint phase (rule HANG-4):
  - a save or the profiler's trace dump (a write to the shared filesystem): at least
    `checkpoint_s`, more when this run has already shown such a step slower than
    `checkpoint_s` / 1.5 (its slowest × 1.5);
  - an eval alone: the slowest eval-slowed step this run has shown × 1.5, else `checkpoint_s`;
  never less than the normal budget;
- the wait for step 1 when checkpointing is on: the initial save at step 0, `checkpoint_s`;
- the first steps after start/restore (warmup): learned from the run itself -- twice the
  first step (compilation) while waiting for the second, then the slowest step since the
  first × 1.5 (a recompilation), never less than the normal budget.

Why a save's budget is never learned down (rule HANG-4): what a save costs is the shared
filesystem's doing, not the job's. The step after MaxText's initial save at step 0 says
nothing about the periodic ones (an asynchronous save barely slows it; it is a warmup step
too), and one periodic save says little about the next: on a busy VAST/NFS the same save
blocks the step after it for 5-20 steps (runbook: "post-checkpoint steps of 300-500 s" for
~30 s steps), a normal save, not a hang. The rule holds for the three cases:
- synchronous save: the write lands in step k·P+1's `seconds:`, so a stall waiting for
  k·P+1 is in the checkpoint phase, at least `checkpoint_s`;
- asynchronous save: the commit blocks the step that runs beside it, k·P+1 or k·P+2
  (runbook: "the checkpoint step and 1-2 steps after"), both in the phase; I/O contention
  spread over later steps slows them by a fraction, within the normal budget;
- a save that blocks many steps' worth of time on a slow filesystem: one long step k·P+1
  (the stall sits at the step after the save), covered up to `checkpoint_s`, and beyond it
  once the run has shown saves that long.
A hang during a save is still paged once `checkpoint_s` is over (the learned extension only
for a run whose own saves took longer); a RAY=1 job's GPU-confirmed early page does not wait
for it (`detectors.hang`: a spinning collective is not a save, whose GPUs sit idle).
An eval is the job's own compute over a fixed eval set: one shown eval does predict the next.
The step after the initial save is never a sample: only steps past the run's warmup, or right
after a periodic save the log showed, teach a cost.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from jobdiagd.model.kinds import StallPhase
from jobdiagd.model.records import StepRecord
from jobdiagd.model.triage import CheckpointConfig
from jobdiagd.triage.progress import WARMUP_STEPS


@dataclass(frozen=True, slots=True)
class StallPolicy:
    stall_factor: float = 3.0
    min_stall_s: float = 120.0
    startup_s: float = 1800.0
    checkpoint_s: float = 900.0
    learned_checkpoint_factor: float = 1.5

    @property
    def shortest_budget(self) -> float:
        """No budget `stall_budget` gives is shorter: before the first step it is `startup_s`,
        in every other phase at least the normal budget, itself at least `min_stall_s`."""
        return min(self.min_stall_s, self.startup_s)


@dataclass(frozen=True, slots=True)
class Budget:
    seconds: float
    phase: StallPhase


def stall_budget(
    steps: list[StepRecord], step_time: float | None, ckpt: CheckpointConfig, policy: StallPolicy
) -> Budget:
    if not steps:
        return Budget(policy.startup_s, StallPhase.STARTUP)
    normal = max(policy.stall_factor * (step_time or 0.0), policy.min_stall_s)
    first = steps[0].step
    last = steps[-1].step
    if last - first < WARMUP_STEPS - 1 or step_time is None:
        warmup = _warmup_budget(steps, normal, policy)
        if last == 0 and (ckpt.enabled or 0 in ckpt.saves):
            # MaxText saves the initial state right after step 0 (orbax saves every step that
            # is a multiple of the period, 0 included), so the wait for step 1 holds the first
            # save -- the slowest one, nothing learned yet. Twice the compile step paged a
            # healthy job whose initial save outlasted it. A run restored at step N > 0 makes
            # no initial save, so this is only for a run that starts at step 0.
            return Budget(max(warmup, policy.checkpoint_s), StallPhase.CHECKPOINT)
        return Budget(warmup, StallPhase.WARMUP)
    upcoming = _slowed_by(ckpt, last + 1)
    if upcoming:
        seen = _slowest_shown(steps, ckpt, upcoming, first, last)
        allow = max(_allowance(k, seen.get(k), policy) for k in upcoming)
        return Budget(max(normal, allow), StallPhase.CHECKPOINT)
    return Budget(normal, StallPhase.STEADY)


_SAVE, _EVAL, _PROFILER = "save", "eval", "profiler"


def _slowed_by(ckpt: CheckpointConfig, step: int) -> frozenset[str]:
    """What slows this step: a save, an eval, the profiler (empty: a steady step)."""
    if not ckpt.adjacent(step):
        return frozenset()
    kinds = (
        (_SAVE, ckpt.saving(step)),
        (_EVAL, ckpt.evaluating(step)),
        (_PROFILER, ckpt.profiled(step)),
    )
    return frozenset(k for k, yes in kinds if yes)


def _slowest_shown(
    steps: list[StepRecord], ckpt: CheckpointConfig, kinds: frozenset[str], first: int, last: int
) -> dict[str, float]:
    """The slowest step of each of `kinds` this run has shown: past its warmup, or right after a
    periodic save the log showed. Never the step after the initial save at step 0 (step 1 also
    sits on every grid, 1 % P == 1: that says nothing of a save or an eval), nor the last two
    steps (they belong to the slowdown now in progress)."""
    seen: dict[str, float] = {}
    for i, s in enumerate(steps):
        past_warmup = s.step - first >= WARMUP_STEPS
        after_periodic_save = s.step > 1 and s.step - 1 in ckpt.saves
        if s.step > last - 2 or not (past_warmup or after_periodic_save):
            continue
        shown = _slowed_by(ckpt, s.step) & kinds
        cost = step_cost(steps, i) if shown else None
        if cost is None:
            continue
        for k in shown:
            seen[k] = max(seen.get(k, 0.0), cost)
    return seen


def _allowance(kind: str, slowest: float | None, policy: StallPolicy) -> float:
    """How long one kind of slowdown may hold the next step (rule HANG-4)."""
    learned = slowest * policy.learned_checkpoint_factor if slowest is not None else None
    if kind == _EVAL:
        return learned if learned is not None else policy.checkpoint_s
    # A write to the shared filesystem: the configured allowance, extended by what the run showed.
    return max(policy.checkpoint_s, learned or 0.0)


def step_cost(steps: list[StepRecord], i: int) -> float | None:
    """How long step i really took: its `seconds`, or the time since the previous step's line
    when both are dated and longer (an eval or a save may sit outside the step's own timing)."""
    s = steps[i]
    cost = s.seconds
    if i > 0 and s.time is not None:
        prev = steps[i - 1]
        if prev.step == s.step - 1 and prev.time is not None and s.time > prev.time:
            cost = max(cost or 0.0, s.time - prev.time)
    return cost


def _warmup_budget(steps: list[StepRecord], normal: float, policy: StallPolicy) -> float:
    """The first steps of a run, learned from what the run has shown: after the first step
    (compilation included) the next may recompile, so allow twice the first step; after
    that, the slowest step since the first (a second compile) with the usual factor."""
    secs = [s.seconds for s in steps if s.seconds is not None]
    if not secs:
        return max(policy.startup_s, normal)
    if len(secs) == 1:
        return max(normal, 2.0 * secs[0])
    after = secs[1:]
    return max(
        normal,
        policy.stall_factor * statistics.median(after),
        policy.learned_checkpoint_factor * max(after),
    )
