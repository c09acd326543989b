"""Stall rules on hand-written logs: dated evidence vs the JOB SUMMARY wall time."""

from __future__ import annotations

from pathlib import Path

from jobdiagd.triage.engine import triage


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
