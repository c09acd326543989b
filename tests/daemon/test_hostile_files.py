"""`jobdiagd run` against hostile or unlucky log files (issue 7): FIFOs, sockets, devices and
directories in place of a log, symlinks out of the outputs root, another user's file, a log
unreadable from the start (the daemon runs as `nobody`), a bogus step line, and the hang clock
across a SIGKILL. Real daemon processes, real files, real permissions; every wait is bounded.
"""

from __future__ import annotations

import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.sim import live
from tests.daemon.conftest import JobLog
from tests.daemon.test_run import notes, status, stop, wait_for

NOBODY = pwd.getpwnam("nobody")
SLURM_JOB_SCRIPT = Path(live.__file__).with_name("slurm_job.sh")
SECRET = "root:$y$j9T$SECRET-HASH-0123456789:19000:0:99999:7:::"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Daemons started by a test; killed at its end whatever happened (a wedged one too)."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


def write_cfg(work: Path, *, min_stall: float, startup: float = 120.0) -> Path:
    cfg = work / "cfg.toml"
    cfg.write_text(
        f"""
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jd.sock"
tick_seconds = 0.5
log_level = "info"
[detectors.hang]
min_stall_seconds = {min_stall}
startup_grace_seconds = {startup}
[notifiers.console]
stream = "stdout"
color = "never"
[notifiers.jsonl]
enabled = true
"""
    )
    return cfg


def bad_job(outputs: Path, job_id: str) -> tuple[Path, Path]:
    """A job dir whose `log` link points at `<id>-JAX-bad.log`, which the caller creates."""
    d = outputs / f"{job_id}-JAX-bad"
    d.mkdir(parents=True)
    log = outputs / f"{d.name}.log"
    (d / "log").symlink_to(f"../{log.name}")
    return d, log


def of(job_id: str, work: Path, event: str | None = None) -> list[dict[str, Any]]:
    """Notifications about a job: its incidents and reports, and notices naming it in the title."""
    return [
        n
        for n in notes(work)
        if (n["job_id"] == job_id or n["title"].endswith(f"job {job_id}"))
        and (event is None or n["event"] == event)
    ]


def blind_notices(work: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for n in notes(work):
        if n["title"].startswith("monitoring blind: job "):
            out.setdefault(n["title"].rsplit(" ", 1)[1], []).append(n)
    return out


def jobs(cfg: Path) -> dict[str, dict[str, Any]]:
    """The status' jobs by id ({} while the daemon is not answering yet)."""
    return {j["job_id"]: j for j in status(cfg).get("status", {}).get("jobs", [])}


# -- a log unreadable from the start --------------------------------------------------------------
# Tests run as root, who reads mode-000 files: the daemon runs as root *without* the two
# capabilities that bypass file permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), dropped
# from its bounding set by `setpriv` (util-linux) before exec — so, like any other user, it
# cannot open a mode-000 file, and it is still a real `jobdiagd run` process.

NO_DAC_BYPASS = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


def test_a_log_unreadable_from_the_start_is_reported_blind_then_restored(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work, outputs = short_tmp, short_tmp / "outputs"
    job = JobLog(outputs, "7301")
    for k in range(5):
        job.step(k, seconds=0.2)
    job.path.chmod(0o000)  # before the daemon ever reads it
    readable = JobLog(outputs, "7302")
    readable.step(0, seconds=0.2)
    cfg = write_cfg(work, min_stall=600)
    with open(work / "daemon.out", "ab") as out:
        daemon = subprocess.Popen(
            [*NO_DAC_BYPASS, sys.executable, "-m", "jobdiagd.cli", "run", "--config", str(cfg)]
            + ["--watch", str(outputs)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    procs.append(daemon)
    wait_for(lambda: jobs(cfg).get("7302", {}).get("last_step") == 0, "the readable job read")
    wait_for(lambda: bool(blind_notices(work).get("7301")), "the blind notice", timeout=30)
    (n,) = blind_notices(work)["7301"]
    assert "Permission denied" in n["body"] and n["severity"] == "warning"
    st = jobs(cfg)["7301"]
    assert st["phase"] == "blind" and st["blind"] == [str(job.dir / "log")]
    assert "7302" not in blind_notices(work)

    job.path.chmod(0o644)  # fixed: the daemon says so and reads it
    wait_for(lambda: any(x["title"] == "monitoring restored: job 7301" for x in notes(work)), "restored")
    wait_for(lambda: jobs(cfg)["7301"]["last_step"] == 4, "the log read after the fix")
    assert jobs(cfg)["7301"]["blind"] == []
    assert len(blind_notices(work)["7301"]) == 1
    assert stop(daemon) == 0
