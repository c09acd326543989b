"""A full disk under the state dir (a real 1 MiB tmpfs) while a job hangs: the page is delayed, never lost.

The daemon runs as a real process (`jobdiagd run`); the state dir is a tmpfs filled to the last
byte with a ballast file while the simulated job's steps stop, so SQLite itself reports "database
or disk is full" (or cannot even map its -shm file after a restart). When the ballast goes,
the hang page must reach the JSONL notifier exactly once, also across restarts.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.daemon import start_daemon, status, stop, wait_for, write_cfg
from tests.helpers.joblog import JobLog
from tests.helpers.small_disk import fill, tmpfs

# Runs the real daemon on real time (tests/conftest.py: service markers).
pytestmark = pytest.mark.daemon


@pytest.fixture
def small_disk(short_tmp: Path) -> Iterator[Path]:
    """`short_tmp/state` on its own 1 MiB tmpfs."""
    with tmpfs(short_tmp / "state", "1m") as disk:
        yield disk


def disk_cfg(work: Path, jsonl: Path) -> Path:
    """Notifications written to `jsonl` (outside the small disk, or on it), retried quickly."""
    extra = f'path = "{jsonl}"\n[delivery]\nretry_initial_seconds = 0.5\nretry_max_seconds = 1\n'
    return write_cfg(work, min_stall=5, extra=extra)


def hang_pages(jsonl: Path) -> int:
    if not jsonl.exists():
        return 0
    pages = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    return [(n["event"], n["kind"], n["job_id"]) for n in pages].count(("open", "hang", "6201"))


def open_incidents(cfg: Path) -> list[str]:
    st = status(cfg)
    if not st.get("running"):
        return []
    return [i["kind"] for i in st["status"]["open_incidents"]]


def ticks(cfg: Path) -> int:
    st = status(cfg)
    return int(st["status"]["ticks"]) if st.get("running") else -1


def start_hang_on_full_disk(
    work: Path, disk: Path, jsonl: Path, procs: list[subprocess.Popen[bytes]]
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """The daemon runs; the disk fills; then a job appears that ran 8 steps and stopped."""
    outputs = work / "outputs"
    outputs.mkdir()
    cfg = disk_cfg(work, jsonl)
    daemon = start_daemon(cfg, outputs, work / "daemon.out")
    procs.append(daemon)
    wait_for(lambda: ticks(cfg) >= 2, "the daemon to run")
    ballast = fill(disk)
    job = JobLog(outputs, "6201")
    for k in range(8):
        job.step(k, seconds=0.2)
    wait_for(lambda: open_incidents(cfg) == ["hang"], "the hang to open (in memory)")
    return daemon, cfg, ballast


def test_hang_opened_on_a_full_disk_is_paged_once_when_space_returns(
    short_tmp: Path, small_disk: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work = short_tmp
    # The notifier file beside the state dir: only the store is short of space.
    jsonl = work / "notifications.jsonl"
    daemon, cfg, ballast = start_hang_on_full_disk(work, small_disk, jsonl, procs)
    n = ticks(cfg)
    wait_for(lambda: ticks(cfg) >= n + 6, "more ticks on the full disk")
    assert hang_pages(jsonl) == 0  # nothing could be stored, so nothing was sent
    assert daemon.poll() is None

    ballast.unlink()
    wait_for(lambda: hang_pages(jsonl) >= 1, "the hang page once space is back", timeout=30)
    n = ticks(cfg)
    wait_for(lambda: ticks(cfg) >= n + 6, "more ticks after the page")
    assert hang_pages(jsonl) == 1
    assert stop(daemon) == 0

    log = (work / "daemon.out").read_text()
    assert "Traceback" not in log
    # One line per writer when its writes start failing, one when they work again (not one per
    # tick). Two writers share the disk: the alert store and the tail offsets (saved in the tick
    # a new step arrives); the alert store must have said it.
    events = [
        e
        for e in (json.loads(line) for line in log.splitlines() if '"state_store_' in line)
        if e["event"] in ("state_store_failing", "state_store_recovered")
    ]
    for name in {e["state_store"] for e in events}:
        mine = [e["event"] for e in events if e["state_store"] == name]
        assert mine.count("state_store_failing") == 1, (name, mine)
        assert mine.count("state_store_recovered") == 1, (name, mine)
    assert "state store" in {e["state_store"] for e in events}

    daemon2 = start_daemon(cfg, work / "outputs", work / "daemon2.out")
    procs.append(daemon2)
    wait_for(lambda: ticks(cfg) >= 6, "ticks after the restart")
    assert open_incidents(cfg) == ["hang"]
    assert hang_pages(jsonl) == 1  # the restart neither repeats nor loses it
    assert stop(daemon2) == 0


def test_hang_opened_on_a_full_disk_survives_a_restart_while_still_full(
    short_tmp: Path, small_disk: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work = short_tmp
    # The notifier file in the state dir: its appends fail on the full disk too.
    jsonl = small_disk / "notifications.jsonl"
    daemon, cfg, ballast = start_hang_on_full_disk(work, small_disk, jsonl, procs)
    n = ticks(cfg)
    wait_for(lambda: ticks(cfg) >= n + 4, "more ticks on the full disk")
    assert stop(daemon, signal.SIGTERM) == 0  # e.g. `systemctl restart` while the disk is full

    daemon2 = start_daemon(cfg, work / "outputs", work / "daemon2.out")
    procs.append(daemon2)
    log2 = work / "daemon2.out"
    # Still full: it either runs with the page held in memory, or waits to open the store.
    wait_for(
        lambda: b"state_store_waiting" in log2.read_bytes() or open_incidents(cfg) == ["hang"],
        "the restarted daemon to wait for the store or re-find the hang",
    )
    assert daemon2.poll() is None
    assert hang_pages(jsonl) == 0

    ballast.unlink()
    wait_for(lambda: hang_pages(jsonl) >= 1, "the hang page once space is back", timeout=40)
    n = ticks(cfg)
    wait_for(lambda: ticks(cfg) >= n + 6, "more ticks after the page")
    assert hang_pages(jsonl) == 1
    assert stop(daemon2) == 0
    assert "Traceback" not in log2.read_text()

    daemon3 = start_daemon(cfg, work / "outputs", work / "daemon3.out")
    procs.append(daemon3)
    wait_for(lambda: ticks(cfg) >= 6, "ticks after a second restart")
    assert hang_pages(jsonl) == 1
    assert stop(daemon3) == 0
