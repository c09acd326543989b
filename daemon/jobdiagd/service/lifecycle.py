"""Service lifecycle: setup -> start tasks -> run until stopped -> cleanup in reverse, errors gathered."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from jobdiagd import clock
from jobdiagd.logsetup import get_logger
from jobdiagd.service.sdnotify import SdNotifier

AsyncFn = Callable[[], Coroutine[Any, Any, None]]
# Setup/cleanup/reload callables may be sync or async; a returned value is ignored.
StepFn = Callable[[], object]
ReloadFn = StepFn

# Every cleanup step is attempted even after the stop budget is spent; each gets at least this long.
MIN_STEP_SECONDS = 0.25


@dataclass(frozen=True)
class _Step:
    name: str
    setup: StepFn | None
    cleanup: StepFn | None
    # What is cut at the stop deadline when the cleanup runs out of time; None: the timeout is an
    # error like any other.
    cut_means: str | None = None


class Lifecycle:
    """aiohttp-style runner for the daemon.

    Steps (`add_step`) are set up in order; if one fails, the rest are skipped and those already
    set up are cleaned up in reverse. A resource opened before the service runs (a lock, a store)
    is `adopt`ed right where it is opened: it counts as set up from then on and is closed after
    every step, in reverse order of adoption; if the start fails before `run()`, `opening()`
    closes what was adopted so far. Tasks (`add_task`) start after every step is up; a task that
    raises stops the service, and its error is reported. `run()` returns normally only if nothing
    failed; otherwise it raises an ExceptionGroup of every error (setup, tasks, cleanup).

    Stopping: `request_stop()` (or SIGTERM/SIGINT when `handle_signals`) sets `stopping`; tasks get
    `drain_seconds` to finish on their own (a tick in progress completes) and are then cancelled;
    cleanups share what is left of `stop_seconds`. SIGHUP calls the reload callback. A cleanup
    that is only best effort within that budget (`cut_means`: the final delivery, whose leftovers
    stay in the outbox for the next start) logs a warning when cut, not an error.
    """

    def __init__(
        self,
        *,
        name: str = "jobdiagd",
        stop_seconds: float = 5.0,
        drain_seconds: float | None = None,
        sd: SdNotifier | None = None,
        on_reload: ReloadFn | None = None,
        watchdog_check: Callable[[], bool] | None = None,
    ) -> None:
        self.name = name
        self.stop_seconds = stop_seconds
        self.drain_seconds = stop_seconds * 0.5 if drain_seconds is None else drain_seconds
        self.sd = sd if sd is not None else SdNotifier(None)
        self.on_reload = on_reload
        self.watchdog_check = watchdog_check
        self.stop_reason: str | None = None
        self.reloads = 0
        self._steps: list[_Step] = []
        self._opened: list[_Step] = []
        self._tasks: list[tuple[str, AsyncFn, bool]] = []
        self._cancel_at_once: set[str] = set()
        self._stop = asyncio.Event()
        self._log = get_logger(component="lifecycle")
        self._reload_tasks: set[asyncio.Task[None]] = set()

    # -- building --------------------------------------------------------

    def add_step(
        self, name: str, setup: StepFn | None = None, cleanup: StepFn | None = None, *, cut_means: str | None = None
    ) -> None:
        self._steps.append(_Step(name, setup, cleanup, cut_means))

    def adopt(self, name: str, close: StepFn) -> None:
        """A resource opened already: `close` runs in the teardown (or in `opening()` on failure)."""
        self._opened.append(_Step(name, None, close))

    @contextlib.asynccontextmanager
    async def opening(self) -> AsyncIterator[None]:
        """Open and adopt resources inside: an error closes those adopted so far, then goes on."""
        try:
            yield
        except BaseException:
            await self.close_opened()
            raise

    async def close_opened(self) -> None:
        """Close the adopted resources in reverse, for a start that never reaches `run()`; a close
        that fails is logged (`cleanup_failed`), the others are still attempted."""
        errors: list[BaseException] = []
        await self._clean_up(self._opened, errors, clock.monotonic() + self.stop_seconds)
        self._opened.clear()

    def add_task(self, name: str, fn: AsyncFn, *, drain: bool = True) -> None:
        """A long-running task. drain=True: on stop it gets `drain_seconds` to finish by itself
        (a loop that checks `stopping`/`sleep()`); drain=False: cancelled at once (e.g. the
        dispatcher, whose pending work stays in the outbox)."""
        self._tasks.append((name, fn, drain))

    # -- control ---------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self, reason: str = "requested") -> None:
        if not self._stop.is_set():
            self.stop_reason = reason
            self._stop.set()

    async def sleep(self, seconds: float) -> bool:
        """Sleep, waking early on stop; True if the service is stopping (for task loops)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), max(0.0, seconds))
        return self._stop.is_set()

    async def reload(self) -> bool:
        """Run the reload callback; a failing reload is logged and the old state kept."""
        if self.on_reload is None:
            self._log.info("reload_ignored", reason="no reload callback")
            return False
        self.sd.reloading()
        try:
            await _call(self.on_reload)
        except Exception as exc:
            self._log.error("reload_failed", error=f"{type(exc).__name__}: {exc}")
            return False
        finally:
            self.sd.ready()
        self.reloads += 1
        self._log.info("reloaded", reloads=self.reloads)
        return True

    # -- running ---------------------------------------------------------

    async def run(self, *, handle_signals: bool = False) -> None:
        loop = asyncio.get_running_loop()
        started = clock.monotonic()
        errors: list[BaseException] = []
        up: list[_Step] = []
        tasks: dict[asyncio.Task[None], str] = {}
        installed: list[signal.Signals] = []
        try:
            if handle_signals:
                installed = self._install_signals(loop)
            await self._set_up(up, errors)
            if not self._stop.is_set():
                self._start_tasks(tasks)
                self.sd.ready(f"{self.name} running")
                steps = [s.name for s in (*self._opened, *up)]
                self._log.info("started", steps=steps, tasks=list(tasks.values()))
                await self._wait_for_stop(tasks, errors)
        finally:
            await self._tear_down(up, tasks, errors)
            for sig in installed:
                loop.remove_signal_handler(sig)
            for t in list(self._reload_tasks):
                t.cancel()
            self._log.info(
                "stopped",
                reason=self.stop_reason,
                errors=len(errors),
                uptime_seconds=round(clock.monotonic() - started, 3),
            )
        if errors:
            raise ExceptionGroup(
                f"{self.name}: {len(errors)} error(s) during run", [_as_exception(e) for e in errors]
            )

    async def _set_up(self, up: list[_Step], errors: list[BaseException]) -> None:
        """Set up the steps in order until one fails or a stop is requested; `up` gets those set up."""
        for step in self._steps:
            if self._stop.is_set():
                return
            try:
                if step.setup is not None:
                    await _call(step.setup)
            except Exception as exc:
                self._log.error("setup_failed", step=step.name, error=f"{type(exc).__name__}: {exc}")
                errors.append(exc)
                self.request_stop(f"setup of {step.name} failed")
                return
            up.append(step)

    def _start_tasks(self, tasks: dict[asyncio.Task[None], str]) -> None:
        for name, fn, drain in self._tasks:
            tasks[asyncio.create_task(fn(), name=name)] = name
            if not drain:
                self._cancel_at_once.add(name)
        if self.sd.watchdog_interval is not None:
            tasks[asyncio.create_task(self._watchdog(), name="watchdog")] = "watchdog"
            self._cancel_at_once.add("watchdog")

    async def _tear_down(
        self, up: list[_Step], tasks: dict[asyncio.Task[None], str], errors: list[BaseException]
    ) -> None:
        """Stop the tasks, then clean up the steps set up and the adopted resources, in reverse."""
        self.request_stop("cancelled")
        self.sd.stopping(f"{self.name} stopping: {self.stop_reason}")
        deadline = clock.monotonic() + self.stop_seconds
        await self._drain(tasks, errors, deadline)
        await self._clean_up(up, errors, deadline)
        await self._clean_up(self._opened, errors, deadline)
        self._opened.clear()

    async def _clean_up(self, steps: list[_Step], errors: list[BaseException], deadline: float) -> None:
        """Every cleanup in reverse, each within what is left of the budget (at least MIN_STEP_SECONDS)."""
        for step in reversed(steps):
            if step.cleanup is None:
                continue
            budget = max(MIN_STEP_SECONDS, deadline - clock.monotonic())
            try:
                async with asyncio.timeout(budget):
                    await _call(step.cleanup)
            except TimeoutError as exc:
                if step.cut_means is None:
                    self._log.error("cleanup_failed", step=step.name, error=f"{type(exc).__name__}: {exc}")
                    errors.append(exc)
                else:
                    self._log.warning("cleanup_cut", step=step.name, seconds=round(budget, 2), means=step.cut_means)
            except Exception as exc:
                self._log.error("cleanup_failed", step=step.name, error=f"{type(exc).__name__}: {exc}")
                errors.append(exc)

    async def _wait_for_stop(self, tasks: dict[asyncio.Task[None], str], errors: list[BaseException]) -> None:
        stop_waiter = asyncio.create_task(self._stop.wait(), name="stop-waiter")
        try:
            pending: set[asyncio.Task[Any]] = {stop_waiter, *tasks}
            while not self._stop.is_set():
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t is stop_waiter:
                        continue
                    pending.discard(t)
                    name = tasks[t]
                    exc = t.exception() if not t.cancelled() else None
                    if exc is not None:
                        self._log.error("task_failed", task=name, error=f"{type(exc).__name__}: {exc}")
                        errors.append(exc)
                        self.request_stop(f"task {name} failed")
                    else:
                        self.request_stop(f"task {name} finished")
        finally:
            stop_waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stop_waiter

    async def _drain(
        self, tasks: dict[asyncio.Task[None], str], errors: list[BaseException], deadline: float
    ) -> None:
        for t, name in tasks.items():
            if name in self._cancel_at_once:
                t.cancel()
        live = [t for t in tasks if not t.done()]
        if live:
            _, still = await asyncio.wait(live, timeout=self.drain_seconds)
            for t in still:
                t.cancel()
            if still:
                # A task that swallows CancelledError is reported, not waited for past the budget.
                await asyncio.wait(still, timeout=max(MIN_STEP_SECONDS, deadline - clock.monotonic()))
        for t, name in tasks.items():
            if t.done() and not t.cancelled():
                exc = t.exception()
                if exc is not None and exc not in errors:
                    self._log.error("task_failed", task=name, error=f"{type(exc).__name__}: {exc}")
                    errors.append(exc)
            elif not t.done():
                errors.append(TimeoutError(f"task {name} did not stop after cancel"))

    async def _watchdog(self) -> None:
        interval = self.sd.watchdog_interval or 0.0
        while not self._stop.is_set():
            # A stuck tick loop must let systemd restart us: ping only while the engine is healthy.
            if self.watchdog_check is None or self.watchdog_check():
                self.sd.watchdog()
            if await self.sleep(interval):
                return

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[signal.Signals]:
        loop.add_signal_handler(signal.SIGTERM, self.request_stop, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, self.request_stop, "SIGINT")
        loop.add_signal_handler(signal.SIGHUP, self._spawn_reload)
        return [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]

    def _spawn_reload(self) -> None:
        async def go() -> None:
            await self.reload()

        task = asyncio.get_running_loop().create_task(go(), name="reload")
        self._reload_tasks.add(task)
        task.add_done_callback(self._reload_tasks.discard)


async def _call(fn: StepFn) -> None:
    result = fn()
    if inspect.isawaitable(result):
        await result


def _as_exception(e: BaseException) -> Exception:
    return e if isinstance(e, Exception) else RuntimeError(repr(e))
