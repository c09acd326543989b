"""The outbox: a notification is stored before any send and marked per notifier after, so a crash loses none.

A mark that cannot be written (disk full, store locked) is kept in memory and written with the
next one: the delivery is not offered again meanwhile, so a full disk causes no repeat sends
(a restart before the mark is written resends it once, like a crash between send and mark).
A stored notification that does not parse is marked dead and reported in `bad_rows`; the
queue goes on with the next one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from jobdiagd.alerts.store import AlertStore, error_text
from jobdiagd.model.alerts import Notification


@dataclass(frozen=True, slots=True)
class Delivery:
    """One notification still owed to one notifier."""

    notification: Notification
    notifier: str
    attempts: int
    next_attempt_at: float
    last_error: str | None


@dataclass(frozen=True, slots=True)
class _Mark:
    status: Literal["sent", "dead"]
    at: float | None  # sent_at
    error: str | None


class Outbox:
    """Pending deliveries live in SQLite; `enqueue` is idempotent on the notification id.

    Each notification gets one delivery row per notifier named at enqueue time, so a notifier added
    later does not receive old history, and one that fails does not hold up the others.
    """

    def __init__(self, store: AlertStore, notifiers: Sequence[str]) -> None:
        if not notifiers:
            raise ValueError("an outbox needs at least one notifier name")
        self.store = store
        self.notifiers = tuple(notifiers)
        # (notification id, notifier) -> final mark not yet written to the store.
        self._held: dict[tuple[str, str], _Mark] = {}
        # (notifier, notification id, error) of stored rows that did not parse; the dispatcher logs them.
        self.bad_rows: list[tuple[str, str, str]] = []

    @property
    def held_marks(self) -> int:
        return len(self._held)

    def abandon_unconfigured(self) -> int:
        """Mark pending deliveries for notifiers no longer configured as dead; returns how many."""
        marks = ",".join("?" * len(self.notifiers))
        where = f" WHERE status = 'pending' AND notifier NOT IN ({marks})"
        if (
            self.store.conn.execute(f"SELECT 1 FROM deliveries{where} LIMIT 1", self.notifiers).fetchone()  # noqa: S608 (placeholders only)
            is None
        ):
            return 0  # nothing to do: no write (a full disk can still be read)
        with self.store.transaction() as conn:
            cur = conn.execute(
                "UPDATE deliveries SET status = 'dead', last_error = 'notifier no longer configured'" + where,  # noqa: S608
                self.notifiers,
            )
        return cur.rowcount

    def enqueue(self, notifications: Iterable[Notification], now: float) -> list[Notification]:
        """Store notifications (commits, or joins the caller's store.transaction()); returns the new ones."""
        added: list[Notification] = []
        with self.store.transaction() as conn:
            for n in notifications:
                cur = conn.execute(
                    "INSERT OR IGNORE INTO outbox (id, created_at, data) VALUES (?, ?, ?)",
                    (n.id, n.created_at, n.to_json()),
                )
                if cur.rowcount == 0:
                    continue  # same idempotency key already stored: a repeat after a restart
                conn.executemany(
                    "INSERT INTO deliveries (notification_id, notifier, status, next_attempt_at)"
                    " VALUES (?, ?, 'pending', ?)",
                    [(n.id, name, now) for name in self.notifiers],
                )
                added.append(n)
        return added

    def _pending_rows(self, notifier: str, limit: int) -> list[sqlite3.Row]:
        skip = sum(1 for _nid, name in self._held if name == notifier)
        rows = self.store.conn.execute(
            "SELECT d.notification_id, o.data, d.attempts, d.next_attempt_at, d.last_error FROM deliveries d"
            " JOIN outbox o ON o.id = d.notification_id"
            " WHERE d.notifier = ? AND d.status = 'pending'"
            " ORDER BY o.created_at, o.rowid LIMIT ?",
            (notifier, limit + skip),
        ).fetchall()
        return [r for r in rows if (r["notification_id"], notifier) not in self._held][:limit]

    def due(self, notifier: str, now: float, limit: int = 50) -> list[Delivery]:
        """Pending deliveries in creation order, stopping at the first not yet due.

        Head-of-line: while the oldest one waits for its retry, nothing newer overtakes it, so a
        destination sees "open" before "resolve" even across restarts. A row that does not parse
        is marked dead (it can never be sent) and skipped.
        """
        out: list[Delivery] = []
        for r in self._pending_rows(notifier, limit):
            nid = str(r["notification_id"])
            try:
                next_at = float(r["next_attempt_at"])
                if next_at > now:
                    break
                delivery = Delivery(
                    Notification.from_json(r["data"]), notifier, int(r["attempts"]), next_at, r["last_error"]
                )
            except (ValueError, KeyError, TypeError) as exc:
                error = f"unreadable stored notification: {error_text(exc)}"
                self.bad_rows.append((notifier, nid, error))
                self._mark(nid, notifier, _Mark("dead", None, error))
                continue
            out.append(delivery)
        return out

    def latest_for_incident(
        self, incident_id: str, events: Sequence[str] = ("open", "remind")
    ) -> Notification | None:
        """The newest stored notification of an incident among `events` (its current text).

        Incident notification ids start with "<incident id>:" (IncidentBook): a range on the
        primary key finds them without a scan.
        """
        rows = self.store.conn.execute(
            "SELECT data FROM outbox WHERE id > ? AND id < ? ORDER BY created_at DESC, rowid DESC",
            (incident_id + ":", incident_id + ";"),
        )
        for row in rows:
            n = Notification.from_json(row[0])
            if n.incident_id == incident_id and n.event in events:
                return n
        return None

    def next_attempt_at(self, notifier: str) -> float | None:
        """When the head of this notifier's queue is due (None: nothing pending)."""
        for r in self._pending_rows(notifier, 1):
            try:
                return float(r["next_attempt_at"])
            except (TypeError, ValueError):
                return float("-inf")  # due() marks it dead at once
        return None

    def mark_sent(self, notification_id: str, notifier: str, now: float) -> None:
        self._mark(notification_id, notifier, _Mark("sent", now, None))

    def mark_failed(self, notification_id: str, notifier: str, error: str, retry_at: float | None) -> None:
        """Record a failed attempt; retry_at=None gives up on this delivery (status 'dead')."""
        if retry_at is None:
            self._mark(notification_id, notifier, _Mark("dead", None, error))
            return
        try:
            with self.store.transaction() as conn:
                conn.execute(
                    "UPDATE deliveries SET attempts = attempts + 1, last_error = ?, next_attempt_at = ?"
                    " WHERE notification_id = ? AND notifier = ?",
                    (error[:2000], retry_at, notification_id, notifier),
                )
        except sqlite3.Error:
            pass  # the dispatcher's own backoff still holds; only the attempt count is not stored

    def flush_marks(self) -> bool:
        """Write held marks; True when none is left."""
        if not self._held:
            return True
        held = dict(self._held)
        try:
            with self.store.transaction() as conn:
                for (nid, name), mark in held.items():
                    self._write_mark(conn, nid, name, mark)
        except sqlite3.Error:
            return False
        for key in held:
            self._held.pop(key, None)
        return True

    def _mark(self, notification_id: str, notifier: str, mark: _Mark) -> None:
        key = (notification_id, notifier)
        self._held[key] = mark
        self.flush_marks()

    @staticmethod
    def _write_mark(conn: sqlite3.Connection, nid: str, notifier: str, mark: _Mark) -> None:
        if mark.status == "sent":
            conn.execute(
                "UPDATE deliveries SET status = 'sent', sent_at = ?, attempts = attempts + 1, last_error = NULL"
                " WHERE notification_id = ? AND notifier = ?",
                (mark.at, nid, notifier),
            )
        else:
            conn.execute(
                "UPDATE deliveries SET status = 'dead', attempts = attempts + 1, last_error = ?"
                " WHERE notification_id = ? AND notifier = ?",
                ((mark.error or "")[:2000], nid, notifier),
            )

    def counts(self) -> dict[str, dict[str, int]]:
        """{notifier: {status: n}} for the status socket and metrics (held marks counted as written)."""
        out: dict[str, dict[str, int]] = {}
        for r in self.store.conn.execute(
            "SELECT notifier, status, COUNT(*) FROM deliveries GROUP BY notifier, status"
        ):
            out.setdefault(r[0], {})[r[1]] = int(r[2])
        for (_nid, name), mark in self._held.items():
            by = out.setdefault(name, {})
            by["pending"] = by.get("pending", 0) - 1
            by[mark.status] = by.get(mark.status, 0) + 1
        return out

    def pending_count(self, notifier: str | None = None) -> int:
        if notifier is None:
            row = self.store.conn.execute(
                "SELECT COUNT(*) FROM deliveries WHERE status = 'pending'"
            ).fetchone()
        else:
            row = self.store.conn.execute(
                "SELECT COUNT(*) FROM deliveries WHERE status = 'pending' AND notifier = ?", (notifier,)
            ).fetchone()
        held = sum(1 for _nid, name in self._held if notifier is None or name == notifier)
        return int(row[0]) - held

    def prune(self, older_than: float) -> int:
        """Drop notifications created before `older_than` whose every delivery is finished."""
        with self.store.transaction() as conn:
            ids = [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM outbox WHERE created_at < ? AND NOT EXISTS"
                    " (SELECT 1 FROM deliveries d WHERE d.notification_id = outbox.id AND d.status = 'pending')",
                    (older_than,),
                )
            ]
            conn.executemany("DELETE FROM deliveries WHERE notification_id = ?", [(i,) for i in ids])
            conn.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
        return len(ids)
