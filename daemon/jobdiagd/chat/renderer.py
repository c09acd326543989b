"""Renders alert pictures off the event loop: a small spawned process pool with a timeout (or a thread).

Decisions where the issue is silent (figures from `bench/bench_plots.py` on the 2-core CI box):
- Default is a process. In a thread a render (0.25-1 s) holds the GIL in 5 ms slices: the loop
  stays responsive (a 10 ms ticker is up to ~30 ms late, ~17 ms with the process) but a thread
  cannot be stopped at the timeout, and it would load matplotlib into the daemon (+~55 MB RSS
  on a ~70 MB daemon). The worker is spawned (a fork of a daemon with threads is unsafe) and
  imports the plotting code itself; `warm()` pays its ~1.2 s start-up once.
- `multiprocessing.Pool` rather than `ProcessPoolExecutor`: its public `terminate()` kills a
  render stuck past the timeout; the next render starts a fresh worker. Workers are recycled
  after `max_tasks_per_child` renders, so a leak in a plotting library cannot grow forever.
- A failed or timed-out render is a `RenderError` naming the picture; the caller sends its
  message without the picture. Renders queue behind `workers` (default 1): pictures are rare.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.pool
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import structlog

from jobdiagd.goodput.report import GoodputChart
from jobdiagd.model.plotdata import HostStrip, PowerStrip, StepChart

log = structlog.get_logger(__name__)

Spec = StepChart | PowerStrip | HostStrip | GoodputChart
Mode = Literal["process", "thread"]


class RenderError(Exception):
    """A picture could not be rendered (timeout, error in the plotting code, worker died)."""


def render_in_worker(spec: Spec) -> bytes:
    """Runs in the worker: the plotting module (and matplotlib) is imported there, not in the daemon."""
    if isinstance(spec, GoodputChart):
        from jobdiagd.chat.goodput_plot import render_goodput

        return render_goodput(spec)
    from jobdiagd.chat.plots import render

    return render(spec)


def _warm_worker() -> bool:
    import jobdiagd.chat.plots  # noqa: F401  (the import is the warm-up)

    return True


def _what(spec: Spec) -> str:
    return f"{type(spec).__name__} {spec.title!r}"


class PlotRenderer:
    """`await renderer.render(spec)` -> PNG bytes; `await renderer.close()` at shutdown."""

    def __init__(
        self,
        *,
        mode: Mode = "process",
        timeout_s: float = 30.0,
        workers: int = 1,
        max_tasks_per_child: int = 200,
    ) -> None:
        if mode not in ("process", "thread"):
            raise ValueError(f"render mode must be 'process' or 'thread', got {mode!r}")
        if timeout_s <= 0 or workers < 1:
            raise ValueError("timeout_s must be > 0 and workers >= 1")
        self.mode = mode
        self.timeout_s = timeout_s
        self.workers = workers
        self.max_tasks_per_child = max_tasks_per_child
        self._pool: multiprocessing.pool.Pool | None = None
        self._threads: ThreadPoolExecutor | None = None
        self.rendered = 0
        self.failed = 0

    def _process_pool(self) -> multiprocessing.pool.Pool:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ctx.Pool(processes=self.workers, maxtasksperchild=self.max_tasks_per_child)
        return self._pool

    async def _run_process(self, fn: Callable[..., object], args: tuple[object, ...]) -> object:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[object] = loop.create_future()

        # Pool callbacks run in the pool's result thread; a timed-out future is already done.
        def settle(value: object, exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(value)

        def done(value: object) -> None:
            loop.call_soon_threadsafe(settle, value, None)

        def failed(exc: BaseException) -> None:
            loop.call_soon_threadsafe(settle, None, exc)

        pool = self._process_pool()
        pool.apply_async(fn, args, callback=done, error_callback=failed)
        return await fut

    async def render(self, spec: Spec) -> bytes:
        if not isinstance(spec, StepChart | PowerStrip | HostStrip | GoodputChart):
            raise TypeError(f"cannot render {type(spec).__name__}")
        try:
            async with asyncio.timeout(self.timeout_s):
                if self.mode == "thread":
                    if self._threads is None:
                        self._threads = ThreadPoolExecutor(self.workers, thread_name_prefix="jobdiagd-plot")
                    png = await asyncio.get_running_loop().run_in_executor(
                        self._threads, render_in_worker, spec
                    )
                else:
                    out = await self._run_process(render_in_worker, (spec,))
                    assert isinstance(out, bytes)
                    png = out
        except TimeoutError as exc:
            self.failed += 1
            await self._reset(f"timed out after {self.timeout_s:g}s")
            raise RenderError(f"rendering {_what(spec)} timed out after {self.timeout_s:g}s") from exc
        except (asyncio.CancelledError, RenderError):
            raise
        except Exception as exc:
            self.failed += 1
            log.warning("plots.render_failed", picture=_what(spec), error=f"{type(exc).__name__}: {exc}")
            raise RenderError(f"rendering {_what(spec)} failed: {type(exc).__name__}: {exc}") from exc
        self.rendered += 1
        return png

    async def warm(self) -> None:
        """Start the worker and import the plotting code there, so the first alert is not slower."""
        if self.mode == "process":
            async with asyncio.timeout(max(self.timeout_s, 60.0)):
                await self._run_process(_warm_worker, ())

    async def _reset(self, why: str) -> None:
        """Kill the worker(s) of a stuck render; the next render spawns fresh ones."""
        pool, self._pool = self._pool, None
        if pool is not None:
            log.warning("plots.worker_reset", reason=why)
            await asyncio.to_thread(_terminate, pool)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(_terminate, pool)
        threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)


def _terminate(pool: multiprocessing.pool.Pool) -> None:
    pool.terminate()
    pool.join()
