"""How long may a job go without a new step before it counts as stalled — one rule for
triage, the daemon's hang detector and backtest, so they can never disagree.

Budget = max(stall_factor × steady step time, min_stall_s), phase-aware:
- before the first step (startup, compilation, the pre-training barrier): `startup_s`;
- when the next step follows a checkpoint save (the save step k·P and the one after it):
  the slowest checkpoint-adjacent step this job has already shown × 1.5, else
  `checkpoint_s`; never less than the normal budget;
- the first steps after start/restore (warmup, often recompilation): `startup_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobdiagd.model.records import StepRecord
from jobdiagd.triage.progress import WARMUP_STEPS, CheckpointConfig


@dataclass(frozen=True, slots=True)
class StallPolicy:
    stall_factor: float = 3.0
    min_stall_s: float = 120.0
    startup_s: float = 1800.0
    checkpoint_s: float = 900.0
    learned_checkpoint_factor: float = 1.5


@dataclass(frozen=True, slots=True)
class Budget:
    seconds: float
    phase: str  # startup | warmup | checkpoint | steady


def stall_budget(
    steps: list[StepRecord], step_time: float | None, ckpt: CheckpointConfig, policy: StallPolicy
) -> Budget:
    if not steps:
        return Budget(policy.startup_s, "startup")
    normal = max(policy.stall_factor * (step_time or 0.0), policy.min_stall_s)
    last = steps[-1].step
    if last - steps[0].step < WARMUP_STEPS - 1 or step_time is None:
        return Budget(max(policy.startup_s, normal), "warmup")
    nxt = last + 1
    if ckpt.adjacent(nxt) or ckpt.adjacent(last):
        seen = [s.seconds for s in steps if s.seconds is not None and ckpt.adjacent(s.step)]
        learned = max(seen) * policy.learned_checkpoint_factor if seen else policy.checkpoint_s
        return Budget(max(normal, learned), "checkpoint")
    return Budget(normal, "steady")
