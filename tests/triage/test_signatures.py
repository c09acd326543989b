"""The signature table: match order, overlaps between rows, and the known-harmless table."""

from __future__ import annotations

import pytest

from jobdiagd.triage.signatures import ALL_CLASSES, SIGNATURES, match_line


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
