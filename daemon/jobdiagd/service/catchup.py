"""Catching up with the logs already written: which job's first, and the backlog that reads them.

When the daemon starts (or many jobs appear at once) every log already written must be read
once before its job can be judged. A full tick reads what fits a byte budget
(`Backlog.read_inline`) and the rest is read in the background between ticks
(`Backlog.start`), in this order:

1. Jobs whose log cannot even be stat'ed: reading them costs nothing and is what tells
   people the job is unmonitored ("monitoring blind") or that its log is not there yet.
2. Then the job quiet for longest: the one whose hang budget runs out first, and the one a
   crash has silenced (a crashed or hung job stops writing; a healthy one writes every step).
   Quiet since = the saved arrival of its last step when the daemon had read it before a
   restart (the hang clock restored from the offsets table), else its log's mtime. The mtime
   only orders the reading; it never judges a hang (the detectors use the daemon's clock).
3. Among equals, the smaller log first: more jobs judged sooner.

`catch_up_order` is pure: plain data in, an order out. `Backlog` keeps the jobs not read yet
and reads them through the reading room's first read (`service.reading`), which stamps each
step with the daemon's clock when its read began.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from jobdiagd import clock
from jobdiagd.logsetup import get_logger

# A full tick catches up with at most this much (and at least one job); the rest is read in the
# background between ticks. A first read's fixed cost (open, header parsed in full, the thread
# hop) counts as CATCH_UP_FILE_BYTES.
CATCH_UP_INLINE_BYTES = 4 << 20
CATCH_UP_FILE_BYTES = 16 << 10


@dataclass(frozen=True, slots=True)
class Pending:
    """A job whose existing log has not been read yet."""

    key: str
    quiet_since: float | None  # saved arrival of the last step, else the log's mtime; None: no stat
    size: int  # bytes to read (0 when unknown)


def catch_up_order(pending: Iterable[Pending]) -> list[str]:
    """The keys in the order their logs should be read (see the module docstring)."""
    ranked = sorted(
        pending,
        key=lambda p: (
            p.quiet_since is not None,
            p.quiet_since if p.quiet_since is not None else 0.0,
            p.size,
            p.key,
        ),
    )
    return [p.key for p in ranked]


class Backlog:
    """The jobs whose existing logs are still to be read, in `catch_up_order`.

    `first_read(key, now)` reads one job's files in full; `due(key)` says a job's end is due now
    (it is read by the tick whatever the budget)."""

    def __init__(
        self, first_read: Callable[[str, float], Awaitable[None]], due: Callable[[str], bool]
    ) -> None:
        self.first_read = first_read
        self.due = due
        self.inline_bytes = CATCH_UP_INLINE_BYTES
        self._pending: dict[str, Pending] = {}
        self._order: deque[str] = deque()
        self._reading: set[str] = set()  # being read (a tick's share, the background's)
        self._task: asyncio.Future[None] | None = None
        # Set between ticks: the background reads start their next job only then, so a tick
        # shares the interpreter with at most the one read already under way.
        self.between_ticks = asyncio.Event()
        self.between_ticks.set()
        self._log = get_logger(component="engine")

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, key: object) -> bool:
        return key in self._pending

    def add(self, jobs: Iterable[Pending]) -> None:
        """New jobs join; the backlog is ranked again (`catch_up_order`)."""
        new = False
        for p in jobs:
            self._pending[p.key] = p
            new = True
        if new:
            self._order = deque(catch_up_order(self._pending.values()))

    async def read_inline(self, now: float) -> set[str]:
        """A full tick's share: jobs whose end is due, then the backlog in order while it fits
        `inline_bytes` (at least one job). The keys read."""
        done: set[str] = set()
        for due in [k for k in self._pending if k not in self._reading and self.due(k)]:
            await self._read(due, now)
            done.add(due)
        spent = 0
        while True:
            key = self._next()
            if key is None:
                break
            size = self._pending[key].size + CATCH_UP_FILE_BYTES
            if done and spent + size > self.inline_bytes:
                self._order.appendleft(key)
                break
            spent += size
            await self._read(key, now)
            done.add(key)
        return done

    async def read_next(self, now: float) -> str | None:
        """Read the next job's existing logs, stamped `now` (the daemon's clock when the read
        starts: arrival times stay "when the daemon read the line"); its key, or None."""
        key = self._next()
        if key is None:
            return None
        await self._read(key, now)
        return key

    def start(self) -> None:
        """Read the rest in the background, between ticks (`between_ticks`)."""
        if self._pending and (self._task is None or self._task.done()):
            self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _next(self) -> str | None:
        while self._order:
            key = self._order.popleft()
            if key in self._pending and key not in self._reading:
                return key
        return None

    async def _read(self, key: str, now: float) -> None:
        self._reading.add(key)
        try:
            await self.first_read(key, now)
        finally:
            self._reading.discard(key)
            self._pending.pop(key, None)

    async def _loop(self) -> None:
        while self._pending:
            await self.between_ticks.wait()
            try:
                if await self.read_next(clock.wall()) is None:
                    return
            except Exception as exc:
                self._log.exception("catch_up_failed", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0)  # a tick, a file event or a status request may run in between
