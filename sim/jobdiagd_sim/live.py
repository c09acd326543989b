"""A live simulated training job that writes realistic log lines in real time (demo and Slurm tests)."""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from jobdiagd import clock
from jobdiagd_sim import lines as L

JAX_PORT = 12321


@dataclass
class LiveConfig:
    steps: int = 20
    step_time: float = 1.0
    hang_after: int | None = None
    nnodes: int = 2
    model: str = "llama3.1-8b"
    noise_every: float = 3.0
    compile_time: float = 1.0
    checkpoint_period: int | None = None
    # Where saves are kept across runs (MaxText's per-model checkpoint directory): a run started
    # with the same directory restores the newest saved step and goes on from the next one.
    checkpoint_dir: Path | None = None
    save_time: float = 0.0  # a save blocks the next step this long (it lands in its `seconds:`)
    first_step_time: float | None = None  # step 0 (compilation inside the first step); None: step_time
    undated_steps: bool = False  # step and save lines without absl prefix (print()-era MaxText)
    seed: int = 0
    # outputs mode: this process writes the whole Slurm log and lays out the job dir
    outputs: Path | None = None
    job_id: str = "1"
    name: str | None = None
    # rank mode: one srun task; prints only its own lines to stdout (srun -l adds the prefix)
    rank: int | None = None
    host: str | None = None
    # stop after this many seconds of hanging (None: hang until signalled)
    max_hang: float | None = None

    @property
    def job_name(self) -> str:
        return self.name or L.job_name(self.model, "live")


class _Out:
    """Routes batch-level and per-task lines to the right sink with the right prefix."""

    def __init__(self, sink: BinaryIO, ntasks: int, rank_mode: bool) -> None:
        self.sink = sink
        self.ntasks = ntasks
        self.rank_mode = rank_mode
        self.lock = threading.Lock()

    def _write(self, text: str) -> None:
        with self.lock:
            self.sink.write((text + "\n").encode("utf-8", "surrogateescape"))
            self.sink.flush()

    def batch(self, *texts: str) -> None:
        if self.rank_mode:
            return  # the batch script prints these itself
        for t in texts:
            self._write(t)

    def task(self, rank: int, *texts: str) -> None:
        for t in texts:
            for part in t.split("\n"):
                self._write(part if self.rank_mode else L.srun_prefix(rank, self.ntasks) + part)


def _hosts(cfg: LiveConfig) -> list[str]:
    return L.hostnames(cfg.nnodes)


def run(cfg: LiveConfig, *, stop: threading.Event | None = None, sink: BinaryIO | None = None) -> int:
    """Run the simulated job until it completes (0) or `stop` is set (143). Blocks; flushes every line.

    Outputs mode (cfg.outputs set) creates `<id>-<name>.log`, the job dir and its `log` link, and
    writes every task's lines with `srun -l` prefixes. Rank mode (cfg.rank set) writes only this
    task's lines, unprefixed, to `sink` (stdout by default).
    """
    stop = stop or threading.Event()
    rng = random.Random(f"live:{cfg.seed}:{cfg.rank}")
    rank_mode = cfg.rank is not None
    hosts = _hosts(cfg)
    if rank_mode:
        assert cfg.rank is not None
        if cfg.host:
            while len(hosts) <= cfg.rank:
                hosts.append(f"node{len(hosts) + 1:03d}")
            hosts[cfg.rank] = cfg.host
        ranks = [cfg.rank]
    else:
        ranks = list(range(cfg.nnodes))
    close: BinaryIO | None = None
    if rank_mode:
        out_sink = sink or sys.stdout.buffer
    else:
        if cfg.outputs is None:
            raise ValueError("either outputs or rank must be set")
        dirname = f"{cfg.job_id}-{cfg.job_name}"
        cfg.outputs.mkdir(parents=True, exist_ok=True)
        job_dir = cfg.outputs / dirname
        job_dir.mkdir(exist_ok=True)
        link = job_dir / "log"
        if not link.is_symlink():
            link.symlink_to(f"../{dirname}.log")
        close = out_sink = sink or open(cfg.outputs / f"{dirname}.log", "ab", buffering=0)  # noqa: SIM115
    out = _Out(out_sink, cfg.nnodes, rank_mode)
    try:
        return _Job(cfg, out, ranks, hosts, rng, stop).run()
    finally:
        if close is not None:
            close.close()


class _Job:
    def __init__(
        self,
        cfg: LiveConfig,
        out: _Out,
        ranks: list[int],
        hosts: list[str],
        rng: random.Random,
        stop: threading.Event,
    ) -> None:
        self.cfg = cfg
        self.out = out
        self.ranks = ranks
        self.hosts = hosts
        self.rng = rng
        self.stop = stop
        self.t0 = clock.wall()
        self.tids = {r: 130000 + 977 * r + rng.randrange(900) for r in ranks}

    def absl(self, rank: int, where: str, level: str = "I") -> str:
        return L.absl_prefix(clock.wall(), self.tids[rank], where, level)

    def each(self, fn: Callable[[int], Sequence[str]]) -> None:
        for r in self.ranks:
            self.out.task(r, *fn(r))

    def each_absl(self, where: str, text: str) -> None:
        for r in self.ranks:
            self.out.task(r, self.absl(r, where) + text)

    def each_step_line(self, where: str, text: str) -> None:
        """Step and save lines: absl-stamped, or bare as print()-era MaxText wrote them."""
        if self.cfg.undated_steps:
            for r in self.ranks:
                self.out.task(r, text)
        else:
            self.each_absl(where, text)

    def wait(self, secs: float) -> bool:
        """Sleep; True if cancelled meanwhile."""
        return self.stop.wait(max(secs, 0.0))

    def run(self) -> int:
        cfg = self.cfg
        passthrough: dict[str, object] = {"steps": cfg.steps}
        if cfg.checkpoint_period:
            passthrough.update(enable_checkpointing=True, checkpoint_period=cfg.checkpoint_period)
        self.out.batch(
            *L.header_lines(
                job_id=cfg.job_id,
                name=cfg.job_name,
                nnodes=cfg.nnodes,
                nodelist=L.compact_nodelist(self.hosts),
                jax_port=JAX_PORT,
                ray_port=None,
                passthrough=passthrough,
                model=cfg.model,
            ),
            L.artifact_line("/shared/artifacts/maxtext-slurm-live"),
            *L.git_summary_block(
                repo="maxtext-slurm", branch="main", commit="0123abcd45", subject="live sim"
            ),
            *L.stage_timeouts_block(),
        )
        for key in ("preflight", "pull", "ecc"):
            desc = L.STAGE_DESCRIPTIONS[key]
            self.out.batch(L.stage_begin(desc, L.DEFAULT_STAGE_TIMEOUTS[key]))
            if self.wait(0.05):
                return self.cancelled()
            self.out.batch(L.stage_end(desc, 0))
        self.out.batch(L.stage_begin("Training", None))
        self.each(
            lambda r: L.env_dump(
                L.node_env(
                    host=self.hosts[r],
                    rank=r,
                    job_id=cfg.job_id,
                    name=cfg.job_name,
                    nnodes=cfg.nnodes,
                    hosts=self.hosts,
                    jax_port=JAX_PORT,
                    ray=False,
                )
            )
        )
        self.each(
            lambda r: [
                self.absl(r, "distributed.py:116") + f"Connecting to JAX distributed service on "
                f"{L.host_ip(self.hosts[0])}:{JAX_PORT}"
            ]
        )
        self.noise(harmless=True)
        self.each(lambda r: [self.absl(r, "pyconfig.py:1012") + L.config_param("steps", cfg.steps)])
        first = 0
        if cfg.checkpoint_period:
            self.each(
                lambda r: [
                    self.absl(r, "pyconfig.py:1012")
                    + L.config_param("checkpoint_period", cfg.checkpoint_period)
                ]
            )
            restored = self.newest_checkpoint()
            if restored is None:
                self.each(lambda r: [self.absl(r, "checkpointing.py:227") + L.NO_CHECKPOINT])
            else:
                self.each(lambda r: [self.absl(r, "checkpointing.py:214") + L.restore_line(restored)])
                first = restored + 1
        if self.wait(cfg.compile_time):
            return self.cancelled()
        self.each(lambda r: [self.absl(r, "train.py:902") + L.BARRIER_BEGIN])
        self.each(lambda r: [self.absl(r, "train.py:906") + L.BARRIER_PASSED])
        last_step_t = clock.wall()
        saved = False
        for step in range(first, cfg.steps):
            if cfg.hang_after is not None and step > cfg.hang_after:
                return self.hang()
            took = cfg.first_step_time if step == 0 and cfg.first_step_time is not None else cfg.step_time
            if self.wait(took + (cfg.save_time if saved else 0.0)):
                return self.cancelled()
            now = clock.wall()
            secs = now - last_step_t
            last_step_t = now
            tokens = 18424.0 / max(secs, 1e-3)
            f = L.StepFields(
                step=step,
                seconds=secs,
                tflops=tokens * 0.01556,
                tokens=tokens,
                total_weights=196608,
                loss=2.1 + 8.8 * math.exp(-step / 45.0),
            )
            self.each_step_line("metric_logger.py:232", L.step_line(f))
            saved = bool(cfg.checkpoint_period) and step % (cfg.checkpoint_period or 1) == 0
            if saved:
                self.save_checkpoint(step)
                self.each_step_line("train.py:1040", L.checkpoint_saved(step))
            if self.rng.random() < 0.3:
                self.noise()
        self.each(
            lambda r: [self.absl(r, "train.py:1101") + "Training completed; waiting for checkpoint manager"]
        )
        self.out.batch(L.stage_end("Training", int(clock.wall() - self.t0)))
        self.summary(0)
        return 0

    def newest_checkpoint(self) -> int | None:
        """The newest step saved in `checkpoint_dir` by an earlier run (a directory per step)."""
        d = self.cfg.checkpoint_dir
        if d is None or not d.is_dir():
            return None
        steps = [int(p.name) for p in d.iterdir() if p.name.isdigit() and p.is_dir()]
        return max(steps) if steps else None

    def save_checkpoint(self, step: int) -> None:
        """Task 0 (or the whole job in outputs mode) keeps the step's directory."""
        d = self.cfg.checkpoint_dir
        if d is not None and 0 in self.ranks:
            (d / str(step)).mkdir(parents=True, exist_ok=True)

    def noise(self, harmless: bool = False) -> None:
        r = self.rng.choice(self.ranks)
        host = self.hosts[r]
        if harmless:
            group = self.rng.choice(L.harmless_lines(clock.wall(), self.tids[r], host, self.rng)[:4])
        else:
            group = self.rng.choice(L.generic_noise(clock.wall(), self.tids[r], host, r, self.rng)[:7])
        self.out.task(r, *group)

    def hang(self) -> int:
        """No more steps; non-training chatter every few seconds keeps the log's mtime fresh."""
        start = clock.wall()
        while not self.wait(self.cfg.noise_every):
            self.noise()
            if self.cfg.max_hang is not None and clock.wall() - start >= self.cfg.max_hang:
                break
        return self.cancelled()

    def cancelled(self) -> int:
        cfg = self.cfg
        step_id = f"{cfg.job_id}.0"
        now = clock.wall()
        # Emulates what real Slurm 22.05 prints around a scancel (see JobSim.cancel_cascade).
        self.out.batch(L.srun_job_step_aborted(), "srun: got SIGCONT")
        self.out.batch(L.slurmstepd_cancelled(cfg.job_id, self.hosts[0], now, dashed=True))
        self.out.batch("srun: forcing job termination")
        if not self.out.rank_mode:
            self.out.task(0, L.slurmstepd_cancelled(cfg.job_id, self.hosts[0], now, step="0", dashed=True))
        for r in self.ranks:
            self.out.task(r, self.absl(r, "train.py:1120", "W") + "Received SIGTERM; shutting down")
        if not self.out.rank_mode:
            for r in self.ranks:
                self.out.task(r, L.node_exit(self.hosts[r], 143))
            for r in self.ranks:
                self.out.batch(L.srun_task_exit(self.hosts[r], str(r), 143))
            self.out.batch(L.srun_step_signal(step_id))
            self.summary(143, L.CANCELLED_TEXT)
        return 143

    def summary(self, rc: int, failure: str | None = None) -> None:
        cfg = self.cfg
        self.out.batch(
            *L.job_summary(
                job_id=cfg.job_id,
                name=cfg.job_name,
                model=cfg.model,
                nnodes=cfg.nnodes,
                wall=int(clock.wall() - self.t0),
                rc=rc,
                failure=failure,
            )
        )


def parse_args(argv: Sequence[str] | None) -> LiveConfig:
    p = argparse.ArgumentParser(prog="python -m jobdiagd_sim.live", description=__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--step-time", type=float, default=1.0)
    p.add_argument("--hang-after", type=int, default=None, metavar="N", help="no steps after step N")
    p.add_argument("--max-hang", type=float, default=None, metavar="SECONDS")
    p.add_argument("--nnodes", type=int, default=None)
    p.add_argument("--model", default="llama3.1-8b")
    p.add_argument("--noise-every", type=float, default=3.0)
    p.add_argument("--compile-time", type=float, default=1.0)
    p.add_argument("--checkpoint-period", type=int, default=None)
    p.add_argument(
        "--checkpoint-dir", type=Path, default=None, help="saves kept here; a rerun restores the newest"
    )
    p.add_argument("--save-time", type=float, default=0.0, help="a save blocks the next step this long")
    p.add_argument("--first-step-time", type=float, default=None, help="step 0's time (compilation)")
    p.add_argument("--undated-steps", action="store_true", help="step lines without absl prefix")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--outputs", type=Path)
    p.add_argument("--job-id", default=None)
    p.add_argument("--name", default=None, help="JOB_NAME, e.g. JAX-llama3.1-8b-live")
    p.add_argument(
        "--rank",
        nargs="?",
        type=int,
        const=-1,
        default=None,
        help="rank mode (one srun task); without a value the rank comes from SLURM_PROCID",
    )
    a = p.parse_args(argv)
    if (a.outputs is None) == (a.rank is None):
        p.error("give exactly one of --outputs or --rank")
    rank = a.rank
    env = os.environ
    if rank is not None and rank < 0:
        rank = int(env.get("SLURM_PROCID", "0"))
    nnodes = a.nnodes or int(env.get("SLURM_NTASKS", "0") or 0) or 2
    job_id = a.job_id or env.get("SLURM_JOB_ID") or "1"
    name = (a.name or env.get("SLURM_JOB_NAME")) if rank is not None else a.name
    host = (env.get("SLURMD_NODENAME") or socket.gethostname()) if rank is not None else None
    return LiveConfig(
        steps=a.steps,
        step_time=a.step_time,
        hang_after=a.hang_after,
        nnodes=nnodes,
        model=a.model,
        noise_every=a.noise_every,
        compile_time=a.compile_time,
        checkpoint_period=a.checkpoint_period,
        checkpoint_dir=a.checkpoint_dir,
        save_time=a.save_time,
        first_step_time=a.first_step_time,
        undated_steps=a.undated_steps,
        seed=a.seed,
        outputs=a.outputs,
        job_id=job_id,
        name=name,
        rank=rank,
        host=host,
        max_hang=a.max_hang,
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    stop = threading.Event()
    # Not a Python signal handler calling stop.set(): the handler runs in the main thread,
    # possibly while that thread holds the Event's own (non-reentrant) lock inside
    # stop.wait(), and then set() deadlocks -- the task ignores SIGTERM until Slurm's
    # SIGKILL and the job's EXIT trap never prints JOB SUMMARY. Block the signals and take
    # them in a helper thread instead.
    sigs = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)

    def take_signal() -> None:
        signal.sigwait(sigs)
        stop.set()

    threading.Thread(target=take_signal, name="sigwait", daemon=True).start()
    return run(cfg, stop=stop)


if __name__ == "__main__":
    sys.exit(main())
