"""Status, cancel cascades, soft success, heartbeat verdicts and progress rules on hand-written logs.

Each case is one the engine once got wrong; each test names the rule (docs/rules.md) it holds
the engine to.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from jobdiagd.cli import main
from jobdiagd.model.triage import TriageResult
from jobdiagd.triage.engine import triage
from jobdiagd.triage.report import render_markdown
from jobdiagd.triage.resolve import ResolveError, list_jobs
from jobdiagd_sim import lines as L

NOW = 2e9
# 2026-06-12 10:00:00 local time: the absl stamps below are on the same calendar.
T0 = time.mktime((2026, 6, 12, 10, 0, 0, 0, 0, -1))
TASKS = 4


def _stamp(t: float, tid: int = 1000, src: str = "metric_logger.py:232", level: str = "I") -> str:
    return L.absl_prefix(t, tid, src, level)


def _steps(first: int, last: int, t0: float = T0, step_s: float = 5.0) -> tuple[list[str], float]:
    out = []
    t = t0
    for s in range(first, last + 1):
        t += step_s
        for task in range(TASKS):
            out.append(
                f"{task}: {_stamp(t, 1000 + task)}completed step: {s}, seconds: {step_s:.3f}, "
                f"Tokens/s/device: 8600.0, loss: 2.0"
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


def _job(tmp: Path, body: list[str], *, steps: int = 100, name: str = "4711-JAX-llama2-70b") -> Path:
    out = tmp / "outputs"
    out.mkdir(exist_ok=True)
    header = [
        "JOB_ID=4711",
        "JOB_NAME=JAX-llama2-70b",
        f"NNODES={TASKS}",
        f"JOB_NODELIST=node[001-00{TASKS}]",
        f'PASSTHROUGH_ARGS="steps={steps} enable_checkpointing=true checkpoint_period=50"',
        "== Training BEGIN (timeout=none) ==",
    ]
    (out / f"{name}.log").write_text("\n".join(header + body) + "\n")
    (out / name).mkdir()
    (out / name / "log").symlink_to(f"../{name}.log")
    return out / name


def _triage(job: Path, state: str) -> TriageResult:
    return triage(job, now=NOW, slurm_state=state)


def test_errors_printed_after_the_cancel_are_not_its_cause(tmp_path: Path) -> None:
    # Runbook, cancelled: "Check for *preceding* errors (NCCL, OOM, heartbeat)".
    body, t = _steps(0, 60)
    body += [
        "slurmstepd: error: *** JOB 4711 ON node001 CANCELLED AT 2026-06-12T10:05:07 ***",
        "1: node002:81234:81502 [2] misc/socket.cc:47 NCCL WARN socketProgressOpt: Call to recv from "
        "10.0.0.3<47134> failed : Connection reset by peer",
        "2: Traceback (most recent call last):",
        "2: KeyboardInterrupt",
        "0: [Node 3] Actor failed: ray.exceptions.ActorDiedError: The actor died unexpectedly.",
        *[f"NODE_EXIT host=node00{i + 1} exit=143" for i in range(TASKS)],
        "== Training FAILED (exit=143, 305s) ==",
        *_summary(143, "5m 10s", "CANCELLED (scancel / SIGTERM)"),
    ]
    r = _triage(_job(tmp_path, body), "CANCELLED")
    assert (r.status, r.primary) == ("cancelled", "cancelled")
    assert any("after the cancel" in n for n in r.cls.notes)
    assert not any("scancel" in s for s in r.next_steps)  # the job is over


def test_an_oom_before_the_cancel_stays_the_cause(tmp_path: Path) -> None:
    body, t = _steps(0, 60)
    body += [
        "2: " + L.xla_oom(2 << 30),
        "slurmstepd: error: *** JOB 4711 ON node001 CANCELLED AT 2026-06-12T10:05:07 ***",
        *_summary(143, "5m 10s", "CANCELLED (scancel / SIGTERM)"),
    ]
    r = _triage(_job(tmp_path, body), "CANCELLED")
    assert (r.status, r.primary) == ("cancelled", "oom-gpu")


def _final_step_then(tmp: Path, tail: list[str], rc: int) -> TriageResult:
    body, _ = _steps(0, 99)
    return _triage(_job(tmp, body + tail + _summary(rc, "9m 0s")), "FAILED")


def test_soft_success_a_is_one_rank_exiting_1(tmp_path: Path) -> None:
    r = _final_step_then(
        tmp_path, ["NODE_EXIT host=node003 exit=1", "== Training FAILED (exit=1, 520s) =="], 1
    )
    assert (r.status, r.primary, r.cls.soft_success_variant) == ("completed", "soft-success", "a")


def test_every_rank_failing_the_final_checkpoint_is_not_a_soft_success(tmp_path: Path) -> None:
    # Runbook: soft-success needs one of three signatures; (a) is a *single* rank exiting 1.
    ckpt = "ValueError: Training stopped: Checkpointing failed. [Errno 2] No such file or directory"
    tail = [f"{i}: {ckpt}" for i in range(TASKS)]
    tail += [f"NODE_EXIT host=node00{i + 1} exit=1" for i in range(TASKS)]
    r = _final_step_then(tmp_path, [*tail, "== Training FAILED (exit=1, 520s) =="], 1)
    assert (r.status, r.primary) == ("failed", "checkpoint-fs-error")


def test_every_rank_segfaulting_after_the_last_step_is_not_a_soft_success(tmp_path: Path) -> None:
    tail = [f"srun: error: node00{i + 1}: task {i}: Segmentation fault (core dumped)" for i in range(TASKS)]
    tail += [f"NODE_EXIT host=node00{i + 1} exit=139" for i in range(TASKS)]
    r = _final_step_then(tmp_path, [*tail, "== Training FAILED (exit=1, 520s) =="], 1)
    # srun's "Segmentation fault" is a signal-kill (rule CL-SIGNAL-KILL: "killed by signal (SIGSEGV ...)"),
    # which the table ranks above node-fail; the NODE_EXIT 139 lines are its carriers.
    assert (r.status, r.primary) == ("failed", "signal-kill")
    assert "node-fail" in r.cls.classes
    assert r.cls.stage == "Training"  # from `== Training FAILED`, not n/a


def test_exit_130_at_the_last_step_is_a_cancel(tmp_path: Path) -> None:
    # Runbook: soft-success is exit 1 or 143; exit 130 or 143 -> cancelled otherwise.
    r = _final_step_then(tmp_path, [], 130)
    assert r.status == "cancelled" and r.primary == "cancelled"


def test_sigkill_on_the_accused_task_makes_the_heartbeat_a_true_positive(tmp_path: Path) -> None:
    # Runbook, heartbeat item 2: "... or SIGKILL on the accused tasks before the heartbeat message".
    body, t = _steps(0, 60)
    body.append("srun: error: node004: task 3: Killed")
    body += [f"0: {x}" for x in L.heartbeat_block(t + 100, 1000, [3])]
    body += ["NODE_EXIT host=node001 exit=134", "NODE_EXIT host=node004 exit=137"]
    body += ["== Training FAILED (exit=1, 420s) ==", *_summary(1, "7m 0s")]
    r = _triage(_job(tmp_path, body), "FAILED")
    hb = r.cls.heartbeat
    assert hb is not None and hb.verdict == "true-positive" and hb.accused_tasks == [3]
    assert hb.earlier_error is not None and hb.earlier_error.task == 3
    assert r.primary == "node-fail"


def test_a_heartbeat_without_an_earlier_error_stays_a_false_positive(tmp_path: Path) -> None:
    body, t = _steps(0, 60)
    body += [f"0: {x}" for x in L.heartbeat_block(t + 20, 1000, [3])]
    body += ["== Training FAILED (exit=1, 420s) ==", *_summary(1, "7m 0s")]
    r = _triage(_job(tmp_path, body), "FAILED")
    assert r.primary == "heartbeat-timeout"
    assert r.cls.heartbeat is not None and r.cls.heartbeat.verdict == "false-positive"


def test_k8s_rank_traceback_before_the_heartbeat_is_the_cause(tmp_path: Path) -> None:
    # Runbook: on k8s read rank-N.log for the failing rank; an earlier error there is the root cause.
    out = tmp_path / "outputs"
    out.mkdir()
    name = "k8s-20261128-100000-475e-JAX-llama2-70b"
    d = out / name
    d.mkdir()
    steps = [f"completed step: {s}, seconds: 5.000, loss: 2.0" for s in range(41)]
    main_log = ["NNODES=4", 'PASSTHROUGH_ARGS="steps=100"', *steps, *L.heartbeat_block(T0 + 400, 1, [3])]
    (out / f"{name}.log").write_text("\n".join(main_log) + "\n")
    (d / "log").symlink_to(f"../{name}.log")
    rank3 = [
        *steps,
        "Traceback (most recent call last):",
        '  File "train.py", line 9',
        "ValueError: bad batch",
    ]
    (d / "rank-3.log").write_text("\n".join(rank3) + "\n")
    r = triage(d, now=NOW, slurm_state="FAILED")
    assert r.primary == "python-exception"
    assert r.cls.heartbeat is not None and r.cls.heartbeat.verdict == "true-positive"


def test_a_slow_start_is_not_a_hang(tmp_path: Path) -> None:
    # 45 min of dated restore/compile before the first step, healthy steps, then scancel with no
    # dated line after the last step: the wall-time gap is the start-up, not a stall.
    body = [f"0: {_stamp(T0, src='checkpointing.py:120')}restoring from this run's directory step 200"]
    steps, t = _steps(201, 260, t0=T0 + 2700)
    body += steps + [*_summary(143, "50m 5s", "CANCELLED (scancel / SIGTERM)")]
    r = _triage(_job(tmp_path, body, steps=1000), "CANCELLED")
    assert (r.status, r.primary) == ("cancelled", "cancelled")


def test_a_signature_at_the_end_of_a_huge_line_is_found(tmp_path: Path) -> None:
    body, _ = _steps(0, 20)
    body.append(
        "0: jax.errors.JaxRuntimeError: "
        + "x" * 100_000
        + " RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2.00GiB."
    )
    body += ["== Training FAILED (exit=1, 120s) ==", *_summary(1, "2m 0s")]
    r = _triage(_job(tmp_path, body), "FAILED")
    assert r.primary == "oom-gpu"


@pytest.mark.parametrize("kind", ["loop", "dir"])
def test_a_broken_log_link_is_a_clear_error(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "outputs" / "4712-JAX-x"
    d.mkdir(parents=True)
    if kind == "loop":
        (d / "log").symlink_to("log")
    else:
        (tmp_path / "outputs" / "elsewhere").mkdir()
        (d / "log").symlink_to("../elsewhere")
    with pytest.raises(ResolveError):
        triage(d, now=NOW)
    assert main(["triage", str(d), "--no-slurm"]) == 2
    err = capsys.readouterr().err
    assert "log" in err and "Traceback" not in err


def test_the_saves_in_the_log_give_the_checkpoint_period(tmp_path: Path) -> None:
    # enable_checkpointing=true, no period printed, saves every 50 steps: the spikes at k*50 are
    # the checkpoint pattern, not a TGS slide; progress lost is counted from step 150.
    body: list[str] = []
    t = T0
    for s in range(160):
        secs = 9.0 if s % 50 in (0, 1) and s > 0 else 5.0
        t += secs
        tgs = 8000.0 * 5.0 / secs
        body.append(
            f"0: {_stamp(t)}completed step: {s}, seconds: {secs:.3f}, Tokens/s/device: {tgs:.1f}, loss: 2.0"
        )
        if s % 50 == 0 and s > 0:
            body.append(f"0: {_stamp(t, src='checkpointing.py:80')}Saved a checkpoint at step {s}.")
    body += ["0: Traceback (most recent call last):", "0: ValueError: boom", *_summary(1, "14m 0s")]
    out = tmp_path / "outputs"
    out.mkdir()
    name = "4720-JAX-llama2-70b"
    header = ["JOB_ID=4720", "NNODES=1", 'PASSTHROUGH_ARGS="steps=1000 enable_checkpointing=true"']
    (out / f"{name}.log").write_text("\n".join(header + body) + "\n")
    (out / name).mkdir()
    (out / name / "log").symlink_to(f"../{name}.log")
    r = triage(out / name, now=NOW, slurm_state="FAILED")
    assert r.ckpt.period == 50
    assert r.progress.last_checkpoint_step == 150 and r.progress.progress_lost_steps == 9
    assert not r.tgs.degraded and r.tgs.pattern == "periodic"
    assert r.progress.step_time_s == 5.0


def test_json_is_strict_with_nan_and_inf_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = [
        f"0: {_stamp(T0 + 5 * s)}completed step: {s}, seconds: 5.000, Tokens/s/device: inf, loss: nan"
        for s in range(30)
    ]
    job = _job(tmp_path, [*body, *_summary(0, "3m 0s")])
    assert main(["triage", str(job), "--json", "--no-slurm", "--now", str(NOW)]) == 0
    text = capsys.readouterr().out
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


def test_undated_steps_are_dated_from_the_barrier(tmp_path: Path) -> None:
    # print-era step lines; the BARRIER PASSED line is dated. 100 steps x 5 s after it.
    barrier = f"0: {_stamp(T0, src='train.py:906')}====== BARRIER PASSED: Starting training loop ======"
    body = [barrier] + [
        f"{task}: completed step: {s}, seconds: 5.000, Tokens/s/device: 8600.0, loss: 2.0"
        for s in range(100)
        for task in range(TASKS)
    ]
    job = _job(tmp_path, body)
    last = T0 + 500
    hanging = triage(job, now=last + 3 * 3600, slurm_state="RUNNING")
    assert (hanging.status, hanging.primary) == ("hanging", "hang")
    assert hanging.progress.expected_step_now == 99 + (3 * 3600) // 5
    assert not any(step.startswith("If RAY=1") for step in hanging.next_steps)  # a RAY=0 job
    assert any(step.startswith("Kill the job") for step in hanging.next_steps)  # still live
    running = triage(job, now=last + 60, slurm_state="RUNNING")
    assert running.status == "running"
    assert "expected None" not in render_markdown(running)


def test_all_skips_empty_dirs_not_named_like_jobs(tmp_path: Path) -> None:
    root = tmp_path / "outputs"
    (root / "llama3.1-70b").mkdir(parents=True)  # a shared checkpoint dir, empty for now
    (root / "4730-JAX-x").mkdir()  # an empty job dir: prolog kill
    refs = list_jobs(root)
    assert [(r.job_id, r.problem) for r in refs] == [("4730", "prolog-kill-no-log")]


def test_one_bad_path_does_not_hide_the_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body, _ = _steps(0, 20)
    job = _job(tmp_path, [*body, *_summary(0, "2m 0s")])
    rc = main(["triage", str(job), str(tmp_path / "missing.log"), "--no-slurm", "--now", str(NOW)])
    out, err = capsys.readouterr()
    assert rc == 2 and "missing.log" in err and "4711" in out


def test_a_restart_inside_the_log_is_a_new_run_and_every_step_line_is_summed(tmp_path: Path) -> None:
    # steps 0-80 at 5 s, then the job restores from 50 and re-runs 51-119 at 6 s.
    first, t = _steps(0, 80)
    restore = f"0: {_stamp(t + 60, src='checkpointing.py:120')}restoring from this run's directory step 50"
    second, _ = _steps(51, 119, t0=t + 120, step_s=6.0)
    job = _job(tmp_path, [*first, restore, *second, *_summary(0, "25m 0s")], steps=120)
    r = triage(job, now=NOW, slurm_state="COMPLETED")
    p = r.progress
    assert (p.start, p.restored_from_step, p.first_step, p.last_step) == ("restored", 50, 51, 119)
    assert p.train_time_s == 81 * 5.0 + 69 * 6.0  # every completed step line of one task
    assert p.step_time_s == 6.0  # this run's steady state, not the first run's
    assert any("restarted within this log" in n for n in r.cls.notes)
    assert r.status == "completed" and not r.tgs.degraded


def test_an_interleaved_task_prefix_does_not_make_up_a_step_number(tmp_path: Path) -> None:
    # srun -u: task 0's "completed step: 9" runs into task 9's "9: I1128 ..." prefix.
    body, t = _steps(0, 40)
    body.insert(40, "0: " + _stamp(T0 + 46) + "completed step: 99: " + _stamp(T0 + 46) + "x")
    body += ["0: Traceback (most recent call last):", "0: ValueError: boom", *_summary(1, "4m 0s")]
    r = _triage(_job(tmp_path, body), "FAILED")
    assert r.progress.last_step == 40 and r.status == "failed" and r.primary == "python-exception"


def test_a_requeued_job_is_triaged_on_its_last_run(tmp_path: Path) -> None:
    run1, t = _steps(0, 60)
    run1 += [
        "slurmstepd: error: *** JOB 4711 ON node001 CANCELLED AT 2026-06-12T10:05:07 DUE TO PREEMPTION ***"
    ]
    run1 += _summary(143, "5m 10s", "CANCELLED (scancel / SIGTERM)")
    header2 = ["JOB_ID=4711", "JOB_NAME=JAX-llama2-70b", "NNODES=4", "JOB_NODELIST=node[005-008]"]
    restore = f"0: {_stamp(t + 600, src='checkpointing.py:120')}restoring from this run's directory step 50"
    run2, t2 = _steps(51, 80, t0=t + 660)
    job = _job(tmp_path, [*run1, *header2, restore, *run2])
    r = triage(job, now=t2 + 20, slurm_state="RUNNING")
    assert (r.status, r.primary) == ("running", None)
    assert r.nodes[0] == "node005" and r.progress.first_step == 51 and r.progress.start == "restored"
    assert any("earlier run" in n for n in r.cls.notes)


def test_absl_stamps_cross_new_year_after_a_dated_first_line(tmp_path: Path) -> None:
    dec31 = time.mktime((2026, 12, 31, 23, 58, 0, 0, 0, -1))
    body = ["[2026-12-31 23:58:00] node001:1:1 [0] NCCL INFO Bootstrap"]
    steps, last = _steps(0, 40, t0=dec31)  # crosses midnight into 2027-01-01
    body += steps
    r = triage(_job(tmp_path, body), now=last + 30, slurm_state="RUNNING")
    assert r.status == "running"
    assert r.progress.last_step_time is not None and abs(r.progress.last_step_time - last) < 1


@pytest.mark.parametrize(
    "status_line",
    [
        "  Status: FAILED (exit 143) (scancel by user)",
        "  Status: Failed (exit 143) â€” CANCELLED",
        "  \x00\x00Status: FAILED (exit 143) — CANCELLED (scancel / SIGTERM)",
    ],
)
def test_status_line_variants_are_read(tmp_path: Path, status_line: str) -> None:
    body, _ = _steps(0, 30)
    body += [
        "========================== JOB SUMMARY ==========================",
        "  Wall:   1-00:02:00",
        status_line,
        "=================================================================",
    ]
    r = _triage(_job(tmp_path, body), "CANCELLED")
    assert r.status == "cancelled" and r.progress.wall_time_s == 86400 + 120


def test_a_summary_without_status_takes_the_failed_stage(tmp_path: Path) -> None:
    body, _ = _steps(0, 30)
    body += ["0: ValueError: boom", "== Training FAILED (exit=1, 200s) ==", *_summary(1, "4m 0s")]
    body = [b for b in body if "Status:" not in b]
    r = _triage(_job(tmp_path, body), "FAILED")
    assert r.status == "failed"


def test_task_0_going_back_without_a_restore_line_is_a_new_run(tmp_path: Path) -> None:
    first, t = _steps(0, 60)
    second, _ = _steps(30, 45, t0=t + 60)
    body = [
        *first,
        *second,
        "0: Traceback (most recent call last):",
        "0: ValueError: boom",
        *_summary(1, "9m 0s"),
    ]
    r = _triage(_job(tmp_path, body), "FAILED")
    assert (r.progress.first_step, r.progress.last_step) == (30, 45)
