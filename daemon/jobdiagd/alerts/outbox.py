"""The outbox: a notification is stored before any send and marked per notifier after, so a crash loses none."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from jobdiagd.alerts.store import AlertStore
from jobdiagd.model.alerts import Notification


@dataclass(frozen=True, slots=True)
class Delivery:
    """One notification still owed to one notifier."""

    notification: Notification
    notifier: str
    attempts: int
    next_attempt_at: float
    last_error: str | None


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

    def abandon_unconfigured(self) -> int:
        """Mark pending deliveries for notifiers no longer configured as dead; returns how many."""
        marks = ",".join("?" * len(self.notifiers))
        with self.store.transaction() as conn:
            cur = conn.execute(
                "UPDATE deliveries SET status = 'dead', last_error = 'notifier no longer configured'"
                f" WHERE status = 'pending' AND notifier NOT IN ({marks})",
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

    def due(self, notifier: str, now: float, limit: int = 50) -> list[Delivery]:
        """Pending deliveries in creation order, stopping at the first not yet due.

        Head-of-line: while the oldest one waits for its retry, nothing newer overtakes it, so a
        destination sees "open" before "resolve" even across restarts.
        """
        rows = self.store.conn.execute(
            "SELECT o.data, d.attempts, d.next_attempt_at, d.last_error FROM deliveries d"
            " JOIN outbox o ON o.id = d.notification_id"
            " WHERE d.notifier = ? AND d.status = 'pending'"
            " ORDER BY o.created_at, o.rowid LIMIT ?",
            (notifier, limit),
        ).fetchall()
        out: list[Delivery] = []
        for r in rows:
            if float(r["next_attempt_at"]) > now:
                break
            out.append(
                Delivery(
                    Notification.from_json(r["data"]),
                    notifier,
                    int(r["attempts"]),
                    float(r["next_attempt_at"]),
                    r["last_error"],
                )
            )
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
        row = self.store.conn.execute(
            "SELECT d.next_attempt_at FROM deliveries d JOIN outbox o ON o.id = d.notification_id"
            " WHERE d.notifier = ? AND d.status = 'pending' ORDER BY o.created_at, o.rowid LIMIT 1",
            (notifier,),
        ).fetchone()
        return None if row is None else float(row[0])

    def mark_sent(self, notification_id: str, notifier: str, now: float) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE deliveries SET status = 'sent', sent_at = ?, attempts = attempts + 1, last_error = NULL"
                " WHERE notification_id = ? AND notifier = ?",
                (now, notification_id, notifier),
            )

    def mark_failed(self, notification_id: str, notifier: str, error: str, retry_at: float | None) -> None:
        """Record a failed attempt; retry_at=None gives up on this delivery (status 'dead')."""
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE deliveries SET attempts = attempts + 1, last_error = ?,"
                " status = CASE WHEN ? IS NULL THEN 'dead' ELSE 'pending' END,"
                " next_attempt_at = COALESCE(?, next_attempt_at)"
                " WHERE notification_id = ? AND notifier = ?",
                (error[:2000], retry_at, retry_at, notification_id, notifier),
            )

    def counts(self) -> dict[str, dict[str, int]]:
        """{notifier: {status: n}} for the status socket and metrics."""
        out: dict[str, dict[str, int]] = {}
        for r in self.store.conn.execute(
            "SELECT notifier, status, COUNT(*) FROM deliveries GROUP BY notifier, status"
        ):
            out.setdefault(r[0], {})[r[1]] = int(r[2])
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
        return int(row[0])

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
