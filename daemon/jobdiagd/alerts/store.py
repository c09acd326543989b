"""SQLite state in the daemon's state dir: incidents, mutes and the notification outbox."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

from jobdiagd.model.alerts import SEVERITIES, Incident, Mute, Severity

DB_NAME = "alerts.sqlite3"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS incidents (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    seq INTEGER NOT NULL,
    is_open INTEGER NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS incidents_open ON incidents (is_open);
CREATE TABLE IF NOT EXISTS mutes (
    job_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    until REAL NOT NULL,
    created_at REAL NOT NULL,
    by TEXT,
    PRIMARY KEY (job_id, kind)
);
CREATE TABLE IF NOT EXISTS outbox (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS deliveries (
    notification_id TEXT NOT NULL REFERENCES outbox (id),
    notifier TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'sent', 'dead')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    last_error TEXT,
    sent_at REAL,
    PRIMARY KEY (notification_id, notifier)
);
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (notifier, status, next_attempt_at);
"""


class AlertStore:
    """One SQLite file (WAL, synchronous=FULL) shared by the incident book and the outbox.

    Used from one thread (the event loop); statements are small and local, so they run inline.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves so one transaction can span
        # the incident update and the outbox insert it causes.
        self._conn = sqlite3.connect(str(path), isolation_level=None, timeout=5.0)
        self._conn.row_factory = sqlite3.Row
        self._depth = 0
        self._conn.execute("PRAGMA journal_mode=WAL")
        # FULL: a notification reported as enqueued survives power loss, not just a process kill.
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._conn.executescript(_SCHEMA)
        self._conn.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )

    @classmethod
    def in_state_dir(cls, state_dir: str | Path) -> AlertStore:
        return cls(Path(state_dir) / DB_NAME)

    @property
    def conn(self) -> sqlite3.Connection:
        return self._conn

    def pragma(self, name: str) -> Any:
        return self._conn.execute(f"PRAGMA {name}").fetchone()[0]

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT; nested uses join the outer transaction."""
        if self._depth:
            self._depth += 1
            try:
                yield self._conn
            finally:
                self._depth -= 1
            return
        self._conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield self._conn
        except BaseException:
            self._depth = 0
            self._conn.execute("ROLLBACK")
            raise
        self._depth = 0
        self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()

    # -- incidents -------------------------------------------------------

    def save_incidents(self, incidents: Iterable[Incident]) -> None:
        with self.transaction() as conn:
            conn.executemany(
                "INSERT INTO incidents (id, job_id, kind, seq, is_open, data) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET is_open = excluded.is_open, data = excluded.data",
                [
                    (i.id, i.job_id, i.kind, i.seq, int(i.is_open), json.dumps(asdict(i), sort_keys=True))
                    for i in incidents
                ],
            )

    def load_incidents(self, *, open_only: bool = True) -> list[Incident]:
        sql = "SELECT data FROM incidents" + (" WHERE is_open = 1" if open_only else "") + " ORDER BY rowid"
        return [_incident_from_json(row["data"]) for row in self._conn.execute(sql)]

    def load_incident(self, incident_id: str) -> Incident | None:
        """One incident, open or resolved (a notifier mirroring state reads the final one)."""
        row = self._conn.execute("SELECT data FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return None if row is None else _incident_from_json(row["data"])

    def load_seqs(self) -> dict[tuple[str, str], int]:
        rows = self._conn.execute("SELECT job_id, kind, MAX(seq) AS seq FROM incidents GROUP BY job_id, kind")
        return {(r["job_id"], r["kind"]): int(r["seq"]) for r in rows}

    # -- mutes -----------------------------------------------------------

    def replace_mutes(self, mutes: Iterable[Mute]) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM mutes")
            conn.executemany(
                "INSERT INTO mutes (job_id, kind, until, created_at, by) VALUES (?, ?, ?, ?, ?)",
                [(m.job_id, m.kind, m.until, m.created_at, m.by) for m in mutes],
            )

    def load_mutes(self) -> list[Mute]:
        rows = self._conn.execute("SELECT job_id, kind, until, created_at, by FROM mutes ORDER BY rowid")
        return [
            Mute(r["job_id"], r["kind"], float(r["until"]), float(r["created_at"]), r["by"]) for r in rows
        ]


def _incident_from_json(text: str) -> Incident:
    raw = json.loads(text)
    if raw.get("severity") not in SEVERITIES:
        raise ValueError(f"stored incident has bad severity: {raw.get('severity')!r}")
    raw["severity"] = cast(Severity, raw["severity"])
    return Incident(**raw)
