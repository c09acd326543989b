"""The alert store under real faults: a full tmpfs, a damaged file, unreadable rows, a newer schema."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from jobdiagd.alerts import store as store_mod
from jobdiagd.alerts.outbox import Outbox
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.alerts.store import DB_NAME, AlertStore, StoreCorrupt, StoreError
from jobdiagd.config import IncidentsConfig
from jobdiagd.edge_trigger import EdgeTrigger
from jobdiagd.model.alerts import Finding, Notification
from jobdiagd.notifiers.dispatcher import Dispatcher, RetryPolicy
from jobdiagd.notifiers.jsonl import JsonlNotifier
from tests.helpers.small_disk import fill, tmpfs

T0 = 1_800_000_000.0
HANG = Finding("hang", "42", "hang", "critical", "no step since step 9", at_step=9)


class Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.got: list[str] = []

    def render(self, notification: Notification) -> str:
        return notification.title

    async def send(self, notification: Notification) -> None:
        self.got.append(notification.id)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "state", "1m") as d:
        yield d


def stored(state: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(state / DB_NAME) as c:
        return [tuple(r) for r in c.execute(sql)]


def test_a_page_made_on_a_full_disk_is_written_with_its_incident_once_space_returns(disk: Path) -> None:
    watch = EdgeTrigger("state store", kind="state_store")
    kicks: list[int] = []
    p = AlertPipeline.open(disk, IncidentsConfig(), ["recorder"], on_enqueue=lambda: kicks.append(1))
    p.store.watch = watch
    ballast = fill(disk)
    with structlog.testing.capture_logs() as logs:
        assert p.observe([HANG], T0) == []  # SQLite said "database or disk is full": nothing stored
        for k in range(1, 6):
            assert p.observe([HANG], T0 + k) == []
        assert [n.id for n in p.held] == ["42:hang:1:open"]
        assert p.snapshot(T0)["unsaved_notifications"] == 1
        assert [i.kind for i in p.book.open_incidents()] == ["hang"]  # the book knows
        assert stored(disk, "SELECT id FROM incidents") == []  # ...the store does not, nor the outbox
        assert stored(disk, "SELECT id FROM outbox") == []
        ballast.unlink()
        added = p.observe([HANG], T0 + 10)
    assert [n.id for n in added] == ["42:hang:1:open"] and kicks == [1]
    assert p.held == []
    # One transaction wrote both: the incident as announced and its page.
    (data,) = stored(disk, "SELECT data FROM incidents")
    assert json.loads(str(data[0]))["announced_at"] == T0
    assert stored(disk, "SELECT id FROM outbox") == [("42:hang:1:open",)]
    # Edge-triggered: one line when writes failed (6 failures), one when they worked again.
    assert [e["event"] for e in logs] == ["state_store_failing", "state_store_recovered"]
    assert "database or disk is full" in logs[0]["error"]
    p.close()


def test_ack_mute_report_and_notice_on_a_full_disk_are_kept_in_order(disk: Path) -> None:
    p = AlertPipeline.open(disk, IncidentsConfig(), ["recorder"])
    p.observe([HANG], T0)
    ballast = fill(disk)
    p.ack("42", "hang", T0 + 1, by="alice")
    p.mute("*", "tgs", T0 + 3600, T0 + 1)
    assert p.notice("blind:42", "monitoring blind: job 42", "gone", T0 + 2) == []
    assert p.report("42", "job-end", "end", "job 42 ended", "body", T0 + 3) == []
    ballast.unlink()
    p.flush(T0 + 4)
    assert stored(disk, "SELECT id FROM outbox ORDER BY created_at, rowid") == [
        ("42:hang:1:open",),
        ("42:hang:1:update:acked by alice:1800000001000",),  # the ack edits the page in place
        ("notice:blind:42",),
        ("report:42:job-end:end",),
    ]
    p.close()
    again = AlertPipeline.open(disk, IncidentsConfig(), ["recorder"])
    (inc,) = again.book.open_incidents()
    assert inc.acked_by == "alice"
    assert [(m.job_id, m.kind) for m in again.book.active_mutes(T0 + 5)] == [("*", "tgs")]
    again.close()


def test_a_restart_before_space_returns_finds_the_page_again(disk: Path) -> None:
    p = AlertPipeline.open(disk, IncidentsConfig(), ["recorder"])
    ballast = fill(disk)
    p.observe([HANG], T0)
    assert len(p.held) == 1
    p.close()  # the process stops with the page only in memory
    ballast.unlink()
    p2 = AlertPipeline.open(disk, IncidentsConfig(), ["recorder"])
    assert p2.book.open_incidents() == []  # the store never heard of it...
    assert [n.id for n in p2.observe([HANG], T0 + 30)] == ["42:hang:1:open"]  # ...so it is paged now
    p2.close()


async def test_deliveries_on_a_full_disk_are_sent_once_and_marked_later(disk: Path) -> None:
    box = Outbox(AlertStore.in_state_dir(disk), ["recorder"])
    box.enqueue([Notification(f"n{i}", "42", "hang", "open", "t", "b", T0 + i) for i in range(3)], T0)
    rec = Recorder()
    d = Dispatcher(box, [rec], policy=RetryPolicy(initial=1, maximum=2), now=lambda: T0 + 10)
    ballast = fill(disk)
    assert (await d.drain()).sent == 3
    assert (await d.drain()).sent == 0  # the marks could not be written, but nothing is resent
    assert rec.got == ["n0", "n1", "n2"]
    assert box.held_marks == 3 and box.pending_count() == 0
    assert stored(disk, "SELECT status FROM deliveries") == [("pending",)] * 3
    ballast.unlink()
    await d.drain()
    assert box.held_marks == 0
    assert stored(disk, "SELECT status FROM deliveries") == [("sent",)] * 3
    assert rec.got == ["n0", "n1", "n2"]
    box.store.close()


async def test_jsonl_append_on_a_full_disk_leaves_no_torn_line_and_is_retried(disk: Path) -> None:
    path = disk / "notifications.jsonl"
    j = JsonlNotifier(path)
    await j.send(Notification("a", "42", "hang", "open", "t", "b", T0))
    ballast = fill(disk)
    big = Notification("b", "42", "hang", "open", "t", "x" * 20000, T0)
    with pytest.raises(Exception, match="No space left"):
        await j.send(big)
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["a"]
    ballast.unlink()
    await j.send(big)
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["a", "b"]


# -- unreadable state ------------------------------------------------------------------


async def test_an_unreadable_outbox_row_is_marked_dead_and_the_queue_goes_on(tmp_path: Path) -> None:
    box = Outbox(AlertStore.in_state_dir(tmp_path), ["recorder"])
    box.enqueue([Notification("good-1", "42", "hang", "open", "t", "b", T0)], T0)
    with box.store.transaction() as c:
        c.execute(
            "INSERT INTO outbox (id, created_at, data) VALUES ('bad', ?, '{\"id\": \"bad\", trunc')",
            (T0 + 1,),
        )
        c.execute("INSERT INTO deliveries VALUES ('bad', 'recorder', 'pending', 0, ?, NULL, NULL)", (T0,))
        c.execute("INSERT INTO outbox (id, created_at, data) VALUES ('bad2', ?, '[1, 2]')", (T0 + 2,))
        c.execute("INSERT INTO deliveries VALUES ('bad2', 'recorder', 'pending', 0, ?, NULL, NULL)", (T0,))
    box.enqueue([Notification("good-2", "42", "hang", "resolve", "t", "b", T0 + 3)], T0)
    rec = Recorder()
    d = Dispatcher(box, [rec], now=lambda: T0 + 10)
    with structlog.testing.capture_logs() as logs:
        await d.drain()
    assert rec.got == ["good-1", "good-2"]
    assert [(e["event"], e["notification"]) for e in logs] == [
        ("delivery_unreadable", "bad"),
        ("delivery_unreadable", "bad2"),
    ]
    assert stored(tmp_path, "SELECT notification_id, status FROM deliveries ORDER BY rowid") == [
        ("good-1", "sent"),
        ("bad", "dead"),
        ("bad2", "dead"),
        ("good-2", "sent"),
    ]
    box.store.close()


async def test_the_delivery_worker_survives_a_store_error_and_recovers(tmp_path: Path) -> None:
    box = Outbox(AlertStore.in_state_dir(tmp_path), ["recorder"])
    rec = Recorder()
    d = Dispatcher(box, [rec], policy=RetryPolicy(initial=0.05, maximum=0.1))
    other = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)
    other.execute("ALTER TABLE deliveries RENAME TO deliveries_gone")  # every query of the worker fails
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(d.run())
        await asyncio.sleep(0.3)
        assert not task.done()  # logged and retried, not ended
        other.execute("ALTER TABLE deliveries_gone RENAME TO deliveries")
        now = time.time()  # the worker runs on the real clock
        box.enqueue([Notification("n", "42", "hang", "open", "t", "b", now)], now)
        d.kick()
        for _ in range(100):
            if rec.got:
                break
            await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert rec.got == ["n"]
    events = [e["event"] for e in logs]
    assert events.count("delivery_loop_failing") == 1 and events.count("delivery_loop_recovered") == 1
    other.close()
    box.store.close()


def test_unreadable_incident_and_mute_rows_are_skipped_and_named(tmp_path: Path) -> None:
    p = AlertPipeline.open(tmp_path, IncidentsConfig(), ["recorder"])
    p.observe([HANG, Finding("hang", "43", "hang", "critical", "x", at_step=1)], T0)
    p.close()
    with sqlite3.connect(tmp_path / DB_NAME) as c:
        c.execute("UPDATE incidents SET data = '{\"id\": 1' WHERE job_id = '42'")
        c.execute("INSERT INTO mutes VALUES ('*', 'tgs', 'soon', 0, NULL)")
    p2 = AlertPipeline.open(tmp_path, IncidentsConfig(), ["recorder"])
    assert [i.job_id for i in p2.book.open_incidents()] == ["43"]
    assert p2.book.active_mutes(T0) == []
    assert len(p2.store.unreadable) == 2 and "42:hang:1" in p2.store.unreadable[0]
    p2.close()
    p3 = AlertPipeline.open(tmp_path, IncidentsConfig(), ["recorder"])
    assert len(p3.store.unreadable) == 1  # the bad incident was closed: named once, not at every start
    p3.close()


@pytest.mark.parametrize("damage", ["random bytes", "half truncated", "garbage page"])
def test_a_damaged_store_is_moved_aside_and_a_clean_one_started_with_a_notice(
    tmp_path: Path, damage: str
) -> None:
    p = AlertPipeline.open(tmp_path, IncidentsConfig(), ["recorder"])
    for k in range(300):
        p.report(str(k), "job-end", "end", f"job {k} ended", "body " * 50, T0 + k)
    p.close()
    db = tmp_path / DB_NAME
    if damage == "random bytes":
        db.write_bytes(os.urandom(40000))
    elif damage == "half truncated":
        os.truncate(db, db.stat().st_size // 2)
    else:
        with db.open("r+b") as fh:
            fh.seek(4096 * 5)
            fh.write(os.urandom(4096))
    with pytest.raises(StoreCorrupt):
        AlertStore(db)
    p2 = AlertPipeline.open(tmp_path, IncidentsConfig(), ["recorder"], now=T0 + 1000)
    assert p2.quarantined is not None
    aside = sorted(f.name for f in tmp_path.iterdir() if ".corrupt-" in f.name)
    assert aside and aside[0] == "alerts.sqlite3.corrupt-20270115T081640Z"
    assert [f.name for f in p2.quarantined.moved] == aside
    (notice,) = p2.outbox.due("recorder", T0 + 1000)
    assert notice.notification.severity == "warning" and "moved aside" in notice.notification.body
    assert "alerts.sqlite3.corrupt-20270115T081640Z" in notice.notification.body
    p2.close()


def test_schema_migrations_run_once_and_a_newer_store_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    released = list(store_mod.MIGRATIONS)
    base = len(released) + 1
    AlertStore.in_state_dir(tmp_path).close()
    assert stored(tmp_path, "SELECT value FROM meta") == [(str(base),)]

    calls: list[int] = []

    def add_message_refs(conn: sqlite3.Connection) -> None:
        calls.append(1)
        conn.execute("CREATE TABLE message_refs (incident_id TEXT, notifier TEXT, ref TEXT)")

    monkeypatch.setattr(store_mod, "MIGRATIONS", [*released, add_message_refs])
    AlertStore.in_state_dir(tmp_path).close()
    AlertStore.in_state_dir(tmp_path).close()
    assert calls == [1]
    assert stored(tmp_path, "SELECT value FROM meta") == [(str(base + 1),)]

    monkeypatch.setattr(store_mod, "MIGRATIONS", released)
    before = (tmp_path / DB_NAME).read_bytes()
    with pytest.raises(
        StoreError, match=f"schema version {base + 1}, newer than this jobdiagd understands"
    ):
        AlertStore.in_state_dir(tmp_path)
    assert (tmp_path / DB_NAME).read_bytes() == before  # refused, not "repaired"


async def test_jsonl_with_random_bytes_still_takes_new_records(tmp_path: Path) -> None:
    path = tmp_path / "notifications.jsonl"
    garbage = bytes(b for b in range(256) if b != ord("\n")) * 12  # not UTF-8, not JSON
    path.write_bytes(garbage + b"\n" + garbage + b"\n" + b'{"id": "old"}\n')
    os.chmod(path, 0o600)
    j = JsonlNotifier(path)
    await j.send(Notification("old", "42", "hang", "open", "t", "b", T0))  # seen: skipped
    await j.send(Notification("new", "42", "hang", "open", "t", "b", T0))
    lines = path.read_bytes().split(b"\n")
    assert [json.loads(x)["id"] for x in lines[2:] if x] == ["old", "new"]


def test_a_version_1_store_gets_the_recovery_tables_and_keeps_its_incidents(tmp_path: Path) -> None:
    """Migration 1 -> 2 (recovery, docs/recovery.md) runs on a store made before it existed."""
    path = tmp_path / DB_NAME
    conn = sqlite3.connect(path)
    conn.executescript(store_mod._SCHEMA_V1)
    conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '1')")
    conn.execute(
        "INSERT INTO mutes (job_id, kind, until, created_at, by) VALUES ('42', 'hang', 9e9, 1.0, 'ops')"
    )
    conn.commit()
    conn.close()
    os.chmod(path, 0o600)
    store = AlertStore.in_state_dir(tmp_path)
    try:
        assert [m.job_id for m in store.load_mutes()] == ["42"]
        names = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"recovery_intents", "recovery_runs", "recovery_log", "node_evidence", "node_notices"} <= names
    finally:
        store.close()
    assert stored(tmp_path, "SELECT value FROM meta") == [("2",)]
