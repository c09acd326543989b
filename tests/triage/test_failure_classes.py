"""Failure classes, cancel kinds and cascades on hand-written logs: each test names the rule (docs/rules.md) it holds triage to.

The wording families themselves are checked line by line in tests/rules/test_signatures.py and on real
error text placed in realistic jobs by the corpus test (realworld/test_corpus_classes.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobdiagd.model.triage import TriageResult
from jobdiagd.triage.engine import triage
from jobdiagd.triage.report import render_markdown
from jobdiagd_sim import lines as L

NOW = 2e9
# 2026-06-12 10:00:00 local time: the absl stamps below are on the same calendar.
T0 = time.mktime((2026, 6, 12, 10, 0, 0, 0, 0, -1))
TASKS = 4
AT = "2026-06-12T11:57:00"  # 15 s after the last of 1401 five-second steps: no stall before it


def _steps(first: int, last: int, t0: float = T0, step_s: float = 5.0) -> tuple[list[str], float]:
    out = []
    t = t0
    for s in range(first, last + 1):
        t += step_s
        for task in range(TASKS):
            out.append(
                f"{task}: {L.absl_prefix(t, 1000 + task, 'metric_logger.py:232')}completed step: {s}, "
                f"seconds: {step_s:.3f}, Tokens/s/device: 8600.0, loss: 2.0"
            )
    return out, t


def _summary(rc: int, wall: str, reason: str = "Training FAILED (exit=1)") -> list[str]:
    status = "SUCCESS (exit 0)" if rc == 0 else f"FAILED (exit {rc}) — {reason}"
    return [
        "========================== JOB SUMMARY ==========================",
        "  Job:    4711 (JAX-llama2-70b)",
        f"  Wall:   {wall}",
        f"  Status: {status}",
        "=================================================================",
    ]


def _job(tmp: Path, body: list[str], *, steps: int = 5000) -> Path:
    out = tmp / "outputs"
    out.mkdir(exist_ok=True)
    name = "4711-JAX-llama2-70b"
    header = [
        "JOB_ID=4711",
        "JOB_NAME=JAX-llama2-70b",
        f"NNODES={TASKS}",
        f"JOB_NODELIST=node[001-00{TASKS}]",
        f'PASSTHROUGH_ARGS="steps={steps} enable_checkpointing=false"',
        "== Training BEGIN (timeout=none) ==",
        "0: ====== BARRIER PASSED: Starting training loop ======",
    ]
    (out / f"{name}.log").write_text("\n".join(header + body) + "\n")
    (out / name).mkdir()
    (out / name / "log").symlink_to(f"../{name}.log")
    return out / name


def _triage(job: Path, state: str | None) -> TriageResult:
    return triage(job, now=NOW, slurm_state=state)


def _section(md: str, title: str) -> str:
    start = md.index(f"### {title}")
    end = md.find("\n### ", start + 4)
    return md[start : end if end >= 0 else len(md)]


def _cancel_tail(reason: str = "", at: str = "2026-06-12T12:00:00") -> list[str]:
    return [
        f"slurmstepd: error: *** JOB 4711 ON node001 CANCELLED AT {at}{reason} ***",
        *[f"NODE_EXIT host=node00{i + 1} exit=143" for i in range(TASKS)],
        "== Training FAILED (exit=143, 7300s) ==",
        *_summary(143, "2h 1m 40s", "CANCELLED (scancel / SIGTERM)"),
    ]


def test_cancelled_primary_is_in_the_json_failures_with_its_line(tmp_path: Path) -> None:
    # Runbook output format: evidence for the primary failure; the JSON failures list is the
    # evidence, so a cancelled job must list the line that cancelled it.
    body, _ = _steps(0, 1400)  # the last step at 11:56:45
    r = _triage(_job(tmp_path, body + _cancel_tail(at=AT)), "CANCELLED")
    assert (r.status, r.primary) == ("cancelled", "cancelled")
    failures = r.to_dict()["failures"]
    assert isinstance(failures, list)
    cancel = [f for f in failures if f["class"] == "cancelled"]
    assert cancel and f"CANCELLED AT {AT}" in str(cancel[0]["raw"])


def test_cancelled_without_a_slurm_line_quotes_the_summary_status(tmp_path: Path) -> None:
    body, _ = _steps(0, 1400)
    tail = [line for line in _cancel_tail(at=AT) if "slurmstepd" not in line]
    r = _triage(_job(tmp_path, body + tail), "CANCELLED")
    assert r.primary == "cancelled"
    cancel = [e for e in r.cls.evidence if e.cls == "cancelled"]
    assert cancel and "Status: FAILED (exit 143)" in cancel[0].text


def test_time_limit_cancel_is_a_scheduler_cancel_not_the_train_timeout_stage(tmp_path: Path) -> None:
    # Rule CL-SLURM-TIME-LIMIT: Slurm's --time ran out; train-timeout is the job script's own stage.
    body, _ = _steps(0, 1400)
    r = _triage(_job(tmp_path, body + _cancel_tail(" DUE TO TIME LIMIT", AT)), "TIMEOUT")
    assert (r.status, r.primary) == ("cancelled", "cancelled")
    assert "train-timeout" not in r.cls.classes
    assert r.cls.stage == "Slurm time limit (--time)"
    md = render_markdown(r)
    assert "time limit (--time)" in _section(md, "What happened")
    assert "scancel" not in _section(md, "What happened")
    assert "DUE TO TIME LIMIT" in _section(md, "Evidence")
    assert any("--time" in s for s in r.next_steps)


def test_preemption_cancel_is_a_scheduler_cancel(tmp_path: Path) -> None:
    body, _ = _steps(0, 1400)
    r = _triage(_job(tmp_path, body + _cancel_tail(" DUE TO PREEMPTION", AT)), "PREEMPTED")
    assert (r.status, r.primary) == ("cancelled", "cancelled")
    assert "scheduler (preemption)" in _section(render_markdown(r), "What happened")


def test_long_silence_before_a_cancel_is_in_the_projection(tmp_path: Path) -> None:
    # Runbook, cancelled: "Check training progress projection — if the last step is far behind
    # the expected step, the real issue is a hang killed by scancel".
    body, t = _steps(0, 60)  # last step at 10:05:05, cancel at 12:00:00
    r = _triage(_job(tmp_path, body + _cancel_tail()), "CANCELLED")
    assert r.primary == "hang"
    proj = _section(render_markdown(r), "Training progress projection")
    row = next(line for line in proj.splitlines() if line.startswith("| Silence before the cancel"))
    assert "1h 54m 55s after step 60" in row and "training had stopped" in row


def test_nccl_error_is_described_as_an_error_not_a_collective_timeout(tmp_path: Path) -> None:
    body, _ = _steps(0, 40)
    body += [
        "2: INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:305: NCCL operation "
        "ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled system error "
        "(run with NCCL_DEBUG=INFO for details).",
        "NODE_EXIT host=node003 exit=1",
        "== Training FAILED (exit=1, 400s) ==",
        *_summary(1, "6m 40s"),
    ]
    r = _triage(_job(tmp_path, body), "FAILED")
    assert r.primary == "nccl-timeout"  # the class for NCCL errors (rule CL-NCCL-TIMEOUT)
    what = _section(render_markdown(r), "What happened")
    assert "NCCL/RCCL error" in what and "collective timeout" not in what
    assert r.cls.primary_rule == "NCCL-xla-op"


def test_leader_task_died_after_an_oom_is_in_the_cascade(tmp_path: Path) -> None:
    # Heartbeat checklist item 2: a real error on the accused task before the heartbeat message
    # makes the heartbeat timeout a consequence. The coordination leader is task 0.
    body, t = _steps(0, 40)
    lost = (
        "F0612 10:04:00.594200 1044529 client.h:77] Terminating process because the JAX distributed service "
        "detected fatal errors. This most likely indicates that another task died; see the other task logs for "
        "more details. absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the leader "
        "task was preempted/died/restarted unexpectedly or this task is experiencing network issues."
    )
    body += [
        "slurmstepd: error: Detected 1 oom_kill event in StepId=4711.0. Some of the step tasks have been OOM Killed.",
        "srun: error: node001: task 0: Out Of Memory",
        *[f"{i}: {lost}" for i in (1, 2, 3)],
        *[f"NODE_EXIT host=node00{i + 1} exit=134" for i in (1, 2, 3)],
        "== Training FAILED (exit=137, 300s) ==",
        *_summary(1, "5m 0s"),
    ]
    r = _triage(_job(tmp_path, body), "OUT_OF_MEMORY")
    assert r.primary == "oom-host"
    hb = r.cls.heartbeat
    assert hb is not None and hb.accused_tasks == [0] and hb.verdict == "true-positive"
    assert "heartbeat-timeout" in r.cls.classes
    assert "consequence" in _section(render_markdown(r), "What happened")


def test_traceback_evidence_quotes_its_exception_line(tmp_path: Path) -> None:
    # Runbook python-exception: "read the traceback for details" — the report quotes the
    # exception the traceback ends in, not only its header.
    body, _ = _steps(0, 40)
    frames = [("/opt/maxtext/MaxText/train.py", 666, "train_loop", "state, metrics = p_train_step(state)")]
    body += [f"1: {ln}" for ln in L.traceback_block(frames, "RuntimeError: Invalid opaque object size")]
    body += ["NODE_EXIT host=node002 exit=1", "== Training FAILED (exit=1, 300s) ==", *_summary(1, "5m 0s")]
    r = _triage(_job(tmp_path, body), "FAILED")
    assert r.primary == "python-exception"
    assert "RuntimeError: Invalid opaque object size" in _section(render_markdown(r), "Evidence")


def test_srun_killed_without_a_summary_is_unknown_death_evidence(tmp_path: Path) -> None:
    # Runbook, unknown-death checklist item 1: "Check for OOM-kill signatures — Killed ...".
    body, _ = _steps(0, 40)
    body += [f"srun: error: node00{i + 1}: task {i}: Killed" for i in range(TASKS)]
    r = _triage(_job(tmp_path, body), "FAILED")
    assert (r.status, r.primary) == ("unknown-death", "unknown-death")
    assert "node-fail" not in r.cls.classes
    failures = r.to_dict()["failures"]
    assert isinstance(failures, list)
    assert [f["text"] for f in failures if f["class"] == "unknown-death"][
        0
    ] == "srun: error: node001: task 0: Killed"


def test_srun_killed_with_a_summary_is_a_node_failure(tmp_path: Path) -> None:
    # Runbook § Diagnosing node failures: "Exit 137 (128+9) = SIGKILL (OOM or external kill)".
    body, _ = _steps(0, 40)
    body += [
        "srun: error: node002: task 1: Killed",
        "== Training FAILED (exit=137, 300s) ==",
        *_summary(1, "5m 0s"),
    ]
    r = _triage(_job(tmp_path, body), "FAILED")
    assert r.primary == "node-fail"


def test_the_abort_after_a_compiler_fatal_is_its_consequence(tmp_path: Path) -> None:
    body = [
        "0: LLVM ERROR: Cannot select: 0x587b5370: bf16 = uint_to_fp # D:1 0x5335dc60",
        "0: Fatal Python error: Aborted",
        "0: Aborted (core dumped)",
        "NODE_EXIT host=node001 exit=134",
        "== Training FAILED (exit=134, 200s) ==",
        *_summary(1, "3m 20s"),
    ]
    r = _triage(_job(tmp_path, body), "FAILED")
    assert r.primary == "xla-compile-fail"
    assert "signal-kill" not in r.cls.classes


def test_ray_memory_monitor_kill_is_host_oom_not_an_actor_failure(tmp_path: Path) -> None:
    body, _ = _steps(0, 40)
    body += [
        "1: ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.",
        "1: The actor is dead because its worker process has died. Worker exit type: USER_ERROR Worker exit "
        "detail: Task was killed due to the node running low on memory.",
        "NODE_EXIT host=node002 exit=1",
        "== Training FAILED (exit=1, 300s) ==",
        *_summary(1, "5m 0s"),
    ]
    r = _triage(_job(tmp_path, body), "FAILED")
    assert r.primary == "oom-host"
    assert "oom-gpu" not in r.cls.classes


def test_allocator_warnings_that_say_not_a_failure_keep_a_job_healthy(tmp_path: Path) -> None:
    body, _ = _steps(0, 40)
    body.insert(
        10,
        "1: W0612 10:00:30.086788 1001 bfc_allocator.cc:310] Allocator (GPU_0_bfc) ran out of memory trying to "
        "allocate 3.37GiB with freed_by_count=0. The caller indicates that this is not a failure, but this may "
        "mean that there could be performance gains if more memory were available.",
    )
    r = _triage(_job(tmp_path, body + _summary(0, "4m 0s"), steps=41), "COMPLETED")
    assert (r.status, r.primary, r.cls.classes) == ("completed", None, [])


def _projection(r: TriageResult) -> dict[str, str]:
    out = {}
    for ln in _section(render_markdown(r), "Training progress projection").splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if len(cells) == 2:
            out[cells[0]] = cells[1]
    return out


def test_progress_lost_on_a_long_run_is_the_exact_summed_time(tmp_path: Path) -> None:
    # Runbook step 5: "Progress lost on failure ... For runs that never reached checkpoint_period,
    # all training steps are lost"; training time is "actually compute the sum". Over 5000
    # steps the kept step records are a sample; the lost time must still be all of it.
    body, _ = _steps(0, 4999)
    r = _triage(_job(tmp_path, body, steps=20000), "FAILED")  # no summary: died
    rows = _projection(r)
    assert rows["Total training time (summed)"] == "6h 56m 40s"
    assert rows["Progress lost"] == "all — no periodic ckpt (5000 steps, 6h 56m 40s)"


def test_progress_lost_since_a_distant_checkpoint_is_not_a_fraction_of_it(tmp_path: Path) -> None:
    body, _ = _steps(0, 4999)
    job = _job(tmp_path, body, steps=20000)
    log = job.parent / f"{job.name}.log"
    log.write_text(
        log.read_text().replace(
            "enable_checkpointing=false", "enable_checkpointing=true checkpoint_period=3000"
        )
    )
    r = _triage(job, "FAILED")
    assert (r.progress.last_checkpoint_step, r.progress.progress_lost_steps) == (3000, 1999)
    assert r.progress.progress_lost_s is not None
    assert abs(r.progress.progress_lost_s - 1999 * 5.0) < 5.0


def _long_named_job(tmp: Path, *, link: bool) -> Path:
    """A job directory whose name is 253 bytes: its `<name>.log` sibling (257 bytes) cannot exist."""
    out = tmp / "outputs"
    out.mkdir(exist_ok=True)
    name = "4711-JAX-llama2-70b-" + "steps_100-per_device_batch_size_2-" * 7
    name = name[:253]
    d = out / name
    d.mkdir()
    if link:
        (d / "log").symlink_to(f"../{name}.log")
    return d


def test_a_job_name_near_the_255_byte_limit_is_a_clear_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Runbook prolog-kill-no-log: "--output path exceeds ext4's 255-byte per-path-segment limit
    # (long JOB_NAME)". Looking for the `.log` sibling raised ENAMETOOLONG and a traceback.
    from jobdiagd.cli import main

    d = _long_named_job(tmp_path, link=True)
    assert main(["triage", str(d), "--no-slurm"]) == 0
    out = capsys.readouterr().out
    assert "**Primary failure:** prolog-kill-no-log" in out
    assert "257 bytes" in out and "longer than the filesystem allows" in out
    assert main(["backtest", str(d)]) == 0
    assert main(["triage", "--all", "--outputs", str(d.parent), "--no-slurm", "--json"]) == 0
    assert "prolog-kill-no-log" in capsys.readouterr().out


def test_an_empty_long_named_job_dir_is_a_prolog_kill(tmp_path: Path) -> None:
    d = _long_named_job(tmp_path, link=False)
    r = triage(d, now=NOW)
    assert r.primary == "prolog-kill-no-log"
    assert any("longer than the filesystem allows" in n for n in r.cls.notes)


HARMLESS_LINES = [
    # The known-harmless table (rule HL-1).
    "E0612 10:01:00.000000 1001 cuda_driver.cc:152] Failed call to cuInit: UNKNOWN ERROR (303)",
    "I0612 10:01:00.000000 1001 xla_bridge.py:907] Unable to initialize backend 'cuda': INTERNAL: CUDA error: "
    "Failed call to cuInit: UNKNOWN ERROR (303)",
    "node001:41778:41778 [0] NCCL WARN MSCCL++: Feature not enabled. ENABLE_MSCCLPP must be defined at "
    "compile-time to enable this feature.",
    "Token indices sequence length is longer than the specified maximum sequence length for this model "
    "(131072 > 8192). Running this sequence through the model will result in indexing errors",
    "OCI runtime exec failed: exec failed: unable to start container process: error executing setns process: "
    "exit status 1: unknown",
    "[exec] docker exec failed for 1a29686a439f, falling back to host-level kill",
    "[cgroup] Sent SIGKILL to 0/0 processes",
    "W0612 10:01:00.000000 1001 topology.cc:1011] Cannot read CPU core 170",
    "I0612 10:01:00.000000 1001 tpu_initializer_helper.cc:127] No hardware is found. Using default TPU version: "
    "jellyfish",
    "I0612 10:01:00.000000 1001 trace.cc:61] No device identifiers found",
    "I0612 10:01:00.000000 1001 pjrt_api.cc:79] Enabling PjRt/TPU event dependency logging",
    "I0612 10:01:00.000000 1001 init-domain.cc:63] Fiber init: default domain = futex",
    'Error response from daemon: cannot remove container "/maxtext_5c1041b552ef": could not kill container: '
    "tried to kill container, but did not receive an exit event",
    # Harmless families of the same kind: allocator retries, shutdown noise, INFO-level NCCL.
    "W0612 10:01:00.000000 1001 bfc_allocator.cc:310] Allocator (GPU_0_bfc) ran out of memory trying to "
    "allocate 3.37GiB with freed_by_count=0. The caller indicates that this is not a failure, but this may "
    "mean that there could be performance gains if more memory were available.",
    "node001:1:2 [0] NCCL INFO Call to connect returned Connection timed out, retrying",
    "E0612 10:01:00.000000 1001 cuda_timer.cc:86] Delay kernel timed out: measured time has sub-optimal "
    "accuracy. There may be a missing warmup execution, please investigate in Nsight Systems.",
    "W0612 10:01:00.000000 1001 hlo_rematerialization.cc:3183] Can't reduce memory use below 10.64GiB "
    "(11428802214 bytes) by rematerialization; only reduced to 71.27GiB (76523901244 bytes)",
    # Words near the signature wordings in healthy output.
    "NCCL_IB_TIMEOUT=22",
    "NCCL_ASYNC_ERROR_HANDLING=1",
    "Config param checkpoint_dir: /outputs/llama2-70b/checkpoints",
    "I0612 10:01:00.000000 1001 checkpoint_manager.py:1] Saved a checkpoint at step 40.",
]


def test_a_healthy_job_with_every_harmless_line_reports_no_failure(tmp_path: Path) -> None:
    # Runbook § Known-harmless log entries: "Do not classify them as failures or mention them".
    body, _ = _steps(0, 59)
    for i, line in enumerate(HARMLESS_LINES):
        body.insert(8 * i + 20, f"{i % TASKS}: {line}")
    body += ["== Training END (300s) ==", *_summary(0, "5m 10s")]
    r = _triage(_job(tmp_path, body, steps=60), "COMPLETED")
    assert (r.status, r.primary, r.cls.classes, r.cls.evidence) == ("completed", None, [], [])
    assert r.to_dict()["failures"] == []


def test_srun_killed_with_an_oom_report_is_the_oom_kill(tmp_path: Path) -> None:
    # Runbook oom-host: "Killed (from OOM killer), oom-kill"; the Killed line is its evidence,
    # not a separate node failure.
    body, _ = _steps(0, 40)
    body += [
        "slurmstepd: error: Detected 1 oom_kill event in StepId=4711.0. Some of the step tasks have been OOM Killed.",
        "srun: error: node002: task 1: Killed",
        "== Training FAILED (exit=137, 300s) ==",
        *_summary(1, "5m 0s"),
    ]
    r = _triage(_job(tmp_path, body), "OUT_OF_MEMORY")
    assert r.primary == "oom-host" and "node-fail" not in r.cls.classes
    assert "srun: error: node002: task 1: Killed" in _section(render_markdown(r), "Evidence")
