"""`jobdiagd run` on the real Slurm cluster paging a real Alertmanager: owner label, re-posts across a restart, resolve."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jobdiagd_sim import live
from tests.helpers.alertmanager import Alertmanager, Webhook, epoch, wait_until
from tests.helpers.daemon import notes, stop
from tests.helpers.slurm_cluster import SlurmCluster

SCRIPT = Path(live.__file__).with_name("slurm_job.sh")
NAME = "JAX-llama3.1-8b-am"
RESEND = 2.0  # a post is valid for 4 of these: longer than a daemon restart takes


def start(cfg: Path, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "jobdiagd.cli", "run", "--config", str(cfg), "--discover", "slurm"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


async def test_slurm_hang_pages_alertmanager_with_its_owner_and_a_restart_keeps_it_firing(
    slurm_cluster: SlurmCluster, short_tmp: Path, alertmanager: Alertmanager, webhook: Webhook
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
enabled = false
[notifiers.jsonl]
enabled = true
[notifiers.alertmanager]
enabled = true
urls = ["{alertmanager.url}"]
cluster = "testcluster"
resend_interval_seconds = {RESEND}
"""
    )
    procs: list[subprocess.Popen[bytes]] = []
    job_id = ""
    out = work / "daemon.out"
    try:
        procs.append(start(cfg, out, slurm_cluster.env))
        job_id = await asyncio.to_thread(
            slurm_cluster.sbatch,
            f"--export=ALL,SIM_PYTHON={sys.executable}",
            f"--job-name={NAME}",
            f"--output={outputs}/%j-%x.log",
            "--ntasks=2",
            "--overcommit",
            str(SCRIPT),
            str(outputs),
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
        procs.append(start(cfg, out, slurm_cluster.env))
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
        if job_id and slurm_cluster.state(job_id) not in ("CANCELLED", "COMPLETED", "FAILED", None):
            slurm_cluster.scancel(job_id)
        for p in procs:
            assert stop(p) == 0, out.read_text()[-3000:]
