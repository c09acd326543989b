"""Log tailing for the daemon: incremental reads per file, offsets persisted, watchfiles wake-ups.

Restart policy (decided here): the offset table says how far each file had been read and
when its last step line was read; on restart the file is re-read from the start with the
same pre-filtered reader triage uses (`read_file`) — so the rebuilt `LogState` holds the
facts triage would find — and the saved arrival time is restored for the steps already
seen before, so a hang in progress keeps its clock. Alerts are never re-sent: incidents
and the outbox live in the alert store, whose ids make a repeat a no-op.

Tailed states keep `logs.steps.TAIL` retention: a job followed for weeks holds a bounded
summary of its steps (what the detectors and the per-tick triage read, exactly), not every
step; the job-end report re-reads the files in full.

Files are followed through truncation, rotation (new inode), a rename or a repointed job
`log` link (same inode: the reader keeps its offset) and deletion (OSError -> the reading room's
"monitoring blind" notice, once per episode). Every open goes through the job's
`logs.safeopen.LogAccess`: a FIFO, socket, device or directory in place of a log, a link out
of the job's roots or another user's file is refused (RefusedFile, an OSError: the same
notice), never read and never waited on. A followed file's descriptor stays open between
polls while an `lstat` of its path still shows the inode that open vetted
(`PrefilterTailReader`): what a poll costs is then that `lstat` and the read.

The arrival time of a job's newest step is written in the tick that read it (the hang clock
must survive a crash or a wedge); other offsets once a minute (`service.reading`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import resource
import sqlite3
import stat
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from jobdiagd.logs.reader import HEAD_FULL, TailReader, read_fd
from jobdiagd.logs.safeopen import ANYWHERE, LogAccess
from jobdiagd.logs.state import LogState
from jobdiagd.logs.steps import TAIL

if TYPE_CHECKING:
    from watchfiles import Change, DefaultFilter  # imported when used: not on the CLI's start-up path

RESOLVE_EVERY = 16
KEEP_VERDICTS_MAX = 1 << 16  # paths whose watch-filter verdict is remembered
HELD_MAX = 1 << 16  # log descriptors kept open between polls, at most (see `_HeldBudget`)


@functools.cache
def _default_filter() -> DefaultFilter:
    from watchfiles import DefaultFilter

    return DefaultFilter()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tail_offsets (
    path TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    inode INTEGER,
    offset INTEGER NOT NULL,
    last_step INTEGER,
    last_step_at REAL,
    blind_since REAL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tail_offsets_job ON tail_offsets (job_id);
"""


@dataclass(frozen=True, slots=True)
class Saved:
    path: str
    job_id: str
    inode: int | None
    offset: int
    last_step: int | None
    last_step_at: float | None
    blind_since: float | None


class OffsetStore:
    """The `tail_offsets` table in a SQLite file (own connection, own table). The daemon keeps it
    in the state dir's alert store file (`service.runner` names the path)."""

    def __init__(self, path: str | Path) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path), isolation_level=None, timeout=5.0)
        self._conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL: a power cut may lose the last commits, which only makes a restart re-read more.
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)

    def load(self, path: str) -> Saved | None:
        row = self._conn.execute(
            "SELECT path, job_id, inode, offset, last_step, last_step_at, blind_since"
            " FROM tail_offsets WHERE path = ?",
            (path,),
        ).fetchone()
        return Saved(*row) if row else None

    def known_jobs(self) -> set[str]:
        return {r[0] for r in self._conn.execute("SELECT DISTINCT job_id FROM tail_offsets")}

    def save(self, rows: Iterable[Saved], now: float) -> None:
        rows = list(rows)
        if not rows:
            return
        self._conn.execute("BEGIN")
        try:
            self._conn.executemany(
                "INSERT INTO tail_offsets (path, job_id, inode, offset, last_step, last_step_at, blind_since,"
                " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (path) DO UPDATE SET"
                " job_id = excluded.job_id, inode = excluded.inode, offset = excluded.offset,"
                " last_step = excluded.last_step, last_step_at = excluded.last_step_at,"
                " blind_since = excluded.blind_since, updated_at = excluded.updated_at",
                [
                    (r.path, r.job_id, r.inode, r.offset, r.last_step, r.last_step_at, r.blind_since, now)
                    for r in rows
                ],
            )
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def forget_job(self, job_id: str) -> None:
        """A job that ended and was reported: its rows go (the report's id prevents a repeat anyway)."""
        self._conn.execute("DELETE FROM tail_offsets WHERE job_id = ?", (job_id,))

    def close(self) -> None:
        self._conn.close()


class _HeldBudget:
    """How many log descriptors the tails keep open between polls: half the process's soft
    open-file limit (the rest is for sockets, SQLite, ssh and first reads). Past it, a tail
    opens and closes its file every poll, as before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = 0
        self.limit: int | None = None

    def take(self) -> bool:
        with self._lock:
            if self.limit is None:
                soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
                self.limit = HELD_MAX if soft == resource.RLIM_INFINITY else min(HELD_MAX, soft // 2)
            if self.held >= self.limit:
                return False
            self.held += 1
            return True

    def give(self) -> None:
        with self._lock:
            self.held -= 1


HELD = _HeldBudget()


def _close_held(fd: int) -> None:
    os.close(fd)
    HELD.give()


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    # The inode, and what the access check judged of it: type and permissions, owner, group.
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid)


class PrefilterTailReader(TailReader):
    """`TailReader` that reads like `read_file`: the head in full (header, env dumps, config —
    everything before training starts, at most `HEAD_FULL` bytes), then only the lines the
    triage pre-filter (`logs.scan`) marks as candidates: NCCL/Ray chatter, the bulk of a live
    log, is skipped before decoding. Same parser; the final job-end triage re-reads the files
    with `read_file` (tail in full), exactly as `jobdiagd triage` does.

    It keeps the descriptor of its file open between polls (within `HELD`'s budget). Each poll
    then `lstat`s the path (its last component not followed) instead of the access-checked
    open's walk from the root: while the path still names the very inode that open vetted —
    same device and inode, same type, permissions, owner and group — reading the descriptor
    reads nothing the check did not allow, and the inode cannot be reused while it is held
    open. Anything else (a new file under the name, the file swapped for a symlink, a
    directory on the way swapped for one leading elsewhere, chmod, chown, deletion, new rules
    in `access`) drops the descriptor and the checked open decides again, as on every poll before. Truncation and the
    head check are the base reader's, on the same descriptor."""

    _held: int | None = None
    _held_as: tuple[int, int, int, int, int] | None = None
    _held_under: LogAccess | None = None  # the rules that vetted it (the engine may set new ones)
    _finalizer: weakref.finalize[[int], PrefilterTailReader] | None = None

    def read_fully(self, body_start: int) -> bool:
        return body_start < HEAD_FULL and not self.state.training_started

    def open_checked(self) -> int:
        fd = self._held
        if fd is not None:
            try:
                st = os.stat(self.path, follow_symlinks=False)
            except OSError:
                self.release()
                raise
            if _identity(st) == self._held_as and self.access is self._held_under:
                return fd
            self.release()
        return super().open_checked()

    def done_with(self, fd: int) -> None:
        if fd == self._held:
            return
        if self._held is None and HELD.take():
            try:
                self._held_as = _identity(os.fstat(fd))
            except OSError:
                HELD.give()
                os.close(fd)
                raise
            self._held, self._held_under = fd, self.access
            # A tail dropped without `release` (its job ended) closes its file when collected.
            self._finalizer = weakref.finalize(self, _close_held, fd)
            return
        os.close(fd)

    def release(self) -> None:
        """Close the held descriptor, if any (the next poll opens the file checked again)."""
        fin, self._finalizer = self._finalizer, None
        self._held = self._held_as = self._held_under = None
        if fin is not None:
            fin()


@dataclass
class FileTail:
    """One followed file. `link` may be a job dir's `log` symlink: it is re-resolved every poll,
    and every open goes through `access` (regular files inside the job's roots, of its owner)."""

    link: Path
    ref_time: float
    access: LogAccess = ANYWHERE
    reader: TailReader | None = None
    ever_read: bool = False
    blind_since: float | None = None
    error: str | None = None
    saved: Saved | None = None
    dirty: bool = False  # something worth persisting changed since the last save
    # The link's lstat identity and what it resolved to. A full realpath costs more than the
    # rest of a poll; a repointed link (a new link: new inode or mtime) or a path through other
    # directories has a new identity. Re-resolved anyway every RESOLVE_EVERY polls (a link
    # further down a chain) and after any failure; the no-follow open checks every use.
    _resolved: tuple[tuple[int, int, int], Path] | None = None
    _polls: int = 0

    @property
    def state(self) -> LogState | None:
        return self.reader.state if self.reader is not None else None

    @property
    def key(self) -> str:
        return str(self.link)

    def poll(self) -> tuple[int, bool]:
        """(bytes read, replaced): replaced means the old state was dropped (new file / truncation).

        Raises OSError when the file cannot be read, RefusedFile when `access` refuses it.
        """
        try:
            return self._poll()
        except OSError:
            self._resolved = None
            if isinstance(self.reader, PrefilterTailReader):
                self.reader.release()
            raise

    def _poll(self) -> tuple[int, bool]:
        target = self._target()
        if self.reader is None:
            self.reader = self._initial(target)
            self.ever_read = True
            self.dirty = True
            return self.reader.offset, False
        replaced = False
        if target != self.reader.path:
            st = os.stat(target)
            if st.st_ino == self.reader.inode:
                self.reader.path = target  # renamed (e.g. the TGS tagger): same file, keep the offset
            else:
                if isinstance(self.reader, PrefilterTailReader):
                    self.reader.release()
                self.reader = PrefilterTailReader(
                    target, LogState(str(target), ref_time=self.ref_time, retention=TAIL), access=self.access
                )
                replaced = True
        before = self.reader.state
        n = self.reader.poll()
        if self.reader.state is not before:
            replaced = True
        if n or replaced:
            self.dirty = True
        self.ever_read = True
        return n, replaced

    def _target(self) -> Path:
        """The file `link` names now (RefusedFile when it leaves the job's roots)."""
        st = os.lstat(self.link)
        ident = (st.st_dev, st.st_ino, st.st_mtime_ns if stat.S_ISLNK(st.st_mode) else 0)
        self._polls += 1
        if self._resolved is None or self._resolved[0] != ident or self._polls % RESOLVE_EVERY == 0:
            self._resolved = (ident, self.access.resolve(self.link))
        return self._resolved[1]

    def _initial(self, target: Path) -> TailReader:
        """Catch up with the file as it is now (the pre-filtered reader triage uses)."""
        state = LogState(str(target), ref_time=self.ref_time, retention=TAIL)
        fd = self.access.open(target, resolved=True)
        try:
            st = os.fstat(fd)
            head = os.pread(fd, 64, 0)
            read_fd(fd, state)
            # Continue after the last complete line; a partial last line is read again once
            # finished (its prefix cannot create a new step record: step numbers only grow).
            offset = state.bytes
            if not state.ends_with_newline:
                start = max(0, offset - (1 << 16))
                chunk = os.pread(fd, offset - start, start)
                cut = chunk.rfind(b"\n")
                offset = offset - (len(chunk) - cut - 1) if cut >= 0 else offset
        finally:
            os.close(fd)
        reader = PrefilterTailReader(
            target,
            state,
            offset=offset,
            lineno=state.lines + 1,
            inode=st.st_ino,
            head=head,
            access=self.access,
        )
        if not state.ends_with_newline:
            reader.lineno = max(1, state.lines)
        return reader

    def row(self, job_id: str, last_step: int | None, last_step_at: float | None) -> Saved:
        r = self.reader
        return Saved(
            self.key,
            job_id,
            r.inode if r is not None else None,
            r.offset if r is not None else 0,
            last_step,
            last_step_at,
            self.blind_since,
        )


@dataclass
class ChangeWatcher:
    """watchfiles on the directories holding watched logs; a change sets `wake` and names the path.

    The set of directories changes as jobs come and go: the watch restarts then. A missed event
    costs nothing but latency — every tick polls every file anyway.

    watchfiles' default filter (editor swap files, `__pycache__`, `.git`, ...) applies, but is
    asked once per path, not once per event: 1000 logs written 10 times a second made its
    per-event check a quarter of the daemon's event-loop time.
    """

    debounce_ms: int = 1000
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    changed: set[str] = field(default_factory=set)
    added: set[str] = field(default_factory=set)
    _dirs: frozenset[str] = frozenset()
    _restart: asyncio.Event = field(default_factory=asyncio.Event)
    errors: int = 0
    _keep: dict[str, bool] = field(default_factory=dict)  # the default filter's verdict per path

    def set_dirs(self, dirs: Iterable[Path]) -> None:
        new = frozenset(str(d) for d in dirs if d.is_dir())
        if new != self._dirs:
            self._dirs = new
            self._restart.set()

    def take(self) -> tuple[set[str], set[str]]:
        """(changed paths, newly added paths) since the last call."""
        out, self.changed = self.changed, set()
        added, self.added = self.added, set()
        self.wake.clear()
        return out, added

    def record(self, changes: Iterable[tuple[Change, str]]) -> None:
        """Note a batch of watchfiles changes (those its default filter keeps) and set `wake`."""
        from watchfiles import Change

        keep = self._keep
        kept = False
        if len(keep) > KEEP_VERDICTS_MAX:
            keep.clear()  # paths of jobs long gone; asking the filter again is cheap
        for change, path in changes:
            ok = keep.get(path)
            if ok is None:
                # The default filter judges the path's parts and name only, never the change.
                ok = keep[path] = _default_filter()(change, path)
            if not ok:
                continue
            kept = True
            self.changed.add(path)
            if change == Change.added:
                self.added.add(path)
        if kept:
            self.wake.set()

    async def run(self) -> None:
        from watchfiles import awatch

        while True:
            self._restart.clear()
            dirs = sorted(self._dirs)
            if not dirs:
                await self._restart.wait()
                continue
            try:
                async for changes in awatch(
                    *dirs,
                    watch_filter=None,  # applied in `record`, once per path
                    stop_event=self._restart,
                    recursive=False,
                    debounce=self.debounce_ms,
                    step=200,
                    yield_on_timeout=False,
                    ignore_permission_denied=True,
                ):
                    self.record(changes)
            except (OSError, RuntimeError):
                # A directory vanished under the watcher; polling covers until the next restart.
                self.errors += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._restart.wait(), 5.0)
