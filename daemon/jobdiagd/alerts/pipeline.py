"""Ties the incident book to the store and outbox: each call persists state and enqueues in one transaction.

A page is delayed by a write fault, never lost (issue 7): when the commit fails (disk full, the
file locked, an I/O error) the book's changes are put back and the notifications they caused are
held in memory; every later commit (at the latest the next tick's) writes the held ones first, in
the same transaction as the incident changes, so an incident is never stored as announced
without its notification. If the process stops before that, nothing of it was stored: after the
restart the book is what the store says, and the detectors find the same condition again and
re-create the notification under the same id. Notices (blind / restored) held at a stop are the
exception: they are logged as lost (`notifications_unsaved`) when the pipeline closes.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jobdiagd.alerts import notices
from jobdiagd.alerts.incidents import IncidentBook, make_notice, make_report
from jobdiagd.alerts.notices import Notice
from jobdiagd.alerts.outbox import Outbox
from jobdiagd.alerts.store import AlertStore, Quarantined, StoreWatch, open_store
from jobdiagd.config import IncidentsConfig
from jobdiagd.model.alerts import Finding, Incident, Mute, Notification, Severity

# Work done inside the transaction of an `observe` (see there): returns notifications to queue.
Within = Callable[[float], list[Notification]]


class AlertPipeline:
    """Findings in, notifications durably queued; after a commit that queued some, `on_queued` is
    told which (the self-metrics count them: every notification is queued here, so they are
    counted in this one place) and `on_enqueue` (the dispatcher's kick) runs."""

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
        self.on_queued: Callable[[Sequence[Notification]], None] | None = None
        self._held: dict[str, Notification] = {}  # by id, in creation order
        self.quarantined: Quarantined | None = None

    @classmethod
    def open(
        cls,
        state_dir: str | Path,
        cfg: IncidentsConfig,
        notifier_names: Sequence[str],
        on_enqueue: Callable[[], None] | None = None,
        *,
        now: float | None = None,
        watch: StoreWatch | None = None,
    ) -> AlertPipeline:
        """Open (or create) the store in `state_dir` and load open incidents and mutes from it.

        Deliveries still pending for a notifier that is no longer configured are abandoned (a
        removed notifier would otherwise keep them pending forever). With `now`, a store that
        cannot be read is quarantined (`open_store`) and a warning notice about it is queued;
        without it, the store's errors propagate.
        """
        if now is None:
            store, quarantined = AlertStore.in_state_dir(state_dir, watch=watch), None
        else:
            store, quarantined = open_store(state_dir, now, watch=watch)
        book = IncidentBook.from_config(
            cfg, incidents=store.load_incidents(), seqs=store.load_seqs(), mutes=store.load_mutes()
        )
        outbox = Outbox(store, notifier_names)
        with contextlib.suppress(sqlite3.Error):  # retried at the next start; they stay pending meanwhile
            outbox.abandon_unconfigured()
        pipeline = cls(store, book, outbox, on_enqueue)
        pipeline.quarantined = quarantined
        if quarantined is not None and now is not None:
            moved = [p.name for p in quarantined.moved]
            pipeline.announce(notices.store_quarantined(quarantined.reason, moved, now), now)
        return pipeline

    def close(self) -> None:
        self.store.close()

    # -- inputs ----------------------------------------------------------

    def observe(self, findings: Iterable[Finding], now: float, within: Within | None = None) -> list[Notification]:
        """`within(now)`, when given, runs inside the transaction that stores the incident
        changes and their notifications, after the book took the findings: what it writes commits
        with them or not at all, and the notifications it returns are queued in it (recovery's
        intent and countdown, rule REC-13)."""
        return self._commit(self.book.observe_all(findings, now), now, within)

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
        plot: Mapping[str, Any] | None = None,
    ) -> list[Notification]:
        return self._commit([make_report(job_id, kind, key, title, body, now, owner, plot)], now)

    def notice(
        self, key: str, title: str, body: str, now: float, severity: Severity = "info"
    ) -> list[Notification]:
        return self._commit([make_notice(key, title, body, now, severity=severity)], now)

    def announce(self, notice: Notice, now: float) -> list[Notification]:
        """Queue one of the daemon's notices (their words: `alerts.notices`)."""
        return self.notice(notice.key, notice.title, notice.body, now, severity=notice.severity)

    def refresh(self, incident: Incident, reason: str, now: float) -> list[Notification]:
        """Edit an incident's message in place (open or resolved): its snapshot changed, e.g. an
        annotation of the book."""
        return self._commit(self.book.updates([incident], reason, now), now)

    def flush(self, now: float) -> list[Notification]:
        """Retry writing what a failed commit left (the engine calls `observe` every tick anyway)."""
        return self._commit([], now)

    # -- outputs ---------------------------------------------------------

    @property
    def held(self) -> list[Notification]:
        """Notifications made but not yet stored (the store refused the write)."""
        return list(self._held.values())

    def open_counts(self) -> dict[str, int]:
        """Open incidents by kind (for the incidents gauge)."""
        return dict(Counter(i.kind for i in self.book.open_incidents()))

    def snapshot(self, now: float) -> dict[str, Any]:
        """JSON-ready view for the status socket."""
        return {
            "open_incidents": [asdict(i) for i in self.book.open_incidents()],
            "mutes": [asdict(m) for m in self.book.active_mutes(now)],
            "deliveries": self.outbox.counts(),
            "unsaved_notifications": len(self._held),
        }

    def _commit(self, notifications: list[Notification], now: float, within: Within | None = None) -> list[Notification]:
        """Returns the notifications queued by this commit (held ones from earlier included).

        A store error is not raised: the store's `watch` reports it (once per episode) and the
        changes and notifications wait for the next commit (what `within` wrote is rolled back
        with them).
        """
        changes = self.book.take_changes()
        for n in notifications:
            self._held.setdefault(n.id, n)
        pending = list(self._held.values())
        if not (pending or changes.incidents or changes.mutes is not None or within is not None):
            return []  # nothing to write: no transaction, no write lock (most ticks)
        try:
            with self.store.transaction():
                if changes.incidents:
                    self.store.save_incidents(changes.incidents)
                if changes.mutes is not None:
                    self.store.replace_mutes(changes.mutes)
                added = self.outbox.enqueue(pending, now) if pending else []
                more = within(now) if within is not None else []
                if more:
                    added += self.outbox.enqueue(more, now)
        except sqlite3.Error:
            # Nothing was written; the book is ahead of the store until a commit succeeds.
            self.book.requeue(changes)
            return []
        self._held.clear()
        if added and self.on_queued is not None:
            self.on_queued(added)
        if added and self.on_enqueue is not None:
            self.on_enqueue()
        return added
