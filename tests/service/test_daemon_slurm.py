"""The daemon against the real one-node Slurm cluster: squeue discovery, tailing, hang page, scancel -> end report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.helpers.daemon import MakeRig, notes, status, stop, wait_for
from tests.helpers.slurm_cluster import SlurmCluster

NAME = "JAX-llama3.1-8b-daemon"


def test_daemon_finds_the_slurm_job_pages_its_hang_and_reports_the_scancel(
    slurm_cluster: SlurmCluster, short_tmp: Path, daemon_rig: MakeRig
) -> None:
    rig = daemon_rig(short_tmp, cluster=slurm_cluster, min_stall=6, grace=120)
    work, cfg = rig.work, rig.cfg
    daemon = rig.start()
    try:
        job_id = rig.sbatch_sim(
            NAME,
            *("--steps", "300", "--step-time", "0.3", "--hang-after", "12"),
            *("--noise-every", "0.5", "--compile-time", "0.2"),
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
        assert stop(daemon) == 0, rig.log()
