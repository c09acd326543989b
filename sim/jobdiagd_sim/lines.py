"""Pure formatters for the exact line formats real MaxText/Slurm/Ray/JAX/NCCL job logs contain."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

# Both tput forms appear in real logs: `setaf`/`sgr0` from a terminfo with colours, bold from
# older job scripts. An empty TERM under sbatch makes tput print nothing at all.
TPUT_GREEN = "\x1b[32m"
TPUT_RED = "\x1b[31m"
TPUT_BOLD = "\x1b[1m"
TPUT_SGR0 = "\x1b(B\x1b[m"
TPUT_RESET = "\x1b[0m"

EM_DASH = "\u2014"


# --------------------------------------------------------------------------------------------
# Prefixes
# --------------------------------------------------------------------------------------------


def srun_width(ntasks: int) -> int:
    """Width `srun -l` pads task ids to: the number of digits of ntasks-1."""
    return len(str(max(ntasks - 1, 0)))


def srun_prefix(task: int, ntasks: int) -> str:
    """`srun -l` label: `"%*d: "` right-aligned to the width of ntasks-1."""
    return f"{task:>{srun_width(ntasks)}d}: "


def hetjob_prefix(component: int, task: int, ntasks: int) -> str:
    """`srun -l` label inside a heterogeneous job: `P0  3: `."""
    return f"P{component} {task:>{srun_width(ntasks)}d}: "


def utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


def absl_prefix(t: float, tid: int, where: str, level: str = "I") -> str:
    """absl/glog prefix `I0612 10:15:22.481234 139872 file.py:232] ` (no year, as in real logs)."""
    d = utc(t)
    return f"{level}{d:%m%d %H:%M:%S}.{d.microsecond:06d} {tid} {where}] "


def ray_prefix(pid: int, ip: str | None = None, actor: str = "MaxTextTrainerActor") -> str:
    """Ray driver forwarding prefix for an actor's output."""
    if ip:
        return f"({actor} pid={pid}, ip={ip}) "
    return f"({actor} pid={pid}) "


def nccl_ts_prefix(t: float) -> str:
    """NCCL >= 2.26 prefixes WARN lines with `[%F %T] `."""
    return f"[{utc(t):%Y-%m-%d %H:%M:%S}] "


def slurm_time(t: float) -> str:
    return f"{utc(t):%Y-%m-%dT%H:%M:%S}"


# --------------------------------------------------------------------------------------------
# Node lists
# --------------------------------------------------------------------------------------------

_HOST_RE = re.compile(r"^(.*?)(\d+)$")


def compact_nodelist(hosts: Sequence[str]) -> str:
    """Slurm compact host list: node001..node008 -> `node[001-008]`, gaps as `node[001-003,005]`."""
    if not hosts:
        return ""
    if len(hosts) == 1:
        return hosts[0]
    groups: dict[str, list[tuple[int, str]]] = {}
    order: list[str] = []
    for h in hosts:
        m = _HOST_RE.match(h)
        if not m:
            groups.setdefault(h, [])
            order.append(h)
            continue
        prefix, num = m.group(1), m.group(2)
        if prefix not in groups:
            order.append(prefix)
        groups.setdefault(prefix, []).append((int(num), num))
    parts: list[str] = []
    for prefix in order:
        nums = sorted(set(groups[prefix]))
        if not nums:
            parts.append(prefix)
            continue
        if len(nums) == 1:
            parts.append(prefix + nums[0][1])
            continue
        ranges: list[str] = []
        start = prev = nums[0]
        for cur in nums[1:]:
            if cur[0] == prev[0] + 1:
                prev = cur
                continue
            ranges.append(start[1] if start == prev else f"{start[1]}-{prev[1]}")
            start = prev = cur
        ranges.append(start[1] if start == prev else f"{start[1]}-{prev[1]}")
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)


def hostnames(n: int, first: int = 1, prefix: str = "node", width: int = 3) -> list[str]:
    return [f"{prefix}{i:0{width}d}" for i in range(first, first + n)]


def host_ip(host: str, subnet: str = "10.0.0") -> str:
    m = _HOST_RE.match(host)
    idx = int(m.group(2)) if m else 1
    return f"{subnet}.{idx % 250 + 1}"


# --------------------------------------------------------------------------------------------
# Header block
# --------------------------------------------------------------------------------------------


def job_name(model: str, tag: str | None = None) -> str:
    return f"JAX-{model}-{tag}" if tag else f"JAX-{model}"


def passthrough_args(args: Mapping[str, object]) -> str:
    """The PASSTHROUGH_ARGS header value, quoted the way `_job.sbatch` echoes it."""
    return " ".join(f"{k}={_argval(v)}" for k, v in args.items())


def _argval(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def header_lines(
    *,
    job_id: str,
    name: str,
    nnodes: int,
    nodelist: str,
    jax_port: int,
    ray_port: int | None,
    passthrough: Mapping[str, object],
    model: str,
    model_alias: str | None = None,
    exp_tag: str | None = None,
) -> list[str]:
    out = [
        f"JOB_ID={job_id}",
        f"JOB_NAME={name}",
        f"NNODES={nnodes}",
        f"JOB_NODELIST={nodelist}",
        f"JAX_COORDINATOR_PORT={jax_port}",
    ]
    if ray_port is not None:
        out.append(f"RAY_PORT={ray_port}")
    out.append(f'PASSTHROUGH_ARGS="{passthrough_args(passthrough)}"')
    out.append(f"MODEL_NAME={model}")
    if model_alias:
        out.append(f"MODEL_NAME_ALIAS={model_alias}")
    if exp_tag:
        out.append(f"EXP_TAG={exp_tag}")
    return out


def artifact_line(path: str) -> str:
    return f"[INFO] Running from artifact: {path}"


def git_summary_block(
    *, repo: str, branch: str, commit: str, subject: str, dirty: Sequence[str] = (), maxtext_commit: str = ""
) -> list[str]:
    out = [
        "=== GIT SUMMARY BEGIN ===",
        f"repo:    {repo}",
        f"branch:  {branch}",
        f"commit:  {commit}  {subject}",
    ]
    if dirty:
        out.append(f"dirty:   {len(dirty)} file(s)")
        out.extend(f"   M {p}" for p in dirty)
    else:
        out.append("dirty:   clean")
    if maxtext_commit:
        out.append(f"maxtext: {maxtext_commit}")
    out.append("=== GIT SUMMARY END ===")
    return out


DEFAULT_STAGE_TIMEOUTS: dict[str, int | None] = {"preflight": 900, "pull": 900, "ecc": 300, "train": None}


def stage_timeouts_block(timeouts: Mapping[str, int | None] = DEFAULT_STAGE_TIMEOUTS) -> list[str]:
    out = ['==STAGE TIMEOUTS (override: STAGE_TIMEOUTS="stage:seconds,...")==']
    for k, v in timeouts.items():
        out.append(f"  {k:<12} {'none' if v is None else f'{v}s'}")
    return out


def env_dump(env: Mapping[str, str]) -> list[str]:
    """`Show all environment variables:` then `printenv | sort` (byte order, like LC_ALL=C sort)."""
    return ["Show all environment variables:"] + [f"{k}={env[k]}" for k in sorted(env)]


def node_env(
    *,
    host: str,
    rank: int,
    job_id: str,
    name: str,
    nnodes: int,
    hosts: Sequence[str],
    jax_port: int,
    ray: bool,
    mem_fraction: str = ".85",
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A realistic per-node environment as `_train.sh` dumps it."""
    env = {
        "HOSTNAME": host,
        "HOME": "/root",
        "PATH": "/opt/rocm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PWD": "/workspace/maxtext",
        "SHLVL": "2",
        "LANG": "C.UTF-8",
        "JOB_ID": job_id,
        "JOB_NAME": name,
        "NNODES": str(nnodes),
        "NODE_RANK": str(rank),
        "JOB_NODELIST": compact_nodelist(hosts),
        "NODELIST_EXPANDED": ",".join(hosts),
        "JAX_COORDINATOR_IP": host_ip(hosts[0]),
        "JAX_COORDINATOR_PORT": str(jax_port),
        "XLA_PYTHON_CLIENT_MEM_FRACTION": mem_fraction,
        "XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_command_buffer=''"
        " --xla_gpu_graph_level=0 --xla_gpu_autotune_level=4",
        "NCCL_SOCKET_IFNAME": "ens50f0np0",
        "NCCL_IB_HCA": "bnxt_re0,bnxt_re1,bnxt_re2,bnxt_re3,bnxt_re4,bnxt_re5,bnxt_re6,bnxt_re7",
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_CROSS_NIC": "0",
        "NCCL_PROTO": "Simple",
        "NCCL_CHECKS_DISABLE": "1",
        "NCCL_DEBUG": "WARN",
        "NCCL_DMABUF_ENABLE": "1",
        "HSA_FORCE_FINE_GRAIN_PCIE": "1",
        "GPU_MAX_HW_QUEUES": "2",
        "HIP_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "TF_CPP_MIN_LOG_LEVEL": "0",
        "PYTHONUNBUFFERED": "1",
        "RAY": "1" if ray else "0",
        "OUTPUTS_BASE_DIR": "/outputs",
    }
    if extra:
        env.update(extra)
    return env


# --------------------------------------------------------------------------------------------
# Stage markers
# --------------------------------------------------------------------------------------------

STAGE_DESCRIPTIONS: dict[str, str] = {
    "preflight": "Preflight",
    "pull": "Docker pull",
    "ecc": "ECC check",
    "train": "Training",
}


def stage_begin(desc: str, timeout: int | None) -> str:
    return f"== {desc} BEGIN (timeout={'none' if timeout is None else f'{timeout}s'}) =="


def stage_end(desc: str, secs: int) -> str:
    return f"== {desc} END ({secs}s) =="


def stage_failed(desc: str, rc: int, secs: int) -> str:
    return f"== {desc} FAILED (exit={rc}, {secs}s) =="


def stage_timeout(desc: str, key: str, elapsed: int, timeout: int) -> list[str]:
    return [
        f"== {desc} TIMEOUT ({elapsed}s/{timeout}s) ==",
        f'  Hint: STAGE_TIMEOUTS="{key}:<seconds>" to adjust.',
    ]


def stage_failure_text(desc: str, rc: int) -> str:
    """The `_STAGE_FAILURE` text the JOB SUMMARY prints after the em dash."""
    return f"{desc} FAILED (exit={rc})"


def stage_timeout_text(desc: str, timeout: int) -> str:
    return f"{desc} TIMEOUT ({timeout}s)"


CANCELLED_TEXT = "CANCELLED (scancel / SIGTERM)"


# --------------------------------------------------------------------------------------------
# MaxText step lines
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepStyle:
    """Which documented variant of the `completed step:` line a job prints."""

    era: str = "current"  # "current" | "2023" (TFLOP/s:, no Tokens/total_weights)
    mfu_peak: float | None = None  # MFU wrapper inserts `, MFU: x%` after TFLOP/s/device
    lm_loss: bool = False  # 2026: `, lm_loss: …, perplexity: …` appended
    moe: bool = False  # `, moe_lb_loss: …` appended
    live_slices: int | None = None  # elastic: `live slice count: N` after seconds
    first_loss_no_colon: bool = False  # the very first step prints `loss 10.4`


@dataclass(frozen=True)
class StepFields:
    step: int
    seconds: float
    tflops: float
    tokens: float
    total_weights: int
    loss: float
    moe_lb_loss: float = 0.0
    rampup: bool = False


def step_line(f: StepFields, style: StepStyle = StepStyle(), *, first: bool = False) -> str:
    parts = [f"completed step: {f.step}", f"seconds: {f.seconds:.3f}"]
    if style.live_slices is not None:
        parts.append(f"live slice count: {style.live_slices}")
    if style.era == "2023":
        parts.append(f"TFLOP/s: {f.tflops:.3f}")
    else:
        if not f.rampup:
            parts.append(f"TFLOP/s/device: {f.tflops:.3f}")
            if style.mfu_peak:
                parts.append(f"MFU: {f.tflops / style.mfu_peak * 100.0:.2f}%")
        parts.append(f"Tokens/s/device: {f.tokens:.3f}")
        parts.append(f"total_weights: {f.total_weights}")
    if first and style.first_loss_no_colon:
        parts.append(f"loss {f.loss:.1f}")
    else:
        parts.append(f"loss: {f.loss:.3f}")
    if style.lm_loss and style.era != "2023":
        lm = max(f.loss - f.moe_lb_loss, 0.0)
        parts.append(f"lm_loss: {lm:.3f}")
        parts.append(f"perplexity: {_perplexity(lm):.3f}")
    if style.moe and style.era != "2023":
        parts.append(f"moe_lb_loss: {f.moe_lb_loss:.5f}")
    text = ", ".join(parts)
    if f.rampup:
        text = "[Rampup Batch Size Phase], " + text
    return text


def _perplexity(loss: float) -> float:
    import math

    return math.exp(min(loss, 30.0))


def profiler_line(step: int, activation: bool = True) -> str:
    return f"completed profiler {'activation' if activation else 'deactivation'} step: {step}"


# --------------------------------------------------------------------------------------------
# Config, restore, checkpoint, barrier
# --------------------------------------------------------------------------------------------


def config_param(key: str, value: object) -> str:
    return f"Config param {key}: {_argval(value)}"


NO_CHECKPOINT = "No existing checkpoints found, not restoring checkpoint."


def restore_line(step: int, *, spaced: bool = False) -> str:
    if spaced:
        return f"restoring from this run's directory latest step           {step}"
    return f"restoring from this run's directory step {step}"


def checkpoint_saved(step: int, form: str = "new") -> str:
    """form: "new" (since 2024-12), "old" (lowercase, no period), "async" (start of an async save)."""
    if form == "old":
        return f"saved a checkpoint at step {step}"
    if form == "async":
        return f"Started an asynchronous checkpoint save for step {step}"
    return f"Saved a checkpoint at step {step}."


def orbax_finalized(process: int, directory: str, step: int) -> str:
    return (
        f"[process={process}][thread=async_save] Finished saving checkpoint (finalized tmp dir) "
        f"to `{directory}/{step}`."
    )


def checkpoint_failed(path: str) -> str:
    return f"Training stopped: Checkpointing failed. [Errno 2] No such file or directory: '{path}'"


BARRIER_BEGIN = "====== BARRIER: Synchronizing hosts before training loop ======"
BARRIER_PASSED = "====== BARRIER PASSED: Starting training loop ======"


# --------------------------------------------------------------------------------------------
# JAX coordination service, XLA, NCCL
# --------------------------------------------------------------------------------------------


def heartbeat_block(t: float, tid: int, dead_tasks: Sequence[int], *, old_ending: bool = False) -> list[str]:
    """The coordination-service fatal error; every line gets its own srun prefix from the caller."""
    e = absl_prefix(t, tid, "coordination_service_agent.cc:332", "E")
    f = absl_prefix(t + 0.000185, tid, "client.h:77", "F")
    out = [
        e + "Polled an error from coordination service (this can be an error from this or another task).",
        f + "Terminating process because the JAX distributed service detected fatal errors. This most "
        "likely indicates that another task died; see the other task logs for more details. Disable "
        "Python buffering, i.e. `python -u`, to be sure to see all the previous output. absl::Status: "
        "UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):",
    ]
    out.extend(f"/job:jax_worker/replica:0/task:{d}" for d in dead_tasks)
    if old_ending:
        out.append("The tasks have crashed. Check the task logs for an earlier error to debug further.")
    else:
        out.append(
            "The tasks have crashed. Check the task logs for an earlier error, or scheduler events "
            "(e.g. preemption, eviction) to debug further."
        )
    return out


def xla_oom(nbytes: int, *, old: bool = True, gib: bool = False) -> str:
    exc = "jaxlib.xla_extension.XlaRuntimeError" if old else "jax.errors.JaxRuntimeError"
    if gib:
        return f"{exc}: RESOURCE_EXHAUSTED: Out of memory while trying to allocate {nbytes / 2**30:.2f}GiB."
    return f"{exc}: RESOURCE_EXHAUSTED: Out of memory while trying to allocate {nbytes} bytes."


def bfc_oom(t: float, tid: int, gpu: int, size_gib: float) -> str:
    return absl_prefix(t, tid, "bfc_allocator.cc:479", "W") + (
        f"Allocator (GPU_{gpu}_bfc) ran out of memory trying to allocate {size_gib:.2f}GiB "
        "(rounded to 4831838208)requested by op "
    )


def traceback_block(frames: Sequence[tuple[str, int, str, str]], final: str) -> list[str]:
    """`Traceback (most recent call last):` + frames (file, line, func, code) + the exception line."""
    out = ["Traceback (most recent call last):"]
    for file, line, func, code in frames:
        out.append(f'  File "{file}", line {line}, in {func}')
        out.append(f"    {code}")
    out.append(final)
    return out


TRAIN_FRAMES: tuple[tuple[str, int, str, str], ...] = (
    ("/workspace/maxtext-slurm/utils/mfu_tracker.py", 512, "<module>", "main(sys.argv[1:])"),
    ("/workspace/maxtext/MaxText/train.py", 1107, "main", "train_loop(config)"),
    (
        "/workspace/maxtext/MaxText/train.py",
        986,
        "train_loop",
        "state, metrics = p_train_step(state, example_batch, nextrng)",
    ),
)

COMPILE_FRAMES: tuple[tuple[str, int, str, str], ...] = (
    ("/workspace/maxtext-slurm/utils/mfu_tracker.py", 512, "<module>", "main(sys.argv[1:])"),
    ("/workspace/maxtext/MaxText/train.py", 1107, "main", "train_loop(config)"),
    (
        "/workspace/maxtext/MaxText/train.py",
        941,
        "train_loop",
        "p_train_step = p_train_step.lower(state, example_batch, nextrng).compile()",
    ),
    (
        "/usr/local/lib/python3.10/dist-packages/jax/_src/stages.py",
        638,
        "compile",
        "self._executable = self._lowering.compile(**kw)",
    ),
)


def nccl_warn(
    host: str, pid: int, tid: int, dev: int, where: str, msg: str, *, ts: float | None = None
) -> list[str]:
    """A WARN as NCCL/RCCL prints it: a blank line, then the message (>=2.26: with a timestamp)."""
    prefix = nccl_ts_prefix(ts) if ts is not None else ""
    return ["", f"{prefix}{host}:{pid}:{tid} [{dev}] {where} NCCL WARN {msg}"]


def nccl_info(host: str, pid: int, tid: int, dev: int, msg: str) -> str:
    return f"{host}:{pid}:{tid} [{dev}] NCCL INFO {msg}"


NCCL_SYSTEM_ERROR = "unhandled system error (run with NCCL_DEBUG=INFO for details)"


def nccl_nic_fatal(host: str) -> str:
    return f"NCCL FATAL {host}: Failed to auto-detect NCCL_SOCKET_IFNAME; ABORTING..."


# --------------------------------------------------------------------------------------------
# Job summary, node exit, Slurm
# --------------------------------------------------------------------------------------------


def fmt_wall(seconds: int) -> str:
    s = max(int(seconds), 0)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60}m {s % 60}s"
    if s >= 60:
        return f"{s // 60}m {s % 60}s"
    return f"{s}s"


def job_summary(
    *,
    job_id: str,
    name: str,
    model: str,
    nnodes: int,
    wall: int,
    rc: int,
    failure: str | None = None,
    color: str = "none",
) -> list[str]:
    """color: "none" (no TERM under sbatch), "setaf" (tput setaf 2/1 … sgr0), "bold" (older scripts)."""
    if rc == 0:
        text = "SUCCESS (exit 0)"
        on = TPUT_GREEN
    else:
        text = f"FAILED (exit {rc}) {EM_DASH} {failure or 'unknown'}"
        on = TPUT_RED
    if color == "setaf":
        text = f"{on}{text}{TPUT_SGR0}"
    elif color == "bold":
        text = f"{TPUT_BOLD}{text}{TPUT_RESET}"
    return [
        "========================== JOB SUMMARY ==========================",
        f"  Job:    {job_id} ({name})",
        f"  Model:  {model}",
        f"  Nodes:  {nnodes}",
        f"  Wall:   {fmt_wall(wall)}",
        f"  Status: {text}",
        "=================================================================",
    ]


def node_exit(host: str, rc: int) -> str:
    return f"NODE_EXIT host={host} exit={rc}"


def srun_task_exit(host: str, tasks: str, rc: int) -> str:
    """`tasks` is `5` or a range such as `0-7` (srun says `task`/`tasks` accordingly)."""
    word = "tasks" if ("-" in tasks or "," in tasks) else "task"
    return f"srun: error: {host}: {word} {tasks}: Exited with exit code {rc}"


def srun_task_killed(host: str, tasks: str) -> str:
    word = "tasks" if ("-" in tasks or "," in tasks) else "task"
    return f"srun: error: {host}: {word} {tasks}: Killed"


def srun_task_oom(host: str, tasks: str) -> str:
    word = "tasks" if ("-" in tasks or "," in tasks) else "task"
    return f"srun: error: {host}: {word} {tasks}: Out Of Memory"


def srun_terminating(step_id: str, *, old: bool = False) -> str:
    """Slurm >= 20.11 logs `Terminating StepId=…`; older builds said `Terminating job step …`."""
    if old:
        return f"srun: Terminating job step {step_id}"
    return f"srun: Terminating StepId={step_id}"


def srun_job_step_aborted(wait: int = 32) -> str:
    return f"srun: Job step aborted: Waiting up to {wait} seconds for job step to finish."


def srun_step_signal(step_id: str) -> str:
    return f"srun: launch/slurm: _step_signal: Terminating StepId={step_id}"


def slurmstepd_cancelled(
    job_id: str,
    host: str,
    t: float,
    *,
    reason: str = "scancel",
    slurm: str = "22.05",
    step: str | None = None,
    dashed: bool = False,
) -> str:
    """reason: "scancel" or "time"; slurm >= 25.05 names the signal for scancel."""
    who = f"slurmstepd-{host}" if dashed else "slurmstepd"
    what = f"STEP {job_id}.{step}" if step is not None else f"JOB {job_id}"
    tail = ""
    if reason == "time":
        tail = " DUE TO TIME LIMIT"
    elif slurm >= "25.05":
        tail = " DUE to SIGNAL Terminated"
    return f"{who}: error: *** {what} ON {host} CANCELLED AT {slurm_time(t)}{tail} ***"


def slurmstepd_oom(step_id: str, *, slurm: str = "23.02", host: str | None = None) -> str:
    who = f"slurmstepd-{host}" if host else "slurmstepd"
    if slurm == "22.05":
        return (
            f"{who}: error: Detected 1 oom-kill event(s) in StepId={step_id}. Some of your processes may "
            "have been killed by the cgroup out-of-memory handler."
        )
    return f"{who}: error: Detected 1 oom_kill event in StepId={step_id}. Some of the step tasks have been OOM Killed."


def kernel_oom(pid: int, total_vm_kb: int, anon_rss_kb: int) -> str:
    return (
        f"Memory cgroup out of memory: Killed process {pid} (python3) total-vm:{total_vm_kb}kB, "
        f"anon-rss:{anon_rss_kb}kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:{anon_rss_kb // 512}kB "
        "oom_score_adj:0"
    )


def shell_killed(job_id: str, line: int, pid: int, cmd: str) -> str:
    return f"/var/spool/slurmd/job{job_id}/slurm_script: line {line}: {pid} Killed                  {cmd}"


# --------------------------------------------------------------------------------------------
# Ray, Prometheus, tunnel
# --------------------------------------------------------------------------------------------


def ray_head_start(host: str, port: int, ip: str) -> str:
    return f"[Ray] Starting HEAD on {host}:{port} (bind={ip})"


def ray_worker_start(head_ip: str, port: int, ip: str) -> str:
    return f"[Ray] Starting WORKER -> {head_ip}:{port} (bind={ip})"


def ray_worker_retry(i: int) -> str:
    return f"[Ray] Retry {i}/18..."


def ray_session(t: float) -> str:
    d = utc(t)
    return f"/tmp/ray/session_{d:%Y-%m-%d_%H-%M-%S}_{d.microsecond:06d}_{int(t) % 9000 + 1000}"


def ray_logs_line(job_dir: str, host: str, session: str) -> str:
    return f"[Ray] Logs -> /outputs/{job_dir}/ray_logs/{host} (persistent, symlinked from {session}/logs)"


def ray_head_failed(port: int, ip: str) -> str:
    return f"[Ray] HEAD failed to start (port {port}, dashboard 8265, bind {ip})"


RAY_HEAD_TIMEOUT = "[Ray] HEAD timeout"
RAY_WORKER_FAILED = "[Ray] WORKER failed"
RAY_FALLBACK = "[!] Ray cluster failed, falling back to non-Ray mode"


def metrics_exporter_started(job_dir: str, host: str) -> str:
    return f"[Metrics Exporter] Started on port 9400 on {host} (log: /outputs/{job_dir}/metrics_exporter/{host}.log)"


def tensorboard_started(model: str) -> str:
    return f"[TensorBoard] Started on port 6006 (logdir: /outputs/{model})"


def prometheus_lines(
    hosts: Sequence[str], job_dir: str, base_port: int, port: int, *, pid: int | None = None
) -> list[str]:
    """`start_prometheus` output, auto-incrementing past occupied ports; `pid` gives the older form."""
    out: list[str] = []
    for p in range(base_port, port):
        out.append(f"[Prometheus] Port {p} occupied, trying {p + 1}...")
    if port != base_port:
        out.append(f"[Prometheus] WARNING: port {base_port} was occupied; using {port} instead")
    ray = ", ".join(f"'{h}:55080'" for h in hosts)
    hw = ", ".join(f"'{h}:9400'" for h in hosts)
    pid_part = f"pid {pid}; " if pid is not None else ""
    out.append(f"[Prometheus] Started on port {port} ({pid_part}ray: {ray}; node_hw: {hw})")
    out.append(f"[Prometheus] TSDB -> /outputs/{job_dir}/prometheus (persistent)")
    if pid is None:
        out.append(f"[Prometheus] Log  -> /outputs/{job_dir}/prometheus.log")
    return out


def tunnel_lines(login_host: str, login_ip: str, head: str, prom_port: int) -> list[str]:
    """`print_ray_info`: the ProxyJump tunnel commands (by login hostname and by IP) and the URLs."""
    fwd = f"-L 8265:localhost:8265 -L 6006:localhost:6006 -L {prom_port}:localhost:{prom_port}"
    pad = " " * max(len(login_host) - len(login_ip), 0)
    return [
        "==============================================",
        "SSH tunnel from your local machine (Ray dashboard is bound to the head's",
        "localhost for security; use ProxyJump through the login node):",
        f"  ssh -J {login_host} {fwd} root@{head}",
        f"  ssh -J {login_ip}{pad} {fwd} root@{head}",
        "",
        "Then open in your browser:",
        "  Ray Dashboard:  http://localhost:8265",
        "  TensorBoard:    http://localhost:6006",
        f"  Prometheus:     http://localhost:{prom_port}",
        "",
        "Ray logs are persisted per node under:",
        "  <JOB_WORKSPACE>/<job>/ray_logs/<hostname>/session_*/logs/",
        "==============================================",
    ]


def actor_launch(rank: int, host: str) -> str:
    return f"[Node {rank} @ {host}] Launching training subprocess: /usr/bin/python3 -u /workspace/maxtext-slurm/utils/mfu_tracker.py ..."


def actor_started(rank: int, host: str, pid: int) -> str:
    return f"[Node {rank} @ {host}] Training subprocess started (pid={pid})"


def actor_killed(rank: int, host: str, signame: str, signum: int) -> str:
    return f"[Node {rank} @ {host}] Training subprocess killed by {signame} (signal {signum})"


def actor_exited(rank: int, host: str, rc: int) -> str:
    return f"[Node {rank} @ {host}] Training subprocess exited with code {rc}"


def actor_failed(rank: int, exc: str) -> str:
    return f"[Node {rank}] Actor failed: {exc}"


ACTOR_DIED = (
    "The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: MaxTextTrainerActor\n"
    "\tactor_id: 5ed1d1a4c6e5b0c2a6f7e8d901000000\n"
    "\tpid: {pid}\n"
    "\tname: maxtext_trainer_{rank}\n"
    "\tnamespace: maxtext\n"
    "\tip: {ip}\n"
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
    "detail: Worker unexpectedly exits with a connection error code 2. End of file. There are some "
    "potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage. "
    "(2) ray stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other "
    "unexpected errors."
)


GPU_PEAK_BF16: dict[float, str] = {2500.0: "MI355X", 1307.0: "MI300X", 989.0: "H100"}


def mfu_enabled(peak: float) -> str:
    gpu = GPU_PEAK_BF16.get(peak, "manual")
    src = "auto" if gpu != "manual" else "env"
    return f"[MFU] MFU tracking enabled (gpu={gpu}, dtype=bf16, peak={peak:.0f} TFLOP/s, source={src})"


# --------------------------------------------------------------------------------------------
# Container / job-script errors
# --------------------------------------------------------------------------------------------


def pull_failed(image: str, authenticated: bool = False) -> str:
    return f"[ERROR] {'Authenticated pull' if authenticated else 'Pull'} failed for {image}."


def login_failed(registry: str) -> str:
    return f"[ERROR] Login to {registry} failed. Check REGISTRY_USER / REGISTRY_TOKEN in container_env.sh."


LOAD_FAILED = "[ERROR] Unable to determine image name or ID from docker load output."
NO_GPU = "WARNING: No GPU devices detected"
PORT_FAIL_JAX = "FATAL: Could not find a free port for JAX coordinator"
PORT_FAIL_RAY = "FATAL: Could not find a free port for Ray"


def unknown_model(model: str) -> str:
    return f"!!! Unknown model: {model} (no configs/{model}.gpu.yml)"


def checkout_failed(branch: str) -> str:
    return f"[FAIL] Failed to check out {branch}"


# --------------------------------------------------------------------------------------------
# Noise: lines healthy jobs print, including every known-harmless pattern (rule HL-1)
# --------------------------------------------------------------------------------------------

# Lines containing a byte that is not valid UTF-8 are built with surrogate escapes and written
# with errors="surrogateescape", so the raw byte lands in the file.
NON_UTF8 = "\udcff\udcfe"


# Indices into harmless_lines() of the groups printed by the host-level job scripts / Docker
# (preflight cleanup, container teardown) rather than by the training process.
HOST_LEVEL_HARMLESS: tuple[int, ...] = (4, 5, 11)


def harmless_process_lines(t: float, tid: int, host: str, rng: random.Random) -> list[list[str]]:
    """The harmless groups the training process itself prints (any time during a run)."""
    groups = harmless_lines(t, tid, host, rng)
    return [g for i, g in enumerate(groups) if i not in HOST_LEVEL_HARMLESS]


def harmless_lines(t: float, tid: int, host: str, rng: random.Random) -> list[list[str]]:
    """Every known-harmless pattern (rule HL-1), each as one group of consecutive lines."""
    core = rng.randint(96, 191)
    cid = "".join(rng.choice("0123456789abcdef") for _ in range(12))
    return [
        [
            absl_prefix(t, tid, "cuda_driver.cc:152", "E") + "Failed call to cuInit: UNKNOWN ERROR (303)",
            "An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib is not installed. Falling back to cpu.",
        ],
        [
            absl_prefix(t, tid, "xla_bridge.py:907", "I")
            + "Unable to initialize backend 'cuda': INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)"
            " (you may need to uninstall the failing plugin package, or set JAX_PLATFORMS=cpu to skip this backend.)"
        ],
        [
            f"{host}:{tid % 100000}:{tid % 100000} [0] NCCL WARN MSCCL++: Feature not enabled. ENABLE_MSCCLPP must be "
            "defined at compile-time to enable this feature."
        ],
        [
            "Token indices sequence length is longer than the specified maximum sequence length for this model "
            "(131072 > 8192). Running this sequence through the model will result in indexing errors"
        ],
        [
            'OCI runtime exec failed: exec failed: unable to start container process: exec: "pkill": executable '
            "file not found in $PATH: unknown",
            f"[exec] docker exec failed for {cid}, falling back to host-level kill",
            "[cgroup] Sent SIGKILL to 0/0 processes",
        ],
        [
            "OCI runtime exec failed: exec failed: unable to start container process: error executing setns "
            "process: exit status 1: unknown"
        ],
        [absl_prefix(t, tid, "topology.cc:1011", "W") + f"Cannot read CPU core {core}"],
        [
            absl_prefix(t, tid, "tpu_initializer_helper.cc:127", "I")
            + "No hardware is found. Using default TPU version: jellyfish"
        ],
        [absl_prefix(t, tid, "trace.cc:59", "I") + "No device identifiers found"],
        [absl_prefix(t, tid, "pjrt_api.cc:79", "I") + "Enabling PjRt/TPU event dependency logging"],
        [absl_prefix(t, tid, "init-domain.cc:63", "I") + "Fiber init: default domain = futex"],
        [
            f'Error response from daemon: cannot remove container "/maxtext_{cid}": could not kill container: '
            "tried to kill container, but did not receive an exit event"
        ],
    ]


def generic_noise(t: float, tid: int, host: str, rank: int, rng: random.Random) -> list[list[str]]:
    """Healthy chatter: NCCL INFO, XLA autotune, Python warnings, ANSI colour, odd bytes."""
    dev = rng.randrange(8)
    pid = 80000 + rank * 131 + tid % 97
    chan = rng.randrange(32)
    return [
        [
            nccl_info(
                host,
                pid,
                pid + 268,
                dev,
                f"Channel {chan:02d}/0 : {dev}[{dev}] -> {(dev + 1) % 8}[{(dev + 1) % 8}] via P2P/IPC/read",
            )
        ],
        [
            nccl_info(
                host,
                pid,
                pid + 268,
                dev,
                "NET/IB : Using [0]bnxt_re0:1/RoCE [1]bnxt_re1:1/RoCE [2]bnxt_re2:1/RoCE ; OOB ens50f0np0:10.0.0.1<0>",
            )
        ],
        [
            nccl_info(
                host,
                pid,
                pid + 268,
                dev,
                f"comm 0x{rng.getrandbits(40):x} rank {rank * 8 + dev} nRanks 64 nNodes 8 localRanks 8 localRank {dev} MNNVL 0",
            )
        ],
        [
            absl_prefix(t, tid, "gemm_algorithm_picker.cc:459", "I")
            + f"Autotuning gemm fusion {rng.randrange(10, 999)}: selected algorithm {rng.randrange(0, 60)} in {rng.uniform(0.1, 3):.2f} ms"
        ],
        [
            absl_prefix(t, tid, "autotuner_util.cc:322", "I")
            + "Autotune results loaded from cache: 1412 entries"
        ],
        [
            absl_prefix(t, tid, "gpu_hlo_schedule.cc:728", "W")
            + "Latency hiding scheduler: estimated peak memory usage 142.71GiB"
        ],
        [
            absl_prefix(t, tid, "rocm_executor.cc:920", "I")
            + "successful NUMA node read from SysFS had negative value (-1), but there must be at least one NUMA node, so returning NUMA node zero"
        ],
        [
            "/usr/local/lib/python3.10/dist-packages/orbax/checkpoint/type_handlers.py:1415: UserWarning: Couldn't find sharding info under RestoreArgs. Populating sharding info from sharding file. Please note restoration time will be slightly increased due to reading from file."
        ],
        ["  warnings.warn("],
        [
            f"\x1b[33mWARNING\x1b[0m: tensorboard data loader is slow ({rng.uniform(1, 9):.1f}s); consider prefetch"
        ],
        [f"\x1b[36m[metrics_exporter]\x1b[0m host={host} gpus=8 scraped in {rng.randrange(40, 400)}ms"],
        [f"[tb_metrics_plugin] staleness fill emitted (step unchanged) \x1b[2m{NON_UTF8}\x1b[0m"],
        [f"rocm-smi: card{dev} junction temp {rng.randrange(45, 85)}C {NON_UTF8[0]}"],
        [absl_prefix(t, tid, "pjit.py:1104", "I") + "Compiling jit(train_step) with global shapes and types"],
    ]


def ray_buffered_noise(
    t: float, host: str, ip: str, rng: random.Random, head: bool, actor_pid: int | None = None
) -> list[str]:
    """Ray's own C++/dedup chatter that reaches the driver's stdout (keeps log mtime fresh)."""
    d = utc(t)
    ts = f"{d:%Y-%m-%d %H:%M:%S},{d.microsecond // 1000:03d}"
    who = "(raylet)" if head else f"(raylet, ip={ip})"
    pid = rng.randrange(2000, 9000)
    choices = [
        f"{who} [{ts} I {pid} {pid}] (raylet) node_manager.cc:525: [state-dump] NodeManager: [state-dump] Node ID: {rng.getrandbits(64):016x}",
        f"{who} [{ts} W {pid} {pid + 41}] (raylet) metric_exporter.cc:105: [1] Export metrics to agent failed: RpcError: RPC Error message: failed to connect to all addresses; RPC Error details:  This won't affect Ray, but you can lose metrics from the cluster.",
        f"{who} [{ts} I {pid} {pid}] (raylet) local_object_manager.cc:245: :info_message:Spilled 0 MiB, 0 objects, write throughput 0 MiB/s.",
        f"(MaxTextTrainerActor pid={actor_pid or pid}) [repeated {rng.randrange(2, 8)}x across cluster] (Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or see https://docs.ray.io/en/master/ray-observability/user-guides/configure-logging.html#log-deduplication for more options.)",
        f"(autoscaler +{rng.randrange(10, 99)}m{rng.randrange(0, 59)}s) Tip: use `ray status` to view detailed cluster status. To disable these messages, set RAY_SCHEDULER_EVENTS=0.",
    ]
    return [rng.choice(choices)]


def pending_event_logger(t: float, tid: int, secs: int) -> str:
    """(R) PjRt's pending-event logger complaining while a rank stalls at teardown."""
    return absl_prefix(t, tid, "pending_event_logger.cc:88", "W") + (
        f"pending_event_logger: 1 event(s) still pending after {secs}s: "
        "PjRtStreamExecutorBuffer::BlockHostUntilReady (device 0)"
    )
