"""`jobdiagd run` as a real process: watchfiles tailing, console/jsonl alerts, status, SIGHUP, SIGTERM, SIGKILL restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import JobLog

PY = sys.executable


def write_cfg(work: Path, *, min_stall: float, tick: float = 0.5) -> Path:
    cfg = work / "cfg.toml"
    cfg.write_text(
        f"""
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jd.sock"
tick_seconds = {tick}
log_level = "info"
[detectors.hang]
min_stall_seconds = {min_stall}
startup_grace_seconds = 60
[notifiers.console]
stream = "stdout"
color = "never"
[notifiers.jsonl]
enabled = true
"""
    )
    return cfg


def start_daemon(cfg: Path, outputs: Path, log: Path) -> subprocess.Popen[bytes]:
    fh = open(log, "ab")  # noqa: SIM115 - owned by the child for its lifetime
    return subprocess.Popen(
        [PY, "-m", "jobdiagd.cli", "run", "--config", str(cfg), "--watch", str(outputs)],
        stdout=fh,
        stderr=subprocess.STDOUT,
    )


def notes(work: Path) -> list[dict[str, Any]]:
    p = work / "state" / "notifications.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def wait_for(pred: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def status(cfg: Path) -> dict[str, Any]:
    out = subprocess.run(
        [PY, "-m", "jobdiagd.cli", "status", "--config", str(cfg), "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode in (0, 1, 3), out.stderr  # 3: not (yet) running
    res: dict[str, Any] = json.loads(out.stdout)
    return res


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    return proc.wait(timeout=30)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


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
            "jobdiagd.sim.live",
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
