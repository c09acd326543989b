"""Simulated job directories with known ground truth (status, failure class, progress) for tests and demos."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import jobdiagd
from jobdiagd_sim import lines as L
from jobdiagd_sim.job import SIM_EPOCH, JobSim, JobSpec

# ---------------------------------------------------------------------------------------------
# Ground truth
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expectation:
    """What a runbook-faithful triage of one simulated job must conclude.

    Status uses the labels of the status table (rules ST-1, ST-5; completed | failed | cancelled | running |
    hanging | unknown-death); class names are those of docs/rules.md §3 verbatim. Steps are 0-indexed.
    """

    scenario: str  # key in SCENARIOS
    job_id: str  # Slurm id, or the k8s-/local_ id
    job_dir: Path  # outputs/<id>-<name>/
    log: Path  # what job_dir/log points at (may not exist: prolog-kill-no-log)
    platform: str  # "slurm" | "k8s" | "local" ("none" for a non-job dir)
    ray: bool  # RAY=1: ray_logs/<head>/worker-*.out is the authoritative step record
    status: str | None  # None = not a job (must be skipped)
    primary_failure: str | None  # None for a healthy job
    expected_classes: frozenset[str]  # must all be among the findings (a subset, not exhaustive)
    first_step: int | None  # first `completed step:` in the authoritative record
    last_step: int | None
    total_steps: int | None  # steps=T from PASSTHROUGH_ARGS (the run is complete at T-1)
    start: str | None  # "fresh" | "restored" | None (no step)
    restored_from_step: int | None  # first_step - 1 when restored
    checkpoint_period: int | None  # Config param / PASSTHROUGH_ARGS / 200 default; None when off
    last_checkpoint_step: int | None  # highest multiple of the period <= last_step; None below it
    tgs_degraded: bool
    tgs_pattern: str | None  # constant-drop | phased | gradual | periodic-spikes | one-time-drop
    head_node: str | None  # RAY=1 head (from the tunnel command)
    prometheus_port: int | None  # RAY=1 Prometheus port ([Prometheus] Started on port N)
    slurm_state: str | None  # what to pass as --slurm-state (None: unavailable / not Slurm)
    now: float  # epoch seconds to pass as --now
    notes: str
    # Classes that must NOT be reported (harmless look-alikes, spikes that are not degradation, ...).
    absent_classes: frozenset[str] = frozenset()
    # False for a directory a job walk must skip (shared checkpoint dir).
    is_job: bool = True
    wall_seconds: int | None = None  # JOB SUMMARY Wall, None without a summary
    train_seconds: float | None = None  # sum of `seconds:` over the authoritative step record
    authoritative_log: Path | None = None  # where last_step etc. come from

    def to_dict(self, relative_to: Path | None = None) -> dict[str, object]:
        out: dict[str, object] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Path):
                v = os.path.relpath(v, relative_to) if relative_to is not None else str(v)
            elif isinstance(v, frozenset):
                v = sorted(v)
            out[f.name] = v
        return out


def last_periodic_checkpoint(last_step: int | None, period: int | None) -> int | None:
    """Runbook rule: highest multiple of period <= last_step; None below the period (step 0 does not count)."""
    if last_step is None or period is None or last_step < period:
        return None
    return last_step // period * period


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------

Builder = Callable[[Path, int], Expectation]
SCENARIOS: dict[str, Builder] = {}
_JOB_IDS: dict[str, int] = {}


def scenario(job_id: int) -> Callable[[Builder], Builder]:
    def deco(fn: Builder) -> Builder:
        name = fn.__name__.removeprefix("sc_").replace("_", "-")
        SCENARIOS[name] = fn
        _JOB_IDS[name] = job_id
        return fn

    return deco


def _sim(name: str, seed: int, **kw: object) -> JobSim:
    rng = random.Random(f"{name}:{seed}")
    job_id = kw.pop("job_id", None) or str(_JOB_IDS[name])
    start = SIM_EPOCH + _JOB_IDS.get(name, 0) % 97 * 3671.0
    spec = JobSpec(job_id=str(job_id), start=start, **kw)  # type: ignore[arg-type]
    if spec.ray and spec.ray_port is None:
        spec.ray_port = spec.jax_port + 1
    return JobSim(spec, rng)


def _start(
    sim: JobSim, *, restore_from: int | None = None, barrier: bool = True, stages: bool = True
) -> None:
    sim.header()
    if stages:
        sim.stages_ok()
    sim.train_begin()
    sim.env_dumps()
    if sim.spec.ray:
        sim.ray_start()
    sim.init_training(restore_from=restore_from, barrier=barrier)


def _expect(
    name: str,
    sim: JobSim,
    outputs_root: Path,
    *,
    status: str | None,
    primary: str | None,
    classes: Sequence[str] = (),
    absent: Sequence[str] = (),
    slurm_state: str | None,
    now: float | None = None,
    tgs_degraded: bool = False,
    tgs_pattern: str | None = None,
    notes: str = "",
    log_name: str | None = None,
    link: bool = True,
    last_checkpoint: int | None | str = "rule",
    summary: bool = True,
) -> Expectation:
    spec = sim.spec
    job_dir, log = sim.write(outputs_root, log_name=log_name, link=link)
    recs = sim.records
    first = recs[0].step if recs else None
    last = recs[-1].step if recs else None
    start: str | None = None
    restored_from: int | None = None
    if first is not None:
        start = "fresh" if first == 0 else "restored"
        restored_from = first - 1 if first > 0 else None
    period = spec.effective_period
    ckpt = last_periodic_checkpoint(last, period) if last_checkpoint == "rule" else last_checkpoint
    assert not isinstance(ckpt, str)
    # Where the step record is authoritative: the head node's worker log for RAY=1, else the log.
    auth = sim.worker_path(job_dir, sim.head) if spec.ray else log
    return Expectation(
        scenario=name,
        job_id=spec.job_id,
        job_dir=job_dir,
        log=log,
        platform=spec.platform,
        ray=spec.ray,
        status=status,
        primary_failure=primary,
        expected_classes=frozenset(classes),
        first_step=first,
        last_step=last,
        total_steps=spec.steps,
        start=start,
        restored_from_step=restored_from,
        checkpoint_period=period,
        last_checkpoint_step=ckpt,
        tgs_degraded=tgs_degraded,
        tgs_pattern=tgs_pattern,
        head_node=sim.head if spec.ray else None,
        prometheus_port=spec.prom_port if spec.ray else None,
        slurm_state=slurm_state,
        now=round(now if now is not None else sim.last_t + 600.0, 3),
        notes=notes,
        absent_classes=frozenset(absent),
        wall_seconds=int(sim.end_t - spec.start) if summary else None,
        train_seconds=round(sum(r.seconds for r in recs), 3) if recs else None,
        authoritative_log=auth,
    )


def _fail_exits(sim: JobSim, bad: dict[int, int], others: int = 143) -> dict[int, int]:
    codes = dict(bad)
    for r in range(sim.ntasks):
        codes.setdefault(r, others)
    return codes


def _steady(sim: JobSim, first: int, factor: Callable[[int], float]) -> Callable[[int], float]:
    def fn(step: int) -> float:
        return sim.default_seconds(step, first) * factor(step)

    return fn


# ---------------------------------------------------------------------------------------------
# Scenarios: healthy, running, hanging
# ---------------------------------------------------------------------------------------------


@scenario(48101)
def sc_completed_ray0(root: Path, seed: int) -> Expectation:
    name = "completed-ray0"
    sim = _sim(
        name,
        seed,
        nnodes=8,
        steps=100,
        checkpointing=True,
        tag="steps_100",
        style=L.StepStyle(mfu_peak=1307.0),
        color="setaf",
        print_checkpoint_period=False,
    )
    _start(sim)
    sim.steps(0, 99)
    sim.train_end_ok()
    sim.summary(0)
    return _expect(
        name,
        sim,
        root,
        status="completed",
        primary=None,
        slurm_state="COMPLETED",
        absent=["hang", "unknown-death", "tgs-degradation", "node-fail", "cancelled"],
        notes="RAY=0, 8 nodes, every node prints every step (absl + MFU). enable_checkpointing=true "
        "without checkpoint_period and no Config param line: period defaults to 200, so no periodic "
        "checkpoint was reached (the step-0 save does not count).",
    )


@scenario(48102)
def sc_completed_ray1_truncated(root: Path, seed: int) -> Expectation:
    name = "completed-ray1-truncated"
    sim = _sim(
        name,
        seed,
        nnodes=8,
        ray=True,
        steps=100,
        checkpointing=True,
        checkpoint_period=50,
        model="llama3.1-70b",
        tag="ray",
        step_time=4.2,
    )
    _start(sim)
    sim.steps(0, 33, profiler_steps=(10, 15))
    sim.forward_cutoff = sim.t + 0.01
    sim.steps(34, 99)
    sim.train_end_ok()
    sim.summary(0)
    return _expect(
        name,
        sim,
        root,
        status="completed",
        primary=None,
        slurm_state="COMPLETED",
        absent=["unknown-death", "hang", "tgs-degradation"],
        notes="RAY=1: the Slurm log's last forwarded step is 33 but every worker log has steps 0..99; "
        "JOB SUMMARY SUCCESS. Profiler activation lines at steps 10 and 15 are not steps.",
    )


@scenario(48103)
def sc_running(root: Path, seed: int) -> Expectation:
    name = "running"
    sim = _sim(
        name,
        seed,
        nnodes=4,
        steps=1000,
        checkpointing=True,
        checkpoint_period=100,
        model="qwen3-30b-a3b",
        style=L.StepStyle(lm_loss=True, moe=True),
        step_time=6.1,
    )
    _start(sim)
    sim.steps(0, 150)
    now = sim.t + sim.spec.step_time * 0.4
    return _expect(
        name,
        sim,
        root,
        status="running",
        primary=None,
        slurm_state="RUNNING",
        now=now,
        absent=["hang", "unknown-death"],
        summary=False,
        notes="No JOB SUMMARY; steps advancing; now is 0.4 step-times after the last step. 2026 step "
        "lines with lm_loss/perplexity/moe_lb_loss appended.",
    )


@scenario(48104)
def sc_hanging(root: Path, seed: int) -> Expectation:
    name = "hanging"
    sim = _sim(
        name,
        seed,
        nnodes=4,
        ray=True,
        steps=2000,
        checkpointing=True,
        checkpoint_period=100,
        model="llama3.1-70b",
        prom_port=9191,
        step_time=5.2,
    )
    _start(sim)
    sim.steps(0, 100)
    sim.quiet_noise(3 * 3600, 45)
    now = sim.t + 20
    return _expect(
        name,
        sim,
        root,
        status="hanging",
        primary="hang",
        classes=["hang"],
        absent=["unknown-death", "heartbeat-timeout"],
        slurm_state="RUNNING",
        now=now,
        summary=False,
        notes="RAY=1, steps stopped at 100 three hours before now while Ray's buffered chatter keeps the "
        "log's mtime fresh (last line ~20s before now). Prometheus moved to 9191 (9190 occupied).",
    )


@scenario(48105)
def sc_hang_init_barrier(root: Path, seed: int) -> Expectation:
    name = "hang-init-barrier"
    sim = _sim(name, seed, nnodes=8, steps=500, model="llama2-70b")
    _start(sim, barrier=False)
    sim.barrier_only()
    sim.quiet_noise(2 * 3600, 300)
    now = sim.t + 30
    return _expect(
        name,
        sim,
        root,
        status="hanging",
        primary="hang",
        classes=["hang"],
        absent=["unknown-death"],
        slurm_state="RUNNING",
        now=now,
        summary=False,
        notes="Init-phase hang: every task printed the BARRIER line, none printed BARRIER PASSED or a "
        "step; Slurm still RUNNING two hours later.",
    )


@scenario(48106)
def sc_unknown_death(root: Path, seed: int) -> Expectation:
    name = "unknown-death"
    sim = _sim(name, seed, nnodes=8, steps=500, model="llama2-70b")
    _start(sim)
    sim.steps(0, 133)
    sim.advance(3.0)
    # SIGKILL mid-write: task 5's autotune chatter stops half way through, no newline, no summary.
    text = (
        sim.absl(5, "gemm_algorithm_picker.cc:459") + "Autotuning gemm fusion 1187: selected algorithm 23 in"
    )
    sim.task(5, text[: len(text) - 9])
    sim.cut_mid_line = True
    return _expect(
        name,
        sim,
        root,
        status="unknown-death",
        primary="unknown-death",
        classes=["unknown-death"],
        absent=["hang", "cancelled"],
        slurm_state="FAILED",
        now=sim.t + 1800,
        summary=False,
        notes="No JOB SUMMARY, log ends mid-line (no trailing newline), Slurm state no longer RUNNING.",
    )


# ---------------------------------------------------------------------------------------------
# Cancellation, heartbeat, soft success
# ---------------------------------------------------------------------------------------------


@scenario(48107)
def sc_cancelled_plain(root: Path, seed: int) -> Expectation:
    name = "cancelled-plain"
    sim = _sim(name, seed, nnodes=8, steps=1000, model="llama2-70b", color="bold")
    _start(sim)
    sim.steps(0, 120)
    sim.advance(sim.spec.step_time * 0.5)
    sim.cancel_cascade(slurm="22.05")
    return _expect(
        name,
        sim,
        root,
        status="cancelled",
        primary="cancelled",
        classes=["cancelled"],
        absent=["node-fail", "hang"],
        slurm_state="CANCELLED",
        notes="scancel while training progressed normally: all nodes NODE_EXIT 143 (harmless), "
        "srun exit-143 cascade, FAILED (exit 143) - CANCELLED.",
    )


@scenario(48108)
def sc_cancelled_after_hang(root: Path, seed: int) -> Expectation:
    name = "cancelled-after-hang"
    sim = _sim(name, seed, nnodes=4, ray=True, steps=1000, model="llama3.1-70b", step_time=5.0)
    _start(sim)
    sim.steps(0, 90)
    sim.quiet_noise(2.5 * 3600, 120)
    sim.cancel_cascade(slurm="25.05")
    return _expect(
        name,
        sim,
        root,
        status="cancelled",
        primary="hang",
        classes=["hang", "cancelled"],
        absent=["node-fail"],
        slurm_state="CANCELLED",
        notes="Steps stopped at 90, then 2.5 h of non-training output before scancel (Slurm 25.05 "
        "'DUE to SIGNAL Terminated'). Cancellation is the mechanism; the hang is the root cause.",
    )


def _heartbeat(
    sim: JobSim, dead: Sequence[int], *, old: bool = False, alive: Sequence[int] | None = None
) -> None:
    """Every live task reports the coordination-service error (accused tasks too: they were alive)."""
    order = list(alive) if alive is not None else list(range(sim.ntasks))
    sim.rng.shuffle(order)
    for r in order:
        for ln in L.heartbeat_block(sim.t + sim.rng.uniform(0, 0.3), sim.tids[r], dead, old_ending=old):
            sim.train_out(r, ln)
    sim.advance(2)


@scenario(48109)
def sc_heartbeat_mid_training(root: Path, seed: int) -> Expectation:
    name = "heartbeat-mid-training"
    sim = _sim(name, seed, nnodes=8, steps=1000, model="llama2-70b", heartbeat_timeout=100, step_time=5.4)
    _start(sim)
    sim.steps(0, 9, rampup_until=9, noise_per_step=0.3)
    sim.steps(10, 130, start_first=0)
    sim.advance(sim.spec.step_time * 0.7)
    _heartbeat(sim, [5])
    sim.node_exits(
        _fail_exits(sim, {5: 134, 0: 134, 1: 134, 2: 134, 3: 134, 4: 134, 6: 134, 7: 134}), terminate_after=0
    )
    sim.training_failed(134)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="heartbeat-timeout",
        classes=["heartbeat-timeout"],
        absent=["hang", "oom-host", "nccl-timeout"],
        slurm_state="FAILED",
        notes="gRPC false positive: training progressed right up to the heartbeat error (wall time ~= "
        "setup + sum of step seconds). The accused task 5 logs its own fatal error. Steps 0-9 use the "
        "'[Rampup Batch Size Phase], ' form without TFLOP/s.",
    )


@scenario(48110)
def sc_heartbeat_after_stall(root: Path, seed: int) -> Expectation:
    name = "heartbeat-after-stall"
    sim = _sim(
        name,
        seed,
        nnodes=4,
        ray=True,
        steps=1000,
        model="llama3.1-70b",
        heartbeat_timeout=100,
        step_time=5.0,
        ray_ip_prefix=True,
    )
    _start(sim)
    sim.steps(0, 110)
    sim.quiet_noise(45 * 60, 90)
    _heartbeat(sim, [2], old=True)
    # RAY=1: the fatal log aborts the training subprocess; each actor reports the signal and the
    # driver exits sys.exit(-6) == 250.
    for r in range(sim.ntasks):
        sim.task(r, L.actor_killed(r, sim.hosts[r], "SIGABRT", 6))
    sim.node_exits(_fail_exits(sim, {}, others=250), terminate_after=0)
    sim.training_failed(250)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="hang",
        classes=["hang", "heartbeat-timeout"],
        slurm_state="FAILED",
        notes="Steps stopped at 110, 45 minutes of silence (only Ray chatter), then the heartbeat "
        "timeout killed the job (older message ending). Wall time >> setup + sum of step seconds: "
        "primary hang, heartbeat secondary.",
    )


@scenario(48111)
def sc_heartbeat_init(root: Path, seed: int) -> Expectation:
    name = "heartbeat-init"
    sim = _sim(
        name,
        seed,
        nnodes=8,
        steps=1000,
        model="deepseek3-671b",
        heartbeat_timeout=100,
        checkpointing=True,
        checkpoint_period=500,
        compile_time=420.0,
    )
    _start(sim, barrier=False)
    _heartbeat(sim, [3, 6])
    sim.node_exits(_fail_exits(sim, {}, others=134), terminate_after=0)
    sim.training_failed(134)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="heartbeat-timeout",
        classes=["heartbeat-timeout"],
        absent=["hang"],
        slurm_state="FAILED",
        notes="Init-phase heartbeat kill during XLA compilation: zero steps, heartbeat timeout 100 s.",
    )


@scenario(48112)
def sc_soft_success_a(root: Path, seed: int) -> Expectation:
    name = "soft-success-a"
    sim = _sim(name, seed, nnodes=4, ray=True, steps=100, model="llama3.1-8b", step_time=2.1)
    _start(sim)
    sim.steps(0, 99)
    sim.advance(20)
    sim.task(0, "[Ray] Stopping cluster")
    sim.advance(1)
    sim.task(
        2,
        L.absl_prefix(sim.t, sim.tids[2], "core_worker.cc:1102", "E")
        + "Failed to kill actor 5ed1d1a4c6e5b0c2a6f7e8d901000000: RPC error: GCS connection lost during shutdown",
    )
    sim.node_exits({2: 1}, terminate_after=None)
    sim.training_failed(1)
    return _expect(
        name,
        sim,
        root,
        status="completed",
        primary="soft-success",
        classes=["soft-success"],
        absent=["unknown-death", "hang"],
        slurm_state="FAILED",
        notes="Soft success (a): completed step 99 of steps=100, then one rank exits 1 (ray.kill racing "
        "cluster shutdown), others exit 0. Status reported as completed.",
    )


@scenario(48113)
def sc_soft_success_b(root: Path, seed: int) -> Expectation:
    name = "soft-success-b"
    sim = _sim(name, seed, nnodes=8, steps=100, model="llama2-70b")
    _start(sim)
    sim.steps(0, 99)
    sim.advance(30)
    for i in range(5):
        sim.advance(60)
        sim.task(3, L.pending_event_logger(sim.t, sim.tids[3], 60 * (i + 1)))
    sim.batch(L.srun_terminating(sim.step_id))
    sim.node_exits({r: 143 for r in range(sim.ntasks)})
    sim.training_failed(143)
    return _expect(
        name,
        sim,
        root,
        status="completed",
        primary="soft-success",
        classes=["soft-success"],
        absent=["unknown-death", "hang", "node-fail"],
        slurm_state="FAILED",
        notes="Soft success (b): completed step 99 of 100, then a pending_event_logger stall on task 3 "
        "for minutes and an all-143 cascade.",
    )


@scenario(48114)
def sc_soft_success_c(root: Path, seed: int) -> Expectation:
    name = "soft-success-c"
    sim = _sim(name, seed, nnodes=4, steps=100, model="llama2-70b", color="setaf")
    _start(sim)
    sim.steps(0, 99)
    sim.advance(40)
    sim.cancel_cascade(reason="time")
    return _expect(
        name,
        sim,
        root,
        status="completed",
        primary="soft-success",
        classes=["soft-success"],
        absent=["unknown-death", "hang", "node-fail"],
        slurm_state="TIMEOUT",
        notes="Soft success (c): completed step 99 of 100, then Slurm cancelled at the --time walltime "
        "during teardown (DUE TO TIME LIMIT); all ranks 143; summary FAILED (exit 143) - CANCELLED.",
    )


# ---------------------------------------------------------------------------------------------
# Training failures
# ---------------------------------------------------------------------------------------------


@scenario(48115)
def sc_oom_cascade(root: Path, seed: int) -> Expectation:
    name = "oom-cascade"
    sim = _sim(
        name,
        seed,
        nnodes=8,
        steps=1000,
        model="llama2-70b",
        checkpointing=True,
        checkpoint_period=200,
        step_time=5.0,
    )
    _start(sim)
    sim.steps(0, 150, noise_per_step=0.3)
    sim.advance(2.0)
    sim.task(
        3,
        f"bash: line 1: {sim.train_pids[3]} Killed                  python3 -u "
        "/workspace/maxtext-slurm/utils/mfu_tracker.py MaxText/configs/base.yml ...",
    )
    sim.batch(L.slurmstepd_oom(sim.step_id, slurm="23.02", host=sim.hosts[3]))
    sim.advance(120)
    for r in [0, 1, 2, 4, 5, 6, 7]:
        for ln in L.nccl_warn(
            sim.hosts[r],
            81000 + r,
            81268 + r,
            r % 8,
            "enqueue.cc:1624",
            "Timeout waiting for collective ncclAllReduce (opCount 3f1a) after 120000 ms",
        ):
            sim.task(r, ln)
        sim.advance(0.3)
    sim.advance(100)
    _heartbeat(sim, [3], alive=[0, 1, 2, 4, 5, 6, 7])
    sim.task(3, L.node_exit(sim.hosts[3], 137))
    sim.batch(L.srun_task_oom(sim.hosts[3], "3"))
    sim.batch(L.srun_terminating(sim.step_id))
    sim.node_exits({r: 134 for r in range(8) if r != 3})
    sim.training_failed(137)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="oom-host",
        classes=["oom-host", "nccl-timeout", "heartbeat-timeout", "node-fail"],
        slurm_state="FAILED",
        notes="Host OOM-kill on node004 (task 3: shell 'Killed', cgroup oom_kill event), then NCCL "
        "timeouts on the other nodes, then a (true-positive) heartbeat timeout naming task 3.",
    )


def _traceback(
    sim: JobSim, ranks: Sequence[int], frames: Sequence[tuple[str, int, str, str]], final: str
) -> None:
    for r in ranks:
        sim.train_out(r, *L.traceback_block(frames, final))


@scenario(48116)
def sc_oom_gpu(root: Path, seed: int) -> Expectation:
    name = "oom-gpu"
    sim = _sim(name, seed, nnodes=8, steps=100, model="llama3.1-405b", compile_time=240.0)
    _start(sim, barrier=False)
    for r in range(8):
        sim.train_out(r, L.bfc_oom(sim.t, sim.tids[r], r % 8, 221.71))
    _traceback(sim, range(8), L.COMPILE_FRAMES, L.xla_oom(238_056_226_816, old=True))
    sim.advance(5)
    sim.node_exits(_fail_exits(sim, {}, others=1), terminate_after=0)
    sim.training_failed(1)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="oom-gpu",
        classes=["oom-gpu"],
        absent=["oom-host"],
        slurm_state="FAILED",
        notes="GPU OOM while compiling llama3.1-405b; env dump shows XLA_PYTHON_CLIENT_MEM_FRACTION=.85 "
        "(rule NS-7, the first fix: raise it to .93).",
    )


@scenario(48117)
def sc_xla_compile_fail(root: Path, seed: int) -> Expectation:
    name = "xla-compile-fail"
    sim = _sim(name, seed, nnodes=4, ray=True, steps=100, model="deepseek3-671b", compile_time=200.0)
    _start(sim, barrier=False)
    for r in range(4):
        sim.train_out(
            r,
            sim.absl(r, "gpu_compiler.cc:2412", "E") + "HloModule jit_train_step failed: "
            "LLVM ERROR: Cannot select: intrinsic %llvm.amdgcn.mfma.f32.32x32x16.bf8.bf8",
        )
    _traceback(
        sim,
        range(4),
        L.COMPILE_FRAMES,
        "jax.errors.JaxRuntimeError: INTERNAL: Failed to compile HloModule jit_train_step: "
        "XLA compilation failed (fusion.3391)",
    )
    for r in range(4):
        sim.task(r, L.actor_exited(r, sim.hosts[r], 1))
    sim.node_exits(_fail_exits(sim, {}, others=1), terminate_after=0)
    sim.training_failed(1)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="xla-compile-fail",
        classes=["xla-compile-fail", "python-exception", "subprocess-fail"],
        slurm_state="FAILED",
        notes="Cascade: XLA compile failure -> Python exception -> training subprocess exit 1 on every "
        "node; the root cause is the compile failure.",
    )


@scenario(48118)
def sc_python_exception(root: Path, seed: int) -> Expectation:
    name = "python-exception"
    sim = _sim(name, seed, nnodes=4, steps=200, model="llama3.1-8b", step_time=2.0)
    _start(sim)
    sim.steps(0, 57)
    sim.advance(1.2)
    _traceback(
        sim,
        [2],
        L.TRAIN_FRAMES[:2]
        + (
            (
                "/workspace/maxtext/MaxText/input_pipeline/_grain_data_processing.py",
                188,
                "map",
                "return self._tokenizer.encode(features['text'])",
            ),
        ),
        "ValueError: grain: record 18213 in /data/c4/en/3.0.1/c4-train.array_record-00042-of-01024 has length 0",
    )
    sim.advance(1)
    sim.node_exits(_fail_exits(sim, {2: 1}), terminate_after=0)
    sim.training_failed(1)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="python-exception",
        classes=["python-exception"],
        absent=["hang", "oom-gpu", "oom-host"],
        slurm_state="FAILED",
        notes="Data-pipeline ValueError on task 2 at step 58; others terminated with 143.",
    )


@scenario(48119)
def sc_signal_kill(root: Path, seed: int) -> Expectation:
    name = "signal-kill"
    sim = _sim(name, seed, nnodes=4, ray=True, steps=300, model="llama3.1-70b", step_time=5.0)
    _start(sim)
    sim.steps(0, 75)
    sim.advance(2.5)
    sim.task(1, L.actor_killed(1, sim.hosts[1], "SIGSEGV", 11))
    sim.core_files.append(f"core.{sim.spec.job_id}.{int(sim.t)}.1.{sim.hosts[1]}.python3.{sim.train_pids[1]}")
    sim.node_exits(_fail_exits(sim, {1: 245}), terminate_after=0)
    sim.training_failed(245)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="signal-kill",
        classes=["signal-kill"],
        absent=["hang"],
        slurm_state="FAILED",
        notes="Training subprocess on node002 killed by SIGSEGV; the Ray driver exits sys.exit(-11) = 245; "
        "a core file sits in the job dir.",
    )


@scenario(48120)
def sc_actor_fail(root: Path, seed: int) -> Expectation:
    name = "actor-fail"
    sim = _sim(name, seed, nnodes=4, ray=True, steps=300, model="llama3.1-70b", step_time=5.0)
    _start(sim)
    sim.steps(0, 40)
    sim.advance(3)
    died = L.ACTOR_DIED.format(pid=sim.actor_pids[2], rank=2, ip=L.host_ip(sim.hosts[2]))
    sim.task(2, L.actor_failed(2, died))
    sim.task(
        2,
        *L.traceback_block(
            [
                (
                    "/workspace/maxtext-slurm/_ray_actor.py",
                    163,
                    "main",
                    "exit_code = ray.get(actor.run_training.remote(train_argv, captured_env))",
                )
            ],
            "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
        ),
    )
    sim.node_exits(_fail_exits(sim, {2: 1}), terminate_after=0)
    sim.training_failed(1)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="actor-fail",
        classes=["actor-fail"],
        absent=["hang"],
        slurm_state="FAILED",
        notes="Ray actor on node003 died; '[Node 2] Actor failed:' followed by the driver's traceback "
        "(rule CL-ACTOR-FAIL: actor-fail 'includes traceback', so it outranks python-exception here).",
    )


@scenario(48121)
def sc_node_fail(root: Path, seed: int) -> Expectation:
    name = "node-fail"
    sim = _sim(name, seed, nnodes=8, steps=1000, model="llama2-70b", step_time=5.0)
    _start(sim)
    sim.steps(0, 130, noise_per_step=0.3)
    sim.advance(3)
    sim.node_exits(_fail_exits(sim, {5: 137}), terminate_after=0, old_srun=True)
    sim.training_failed(137)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="node-fail",
        classes=["node-fail"],
        absent=["oom-host", "cancelled", "hang"],
        slurm_state="FAILED",
        notes="NODE_EXIT host=node006 exit=137 with no OOM signature (external SIGKILL / hardware); "
        "other nodes exit 143 from srun's --kill-on-bad-exit (older srun wording 'Terminating job step').",
    )


@scenario(48122)
def sc_nccl_timeout(root: Path, seed: int) -> Expectation:
    name = "nccl-timeout"
    sim = _sim(name, seed, nnodes=4, steps=400, model="llama3.1-70b", step_time=5.0)
    _start(sim)
    sim.steps(0, 88)
    sim.advance(60)
    for ln in L.nccl_warn(
        sim.hosts[1],
        81201,
        81502,
        3,
        "transport/net_ib.cc:1696",
        "NET/IB : Got completion from peer 10.0.0.7<48312> with status=12 opcode=0 len=0 vendor "
        "err 129 (Send) localGid ::ffff:10.0.0.3 remoteGid ::ffff:10.0.0.7",
        ts=sim.t,
    ):
        sim.task(1, ln)
    sim.advance(240)
    for r in range(4):
        for ln in L.nccl_warn(
            sim.hosts[r],
            81200 + r,
            81500 + r,
            r,
            "misc/socket.cc:478",
            "socketStartConnect: exceeded timeouts (5)",
            ts=sim.t,
        ):
            sim.task(r, ln)
    _traceback(
        sim,
        [1],
        L.TRAIN_FRAMES,
        "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: external/xla/xla/service/gpu/runtime/"
        f"nccl_api.cc:634: NCCL operation ncclGroupEnd() failed: {L.NCCL_SYSTEM_ERROR}. "
        "Last NCCL warning(error) log entry (may be unrelated) 'socketStartConnect: exceeded timeouts (5)'.",
    )
    sim.node_exits(_fail_exits(sim, {1: 1}), terminate_after=0)
    sim.training_failed(1)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="nccl-timeout",
        classes=["nccl-timeout"],
        absent=["hang", "oom-host"],
        slurm_state="FAILED",
        notes="NCCL >= 2.26 WARN lines with the [%F %T] prefix (each after a blank line): IB completion "
        "error then socket connect timeouts, then ncclSystemError in a traceback.",
    )


@scenario(48123)
def sc_subprocess_fail(root: Path, seed: int) -> Expectation:
    name = "subprocess-fail"
    sim = _sim(name, seed, nnodes=3, ray=True, steps=100, model="llama3.1-8b", compile_time=10.0)
    sim.header()
    sim.stages_ok()
    sim.train_begin()
    sim.env_dumps()
    sim.ray_start()
    for r in range(3):
        sim.train_out(
            r,
            "usage: mfu_tracker.py <config.yml> [key=value ...]",
            "mfu_tracker.py: error: argument 'per_device_batch_size=six': invalid int value",
        )
        sim.task(r, L.actor_exited(r, sim.hosts[r], 2))
    sim.node_exits(_fail_exits(sim, {}, others=2), terminate_after=0)
    sim.training_failed(2)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="subprocess-fail",
        classes=["subprocess-fail"],
        absent=["python-exception", "hang"],
        slurm_state="FAILED",
        notes="Training subprocess exited with code 2 (bad argument) on every node before any step.",
    )


@scenario(48124)
def sc_checkpoint_fs_error(root: Path, seed: int) -> Expectation:
    name = "checkpoint-fs-error"
    sim = _sim(
        name,
        seed,
        nnodes=4,
        ray=True,
        steps=500,
        checkpointing=True,
        checkpoint_period=50,
        model="llama3.1-70b",
        step_time=5.0,
        save_form="new",
    )
    _start(sim)
    sim.steps(0, 100, skip_save=(100,))
    sim.advance(240)
    ck = f"/outputs/{sim.spec.model}/checkpoints/100/manifest.ocdbt.__lock"
    # One writer hits a transient NFS ENOENT while the others finish the same checkpoint.
    sim.train_out(0, sim.absl(0, "train.py:1052", "E") + L.checkpoint_failed(ck))
    for r in (1, 2, 3):
        sim.train_out(r, sim.absl(r, "train.py:1040") + L.checkpoint_saved(100))
    sim.task(0, L.actor_exited(0, sim.head, 1))
    sim.node_exits(_fail_exits(sim, {0: 1}), terminate_after=0)
    sim.training_failed(1)
    shared = root / sim.spec.model / "checkpoints"
    for st in (50, 100):
        d = shared / str(st)
        d.mkdir(parents=True, exist_ok=True)
        (d / "manifest.ocdbt").write_bytes(b"OCDBT\x00")
        (d / "_CHECKPOINT_METADATA").write_text(f'{{"step": {st}}}\n')
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="checkpoint-fs-error",
        classes=["checkpoint-fs-error"],
        absent=["hang"],
        slurm_state="FAILED",
        last_checkpoint=100,
        notes="Head-node worker log: 'Training stopped: Checkpointing failed. [Errno 2] ... "
        "manifest.ocdbt.__lock' at step 100; the other three workers logged 'Saved a checkpoint at step "
        "100.' and outputs/llama3.1-70b/checkpoints/100 has its final name: intact, zero progress lost.",
    )


@scenario(48149)
def sc_oom_gpu_midtrain(root: Path, seed: int) -> Expectation:
    name = "oom-gpu-midtrain"
    sim = _sim(
        name, seed, nnodes=4, ray=True, steps=500, model="llama3.1-405b", step_time=6.0, mem_fraction=".93"
    )
    _start(sim)
    sim.steps(0, 60)
    sim.advance(4)
    _traceback(sim, [3], L.TRAIN_FRAMES, L.xla_oom(24_159_191_040, old=False, gib=True))
    sim.task(3, L.actor_exited(3, sim.hosts[3], 1))
    sim.node_exits(_fail_exits(sim, {3: 1}), terminate_after=0)
    sim.training_failed(1)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="oom-gpu",
        classes=["oom-gpu"],
        absent=["oom-host", "hang"],
        slurm_state="FAILED",
        notes="GPU OOM at step 61 on node004 (jax.errors.JaxRuntimeError, GiB size) with "
        "XLA_PYTHON_CLIENT_MEM_FRACTION=.93 already: the fallback OOM playbook applies (rule NS-7).",
    )


@scenario(48150)
def sc_oom_host_ray(root: Path, seed: int) -> Expectation:
    name = "oom-host-ray"
    sim = _sim(
        name,
        seed,
        nnodes=4,
        ray=True,
        steps=500,
        model="llama3.1-70b",
        step_time=5.0,
        checkpointing=True,
        checkpoint_period=50,
    )
    _start(sim)
    sim.steps(0, 50)
    sim.advance(30)
    sim.task(0, L.actor_killed(0, sim.head, "SIGKILL", 9))
    sim.batch(L.slurmstepd_oom(sim.step_id, slurm="22.05"))
    sim.node_exits(_fail_exits(sim, {0: 247}), terminate_after=0)
    sim.training_failed(247)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="oom-host",
        classes=["oom-host", "signal-kill"],
        absent=["hang", "oom-gpu"],
        slurm_state="OUT_OF_MEMORY",
        notes="Host OOM during the step-50 checkpoint on the head node: the kernel SIGKILLs the training "
        "subprocess (actor reports SIGKILL, driver exits 247) and slurmstepd reports the cgroup "
        "oom-kill (Slurm 22.05 wording). oom-host outranks signal-kill.",
    )


@scenario(48151)
def sc_completed_24n(root: Path, seed: int) -> Expectation:
    name = "completed-24n"
    sim = _sim(name, seed, nnodes=24, steps=30, model="llama3.1-405b", step_time=14.0, tag="24n")
    _start(sim)
    sim.steps(0, 29, noise_per_step=0.3)
    sim.train_end_ok()
    sim.summary(0)
    return _expect(
        name,
        sim,
        root,
        status="completed",
        primary=None,
        slurm_state="COMPLETED",
        absent=["hang", "unknown-death", "node-fail"],
        notes="24 nodes: srun -l pads task ids to two columns (' 0: ' ... '23: ').",
    )


@scenario(48152)
def sc_heartbeat_after_stall_24n(root: Path, seed: int) -> Expectation:
    name = "heartbeat-after-stall-24n"
    sim = _sim(
        name, seed, nnodes=24, steps=2000, model="llama3.1-405b", step_time=14.0, heartbeat_timeout=100
    )
    _start(sim)
    sim.steps(0, 24, noise_per_step=0.2)
    sim.quiet_noise(52 * 60, 600)
    _heartbeat(sim, [17])
    sim.node_exits(_fail_exits(sim, {}, others=134), terminate_after=0)
    sim.training_failed(134)
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="hang",
        classes=["hang", "heartbeat-timeout"],
        slurm_state="FAILED",
        notes="RAY=0, 24 tasks: all stopped after step 24, 52 minutes of near-silence, then every one of the "
        "24 tasks reports the heartbeat error naming task 17 (alive: it reports its own death too). No TSDB: "
        "the wall-time gap is the evidence for the hang.",
    )


# ---------------------------------------------------------------------------------------------
# Restore and TGS
# ---------------------------------------------------------------------------------------------


@scenario(48125)
def sc_restored(root: Path, seed: int) -> Expectation:
    name = "restored"
    sim = _sim(
        name,
        seed,
        nnodes=4,
        ray=True,
        steps=300,
        checkpointing=True,
        checkpoint_period=100,
        model="llama3.1-70b",
        step_time=5.0,
        style=L.StepStyle(live_slices=4),
    )
    _start(sim, restore_from=200)
    sim.steps(201, 299)
    sim.train_end_ok()
    sim.summary(0)
    return _expect(
        name,
        sim,
        root,
        status="completed",
        primary=None,
        slurm_state="COMPLETED",
        absent=["tgs-degradation", "hang"],
        notes="Restored from checkpoint step 200 (worker log 'restoring from this run's directory step "
        "200'); first step 201. Elastic step lines ('live slice count: 4').",
    )


def _saves_on_a_slow_filesystem(name: str, root: Path, seed: int, *, asynchronous: bool) -> Expectation:
    """A healthy run whose periodic saves block the step after them for 5-20 steps' worth of time
    (a busy shared filesystem), while the initial save at step 0 barely slowed step 1."""
    period = 15
    # Steps' worth of time each periodic save blocks the step after it (runbook: post-checkpoint
    # steps of 300-500 s for ~30 s steps are normal), the first ones cheap for the sync run.
    blocks = (
        {15: 5, 30: 12, 45: 20, 60: 8, 75: 17, 90: 6, 105: 19}
        if asynchronous
        else {15: 1, 30: 1, 45: 10, 60: 16, 75: 20, 90: 13, 105: 5}
    )
    sim = _sim(
        name,
        seed,
        nnodes=4,
        steps=120,
        checkpointing=True,
        checkpoint_period=period,
        model="llama3.1-70b",
        step_time=30.0,
        save_form="async" if asynchronous else "new",
        extra_args={"async_checkpointing": True} if asynchronous else {},
    )
    _start(sim)
    base = sim.spec.step_time

    def seconds(step: int) -> float:
        if step == 1:
            return base * sim.rng.uniform(1.02, 1.08)  # the step-0 save cost step 1 almost nothing
        return sim.default_seconds(step, 0) + blocks.get(step - 1, 0) * base * sim.rng.uniform(0.97, 1.03)

    sim.steps(0, 119, seconds)
    sim.train_end_ok()
    sim.summary(0)
    kind = "asynchronous (the commit blocks the step beside it)" if asynchronous else "synchronous"
    return _expect(
        name,
        sim,
        root,
        status="completed",
        primary=None,
        slurm_state="COMPLETED",
        absent=["hang", "tgs-degradation", "unknown-death"],
        notes=f"Healthy, 30 s steps, {kind} saves every {period} steps on a busy filesystem: the "
        "step after each periodic save takes 5-20 steps' worth of time (the first two cheap in the "
        "sync run), while step 1 after the initial step-0 save is barely slower than a normal step. "
        "Normal checkpoint behaviour (rule HANG-4): no hang page.",
    )


@scenario(48153)
def sc_async_saves_slow_fs(root: Path, seed: int) -> Expectation:
    return _saves_on_a_slow_filesystem("async-saves-slow-fs", root, seed, asynchronous=True)


@scenario(48154)
def sc_sync_saves_slow_fs(root: Path, seed: int) -> Expectation:
    return _saves_on_a_slow_filesystem("sync-saves-slow-fs", root, seed, asynchronous=False)


def _tgs_job(
    name: str,
    root: Path,
    seed: int,
    factor: Callable[[int], float],
    *,
    ray: bool,
    steps: int,
    pattern: str,
    degraded: bool,
    notes: str,
    restore_from: int | None = None,
    profiler_steps: Sequence[int] = (),
    **kw: object,
) -> Expectation:
    sim = _sim(
        name, seed, nnodes=4, ray=ray, steps=steps, step_time=5.6, tokens_per_device_step=3290 * 5.6, **kw
    )
    _start(sim, restore_from=restore_from)
    first = 0 if restore_from is None else restore_from + 1
    sim.steps(
        first, steps - 1, _steady(sim, first, factor), noise_per_step=0.4, profiler_steps=profiler_steps
    )
    sim.train_end_ok()
    sim.summary(0)
    absent = [] if degraded else ["tgs-degradation"]
    return _expect(
        name,
        sim,
        root,
        status="completed",
        primary=None,
        classes=["tgs-degradation"] if degraded else [],
        absent=absent + ["hang"],
        slurm_state="COMPLETED",
        tgs_degraded=degraded,
        tgs_pattern=pattern,
        notes=notes,
    )


@scenario(48126)
def sc_tgs_constant_drop(root: Path, seed: int) -> Expectation:
    return _tgs_job(
        "tgs-constant-drop",
        root,
        seed,
        lambda s: 1.306 if s >= 30 else 1.0,
        ray=True,
        steps=100,
        pattern="constant-drop",
        degraded=True,
        model="llama3.1-70b",
        notes="TGS 3290 -> ~2520 (-23%) from step 30 to the end, every step uniformly slower.",
    )


@scenario(48127)
def sc_tgs_phased(root: Path, seed: int) -> Expectation:
    def f(s: int) -> float:
        if 40 <= s < 60:
            return 1.18
        if s >= 75:
            return 1.35
        return 1.0

    return _tgs_job(
        "tgs-phased",
        root,
        seed,
        f,
        ray=False,
        steps=120,
        pattern="phased",
        degraded=True,
        model="deepseek3-671b",
        style=L.StepStyle(moe=True),
        notes="TGS drops -15% at 40-59, recovers at 60-74, drops -26% from 75 to the end.",
    )


@scenario(48128)
def sc_tgs_gradual(root: Path, seed: int) -> Expectation:
    return _tgs_job(
        "tgs-gradual",
        root,
        seed,
        lambda s: 1.0 + 0.0028 * max(s - 410, 0),
        ray=True,
        steps=520,
        pattern="gradual",
        degraded=True,
        restore_from=400,
        checkpointing=True,
        checkpoint_period=1000,
        restore_spaced=True,
        model="llama3.1-70b",
        notes="Restored job (2024 restore form with a run of spaces, step 400); step time grows ~0.28%/step "
        "(leaked RCCL communicator threads): last 10 steps ~-24% TGS vs steps 406-416.",
    )


@scenario(48129)
def sc_tgs_periodic(root: Path, seed: int) -> Expectation:
    def f(s: int) -> float:
        return 6.0 if s > 1 and (s - 1) % 15 == 0 else 1.0

    return _tgs_job(
        "tgs-periodic",
        root,
        seed,
        f,
        ray=False,
        steps=100,
        pattern="periodic",
        degraded=False,
        checkpointing=True,
        checkpoint_period=15,
        save_form="async",
        period_in_args=False,
        model="llama2-70b",
        notes="checkpoint_period=15 comes from the model YAML (only 'Config param checkpoint_period: 15' shows "
        "it; PASSTHROUGH_ARGS has enable_checkpointing=true alone): the step after every checkpoint (16, 31, ..., 91) takes ~6x longer "
        "while the async save commits; otherwise flat. Expected behaviour, NOT degradation.",
    )


@scenario(48130)
def sc_tgs_one_time_drop(root: Path, seed: int) -> Expectation:
    return _tgs_job(
        "tgs-one-time-drop",
        root,
        seed,
        lambda s: 1.25 if s >= 70 else 1.0,
        ray=True,
        steps=100,
        pattern="one-time",
        degraded=True,
        model="llama3.1-70b",
        notes="Flat until step 69, then one sudden -20% TGS drop at step 70 that never recovers.",
    )


def _jitter(name: str, seed: int, steps: int, sigma: float, outliers: float) -> list[float]:
    """Per-step step-time factors of a real job: gaussian jitter and rare one-off slow steps."""
    rng = random.Random(f"{name}:jitter:{seed}")
    return [
        max(0.5, 1.0 + rng.gauss(0.0, sigma)) * (1.8 if rng.random() < outliers else 1.0)
        for _ in range(steps)
    ]


@scenario(48190)
def sc_tgs_noisy_healthy(root: Path, seed: int) -> Expectation:
    jitter = _jitter("tgs-noisy-healthy", seed, 300, 0.04, 0.0)

    def f(s: int) -> float:
        return jitter[s] * (2.5 if 40 <= s <= 46 else 1.0)

    return _tgs_job(
        "tgs-noisy-healthy",
        root,
        seed,
        f,
        ray=False,
        steps=300,
        pattern="none",
        degraded=False,
        profiler_steps=(40, 46),
        model="llama3.1-70b",
        notes="Healthy job with ±4% step-time jitter and a profiler window (activation at step 40, deactivation "
        "at 46, those steps 2.5x slower): no pattern, not degraded, not periodic.",
    )


@scenario(48191)
def sc_tgs_noisy_gradual(root: Path, seed: int) -> Expectation:
    jitter = _jitter("tgs-noisy-gradual", seed, 260, 0.04, 0.0)
    return _tgs_job(
        "tgs-noisy-gradual",
        root,
        seed,
        lambda s: jitter[s] * (1.0 + 0.0014 * max(s - 40, 0)),
        ray=False,
        steps=260,
        pattern="gradual",
        degraded=True,
        model="llama3.1-70b",
        notes="Step time grows ~0.14%/step from step 40 under ±4% jitter (a resource leak): TGS slides ~-24% "
        "by the end; a steady slide, not phases.",
    )


# ---------------------------------------------------------------------------------------------
# Infrastructure failures and stage timeouts
# ---------------------------------------------------------------------------------------------


def _stage_fail(
    sim: JobSim, key: str, per_node: dict[int, Sequence[str]], rc: int = 1, secs: float = 30
) -> None:
    desc = L.STAGE_DESCRIPTIONS[key]
    sim.batch(L.stage_begin(desc, sim.spec.timeouts[key]))
    sim.advance(secs)
    for r, out in per_node.items():
        sim.task(r, *out)
    sim.node_exits({r: rc for r in per_node}, terminate_after=0)
    sim.batch(L.stage_failed(desc, rc, int(secs + 2)))
    sim.summary(1, L.stage_failure_text(desc, rc))


def _train_stage_fail(sim: JobSim, per_node: dict[int, Sequence[str]], rc: int = 1) -> None:
    for r, out in per_node.items():
        sim.task(r, *out)
    sim.node_exits(_fail_exits(sim, {r: rc for r in per_node}), terminate_after=0)
    sim.training_failed(rc)


def _infra(
    name: str,
    root: Path,
    sim: JobSim,
    cls: str,
    notes: str,
    *,
    status: str = "failed",
    slurm_state: str = "FAILED",
    summary: bool = True,
    absent: Sequence[str] = (),
) -> Expectation:
    return _expect(
        name,
        sim,
        root,
        status=status,
        primary=cls,
        classes=[cls],
        slurm_state=slurm_state,
        absent=["hang", "unknown-death", *absent],
        notes=notes,
        summary=summary,
    )


@scenario(48131)
def sc_container_pull_fail(root: Path, seed: int) -> Expectation:
    name = "container-pull-fail"
    sim = _sim(name, seed, nnodes=4)
    sim.header()
    sim.stage_ok("preflight", 12)
    img = "registry.example.com/ml/jax-maxtext:25.11-rocm7"
    _stage_fail(
        sim,
        "pull",
        {
            r: ([L.login_failed("registry.example.com")] if r == 0 else [])
            + [L.pull_failed(img, authenticated=True)]
            for r in range(4)
        },
    )
    return _infra(
        name, root, sim, "container-pull-fail", "Registry login + authenticated pull failed on all nodes."
    )


@scenario(48132)
def sc_container_load_fail(root: Path, seed: int) -> Expectation:
    name = "container-load-fail"
    sim = _sim(name, seed, nnodes=2)
    sim.header()
    sim.stage_ok("preflight", 9)
    _stage_fail(
        sim,
        "pull",
        {
            1: [
                "Loading image from /shared/images/jax-maxtext-25.11.tar ...",
                "open /var/lib/docker/tmp/docker-import-1234/repositories: no such file or directory",
                L.LOAD_FAILED,
            ]
        },
        secs=75,
    )
    return _infra(
        name, root, sim, "container-load-fail", "docker load of the image tarball failed on node002."
    )


@scenario(48133)
def sc_no_gpu(root: Path, seed: int) -> Expectation:
    name = "no-gpu"
    sim = _sim(name, seed, nnodes=4)
    sim.header()
    sim.stages_ok()
    sim.train_begin()
    sim.env_dumps()
    _train_stage_fail(sim, {2: [L.NO_GPU, "[container] refusing to start training without GPUs"]})
    return _infra(name, root, sim, "no-gpu", "node003 sees no GPU devices at container start.")


@scenario(48134)
def sc_nccl_nic_fail(root: Path, seed: int) -> Expectation:
    name = "nccl-nic-fail"
    sim = _sim(name, seed, nnodes=4)
    sim.header()
    sim.stages_ok()
    sim.train_begin()
    sim.env_dumps()
    _train_stage_fail(sim, {2: [L.nccl_nic_fatal(sim.hosts[2])]})
    return _infra(name, root, sim, "nccl-nic-fail", "choose_nccl_socket_ifname found no NIC on node003.")


@scenario(48135)
def sc_port_fail(root: Path, seed: int) -> Expectation:
    name = "port-fail"
    sim = _sim(name, seed, nnodes=8)
    # _job.sbatch picks the port before it prints the header or installs the EXIT trap: the log is
    # this single line and has no JOB SUMMARY.
    sim.batch(L.PORT_FAIL_JAX)
    return _infra(
        name,
        root,
        sim,
        "port-fail",
        "The only line in the log: port selection runs before the header and before the EXIT trap, so "
        "there is no JOB SUMMARY. Status decided as failed (explicit FATAL), not unknown-death.",
        summary=False,
    )


@scenario(48136)
def sc_model_not_found(root: Path, seed: int) -> Expectation:
    name = "model-not-found"
    sim = _sim(name, seed, nnodes=2, model="llama9-70b")
    sim.header()
    sim.stages_ok()
    sim.train_begin()
    sim.env_dumps()
    _train_stage_fail(sim, {r: [L.unknown_model("llama9-70b")] for r in range(2)})
    return _infra(name, root, sim, "model-not-found", "No configs/llama9-70b.gpu.yml.")


@scenario(48137)
def sc_patch_branch_fail(root: Path, seed: int) -> Expectation:
    name = "patch-branch-fail"
    sim = _sim(name, seed, nnodes=2, extra_args={"maxtext_branch": "hotfix/rope-scaling"})
    sim.header()
    sim.stages_ok()
    sim.train_begin()
    sim.env_dumps()
    _train_stage_fail(
        sim,
        {
            r: [
                "error: pathspec 'hotfix/rope-scaling' did not match any file(s) known to git",
                L.checkout_failed("hotfix/rope-scaling"),
            ]
            for r in range(2)
        },
    )
    return _infra(
        name, root, sim, "patch-branch-fail", "MaxText hotfix branch checkout failed in the container."
    )


@scenario(48138)
def sc_ray_start_fail(root: Path, seed: int) -> Expectation:
    name = "ray-start-fail"
    sim = _sim(name, seed, nnodes=4, steps=60, model="llama3.1-8b", step_time=2.0, ray_port=12322)
    sim.header()
    # The header says RAY_PORT (Ray was requested) even though the job falls back to RAY=0.
    sim.slurm.insert(5, f"RAY_PORT={sim.spec.ray_port}")
    sim.stages_ok()
    sim.train_begin()
    sim.env_dumps()
    sim.task(0, L.ray_head_start(sim.head, 12322, L.host_ip(sim.head)))
    for r in range(1, sim.ntasks):
        sim.task(r, L.ray_worker_start(L.host_ip(sim.head), 12322, L.host_ip(sim.hosts[r])))
    for i in (1, 2, 3):
        sim.advance(10)
        for r in range(1, sim.ntasks):
            sim.task(r, L.ray_worker_retry(i))
    sim.advance(30)
    sim.task(0, L.RAY_HEAD_TIMEOUT)
    sim.all_ranks(lambda r: [L.RAY_FALLBACK], train=False)
    sim.init_training()
    sim.steps(0, 59)
    sim.train_end_ok()
    sim.summary(0)
    return _expect(
        name,
        sim,
        root,
        status="completed",
        primary="ray-start-fail",
        classes=["ray-start-fail"],
        absent=["hang"],
        slurm_state="COMPLETED",
        notes="Ray HEAD timed out; the job fell back to non-Ray mode and completed. Non-critical: "
        "status completed, ray-start-fail is the only signature (no ray_logs to read).",
    )


def _stage_timeout_job(name: str, root: Path, seed: int, key: str, before: Sequence[str]) -> Expectation:
    sim = _sim(name, seed, nnodes=4)
    sim.header()
    for k in before:
        sim.stage_ok(k, 10)
    desc = L.STAGE_DESCRIPTIONS[key]
    limit = sim.spec.timeouts[key]
    assert limit is not None
    sim.batch(L.stage_begin(desc, limit))
    if key == "pull":
        sim.all_ranks(lambda r: ["[pull] pulling rocm/jax-maxtext:25.11 (31.2 GB) ..."], train=False)
    elif key == "preflight":
        sim.all_ranks(
            lambda r: [f"[preflight] {sim.hosts[r]}: waiting for stale GPU processes to exit"], train=False
        )
    elif key == "ecc":
        sim.all_ranks(lambda r: [f"[ECC] {sim.hosts[r]}: querying UMC error counters"], train=False)
    sim.advance(limit)
    sim.batch(*L.stage_timeout(desc, key, limit, limit))
    sim.batch(L.srun_terminating(sim.step_id))
    sim.summary(1, L.stage_timeout_text(desc, limit))
    # A timeout is not a stage-fail: rule CL-STAGE-FAIL is "a non-timeout stage failure".
    return _infra(
        name,
        root,
        sim,
        f"{key}-timeout",
        f"{desc} stage exceeded its {limit}s timeout.",
        absent=["stage-fail"],
    )


@scenario(48139)
def sc_preflight_timeout(root: Path, seed: int) -> Expectation:
    return _stage_timeout_job("preflight-timeout", root, seed, "preflight", [])


@scenario(48140)
def sc_pull_timeout(root: Path, seed: int) -> Expectation:
    return _stage_timeout_job("pull-timeout", root, seed, "pull", ["preflight"])


@scenario(48141)
def sc_ecc_timeout(root: Path, seed: int) -> Expectation:
    return _stage_timeout_job("ecc-timeout", root, seed, "ecc", ["preflight", "pull"])


@scenario(48142)
def sc_train_timeout(root: Path, seed: int) -> Expectation:
    name = "train-timeout"
    sim = _sim(
        name,
        seed,
        nnodes=4,
        steps=2000,
        model="llama3.1-8b",
        step_time=9.0,
        timeouts={"preflight": 900, "pull": 900, "ecc": 300, "train": 1800},
    )
    _start(sim)
    t0 = sim.stage_t0
    n = 0
    while sim.t + sim.spec.step_time * 1.05 < t0 + 1800:
        sim.steps(n, n, start_first=0, noise_per_step=0.3)
        n += 1
    sim.t = t0 + 1800
    sim.batch(*L.stage_timeout("Training", "train", 1800, 1800))
    sim.batch(L.srun_terminating(sim.step_id))
    sim.node_exits({r: 143 for r in range(4)})
    sim.summary(1, L.stage_timeout_text("Training", 1800))
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="train-timeout",
        classes=["train-timeout"],
        absent=["hang", "node-fail", "stage-fail"],
        slurm_state="FAILED",
        notes="STAGE_TIMEOUTS train:1800 (see the header table); training was progressing until the "
        "stage timeout killed it.",
    )


@scenario(48143)
def sc_stage_fail(root: Path, seed: int) -> Expectation:
    name = "stage-fail"
    sim = _sim(name, seed, nnodes=8)
    sim.header()
    sim.stage_ok("preflight", 11)
    sim.stage_ok("pull", 40)
    _stage_fail(
        sim,
        "ecc",
        {3: ["[ECC] node004: GPU 5: 3 uncorrectable UMC errors since boot; refusing to train"]},
        secs=8,
    )
    return _expect(
        name,
        sim,
        root,
        status="failed",
        primary="stage-fail",
        classes=["stage-fail"],
        absent=["hang", "ecc-timeout"],
        slurm_state="FAILED",
        notes="ECC check FAILED (exit=1) on node004 before training.",
    )


# ---------------------------------------------------------------------------------------------
# Layout variants
# ---------------------------------------------------------------------------------------------


@scenario(48144)
def sc_prolog_kill_no_log(root: Path, seed: int) -> Expectation:
    name = "prolog-kill-no-log"
    spec = JobSpec(
        job_id=str(_JOB_IDS[name]),
        model="llama3.1-405b",
        tag="steps_20000-enable_checkpointing_true-per_device_batch_size_2-max_target_length_8192",
    )
    root.mkdir(parents=True, exist_ok=True)
    job_dir = root / spec.dirname
    job_dir.mkdir(exist_ok=True)
    log = root / f"{spec.dirname}.log"
    link = job_dir / "log"
    if link.is_symlink():
        link.unlink()
    # submit.sh created the dir and the link; slurmd killed the job before the batch script ran.
    link.symlink_to(f"../{log.name}")
    os.utime(job_dir, (SIM_EPOCH, SIM_EPOCH))
    return Expectation(
        scenario=name,
        job_id=spec.job_id,
        job_dir=job_dir,
        log=log,
        platform="slurm",
        ray=False,
        status="failed",
        primary_failure="prolog-kill-no-log",
        expected_classes=frozenset({"prolog-kill-no-log"}),
        first_step=None,
        last_step=None,
        total_steps=20000,
        start=None,
        restored_from_step=None,
        checkpoint_period=200,
        last_checkpoint_step=None,
        tgs_degraded=False,
        tgs_pattern=None,
        head_node=None,
        prometheus_port=None,
        slurm_state="FAILED",
        now=SIM_EPOCH + 600,
        notes="Job dir holds only the dangling 'log' link made at submit; no .log sibling exists (slurmd killed "
        "the job in the prolog, Reason=RaisedSignal:53).",
        absent_classes=frozenset({"unknown-death"}),
    )


@scenario(48145)
def sc_renamed_log(root: Path, seed: int) -> Expectation:
    name = "renamed-log"
    sim = _sim(
        name,
        seed,
        nnodes=4,
        steps=80,
        model="llama3.1-8b",
        step_time=2.0,
        tokens_per_device_step=6580.0,
        checkpointing=True,
        checkpoint_period=40,
    )
    _start(sim)
    sim.steps(0, 79)
    sim.train_end_ok()
    sim.summary(0)
    return _expect(
        name,
        sim,
        root,
        status="completed",
        primary=None,
        slurm_state="COMPLETED",
        log_name=f"{sim.spec.dirname}-4N-TGS_3290.log",
        absent=["hang", "unknown-death"],
        notes="Log renamed by the TGS tagger to <stem>-4N-TGS_3290.log (steady-state Tokens/s/device ~3290) "
        "and the 'log' link repointed to it.",
    )


@scenario(48146)
def sc_k8s(root: Path, seed: int) -> Expectation:
    name = "k8s"
    sim = _sim(
        name,
        seed,
        job_id="k8s-20260310-080957-475e",
        nnodes=2,
        steps=60,
        model="llama3.1-8b",
        step_time=2.0,
        platform="k8s",
    )
    sim.header()
    for r in range(sim.ntasks):
        sim.task(
            r,
            f"[{r}] Starting on {sim.hosts[r]} ({L.host_ip(sim.hosts[r])})",
            f"[{r}] Coordinator: {L.host_ip(sim.head)}:{sim.spec.jax_port}",
        )
    sim.advance(4)
    for r in range(sim.ntasks):
        sim.task(r, f"[{r}] All {sim.ntasks} nodes ready")
    sim.train_begin()
    sim.env_dumps()
    sim.init_training()
    sim.steps(0, 59)
    sim.train_end_ok()
    sim.summary(0)
    return _expect(
        name,
        sim,
        root,
        status="completed",
        primary=None,
        slurm_state=None,
        absent=["hang", "unknown-death"],
        notes="k8s job: the primary log has rank 0 only (no srun prefix); rank 1 tees into "
        "<job dir>/rank-1.log (there is no rank-0.log).",
    )


@scenario(48147)
def sc_local(root: Path, seed: int) -> Expectation:
    name = "local"
    sim = _sim(
        name,
        seed,
        job_id="local_20260310_091500_ab12",
        nnodes=1,
        steps=30,
        model="llama3.1-8b",
        step_time=1.5,
        platform="local",
        absl=False,
        style=L.StepStyle(era="2023", first_loss_no_colon=True),
        save_form="old",
        checkpointing=True,
        checkpoint_period=10,
    )
    _start(sim, stages=False)
    sim.steps(0, 29)
    sim.train_end_ok()
    sim.summary(0)
    return _expect(
        name,
        sim,
        root,
        status="completed",
        primary=None,
        slurm_state=None,
        absent=["hang", "unknown-death"],
        notes="Single-node local run (no srun prefix, no Slurm) in the old print() era: no absl prefix, "
        "2023 'TFLOP/s:' lines without Tokens/total_weights, first step 'loss 10.9' without a colon, "
        "lowercase 'saved a checkpoint at step 10'.",
    )


@scenario(48148)
def sc_shared_checkpoint_dir(root: Path, seed: int) -> Expectation:
    name = "shared-checkpoint-dir"
    d = root / "llama2-70b"
    for st in (200, 400):
        c = d / "checkpoints" / str(st)
        c.mkdir(parents=True, exist_ok=True)
        (c / "manifest.ocdbt").write_bytes(b"OCDBT\x00")
        (c / "_CHECKPOINT_METADATA").write_text(f'{{"step": {st}}}\n')
    tb = d / "tensorboard" / "plugins"
    tb.mkdir(parents=True, exist_ok=True)
    (d / "tensorboard" / "events.out.tfevents.1781251200.node001").write_bytes(b"\x18\x00\x00\x00")
    return Expectation(
        scenario=name,
        job_id="",
        job_dir=d,
        log=d / "log",
        platform="none",
        ray=False,
        status=None,
        primary_failure=None,
        expected_classes=frozenset(),
        first_step=None,
        last_step=None,
        total_steps=None,
        start=None,
        restored_from_step=None,
        checkpoint_period=None,
        last_checkpoint_step=None,
        tgs_degraded=False,
        tgs_pattern=None,
        head_node=None,
        prometheus_port=None,
        slurm_state=None,
        now=SIM_EPOCH + 600,
        notes="Shared checkpoint dir (outputs/<model>/), no 'log' link: a job walk must skip it.",
        is_job=False,
    )


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------

EXAMPLE_SCENARIOS: tuple[str, ...] = (
    "completed-ray0",
    "hanging",
    "heartbeat-after-stall",
    "oom-cascade",
    "completed-ray1-truncated",
    "tgs-constant-drop",
)


def build(name: str, outputs_root: Path, *, seed: int = 0) -> Expectation:
    """Write scenario `name` under outputs_root and return its ground truth."""
    try:
        fn = SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
    return fn(Path(outputs_root), seed)


def write_manifest(outputs_root: Path, exps: Sequence[Expectation]) -> Path:
    path = Path(outputs_root) / "manifest.json"
    doc = {
        "outputs_root": ".",
        "paths": "relative to the directory holding this manifest",
        "jobs": [e.to_dict(relative_to=Path(outputs_root)) for e in exps],
    }
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path


def build_all(outputs_root: Path, *, seed: int = 0, names: Sequence[str] | None = None) -> list[Expectation]:
    """Build every scenario (or `names`) under outputs_root and write manifest.json there."""
    exps = [build(n, outputs_root, seed=seed) for n in (names or list(SCENARIOS))]
    write_manifest(outputs_root, exps)
    return exps


def examples_dir() -> Path:
    """The sample jobs the `jobdiagd` package carries (package data: daemon/jobdiagd/examples/outputs)."""
    return Path(jobdiagd.__file__).resolve().parent / "examples" / "outputs"


def write_examples(dest: Path | None = None) -> list[Expectation]:
    """Regenerate the bundled demo corpus (a handful of representative jobs)."""
    out = dest or examples_dir()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return build_all(out, names=list(EXAMPLE_SCENARIOS))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobdiagd_sim.scenarios", description=__doc__)
    p.add_argument("outputs", nargs="?", type=Path, help="outputs root to write the corpus into")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", action="append", metavar="NAME", help="build only these scenarios (repeatable)")
    p.add_argument("--list", action="store_true", help="list scenario names and exit")
    p.add_argument(
        "--write-examples", action="store_true", help="regenerate daemon/jobdiagd/examples/outputs"
    )
    args = p.parse_args(argv)
    if args.list:
        for n in SCENARIOS:
            print(n)
        return 0
    if args.write_examples:
        exps = write_examples(args.outputs)
        print(f"wrote {len(exps)} example jobs to {args.outputs or examples_dir()}")
        return 0
    if args.outputs is None:
        p.error("outputs is required unless --list or --write-examples")
    exps = build_all(args.outputs, seed=args.seed, names=args.only)
    for e in exps:
        print(f"{e.scenario:28} {e.status or '-':14} {e.primary_failure or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
