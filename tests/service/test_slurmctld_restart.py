"""slurmctld stopped and restarted under a running `jobdiagd run`, on a private one-node cluster.

The test starts its own cluster (scripts/services/slurm.sh with its own JOBDIAGD_SLURM_DIR and
ports), so the shared one is never touched. A simulated job runs; slurmctld is stopped (SIGTERM,
as an admin's restart does) while the job keeps running under slurmd and then hangs; slurmctld
comes back from its saved state. The daemon must keep reading the job's log and page the hang
while Slurm does not answer, say "source degraded: squeue" once and "source recovered" once,
show it in `jobdiagd status`, and report the job's real end once after the restart.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import MakeRig, notes, status_cli, stop, wait_for
from tests.helpers.faults import record_fault, short_dir  # noqa: F401  (fixture)
from tests.helpers.procs import alive
from tests.helpers.slurm_cluster import SlurmCluster, release_cluster, start_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.daemon, pytest.mark.timeout(300)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def private_cluster(short_dir: Path) -> Iterator[SlurmCluster]:  # noqa: F811 - the fixture
    short_dir.chmod(0o755)  # munged wants every directory above its socket searchable by all
    env = {
        "JOBDIAGD_SLURM_DIR": str(short_dir / "slurm"),
        "JOBDIAGD_SLURMCTLD_PORT": str(free_port()),
        "JOBDIAGD_SLURMD_PORT": str(free_port()),
    }
    cluster = start_cluster(env)
    try:
        yield cluster
    finally:
        release_cluster(cluster)  # ours alone: the last lease stops it


def ctld_pid(cluster: SlurmCluster) -> int:
    return int((cluster.state_dir / "run" / "slurmctld.pid").read_text())


def stop_ctld(cluster: SlurmCluster) -> None:
    pid = ctld_pid(cluster)
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not alive(pid), "slurmctld gone", timeout=30)


def start_ctld(cluster: SlurmCluster) -> None:
    """As slurm.sh starts it, minus -c: recover the job table from StateSaveLocation."""
    with open(cluster.state_dir / "log" / "slurmctld.stdout", "ab") as out:
        proc = subprocess.Popen(
            ["setsid", "slurmctld", "-D", "-f", str(cluster.conf)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=cluster.env,
        )
    (cluster.state_dir / "run" / "slurmctld.pid").write_text(str(proc.pid))  # slurm.sh stop kills it
    wait_for(lambda: "is UP" in cluster.run("scontrol", "ping", check=False).stdout, "slurmctld up", 60)


def status(cfg: Path) -> tuple[int, dict[str, Any]]:
    rc, out = status_cli(cfg, "--json")
    return rc, json.loads(out)


def titled(work: Path, title: str) -> list[dict[str, Any]]:
    return [n for n in notes(work) if n["event"] == "notice" and n["title"] == title]


def test_slurmctld_down_then_back_mid_run(
    private_cluster: SlurmCluster,
    short_dir: Path,  # noqa: F811
    daemon_rig: MakeRig,
) -> None:
    cluster = private_cluster
    timeout = "command_timeout_seconds = 3\n"
    rig = daemon_rig(short_dir, cluster=cluster, min_stall=6, grace=120, console=False, slurm=timeout)
    work, cfg = rig.work, rig.cfg
    daemon = rig.start()
    job_id = ""
    try:
        job_id = rig.sbatch_sim(
            "JAX-llama3.1-8b-ctld",
            *("--steps", "100000", "--step-time", "0.5", "--hang-after", "30"),
            *("--noise-every", "0.5", "--compile-time", "0.2"),
        )

        def watched() -> list[str]:
            return [j["job_id"] for j in status(cfg)[1].get("status", {}).get("jobs", [])]

        wait_for(lambda: job_id in watched(), "the job watched", timeout=120)
        wait_for(
            lambda: any(j.get("last_step") for j in status(cfg)[1]["status"]["jobs"]),
            "steps read",
            timeout=60,
        )

        stop_ctld(cluster)
        down_at = time.time()
        wait_for(lambda: titled(work, "source degraded: squeue") != [], "the degraded notice", timeout=60)
        rc, st = status(cfg)
        assert rc == 1 and st["state"] == "degraded", st
        assert any(d.startswith("source squeue failing") for d in st["degraded"]), st["degraded"]
        # Slurm is away; the job's log is still read and its hang paged.
        wait_for(
            lambda: any(n["event"] == "open" and n["job_id"] == job_id for n in notes(work)),
            "the hang paged while slurmctld is down",
            timeout=120,
        )
        (page,) = [n for n in notes(work) if n["event"] == "open"]
        assert page["kind"] == "hang" and page["created_at"] > down_at
        assert job_id in watched()  # not ended for want of an answer
        down_for = time.time() - down_at

        start_ctld(cluster)
        wait_for(lambda: titled(work, "source recovered: squeue") != [], "the recovered notice", timeout=60)
        wait_for(lambda: status(cfg)[0] == 0, "status OK again", timeout=30)
        assert cluster.state(job_id) == "RUNNING"  # recovered from the saved state
        assert job_id in watched()

        cluster.scancel(job_id)
        wait_for(
            lambda: any(n["event"] == "report" and n["job_id"] == job_id for n in notes(work)),
            "the job-end report",
            timeout=120,
        )
        (report,) = [n for n in notes(work) if n["event"] == "report"]
        assert "[Slurm CANCELLED]" in report["title"]
        assert len(titled(work, "source degraded: squeue")) == 1
        assert len(titled(work, "source recovered: squeue")) == 1
        assert stop(daemon) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
    events = [(n["event"], n["title"] if n["event"] == "notice" else n["kind"]) for n in notes(work)]
    record_fault(
        "slurmctld stopped and restarted",
        injected=f"slurmctld SIGTERMed for {down_for:.0f} s while job {job_id} runs and then hangs; "
        "restarted from its saved state",
        daemon="kept reading the job's log and paged its hang while squeue failed; job not ended for want "
        "of an answer; status DEGRADED (exit 1), then OK",
        delivered="; ".join(f"{e} {k}" for e, k in events),
        figures={"slurmctld_down_s": round(down_for, 1), "degraded_notices": 1, "recovered_notices": 1},
    )
