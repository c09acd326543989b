"""Store, outbox and pipeline: durability, idempotency, and crash safety with a real kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobdiagd.alerts.outbox import Outbox
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.alerts.store import AlertStore
from jobdiagd.config import IncidentsConfig
from jobdiagd.model.alerts import Finding, Notification
from jobdiagd.notifiers.dispatcher import Dispatcher
from jobdiagd.notifiers.jsonl import JsonlNotifier

T0 = 1_800_000_000.0
CHILD = Path(__file__).with_name("outbox_crash_child.py")


class Recorder:
    def __init__(self, name: str = "recorder") -> None:
        self.name = name
        self.got: list[Notification] = []

    def render(self, notification: Notification) -> str:
        return notification.title

    async def send(self, notification: Notification) -> None:
        self.got.append(notification)


def note(nid: str, t: float = T0) -> Notification:
    return Notification(nid, "1", "hang", "open", f"title {nid}", "body", t)


def jsonl_ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]


def test_store_pragmas(tmp_path: Path) -> None:
    store = AlertStore.in_state_dir(tmp_path)
    assert store.pragma("journal_mode") == "wal"
    assert store.pragma("synchronous") == 2  # FULL
    assert (tmp_path / "alerts.sqlite3").exists()
    store.close()


def test_enqueue_is_idempotent_on_id(tmp_path: Path) -> None:
    store = AlertStore.in_state_dir(tmp_path)
    box = Outbox(store, ["a", "b"])
    assert [n.id for n in box.enqueue([note("x"), note("y")], T0)] == ["x", "y"]
    assert box.enqueue([note("x")], T0 + 5) == []
    assert box.pending_count() == 4
    assert [d.notification.id for d in box.due("a", T0)] == ["x", "y"]
    box.mark_sent("x", "a", T0 + 1)
    assert [d.notification.id for d in box.due("a", T0 + 1)] == ["y"]
    assert [d.notification.id for d in box.due("b", T0 + 1)] == ["x", "y"]
    assert box.counts() == {"a": {"pending": 1, "sent": 1}, "b": {"pending": 2}}
    store.close()


def test_transaction_rolls_back_incident_and_outbox_together(tmp_path: Path) -> None:
    store = AlertStore.in_state_dir(tmp_path)
    box = Outbox(store, ["a"])
    with pytest.raises(RuntimeError), store.transaction():
        box.enqueue([note("x")], T0)
        raise RuntimeError("crash inside the transaction")
    assert box.pending_count() == 0
    store.close()


def test_pipeline_persists_incidents_across_restart(tmp_path: Path) -> None:
    cfg = IncidentsConfig(reminder_interval_seconds=600)
    kicks: list[int] = []
    p = AlertPipeline.open(tmp_path, cfg, ["recorder"], on_enqueue=lambda: kicks.append(1))
    f = Finding("hang", "7", "hang", "critical", "stalled", at_step=10)
    assert [n.id for n in p.observe([f], T0)] == ["7:hang:1:open"]
    assert kicks == [1]
    p.ack("7", "hang", T0 + 1, by="bob")
    p.mute("8", "*", T0 + 999, T0)
    p.close()

    p2 = AlertPipeline.open(tmp_path, cfg, ["recorder"])
    [inc] = p2.book.open_incidents()
    assert (inc.id, inc.acked_by) == ("7:hang:1", "bob")
    assert p2.book.is_muted("8", "hang", T0 + 1)
    assert p2.observe([f], T0 + 10_000) == []  # acked: no reminder
    [r] = p2.observe(
        [Finding("hang", "7", "hang", "critical", "steps resumed at step 11", resolved=True)], T0 + 20_000
    )
    assert r.event == "resolve"
    assert p2.open_counts() == {}
    p2.close()


def test_pipeline_report_and_notice_are_idempotent(tmp_path: Path) -> None:
    p = AlertPipeline.open(tmp_path, IncidentsConfig(), ["recorder"])
    assert len(p.report("7", "job-end", "final", "job 7 ended", "**FAILED** at step 10", T0)) == 1
    assert p.report("7", "job-end", "final", "job 7 ended", "again", T0 + 1) == []
    assert len(p.notice("squeue-down-1", "squeue failing", "...", T0, severity="warning")) == 1
    assert p.outbox.pending_count() == 2
    p.close()


def _run_child(mode: str, state_dir: Path, until: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), mode, str(state_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(until):
                break
        assert any(line.startswith(until) for line in lines), lines
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_kill_between_enqueue_and_send_delivers_exactly_once(tmp_path: Path) -> None:
    _run_child("enqueue", tmp_path, "ENQUEUED")
    out = tmp_path / "out.jsonl"
    for _restart in range(2):
        p = AlertPipeline.open(tmp_path, IncidentsConfig(), ["jsonl", "recorder"])
        rec = Recorder()
        d = Dispatcher(p.outbox, [JsonlNotifier(out), rec], now=lambda: T0 + 5)
        await d.drain()
        # The restarted book knows the incident is open and announced: no second "open".
        assert p.observe([Finding("hang", "4242", "hang", "critical", "still")], T0 + 6) == []
        p.close()
        if _restart == 0:
            assert [n.id for n in rec.got] == ["4242:hang:1:open"]
        else:
            assert rec.got == []
    assert jsonl_ids(out) == ["4242:hang:1:open"]


async def test_kill_between_send_and_mark_does_not_duplicate_jsonl(tmp_path: Path) -> None:
    _run_child("send", tmp_path, "SENT")
    out = tmp_path / "out.jsonl"
    assert jsonl_ids(out) == ["4242:hang:1:open"]
    p = AlertPipeline.open(tmp_path, IncidentsConfig(), ["jsonl", "recorder"])
    assert p.outbox.pending_count("jsonl") == 1  # the mark never happened
    rec = Recorder()
    result = await Dispatcher(p.outbox, [JsonlNotifier(out), rec], now=lambda: T0 + 5).drain()
    assert result.sent == 2
    assert jsonl_ids(out) == ["4242:hang:1:open"]  # the resend was recognised by id
    assert [n.id for n in rec.got] == ["4242:hang:1:open"]
    assert p.outbox.pending_count() == 0
    p.close()


async def test_jsonl_survives_torn_last_line(tmp_path: Path) -> None:
    out = tmp_path / "n.jsonl"
    out.write_text('{"id": "a"}\n{"id": "b", "tit')
    j = JsonlNotifier(out)
    await j.send(note("a"))
    await j.send(note("c"))
    lines = out.read_text().splitlines()
    assert json.loads(lines[-1])["id"] == "c"
    assert len(lines) == 3  # "a" skipped; "c" not glued onto the torn line


def test_removed_notifier_does_not_keep_deliveries_pending(tmp_path: Path) -> None:
    p = AlertPipeline.open(tmp_path, IncidentsConfig(), ["console", "telegram"])
    p.observe([Finding("hang", "1", "hang", "critical", "stalled")], T0)
    p.close()
    p = AlertPipeline.open(tmp_path, IncidentsConfig(), ["console"])
    assert p.outbox.counts() == {"console": {"pending": 1}, "telegram": {"dead": 1}}
    assert p.outbox.prune(T0 + 1) == 0  # console still owes it
    p.outbox.mark_sent("1:hang:1:open", "console", T0 + 1)
    assert p.outbox.prune(T0 + 1) == 1
    assert p.outbox.counts() == {}
    p.close()
