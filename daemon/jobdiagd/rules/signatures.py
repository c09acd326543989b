"""Failure-signature and known-harmless tables as wording families (data; docs/rules.md §3-4).

The signature strings of job-log-triage are examples of families, not the only wordings. Each class
row here is a small set of `Family` patterns written from the wording the projects print
(their format strings and real bug reports: XLA's `NCCL operation %s failed: %s`, NCCL's
ncclGetErrorString texts, TensorStore's `Failed to acquire lock on file ... [OS error: ...]`,
Ray's memory monitor, LLVM's `LLVM ERROR: %s`, slurmstepd's `*** %s ON %s CANCELLED AT %s
DUE TO TIME LIMIT ***`, ...). Every family carries a short `rule` id and the job-log-triage row it
implements (`ref`); reports and evidence name the rule that matched.

A family matches a (prefix-stripped) line when one of its `needles` occurs in it and, if
given, its `regex` also matches. Needles double as the fast pre-filter of the log reader
(`jobdiagd.logs.scan`), so a family must never rely on a regex alone, and a needle must be
rare in healthy logs (every occurrence costs a callback on multi-GB logs).

Decisions (rules MATCH-1, MATCH-2, HL-1, HL-2, CL-HANG; docs/rules.md):
- A line matches at most one family per class: the first in the class's order. The order
  puts specific wordings before generic ones (an NCCL error string before "NCCL WARN"), so
  the description of the match is the most specific one (`Family.description`: a non-timeout
  NCCL error is never described as a "collective timeout").
- `fallback` families (a Python exception line) count only when no other class matches the
  line: an exception that names a specific failure (OOM, NCCL, checkpoint) belongs to it.
- `after_traceback` families count only right after a `Traceback` header of the same task, or,
  the header lost to interleaved multi-rank output, right after a `File "...", line N, in f`
  frame of that task (rule PY-LOST-HEADER): the exception line that ends a traceback, not any
  line that looks like one.
- `startup_only` families count only before training started (`jax.distributed.initialize` and
  the start-up barriers, rule CL-INIT); `before_first_step` ones only before any step completed
  (the train step compiles and autotunes then: an absl CHECK abort is the compiler's, rule XC-check-compile-phase).
- Evidence-only rows (`EVIDENCE_SIGNATURES`, e.g. XLA's rendezvous "may be stuck" watchdog)
  never make a class of their own: they are quoted when the primary failure they describe
  (hang) is decided from progress.
- Harmless families are checked after the signatures: a line that matches one is never
  evidence (runbook: "Do not classify them as failures"), whatever else it matches.

Rows are in the class table's priority order (rule MATCH-4); `classify` decides the primary failure from them
(with the cascade rules documented there), the order here is the tie-breaker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from jobdiagd.model.kinds import FailureClass

SRC_INFRA = "job-log-triage.md § Failure classification table › Infrastructure failures"
SRC_STAGE = "job-log-triage.md § Failure classification table › Stage timeouts"
SRC_TRAIN = "job-log-triage.md § Failure classification table › Training failures"
SRC_JOB = "job-log-triage.md § Failure classification table › Job-level status"
SRC_HANG = "job-log-triage.md § Hang diagnosis"
SRC_HARMLESS = "job-log-triage.md § Known-harmless log entries"


class Tier(Enum):
    """How a class takes part in choosing the primary failure (see classify.py)."""

    INFRA = "infrastructure"  # before training: the job never trained
    ROOT = "root"  # a specific root cause
    SYMPTOM = "symptom"  # specific, but usually downstream of another root cause
    CARRIER = "carrier"  # the mechanism that ended the job (traceback, exit code)
    ADVISORY = "advisory"  # reported, never primary (e.g. Ray falls back to non-Ray)
    EVIDENCE = "evidence"  # never a class of its own: quoted for a derived primary (hang)


@dataclass(frozen=True, slots=True)
class Family:
    """One wording family of a class."""

    rule: str  # short id, unique over the tables (reports and evidence name it)
    ref: str  # the job-log-triage row (or source wording) it implements
    needles: tuple[str, ...]
    regex: re.Pattern[str] | None = None
    description: str = ""  # what happened, when it differs from the class's description
    training_only: bool = False  # only once training started (barrier passed or a step done)
    startup_only: bool = False  # only before training started (jax.distributed start-up, barriers)
    before_first_step: bool = False  # only before any step completed (compilation, autotuning)
    fallback: bool = False  # only when no other class matches the line
    after_traceback: bool = False  # only right after a Traceback header of the same task

    def matches(self, text: str) -> bool:
        if not any(n in text for n in self.needles):
            return False
        return self.regex is None or self.regex.search(text) is not None


@dataclass(frozen=True, slots=True)
class Signature:
    cls: str
    source: str
    tier: Tier
    families: tuple[Family, ...]
    description: str = ""
    stage: str = ""

    @property
    def needles(self) -> tuple[str, ...]:
        return tuple(n for f in self.families for n in f.needles)

    def family(
        self,
        text: str,
        *,
        training_started: bool = True,
        after_traceback: bool = False,
        first_step_done: bool = True,
    ) -> Family | None:
        """The first family of this class that matches the line, or None."""
        for fam in self.families:
            if (fam.training_only and not training_started) or (fam.startup_only and training_started):
                continue
            if fam.before_first_step and first_step_done:
                continue
            if fam.after_traceback and not after_traceback:
                continue
            if fam.matches(text):
                return fam
        return None

    def matches(self, text: str) -> bool:
        return self.family(text) is not None


@dataclass(frozen=True, slots=True)
class Match:
    """A line's match: the class row and the family (wording) that matched."""

    sig: Signature
    family: Family

    @property
    def cls(self) -> str:
        return self.sig.cls

    @property
    def rule(self) -> str:
        return self.family.rule


def _rx(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


# Barrier ids of checkpoint saves (Orbax: `0_async_write_complete.0.1`, `async_commit_complete`,
# `CheckpointManager:save`, `create_tmp_directory:post`): a timeout there is the checkpoint's.
_CKPT_BARRIER = (
    r"(?:async_(?:write|commit|save)|[Cc]heckpoint|ckpt|[Ss]ave|[Ff]inaliz|[Cc]ommit|orbax|ocdbt|tmp_dir)"
)
# XLA compiler source files whose CHECK failures are compile failures (passes, emitters,
# autotuners, partitioners, assignment and layout), matched in the `<file>.cc:<line>]` of an
# absl line that kept its prefix.
_XLA_COMPILER_FILES = (
    r"autotun|compiler|partition|emitter|fusion|_pass|pipeline|layout_assignment|buffer_assignment"
    r"|hlo_|_rewriter|simplifier|algorithm_picker|triton|tiling|spmd|sharding_propagation"
    r"|shape_inference|nvptx|amdgpu|llvm|lowering|indexing_map|dot_|gemm_"
)


def _one(
    cls: str,
    rule: str,
    source: str,
    tier: Tier,
    needles: tuple[str, ...],
    description: str,
    stage: str,
    regex: re.Pattern[str] | None = None,
) -> Signature:
    """A class whose only family is its job-log-triage row's own literal(s)."""
    return Signature(
        cls, source, tier, (Family(rule, f"runbook {cls} row", needles, regex),), description, stage
    )


# ------------------------------------------------------------------------------------------------
# Descriptions of what happened, per wording (report "What happened", alert "what it means").
# ------------------------------------------------------------------------------------------------
NCCL_TIMEOUT_DESC = "NCCL/RCCL collective timeout — network or GPU issue"
NCCL_ERROR_DESC = "NCCL/RCCL error (an NCCL call failed; not a timeout) — network, GPU or library issue"
NCCL_WARN_DESC = (
    "NCCL/RCCL communication failure (NCCL WARN: connection or transport error) — network or GPU issue"
)
NCCL_FAILED_OR_TIMED_OUT_DESC = "NCCL/RCCL operations failed or timed out — network or GPU issue"
JAX_INIT_DESC = (
    "JAX distributed initialization timed out at start-up: not every task joined the coordination service "
    "(a task crashed or never started, or cannot reach the coordinator) — read the output of the tasks named"
)
SLURM_NODE_FAILURE_DESC = (
    "Slurm reports a node of the job failed (hardware, kernel or slurmd down); the step was torn down with it"
)
ASYNC_CKPT_TIMEOUT_DESC = (
    "Checkpoint save timed out: the asynchronous write to checkpoint storage did not finish in time "
    "(slow or stalled NFS/object storage) — the checkpoint may be incomplete"
)
XLA_AUTOTUNE_LAUNCH_DESC = (
    "XLA/GPU compiler failure: the GPU autotuner could not launch its benchmark kernels during compilation"
)

SIGNATURES: tuple[Signature, ...] = (
    # --- Infrastructure failures (before training starts) -------------------------------
    _one(
        "prolog-kill-no-log",
        "INF-prolog",
        SRC_INFRA,
        Tier.INFRA,
        ("died in prolog before writing any log",),
        "slurmd killed the job before the batch script could run",
        "Slurm prolog",
    ),
    _one(
        "container-pull-fail",
        "INF-pull",
        SRC_INFRA,
        Tier.INFRA,
        ("[ERROR] Pull failed for", "[ERROR] Authenticated pull failed", "[ERROR] Login to"),
        "Image pull or registry auth failed",
        "Docker pull",
        _rx(r"\[ERROR\] (?:Pull failed for|Authenticated pull failed)|\A(?>.*?\[ERROR\] Login to ).* failed"),
    ),
    _one(
        "container-load-fail",
        "INF-load",
        SRC_INFRA,
        Tier.INFRA,
        ("[ERROR] Unable to determine image name or ID from docker load output",),
        "Tarball load failed",
        "Docker pull",
    ),
    _one(
        "no-gpu",
        "INF-nogpu",
        SRC_INFRA,
        Tier.INFRA,
        ("WARNING: No GPU devices detected",),
        "No GPU devices visible",
        "Container start",
    ),
    _one(
        "nccl-nic-fail",
        "INF-nic",
        SRC_INFRA,
        Tier.INFRA,
        ("Failed to auto-detect NCCL_SOCKET_IFNAME",),
        "Multi-node: no suitable NIC for NCCL",
        "Container start",
    ),
    _one(
        "port-fail",
        "INF-port",
        SRC_INFRA,
        Tier.INFRA,
        (
            "FATAL: Could not find a free port for JAX coordinator",
            "FATAL: Could not find a free port for Ray",
        ),
        "Port allocation failed",
        "Job start",
    ),
    _one(
        "model-not-found",
        "INF-model",
        SRC_INFRA,
        Tier.INFRA,
        ("!!! Unknown model:", "!!! Model name resolution failed"),
        "Config file missing or ambiguous name",
        "Training start",
    ),
    _one(
        "patch-branch-fail",
        "INF-patch",
        SRC_INFRA,
        Tier.INFRA,
        ("[FAIL] Failed to check out",),
        "MaxText hotfix branch checkout failed",
        "Container start",
    ),
    _one(
        "ray-start-fail",
        "INF-ray",
        SRC_INFRA,
        Tier.ADVISORY,
        ("[Ray] HEAD failed to start", "[Ray] HEAD timeout", "[Ray] WORKER failed"),
        "Ray cluster bootstrap failed (falls back to non-Ray)",
        "Ray init",
    ),
    # --- Stage timeouts -------------------------------------------------------------------
    _one(
        "preflight-timeout",
        "STG-preflight",
        SRC_STAGE,
        Tier.INFRA,
        ("== Preflight TIMEOUT",),
        "Preflight checks hung (stale GPU processes, NFS, NUMA)",
        "Preflight",
    ),
    _one(
        "pull-timeout",
        "STG-pull",
        SRC_STAGE,
        Tier.INFRA,
        ("== Docker pull TIMEOUT",),
        "Image pull took too long (slow registry or large image)",
        "Docker pull",
    ),
    _one(
        "ecc-timeout",
        "STG-ecc",
        SRC_STAGE,
        Tier.INFRA,
        ("== ECC check TIMEOUT",),
        "ECC memory check hung (GPU driver issue)",
        "ECC check",
    ),
    Signature(
        "train-timeout",
        SRC_STAGE,
        Tier.ROOT,
        (
            # Only the job script's own stage timeout. Slurm's `CANCELLED AT ... DUE TO TIME LIMIT`
            # (--time) is the scheduler cancelling the job: the cancelled class, decided from the
            # cancel line (rule CL-SLURM-TIME-LIMIT).
            Family("TT-stage", "runbook train-timeout row: '== Training TIMEOUT'", ("== Training TIMEOUT",)),
        ),
        "Training exceeded the configured wall-clock limit",
        "Training",
    ),
    # --- Training failures ----------------------------------------------------------------
    # `hang` has no log signature: it is decided from step progress (classify.py).
    Signature(
        "heartbeat-timeout",
        SRC_TRAIN,
        Tier.ROOT,
        (
            Family(
                "HB-unhealthy",
                "runbook heartbeat-timeout row: 'stopped sending heartbeats', 'The tasks have crashed'",
                # Older JAX: "Terminating process because the coordinator detected missing heartbeats."
                ("stopped sending heartbeats", "The tasks have crashed", "detected missing heartbeats"),
            ),
            # TSL coordination service: `/job:.../task:N has been set to ERROR in coordination
            # service: UNAVAILABLE: Task /job:.../task:N heartbeat timeout.`
            Family(
                "HB-task-timeout",
                "runbook heartbeat-timeout (the coordination service's own wording of a missed heartbeat)",
                ("heartbeat timeout", "set to ERROR in coordination service"),
                _rx(
                    r"[Tt]ask /job:\S+ heartbeat timeout|/job:\S+ has been set to ERROR in coordination service"
                ),
            ),
            # `Failed to send RPC to coordination service. Either the leader task was
            # preempted/died/restarted unexpectedly ...`: the liveness mechanism lost task 0.
            Family(
                "HB-leader-lost",
                "runbook heartbeat-timeout; § Heartbeat checklist (the coordination leader, task 0, is gone)",
                ("leader task",),
                _rx(r"leader task (?:was )?(?:preempted|died|restarted)"),
            ),
            # A coordination barrier that timed out during training names the tasks that never
            # arrived. Start-up barriers are a distributed-initialization deadline (NODE-jax-init);
            # Orbax's save barriers are the checkpoint's (CKPT-async-timeout).
            Family(
                "HB-barrier",
                "runbook heartbeat-timeout (a coordination barrier timed out during training)",
                ("Barrier timed out",),
                _rx(
                    r"DEADLINE_EXCEEDED: Barrier timed out\.(?! (?:Barrier_id|Id): \S{0,80}?"
                    + _CKPT_BARRIER
                    + ")"
                ),
                training_only=True,
            ),
        ),
        "JAX coordination heartbeat timeout",
        "Training",
    ),
    Signature(
        "oom-host",
        SRC_TRAIN,
        Tier.ROOT,
        (
            # Kernel and cgroup wording; "Out of memory while trying to allocate" is XLA's GPU message.
            Family(
                "OOMH-kernel",
                "runbook oom-host row: 'oom-kill', 'Out of memory', 'Killed' (kernel OOM killer)",
                (
                    "oom-kill",
                    "oom_kill",
                    "invoked oom-killer",
                    "Killed process",
                    "Kill process",
                    "Out of memory",
                ),
                _rx(
                    r"oom[-_]kill|invoked oom-killer|Killed process \d+"
                    r"|(?:[Oo]ut of memory|Memory cgroup out of memory): Kill(?:ed)? process \d+"
                    r"|Out of memory(?! while trying)"
                ),
            ),
            Family(
                "OOMH-slurm",
                "runbook oom-host row: 'Out of memory' (srun's per-task cgroup OOM report)",
                ("Out Of Memory",),
                _rx(r": Out Of Memory\b"),
            ),
            Family(
                "OOMH-shell",
                "runbook oom-host row: 'Killed' (the shell reports the training process SIGKILLed)",
                (" Killed",),
                _rx(r": line \d+: +\d+ Killed\b"),
            ),
            # Ray's memory monitor kills a task/worker because the node ran low on host memory.
            Family(
                "OOMH-ray",
                "runbook oom-host ('Host OOM: process killed'); Ray's memory monitor wording",
                (
                    "running low on memory",
                    "killed due to memory pressure",
                    "exceeds the memory usage threshold",
                    "System memory low at node",
                    "ray.exceptions.OutOfMemoryError",
                    "RayOutOfMemoryError",
                    "address the out of memory issue",
                ),
                description="Host OOM: Ray's memory monitor killed a worker because the node ran low on memory",
            ),
        ),
        "Host OOM: process killed by Linux OOM killer",
        "Training",
    ),
    Signature(
        "oom-gpu",
        SRC_TRAIN,
        Tier.ROOT,
        (
            Family(
                "OOMG-xla",
                "runbook oom-gpu row: 'RESOURCE_EXHAUSTED', 'ResourceExhausted', XLA's allocation failure",
                (
                    "RESOURCE_EXHAUSTED",
                    "ResourceExhausted",
                    "Resource exhausted: ",
                    "Out of memory while trying to allocate",
                ),
            ),
            # XLA's device allocator: `Failed to allocate request for 176.00MiB (...) on device
            # ordinal 0`, `Failed to allocate 98697216 bytes for new constant`.
            Family(
                "OOMG-alloc",
                "runbook oom-gpu ('GPU VRAM exhausted'): XLA could not allocate device memory",
                ("Failed to allocate",),
                _rx(r"Failed to allocate [^\n]{0,80}?(?:on device|device ordinal|for new constant)"),
            ),
            Family(
                "OOMG-bfc",
                "runbook oom-gpu row: 'out of memory' (the BFC allocator; 'not a failure' ones are harmless)",
                ("ran out of memory trying to allocate",),
            ),
            # The bare "out of memory" of rule CL-OOM-GPU, in a GPU runtime's wording only: host OOM and
            # Ray's memory monitor say it too (oom-host).
            Family(
                "OOMG-device",
                "runbook oom-gpu row: 'OUT_OF_MEMORY', 'XLA_ERROR', 'out of memory' (GPU runtime wording)",
                ("OUT_OF_MEMORY", "XLA_ERROR", "hipErrorOutOfMemory", "out of memory", "OutOfMemoryError"),
                _rx(
                    r"(?<!State=)\b\w*OUT_OF_MEMORY\b|XLA_ERROR|hipErrorOutOfMemory"
                    r"|torch\.(?:cuda\.)?OutOfMemoryError"
                    r"|(?:CUDA|HIP|[Cc]uda|[Hh]ip|GPU|[Dd]evice|VRAM|CUBIN|cuBLAS|CUBLAS|cuDNN|MIOpen"
                    r"|Cuda failure \d+)[^\n]{0,80}?out of memory"
                ),
            ),
        ),
        "GPU VRAM exhausted during compilation or execution",
        "Training",
    ),
    Signature(
        "nccl-timeout",
        SRC_TRAIN,
        Tier.SYMPTOM,
        (
            # Errors first (a line that names what failed is described as that, not a timeout).
            Family(
                "NCCL-xla-op",
                "runbook nccl-timeout row: 'NCCL error' (XLA: `NCCL operation <call> failed: <reason>`)",
                ("NCCL operation",),
                _rx(r"NCCL operation .{1,600}? failed\b"),
                NCCL_ERROR_DESC,
            ),
            Family(
                "NCCL-result",
                "runbook nccl-timeout row: 'ncclSystemError' (NCCL's result codes and their texts)",
                (
                    "unhandled cuda error",
                    "unhandled system error",
                    "report this issue to the NCCL developers",
                    "remote process exited or there was a network error",
                    "ncclUnhandledCudaError",
                    "ncclSystemError",
                    "ncclInternalError",
                    "ncclRemoteError",
                    "ncclInvalidUsage",
                    "ncclInvalidArgument",
                ),
                description=NCCL_ERROR_DESC,
            ),
            # XLA's NCCL communicator: `<last error>. Last NCCL error (maybe unrelated): <result>`
            # (its health check), `NcclCommunicator aborted`, `Aborting communicator: ...`.
            Family(
                "NCCL-xla-comm",
                "runbook nccl-timeout row: 'NCCL error' (XLA's NCCL communicator wording)",
                (
                    "Last NCCL error (maybe unrelated)",
                    "Last NCCL warning(error) log entry",
                    "NcclCommunicator aborted",
                    "Aborting communicator",
                ),
                description=NCCL_ERROR_DESC,
            ),
            Family(
                "NCCL-error",
                "runbook nccl-timeout row: 'NCCL error'",
                ("NCCL error", "RCCL error"),
                description=NCCL_ERROR_DESC,
            ),
            # Timeouts.
            Family(
                "NCCL-warn-timeout",
                "runbook nccl-timeout row: 'NCCL WARN Timeout' (not a literal in NCCL: WARN + timeout)",
                ("NCCL WARN",),
                _rx(r"\A(?>.*?NCCL WARN).*(?:[Tt]imeout|[Tt]imed out)"),
                NCCL_TIMEOUT_DESC,
            ),
            Family(
                "NCCL-timeout-waiting",
                "runbook nccl-timeout row: 'Timeout waiting for'",
                ("Timeout waiting for",),
                description=NCCL_TIMEOUT_DESC,
            ),
            # PyTorch's ProcessGroupNCCL watchdog: `WorkNCCL(SeqNum=.., OpType=..) ran for N
            # milliseconds before timing out`.
            Family(
                "NCCL-watchdog",
                "runbook nccl-timeout ('NCCL/RCCL collective timeout'); the ProcessGroupNCCL watchdog wording",
                ("Watchdog caught collective operation timeout", "WorkNCCL(", "Timeout at NCCL work"),
                _rx(
                    r"Watchdog caught collective operation timeout|Timeout at NCCL work"
                    r"|\A(?>.*?WorkNCCL\([^)]{0,1000}\)).*?(?:before timing out|timed out)"
                ),
                NCCL_TIMEOUT_DESC,
            ),
            # XLA exchanges the NCCL clique id through the coordination key-value store; a
            # `GetKeyValue() timed out with key: devices=[...]` is a communicator-setup timeout.
            Family(
                "NCCL-clique-kv-timeout",
                "runbook nccl-timeout ('collective timeout'; XLA's NCCL clique key exchange timed out)",
                ("timed out with key",),
                _rx(r"timed out with key: [^\n]*devices=\["),
                NCCL_TIMEOUT_DESC,
            ),
            Family(
                "NCCL-failed-or-timed-out",
                "runbook nccl-timeout ('NCCL error'/'timeout'; the watchdog's generic preamble)",
                ("NCCL operations have failed or timed out",),
                description=NCCL_FAILED_OR_TIMED_OUT_DESC,
            ),
            # Any other NCCL WARN counts only during training (MSCCL++ notices are harmless).
            Family(
                "NCCL-warn",
                "runbook nccl-timeout row: 'NCCL WARN (during training)'",
                ("NCCL WARN",),
                _rx(r"NCCL WARN(?!.*MSCCL\+\+)"),
                NCCL_WARN_DESC,
                training_only=True,
            ),
        ),
        NCCL_TIMEOUT_DESC,
        "Training",
    ),
    Signature(
        "xla-compile-fail",
        SRC_TRAIN,
        Tier.ROOT,
        (
            Family(
                "XC-xla",
                "runbook xla-compile-fail row: 'INTERNAL: Failed to compile', 'XLA compilation failed', 'HloModule + error'",
                ("INTERNAL: Failed to compile", "XLA compilation failed", "HloModule"),
                _rx(
                    # `\A(?>.*?X).*Y`: X then Y anywhere after, trying only the first X (an atomic
                    # group); `X.*Y` retried at every X of a 64 KB line takes minutes.
                    r"INTERNAL: Failed to compile|XLA compilation failed"
                    r"|\A(?>.*?HloModule).*(?:[Ee]rror|failed)"
                    r"|\A(?>.*?(?:[Ee]rror|failed)).*HloModule"
                ),
            ),
            # LLVM's report_fatal_error prints `LLVM ERROR: <reason>` and aborts.
            Family("XC-llvm", "compiler fatal before training: LLVM's `LLVM ERROR: %s`", ("LLVM ERROR: ",)),
            Family(
                "XC-ptxas",
                "compiler fatal before training: ptxas (the PTX assembler XLA runs)",
                (
                    "ptxas exited with non-zero",
                    "ptxas returned an error",
                    "Failed to launch ptxas",
                    "ptxas fatal",
                    "ptxas` invocation failed",
                ),
            ),
            # An absl CHECK / RET_CHECK failing in a compiler pass, autotuner or partitioner
            # (`F0000 00:00:1786847906.773812 3801585 layout_assignment.cc:526] Check failed: ...`).
            Family(
                "XC-check",
                "runbook xla-compile-fail ('XLA/GPU compiler failure'): an internal check of a compiler pass",
                ("Non-OK-status", "Check failed", "RET_CHECK failure"),
                _rx(
                    # Bounded repeats and an atomic first match: unbounded `\w*` and `[^\n]*`
                    # here backtrack quadratically on a long line (see the XC-xla family).
                    r"\A(?>.*?(?:" + _XLA_COMPILER_FILES + r")\w{0,120}"
                    r"\.(?:cc|h):\d{1,9}\]).*(?:Non-OK-status|Check failed)"
                    r"|Non-OK-status: [\w.>()-]{0,400}(?:executable|[Cc]ompil)"
                    r"|RET_CHECK failure \([^)\n]{0,400}(?:xla/service|compiler/xla|xla/hlo|/spmd/|xla/backends)"
                ),
            ),
            # Before the first step the process compiles and autotunes the train step: an absl CHECK
            # abort then (its file name already stripped with the absl prefix) is the compiler's.
            Family(
                "XC-check-compile-phase",
                "runbook xla-compile-fail: an absl CHECK abort before the first step (compilation/autotuning)",
                ("Non-OK-status: ", "Check failed: "),
                _rx(r"(?:^|\] )(?:Non-OK-status|Check failed): "),
                before_first_step=True,
            ),
            # The CHECK's stack trace names the compiler: `@ 0x7f0e1c0cc4a4  xla::gpu::IrEmitterUnnested::EmitFusion()`.
            Family(
                "XC-frame",
                "runbook xla-compile-fail: a fatal stack trace inside XLA's compiler (passes, emitters, autotuners)",
                ("xla::", "stream_executor::"),
                _rx(
                    r"^\s*@\s+0x[0-9a-f]{4,16}\s+(?:xla|stream_executor)::[\w:<>()~, ]{0,200}?"
                    r"(?:Autotun|AlgorithmPicker|Redzone|HloPassPipeline|RunHloPasses|RunPasses|IrEmitter"
                    r"|::Emit\w{0,40}\(|Compil|LayoutAssignment|BufferAssign|Partitioner|Rewriter|Simplifier"
                    r"|FusionAnalysis|TritonFusion)"
                ),
            ),
            # The GPU autotuner benchmarks candidate kernels while compiling; a kernel it cannot
            # launch (`Failed to launch ROCm kernel: RepeatBufferKernel ...`, CUDA_ERROR_LAUNCH_FAILED /
            # hipErrorLaunchFailure in gemm_algorithm_picker / the autotuner's redzone buffers).
            Family(
                "XC-autotune-launch",
                "runbook xla-compile-fail: the GPU autotuner could not launch a kernel while compiling",
                (
                    "RepeatBufferKernel",
                    "Failed to launch",
                    "failed to launch",
                    "CUDA_ERROR_LAUNCH_FAILED",
                    "hipErrorLaunchFailure",
                ),
                _rx(
                    r"RepeatBufferKernel"
                    r"|\A(?>.*?(?:[Aa]utotun|algorithm_picker|[Rr]edzone)).*?(?:[Ff]ailed to launch"
                    r"|CUDA_ERROR_LAUNCH_FAILED|hipErrorLaunchFailure)"
                    r"|\A(?>.*?(?:[Ff]ailed to launch|CUDA_ERROR_LAUNCH_FAILED|hipErrorLaunchFailure))"
                    r".*?(?:[Aa]utotun|algorithm_picker|[Rr]edzone)"
                ),
                XLA_AUTOTUNE_LAUNCH_DESC,
            ),
            Family(
                "XC-autotune",
                "runbook xla-compile-fail: XLA's autotuner found no config that compiles",
                ("Autotuning failed",),
            ),
            # The compiled GPU code cannot be linked or loaded for the device.
            Family(
                "XC-gpu-code",
                "runbook xla-compile-fail ('XLA/GPU compiler failure'): the GPU code cannot be JIT-linked or loaded",
                (
                    "PTX JIT compiler library not found",
                    "to load PTX text as a module",
                    "CUDA_ERROR_INVALID_PTX",
                    "CUDA_ERROR_INVALID_IMAGE",
                    "CUDA_ERROR_NO_BINARY_FOR_GPU",
                    "hipErrorNoBinaryForGpu",
                ),
            ),
        ),
        "XLA/GPU compiler failure",
        "Training",
    ),
    Signature(
        "python-exception",
        SRC_TRAIN,
        Tier.CARRIER,
        (
            # Interleaved multi-rank output can eat the start of the header (`raceback (most recent
            # call last):`); logging's `Stack (most recent call last):` is no exception.
            Family(
                "PY-traceback",
                "runbook python-exception row: 'Traceback (most recent call last):'",
                ("(most recent call last):",),
                _rx(r"(?<!Stack )\(most recent call last\):"),
            ),
            # The exception that ends the traceback (`ValueError: ...`, `jaxlib...XlaRuntimeError: ...`):
            # the line the report must quote ("read the traceback for details").
            Family(
                "PY-exception-line",
                "runbook python-exception ('read the traceback'): the exception line that ends a traceback",
                ("Error: ", "Exception: "),
                _rx(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?:\([\w.]+\))?: "),
                fallback=True,
                after_traceback=True,
            ),
        ),
        "Unhandled Python exception",
        "Training",
    ),
    Signature(
        "signal-kill",
        SRC_TRAIN,
        Tier.CARRIER,
        (
            Family(
                "SIG-actor",
                "runbook signal-kill row: 'Training subprocess killed by'",
                ("Training subprocess killed by",),
            ),
            Family(
                "SIG-python-fault",
                "runbook signal-kill ('SIGSEGV, SIGABRT'): Python's fault handler",
                ("Fatal Python error: ",),
                _rx(
                    r"Fatal Python error: (?:Segmentation fault|Aborted|Bus error|Floating point exception|Illegal instruction)"
                ),
            ),
            Family(
                "SIG-shell",
                "runbook signal-kill ('SIGSEGV, SIGABRT'): the shell / srun reports a signal death",
                (
                    "Segmentation fault",
                    "Aborted (core dumped)",
                    "Bus error",
                    "Illegal instruction",
                    "srun: error:",
                ),
                _rx(
                    r"Segmentation fault|Aborted \(core dumped\)|(?:Bus error|Illegal instruction) \(core dumped\)"
                    r"|: line \d+: +\d+ (?:Aborted|Bus error|Illegal instruction)"
                    r"|srun: error: \S+: tasks? [\d,\-\[\] ]+: (?:Aborted|Bus error|Illegal instruction"
                    r"|Floating point exception)"
                ),
            ),
            # The ROCm runtime aborts the process on a GPU hardware exception (SIGABRT, core dumped).
            Family(
                "SIG-gpu-hw-exception",
                "runbook signal-kill ('SIGABRT'); § node failures: hardware fault (runtime aborts)",
                ("HW Exception by GPU",),
            ),
        ),
        "Training process killed by signal (SIGSEGV, SIGABRT, etc.)",
        "Training",
    ),
    _one(
        "subprocess-fail",
        "SUB-exit",
        SRC_TRAIN,
        Tier.CARRIER,
        ("Training subprocess exited with code",),
        "Training process exited non-zero",
        "Training",
        _rx(r"Training subprocess exited with code (?!0\b)"),
    ),
    Signature(
        "actor-fail",
        SRC_TRAIN,
        Tier.CARRIER,
        (
            Family("ACT-job", "runbook actor-fail row: 'Actor failed:'", ("Actor failed:",)),
            Family(
                "ACT-ray",
                "runbook actor-fail ('Ray actor exception'): Ray's own wording of an actor death",
                ("The actor died unexpectedly", "RayActorError", "The actor is dead because"),
            ),
        ),
        "Ray actor exception",
        "Training",
    ),
    Signature(
        "checkpoint-fs-error",
        SRC_TRAIN,
        Tier.ROOT,
        (
            Family(
                "CKPT-maxtext",
                "runbook checkpoint-fs-error row: 'Training stopped: Checkpointing failed', 'manifest.ocdbt.__lock'",
                ("Checkpointing failed", "manifest.ocdbt.__lock"),
                _rx(
                    r"Training stopped: Checkpointing failed|No such file or directory: .*manifest\.ocdbt\.__lock"
                ),
            ),
            # TensorStore: `Failed to acquire lock on file: <f>.__lock [OS error: ...]`, `Failed to
            # rename fd: N "<f>.__lock" ... [OS error 2: ENOENT ...]`.
            Family(
                "CKPT-lock",
                "runbook checkpoint-fs-error ('OCDBT/filesystem errors'): a lock file cannot be taken or renamed",
                ("Failed to acquire lock", "Failed to rename fd", ".__lock"),
                _rx(
                    r"\A(?>.*?(?:Failed to acquire lock|Failed to rename fd|\.__lock\b)).*"
                    r"(?:\[OS error|\[Errno \d+\]|No such file or directory)"
                ),
            ),
            # TensorStore's kvstore I/O errors: `Error writing "<key>" in OCDBT database at local
            # file "<dir>"`, `Error writing local file "<f>"`, `[OS error N: ...]`.
            Family(
                "CKPT-tensorstore-io",
                "runbook checkpoint-fs-error ('similar OCDBT/filesystem errors'): TensorStore file I/O failed",
                ("in OCDBT database", "Error writing local file", "Error getting file info", "[OS error"),
                _rx(
                    r"Error (?:writing|reading|deleting) [^\n]{0,600}? in OCDBT database|Error writing local file"
                    r"|Error getting file info|\[OS error[^\]\n]{0,600}\]"
                ),
            ),
            # Orbax's asynchronous save: the hosts meet at coordination barriers after writing
            # (`Barrier timed out. Id: 0_async_write_complete.0.1`), the save future has a deadline
            # (`ChainedFuture completed 0/1 futures but timed out after 1199.96 seconds`), TensorStore
            # writes fail with DEADLINE_EXCEEDED.
            Family(
                "CKPT-async-timeout",
                "runbook checkpoint-fs-error ('checkpoint write failed'): an asynchronous save timed out",
                ("Barrier timed out", "futures but timed out", "DEADLINE_EXCEEDED"),
                _rx(
                    r"Barrier timed out\. (?:Barrier_id|Id): \S{0,80}?"
                    + _CKPT_BARRIER
                    + r"|ChainedFuture completed \d+/\d+ futures but timed out"
                    r"|\A(?>.*?DEADLINE_EXCEEDED)[^\n]{0,400}?(?:OCDBT|ocdbt|[Tt]ensor[Ss]tore|kvstore|\.zarray"
                    r"|Error (?:writing|reading))"
                    r"|\A(?>.*?Error (?:writing|reading) )[^\n]{0,600}?DEADLINE_EXCEEDED"
                ),
                ASYNC_CKPT_TIMEOUT_DESC,
            ),
            # An OSError on a checkpoint path (Orbax's tmp directories, OCDBT/zarr files).
            Family(
                "CKPT-oserror",
                "runbook checkpoint-fs-error ('[Errno 2] No such file or directory'): an OS error on a checkpoint path",
                ("[Errno ",),
                _rx(
                    r"\[Errno \d+\] [^:\n]*: '[^'\n]*(?:orbax-checkpoint-tmp|\.orbax|[Cc]heckpoint|ckpt|ocdbt"
                    r"|_METADATA|_sharding|\.zarray|commit_success)"
                ),
            ),
        ),
        "Checkpoint write failed due to NFS/storage filesystem error",
        "Checkpoint save",
    ),
    # --- Job-level status -------------------------------------------------------------------
    Signature(
        "node-fail",
        SRC_JOB,
        Tier.CARRIER,
        (
            Family(
                "NODE-exit",
                "runbook node-fail row: 'NODE_EXIT host=... exit= (non-zero)'",
                ("NODE_EXIT host=",),
                _rx(r"NODE_EXIT host=\S+ exit=(?!0\b)\d+"),
            ),
            # `srun: error: <host>: task N: Killed`: the task was SIGKILLed (exit 137: OOM or an
            # external kill). With no JOB SUMMARY it is the unknown-death checklist's evidence.
            Family(
                "NODE-srun-killed",
                "runbook § Diagnosing node failures ('Exit 137 = SIGKILL'); § unknown-death checklist ('Killed')",
                ("srun: error:",),
                _rx(r"srun: error: \S+: tasks? [\d,\-\[\] ]+: Killed\b"),
                "A task was SIGKILLed (srun reports it Killed: host OOM-kill or an external kill)",
            ),
            Family(
                "NODE-slurm-node-failure",
                "runbook node-fail ('One or more nodes exited with errors'): Slurm reports a node failure",
                ("Node failure on", "DUE TO NODE FAILURE"),
                _rx(r"(?:srun|salloc|sbatch): error: Node failure on \S+|DUE TO NODE FAILURE"),
                SLURM_NODE_FAILURE_DESC,
            ),
            # jax.distributed.initialize at start-up: the coordinator's registration deadline
            # (`[Init]Wait_for_all_tasks_to_register`, `RegisterTask` ... `DEADLINE_EXCEEDED`), the
            # client's connect barrier (`PjRT_Client_Connect`), any coordination barrier before
            # training started. The tasks it names never joined: a node-level failure to start, not
            # a heartbeat timeout (the liveness check begins after registration). Rule CL-INIT.
            Family(
                "NODE-jax-init",
                "runbook node-fail ('one or more nodes'); JAX distributed initialization: tasks that never joined",
                (
                    "cluster registration failed",
                    "Wait_for_all_tasks_to_register",
                    "PjRT_Client_Connect",
                    "CoordinationService/RegisterTask",
                ),
                _rx(
                    r"coordination service as cluster registration failed|Wait_for_all_tasks_to_register"
                    r"|Barrier timed out\. (?:Barrier_id|Id): PjRT_Client_Connect"
                    r"|CoordinationService/RegisterTask"
                ),
                JAX_INIT_DESC,
            ),
            Family(
                "NODE-jax-init-deadline",
                "runbook node-fail; a coordination-service deadline before training started (start-up)",
                ("Barrier timed out", "DEADLINE_EXCEEDED"),
                _rx(
                    # Not a checkpoint's barrier (a restore's at start-up is CKPT-async-timeout).
                    r"\A(?!(?>.*?Barrier timed out\. )(?:Barrier_id|Id): \S{0,80}?"
                    + _CKPT_BARRIER
                    + r").*?(?:DEADLINE_EXCEEDED: Barrier timed out\."
                    r"|(?:XlaRuntimeError|JaxRuntimeError|[Cc]oordination service|[Dd]istributed)[^\n]{0,200}?"
                    r"DEADLINE_EXCEEDED)"
                ),
                JAX_INIT_DESC,
                startup_only=True,
            ),
        ),
        "One or more nodes exited with errors",
    ),
    _one(
        "stage-fail",
        "STAGE-failed",
        SRC_JOB,
        Tier.CARRIER,
        (" FAILED (exit=",),
        "A non-timeout stage failure",
        "",
        _rx(r"^== .+ FAILED \(exit="),
    ),
)

# Rows that describe a derived class (decided from progress): quoted, never a class of their own.
EVIDENCE_SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "hang",
        SRC_HANG,
        Tier.EVIDENCE,
        (
            # XLA's rendezvous watchdog: `This thread has been waiting for `<op>` for 10 seconds and
            # may be stuck. Expected N threads to join the rendezvous, ...`: printed by a stuck collective.
            Family(
                "HANG-rendezvous",
                "runbook § Hang diagnosis ('all nodes waiting on each other'): XLA's rendezvous watchdog",
                ("may be stuck",),
                _rx(r"waiting for .{0,600}? and may be stuck|may be stuck\. Expected \d+ threads?"),
            ),
        ),
        "Training stopped advancing: a collective hang",
        "Training",
    ),
)

BY_CLASS: dict[str, Signature] = {s.cls: s for s in SIGNATURES}
EVIDENCE_CLASSES: frozenset[str] = frozenset(s.cls for s in EVIDENCE_SIGNATURES)
FAMILIES: dict[str, Family] = {f.rule: f for s in (*SIGNATURES, *EVIDENCE_SIGNATURES) for f in s.families}

# Classes decided from progress or job state rather than a line signature.
DERIVED_CLASSES: tuple[FailureClass, ...] = (
    FailureClass.HANG,
    FailureClass.CANCELLED,
    FailureClass.UNKNOWN_DEATH,
    FailureClass.SOFT_SUCCESS,
    FailureClass.TGS_DEGRADATION,
)

# Every class name job-log-triage defines (docs/rules.md §3), in its table order (hang sits before heartbeat).
ALL_CLASSES: tuple[str, ...] = (
    *(s.cls for s in SIGNATURES if s.source in (SRC_INFRA, SRC_STAGE)),
    FailureClass.HANG,
    *(s.cls for s in SIGNATURES if s.source == SRC_TRAIN),
    FailureClass.TGS_DEGRADATION,
    FailureClass.CANCELLED,
    FailureClass.NODE_FAIL,
    FailureClass.UNKNOWN_DEATH,
    FailureClass.STAGE_FAIL,
    FailureClass.SOFT_SUCCESS,
)


def describe(cls: str, rule: str | None = None) -> str:
    """What a match means in plain words: the family's own description, else the class's."""
    fam = FAMILIES.get(rule or "")
    if fam is not None and fam.description:
        return fam.description
    sig = BY_CLASS.get(cls)
    return sig.description if sig is not None and sig.description else cls


@dataclass(frozen=True, slots=True)
class Harmless:
    rule: str
    needles: tuple[str, ...]
    why: str
    regex: re.Pattern[str] | None = None
    source: str = SRC_HARMLESS

    def matches(self, text: str) -> bool:
        if not any(n in text for n in self.needles):
            return False
        return self.regex is None or self.regex.search(text) is not None


# A line matching one of these is never evidence of a failure (runbook: "Do not classify
# them as failures or mention them in the triage report").
HARMLESS: tuple[Harmless, ...] = (
    # The CUDA probe on AMD nodes, not any "INTERNAL: CUDA error" (a real CUDA OOM says that too).
    Harmless("HX-cuinit", ("Failed call to cuInit",), "JAX/XLA CUDA probe on AMD nodes"),
    Harmless("HX-msccl", ("MSCCL++: Feature not enabled", "MSCCL++"), "RCCL init notice"),
    Harmless(
        "HX-tokenizer",
        ("Token indices sequence length is longer than the specified maximum",),
        "tokenizer warning",
    ),
    Harmless("HX-oci", ("OCI runtime exec failed",), "container cleanup / teardown race"),
    Harmless(
        "HX-docker-exec", ("docker exec failed", "falling back to host-level kill"), "preflight cleanup"
    ),
    Harmless("HX-sigkill-none", ("Sent SIGKILL to 0/0 processes",), "preflight cleanup, nothing to kill"),
    Harmless("HX-cpu-core", ("Cannot read CPU core",), "topology probe outside the cgroup"),
    Harmless("HX-tpu-probe", ("No hardware is found. Using default TPU version",), "TPU probe on a GPU node"),
    Harmless("HX-trace", ("No device identifiers found",), "XLA tracing probe"),
    Harmless("HX-pjrt-log", ("Enabling PjRt/TPU event dependency logging",), "XLA logging init"),
    Harmless("HX-fiber", ("Fiber init: default domain",), "threading init"),
    Harmless("HX-docker-rm", ("cannot remove container",), "Docker slow to exit during teardown"),
    Harmless("HX-docker-exit", ("did not receive an exit event",), "Docker slow to exit during teardown"),
    # Families of the same kind (allocator / runtime messages that say they are not a failure).
    Harmless(
        "HX-bfc-not-a-failure",
        ("indicates that this is not a failure",),
        "the BFC allocator retries with less memory; it says itself this is not a failure",
    ),
    Harmless(
        "HX-coordination-shutdown",
        ("Failed to retrieve preemption notice", "Failed to disconnect from coordination service"),
        "coordination-service socket closed while the tasks shut down",
    ),
    Harmless(
        "HX-delay-kernel", ("Delay kernel timed out",), "XLA's kernel timer accuracy notice (autotuner)"
    ),
    # NCCL's INFO level never reports a failure (e.g. "Call to connect returned ..., retrying").
    Harmless("HX-nccl-info", (" NCCL INFO ",), "NCCL INFO-level progress", _rx(r"\[\d+\] NCCL INFO ")),
)


_EXCEPTION_LINE = FAMILIES["PY-exception-line"].regex


def is_exception_line(text: str) -> bool:
    """`ValueError: ...`, `jaxlib.xla_extension.XlaRuntimeError: ...`: the line ending a traceback."""
    return _EXCEPTION_LINE is not None and _EXCEPTION_LINE.search(text) is not None


def harmless_rule(text: str) -> str | None:
    for h in HARMLESS:
        if h.matches(text):
            return h.rule
    return None


def is_harmless(text: str) -> bool:
    return harmless_rule(text) is not None


def match_line(
    text: str, *, training_started: bool, after_traceback: bool = False, first_step_done: bool = True
) -> list[Match]:
    """Every class row a stripped line matches, with the family that matched (empty for harmless
    lines). `after_traceback`: the line follows a Traceback header (or, the header lost, a frame
    line) of the same task; `first_step_done`: a training step completed (compilation is over)."""
    if _ANY_NEEDLE.search(text) is None:
        return []  # the common case (the head and tail of a log are parsed whole): one C search
    found: list[Match] = []
    fallbacks: list[Match] = []
    for sig in SIGNATURES:
        fam = sig.family(
            text,
            training_started=training_started,
            after_traceback=after_traceback,
            first_step_done=first_step_done,
        )
        if fam is not None:
            (fallbacks if fam.fallback else found).append(Match(sig, fam))
    for sig in EVIDENCE_SIGNATURES:
        fam = sig.family(text, training_started=training_started)
        if fam is not None:
            found.append(Match(sig, fam))
    if not found:
        found = fallbacks
    if not found or is_harmless(text):
        return []
    classes = {m.cls for m in found}
    if FailureClass.OOM_HOST in classes and FailureClass.OOM_GPU in classes:
        # "Memory cgroup out of memory: Killed process" is the kernel, not the GPU allocator.
        found = [m for m in found if m.cls != FailureClass.OOM_GPU]
    return found


SIGNATURE_NEEDLES: tuple[str, ...] = tuple(
    sorted({n for s in (*SIGNATURES, *EVIDENCE_SIGNATURES) for f in s.families for n in f.needles})
)
# Every family needs one of its needles in the line: a line with none of them matches nothing.
_ANY_NEEDLE = re.compile("|".join(re.escape(n) for n in sorted(SIGNATURE_NEEDLES, key=len, reverse=True)))
