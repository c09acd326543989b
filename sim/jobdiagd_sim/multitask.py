"""Multi-task jobs whose step lines carry no timestamp, with ground-truth times, for backtest figures.

Every task prints its own undated `completed step:` line (print()-era MaxText under `srun -l`,
task 0 authoritative, the tasks' order shuffled), 8-24 tasks, some RAY=1. Healthy jobs save
checkpoints (the step-0 save of a fresh run too) and run evals whose blocking time lands in the
next step's `seconds:`, as in MaxText's train loop; the costs stay within what the daemon's
stall policy allows (`triage.stall`: the step after the step-0 save is a warmup step). Hung
jobs stop printing steps -- mid-training, right after a checkpoint save, during warmup, or after
the pre-training barrier before step 0 -- while XLA/NCCL/Ray chatter with its own timestamps
goes on until the job is cancelled. `Case` carries the true times (the simulator's clock) the
bench measures page latency against.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from jobdiagd_sim.job import SIM_EPOCH, JobSim, JobSpec


@dataclass(frozen=True)
class Plan:
    name: str
    ntasks: int
    steps: int  # steps=T in PASSTHROUGH_ARGS
    step_time: float
    ray: bool = False
    period: int | None = None  # checkpoint_period (None: checkpointing off)
    save_cost: float = 0.0  # blocking seconds of a periodic save (in the next step's seconds)
    eval_interval: int | None = None
    eval_cost: float = 0.0
    restore_from: int | None = None
    # None: healthy to the end. Else the last step printed before the hang (-1: none, the job
    # hangs after the pre-training barrier).
    hang_after: int | None = None
    hang_kind: str | None = None  # mid | after-checkpoint | warmup | before-step-0
    hang_for: float = 2 * 3600.0


@dataclass(frozen=True)
class Case:
    plan: Plan
    job_dir: Path
    log: Path
    job_id: str
    last_step: int | None  # the last step printed
    last_step_t: float | None  # when it completed, on the simulator's clock (epoch seconds)
    barrier_t: float | None  # when the barrier was passed (epoch seconds)
    total_seconds: float  # sum of the authoritative `seconds:` fields

    @property
    def healthy(self) -> bool:
        return self.plan.hang_after is None


PLANS: tuple[Plan, ...] = (
    # healthy
    Plan("ok-8-ckpt", 8, 100, 5.6, period=20, save_cost=60),
    Plan("ok-12-ckpt-eval", 12, 120, 6.5, period=25, save_cost=45, eval_interval=10, eval_cost=30),
    Plan("ok-16-ckpt", 16, 150, 8.0, period=50, save_cost=100),
    Plan("ok-24-ckpt", 24, 100, 14.0, period=30, save_cost=180),
    Plan("ok-8-ray", 8, 100, 5.2, ray=True, period=25, save_cost=50),
    Plan("ok-16-ray-eval", 16, 120, 10.0, ray=True, period=40, save_cost=120, eval_interval=20, eval_cost=60),
    Plan("ok-24-restored", 24, 300, 9.0, period=50, save_cost=400, restore_from=100),
    Plan("ok-12-ray-restored", 12, 250, 7.0, ray=True, period=50, save_cost=150, restore_from=150),
    Plan("ok-8-nockpt", 8, 60, 20.0),
    Plan("ok-24-ckpt-eval", 24, 100, 6.0, period=20, save_cost=90, eval_interval=20, eval_cost=45),
    Plan("ok-12-short-steps", 12, 200, 2.5, period=40, save_cost=60),
    Plan("ok-16-ray", 16, 90, 12.0, ray=True, period=30, save_cost=150),
    # hangs
    Plan("hang-8-mid", 8, 1000, 5.6, period=20, save_cost=60, hang_after=57, hang_kind="mid"),
    Plan(
        "hang-12-after-ckpt",
        12,
        1000,
        6.5,
        period=20,
        save_cost=45,
        hang_after=40,
        hang_kind="after-checkpoint",
    ),
    Plan(
        "hang-16-before-step0",
        16,
        1000,
        8.0,
        period=50,
        save_cost=100,
        hang_after=-1,
        hang_kind="before-step-0",
    ),
    Plan("hang-24-mid", 24, 1000, 14.0, period=30, save_cost=180, hang_after=33, hang_kind="mid"),
    Plan("hang-8-ray-mid", 8, 1000, 5.2, ray=True, period=25, save_cost=50, hang_after=61, hang_kind="mid"),
    Plan(
        "hang-16-ray-after-ckpt",
        16,
        1000,
        10.0,
        ray=True,
        period=40,
        save_cost=120,
        hang_after=80,
        hang_kind="after-checkpoint",
    ),
    Plan("hang-24-warmup", 24, 1000, 14.0, period=30, save_cost=180, hang_after=1, hang_kind="warmup"),
    Plan(
        "hang-12-ray-before-step0",
        12,
        1000,
        7.0,
        ray=True,
        period=50,
        save_cost=80,
        hang_after=-1,
        hang_kind="before-step-0",
    ),
    Plan(
        "hang-24-restored-after-ckpt",
        24,
        1000,
        9.0,
        period=25,
        save_cost=400,
        restore_from=100,
        hang_after=175,
        hang_kind="after-checkpoint",
    ),
    Plan(
        "hang-8-after-eval",
        8,
        1000,
        6.0,
        period=50,
        save_cost=60,
        eval_interval=10,
        eval_cost=40,
        hang_after=30,
        hang_kind="mid",
    ),
    Plan(
        "hang-24-restored-mid",
        24,
        1000,
        9.0,
        period=50,
        save_cost=400,
        restore_from=100,
        hang_after=140,
        hang_kind="mid",
    ),
    Plan("hang-16-step0", 16, 1000, 8.0, period=50, save_cost=100, hang_after=0, hang_kind="warmup"),
)


def build(plan: Plan, root: Path, seed: int = 0, job_id: str | None = None) -> Case:
    """Write one job under `root` (the outputs layout) and return its ground truth."""
    rng = random.Random(f"multitask:{plan.name}:{seed}")
    extra: dict[str, object] = {}
    if plan.eval_interval:
        extra["eval_interval"] = plan.eval_interval
    spec = JobSpec(
        job_id=job_id or str(60000 + (PLANS.index(plan) if plan in PLANS else 999)),
        model="llama3.1-70b",
        tag=plan.name,
        nnodes=plan.ntasks,
        ray=plan.ray,
        steps=plan.steps,
        checkpointing=plan.period is not None,
        checkpoint_period=plan.period,
        extra_args=extra,
        step_time=plan.step_time,
        start=SIM_EPOCH + rng.randrange(0, 30 * 86400),
        absl=False,  # undated step lines; XLA/NCCL/Ray chatter keeps its stamps
    )
    if spec.ray:
        spec.ray_port = spec.jax_port + 1
    sim = JobSim(spec, rng)
    sim.header()
    sim.stages_ok()
    sim.train_begin()
    sim.env_dumps()
    if spec.ray:
        sim.ray_start()
    sim.init_training(restore_from=plan.restore_from)
    barrier_t = sim.t
    first = 0 if plan.restore_from is None else plan.restore_from + 1

    def seconds(step: int) -> float:
        secs = sim.default_seconds(step, first)
        prev = step - 1
        if plan.period and prev >= first and prev % plan.period == 0:
            secs += plan.save_cost * rng.uniform(0.95, 1.05)
        if plan.eval_interval and prev >= first and prev > 0 and prev % plan.eval_interval == 0:
            secs += plan.eval_cost * rng.uniform(0.95, 1.05)
        return secs

    last = plan.steps - 1 if plan.hang_after is None else plan.hang_after
    if last >= first:
        sim.steps(first, last, seconds, noise_per_step=0.5)
    if plan.hang_after is None:
        sim.train_end_ok()
        sim.summary(0)
    else:
        sim.quiet_noise(plan.hang_for, 60.0)
        sim.cancel_cascade()
    job_dir, log = sim.write(root)
    recs = sim.records
    return Case(
        plan=plan,
        job_dir=job_dir,
        log=log,
        job_id=spec.job_id,
        last_step=recs[-1].step if recs else None,
        last_step_t=recs[-1].t if recs else None,
        barrier_t=barrier_t,
        total_seconds=sum(r.seconds for r in recs),
    )


def build_all(root: Path, seed: int = 0) -> list[Case]:
    return [build(p, root, seed) for p in PLANS]
