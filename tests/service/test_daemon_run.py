"""`jobdiagd run` as a real process: watchfiles tailing, console/jsonl alerts, status, SIGHUP, SIGTERM, SIGKILL restart."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers.daemon import PY, notes, start_daemon, status, stop, wait_for, write_cfg
from tests.helpers.joblog import JobLog

# Runs the real daemon on real time (tests/conftest.py: service markers).
pytestmark = pytest.mark.daemon


def test_live_job_hang_is_paged_with_triage_then_the_end_report(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work, outputs = short_tmp, short_tmp / "outputs"
    outputs.mkdir()
    cfg = write_cfg(work, min_stall=6)
    daemon = start_daemon(cfg, outputs, work / "daemon.out")
    procs.append(daemon)
    sim = subprocess.Popen(
        [
            PY,
            "-m",
            "jobdiagd_sim.live",
            "--outputs",
            str(outputs),
            "--job-id",
            "6101",
            "--name",
            "JAX-llama3.1-8b-live",
            "--nnodes",
            "2",
            "--steps",
            "300",
            "--step-time",
            "0.3",
            "--hang-after",
            "15",
            "--noise-every",
            "0.5",
            "--compile-time",
            "0.2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs.append(sim)
    wait_for(lambda: any(n["event"] == "open" and n["kind"] == "hang" for n in notes(work)), "hang alert")
    opened = [n for n in notes(work) if n["event"] == "open"]
    assert [(n["kind"], n["job_id"]) for n in opened] == [("hang", "6101")]
    assert "step 15" in opened[0]["body"] and "**primary failure**: hang" in opened[0]["body"]

    st = status(cfg)
    assert st["running"] is True and st["healthy"] is True
    (job,) = st["status"]["jobs"]
    assert job["job_id"] == "6101" and job["last_step"] == 15 and job["open_incidents"] == ["hang"]
    assert job["expected_step"] > 15 and job["step_time_s"] == pytest.approx(0.3, abs=0.1)

    daemon.send_signal(signal.SIGHUP)  # reload: keeps running, same incident
    wait_for(lambda: b"config_reloaded" in (work / "daemon.out").read_bytes(), "reload")
    assert status(cfg)["status"]["jobs"][0]["open_incidents"] == ["hang"]

    assert stop(sim) == 143  # scancel-like: cancellation cascade + JOB SUMMARY
    wait_for(lambda: any(n["event"] == "report" for n in notes(work)), "job-end report")
    report = next(n for n in notes(work) if n["event"] == "report")
    assert "cancelled" in report["title"] and "primary hang" in report["title"]
    assert "## Job triage" in report["body"]
    wait_for(lambda: any(n["event"] == "resolve" for n in notes(work)), "resolution")
    # Causal order: the hang's resolution ("job ended") is delivered before the job's end report.
    events = [(n["event"], n["kind"]) for n in notes(work)]
    assert events.index(("resolve", "hang")) < events.index(("report", "job-end")), events
    assert stop(daemon) == 0
    out = (work / "daemon.out").read_text()
    assert "OPEN     hang on job 6101" in out and "REPORT   job 6101 ended" in out  # console notifier
    assert not (work / "jd.sock").exists()


def test_sigkill_during_an_open_incident_then_restart(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work, outputs = short_tmp, short_tmp / "outputs"
    cfg = write_cfg(work, min_stall=3)
    job = JobLog(outputs, "6102")
    for k in range(8):
        job.step(k, seconds=0.2)
    daemon = start_daemon(cfg, outputs, work / "daemon.out")
    procs.append(daemon)
    wait_for(lambda: any(n["event"] == "open" for n in notes(work)), "hang alert")
    assert stop(daemon, signal.SIGKILL) == -signal.SIGKILL

    daemon2 = start_daemon(cfg, outputs, work / "daemon2.out")
    procs.append(daemon2)
    wait_for(lambda: status(cfg).get("running") is True, "restarted daemon")
    wait_for(lambda: status(cfg)["status"]["ticks"] >= 8, "a few ticks after the restart")
    st = status(cfg)["status"]
    assert [i["kind"] for i in st["open_incidents"]] == ["hang"]  # still open
    assert [(n["event"], n["kind"]) for n in notes(work)] == [("open", "hang")]  # no duplicate

    job.step(8, seconds=10.0)
    wait_for(lambda: any(n["event"] == "resolve" for n in notes(work)), "resolution")
    assert [(n["event"], n["kind"]) for n in notes(work)] == [("open", "hang"), ("resolve", "hang")]
    assert "steps resumed at step 8" in notes(work)[1]["body"]
    assert stop(daemon2) == 0
    assert os.path.exists(work / "state" / "alerts.sqlite3")
