"""The daemon against the real one-node Slurm cluster: squeue discovery, tailing, hang page, scancel -> end report."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jobdiagd_sim import live
from tests.helpers.daemon import notes, status, stop, wait_for
from tests.helpers.slurm_cluster import SlurmCluster

SCRIPT = Path(live.__file__).with_name("slurm_job.sh")
NAME = "JAX-llama3.1-8b-daemon"


def test_daemon_finds_the_slurm_job_pages_its_hang_and_reports_the_scancel(
    slurm_cluster: SlurmCluster, short_tmp: Path
) -> None:
    work, outputs = short_tmp, short_tmp / "outputs"
    outputs.mkdir()
    outputs.chmod(0o777)
    cfg = work / "cfg.toml"
    cfg.write_text(
        f"""
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jd.sock"
tick_seconds = 0.5
squeue_interval_seconds = 1
[slurm]
backend = "cli"
slurm_conf = "{slurm_cluster.conf}"
outputs_roots = ["{outputs}"]
[detectors.hang]
min_stall_seconds = 6
startup_grace_seconds = 120
[notifiers.console]
stream = "stdout"
color = "never"
[notifiers.jsonl]
enabled = true
"""
    )
    with open(work / "daemon.out", "ab") as fh:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "jobdiagd.cli", "run", "--config", str(cfg), "--discover", "slurm"],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=slurm_cluster.env,
        )
    job_id = ""
    try:
        job_id = slurm_cluster.sbatch(
            f"--export=ALL,SIM_PYTHON={sys.executable}",
            f"--job-name={NAME}",
            f"--output={outputs}/%j-%x.log",
            "--ntasks=2",
            "--overcommit",
            str(SCRIPT),
            str(outputs),
            "--steps",
            "300",
            "--step-time",
            "0.3",
            "--hang-after",
            "12",
            "--noise-every",
            "0.5",
            "--compile-time",
            "0.2",
        )

        # The cluster is shared (other test sessions may run jobs on it): only this job counts.
        def mine() -> list[dict[str, Any]]:
            return [n for n in notes(work) if n["job_id"] == job_id]

        wait_for(lambda: any(n["event"] == "open" for n in mine()), "hang alert", timeout=120)
        opened = [n for n in mine() if n["event"] == "open"]
        assert [(n["kind"], n["job_id"]) for n in opened] == [("hang", job_id)]
        assert "step 12" in opened[0]["body"] and "**status**: hanging" in opened[0]["body"]
        jobs = [j for j in status(cfg)["status"]["jobs"] if j["job_id"] == job_id]
        assert [(j["job_id"], j["state"], j["last_step"]) for j in jobs] == [(job_id, "RUNNING", 12)]
        assert status(cfg)["status"]["sources"]["squeue"]["failing"] is False

        # slurmstepd dates its CANCELLED line to the second: a cancel sent within a second of the
        # page can be dated inside the stall budget, and the end triage then rightly sees a plain
        # cancel. Cancel clearly after the stall, as the operator this test plays would.
        time.sleep(2)
        slurm_cluster.scancel(job_id)
        wait_for(lambda: any(n["event"] == "report" for n in mine()), "job-end report", timeout=120)
        report = next(n for n in mine() if n["event"] == "report")
        assert report["job_id"] == job_id
        assert "cancelled" in report["title"] and "primary hang" in report["title"]
        assert "CANCELLED" in report["title"]
        assert "**Primary failure:** hang" in report["body"]
        wait_for(lambda: any(n["event"] == "resolve" for n in mine()), "hang resolved by the job end")
        assert [j for j in status(cfg)["status"]["jobs"] if j["job_id"] == job_id] == []
    finally:
        if job_id and slurm_cluster.state(job_id) not in ("CANCELLED", "COMPLETED", "FAILED", None):
            slurm_cluster.scancel(job_id)
        assert stop(daemon) == 0, (work / "daemon.out").read_text()[-3000:]
