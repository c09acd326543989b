"""Ties the incident book to the store and outbox: each call persists state and enqueues in one transaction."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jobdiagd.alerts.incidents import IncidentBook, make_notice, make_report
from jobdiagd.alerts.outbox import Outbox
from jobdiagd.alerts.store import AlertStore
from jobdiagd.config import IncidentsConfig
from jobdiagd.model.alerts import Finding, Incident, Mute, Notification, Severity


class AlertPipeline:
    """Findings in, notifications durably queued; `on_enqueue` (the dispatcher's kick) runs after commit."""

    def __init__(
        self,
        store: AlertStore,
        book: IncidentBook,
        outbox: Outbox,
        on_enqueue: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.book = book
        self.outbox = outbox
        self.on_enqueue = on_enqueue

    @classmethod
    def open(
        cls,
        state_dir: str | Path,
        cfg: IncidentsConfig,
        notifier_names: Sequence[str],
        on_enqueue: Callable[[], None] | None = None,
    ) -> AlertPipeline:
        """Open (or create) the store in `state_dir` and load open incidents and mutes from it.

        Deliveries still pending for a notifier that is no longer configured are abandoned (a
        removed notifier would otherwise keep them pending forever).
        """
        store = AlertStore.in_state_dir(state_dir)
        book = IncidentBook.from_config(
            cfg, incidents=store.load_incidents(), seqs=store.load_seqs(), mutes=store.load_mutes()
        )
        outbox = Outbox(store, notifier_names)
        outbox.abandon_unconfigured()
        return cls(store, book, outbox, on_enqueue)

    def close(self) -> None:
        self.store.close()

    # -- inputs ----------------------------------------------------------

    def observe(self, findings: Iterable[Finding], now: float) -> list[Notification]:
        return self._commit(self.book.observe_all(findings, now), now)

    def job_ended(self, job_id: str, state: str, now: float) -> list[Notification]:
        return self._commit(self.book.job_ended(job_id, now, state), now)

    def ack(self, job_id: str, kind: str, now: float, by: str | None = None) -> Incident | None:
        before = self.book.get(job_id, kind)
        inc = self.book.ack(job_id, kind, now, by)
        changed = inc is not None and (before is None or before.acked_at is None)
        notes = self.book.updates([inc], f"acked by {by or 'someone'}", now) if changed and inc else []
        self._commit(notes, now)
        return inc

    def mute(self, job_id: str, kind: str, until: float, now: float, by: str | None = None) -> Mute:
        mute = self.book.mute(job_id, kind, until, now, by)
        affected = [i for i in self.book.open_incidents() if mute.covers(i.job_id, i.kind, now)]
        self._commit(self.book.updates(affected, f"muted by {by or 'someone'}", now), now)
        return mute

    def unmute(self, job_id: str, kind: str, now: float, by: str | None = None) -> bool:
        was = [
            i for i in self.book.open_incidents() if self.book.covering_mute(i.job_id, i.kind, now) is not None
        ]
        removed = self.book.unmute(job_id, kind, now)
        # Only the incidents the removed mute no longer silences change their message.
        affected = [i for i in was if self.book.covering_mute(i.job_id, i.kind, now) is None]
        self._commit(self.book.updates(affected, f"unmuted by {by or 'someone'}", now), now)
        return removed

    def report(
        self,
        job_id: str,
        kind: str,
        key: str,
        title: str,
        body: str,
        now: float,
        owner: str | None = None,
    ) -> list[Notification]:
        return self._commit([make_report(job_id, kind, key, title, body, now, owner)], now)

    def notice(
        self, key: str, title: str, body: str, now: float, severity: Severity = "info"
    ) -> list[Notification]:
        return self._commit([make_notice(key, title, body, now, severity=severity)], now)

    # -- outputs ---------------------------------------------------------

    def open_counts(self) -> dict[str, int]:
        """Open incidents by kind (for the incidents gauge)."""
        return dict(Counter(i.kind for i in self.book.open_incidents()))

    def snapshot(self, now: float) -> dict[str, Any]:
        """JSON-ready view for the status socket."""
        return {
            "open_incidents": [asdict(i) for i in self.book.open_incidents()],
            "mutes": [asdict(m) for m in self.book.active_mutes(now)],
            "deliveries": self.outbox.counts(),
        }

    def _commit(self, notifications: list[Notification], now: float) -> list[Notification]:
        changes = self.book.take_changes()
        try:
            with self.store.transaction():
                if changes.incidents:
                    self.store.save_incidents(changes.incidents)
                if changes.mutes is not None:
                    self.store.replace_mutes(changes.mutes)
                added = self.outbox.enqueue(notifications, now) if notifications else []
        except Exception:
            # The store is unchanged; the book is ahead of it. The changes are written by the next
            # commit, but this call's notifications are not queued: the caller must log the error.
            # After a restart the book reloads from the store and re-creates them (same ids).
            self.book.requeue(changes)
            raise
        if added and self.on_enqueue is not None:
            self.on_enqueue()
        return added
