"""The live simulated job writes a real-format log in real time and ends with the right summary."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from jobdiagd_sim.live import LiveConfig, run

STEP = re.compile(
    rb"^(\d+): I\d{4} [\d:.]+ \d+ metric_logger\.py:232\] completed step: (\d+), seconds: ", re.M
)


def _wait_for(path: Path, needle: bytes, timeout: float = 30) -> bytes:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            data = path.read_bytes()
            if needle in data:
                return data
        time.sleep(0.02)
    raise AssertionError(f"{needle!r} never appeared in {path}")


def test_outputs_mode_completes_with_success_summary(tmp_path: Path) -> None:
    cfg = LiveConfig(
        steps=4,
        step_time=0.01,
        compile_time=0.01,
        nnodes=3,
        outputs=tmp_path,
        job_id="777",
        name="JAX-llama3.1-8b-live",
        checkpoint_period=2,
    )
    assert run(cfg) == 0
    log = tmp_path / "777-JAX-llama3.1-8b-live.log"
    link = tmp_path / "777-JAX-llama3.1-8b-live" / "log"
    assert os.readlink(link) == "../777-JAX-llama3.1-8b-live.log" and link.resolve() == log.resolve()
    data = log.read_bytes()
    assert data.startswith(
        b"JOB_ID=777\nJOB_NAME=JAX-llama3.1-8b-live\nNNODES=3\nJOB_NODELIST=node[001-003]\n"
    )
    assert b'PASSTHROUGH_ARGS="steps=4 enable_checkpointing=true checkpoint_period=2"' in data
    steps = sorted((int(r), int(s)) for r, s in STEP.findall(data))
    assert steps == [(r, s) for r in range(3) for s in range(4)]
    assert b"2: Saved a checkpoint at step 2." not in data  # absl-prefixed, not bare
    assert re.search(rb"\n2: I\d{4} \S+ \d+ train\.py:1040\] Saved a checkpoint at step 2\.\n", data)
    assert b"== Training END (" in data
    assert data.rstrip().endswith(b"  Status: SUCCESS (exit 0)\n" + b"=" * 65)


def test_a_rerun_with_the_same_checkpoint_dir_restores_the_newest_step(tmp_path: Path) -> None:
    """What a restart of a hung job sees with maxtext's per-model checkpoint directory."""
    ckpt = tmp_path / "llama3.1-8b" / "checkpoints"

    def job(job_id: str, steps: int) -> bytes:
        cfg = LiveConfig(
            steps=steps, step_time=0.01, compile_time=0.01, nnodes=2, outputs=tmp_path, job_id=job_id,
            name="JAX-llama3.1-8b-ck", checkpoint_period=2, checkpoint_dir=ckpt,
        )
        assert run(cfg) == 0
        return (tmp_path / f"{job_id}-JAX-llama3.1-8b-ck.log").read_bytes()

    first = job("801", 5)
    assert b"No existing checkpoints found, not restoring checkpoint." in first
    assert sorted(p.name for p in ckpt.iterdir()) == ["0", "2", "4"]
    second = job("802", 8)
    assert re.search(rb"\n0: I\d{4} \S+ \d+ checkpointing\.py:214\] restoring from this run's directory step 4\n", second)
    assert sorted({int(s) for _, s in STEP.findall(second)}) == [5, 6, 7]  # from the step after it


def test_outputs_mode_hang_then_cancel(tmp_path: Path) -> None:
    cfg = LiveConfig(
        steps=50,
        step_time=0.01,
        compile_time=0.01,
        nnodes=2,
        outputs=tmp_path,
        job_id="778",
        name="JAX-x-live",
        hang_after=2,
        noise_every=0.02,
    )
    stop = threading.Event()
    result: list[int] = []
    th = threading.Thread(target=lambda: result.append(run(cfg, stop=stop)))
    th.start()
    log = tmp_path / "778-JAX-x-live.log"
    _wait_for(log, b"completed step: 2,")
    size_at_hang = log.stat().st_size
    # keeps writing non-training output while no further step arrives
    deadline = time.monotonic() + 20
    while log.stat().st_size == size_at_hang and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    th.join(20)
    assert result == [143]
    data = log.read_bytes()
    assert log.stat().st_size > size_at_hang
    assert b"completed step: 3," not in data
    assert b"0: NODE_EXIT host=node001 exit=143" in data and b"1: NODE_EXIT host=node002 exit=143" in data
    assert b"srun: error: node002: task 1: Exited with exit code 143" in data
    assert "  Status: FAILED (exit 143) \u2014 CANCELLED (scancel / SIGTERM)".encode() in data


def test_rank_mode_prints_only_its_own_unprefixed_lines() -> None:
    buf = io.BytesIO()
    cfg = LiveConfig(steps=3, step_time=0.01, compile_time=0.01, nnodes=4, rank=2, host="node003")
    assert run(cfg, sink=buf) == 0
    data = buf.getvalue()
    assert b"PASSTHROUGH_ARGS=" not in data and b"JOB SUMMARY" not in data  # the batch script prints those
    assert len(re.findall(rb"^I\d{4} \S+ \d+ metric_logger\.py:232\] completed step: \d+", data, re.M)) == 3
    assert b"HOSTNAME=node003" in data and b"NODE_RANK=2" in data


def test_cli_sigterm_prints_cancellation_and_exits_143(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobdiagd_sim.live",
            "--outputs",
            str(tmp_path),
            "--job-id",
            "779",
            "--name",
            "JAX-y-live",
            "--nnodes",
            "2",
            "--steps",
            "100",
            "--step-time",
            "0.05",
            "--compile-time",
            "0.01",
        ],
    )
    try:
        _wait_for(tmp_path / "779-JAX-y-live.log", b"completed step: 1,")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    data = (tmp_path / "779-JAX-y-live.log").read_bytes()
    assert b"CANCELLED AT" in data
    assert data.rstrip().endswith(
        "  Status: FAILED (exit 143) \u2014 CANCELLED (scancel / SIGTERM)\n".encode() + b"=" * 65
    )
