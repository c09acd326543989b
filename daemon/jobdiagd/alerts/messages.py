"""Where each notification landed in a chat (message ids per notifier and destination), kept in SQLite.

Chat transports record a message right after the API accepted it, before the outbox marks the
delivery sent. A retry of the same notification (a crash between the two, or a send that timed
out after the server took it) finds the record and does not post again; only a crash inside
the few milliseconds between the server's answer and this record can repeat one message.
Edits, replies and the buttons' tokens all find the incident's message here, after restarts too;
a job that a recovery restart made finds the thread of the job it replaces (`thread_of`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jobdiagd.alerts.store import AlertStore
from jobdiagd.model.alerts import Incident

Role = Literal["parent", "reply"]
MAX_CHAIN = 32  # restarts of one job followed back to find its thread


@dataclass(frozen=True, slots=True)
class ChatMessageRef:
    """One message a transport posted: `destination` is the chat/channel id as text."""

    notifier: str
    destination: str
    message_id: str
    notification_id: str
    incident_id: str | None
    job_id: str
    role: Role
    kind: str  # "text" | "photo" | "document" (how the transport must edit it)
    extra: Mapping[str, Any] | None = None  # transport-specific (e.g. Slack's thread ts)
    created_at: float = 0.0


class MessageStore:
    """Transport-neutral record of posted messages; runs on the event loop's thread like the store."""

    def __init__(self, store: AlertStore) -> None:
        self.store = store

    def record(self, ref: ChatMessageRef) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO chat_messages (notifier, destination, message_id, notification_id,"
                " incident_id, job_id, role, kind, extra, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    ref.notifier,
                    ref.destination,
                    ref.message_id,
                    ref.notification_id,
                    ref.incident_id,
                    ref.job_id,
                    ref.role,
                    ref.kind,
                    None if ref.extra is None else json.dumps(dict(ref.extra), sort_keys=True),
                    ref.created_at,
                ),
            )

    def forget(self, notifier: str, destination: str, message_id: str) -> None:
        """The message is gone (deleted in the chat): the next edit posts a new one."""
        with self.store.transaction() as conn:
            conn.execute(
                "DELETE FROM chat_messages WHERE notifier = ? AND destination = ? AND message_id = ?",
                (notifier, destination, message_id),
            )

    def sent(self, notification_id: str, notifier: str) -> list[ChatMessageRef]:
        """What this notification already produced for this notifier (a retry must not repeat it)."""
        return self._select("notification_id = ? AND notifier = ?", (notification_id, notifier))

    def parents(self, incident_id: str, notifier: str) -> list[ChatMessageRef]:
        """The incident's message in every destination it was posted to."""
        return self._select("incident_id = ? AND notifier = ? AND role = 'parent'", (incident_id, notifier))

    def job_parents(self, job_id: str, notifier: str) -> list[ChatMessageRef]:
        """Incident messages of a job, newest first (the job-end report replies to them)."""
        return self._select("job_id = ? AND notifier = ? AND role = 'parent'", (job_id, notifier))[::-1]

    def thread_of(self, job_id: str, notifier: str) -> list[ChatMessageRef]:
        """Where a restarted job's messages go (rule REC-11): the incident messages of the job it
        replaces, newest first, up its chain of restarts to the first job that has any; [] for a
        job that replaces none. Read from the recovery tables of the same store."""
        seen = {job_id}
        current = job_id
        for _ in range(MAX_CHAIN):
            row = self.store.conn.execute(
                "SELECT parent FROM recovery_runs WHERE job_id = ? ORDER BY attempt DESC LIMIT 1", (current,)
            ).fetchone()
            parent = str(row["parent"]) if row is not None else None
            if parent is None or parent in seen:
                return []
            found = self.job_parents(parent, notifier)
            if found:
                return found
            seen.add(parent)
            current = parent
        return []

    def incident_token(self, incident_id: str) -> int | None:
        return self.store.incident_token(incident_id)

    def incident_by_token(self, token: int) -> Incident | None:
        return self.store.incident_by_token(token)

    def prune(self, older_than: float) -> int:
        """Forget messages of incidents resolved (and reports/notices posted) before `older_than`."""
        with self.store.transaction() as conn:
            cur = conn.execute(
                "DELETE FROM chat_messages WHERE created_at < ? AND (incident_id IS NULL OR incident_id IN"
                " (SELECT id FROM incidents WHERE is_open = 0))",
                (older_than,),
            )
        return cur.rowcount

    def _select(self, where: str, args: tuple[Any, ...]) -> list[ChatMessageRef]:
        rows = self.store.conn.execute(
            # `where` is one of this class's constant clauses; the values are bound parameters.
            "SELECT notifier, destination, message_id, notification_id, incident_id, job_id, role, kind,"  # noqa: S608
            f" extra, created_at FROM chat_messages WHERE {where} ORDER BY created_at, rowid",
            args,
        ).fetchall()
        return [
            ChatMessageRef(
                notifier=r["notifier"],
                destination=r["destination"],
                message_id=r["message_id"],
                notification_id=r["notification_id"],
                incident_id=r["incident_id"],
                job_id=r["job_id"],
                role="parent" if r["role"] == "parent" else "reply",
                kind=r["kind"],
                extra=json.loads(r["extra"]) if r["extra"] else None,
                created_at=float(r["created_at"]),
            )
            for r in rows
        ]
