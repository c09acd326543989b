"""`jobdiagd run` on the real Slurm cluster paging a real Alertmanager: owner label, re-posts across a restart, resolve."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tests.helpers.alertmanager import Alertmanager, Webhook, epoch, wait_until
from tests.helpers.daemon import MakeRig, notes, stop
from tests.helpers.slurm_cluster import SlurmCluster

NAME = "JAX-llama3.1-8b-am"
RESEND = 2.0  # a post is valid for 4 of these: longer than a daemon restart takes


async def test_slurm_hang_pages_alertmanager_with_its_owner_and_a_restart_keeps_it_firing(
    slurm_cluster: SlurmCluster,
    short_tmp: Path,
    alertmanager: Alertmanager,
    webhook: Webhook,
    daemon_rig: MakeRig,
) -> None:
    am = f"""[notifiers.alertmanager]
enabled = true
urls = ["{alertmanager.url}"]
cluster = "testcluster"
resend_interval_seconds = {RESEND}
"""
    rig = daemon_rig(short_tmp, cluster=slurm_cluster, min_stall=6, grace=120, console=False, extra=am)
    work, procs = rig.work, rig.procs
    try:
        rig.start()
        job_id = await asyncio.to_thread(
            rig.sbatch_sim,
            NAME,
            *("--steps", "300", "--step-time", "0.3", "--hang-after", "12"),
            *("--noise-every", "0.5", "--compile-time", "0.2"),
        )
        squeue = await asyncio.to_thread(slurm_cluster.run, "squeue", "-h", "-j", job_id, "-o", "%u")
        user = squeue.stdout.strip()
        query = f'job_id="{job_id}"'
        alerts: list[dict[str, Any]] = await wait_until(
            lambda: alertmanager.alerts(query), "the hang alert", within=120
        )
        (before,) = alerts
        assert before["labels"] == {
            "alertname": "JobdiagdHang",
            "cluster": "testcluster",
            "job_id": job_id,
            "kind": "hang",
            "severity": "critical",
            "owner": user,
            "source": "jobdiagd",
        }
        assert "step 12" in before["annotations"]["description"]
        await wait_until(lambda: webhook.notifications("firing", job_id=job_id), "the page")

        assert await asyncio.to_thread(stop, procs[-1]) == 0
        stopped = time.time()
        rig.start()
        # Past the last post of the first process: only the new one keeps it firing.
        await asyncio.sleep(4 * RESEND + 2)
        (after,) = await alertmanager.alerts(query)
        assert after["fingerprint"] == before["fingerprint"] and after["status"]["state"] == "active"
        assert epoch(after["updatedAt"]) > stopped  # posted by the restarted daemon
        assert len(webhook.notifications("firing", job_id=job_id)) == 1

        await asyncio.to_thread(slurm_cluster.scancel, job_id)
        await wait_until(lambda: webhook.notifications("resolved", job_id=job_id), "the resolve", within=120)
        assert await alertmanager.alerts(query) == []
        assert [n["event"] for n in notes(work) if (n["kind"], n["job_id"]) == ("hang", job_id)] == [
            "open",
            "resolve",
        ]
    finally:
        for p in procs:
            assert stop(p) == 0, rig.log()
