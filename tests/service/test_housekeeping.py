"""History pruning: finished notifications and resolved incidents' chat links go, pending work stays."""

from __future__ import annotations

from pathlib import Path

from jobdiagd.alerts.messages import ChatMessageRef, MessageStore
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import DeliveryConfig, IncidentsConfig
from jobdiagd.model.alerts import Finding
from jobdiagd.service.housekeeping import prune_history, prune_loop

T0 = 1_800_000_000.0
KEEP = DeliveryConfig().keep_history_seconds


def chat_ref(message_id: str, incident_id: str | None, at: float) -> ChatMessageRef:
    return ChatMessageRef(
        "telegram", "-100", message_id, f"n{message_id}", incident_id, "7", "parent", "text", None, at
    )


def rows(p: AlertPipeline, table: str) -> int:
    return int(p.store.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def test_old_finished_history_is_pruned_and_pending_or_open_work_is_kept(tmp_path: Path) -> None:
    p = AlertPipeline.open(tmp_path, IncidentsConfig(), ["console"])
    delivered = p.observe([Finding("hang", "1", "hang", "critical", "stalled")], T0)
    pending = p.observe([Finding("hang", "2", "hang", "critical", "stalled")], T0)
    p.outbox.mark_sent(delivered[0].id, "console", T0 + 1)
    open_incident = next(i for i in p.book.open_incidents() if i.job_id == "2")
    messages = MessageStore(p.store)
    messages.record(chat_ref("1", None, T0))  # a report, old
    messages.record(chat_ref("2", open_incident.id, T0))  # an open incident's page, old
    messages.record(chat_ref("3", None, T0 + KEEP))  # a report, fresh

    assert prune_history(p.outbox, messages, T0 + KEEP - 1, KEEP).notifications == 0  # not old yet
    pruned = prune_history(p.outbox, messages, T0 + KEEP + 10, KEEP)

    assert (pruned.notifications, pruned.chat_messages) == (1, 1)
    assert [d.notification.id for d in p.outbox.due("console", T0 + KEEP + 10)] == [pending[0].id]
    assert rows(p, "outbox") == 1
    remaining = {r[0] for r in p.store.conn.execute("SELECT message_id FROM chat_messages")}
    assert remaining == {"2", "3"}
    p.close()


async def test_a_failing_prune_is_logged_and_retried_not_raised(tmp_path: Path) -> None:
    p = AlertPipeline.open(tmp_path, IncidentsConfig(), ["console"])
    messages = MessageStore(p.store)
    p.close()  # every statement now fails with sqlite3.ProgrammingError
    sleeps: list[float] = []

    async def sleep(seconds: float) -> bool:
        sleeps.append(seconds)
        return len(sleeps) >= 2  # stop after the second pass

    await prune_loop(p.outbox, messages, lambda: KEEP, sleep, every=60.0)
    assert sleeps == [60.0, 60.0]
