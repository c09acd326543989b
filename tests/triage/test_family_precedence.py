"""Precedence rules of issue 16's misread families, on hand-written logs: Slurm node failure
(rule NF-3), Slurm's time limit (rule CL-SLURM-TIME-LIMIT), JAX start-up deadlines (rules CL-INIT,
NF-4, PY-CARRIER), XLA CHECK aborts (families XC-check-compile-phase, XC-frame,
XC-autotune-launch), tracebacks without a header (rule PY-LOST-HEADER) and Orbax save timeouts
(rule CL-CKPT-ASYNC-TIMEOUT). Real wordings of each family are in tests/triage/realworld/.
"""

from __future__ import annotations

import time
from pathlib import Path

from jobdiagd.model.records import Evidence
from jobdiagd.triage import classify as C
from jobdiagd.triage.report import render_markdown
from jobdiagd_sim import lines as L
from tests.triage.test_failure_classes import T0, TASKS, _job, _section, _steps, _summary, _triage


def _at(seconds_after_t0: float, level: str = "I", where: str = "x.cc:1") -> str:
    return L.absl_prefix(T0 + seconds_after_t0, 4242, where, level)


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def _node_exits(codes: dict[int, int]) -> list[str]:
    return [f"{t}: NODE_EXIT host=node00{t + 1} exit={rc}" for t, rc in codes.items()]


def _failed_tail(codes: dict[int, int], rc: int = 1) -> list[str]:
    return [*_node_exits(codes), f"== Training FAILED (exit={rc}, 7300s) ==", *_summary(1, "2h 1m 40s")]


# --- rule NF-3 ----------------------------------------------------------------------------------


def _node_failure_cancel(after_last_step_s: float) -> list[str]:
    body, t_last = _steps(0, 1400)  # the last step at 11:56:45
    cancel_at = _iso(t_last + after_last_step_s)
    return [
        *body,
        "srun: error: Node failure on node003",
        f"slurmstepd: error: *** STEP 4711.0 ON node001 CANCELLED AT {cancel_at} DUE TO NODE FAILURE, "
        "SEE SLURMCTLD LOG FOR DETAILS ***",
        *[f"NODE_EXIT host=node00{i + 1} exit=143" for i in (0, 1, 3)],
        "== Training FAILED (exit=143, 7300s) ==",
        *_summary(143, "2h 1m 40s", "CANCELLED (scancel / SIGTERM)"),
    ]


def test_nf3_slurm_node_failure_after_a_stall_is_node_fail_not_a_hang(tmp_path: Path) -> None:
    r = _triage(_job(tmp_path, _node_failure_cancel(after_last_step_s=330)), "NODE_FAIL")
    assert (r.status, r.primary) == ("cancelled", "node-fail")
    assert "hang" not in r.cls.classes
    assert any("waiting for the failed node" in n for n in r.cls.notes)
    assert r.cls.primary_rule == "NODE-slurm-node-failure"
    assert any("--exclude" in s for s in r.next_steps)
    assert "Node failure on node003" in _section(render_markdown(r), "Evidence")


def test_nf3_an_oom_report_before_the_node_failure_is_the_root_cause() -> None:
    oom = Evidence("oom-host", 10, 0, "m", 2, None, "Out of memory: Killed process 4242 (python3)", 100.0)
    nf = Evidence(
        "node-fail",
        20,
        0,
        "m",
        None,
        None,
        "srun: error: Node failure on node003",
        400.0,
        rule="NODE-slurm-node-failure",
    )
    assert C._slurm_node_failure_primary(C._Candidates([oom], [], [nf])) == "oom-host"
    later = Evidence("oom-host", 30, 0, "m", 2, None, "Out of memory: Killed process 1", 500.0)
    assert C._slurm_node_failure_primary(C._Candidates([later], [], [nf])) == "node-fail"
    assert C._slurm_node_failure_primary(C._Candidates([later], [], [])) is None


def test_nf3_node_failure_outranks_the_heartbeat_timeout_it_caused(tmp_path: Path) -> None:
    body, t_last = _steps(0, 1400)
    hb = [
        f"{t}: {_at(t_last - T0 + 110)}Terminating process because the JAX distributed service detected fatal "
        "errors. absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):"
        for t in (0, 1, 3)
    ]
    tail = _node_failure_cancel(after_last_step_s=330)[len(body) :]
    r = _triage(_job(tmp_path, body + hb + tail), "NODE_FAIL")
    assert r.primary == "node-fail"


# --- rule CL-SLURM-TIME-LIMIT ------------------------------------------------------------------------


def test_time_limit_after_a_stall_is_still_a_hang(tmp_path: Path) -> None:
    body, t_last = _steps(0, 1400)
    tail = [
        f"slurmstepd: error: *** JOB 4711 ON node001 CANCELLED AT {_iso(t_last + 1800)} DUE TO TIME LIMIT ***",
        *[f"NODE_EXIT host=node00{i + 1} exit=143" for i in range(TASKS)],
        "== Training FAILED (exit=143, 7300s) ==",
        *_summary(143, "2h 31m 40s", "CANCELLED (scancel / SIGTERM)"),
    ]
    r = _triage(_job(tmp_path, body + tail), "TIMEOUT")
    assert (r.status, r.primary) == ("cancelled", "hang")
    assert "train-timeout" not in r.cls.classes


# --- rules CL-INIT, NF-4, PY-CARRIER -------------------------------------------------------------------


def _startup_job(tmp: Path, lines: list[str], codes: dict[int, int]) -> Path:
    """A job whose training never passed the barrier: the lines, then the failing tasks' exits."""
    out = tmp / "outputs"
    out.mkdir(exist_ok=True)
    name = "4711-JAX-llama2-70b"
    header = [
        "JOB_ID=4711",
        "JOB_NAME=JAX-llama2-70b",
        f"NNODES={TASKS}",
        f"JOB_NODELIST=node[001-00{TASKS}]",
        'PASSTHROUGH_ARGS="steps=100 enable_checkpointing=false"',
        "== Training BEGIN (timeout=none) ==",
    ]
    (out / f"{name}.log").write_text("\n".join(header + lines + _failed_tail(codes)) + "\n")
    (out / name).mkdir()
    (out / name / "log").symlink_to(f"../{name}.log")
    return out / name


def test_cl_init_registration_deadline_with_node_exits_is_node_fail(tmp_path: Path) -> None:
    lines = [
        "0: Traceback (most recent call last):",
        '0:   File "/deps/MaxText/max_utils.py", line 80, in maybe_initialize_jax_distributed_system',
        "0:     jax.distributed.initialize()",
        "0: jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. "
        "Id: [Init]Wait_for_all_tasks_to_register::0.",
    ]
    r = _triage(_startup_job(tmp_path, lines, {0: 1, 2: 1}), "FAILED")
    assert (r.status, r.primary) == ("failed", "node-fail")
    assert "heartbeat-timeout" not in r.cls.classes
    assert r.cls.stage == "Job start (JAX distributed initialization)"
    assert r.cls.primary_rule == "NODE-jax-init"
    assert any("never registered" in s for s in r.next_steps)


def test_nf4_node_fail_before_stage_fail_whatever_the_line_order(tmp_path: Path) -> None:
    lines = [
        "0: 2024-04-12 23:39:41.656900: E external/xla/xla/pjrt/distributed/client.cc:96] Coordination "
        "service agent in error status: DEADLINE_EXCEEDED: Deadline Exceeded",
    ]
    r = _triage(_startup_job(tmp_path, lines, {0: 1}), "FAILED")
    assert r.primary == "node-fail"
    assert "stage-fail" in r.cls.classes


def test_nf4_a_stage_marker_logged_before_the_node_exits_does_not_win(tmp_path: Path) -> None:
    # A wrapper that flushes its NODE_EXIT line after the batch script printed the stage marker.
    body, _ = _steps(0, 1400)
    tail = [
        "== Training FAILED (exit=1, 7300s) ==",
        "2: NODE_EXIT host=node003 exit=1",
        *_summary(1, "2h 1m 40s"),
    ]
    r = _triage(_job(tmp_path, body + tail), "FAILED")
    assert r.primary == "node-fail"


def test_py_carrier_a_traceback_carrying_a_carrier_is_not_its_own_candidate() -> None:
    tb = Evidence("python-exception", 5, 0, "m", 0, None, "Traceback (most recent call last):", None)
    tb.carries = "node-fail"
    hits = {"python-exception": [tb], "node-fail": [Evidence("node-fail", 9, 0, "m", 0, None, "x", None)]}
    assert C._carried_by_other_carrier(tb, hits)
    assert not C._carried_by_other_carrier(tb, {"python-exception": [tb]})
    tb.carries = "oom-gpu"  # a root carried: the root decides anyway, the traceback stays a candidate
    assert not C._carried_by_other_carrier(tb, {**hits, "oom-gpu": [tb]})


def test_a_barrier_timeout_during_training_stays_a_heartbeat_and_a_save_barrier_a_checkpoint(
    tmp_path: Path,
) -> None:
    body, t_last = _steps(0, 1400)
    save = (
        f"2: {_at(t_last - T0 + 30)}jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. "
        "Id: 0_async_write_complete.0.1400. This usually happens because a task triggered the barrier too early"
    )
    r = _triage(_job(tmp_path, body + [save] + _failed_tail({2: 1})), "FAILED")
    assert r.primary == "checkpoint-fs-error"
    assert "heartbeat-timeout" not in r.cls.classes


# --- xla-compile-fail: CHECK aborts, frames, autotuner launches --------------------------------------


def test_a_check_abort_before_the_first_step_is_a_compile_failure(tmp_path: Path) -> None:
    lines = [
        "0: ====== BARRIER PASSED: Starting training loop ======",
        f"0: {_at(60, 'F', 'shape_tree.cc:54')}Check failed: result->children_start_id >= 0 (-1 vs. 0)",
        "0: *** Check failure stack trace: ***",
        "0:     @     0x7f0e1c0cc4a4  xla::gpu::IrEmitterUnnested::EmitFusion()",
        "0: Fatal Python error: Aborted",
    ]
    r = _triage(_startup_job(tmp_path, lines, {0: 134, 1: 134}), "FAILED")
    assert (r.status, r.primary) == ("failed", "xla-compile-fail")
    assert "signal-kill" not in r.cls.classes


def test_a_check_abort_after_training_progressed_is_no_compile_failure(tmp_path: Path) -> None:
    body, t_last = _steps(0, 1400)
    crash = [
        f"1: {_at(t_last - T0 + 3, 'F', 'shape.h:852')}Check failed: buffer != nullptr",
        "1: *** Check failure stack trace: ***",
    ]
    r = _triage(_job(tmp_path, body + crash + _failed_tail({1: 134}, rc=134)), "FAILED")
    assert r.primary == "node-fail"
    assert "xla-compile-fail" not in r.cls.classes


# --- rule PY-LOST-HEADER -----------------------------------------------------------------------------


def test_frames_and_an_exception_without_their_header_are_a_python_exception(tmp_path: Path) -> None:
    body, _ = _steps(0, 1400)
    tb = [
        '3:   File "/usr/lib/python3.10/multiprocessing/synchronize.py", line 87, in _cleanup',
        "3:     sem_unlink(name)",
        "1: completed eval batch",  # another rank's output interleaved
        "3: FileNotFoundError: [Errno 2] No such file or directory",
    ]
    r = _triage(_job(tmp_path, body + tb + _failed_tail({3: 1})), "FAILED")
    assert r.primary == "python-exception"
    assert "FileNotFoundError" in _section(render_markdown(r), "Evidence")


def test_an_exception_shaped_line_without_frames_is_no_traceback(tmp_path: Path) -> None:
    body, _ = _steps(0, 1400)
    other_task_frame = ['2:   File "x.py", line 1, in f', "3: ValueError: too many dimensions 'str'"]
    r = _triage(_job(tmp_path, body + other_task_frame + _failed_tail({3: 1})), "FAILED")
    assert r.primary == "node-fail"
