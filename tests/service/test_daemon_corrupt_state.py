"""`jobdiagd run` on damaged or busy state: quarantine and start clean, skip bad rows, wait for a lock.

Every test runs the real daemon process against a real SQLite file that was damaged (random
bytes, cut in half, an outbox row that is not JSON) or locked by another process, and checks
that it keeps running, says so once in the log, and still delivers to the JSONL notifier.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import notes, start_daemon, status, stop, wait_for, write_cfg
from tests.helpers.joblog import JobLog

# Runs the real daemon on real time (tests/conftest.py: service markers).
pytestmark = pytest.mark.daemon

PY = sys.executable


def log_events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def running(cfg: Path) -> bool:
    return bool(status(cfg).get("running"))


def make_state_with_history(work: Path, procs: list[subprocess.Popen[bytes]]) -> Path:
    """A state dir written by a real daemon: a job that hung, paged, and a store of some size."""
    cfg = write_cfg(work, min_stall=3)
    job = JobLog(work / "outputs", "6301")
    for k in range(8):
        job.step(k, seconds=0.2)
    d = start_daemon(cfg, work / "outputs", work / "first.out")
    procs.append(d)
    wait_for(lambda: any(n["event"] == "open" for n in notes(work)), "a hang page")
    assert stop(d) == 0
    (work / "state" / "notifications.jsonl").unlink()  # later pages are what the test looks at
    return cfg


@pytest.mark.parametrize("damage", ["random bytes", "half truncated"])
def test_a_damaged_store_at_start_is_quarantined_and_the_daemon_runs_clean(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]], damage: str
) -> None:
    work = short_tmp
    cfg = make_state_with_history(work, procs)
    db = work / "state" / "alerts.sqlite3"
    if damage == "random bytes":
        db.write_bytes(os.urandom(db.stat().st_size))
    else:
        os.truncate(db, db.stat().st_size // 2)

    d = start_daemon(cfg, work / "outputs", work / "daemon.out")
    procs.append(d)
    wait_for(lambda: any(n["kind"] == "notice" for n in notes(work)), "the quarantine notice")
    assert d.poll() is None and running(cfg)
    (notice,) = [n for n in notes(work) if n["kind"] == "notice"]
    assert notice["severity"] == "warning" and "moved aside" in notice["body"]
    aside = [f for f in (work / "state").iterdir() if ".corrupt-" in f.name]
    assert aside and any(f.name.startswith("alerts.sqlite3.corrupt-") for f in aside)
    # Started clean: the job still hangs, so it is paged again (the old store was lost).
    wait_for(lambda: any(n["event"] == "open" for n in notes(work)), "the hang paged again")
    assert stop(d) == 0
    out = (work / "daemon.out").read_text()
    assert "Traceback" not in out
    (loud,) = [e for e in log_events(work / "daemon.out") if e["event"] == "state_store_quarantined"]
    assert loud["level"] == "error" and loud["moved_to"]


def test_an_unreadable_outbox_row_is_skipped_marked_dead_and_delivery_goes_on(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work = short_tmp
    cfg = write_cfg(work, min_stall=3)
    (work / "outputs").mkdir()
    d = start_daemon(cfg, work / "outputs", work / "first.out")
    procs.append(d)
    wait_for(lambda: running(cfg), "the daemon")
    assert stop(d) == 0
    now = time.time()
    with sqlite3.connect(work / "state" / "alerts.sqlite3") as c:
        for nid, data in (("bad-row", '{"id": "bad-row", "event": '), ("bad-type", '"just a string"')):
            c.execute("INSERT INTO outbox VALUES (?, ?, ?)", (nid, now, data))
            for notifier in ("console", "jsonl"):
                c.execute(
                    "INSERT INTO deliveries VALUES (?, ?, 'pending', 0, ?, NULL, NULL)", (nid, notifier, now)
                )
    job = JobLog(work / "outputs", "6302")  # a real page queued after the bad rows
    for k in range(8):
        job.step(k, seconds=0.2)

    d2 = start_daemon(cfg, work / "outputs", work / "daemon.out")
    procs.append(d2)
    wait_for(lambda: any(n["event"] == "open" for n in notes(work)), "the hang page after the bad rows")
    assert d2.poll() is None and running(cfg)
    assert [n["job_id"] for n in notes(work)] == ["6302"]
    assert stop(d2) == 0
    bad = [e for e in log_events(work / "daemon.out") if e["event"] == "delivery_unreadable"]
    assert sorted((e["notification"], e["notifier"]) for e in bad) == [
        ("bad-row", "console"),
        ("bad-row", "jsonl"),
        ("bad-type", "console"),
        ("bad-type", "jsonl"),
    ]
    with sqlite3.connect(work / "state" / "alerts.sqlite3") as c:
        rows = c.execute(
            "SELECT DISTINCT status FROM deliveries WHERE notification_id LIKE 'bad-%'"
        ).fetchall()
    assert rows == [("dead",)]
    assert "Traceback" not in (work / "daemon.out").read_text()


LOCKER = """
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
if sys.argv[2] == "exclusive":
    c.execute("PRAGMA locking_mode=EXCLUSIVE")  # nobody else may even read
c.execute("BEGIN EXCLUSIVE")
c.execute("INSERT INTO meta (key, value) VALUES ('held-by', 'another process')")
print("locked", flush=True)
sys.stdin.read()  # hold the lock until the test closes our stdin
c.execute("ROLLBACK")
"""


def lock_store(work: Path, mode: str, procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    locker = subprocess.Popen(
        [PY, "-c", LOCKER, str(work / "state" / "alerts.sqlite3"), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    procs.append(locker)
    assert locker.stdout is not None and locker.stdout.readline() == b"locked\n"
    return locker


def release(locker: subprocess.Popen[bytes]) -> None:
    assert locker.stdin is not None
    locker.stdin.close()
    assert locker.wait(timeout=10) == 0


def test_a_store_another_process_keeps_unreadable_at_start_is_waited_for(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work = short_tmp
    cfg = make_state_with_history(work, procs)
    locker = lock_store(work, "exclusive", procs)
    d = start_daemon(cfg, work / "outputs", work / "daemon.out")
    procs.append(d)
    out = work / "daemon.out"
    wait_for(lambda: b"state_store_waiting" in out.read_bytes(), "the daemon to say it waits")
    time.sleep(7)  # another attempt (every 5 s): still waiting, still one line, no traceback
    assert d.poll() is None and not running(cfg)
    text = out.read_text()
    assert "Traceback" not in text and text.count("state_store_waiting") == 1
    (waiting,) = [e for e in log_events(out) if e["event"] == "state_store_waiting"]
    assert "database is locked" in waiting["error"]

    release(locker)
    wait_for(lambda: running(cfg), "the daemon to start once the lock is gone")
    # The job from the earlier run is still hung: its open incident is loaded, not paged twice.
    assert [i["kind"] for i in status(cfg)["status"]["open_incidents"]] == ["hang"]
    assert stop(d) == 0
    assert notes(work) == []


def test_a_page_made_while_another_process_holds_the_write_lock_is_sent_once_it_is_released(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work = short_tmp
    cfg = make_state_with_history(work, procs)
    locker = lock_store(work, "write", procs)
    job = JobLog(work / "outputs", "6303")
    for k in range(8):
        job.step(k, seconds=0.2)
    d = start_daemon(cfg, work / "outputs", work / "daemon.out")
    procs.append(d)
    out = work / "daemon.out"

    def both_open() -> bool:
        st = status(cfg)
        return bool(st.get("running")) and len(st["status"]["open_incidents"]) == 2

    wait_for(both_open, "the new hang to open while the store is locked")
    assert notes(work) == []  # held: the incident and its page are written together, later
    # One line per writer (alerts, tail offsets), not one per tick.
    failing = [e for e in log_events(out) if e["event"] == "state_store_failing"]
    assert sorted(e["state_store"] for e in failing) == ["state store", "tail offsets"]
    assert all("database is locked" in e["error"] for e in failing)

    release(locker)
    wait_for(lambda: [n["job_id"] for n in notes(work)] == ["6303"], "the held page")
    assert stop(d) == 0
    assert [(n["event"], n["job_id"]) for n in notes(work)] == [("open", "6303")]
    assert "Traceback" not in out.read_text()


def test_a_second_daemon_on_the_same_state_dir_is_refused_with_one_line(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work = short_tmp
    cfg = write_cfg(work, min_stall=3)
    (work / "outputs").mkdir()
    d = start_daemon(cfg, work / "outputs", work / "first.out")
    procs.append(d)
    wait_for(lambda: running(cfg), "the first daemon")
    other = cfg.with_name("other.toml")
    other.write_text(cfg.read_text().replace("jd.sock", "other.sock"))
    second = subprocess.run(
        [PY, "-m", "jobdiagd.cli", "run", "--config", str(other), "--watch", str(work / "outputs")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode == 2
    assert second.stderr.strip().count("\n") == 0
    assert f"is in use by another jobdiagd (pid {d.pid})" in second.stderr
    assert stop(d) == 0
