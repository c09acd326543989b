"""The incremental cache of `jobdiagd goodput`: each log's run facts, kept until its files change.

One SQLite file (`goodput-cache.sqlite3`) in a private directory (0700, the file 0600, never
through a symlink: `privatefs`), keyed by the job's main log path. A row is used only when its
fingerprint matches: the facts' version, the package version, the Slurm state the triage was
given, and (path, size, mtime) of every file the triage reads (main log, RAY=1 worker logs,
k8s rank logs). A finished job is read once; a live one whenever it wrote. Rows of jobs no
longer in the archive are left alone (another `outputs` root may list them). A cache that
cannot be opened (or is unsafe: a planted link, another user's file) is skipped with a note,
never fatal.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from jobdiagd import __version__
from jobdiagd.goodput.facts import FACTS_VERSION, RunFacts
from jobdiagd.model.jobref import JobRef
from jobdiagd.privatefs import UnsafePathError, check_private_file, ensure_private_dir, open_private

CACHE_NAME = "goodput-cache.sqlite3"
MAX_FILES = 512  # worker/rank logs stat()ed per job: the reader's own cap (logs.job)
# Rows written are committed every this many: a run stopped midway (the daemon's digest past its
# timeout, a ^C) keeps what it read.
COMMIT_EVERY = 100


def job_files(ref: JobRef) -> list[Path]:
    """The files a triage of `ref` reads (what the fingerprint covers)."""
    files = [ref.log] if ref.log is not None else []
    d = ref.job_dir
    if d is not None:
        ray = d / "ray_logs"
        try:
            if ray.is_dir():
                for host in sorted(p for p in ray.iterdir() if p.is_dir()):
                    files += sorted(host.glob("worker-*.out")) + sorted(host.glob("worker-*.err"))
            files += sorted(d.glob("rank-*.log"))
        except OSError:
            pass
    return files[: MAX_FILES + 1]


def fingerprint(ref: JobRef, extra: str = "") -> str:
    parts = [f"v{FACTS_VERSION}", __version__, extra]
    for f in job_files(ref):
        try:
            st = os.stat(f)
        except OSError:
            parts.append(f"{f}:-")
            continue
        parts.append(f"{f}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


class FactsCache:
    """Run facts by log path; `directory` None: nothing is kept between runs."""

    def __init__(self, directory: Path | None) -> None:
        self.note: str | None = None
        self._conn: sqlite3.Connection | None = None
        self._rows: dict[str, tuple[str, str]] = {}
        self.hits = 0
        self.misses = 0
        self._unsaved = 0
        if directory is None:
            return
        try:
            path = ensure_private_dir(directory) / CACHE_NAME
            for suffix in ("", "-journal"):
                check_private_file(f"{path}{suffix}", "cache file")
            os.close(open_private(path, os.O_RDWR | os.O_CREAT, "cache file"))
            conn = sqlite3.connect(str(path), timeout=5.0)
            conn.execute(
                "CREATE TABLE IF NOT EXISTS facts (key TEXT PRIMARY KEY, fp TEXT NOT NULL, data TEXT NOT NULL)"
            )
            self._rows = {k: (fp, data) for k, fp, data in conn.execute("SELECT key, fp, data FROM facts")}
            self._conn = conn
        except (OSError, sqlite3.Error, ValueError, UnsafePathError) as exc:
            self.note = f"cache {directory} not used: {exc}"

    @property
    def path(self) -> str | None:
        return None if self._conn is None else str(self._conn.execute("PRAGMA database_list").fetchone()[2])

    def get(self, key: str, fp: str) -> list[RunFacts] | None:
        row = self._rows.get(key)
        if row is None or row[0] != fp:
            self.misses += 1
            return None
        try:
            facts = [RunFacts.from_dict(d) for d in json.loads(row[1])]
        except (ValueError, TypeError, KeyError):
            self.misses += 1
            return None
        self.hits += 1
        return facts

    def put(self, key: str, fp: str, facts: Iterable[RunFacts]) -> None:
        data = json.dumps([f.to_dict() for f in facts], separators=(",", ":"))
        self._rows[key] = (fp, data)
        if self._conn is not None:
            try:
                self._conn.execute(
                    "INSERT OR REPLACE INTO facts (key, fp, data) VALUES (?, ?, ?)", (key, fp, data)
                )
                self._unsaved += 1
                if self._unsaved >= COMMIT_EVERY:
                    self._conn.commit()
                    self._unsaved = 0
            except sqlite3.Error as exc:
                self.note = f"cache not written: {exc}"

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.commit()
            except sqlite3.Error as exc:
                self.note = f"cache not written: {exc}"
            self._conn.close()
            self._conn = None
