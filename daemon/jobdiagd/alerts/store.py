"""SQLite state in the daemon's state dir: incidents, mutes and the notification outbox.

Faults (issue 7) and what the store does about them:
- The file is created 0600 in a 0700 state dir and never through a symlink (`privatefs`);
  SQLite gives its -wal/-shm files the database file's mode.
- A write that fails (disk full, the file locked by another process, an I/O error) rolls the
  transaction back whole and raises `sqlite3.Error`; `watch` hears of the first failure and of
  the recovery (edge-triggered), so the daemon logs one line per episode. Callers keep what they
  could not write and retry (see `AlertPipeline`, `Outbox`).
- At open, a file that is not SQLite or fails `PRAGMA quick_check` raises `StoreCorrupt`;
  `open_store` then moves it aside (`<name>.corrupt-<UTC stamp>`, with its -wal/-shm) and starts
  clean. A locked file or a full disk raises `StoreUnavailable` (worth waiting for); a file
  from a newer schema or one that cannot be opened raises `StoreError` (one line, no repair).
- A stored row that does not parse is skipped and named in `unreadable`, never fatal.

Schema evolution: `meta.schema_version` records the version; `MIGRATIONS[i]` takes a store from
version i + 1 to i + 2, in one transaction with the version bump (a crash mid-way leaves the old
version). A store newer than this code is refused rather than guessed at.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from jobdiagd import clock
from jobdiagd.model.alerts import SEVERITIES, Incident, Mute
from jobdiagd.privatefs import check_private_file, ensure_private_dir, open_private

DB_NAME = "alerts.sqlite3"
# SQLite's companions of a database file; they hold committed data too (WAL) and move with it.
COMPANIONS = ("-wal", "-shm", "-journal")
BUSY_TIMEOUT_S = 1.0

_SCHEMA_V1 = """
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
CREATE TABLE IF NOT EXISTS chat_messages (
    notifier TEXT NOT NULL,
    destination TEXT NOT NULL,
    message_id TEXT NOT NULL,
    notification_id TEXT NOT NULL,
    incident_id TEXT,
    job_id TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('parent', 'reply')),
    kind TEXT NOT NULL,
    extra TEXT,
    created_at REAL NOT NULL,
    PRIMARY KEY (notifier, destination, message_id)
);
CREATE INDEX IF NOT EXISTS chat_messages_incident ON chat_messages (incident_id, notifier, role);
CREATE INDEX IF NOT EXISTS chat_messages_notification ON chat_messages (notification_id, notifier);
CREATE INDEX IF NOT EXISTS chat_messages_job ON chat_messages (job_id, notifier, role);
"""

Migration = Callable[[sqlite3.Connection], None]

# Version 2: recovery (docs/recovery.md). Intents are the recovery outbox: written in the
# transaction that changes the incident, executed step by step, marked done (rule REC-13);
# `recovery_runs` links each restarted run to its chain (rule REC-8); `recovery_log` is every
# action taken, by whom, why and how (rule REC-15); `node_evidence` and `node_notices` are the
# suspect-node memory (rules REC-20 to REC-22).
_SCHEMA_V2_RECOVERY = """
CREATE TABLE IF NOT EXISTS recovery_intents (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    incident_id TEXT,
    status TEXT NOT NULL CHECK (status IN
        ('suggested', 'scheduled', 'running', 'done', 'cancelled', 'failed', 'dry-run', 'refused')),
    due_at REAL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    plan TEXT NOT NULL,
    progress TEXT NOT NULL DEFAULT '{}',
    new_job_id TEXT,
    result TEXT
);
CREATE INDEX IF NOT EXISTS recovery_intents_status ON recovery_intents (status, due_at);
CREATE INDEX IF NOT EXISTS recovery_intents_job ON recovery_intents (job_id);
CREATE TABLE IF NOT EXISTS recovery_runs (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    chain TEXT NOT NULL,
    parent TEXT NOT NULL,
    parent_last_step INTEGER,
    no_progress INTEGER NOT NULL,
    family TEXT NOT NULL,
    excluded TEXT NOT NULL DEFAULT '',
    started_at REAL NOT NULL,
    PRIMARY KEY (job_id, attempt)
);
CREATE TABLE IF NOT EXISTS recovery_log (
    at REAL NOT NULL,
    intent_id TEXT,
    job_id TEXT NOT NULL,
    actor TEXT NOT NULL,
    rule TEXT NOT NULL,
    action TEXT NOT NULL,
    argv TEXT NOT NULL,
    outcome TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS recovery_log_at ON recovery_log (at);
CREATE TABLE IF NOT EXISTS node_evidence (
    node TEXT NOT NULL,
    job_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    failure_class TEXT NOT NULL,
    weight REAL NOT NULL,
    evidence TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (node, job_id, kind)
);
CREATE INDEX IF NOT EXISTS node_evidence_at ON node_evidence (at);
CREATE TABLE IF NOT EXISTS node_notices (
    node TEXT PRIMARY KEY,
    noticed_at REAL NOT NULL,
    score REAL NOT NULL,
    cleared_at REAL
);
"""


def _migrate_v2_recovery(conn: sqlite3.Connection) -> None:
    for statement in _SCHEMA_V2_RECOVERY.split(";"):
        if statement.strip():
            conn.execute(statement)


# MIGRATIONS[i]: schema version i + 1 -> i + 2. Append only; never edit a released step.
MIGRATIONS: list[Migration] = [_migrate_v2_recovery]


def schema_version() -> int:
    return 1 + len(MIGRATIONS)


class StoreError(Exception):
    """The store cannot be used; the message is one line naming the file."""


class StoreCorrupt(StoreError):
    """The file is not a readable SQLite database: move it aside and start clean."""


class StoreUnavailable(StoreError):
    """Locked by another process, or no space to open it: worth waiting for."""


class StoreWatch(Protocol):
    """Told about every outermost write transaction (edge_trigger.EdgeTrigger fits)."""

    def failure(self, error: BaseException | str, now: float) -> bool: ...

    def success(self, now: float) -> bool: ...


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _kind_of(exc: sqlite3.Error) -> type[StoreError]:
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return StoreCorrupt
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_IOERR", "SQLITE_PROTOCOL")):
        return StoreUnavailable
    return StoreError


class AlertStore:
    """One SQLite file (WAL, synchronous=FULL) shared by the incident book and the outbox.

    Used from one thread (the event loop); statements are small and local, so they run inline.
    """

    def __init__(self, path: str | Path, *, watch: StoreWatch | None = None, _prepared: bool = False) -> None:
        self.path = Path(path)
        self.watch = watch
        self.unreadable: list[str] = []  # rows skipped by the load_* methods, for the start-up log
        self._depth = 0
        memory = str(path) == ":memory:"
        if not memory and not _prepared:
            _prepare_files(self.path)
        try:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves so one transaction can span
            # the incident update and the outbox insert it causes.
            # timeout: only another process can hold the lock (our connections run in one
            # thread, one transaction at a time); waiting long for it would stall every tick.
            self._conn = sqlite3.connect(str(path), isolation_level=None, timeout=BUSY_TIMEOUT_S)
        except sqlite3.Error as exc:
            raise _kind_of(exc)(f"state store {self.path}: cannot open: {exc}") from exc
        self._conn.row_factory = sqlite3.Row
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            # FULL: a notification reported as enqueued survives power loss, not just a process kill.
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            problem = self._conn.execute("PRAGMA quick_check(1)").fetchone()[0]
            if problem != "ok":
                raise StoreCorrupt(f"state store {self.path} is damaged: {problem.splitlines()[-1]}")
            self._migrate()
            if not memory:
                for suffix in COMPANIONS:  # created by SQLite just now: same checks, same mode
                    check_private_file(f"{self.path}{suffix}")
        except sqlite3.Error as exc:
            self._conn.close()
            raise _kind_of(exc)(f"state store {self.path}: {exc}") from exc
        except BaseException:
            self._conn.close()
            raise

    @classmethod
    def in_state_dir(cls, state_dir: str | Path, *, watch: StoreWatch | None = None) -> AlertStore:
        return cls(ensure_private_dir(state_dir) / DB_NAME, watch=watch)

    def connect_again(self, *, watch: StoreWatch | None = None) -> AlertStore:
        """Another connection to this store, for another thread of this process (SQLite
        connections stay in the thread that made them; call this there).

        It never opens the file by other means: POSIX locks belong to the process, so closing any
        other descriptor of the database file would drop the locks every SQLite connection of the
        process holds on it — and a `jobdiagd nodes` run elsewhere, closing, would then take itself
        for the last connection and delete the live WAL."""
        return AlertStore(self.path, watch=watch, _prepared=True)

    @property
    def conn(self) -> sqlite3.Connection:
        return self._conn

    def pragma(self, name: str) -> Any:
        return self._conn.execute(f"PRAGMA {name}").fetchone()[0]

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT; nested uses join the outer transaction.

        Any error rolls the whole transaction back (a failed COMMIT too: SQLite may leave it
        open) and propagates; sqlite3 errors of the outermost transaction are reported to `watch`.
        """
        if self._depth:
            self._depth += 1
            try:
                yield self._conn
            finally:
                self._depth -= 1
            return
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield self._conn
            finally:
                self._depth = 0
            self._conn.execute("COMMIT")
        except BaseException as exc:
            self._rollback()
            if isinstance(exc, sqlite3.Error) and self.watch is not None:
                self.watch.failure(error_text(exc), clock.wall())
            raise
        if self.watch is not None:
            self.watch.success(clock.wall())

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            # SQLite may have rolled back already (e.g. after SQLITE_FULL).
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")

    def close(self) -> None:
        self._conn.close()

    # -- schema ------------------------------------------------------------

    def _migrate(self) -> None:
        # Read first: an up-to-date store is opened without writing (a full disk can still be read).
        version = self._version()
        if version is not None and version > schema_version():
            raise StoreError(
                f"state store {self.path} has schema version {version}, newer than this jobdiagd "
                f"understands ({schema_version()}): run the newer jobdiagd, or move the file aside"
            )
        if version == schema_version() and self._has_tables():
            return
        with self.transaction() as conn:
            # executescript would COMMIT our transaction: run the statements one by one.
            for statement in _SCHEMA_V1.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '1')")
            version = self._version() or 1
            for step in MIGRATIONS[version - 1 :]:
                step(conn)
            if version != schema_version():
                conn.execute(
                    "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(schema_version()),)
                )

    def _version(self) -> int | None:
        try:
            row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise
        if row is None:
            return None
        try:
            version = int(row[0])
        except (TypeError, ValueError):
            raise StoreCorrupt(f"state store {self.path}: bad schema_version {row[0]!r}") from None
        if version < 1:
            raise StoreCorrupt(f"state store {self.path}: bad schema_version {version}")
        return version

    def _has_tables(self) -> bool:
        names = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return {"meta", "incidents", "mutes", "outbox", "deliveries"} <= names

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
        """Stored incidents; a row that does not parse is skipped, named in `unreadable`, and (when
        open) closed in the store so it is reported once, not at every start."""
        sql = (
            "SELECT id, data FROM incidents" + (" WHERE is_open = 1" if open_only else "") + " ORDER BY rowid"  # noqa: S608
        )
        out: list[Incident] = []
        bad: list[str] = []
        for row in self._conn.execute(sql):
            try:
                out.append(_incident_from_json(row["data"]))
            except (ValueError, TypeError, KeyError) as exc:
                bad.append(str(row["id"]))
                self.unreadable.append(f"incident {row['id']!r} skipped: {error_text(exc)}")
        if bad and open_only:
            try:
                with self.transaction() as conn:
                    conn.executemany("UPDATE incidents SET is_open = 0 WHERE id = ?", [(b,) for b in bad])
            except sqlite3.Error:
                pass  # skipped again at the next start
        return out

    def incident_token(self, incident_id: str) -> int | None:
        """A short, stable handle for an incident (its rowid): what chat buttons carry."""
        row = self._conn.execute("SELECT rowid FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return None if row is None else int(row[0])

    def incident_by_token(self, token: int) -> Incident | None:
        row = self._conn.execute("SELECT data FROM incidents WHERE rowid = ?", (token,)).fetchone()
        return None if row is None else _incident_from_json(row["data"])

    def load_incident(self, incident_id: str) -> Incident | None:
        """One incident, open or resolved (a notifier mirroring state reads the final one)."""
        row = self._conn.execute("SELECT data FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return None if row is None else _incident_from_json(row["data"])

    def load_seqs(self) -> dict[tuple[str, str], int]:
        rows = self._conn.execute("SELECT job_id, kind, MAX(seq) AS seq FROM incidents GROUP BY job_id, kind")
        out: dict[tuple[str, str], int] = {}
        for r in rows:
            if isinstance(r["seq"], int) and isinstance(r["job_id"], str) and isinstance(r["kind"], str):
                out[(r["job_id"], r["kind"])] = r["seq"]
        return out

    # -- small facts the daemon remembers (the meta table) ---------------------

    def meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # -- mutes -----------------------------------------------------------

    def replace_mutes(self, mutes: Iterable[Mute]) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM mutes")
            conn.executemany(
                "INSERT INTO mutes (job_id, kind, until, created_at, by) VALUES (?, ?, ?, ?, ?)",
                [(m.job_id, m.kind, m.until, m.created_at, m.by) for m in mutes],
            )

    def load_mutes(self) -> list[Mute]:
        out: list[Mute] = []
        for r in self._conn.execute("SELECT job_id, kind, until, created_at, by FROM mutes ORDER BY rowid"):
            try:
                if not (isinstance(r["job_id"], str) and isinstance(r["kind"], str)):
                    raise ValueError("job_id/kind must be text")
                by = r["by"] if r["by"] is None else str(r["by"])
                out.append(Mute(r["job_id"], r["kind"], _number(r["until"]), _number(r["created_at"]), by))
            except (ValueError, TypeError) as exc:
                self.unreadable.append(f"mute {r['job_id']!r}/{r['kind']!r} skipped: {error_text(exc)}")
        return out


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not a number: {value!r}")
    return float(value)


def _prepare_files(path: Path) -> None:
    """Refuse planted links or foreign files; create the database 0600 so SQLite's -wal/-shm
    (which copy its mode) are 0600 too, whatever the umask."""
    for suffix in ("", *COMPANIONS):
        check_private_file(f"{path}{suffix}")
    try:
        os.close(open_private(path, os.O_RDWR | os.O_CREAT))
    except OSError as exc:
        kind = StoreUnavailable if exc.errno in (errno.ENOSPC, errno.EDQUOT) else StoreError
        raise kind(f"state store {path}: cannot open: {exc.strerror or exc}") from exc


_INCIDENT_TYPES = typing.get_type_hints(Incident)


def _incident_from_json(text: object) -> Incident:
    if not isinstance(text, str):
        raise ValueError("stored incident is not text")
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("stored incident is not a JSON object")
    if raw.get("severity") not in SEVERITIES:
        raise ValueError(f"stored incident has bad severity: {raw.get('severity')!r}")
    for f in fields(Incident):
        if f.name in raw and not _has_type(raw[f.name], _INCIDENT_TYPES[f.name]):
            raise ValueError(f"stored incident field {f.name!r} has a bad value: {raw[f.name]!r}")
    return Incident(**raw)


def _has_type(value: object, tp: Any) -> bool:
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        return any(_has_type(value, a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is typing.Literal:
        return value in typing.get_args(tp)
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


# -- opening, with quarantine ---------------------------------------------------


@dataclass(frozen=True)
class Quarantined:
    """A store file moved aside at start because it could not be read."""

    reason: str
    moved: Sequence[Path]


def quarantine(path: Path, now: float) -> list[Path]:
    """Rename `path` and its companions to `<name>.corrupt-<UTC stamp>[-wal|-shm]` (kept for
    inspection, never deleted); returns the new names."""
    stamp = datetime.fromtimestamp(now, tz=UTC).strftime("%Y%m%dT%H%M%SZ")
    base = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while any(Path(f"{base}{s}").exists() for s in ("", *COMPANIONS)):
        n += 1
        base = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    moved: list[Path] = []
    for suffix in ("", *COMPANIONS):
        src = Path(f"{path}{suffix}")
        if os.path.lexists(src):
            dst = Path(f"{base}{suffix}")
            os.rename(src, dst)
            moved.append(dst)
    return moved


def open_store(
    state_dir: str | Path, now: float, *, watch: StoreWatch | None = None
) -> tuple[AlertStore, Quarantined | None]:
    """The state dir's store; an unreadable one is quarantined and replaced by a clean one.

    Raises UnsafePathError (privatefs), StoreUnavailable (wait and retry) or StoreError.
    """
    path = ensure_private_dir(state_dir) / DB_NAME
    try:
        return AlertStore(path, watch=watch), None
    except StoreCorrupt as exc:
        reason = str(exc)
    try:
        moved = quarantine(path, now)
    except OSError as exc:
        raise StoreError(f"{reason}; moving it aside failed: {exc.strerror or exc}") from exc
    return AlertStore(path, watch=watch), Quarantined(reason, moved)
