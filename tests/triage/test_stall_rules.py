"""Stall rules on hand-written logs: dated evidence vs the JOB SUMMARY wall time."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd.sources.slurm_parse import SlurmJob
from jobdiagd.sources.slurmstate import slurm_wall_s
from jobdiagd.triage.engine import triage, triage_ref
from jobdiagd.triage.report import render_markdown
from jobdiagd.triage.resolve import resolve
from jobdiagd.triage.stall import StallPolicy


def _job(tmp: Path, steps: int, wall: str, tail: list[str]) -> Path:
    out = tmp / "outputs"
    out.mkdir()
    name = "4242-JAX-llama2-70b"
    lines = [
        "JOB_ID=4242",
        "JOB_NAME=JAX-llama2-70b",
        "NNODES=2",
        "JOB_NODELIST=node[001-002]",
        'PASSTHROUGH_ARGS="steps=1000"',
    ]
    for s in range(steps):
        t = 10 * 3600 + s * 5
        stamp = f"I0612 {t // 3600:02d}:{t % 3600 // 60:02d}:{t % 60:02d}.000000 1 metric_logger.py:232] "
        for task in (0, 1):
            lines.append(
                f"{task}: {stamp}completed step: {s}, seconds: 5.000, Tokens/s/device: 3000.0, loss: 2.0"
            )
    lines += tail
    lines += [
        "========================== JOB SUMMARY ==========================",
        "  Job:    4242 (JAX-llama2-70b)",
        f"  Wall:   {wall}",
        "  Status: FAILED (exit 143) — CANCELLED (scancel / SIGTERM)",
        "=================================================================",
    ]
    (out / f"{name}.log").write_text("\n".join(lines) + "\n")
    (out / name).mkdir()
    (out / name / "log").symlink_to(f"../{name}.log")
    return out / name


def test_cancel_after_undated_stall_is_a_hang_by_wall_time(tmp_path: Path) -> None:
    # 50 steps x 5 s of training in a 1 h wall: 55 min unaccounted, nothing dated after the last step.
    r = triage(_job(tmp_path, 50, "1h 0m 0s", ["0: srun: Terminating StepId=4242.0"]), now=2e9)
    assert (r.status, r.primary) == ("cancelled", "hang")
    assert r.cls.stall is not None and r.cls.stall.basis == "wall-time"


def test_cancel_right_after_progress_is_plain_cancel(tmp_path: Path) -> None:
    # A dated cancel line 20 s after the last step: the stall is measured, and it is short.
    tail = ["0: slurmstepd: error: *** STEP 4242.0 ON node001 CANCELLED AT 2026-06-12T10:04:25 ***"]
    r = triage(_job(tmp_path, 50, "1h 0m 0s", tail), now=2e9)
    assert r.cls.stall is not None and r.cls.stall.basis == "timestamps"
    assert (r.status, r.primary) == ("cancelled", "cancelled")


def test_short_wall_cancel_is_plain_cancel(tmp_path: Path) -> None:
    r = triage(_job(tmp_path, 50, "14m 10s", []), now=2e9)
    assert (r.status, r.primary) == ("cancelled", "cancelled")


def _live_undated_job(tmp: Path, steps: int) -> Path:
    """A running print-era job: no absl stamps on any line, no JOB SUMMARY yet."""
    out = tmp / "outputs"
    out.mkdir()
    name = "4343-JAX-llama2-70b"
    lines = ["JOB_ID=4343", "JOB_NAME=JAX-llama2-70b", "NNODES=2", 'PASSTHROUGH_ARGS="steps=1000"']
    for s in range(steps):
        for task in (0, 1):
            lines.append(f"{task}: completed step: {s}, seconds: 5.000, Tokens/s/device: 3000.0, loss: 2.0")
    lines.append("1: node002:1:1 [0] NCCL INFO chatter that keeps the mtime fresh")
    (out / f"{name}.log").write_text("\n".join(lines) + "\n")
    (out / name).mkdir()
    (out / name / "log").symlink_to(f"../{name}.log")
    return out / name


def test_live_undated_job_hangs_by_slurm_wall_time(tmp_path: Path) -> None:
    # 50 steps x 5 s = 250 s trained; Slurm says the job started 2 h ago -> ~1.6 h unaccounted.
    job = _live_undated_job(tmp_path, 50)
    r = triage_ref(resolve(str(job), []), now=2e9, slurm_state="RUNNING", slurm_wall_s=7200.0)
    assert r.cls.stall is not None and r.cls.stall.basis == "wall-time"
    assert (r.status, r.primary) == ("hanging", "hang")
    assert r.progress.wall_time_s == 7200.0
    assert "Wall time (Slurm start to end/now)" in render_markdown(r)


def test_live_undated_job_in_its_setup_budget_is_running(tmp_path: Path) -> None:
    # 250 s trained in 15 min of Slurm time: within the ~20-30 min setup overhead.
    job = _live_undated_job(tmp_path, 50)
    r = triage_ref(resolve(str(job), []), now=2e9, slurm_state="RUNNING", slurm_wall_s=900.0)
    assert r.status == "running"
    # and without any wall time (no Slurm), nothing can be said about a stall: still running
    r2 = triage_ref(resolve(str(job), []), now=2e9, slurm_state="RUNNING")
    assert r2.status == "running" and r2.cls.stall is not None and r2.cls.stall.basis == "none"


def test_slurm_wall_time_is_start_to_end_or_now() -> None:
    job = SlurmJob("7", "n", "u", "RUNNING", "p", start_time=1000.0)
    assert slurm_wall_s(job, now=4600.0) == 3600.0
    ended = SlurmJob("7", "n", "u", "CANCELLED", "p", start_time=1000.0, end_time=1600.0)
    assert slurm_wall_s(ended, now=9999.0) == 600.0
    assert slurm_wall_s(SlurmJob("7", "n", "u", "PENDING", "p"), now=9999.0) is None
    assert slurm_wall_s(None, now=1.0) is None


def test_cancel_instant_is_refined_past_the_whole_second_stamp(tmp_path: Path) -> None:
    # Last step at 10:04:05.000, cancel stamped 10:04:19 (whole seconds), the cascade at
    # 10:04:19.900: the stall is 14.9 s, not 14 s (rule CAS-8). With a 14.5 s budget the cancel
    # came after a stall, which the truncated stamp would have missed.
    tail = [
        "0: slurmstepd: error: *** STEP 4242.0 ON node001 CANCELLED AT 2026-06-12T10:04:19 ***",
        "0: W0612 10:04:19.900000 1 train.py:1120] Received SIGTERM; shutting down",
    ]
    policy = StallPolicy(stall_factor=1.0, min_stall_s=14.5)
    r = triage(_job(tmp_path, 50, "1h 0m 0s", tail), now=2e9, policy=policy)
    assert r.cls.stall is not None and r.cls.stall.basis == "timestamps"
    assert r.cls.stall.gap_s == pytest.approx(14.9)
    assert (r.status, r.primary) == ("cancelled", "hang")


def test_a_dated_line_a_second_later_does_not_move_the_cancel(tmp_path: Path) -> None:
    # The next dated line is 3 s after the stamp: it does not bound the instant; the stamp is used.
    tail = [
        "0: slurmstepd: error: *** STEP 4242.0 ON node001 CANCELLED AT 2026-06-12T10:04:19 ***",
        "0: W0612 10:04:22.500000 1 train.py:1120] Received SIGTERM; shutting down",
    ]
    policy = StallPolicy(stall_factor=1.0, min_stall_s=14.5)
    r = triage(_job(tmp_path, 50, "1h 0m 0s", tail), now=2e9, policy=policy)
    assert r.cls.stall is not None and r.cls.stall.gap_s == pytest.approx(14.0)
    assert (r.status, r.primary) == ("cancelled", "cancelled")
