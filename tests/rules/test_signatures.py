"""The signature table: match order, overlaps between rows, and the known-harmless table."""

from __future__ import annotations

import pytest

from jobdiagd.rules.signatures import (
    ALL_CLASSES,
    BY_CLASS,
    EVIDENCE_SIGNATURES,
    HARMLESS,
    SIGNATURES,
    describe,
    match_line,
)


def classes(text: str, started: bool = True) -> list[str]:
    return [s.cls for s in match_line(text, training_started=started)]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 50677260416 bytes.", ["oom-gpu"]),
        ("Memory cgroup out of memory: Killed process 424242 (python3) total-vm:1kB", ["oom-host"]),
        ("Out of memory: Killed process 4242 (python3)", ["oom-host"]),
        ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=123.0.", ["oom-host"]),
        ("/var/spool/slurmd/job123456/slurm_script: line 42: 424242 Killed  python3 -u x.py", ["oom-host"]),
        ("srun: error: node006: task 5: Out Of Memory", ["oom-host"]),
        ("Allocator (GPU_0_bfc) ran out of memory trying to allocate 4.50GiB", ["oom-gpu"]),
        (
            "node001:81234:81502 [3] misc/socket.cc:478 NCCL WARN socketStartConnect: exceeded timeouts (5)",
            ["nccl-timeout"],
        ),
        ("NCCL WARN MSCCL++: Feature not enabled. ENABLE_MSCCLPP must be defined at compile-time", []),
        ("Failed call to cuInit: UNKNOWN ERROR (303)", []),
        ("INTERNAL: Failed to compile the module", ["xla-compile-fail"]),
        ("Traceback (most recent call last):", ["python-exception"]),
        ("[Node 0 @ node001] Training subprocess killed by SIGSEGV (signal 11)", ["signal-kill"]),
        ("[Node 0 @ node001] Training subprocess exited with code 1", ["subprocess-fail"]),
        ("[Node 0 @ node001] Training subprocess exited with code 0", []),
        ("[Node 3] Actor failed: RuntimeError", ["actor-fail"]),
        (
            "Training stopped: Checkpointing failed. [Errno 2] No such file or directory: '/x/manifest.ocdbt.__lock'",
            ["checkpoint-fs-error"],
        ),
        ("NODE_EXIT host=node006 exit=137", ["node-fail"]),
        ("== Training FAILED (exit=1, 3620s) ==", ["stage-fail"]),
        ("== Preflight TIMEOUT (900s/900s) ==", ["preflight-timeout"]),
        ("== Docker pull TIMEOUT (900s/900s) ==", ["pull-timeout"]),
        ("[Ray] HEAD timeout", ["ray-start-fail"]),
        ("!!! Unknown model: llama9", ["model-not-found"]),
        (
            "The tasks have crashed. Check the task logs for an earlier error to debug further.",
            ["heartbeat-timeout"],
        ),
        ("Token indices sequence length is longer than the specified maximum sequence length", []),
        ("OCI runtime exec failed: exec failed: unable to start container process", []),
    ],
)
def test_line_classes(line: str, expected: list[str]) -> None:
    assert classes(line) == expected


def test_plain_nccl_warn_only_counts_during_training() -> None:
    line = "node001:1:2 [0] NCCL WARN Cuda failure 'invalid argument'"
    assert classes(line, started=False) == []
    assert classes(line, started=True) == ["nccl-timeout"]
    assert classes("node001:1:2 [0] NCCL WARN Timeout waiting for peer", started=False) == ["nccl-timeout"]


def test_every_row_names_its_source_and_has_needles() -> None:
    for sig in SIGNATURES:
        assert sig.source.startswith(("job-log-triage.md", "notes/"))
        assert sig.needles
    assert len(set(ALL_CLASSES)) == len(ALL_CLASSES)
    for required in (
        "hang",
        "soft-success",
        "unknown-death",
        "tgs-degradation",
        "cancelled",
        "prolog-kill-no-log",
    ):
        assert required in ALL_CLASSES


def rules(text: str, started: bool = True, after_traceback: bool = False) -> list[tuple[str, str]]:
    return [
        (m.cls, m.rule) for m in match_line(text, training_started=started, after_traceback=after_traceback)
    ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # NCCL/RCCL errors in XLA's and NCCL's own wording (format strings), not timeouts.
        (
            "INTERNAL: xla/service/gpu/runtime/nccl_api.cc:515: NCCL operation ncclCommInitRankConfig(&comm, "
            "nranks, id, rank, &config) failed: invalid usage (run with NCCL_DEBUG=WARN for details).",
            ("nccl-timeout", "NCCL-xla-op"),
        ),
        ("RuntimeError: ncclCommInitRank failed: unhandled system error", ("nccl-timeout", "NCCL-result")),
        ("ncclInternalError: Internal check failed.", ("nccl-timeout", "NCCL-result")),
        ("what(): RCCL error in: rccl.cc:42, internal error", ("nccl-timeout", "NCCL-error")),
        ("node3:1:2 [0] NCCL WARN Net : Connection closed by remote peer", ("nccl-timeout", "NCCL-warn")),
        ("node3:1:2 [0] NCCL WARN Timeout waiting for proxy response", ("nccl-timeout", "NCCL-warn-timeout")),
        (
            "[E ProcessGroupNCCL.cpp:1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
            "OpType=ALLGATHER, Timeout(ms)=60000) ran for 60030 milliseconds before timing out.",
            ("nccl-timeout", "NCCL-watchdog"),
        ),
        # Checkpoint filesystem errors in TensorStore / OCDBT / Orbax wording.
        (
            "Failed to acquire lock on file: /ckpt/x/_sharding.__lock [OS error: Resource temporarily unavailable]",
            ("checkpoint-fs-error", "CKPT-lock"),
        ),
        (
            'Error writing "opt_state/c/1" in OCDBT database at local file "/ckpt/400.orbax-checkpoint-tmp-3/": '
            "[OS error 116: ESTALE Stale file handle]",
            ("checkpoint-fs-error", "CKPT-tensorstore-io"),
        ),
        (
            "OSError: [Errno 28] No space left on device: '/ckpt/400.orbax-checkpoint-tmp-3/_METADATA'",
            ("checkpoint-fs-error", "CKPT-oserror"),
        ),
        # Ray's memory monitor is host OOM, never GPU OOM.
        (
            "(raylet) node_manager.cc:3064: 3 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers "
            "crashed due to other reasons at node (ID: 1, IP: 10.0.0.2) over the last time period.",
            ("oom-host", "OOMH-ray"),
        ),
        (
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
            ("oom-host", "OOMH-ray"),
        ),
        ("Memory cgroup out of memory: Kill process 17811 (python3) score 990", ("oom-host", "OOMH-kernel")),
        ("hipErrorOutOfMemory: out of memory", ("oom-gpu", "OOMG-device")),
        ("RuntimeError: CUDA error: out of memory", ("oom-gpu", "OOMG-device")),
        # Compiler fatals before training.
        ("LLVM ERROR: out of memory", ("xla-compile-fail", "XC-llvm")),
        ("INTERNAL: ptxas exited with non-zero error code 139, output:", ("xla-compile-fail", "XC-ptxas")),
        (
            "RuntimeError: hipErrorNoBinaryForGpu: Unable to find code object for all current devices!",
            ("xla-compile-fail", "XC-gpu-code"),
        ),
        # Slurm's own lines.
        ("srun: error: node004: tasks 3-5: Killed", ("node-fail", "NODE-srun-killed")),
        ("srun: error: Node failure on node004", ("node-fail", "NODE-slurm-node-failure")),
        ("srun: error: node004: task 3: Aborted", ("signal-kill", "SIG-shell")),
        ("Fatal Python error: Bus error", ("signal-kill", "SIG-python-fault")),
        # Coordination service.
        (
            "/job:jax_worker/replica:0/task:5 has been set to ERROR in coordination service: UNAVAILABLE: Task "
            "/job:jax_worker/replica:0/task:5 heartbeat timeout.",
            ("heartbeat-timeout", "HB-task-timeout"),
        ),
        ("UNAVAILABLE: Either the leader task died unexpectedly", ("heartbeat-timeout", "HB-leader-lost")),
        # Ray's actor death wording.
        (
            "ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.",
            ("actor-fail", "ACT-ray"),
        ),
    ],
)
def test_family_wordings(line: str, expected: tuple[str, str]) -> None:
    assert rules(line) == [expected]


@pytest.mark.parametrize(
    "line",
    [
        # Allocator / runtime messages that say they are not a failure, shutdown noise, INFO level.
        "Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.1GiB with freed_by_count=0. The caller "
        "indicates that this is not a failure, but may mean that there could be performance gains.",
        "Failed to retrieve preemption notice from coordination service: UNAVAILABLE: Socket closed",
        "Failed to disconnect from coordination service with status: DEADLINE_EXCEEDED: Deadline Exceeded",
        "node1:1:2 [0] NCCL INFO Call to connect returned Connection timed out, retrying",
        "Delay kernel timed out: measured time has sub-optimal accuracy.",
        "Unable to initialize backend 'cuda': INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
        # Words near the needles that are not failures.
        "NCCL_IB_TIMEOUT=22",
        "Config param checkpoint_dir: /outputs/llama/checkpoints",
        "State=OUT_OF_MEMORY",
        "I0612 10:00:00.000000 1 checkpoint_manager.py:1] Saved a checkpoint at step 400.",
        "ValueError: not after a traceback header, so not an exception line",
    ],
)
def test_harmless_and_benign_lines_match_nothing(line: str) -> None:
    assert rules(line) == []


def test_an_exception_line_counts_only_after_a_traceback_and_only_when_nothing_else_matches() -> None:
    assert rules("ValueError: boom", after_traceback=True) == [("python-exception", "PY-exception-line")]
    assert rules("ValueError: boom") == []
    oom = "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1 bytes."
    assert rules(oom, after_traceback=True) == [("oom-gpu", "OOMG-xla")]


def test_every_family_names_its_rule_and_runbook_reference() -> None:
    fams = [f for s in (*SIGNATURES, *EVIDENCE_SIGNATURES) for f in s.families]
    assert len({f.rule for f in fams}) == len(fams)
    for f in fams:
        assert f.rule and f.ref and f.needles
        assert all(len(n) >= 5 for n in f.needles), f.rule  # short needles cost every log byte
    assert all(h.rule for h in HARMLESS)


def test_descriptions_follow_the_wording() -> None:
    assert "collective timeout" not in describe("nccl-timeout", "NCCL-result")
    assert "collective timeout" in describe("nccl-timeout", "NCCL-watchdog")
    assert describe("oom-gpu", None) == BY_CLASS["oom-gpu"].description


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # Source wordings looked up after the held-out measurement (XLA's communicator health
        # check, older JAX's heartbeat termination, a `ckpt` checkpoint directory).
        (
            "INTERNAL: Call to recv failed : Connection reset by peer. Last NCCL error (maybe unrelated): "
            "remote process exited or there was a network error",
            ("nccl-timeout", "NCCL-result"),
        ),
        ("FAILED_PRECONDITION: NcclCommunicator aborted", ("nccl-timeout", "NCCL-xla-comm")),
        (
            "Terminating process because the coordinator detected missing heartbeats. This most likely indicates "
            "that another task died.",
            ("heartbeat-timeout", "HB-unhealthy"),
        ),
        (
            "OSError: [Errno 116] Stale file handle: '/nfs/ckpt/step_400/params'",
            ("checkpoint-fs-error", "CKPT-oserror"),
        ),
    ],
)
def test_source_wordings(line: str, expected: tuple[str, str]) -> None:
    assert rules(line) == [expected]


def fam(
    text: str, *, started: bool = True, first_step: bool = True, after_tb: bool = False
) -> list[tuple[str, str]]:
    return [
        (m.cls, m.rule)
        for m in match_line(
            text, training_started=started, after_traceback=after_tb, first_step_done=first_step
        )
    ]


def test_slurm_time_limit_line_is_no_signature_the_cancel_decides() -> None:
    # Rule CL-SLURM-TIME-LIMIT: the scheduler's cancel, read from the cancel line; never train-timeout.
    line = "slurmstepd: error: *** STEP 7.0 ON n1 CANCELLED AT 2025-01-01T00:00:00 DUE TO TIME LIMIT ***"
    assert fam(line) == []
    assert fam("== Training TIMEOUT (3600s/3600s) ==") == [("train-timeout", "TT-stage")]


@pytest.mark.parametrize(
    "line",
    [
        "srun: error: Node failure on node003",
        "slurmstepd: error: *** STEP 1.0 ON n1 CANCELLED AT 2023-03-06T03:17:51 DUE TO NODE FAILURE, "
        "SEE SLURMCTLD LOG FOR DETAILS ***",
        "slurmd[cn9]: *** JOB 1585974 CANCELLED AT 2016-08-05T16:52:11 DUE TO NODE FAILURE ***",
    ],
)
def test_slurm_node_failure_wordings(line: str) -> None:
    assert fam(line) == [("node-fail", "NODE-slurm-node-failure")]


def test_jax_start_up_deadlines_are_node_fail_not_heartbeat() -> None:
    # Rule CL-INIT: registration / connect deadlines name tasks that never joined.
    registration = (
        "Original error: DEADLINE_EXCEEDED: Barrier timed out. Id: [Init]Wait_for_all_tasks_to_register::0."
    )
    assert fam(registration, started=False) == [("node-fail", "NODE-jax-init")]
    rpc = "while calling /xla.coordination.CoordinationService/RegisterTask:"
    assert fam(rpc, started=False) == [("node-fail", "NODE-jax-init")]
    agent = "Coordination service agent in error status: DEADLINE_EXCEEDED: Deadline Exceeded"
    assert fam(agent, started=False) == [("node-fail", "NODE-jax-init-deadline")]
    barrier = "XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Barrier_id: multihost_broadcast_sync0."
    assert fam(barrier, started=False) == [("node-fail", "NODE-jax-init-deadline")]
    # Once training started the same barrier timeout is the coordination service's (heartbeat row).
    assert fam(barrier, started=True) == [("heartbeat-timeout", "HB-barrier")]
    assert fam(agent, started=True) == []


def test_a_save_barrier_timeout_is_the_checkpoints_at_any_time() -> None:
    # Rule CL-CKPT-ASYNC-TIMEOUT.
    line = (
        "jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. "
        "Id: 0_async_write_complete.0.1. This usually happens because a task triggered the barrier too early"
    )
    for started in (True, False):
        assert fam(line, started=started) == [("checkpoint-fs-error", "CKPT-async-timeout")]
    future = "ChainedFuture completed 0/1 futures but timed out after 1199.96 seconds"
    assert fam(future) == [("checkpoint-fs-error", "CKPT-async-timeout")]
    healthy = "ChainedFuture completed 1/1 futures in 13.37 seconds."
    assert fam(healthy) == []


def test_check_aborts_and_compiler_frames() -> None:
    kept_prefix = (
        "F0000 00:00:1786847906.773812 3801585 layout_assignment.cc:526] Check failed: "
        "!IsCublasLtGemm(*instruction) Gemm rewriting should run after layout assignment"
    )
    assert fam(kept_prefix) == [("xla-compile-fail", "XC-check")]
    stripped = "Check failed: result->children_start_id >= 0 (-1 vs. 0)"
    assert fam(stripped, first_step=False) == [("xla-compile-fail", "XC-check-compile-phase")]
    assert fam(stripped, first_step=True) == []
    frame = "    @     0x7f0e1c0cc4a4  xla::gpu::IrEmitterUnnested::EmitFusion()"
    assert fam(frame) == [("xla-compile-fail", "XC-frame")]
    runtime_frame = "    @     0x7f0e1c0cc4a4  xla::gpu::GpuExecutable::ExecuteAsyncOnStream()"
    assert fam(runtime_frame) == []
    launch = (
        "Status: INTERNAL: Failed to launch ROCm kernel: RepeatBufferKernel with block dimensions: 256x1x1: "
        "hipError_t(303)"
    )
    assert fam(launch) == [("xla-compile-fail", "XC-autotune-launch")]
    picker = (
        "E gemm_algorithm_picker.cc:300] Autotuning: CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure"
    )
    assert ("xla-compile-fail", "XC-autotune-launch") in fam(picker)
    # A kernel launch failure at run time, outside the autotuner, is no compile failure.
    runtime = "INTERNAL: Failed to launch CUDA kernel: fusion_1560 with block dimensions: 160x1x1"
    assert fam(runtime) == []


def test_traceback_header_with_lost_characters_and_logging_stacks() -> None:
    assert fam("raceback (most recent call last):") == [("python-exception", "PY-traceback")]
    assert fam("Stack (most recent call last):") == []
