"""`jobdiagd triage` on a job running under the real one-node Slurm: the state comes from scontrol."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from jobdiagd.cli import main
from jobdiagd_sim import live
from tests.helpers.slurm_cluster import SlurmCluster

SCRIPT = Path(live.__file__).with_name("slurm_job.sh")
NAME = "JAX-llama3.1-8b-triage"


def _wait(path: Path, pattern: bytes, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and re.search(pattern, path.read_bytes()):
            return
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} never appeared in {path}")


def test_triage_asks_slurm_for_the_state(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job_id = slurm_cluster.sbatch(
        f"--export=ALL,SIM_PYTHON={sys.executable}",
        f"--job-name={NAME}",
        f"--output={tmp_path}/%j-%x.log",
        "--ntasks=2",
        "--overcommit",
        str(SCRIPT),
        str(tmp_path),
        "--steps",
        "100",
        "--step-time",
        "0.2",
        "--compile-time",
        "0.1",
        "--hang-after",
        "3",
        "--noise-every",
        "0.3",
    )
    log = tmp_path / f"{job_id}-{NAME}.log"
    _wait(log, rb"\n0: \S+ \S+ \d+ \S+\] completed step: 3,")
    os.environ["SLURM_CONF"] = slurm_cluster.env["SLURM_CONF"]
    try:
        # An hour later on the triage clock: steps stopped, scontrol says RUNNING -> hanging.
        rc = main(["triage", job_id, "--outputs", str(tmp_path), "--json", "--now", str(time.time() + 3600)])
        assert rc == 0
        doc = json.loads(capsys.readouterr().out)
        assert (doc["status"], doc["primary_failure"]) == ("hanging", "hang")
        assert doc["progress"]["last_step"] == 3
        assert doc["job"]["id"] == job_id and doc["job"]["platform"] == "slurm"
        slurm_cluster.scancel(job_id)
        _wait(log, rb"JOB SUMMARY[\s\S]*=+\n$")
        slurm_cluster.wait_state(job_id, ["CANCELLED"], timeout=60)
        rc = main(["triage", str(log), "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert doc["status"] == "cancelled"
    finally:
        os.environ.pop("SLURM_CONF", None)
