"""Compiled hyperscan databases kept on disk: compiling the pre-filter's costs 30-50 ms, about
what grep needs for 100 MB; loading one back costs microseconds.

Decisions (the issue is silent):
- Where: `$JOBDIAGD_CACHE_DIR`, else `$XDG_CACHE_HOME/jobdiagd`, else `~/.cache/jobdiagd`. The
  directory is private (`privatefs`: 0700, owned by the user); a file is loaded only when it
  is a regular file of the user's, not writable by others (a planted database is never read).
- What: one file per pattern set, named by a hash of the patterns, their flags, the hyperscan
  binding's version and the CPU's feature flags, so a home directory shared by machines of
  different CPUs keeps one database per kind. A loaded database must scan a probe before it is
  used; anything wrong (unreadable, another platform, corrupt) means compiling it again.
- Failing to cache (read-only home, no HOME) is silent: the database is compiled, as before.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any


def cache_dir() -> Path | None:
    env = os.environ.get("JOBDIAGD_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "jobdiagd"
    home = os.environ.get("HOME")
    return Path(home) / ".cache" / "jobdiagd" if home else None


@lru_cache(maxsize=1)
def _platform() -> bytes:
    """The CPU's feature flags (a database compiled for AVX-512 must not load on a CPU without)."""
    try:
        with open("/proc/cpuinfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"flags"):
                    return line
    except OSError:
        pass
    import platform

    return f"{platform.machine()} {platform.processor()}".encode()


def _key(hs: Any, patterns: Sequence[bytes], flags: Sequence[int] | None) -> str:
    h = hashlib.sha256()
    for part in (
        str(getattr(hs, "__version__", "?")).encode(),
        _platform(),
        repr(list(flags or ())).encode(),
    ):
        h.update(part + b"\0")
    for p in patterns:
        h.update(len(p).to_bytes(4, "little") + p)
    return h.hexdigest()[:40]


def _compile(hs: Any, patterns: Sequence[bytes], flags: Sequence[int] | None) -> Any:
    db = hs.Database(mode=hs.HS_MODE_BLOCK)
    ids = list(range(len(patterns)))
    if flags is None:
        db.compile(expressions=list(patterns), ids=ids, elements=len(patterns))
    else:
        db.compile(expressions=list(patterns), ids=ids, elements=len(patterns), flags=list(flags))
    return db


def _usable(hs: Any, db: Any) -> bool:
    try:
        db.scan(b"\n", match_event_handler=_ignore, scratch=hs.Scratch(db))
    except Exception:
        return False
    return True


def _ignore(_id: int, _frm: int, _to: int, _flags: int, _ctx: object) -> None:
    return None


def block_database(hs: Any, patterns: Sequence[bytes], flags: Sequence[int] | None = None) -> Any:
    """A block-mode database of `patterns` (pattern i reports id i), from the cache when it holds
    a usable one, else compiled (and stored for the next process)."""
    where = cache_dir()
    if where is None:
        return _compile(hs, patterns, flags)
    path = where / f"hs-{_key(hs, patterns, flags)}.db"
    from jobdiagd.privatefs import UnsafePathError, check_private_file, ensure_private_dir, open_private

    try:
        if check_private_file(path, "hyperscan cache file"):
            fd = open_private(path, os.O_RDONLY, "hyperscan cache file")
            with os.fdopen(fd, "rb") as fh:
                db = hs.loadb(fh.read(), hs.HS_MODE_BLOCK)
            if _usable(hs, db):
                return db
    except Exception:  # unreadable, refused, corrupt, another platform: compile it again
        pass
    db = _compile(hs, patterns, flags)
    try:
        ensure_private_dir(where)
        tmp = where / f".{path.name}.{os.getpid()}"
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "hyperscan cache file")
        with os.fdopen(fd, "wb") as fh:
            fh.write(hs.dumpb(db))
        os.replace(tmp, path)
    except (OSError, UnsafePathError):
        pass
    return db
