"""How long may a job go without a new step before it counts as stalled — one rule for
triage, the daemon's hang detector and backtest, so they can never disagree.

Budget = max(stall_factor × steady step time, min_stall_s), phase-aware:
- before the first step (startup, compilation, the pre-training barrier): `startup_s`;
- when the next step is slowed by a checkpoint save (the save step k·P and the one after
  it, or a save the log showed), an eval (`eval_interval`) or the profiler window: the
  slowest such step this run has already shown past its warmup × 1.5, else `checkpoint_s`;
  never less than the normal budget;
- the wait for step 1 when checkpointing is on: the initial save at step 0, `checkpoint_s`;
- the first steps after start/restore (warmup): learned from the run itself -- twice the
  first step (compilation) while waiting for the second, then the slowest step since the
  first × 1.5 (a recompilation), never less than the normal budget.
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
    if ckpt.adjacent(last + 1):
        # Learned only from steps a save really slowed: past this run's warmup, or right after
        # a save the log showed (MaxText's initial save at step 0). Step 1 merely sitting on
        # the period's grid (1 % P == 1) says nothing about how long a save takes.
        costs = [
            _cost(steps, i)
            for i, s in enumerate(steps)
            if ckpt.adjacent(s.step)
            and s.step <= last - 2  # the last two steps belong to the save now in progress
            and (s.step - first >= WARMUP_STEPS or s.step - 1 in ckpt.saves)
        ]
        seen = [c for c in costs if c is not None]
        learned = max(seen) * policy.learned_checkpoint_factor if seen else policy.checkpoint_s
        return Budget(max(normal, learned), StallPhase.CHECKPOINT)
    return Budget(normal, StallPhase.STEADY)


def _cost(steps: list[StepRecord], i: int) -> float | None:
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
