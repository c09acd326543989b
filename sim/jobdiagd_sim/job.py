"""A simulated multi-node MaxText job that accumulates realistic Slurm/Ray/k8s log output in memory."""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from jobdiagd_sim import lines as L

# A fixed simulated epoch so every scenario is reproducible: 2026-06-12 08:00:00 UTC.
SIM_EPOCH = 1781251200.0


@dataclass
class JobSpec:
    """Everything that shapes one simulated job's output."""

    job_id: str
    model: str = "llama2-70b"
    tag: str | None = None
    nnodes: int = 8
    first_node: int = 1
    # Explicit host names, one per node (e.g. the hosts a real-world excerpt names); empty: node001...
    hosts: tuple[str, ...] = ()
    ray: bool = False
    steps: int = 100
    checkpointing: bool = False
    checkpoint_period: int | None = None
    print_checkpoint_period: bool = True
    period_in_args: bool = (
        True  # False: the period comes from the model YAML (only the Config param line shows it)
    )
    extra_args: dict[str, object] = field(default_factory=dict)
    step_time: float = 5.6
    tokens_per_device_step: float = 48_000.0
    total_weights: int = 1_572_864
    start: float = SIM_EPOCH
    absl: bool = True
    style: L.StepStyle = field(default_factory=L.StepStyle)
    platform: str = "slurm"  # "slurm" | "k8s" | "local"
    color: str = "none"
    mem_fraction: str = ".85"
    jax_port: int = 12321
    ray_port: int | None = None
    prom_port: int = 9190
    ray_ip_prefix: bool = False
    save_form: str = "new"
    restore_spaced: bool = False
    login: str = "alice@login01"
    stages: bool = True
    heartbeat_timeout: int | None = None
    compile_time: float = 180.0
    timeouts: dict[str, int | None] = field(default_factory=lambda: dict(L.DEFAULT_STAGE_TIMEOUTS))
    # More variables of the per-node environment dump (e.g. SLURM_JOB_USER under srun).
    env_extra: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return L.job_name(self.model, self.tag)

    @property
    def dirname(self) -> str:
        return f"{self.job_id}-{self.name}"

    @property
    def passthrough(self) -> dict[str, object]:
        args: dict[str, object] = {"steps": self.steps}
        if self.checkpointing:
            args["enable_checkpointing"] = True
            if self.checkpoint_period is not None and self.period_in_args:
                args["checkpoint_period"] = self.checkpoint_period
        args.update(self.extra_args)
        return args

    @property
    def effective_period(self) -> int | None:
        if not self.checkpointing:
            return None
        return self.checkpoint_period if self.checkpoint_period is not None else 200


@dataclass(frozen=True)
class StepRecord:
    step: int
    t: float  # epoch seconds when the step completed
    seconds: float
    tokens: float


SecondsFn = Callable[[int], float]


class JobSim:
    """Builds the text of a job's log files line by line, advancing a simulated clock."""

    def __init__(self, spec: JobSpec, rng: random.Random) -> None:
        self.spec = spec
        self.rng = rng
        self.t = spec.start
        if spec.hosts and (len(spec.hosts) != spec.nnodes or len(set(spec.hosts)) != len(spec.hosts)):
            raise ValueError(f"JobSpec.hosts must name {spec.nnodes} distinct hosts, got {spec.hosts!r}")
        self.hosts = list(spec.hosts) if spec.hosts else L.hostnames(spec.nnodes, spec.first_node)
        self.head = self.hosts[0]
        self.ntasks = spec.nnodes
        self.slurm: list[str] = []
        self.rank_logs: dict[int, list[str]] = {r: [] for r in range(spec.nnodes)}
        self.workers: dict[str, list[str]] = {h: [] for h in self.hosts} if spec.ray else {}
        self.records: list[StepRecord] = []
        self.slurm_records: list[StepRecord] = []
        self.tids = [rng.randrange(130000, 160000) for _ in self.hosts]
        self.actor_pids = [rng.randrange(2000, 9000) for _ in self.hosts]
        self.train_pids = [p + rng.randrange(30, 90) for p in self.actor_pids]
        self.forward_cutoff: float | None = None  # RAY=1: forwarded output after this time is lost
        self.stage_t0 = self.t
        self.last_t = self.t
        self.stage = "train"
        self.step_id = f"{spec.job_id}.0"
        self.cut_mid_line = False
        self.end_t = self.t
        self.checkpoints_saved: list[int] = []
        self.core_files: list[str] = []

    # ---------------------------------------------------------------- output primitives

    def advance(self, dt: float) -> None:
        self.t += dt

    def _emit_slurm(self, text: str) -> None:
        self.slurm.append(text)
        self.last_t = self.t

    def batch(self, *texts: str) -> None:
        """Batch-script output: no task prefix (k8s/local: goes to the primary log too)."""
        for text in texts:
            self._emit_slurm(text)

    def task(self, rank: int, *texts: str) -> None:
        """Output of one srun task (or, on k8s, of one rank's pod)."""
        for text in texts:
            for part in text.split("\n"):
                if self.spec.platform == "slurm":
                    self._emit_slurm(L.srun_prefix(rank, self.ntasks) + part)
                else:
                    self.rank_logs[rank].append(part)
                    if rank == 0:
                        self._emit_slurm(part)

    def train_out(self, rank: int, *texts: str) -> None:
        """Output of the training process: direct for RAY=0, via the actor's worker log for RAY=1."""
        if not self.spec.ray:
            self.task(rank, *texts)
            return
        host = self.hosts[rank]
        for text in texts:
            for part in text.split("\n"):
                self.workers[host].append(part)
                if self.forward_cutoff is None or self.t <= self.forward_cutoff:
                    ip = L.host_ip(host) if self.spec.ray_ip_prefix else None
                    self.task(rank, L.ray_prefix(self.actor_pids[rank], ip) + part)

    def absl(self, rank: int, where: str, level: str = "I", jitter: float = 0.0) -> str:
        if not self.spec.absl:
            return ""
        return L.absl_prefix(self.t + jitter, self.tids[rank], where, level)

    def all_ranks(
        self, fn: Callable[[int], Iterable[str]], *, shuffle: bool = True, train: bool = True
    ) -> None:
        order = list(range(self.ntasks))
        if shuffle:
            self.rng.shuffle(order)
        for r in order:
            out = list(fn(r))
            if train:
                self.train_out(r, *out)
            else:
                self.task(r, *out)

    # ---------------------------------------------------------------- noise

    def noise(self, count: int, *, harmless_share: float = 0.3, ranks: Sequence[int] | None = None) -> None:
        """Healthy chatter from random ranks; `harmless_share` of it from the harmless table (rule HL-1)."""
        for _ in range(count):
            rank = self.rng.choice(list(ranks) if ranks is not None else range(self.ntasks))
            host = self.hosts[rank]
            tid = self.tids[rank]
            if self.rng.random() < harmless_share:
                group = self.rng.choice(L.harmless_process_lines(self.t, tid, host, self.rng))
            else:
                group = self.rng.choice(L.generic_noise(self.t, tid, host, rank, self.rng))
            if not self.spec.absl:
                group = [_strip_absl(g) for g in group]
            if self.spec.ray and self.rng.random() < 0.4:
                # Ray's own buffered chatter reaches the driver's stdout, not the worker log.
                self.task(
                    rank,
                    *L.ray_buffered_noise(
                        self.t, host, L.host_ip(host), self.rng, rank == 0, self.actor_pids[rank]
                    ),
                )
            else:
                self.train_out(rank, *group)

    def quiet_noise(self, duration: float, every: float) -> None:
        """Non-training output while training makes no progress (keeps the log's mtime fresh)."""
        end = self.t + duration
        while self.t + every <= end:
            self.advance(every * self.rng.uniform(0.7, 1.3))
            rank = self.rng.randrange(self.ntasks)
            host = self.hosts[rank]
            if self.spec.ray:
                self.task(
                    rank,
                    *L.ray_buffered_noise(
                        self.t, host, L.host_ip(host), self.rng, rank == 0, self.actor_pids[rank]
                    ),
                )
            else:
                group = self.rng.choice(L.generic_noise(self.t, self.tids[rank], host, rank, self.rng)[:7])
                self.task(rank, *group)
        self.t = max(self.t, end)

    # ---------------------------------------------------------------- phases

    def header(self) -> None:
        s = self.spec
        nodelist = L.compact_nodelist(self.hosts)
        self.batch(
            *L.header_lines(
                job_id=s.job_id,
                name=s.name,
                nnodes=s.nnodes,
                nodelist=nodelist,
                jax_port=s.jax_port,
                ray_port=s.ray_port if s.ray else None,
                passthrough=s.passthrough,
                model=s.model,
                exp_tag=s.tag,
            )
        )
        self.batch(L.artifact_line(f"/shared/artifacts/maxtext-slurm-{self.rng.getrandbits(28):07x}"))
        self.batch(
            *L.git_summary_block(
                repo="maxtext-slurm",
                branch="main",
                commit=f"{self.rng.getrandbits(40):010x}"[:10],
                subject="observability: scrape node_hw every 10s",
                dirty=["configs/llama2-70b.gpu.yml"] if self.rng.random() < 0.5 else [],
                maxtext_commit=f"{self.rng.getrandbits(40):010x}"[:10],
            )
        )
        self.batch(*L.stage_timeouts_block(self.spec.timeouts))

    def stage_ok(self, key: str, secs: float) -> None:
        desc = L.STAGE_DESCRIPTIONS[key]
        self.batch(L.stage_begin(desc, self.spec.timeouts[key]))
        if key == "preflight":
            self.all_ranks(lambda r: [f"[preflight] {self.hosts[r]}: no stale GPU processes"], train=False)
            if self.rng.random() < 0.6:
                r = self.rng.randrange(self.ntasks)
                self.task(
                    r, *self.rng.choice(L.harmless_lines(self.t, self.tids[r], self.hosts[r], self.rng)[4:6])
                )
        elif key == "pull":
            self.all_ranks(
                lambda r: ["[pull] image rocm/jax-maxtext:25.11 present (digest sha256:3f1c…)"], train=False
            )
        elif key == "ecc":
            self.all_ranks(
                lambda r: [f"[ECC] {self.hosts[r]}: 8 GPUs, 0 uncorrectable, 0 correctable"], train=False
            )
        self.advance(secs)
        self.batch(L.stage_end(desc, int(secs)))

    def stages_ok(self) -> None:
        self.stage_ok("preflight", self.rng.uniform(8, 20))
        self.stage_ok("pull", self.rng.uniform(20, 90))
        self.stage_ok("ecc", self.rng.uniform(4, 12))

    def train_begin(self) -> None:
        self.stage_t0 = self.t
        self.batch(L.stage_begin("Training", self.spec.timeouts["train"]))

    def env_dumps(self) -> None:
        s = self.spec
        dumps: list[list[str]] = []
        for r in range(self.ntasks):
            env = L.node_env(
                host=self.hosts[r],
                rank=r,
                job_id=s.job_id,
                name=s.name,
                nnodes=s.nnodes,
                hosts=self.hosts,
                jax_port=s.jax_port,
                ray=s.ray,
                mem_fraction=s.mem_fraction,
                extra=s.env_extra or None,
            )
            dumps.append(L.env_dump(env))
        # srun interleaves the tasks' output line by line: the dumps are not contiguous blocks.
        pos = [0] * self.ntasks
        while any(pos[r] < len(dumps[r]) for r in range(self.ntasks)):
            r = self.rng.choice([r for r in range(self.ntasks) if pos[r] < len(dumps[r])])
            n = self.rng.randint(1, 12)
            self.task(r, *dumps[r][pos[r] : pos[r] + n])
            pos[r] += n
        self.advance(3)

    def ray_start(self) -> None:
        s = self.spec
        port = s.ray_port or 6379
        self.all_ranks(lambda r: [L.metrics_exporter_started(s.dirname, self.hosts[r])], train=False)
        self.task(0, L.ray_head_start(self.head, port, L.host_ip(self.head)))
        self.task(0, "Local node IP: " + L.host_ip(self.head), "", "Ray runtime started.")
        self.task(0, L.ray_logs_line(s.dirname, self.head, L.ray_session(self.t)))
        self.advance(6)
        for r in range(1, self.ntasks):
            self.task(r, L.ray_worker_start(L.host_ip(self.head), port, L.host_ip(self.hosts[r])))
        self.advance(5)
        for r in range(1, self.ntasks):
            self.task(r, L.ray_logs_line(s.dirname, self.hosts[r], L.ray_session(self.t + r)))
        self.advance(4)
        self.task(0, *L.prometheus_lines(self.hosts, s.dirname, 9190, s.prom_port))
        self.task(0, L.tensorboard_started(s.model))
        self.task(
            0, *L.tunnel_lines(s.login, s.login.split("@")[0] + "@203.0.113.10", self.head, s.prom_port)
        )
        for r in range(self.ntasks):
            self.task(r, L.actor_launch(r, self.hosts[r]))
            self.task(r, L.actor_started(r, self.hosts[r], self.train_pids[r]))

    def init_training(self, *, restore_from: int | None = None, barrier: bool = True) -> None:
        """JAX init, config dump, restore decision, compile chatter, barrier."""
        s = self.spec
        self.all_ranks(lambda r: [L.mfu_enabled(s.style.mfu_peak)] if s.style.mfu_peak else [])
        self.all_ranks(
            lambda r: [
                self.absl(r, "distributed.py:116")
                + f"Connecting to JAX distributed service on {L.host_ip(self.head)}:{s.jax_port}"
            ]
        )
        self.noise(self.ntasks * 2, harmless_share=0.9)
        self.advance(12)
        params: list[tuple[str, object]] = [("steps", s.steps), ("enable_checkpointing", s.checkpointing)]
        if s.effective_period is not None and s.print_checkpoint_period:
            params.append(("checkpoint_period", s.effective_period))
        params.append(("per_device_batch_size", 6))
        params.append(("max_target_length", 8192))
        if s.heartbeat_timeout is not None:
            params.append(("jax_distributed_heartbeat_timeout_seconds", s.heartbeat_timeout))
        self.train_out(0, *[self.absl(0, "pyconfig.py:1012") + L.config_param(k, v) for k, v in params])
        self.advance(5)
        if s.checkpointing:
            if restore_from is None:
                self.all_ranks(lambda r: [self.absl(r, "checkpointing.py:227") + L.NO_CHECKPOINT])
            else:
                self.all_ranks(
                    lambda r: [
                        self.absl(r, "checkpointing.py:240")
                        + L.restore_line(restore_from, spaced=s.restore_spaced)
                    ]
                )
                self.advance(40)
        self.noise(self.ntasks * 2, harmless_share=0.2)
        self.advance(s.compile_time * 0.6)
        self.noise(self.ntasks, harmless_share=0.2)
        self.advance(s.compile_time * 0.4)
        if barrier:
            self.all_ranks(lambda r: [self.absl(r, "train.py:902") + L.BARRIER_BEGIN])
            self.advance(2)
            self.all_ranks(lambda r: [self.absl(r, "train.py:906") + L.BARRIER_PASSED])

    def barrier_only(self) -> None:
        self.all_ranks(lambda r: [self.absl(r, "train.py:902") + L.BARRIER_BEGIN])

    # ---------------------------------------------------------------- steps

    def loss_at(self, step: int) -> float:
        return 2.1 + 8.8 * math.exp(-step / 45.0) + self.rng.uniform(-0.02, 0.02)

    def default_seconds(self, step: int, first: int) -> float:
        base = self.spec.step_time
        rel = step - first
        if rel == 0:
            return base * 9.0 + self.rng.uniform(0, 5)
        if rel == 1:
            return base * 1.6
        return base * self.rng.uniform(0.99, 1.01)

    def steps(
        self,
        first: int,
        last: int,
        seconds: SecondsFn | None = None,
        *,
        noise_per_step: float = 0.6,
        rampup_until: int | None = None,
        profiler_steps: Sequence[int] = (),
        start_first: int | None = None,
        ranks: Sequence[int] | None = None,
        skip_save: Sequence[int] = (),
    ) -> None:
        """Run steps first..last inclusive, each rank printing its own step line."""
        s = self.spec
        run_first = first if start_first is None else start_first
        for step in range(first, last + 1):
            secs = seconds(step) if seconds else self.default_seconds(step, run_first)
            self.advance(secs)
            tokens = s.tokens_per_device_step / secs
            tflops = tokens * 0.01556
            loss = self.loss_at(step)
            rec = StepRecord(step, self.t, secs, tokens)
            self.records.append(rec)
            if self.forward_cutoff is None or self.t <= self.forward_cutoff:
                self.slurm_records.append(rec)
            rampup = rampup_until is not None and step <= rampup_until
            fields = L.StepFields(
                step=step,
                seconds=secs,
                tflops=tflops,
                tokens=tokens,
                total_weights=s.total_weights,
                loss=loss,
                moe_lb_loss=0.01 + 0.002 * math.sin(step),
                rampup=rampup,
            )
            first_line = step == run_first

            def out(r: int, f: L.StepFields = fields, fl: bool = first_line, st: int = step) -> list[str]:
                res = []
                if st in profiler_steps:
                    res.append(self.absl(r, "profiler.py:95", jitter=-0.01) + L.profiler_line(st, True))
                res.append(
                    self.absl(r, "metric_logger.py:232", jitter=self.rng.uniform(0, 0.02))
                    + L.step_line(f, s.style, first=fl)
                )
                return res

            order = list(ranks) if ranks is not None else list(range(self.ntasks))
            self.rng.shuffle(order)
            for r in order:
                self.train_out(r, *out(r))
            period = s.effective_period
            if (
                period is not None
                and step % period == 0
                and (step > 0 or run_first == 0)
                and step not in skip_save
            ):
                self.save_checkpoint(step, ranks=order)
            if noise_per_step and self.rng.random() < noise_per_step:
                self.noise(1 + int(self.rng.random() < 0.3))

    def save_checkpoint(self, step: int, ranks: Sequence[int] | None = None) -> None:
        s = self.spec
        order = list(ranks) if ranks is not None else list(range(self.ntasks))
        ckdir = f"/outputs/{s.model}/checkpoints"
        if s.save_form == "async":
            for r in order:
                self.train_out(r, self.absl(r, "checkpointing.py:312") + L.checkpoint_saved(step, "async"))
            self.advance(0.5)
            for r in order:
                self.train_out(
                    r, self.absl(r, "async_checkpointer.py:94") + L.orbax_finalized(r, ckdir, step)
                )
        else:
            for r in order:
                self.train_out(r, self.absl(r, "train.py:1040") + L.checkpoint_saved(step, s.save_form))
        self.checkpoints_saved.append(step)

    # ---------------------------------------------------------------- endings

    def train_end_ok(self) -> None:
        self.advance(self.rng.uniform(20, 60))
        self.all_ranks(
            lambda r: [self.absl(r, "train.py:1101") + "Training completed; waiting for checkpoint manager"]
        )
        self.noise(2, harmless_share=1.0)
        if self.spec.ray:
            self.advance(3)
            self.task(0, "[Ray] Stopping cluster")
        self.advance(5)
        # Container teardown races (harmless, rule HL-1) on a node or two.
        for _ in range(self.rng.randrange(3)):
            r = self.rng.randrange(self.ntasks)
            groups = L.harmless_lines(self.t, self.tids[r], self.hosts[r], self.rng)
            self.task(r, *groups[self.rng.choice((5, 11))])
        self.batch(L.stage_end("Training", int(self.t - self.stage_t0)))

    def summary(self, rc: int, failure: str | None = None) -> None:
        s = self.spec
        self.advance(1)
        self.batch(
            *L.job_summary(
                job_id=s.job_id,
                name=s.name,
                model=s.model,
                nnodes=s.nnodes,
                wall=int(self.t - s.start),
                rc=rc,
                failure=failure,
                color=s.color,
            )
        )
        self.end_t = self.t

    def training_failed(self, rc: int) -> None:
        """Stage marker + summary for a failed Training stage."""
        self.advance(2)
        self.batch(L.stage_failed("Training", rc, int(self.t - self.stage_t0)))
        self.summary(1, L.stage_failure_text("Training", rc))

    def node_exits(
        self, codes: dict[int, int], *, old_srun: bool = False, terminate_after: int | None = None
    ) -> None:
        """srun's view of the tasks exiting, in the order given; NODE_EXIT comes from the task itself."""
        for i, (r, rc) in enumerate(codes.items()):
            if rc != 0:
                self.task(r, L.node_exit(self.hosts[r], rc))
                self.batch(L.srun_task_exit(self.hosts[r], str(r), rc))
            if terminate_after is not None and i == terminate_after:
                self.batch(L.srun_terminating(self.step_id, old=old_srun))
                self.batch(L.srun_job_step_aborted())
            self.advance(self.rng.uniform(0.1, 1.5))

    def cancel_cascade(self, *, reason: str = "scancel", slurm: str = "22.05") -> None:
        """scancel/walltime: SIGTERM everywhere, every node exits 143, the TERM trap prints the summary.

        Order and wording as observed from Slurm 22.05: the step's CANCELLED line reaches the log
        through task 0's stderr (so it carries the `0: ` prefix), the job's line does not.
        """
        s = self.spec
        dashed = self.rng.random() < 0.5
        self.batch(L.srun_job_step_aborted(), "srun: got SIGCONT")
        self.batch(
            L.slurmstepd_cancelled(s.job_id, self.head, self.t, reason=reason, slurm=slurm, dashed=dashed)
        )
        self.batch("srun: forcing job termination")
        self.task(
            0,
            L.slurmstepd_cancelled(
                s.job_id, self.head, self.t, reason=reason, slurm=slurm, step="0", dashed=dashed
            ),
        )
        self.advance(1)
        if self.rng.random() < 0.7:
            self.task(
                self.rng.randrange(self.ntasks), L.harmless_lines(self.t, 1, self.head, self.rng)[11][0]
            )
        for r in range(self.ntasks):
            self.task(r, L.node_exit(self.hosts[r], 143))
        for r in range(self.ntasks):
            self.batch(L.srun_task_exit(self.hosts[r], str(r), 143))
            self.advance(0.2)
        if self.rng.random() < 0.5:
            self.task(0, L.harmless_lines(self.t, 1, self.head, self.rng)[5][0])
        self.batch(L.srun_step_signal(self.step_id))
        self.summary(143, L.CANCELLED_TEXT)

    # ---------------------------------------------------------------- files

    def write(
        self, outputs_root: Path, *, log_name: str | None = None, link: bool = True
    ) -> tuple[Path, Path]:
        """Lay the job out the way real jobs do; returns (job_dir, log_path)."""
        s = self.spec
        outputs_root.mkdir(parents=True, exist_ok=True)
        job_dir = outputs_root / s.dirname
        job_dir.mkdir(exist_ok=True)
        log_path = outputs_root / (log_name or f"{s.dirname}.log")
        data = encode_lines(self.slurm, cut_mid_line=self.cut_mid_line)
        log_path.write_bytes(data)
        if link:
            link_path = job_dir / "log"
            if link_path.is_symlink() or link_path.exists():
                link_path.unlink()
            link_path.symlink_to(f"../{log_path.name}")
        end = self.last_t
        if s.platform == "k8s":
            # Rank 0 is the primary log; every other rank tees into <job dir>/rank-N.log.
            for r, text in self.rank_logs.items():
                if r == 0:
                    continue
                p = job_dir / f"rank-{r}.log"
                p.write_bytes(encode_lines(text))
                os.utime(p, (end, end))
        if s.ray:
            self._write_ray_logs(job_dir)
        for name in self.core_files:
            p = job_dir / name
            p.write_bytes(b"\x7fELF\x02\x01\x01\x04" + bytes(56))
            os.utime(p, (end, end))
        os.utime(log_path, (end, end))
        os.utime(job_dir, (s.start, s.start))
        return job_dir, log_path

    def worker_path(self, job_dir: Path, host: str) -> Path:
        rank = self.hosts.index(host)
        wid = _hex(self.spec.job_id + host, 56)
        return job_dir / "ray_logs" / host / f"worker-{wid}-01000000-{self.actor_pids[rank]}.out"

    def _write_ray_logs(self, job_dir: Path) -> None:
        end = self.last_t
        for host, text in self.workers.items():
            d = job_dir / "ray_logs" / host
            d.mkdir(parents=True, exist_ok=True)
            wp = self.worker_path(job_dir, host)
            body = [":job_id:01000000", ":actor_name:MaxTextTrainerActor", *text]
            wp.write_bytes(encode_lines(body))
            wp.with_suffix(".err").write_bytes(b":job_id:01000000\n:actor_name:MaxTextTrainerActor\n")
            idle = (
                d
                / f"worker-{_hex(host + 'idle', 56)}-ffffffff-{self.actor_pids[self.hosts.index(host)] - 17}.out"
            )
            idle.write_bytes(b"")
            raylet = d / "raylet.out"
            raylet.write_bytes(
                encode_lines(
                    [
                        f"[{L.utc(self.spec.start):%Y-%m-%d %H:%M:%S},000 I 1201 1201] (raylet) main.cc:180: Setting cluster ID to: 7c2a",
                        f"[{L.utc(self.spec.start):%Y-%m-%d %H:%M:%S},004 I 1201 1201] (raylet) io_service_pool.cc:35: IOServicePool is running with 1 io_service.",
                    ]
                )
            )
            if host == self.head:
                gcs = d / "gcs_server.out"
                gcs.write_bytes(
                    encode_lines(
                        [
                            f"[{L.utc(self.spec.start):%Y-%m-%d %H:%M:%S},000 I 1188 1188] (gcs_server) gcs_server_main.cc:59: Ray cluster metadata ray_version=2.44.1"
                        ]
                    )
                )
                os.utime(gcs, (end, end))
            for p in (wp, wp.with_suffix(".err"), idle, raylet):
                os.utime(p, (end, end))


def encode_lines(text_lines: Sequence[str], *, cut_mid_line: bool = False) -> bytes:
    body = "\n".join(text_lines)
    if not cut_mid_line and text_lines:
        body += "\n"
    return body.encode("utf-8", "surrogateescape")


def _hex(seed: str, n: int) -> str:
    r = random.Random(seed)
    return "".join(r.choice("0123456789abcdef") for _ in range(n))


def _strip_absl(line: str) -> str:
    # Old MaxText printed without absl: drop a leading glog-style prefix if present.
    if len(line) > 30 and line[0] in "IWEF" and line[1:5].isdigit() and "] " in line[:60]:
        return line.split("] ", 1)[1]
    return line
