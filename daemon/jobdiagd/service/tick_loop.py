"""When the engine ticks: full ticks every `tick_seconds`, partial ticks on file events and GPU
confirmations, the early page's polls, and garbage collection between ticks.

`TickLoop(engine).run(sleep, tick_seconds)` is the daemon's "engine" task (`service.runner`);
what one tick does is `Engine.tick` (`service.engine`).

- A full tick runs every `tick_seconds`; the catch-up backlog's background reads start after it
  (`catchup.Backlog.start`) and run only between ticks.
- A file event wakes a partial tick for the jobs whose files changed, after a burst of writes
  settled (`partial_gap`); a new file under an outputs root that no job names wakes a full tick
  at once (discover now), and the full-tick period starts again.
- A GPU-confirmed hang (the early page, `service.early_page`) wakes a partial tick for that job
  with the hang detector: it pages now, not at the next full tick. The early page is polled after
  full ticks and when a poll is due, at least `MIN_EARLY_GAP_S` apart.
- A full garbage collection runs between ticks every `GC_EVERY_S` (the runner turns off the
  automatic oldest-generation collections, whose pauses would land inside ticks).
- A tick that raises is logged (`tick_failed`) and, if full, counted as failed (health, the
  tick counter); the loop goes on.
- The site Prometheus' degraded and recovered notices are queued after each pass of the loop.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Sequence

from jobdiagd import clock
from jobdiagd.edge_trigger import EdgeTrigger
from jobdiagd.logsetup import get_logger
from jobdiagd.service.early_page import EarlyConfirmer
from jobdiagd.service.engine import Engine

MIN_PARTIAL_GAP_S = 2.5
# Past this many jobs read by one partial tick, the next one settles longer, in proportion (up
# to MAX_PARTIAL_GAP_S). A partial tick costs a fixed ~60 us per job it reads, whatever the job
# wrote: 1000 busy jobs read every 2.5 s spent half the event loop's CPU on that (bench_daemon).
# Decision: at such a site a new line reaches the detectors up to 6-10 s after it is written
# instead of 2.5 s; a failure is still paged within seconds, a hang's budget is minutes.
PARTIAL_JOBS_AT_MIN_GAP = 400
MAX_PARTIAL_GAP_S = 10.0

# The early page's polls are at least this far apart (its own cadence is the scrape interval).
MIN_EARLY_GAP_S = 0.5
GC_EVERY_S = 300.0


def partial_gap(jobs_read: int) -> float:
    """How long file events settle into one partial tick, after one that read `jobs_read` jobs."""
    scaled = MIN_PARTIAL_GAP_S * jobs_read / PARTIAL_JOBS_AT_MIN_GAP
    return min(MAX_PARTIAL_GAP_S, max(MIN_PARTIAL_GAP_S, scaled))


class TickLoop:
    """Schedules `engine`'s ticks until the service stops."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._partial_jobs = 0  # jobs the last file-event partial tick read (`partial_gap`)
        self._log = get_logger(component="engine")
        self._early_edge = EdgeTrigger("early page", kind="early_page", logger=self._log)

    async def run(
        self, sleep: Callable[[float], Awaitable[bool]], tick_seconds: float | Callable[[], float]
    ) -> None:
        """Full ticks every `tick_seconds`; file events wake partial ticks in between.

        `sleep(s)` returns True when the service is stopping (Lifecycle.sleep).
        """
        try:
            await self._run(sleep, tick_seconds)
        finally:
            await self.engine.stop_discovery()
            await self.engine.room.backlog.stop()

    async def _run(
        self, sleep: Callable[[float], Awaitable[bool]], tick_seconds: float | Callable[[], float]
    ) -> None:
        def period() -> float:
            return tick_seconds() if callable(tick_seconds) else tick_seconds

        next_full = clock.wall()
        last_gc = clock.monotonic()
        early = self.engine.enricher.early if self.engine.enricher is not None else None
        while True:
            now = clock.wall()
            # The early page is polled after full ticks and when a poll is due, not after every
            # file event: its due times are at least the slack (20 s) after a step's read.
            due_poll = early.next_poll_at() if early is not None else None
            poll_early = due_poll is not None and now >= due_poll
            if now >= next_full:
                await self._safe_tick(now, None)
                self.engine.room.backlog.start()
                next_full = now + period()
                poll_early = True
                if clock.monotonic() - last_gc >= GC_EVERY_S:
                    last_gc = self._collect()
            elif await self._tick_on_events(now, early):
                next_full = now + period()
            wake_at = next_full
            if early is not None:
                if poll_early:
                    self._early_poll(early, clock.wall())
                due = early.next_poll_at()
                if due is not None:
                    wake_at = min(wake_at, max(due, clock.wall() + MIN_EARLY_GAP_S))
            self._site_notices(clock.wall())
            if await self._pause(sleep, wake_at, next_full, early):
                return

    async def _tick_on_events(self, now: float, early: EarlyConfirmer | None) -> bool:
        """Between full ticks: a partial tick for GPU-confirmed hangs or changed files, or a full
        one for something new under an outputs root (True: the full-tick period starts again)."""
        if early is not None and early.wake.is_set():
            # GPU-confirmed hangs page now, not at the next full tick.
            keys = {k for k in early.take_confirmed() if k in self.engine.jobs}
            if keys:
                await self._safe_tick(now, keys, early=True)
            return False
        if self.engine.watcher is None:
            return False
        discover, keys = self.engine.room.take_events()
        if discover:
            await self._safe_tick(now, None)  # something new under an outputs root: discover now
            self.engine.room.backlog.start()
            return True
        if keys:
            self._partial_jobs = len(keys)
            await self._safe_tick(now, keys)
        return False

    async def _pause(
        self,
        sleep: Callable[[float], Awaitable[bool]],
        wake_at: float,
        next_full: float,
        early: EarlyConfirmer | None,
    ) -> bool:
        """Sleep until `wake_at` or a file event / GPU confirmation; True when the service stops."""
        timeout = max(0.0, wake_at - clock.wall())
        events = [e for e in (self.engine.watcher.wake if self.engine.watcher is not None else None,) if e is not None]
        if early is not None:
            events.append(early.wake)
        if not events:
            return await sleep(timeout)
        if await self._wait(sleep, timeout, events):
            return True
        if self.engine.watcher is not None and self.engine.watcher.wake.is_set():
            # Woken by a file event: let a burst of writes settle into one partial tick.
            rest = next_full - clock.wall()
            if rest > 0 and await sleep(min(partial_gap(self._partial_jobs), rest)):
                return True
        return False

    def _early_poll(self, early: EarlyConfirmer, now: float) -> None:
        try:
            early.poll({k: w.view for k, w in self.engine.jobs.items()}, now, self.engine.detectors)
        except Exception as exc:  # the early page is an extra: the step budget still pages
            self._early_edge.failure(exc, now)

    def _site_notices(self, now: float) -> None:
        """The site Prometheus' degraded/recovered notices (one per episode, rule SITE-6), queued as
        its queries settle: said after the tick or poll that follows."""
        site = self.engine.enricher.site if self.engine.enricher is not None else None
        if site is not None:
            for notice in site.take_notices():
                self.engine.announce(notice, now)

    def _collect(self) -> float:
        """A full garbage collection between ticks, on our schedule (the runner turns off the
        automatic oldest-generation collections, whose 50+ ms pauses would land inside ticks)."""
        started = clock.monotonic()
        gc.collect()
        done = clock.monotonic()
        self.engine.durations["gc"].append(done - started)
        return done

    async def _wait(
        self, sleep: Callable[[float], Awaitable[bool]], seconds: float, events: Sequence[asyncio.Event]
    ) -> bool:
        sleeper = asyncio.ensure_future(sleep(seconds))
        wakers = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            done, _ = await asyncio.wait({sleeper, *wakers}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sleeper, *wakers):
                if not t.done():
                    t.cancel()
            await asyncio.gather(sleeper, *wakers, return_exceptions=True)
        return sleeper in done and not sleeper.cancelled() and bool(sleeper.result())

    async def _safe_tick(self, now: float, only: set[str] | None, *, early: bool = False) -> None:
        self.engine.room.backlog.between_ticks.clear()
        try:
            await self.engine.tick(now, only, early=early)
        except Exception as exc:
            self._log.exception("tick_failed", error=f"{type(exc).__name__}: {exc}")
            if only is None:
                if self.engine.health is not None:
                    self.engine.health.tick_done(now, False)
                self.engine.metrics.observe_tick(0.0, False)
        finally:
            self.engine.room.backlog.between_ticks.set()
