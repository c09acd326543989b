"""sim/slurm_job.sh under real Slurm: srun -l prefixes, job dir + link, JOB SUMMARY on success and scancel."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from jobdiagd_sim import live
from tests.helpers.slurm_cluster import SlurmCluster

SCRIPT = Path(live.__file__).with_name("slurm_job.sh")
NAME = "JAX-llama3.1-8b-slurmsim"


def _submit(cluster: SlurmCluster, outputs: Path, *live_args: str) -> str:
    env_py = f"SIM_PYTHON={sys.executable}"
    return cluster.sbatch(
        f"--export=ALL,{env_py}",
        f"--job-name={NAME}",
        f"--output={outputs}/%j-%x.log",
        "--ntasks=2",
        "--overcommit",
        str(SCRIPT),
        str(outputs),
        *live_args,
    )


def _wait_text(path: Path, pattern: bytes, timeout: float = 60) -> bytes:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and re.search(pattern, path.read_bytes()):
            return path.read_bytes()
        time.sleep(0.2)
    raise AssertionError(
        f"{pattern!r} not in {path}: {path.read_bytes()[-2000:] if path.exists() else 'missing'!r}"
    )


def test_slurm_job_completes_with_real_srun_prefixes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id = _submit(slurm_cluster, tmp_path, "--steps", "3", "--step-time", "0.2", "--compile-time", "0.1")
    slurm_cluster.wait_state(job_id, ["COMPLETED", "FAILED", "CANCELLED"], timeout=90)
    log = tmp_path / f"{job_id}-{NAME}.log"
    data = _wait_text(log, rb"JOB SUMMARY[\s\S]*=+\n$")
    assert os.readlink(tmp_path / f"{job_id}-{NAME}" / "log") == f"../{log.name}"
    assert data.startswith(f"JOB_ID={job_id}\nJOB_NAME={NAME}\nNNODES=1\n".encode())
    ranks_steps = re.findall(
        rb"^(\d): I\d{4} \S+ \d+ metric_logger\.py:232\] completed step: (\d+),", data, re.M
    )
    assert sorted((int(r), int(s)) for r, s in ranks_steps) == [(r, s) for r in (0, 1) for s in range(3)]
    assert b"  Status: SUCCESS (exit 0)" in data
    assert slurm_cluster.state(job_id) == "COMPLETED"


def test_slurm_job_scancel_prints_cancelled_summary(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id = _submit(
        slurm_cluster,
        tmp_path,
        "--steps",
        "100",
        "--step-time",
        "0.2",
        "--compile-time",
        "0.1",
        "--hang-after",
        "1",
        "--noise-every",
        "0.3",
    )
    log = tmp_path / f"{job_id}-{NAME}.log"
    _wait_text(log, rb"\n1: \S+ \S+ \d+ metric_logger\.py:232\] completed step: 1,")
    slurm_cluster.scancel(job_id)
    data = _wait_text(log, rb"JOB SUMMARY[\s\S]*=+\n$")
    assert "  Status: FAILED (exit 143) \u2014 CANCELLED (scancel / SIGTERM)".encode() in data
    assert b"completed step: 2," not in data
    slurm_cluster.wait_state(job_id, ["CANCELLED"], timeout=60)
