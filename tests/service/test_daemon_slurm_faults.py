"""The daemon on real Slurm behind a lying `squeue`: empty or garbage answers, exit 1, a hang.

A wrapper script named `squeue`, first on the daemon's PATH, reads a mode file on every call:
`empty` (exit 0, prints nothing), `garbage` (exit 0, prints HTML), `fail` (exit 1), `hang`
(sleeps 600 s, then runs the real squeue, as a slow site wrapper would); no mode file runs the
real squeue. Every other Slurm command is the real one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import DaemonRig, MakeRig, notes, status_cli, wait_for
from tests.helpers.procs import alive, pids_in, zombie_children
from tests.helpers.slurm_cluster import SlurmCluster

# Runs the real daemon on real time (tests/conftest.py: service markers).
pytestmark = pytest.mark.daemon


WRAPPER = """#!/bin/bash
ctl="{ctl}"
mode=$(cat "$ctl/mode" 2>/dev/null)
echo "$$ ${{mode:-real}}" >> "$ctl/calls"
case "$mode" in
  empty) exit 0 ;;
  garbage) echo "<html><body><h1>502 Bad Gateway</h1></body></html>"; exit 0 ;;
  fail) echo "squeue: error: Unable to contact slurm controller (connect failure)" >&2; exit 1 ;;
  hang) sleep 600 & echo $! >> "$ctl/kids"; wait $! ;;
esac
exec {real} "$@"
"""


@dataclass
class Rig:
    d: DaemonRig  # whose squeue is the wrapper in `ctl`/bin
    ctl: Path
    job_id: str = ""

    @property
    def cluster(self) -> SlurmCluster:
        assert self.d.cluster is not None
        return self.d.cluster

    @property
    def work(self) -> Path:
        return self.d.work

    @property
    def daemon(self) -> subprocess.Popen[bytes]:
        return self.d.daemon

    def mode(self, mode: str | None) -> None:
        path = self.ctl / "mode"
        if mode is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(mode)

    def calls(self, mode: str) -> int:
        path = self.ctl / "calls"
        lines = path.read_text().splitlines() if path.exists() else []
        return sum(1 for ln in lines if ln.split()[-1] == mode)

    def start(self) -> None:
        self.d.start()

    def submit(self, *live_args: str) -> str:
        self.job_id = self.d.sbatch_sim(
            "JAX-llama3.1-8b-faults", "--noise-every", "0.5", "--compile-time", "0.2", *live_args
        )
        return self.job_id

    def status(self, *args: str) -> tuple[int, str]:
        return status_cli(self.d.cfg, *args)

    def status_json(self) -> dict[str, Any]:
        rc, out = self.status("--json")
        data: dict[str, Any] = json.loads(out)
        data["exit_code"] = rc
        return data

    def squeue_state(self) -> dict[str, Any]:
        return dict(self.status_json().get("status", {}).get("sources", {}).get("squeue") or {})

    def watched(self) -> list[str]:
        return [j["job_id"] for j in self.status_json().get("status", {}).get("jobs", [])]

    def running(self, job_id: str) -> bool:
        """The daemon has seen the job RUNNING (a job it last saw PENDING is never paged as hung)."""
        jobs = self.status_json().get("status", {}).get("jobs", [])
        return any(j["job_id"] == job_id and j.get("state") == "RUNNING" for j in jobs)

    def log(self) -> str:
        return self.d.log(4000)


def _notices(work: Path, title: str) -> list[dict[str, Any]]:
    return [n for n in notes(work) if n["event"] == "notice" and n["title"] == title]


def _reports(work: Path, job_id: str) -> list[dict[str, Any]]:
    # The test cluster is shared by every pytest session on the machine: only this job counts.
    return [n for n in notes(work) if n["event"] == "report" and n["job_id"] == job_id]


@pytest.fixture
def rig(slurm_cluster: SlurmCluster, short_tmp: Path, daemon_rig: MakeRig) -> Iterator[Rig]:
    real = shutil.which("squeue", path=slurm_cluster.env.get("PATH"))
    assert real is not None, "squeue is not installed"
    ctl = short_tmp / "ctl"
    (ctl / "bin").mkdir(parents=True)
    wrapper = ctl / "bin" / "squeue"
    wrapper.write_text(WRAPPER.format(ctl=ctl, real=real))
    wrapper.chmod(0o755)
    env = {**slurm_cluster.env, "PATH": f"{ctl / 'bin'}:{slurm_cluster.env.get('PATH', '')}"}
    timeout = "command_timeout_seconds = 2\n"
    d = daemon_rig(
        short_tmp, cluster=slurm_cluster, env=env, min_stall=6, grace=120, console=None, slurm=timeout
    )
    r = Rig(d, ctl)
    try:
        yield r
    finally:
        r.mode(None)
        d.cleanup()
        for pid in pids_in(ctl / "kids"):  # the wrapper's sleeps, if a failing run left them
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_empty_or_garbage_squeue_answers_do_not_end_a_running_job(rig: Rig) -> None:
    rig.start()
    job_id = rig.submit("--steps", "100000", "--step-time", "0.5")
    wait_for(lambda: job_id in rig.watched(), "the job watched", timeout=120)

    # squeue says "no jobs" (exit 0) while the job runs: scontrol says RUNNING, so it is not over.
    rig.mode("empty")
    wait_for(lambda: rig.calls("empty") >= 4, "four empty squeue answers", timeout=60)
    assert _reports(rig.work, job_id) == [], "a job-end report for a running job"
    assert job_id in rig.watched()
    wait_for(lambda: rig.squeue_state().get("failing") is True, "squeue shown failing", timeout=60)
    assert f"omits job {job_id}, which scontrol reports RUNNING" in rig.squeue_state()["last_error"]
    rc, text = rig.status()
    assert rc == 1
    assert "DEGRADED: source squeue failing" in text.splitlines()[1]

    # Garbage with exit 0: a broken answer, not an empty cluster.
    rig.mode("garbage")
    wait_for(lambda: rig.calls("garbage") >= 3, "three garbage squeue answers", timeout=60)
    wait_for(
        lambda: "unparseable output" in (rig.squeue_state().get("last_error") or ""),
        "the garbage named in status",
        timeout=60,
    )
    assert _reports(rig.work, job_id) == []
    assert job_id in rig.watched()
    assert len(_notices(rig.work, "source degraded: squeue")) == 1

    rig.mode(None)
    wait_for(lambda: _notices(rig.work, "source recovered: squeue") != [], "recovered notice", timeout=60)
    wait_for(lambda: rig.status()[0] == 0, "status healthy again", timeout=30)
    assert "  OK" in rig.status()[1].splitlines()[1]

    # The real end is reported, once, with its real state.
    rig.cluster.scancel(job_id)
    wait_for(lambda: _reports(rig.work, job_id) != [], "the job-end report", timeout=120)
    wait_for(lambda: rig.watched() == [], "the job dropped after its end", timeout=60)
    (report,) = _reports(rig.work, job_id)
    assert report["job_id"] == job_id and "[Slurm CANCELLED]" in report["title"]
    assert report["id"].startswith(f"report:{job_id}:job-end:end:")
    assert len(_notices(rig.work, "source degraded: squeue")) == 1
    assert len(_notices(rig.work, "source recovered: squeue")) == 1
    assert rig.daemon is not None
    rig.daemon.send_signal(signal.SIGTERM)
    assert rig.daemon.wait(timeout=30) == 0, rig.log()


def test_hung_squeue_wrapper_is_killed_at_the_timeout_and_ticks_go_on(rig: Rig) -> None:
    rig.start()
    job_id = rig.submit("--steps", "400", "--step-time", "0.3", "--hang-after", "40")
    # RUNNING, not only watched: squeue hangs from now on, so the state the daemon saw last stays.
    wait_for(lambda: rig.running(job_id), "the job seen running", timeout=60)

    rig.mode("hang")
    hung_at = time.time()
    # command_timeout_seconds = 2 holds although the wrapper's sleep keeps its pipes open.
    wait_for(
        lambda: "no answer within 2 s" in (rig.squeue_state().get("last_error") or ""),
        "squeue timing out after 2 s",
        timeout=60,
    )
    # Ticks go on meanwhile: the job's hang is paged while every squeue call hangs.
    mine = lambda: [n for n in notes(rig.work) if n["job_id"] == job_id]  # noqa: E731 (shared cluster)
    wait_for(lambda: any(n["event"] == "open" for n in mine()), "hang alert", timeout=120)
    (opened,) = [n for n in mine() if n["event"] == "open"]
    assert (opened["kind"], opened["job_id"]) == ("hang", job_id)
    assert opened["created_at"] > hung_at
    assert rig.calls("hang") >= 2
    assert rig.status_json()["exit_code"] == 1  # degraded, not stale: ticks are recent
    kids = pids_in(rig.ctl / "kids")
    assert kids and [p for p in kids[:-1] if alive(p)] == []  # each timed-out call's sleep killed
    assert rig.daemon is not None
    wait_for(lambda: zombie_children(rig.daemon.pid) == [], "no zombie children of the daemon", timeout=10)

    # SIGTERM during a hung call: the daemon stops, and takes the call's processes with it.
    wait_for(lambda: alive(pids_in(rig.ctl / "kids")[-1]), "a squeue call in flight", timeout=30)
    rig.daemon.send_signal(signal.SIGTERM)
    assert rig.daemon.wait(timeout=30) == 0, rig.log()
    wait_for(
        lambda: [p for p in pids_in(rig.ctl / "kids") if alive(p)] == [],
        "the in-flight call's sleep killed",
        timeout=10,
    )


def test_status_exits_nonzero_and_says_degraded_while_squeue_fails(rig: Rig) -> None:
    rig.mode("fail")
    rig.start()
    wait_for(lambda: rig.squeue_state().get("failing") is True, "squeue shown failing", timeout=60)
    rc, text = rig.status()
    assert rc == 1, text
    assert "DEGRADED: source squeue failing" in text.splitlines()[1]
    assert "squeue: FAILING since" in text and "Unable to contact slurm controller" in text
    data = rig.status_json()
    assert (data["exit_code"], data["state"], data["healthy"]) == (1, "degraded", False)
    assert data["degraded"][0].startswith("source squeue failing")
    squeue = data["status"]["sources"]["squeue"]
    assert squeue["failing_since"] is not None and squeue["failures"] >= 1
    assert "exit 1: squeue: error: Unable to contact slurm controller" in squeue["last_error"]
    wait_for(lambda: _notices(rig.work, "source degraded: squeue") != [], "degraded notice", timeout=60)

    rig.mode(None)
    wait_for(lambda: rig.status()[0] == 0, "status healthy once squeue answers", timeout=60)
    assert rig.status()[1].splitlines()[1].endswith("  OK")
    assert rig.squeue_state()["last_ok_at"] is not None
    wait_for(lambda: _notices(rig.work, "source recovered: squeue") != [], "recovered notice", timeout=30)
    (degraded,) = _notices(rig.work, "source degraded: squeue")
    assert degraded["severity"] == "warning" and "Unable to contact slurm controller" in degraded["body"]
    assert len(_notices(rig.work, "source recovered: squeue")) == 1
    assert rig.daemon is not None
    rig.daemon.send_signal(signal.SIGTERM)
    assert rig.daemon.wait(timeout=30) == 0, rig.log()
