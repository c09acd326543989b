"""Logs broken while `jobdiagd run` tails them: one job per fault, all at once, one daemon.

Truncated, rotated (renamed away and a new file in its place), renamed with the `log` link
repointed, deleted, replaced by a directory, made unreadable, fed a 100 MB line and fed binary
garbage. A job that cannot be read gets one "monitoring blind" notice and, once repaired, one
"monitoring restored"; `jobdiagd status` shows it blind (DEGRADED) meanwhile. The others go on
being read (their next steps counted), and a control job's failure is paged while all this
happens. The daemon runs without CAP_DAC_OVERRIDE (setpriv), so mode 000 means unreadable.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.service.status_socket import StatusUnavailable, request
from jobdiagd_sim import lines as L
from tests.helpers.daemon import notes, start_daemon, stop, wait_for, write_cfg
from tests.helpers.faults import record_fault, short_dir  # noqa: F401  (fixture)
from tests.helpers.joblog import JobLog

PY = sys.executable
NO_DAC_BYPASS = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
BIG = 100 * 1024 * 1024

pytestmark = [pytest.mark.daemon, pytest.mark.timeout(240)]

FAULTS = {
    "7401": "truncated",
    "7402": "rotated",
    "7403": "renamed",
    "7404": "deleted",
    "7405": "replaced by a directory",
    "7406": "unreadable",
    "7407": "100 MB line",
    "7408": "binary garbage",
}
BLINDING = {"7404", "7405", "7406"}
CONTROL = "7409"


def snapshot(sock: Path) -> dict[str, Any]:
    try:
        return dict(request(sock, "status", timeout=10)["result"])
    except StatusUnavailable:
        return {}


def steps(sock: Path) -> dict[str, int | None]:
    return {j["job_id"]: j["last_step"] for j in snapshot(sock).get("jobs", [])}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def titles(work: Path, prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in notes(work):
        if n["event"] == "notice" and n["title"].startswith(prefix):
            job = n["title"].rsplit(" ", 1)[1]
            out[job] = out.get(job, 0) + 1
    return out


def test_every_kind_of_broken_log_at_once(short_dir: Path) -> None:  # noqa: F811 - the fixture
    work, outputs = short_dir, short_dir / "outputs"
    sock = work / "jd.sock"
    jobs = {job_id: JobLog(outputs, job_id) for job_id in [*FAULTS, CONTROL]}
    for job in jobs.values():
        for k in range(5):
            job.step(k, seconds=0.2)
    cfg = write_cfg(work, min_stall=600)  # no job hangs here: every page is a fault's
    daemon = start_daemon(cfg, outputs, work / "daemon.out", prefix=NO_DAC_BYPASS)
    try:
        wait_for(
            lambda: set(steps(sock).values()) == {4} and len(steps(sock)) == 9, "every job read to step 4"
        )
        rss_before = rss_mb(daemon.pid)

        j = jobs["7401"]  # truncated: the job's log starts over (a requeue writing the same file)
        os.truncate(j.path, 0)
        j.step(0, seconds=0.2)
        j.step(1, seconds=0.2)
        j = jobs["7402"]  # rotated: the file renamed away, a new one in its place
        j.path.rename(j.path.with_name(j.path.name + ".1"))
        j.step(5, seconds=0.2)
        j = jobs["7403"]  # renamed, and the job dir's `log` link repointed at the new name
        moved = j.path.with_name(j.path.stem + "-renamed.log")
        j.path.rename(moved)
        (j.dir / "log").unlink()
        (j.dir / "log").symlink_to(f"../{moved.name}")
        j.path = moved
        j.step(5, seconds=0.2)
        jobs["7404"].path.unlink()
        jobs["7405"].path.unlink()
        jobs["7405"].path.mkdir()
        jobs["7406"].path.chmod(0o000)
        j = jobs["7407"]
        with open(j.path, "a") as fh:
            chunk = "x" * (1 << 20)
            for _ in range(BIG // len(chunk)):
                fh.write(chunk)
            fh.write("\n")
        j.step(5, seconds=0.2)
        j = jobs["7408"]
        with open(j.path, "ab") as bfh:
            bfh.write(os.urandom(1 << 20))
            bfh.write(b"\n")
        j.step(5, seconds=0.2)
        # The control job fails meanwhile: its page must not wait for the broken ones.
        jobs[CONTROL].task(0, L.xla_oom(32 * 2**30))

        wait_for(
            lambda: set(titles(work, "monitoring blind")) == BLINDING, "a blind notice per unreadable job"
        )
        st = snapshot(sock)
        blind_in_status = sorted(j["job_id"] for j in st["jobs"] if j["blind"])
        assert blind_in_status == sorted(BLINDING)
        wait_for(
            lambda: any(n["event"] == "open" and n["job_id"] == CONTROL for n in notes(work)),
            "the control job's failure paged",
        )
        want = {"7401": 1, "7402": 5, "7403": 5, "7407": 5, "7408": 5}
        wait_for(
            lambda: all(steps(sock).get(k) == v for k, v in want.items()),
            f"steps read after the faults: {want}",
        )
        ticks_before = snapshot(sock)["ticks"]
        wait_for(lambda: snapshot(sock)["ticks"] >= ticks_before + 6, "ticks going on while jobs are blind")
        rc = subprocess.run(
            [PY, "-m", "jobdiagd.cli", "status", "--config", str(cfg)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert rc.returncode == 1 and "DEGRADED" in rc.stdout and "job 7405 blind" in rc.stdout, rc.stdout
        rss_after = rss_mb(daemon.pid)

        # Repaired: each comes back once, and is read again.
        jobs["7404"].step(5, seconds=0.2)  # written again: a new file
        jobs["7405"].path.rmdir()
        jobs["7405"].step(5, seconds=0.2)
        jobs["7406"].path.chmod(0o644)
        jobs["7406"].step(5, seconds=0.2)
        wait_for(lambda: set(titles(work, "monitoring restored")) == BLINDING, "a restored notice per job")
        wait_for(
            lambda: all(v == 5 for k, v in steps(sock).items() if k in BLINDING), "the repaired logs read"
        )
        time.sleep(2)  # a repeat notice would come within a few ticks
        blind, restored = titles(work, "monitoring blind"), titles(work, "monitoring restored")
        assert blind == dict.fromkeys(BLINDING, 1) and restored == dict.fromkeys(BLINDING, 1)
        pages = [(n["job_id"], n["kind"]) for n in notes(work) if n["event"] == "open"]
        assert pages == [(CONTROL, pages[0][1])], pages
        wait_for(lambda: snapshot(sock).get("last_tick_ok") is True, "a clean tick")
        assert (
            subprocess.run(
                [PY, "-m", "jobdiagd.cli", "status", "--config", str(cfg)], capture_output=True, check=False
            ).returncode
            == 0
        )
        assert stop(daemon) == 0
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGKILL)
            daemon.wait(30)
    record_fault(
        "log files broken while tailed",
        injected="one job each: " + ", ".join(f"{k} {v}" for k, v in FAULTS.items()),
        daemon="deleted, directory and mode-000 logs: blind, status DEGRADED, then restored once readable; "
        "truncated, rotated, renamed, 100 MB line, binary garbage: read on, later steps counted; "
        "control job's failure paged meanwhile",
        delivered=f"blind notices {sum(blind.values())}, restored notices {sum(restored.values())}, "
        f"pages {len(pages)} (the control job's)",
        figures={
            "rss_before_mb": round(rss_before, 1),
            "rss_after_100MB_line_mb": round(rss_after, 1),
            "blind_notices": sum(blind.values()),
            "restored_notices": sum(restored.values()),
        },
    )
    assert rss_after - rss_before < 64, (rss_before, rss_after)  # the 100 MB line was not held
