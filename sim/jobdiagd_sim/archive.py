"""A simulated archive of training chains for the goodput ledger: weeks of jobs that train, hang,
crash and restart, with the truth of every run in `archive.json`.

Each chain is one training of a configuration (model, nodes, step time, checkpoint period, a
save cost that slows the step after each save) under its own experiment tag (`EXP_TAG`, part of
the job name), as concurrent trainings of one model write to their own checkpoint directories. Its runs end completed, hung (the steps stop,
the log keeps chatter until an operator cancels the job), on a node failure, a heartbeat
timeout, or a user's Python exception (which ends the chain). After an interruption the job is
requeued by Slurm (the next run appends to the same log) or resubmitted by hand under a new job
id, restoring the last checkpoint, after a gap. Users and partitions are in each node's
environment dump (`SLURM_JOB_USER`, `SLURM_JOB_PARTITION`, as `printenv` under srun shows
them). `small=True` makes cheap jobs (2 nodes, tens of steps, little chatter) for benchmarks.

    python -m jobdiagd_sim.archive OUT [--chains 40] [--seed 0] [--small]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from jobdiagd_sim import lines as L
from jobdiagd_sim.job import SIM_EPOCH, JobSim, JobSpec, encode_lines
from jobdiagd_sim.scenarios import _fail_exits, _heartbeat, _traceback

OUTCOMES = ("completed", "hang", "node-fail", "heartbeat", "python-exception")
USERS = ("alice", "bob", "carol", "dave")
PARTITIONS = ("mi300x", "mi355x")


@dataclass(frozen=True)
class Config:
    model: str
    nnodes: int
    step_time: float
    period: int
    steps: int
    save_s: float
    compile_time: float = 120.0


CONFIGS = (
    Config("llama3.1-70b", 4, 5.0, 100, 900, 40.0),
    Config("llama2-70b", 8, 6.0, 200, 1200, 60.0),
    Config("qwen3-30b-a3b", 2, 3.0, 150, 1000, 20.0),
)
SMALL = (
    Config("llama3.1-8b", 2, 1.5, 10, 40, 3.0, compile_time=10.0),
    Config("qwen3-30b-a3b", 1, 1.0, 10, 30, 2.0, compile_time=8.0),
)


@dataclass(frozen=True)
class ArchiveRun:
    job_id: str
    log: str  # relative to the archive root
    run_index: int  # in its log (a requeued job's runs share one)
    outcome: str
    first_step: int
    last_step: int
    restored_from: int | None
    link: str | None  # how it continues the chain's previous run: "requeue" | "restore" | "retry"
    start: float
    end: float
    save_s: float
    chatter_s: float | None = None  # a hang: seconds between the log lines it keeps writing


@dataclass(frozen=True)
class ArchiveChain:
    chain: str
    user: str
    partition: str
    model: str
    nnodes: int
    runs: tuple[ArchiveRun, ...]


class _Builder:
    def __init__(self, root: Path, rng: random.Random, small: bool, first_id: int) -> None:
        self.root, self.rng, self.small = root, rng, small
        self.next_id = first_id - 1

    def job_id(self) -> str:
        self.next_id += 1
        return str(self.next_id)

    def run(
        self,
        cfg: Config,
        job_id: str,
        start: float,
        restore: int | None,
        outcome: str,
        env: dict[str, str],
        first_node: int,
        tag: str,
    ) -> tuple[JobSim, int, int]:
        spec = JobSpec(
            job_id=job_id,
            model=cfg.model,
            tag=tag,
            nnodes=cfg.nnodes,
            first_node=first_node,
            steps=cfg.steps,
            checkpointing=True,
            checkpoint_period=cfg.period,
            step_time=cfg.step_time,
            start=start,
            compile_time=cfg.compile_time,
            env_extra=env,
        )
        sim = JobSim(spec, random.Random(self.rng.getrandbits(32)))
        sim.header()
        sim.stages_ok()
        sim.train_begin()
        sim.env_dumps()
        sim.init_training(restore_from=restore)
        first = 0 if restore is None else restore + 1
        last = cfg.steps - 1 if outcome == "completed" else self._stop(first, cfg)
        sim.steps(first, last, self._seconds(sim, cfg, first), noise_per_step=0.05 if self.small else 0.4)
        return sim, first, last

    def _stop(self, first: int, cfg: Config) -> int:
        return min(cfg.steps - 2, first + self.rng.randint(max(3, cfg.period // 3), max(4, cfg.period * 3)))

    @staticmethod
    def _seconds(sim: JobSim, cfg: Config, first: int) -> Callable[[int], float]:
        def fn(step: int) -> float:
            save = cfg.save_s if step - 1 >= first and (step - 1) % cfg.period == 0 else 0.0
            return sim.default_seconds(step, first) + save

        return fn

    def end(self, sim: JobSim, outcome: str) -> float | None:
        """The run's ending; returns a hang's chatter interval."""
        if outcome == "completed":
            sim.train_end_ok()
            sim.summary(0)
            return None
        if outcome == "hang":
            every = self.rng.choice((45.0, 120.0, 300.0, 2400.0))
            sim.quiet_noise(
                self.rng.uniform(1800, 4 * 3600) if not self.small else self.rng.uniform(900, 2400), every
            )
            sim.cancel_cascade()
            return every
        sim.advance(self.rng.uniform(1, 3))
        bad = self.rng.randrange(sim.ntasks)
        if outcome == "node-fail":
            sim.node_exits(_fail_exits(sim, {bad: 137}), terminate_after=0, old_srun=True)
            sim.training_failed(137)
        elif outcome == "heartbeat":
            _heartbeat(sim, [bad])
            sim.node_exits(_fail_exits(sim, dict.fromkeys(range(sim.ntasks), 134)), terminate_after=0)
            sim.training_failed(134)
        else:
            _traceback(sim, [bad], L.TRAIN_FRAMES[:2], "ValueError: grain: record 18213 has length 0")
            sim.node_exits(_fail_exits(sim, {bad: 1}), terminate_after=0)
            sim.training_failed(1)
        return None

    def outcome(self, last_chance: bool) -> str:
        if last_chance:
            return "completed"
        return self.rng.choices(OUTCOMES, weights=(40, 22, 18, 10, 5))[0]


def _chain(b: _Builder, index: int, start: float, configs: Sequence[Config]) -> ArchiveChain:
    rng = b.rng
    cfg = rng.choice(configs)
    user, part = rng.choice(USERS), rng.choice(PARTITIONS)
    env = {"SLURM_JOB_USER": user, "SLURM_JOB_PARTITION": part}
    runs: list[ArchiveRun] = []
    t, restore, link = start, None, None
    job_id = b.job_id()
    log: Path | None = None
    run_index = 0
    for attempt in range(4):
        near_end = restore is not None and restore + 1 >= cfg.steps - 3
        outcome = b.outcome(attempt == 3 or near_end)
        first_node = rng.randrange(1, 40)
        sim, first, last = b.run(cfg, job_id, t, restore, outcome, env, first_node, f"exp{index}")
        chatter = b.end(sim, outcome)
        if link == "requeue" and log is not None:
            with log.open("ab") as fh:
                fh.write(encode_lines(sim.slurm))
            os.utime(log, (sim.last_t, sim.last_t))
            run_index += 1
        else:
            _, log = sim.write(b.root)
            run_index = 0
        runs.append(
            ArchiveRun(
                job_id=job_id,
                log=os.path.relpath(log, b.root),
                run_index=run_index,
                outcome=outcome,
                first_step=first,
                last_step=last,
                restored_from=restore,
                link=link,
                start=sim.spec.start,
                end=sim.end_t,
                save_s=cfg.save_s,
                chatter_s=chatter,
            )
        )
        if outcome in ("completed", "python-exception"):
            break
        restore = last // cfg.period * cfg.period if last >= cfg.period else None
        if outcome == "node-fail" and rng.random() < 0.5:
            link, t = "requeue", sim.end_t + rng.uniform(30, 600)
        else:
            link, t, job_id = "restore", sim.end_t + rng.uniform(300, 3 * 3600), b.job_id()
            if restore is None:
                link = "retry"  # nothing to restore: a fresh start (rule GP-3 d)
    return ArchiveChain(f"chain-{index}", user, part, cfg.model, cfg.nnodes, tuple(runs))


def build_archive(
    root: Path,
    *,
    chains: int = 30,
    seed: int = 0,
    start: float = SIM_EPOCH,
    days: float = 21.0,
    small: bool = False,
    first_id: int = 61001,
) -> list[ArchiveChain]:
    """Write `chains` chains under `root` (started over `days` days, job ids from `first_id`)
    and `archive.json`."""
    root.mkdir(parents=True, exist_ok=True)
    b = _Builder(root, random.Random(f"archive:{seed}"), small, first_id)
    starts = sorted(start + b.rng.uniform(0, days * 86400) for _ in range(chains))
    out = [_chain(b, i, t, SMALL if small else CONFIGS) for i, t in enumerate(starts)]
    doc = {"chains": [asdict(c) for c in out]}
    (root / "archive.json").write_text(json.dumps(doc, indent=1) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobdiagd_sim.archive", description=__doc__)
    p.add_argument("outputs", type=Path)
    p.add_argument("--chains", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--days", type=float, default=21.0)
    p.add_argument("--small", action="store_true")
    a = p.parse_args(argv)
    out = build_archive(a.outputs, chains=a.chains, seed=a.seed, days=a.days, small=a.small)
    runs = sum(len(c.runs) for c in out)
    print(f"wrote {len(out)} chains, {runs} runs to {a.outputs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
