"""JSON-lines notifier: one object per notification appended and fsynced; repeats of an id are skipped.

The file is the daemon's own (`privatefs`): created 0600, opened with O_NOFOLLOW, refused when it
is a link, not a regular file, another user's or writable by others (a send then fails and is
retried; it never writes through a planted link). A failed append (disk full) is cut back so
no torn line is left, and the send is retried. Lines that are not JSON (a torn write, random
bytes) are skipped when the file is read back.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import asdict
from pathlib import Path

from jobdiagd.model.alerts import Notification
from jobdiagd.notifiers.base import NotifierError
from jobdiagd.privatefs import DIR_MODE, UnsafePathError, open_private


class JsonlNotifier:
    name = "jsonl"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen: set[str] | None = None
        self._lock = asyncio.Lock()

    def render(self, notification: Notification) -> str:
        return json.dumps(asdict(notification), sort_keys=True, ensure_ascii=False) + "\n"

    async def send(self, notification: Notification) -> None:
        line = self.render(notification)
        async with self._lock:
            try:
                await asyncio.to_thread(self._append, notification.id, line)
            except (OSError, UnsafePathError) as exc:
                raise NotifierError(f"jsonl {self.path}: {exc}") from exc

    def _load_seen(self) -> set[str]:
        # Read once per process: the outbox may resend what was written just before a crash.
        seen: set[str] = set()
        try:
            fd = open_private(self.path, os.O_RDONLY, "notifier file")
        except FileNotFoundError:
            return seen
        with open(fd, "rb") as fh:
            for raw in fh:
                try:
                    seen.add(str(json.loads(raw)["id"]))
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last line from a crash mid-write, or bytes that are not ours
        return seen

    def _append(self, nid: str, line: str) -> None:
        if self._seen is None:
            self._seen = self._load_seen()
        if nid in self._seen:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        fd = open_private(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, "notifier file")
        try:
            data = line.encode()
            size = os.fstat(fd).st_size
            if size > 0 and not self._ends_with_newline(fd):
                data = b"\n" + data  # don't glue a record to a torn one
            try:
                view = memoryview(data)
                while view:  # a nearly full disk takes part of a write, then refuses the rest
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, size)  # leave no partial record behind; the send is retried
                raise
        finally:
            os.close(fd)
        self._seen.add(nid)

    @staticmethod
    def _ends_with_newline(fd: int) -> bool:
        size = os.fstat(fd).st_size
        return os.pread(fd, 1, size - 1) == b"\n"
