"""The early page's edge: ask overdue live jobs' GPUs off the tick, bounded, and hand back confirmations.

Which Prometheus: a live RAY=1 job's own (through the ssh tunnel pool), else the site
Prometheus of `[site_prometheus]` (`service.site_source.SiteJobs`) for any job whose nodes
Slurm names; a RAY=1 job whose own Prometheus answers `no-data` is asked on the site too (the
same judge either way, rule SITE-1). A job asked only on the site is paced by the site's scrape
interval, whose cache makes jobs on the same nodes cost one query (rule SITE-5).

Scheduling (decided here): `poll(views, now)` is called by the engine's loop after every full
tick and whenever `next_poll_at()` comes; it never waits on the network. For each job whose step is
overdue (`HangDetector.early_due_at`) and not yet confirmed for that step, it starts one
query task per `early_scrape_interval_s` (a job with a query in flight is skipped, so a slow
Prometheus costs one query at a time, never a queue), through the ssh tunnel pool the hang
verdict uses (one connection per head node). At most `early_max_concurrent` queries run at
once (a semaphore; the others wait their turn in it). The answer goes through the one GPU-hang
judge (`tsdb.gpu_hang.judge`, rule HANG-GPU, the one the hang page's verdict uses) into the job's
`EarlyMemo` (`view.gpu_check`); a confirmation sets `wake`, and the engine runs the hang
detector for those jobs at once (`take_confirmed`), not at the next full tick. A failed query
is `no-data` (never confirms); the step budget is untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobdiagd.detectors import Detector, EarlyMemo, early_memo
from jobdiagd.detectors.hang import EarlyRule, HangDetector
from jobdiagd.logsetup import get_logger
from jobdiagd.model.kinds import GpuHangState
from jobdiagd.service.jobs import JobView
from jobdiagd.service.site_source import SiteJobs
from jobdiagd.tsdb.access import SshTunnelPool
from jobdiagd.tsdb.context import DiagnosisContext, context_from_result
from jobdiagd.tsdb.gpu_hang import GpuVerdict
from jobdiagd.tsdb.hang_verdict import hang_power_verdict
from jobdiagd.tsdb.settings import TsdbSettings

QueryFn = Callable[[DiagnosisContext, float], Coroutine[Any, Any, GpuVerdict]]


@dataclass
class _Job:
    step: int
    step_at: float | None
    ctx: DiagnosisContext | None
    site: bool = False  # the site Prometheus may be asked about it (Slurm names its nodes)
    next_at: float = float("-inf")
    task: asyncio.Task[GpuVerdict] | None = None


async def live_early_verdict(
    ctx: DiagnosisContext, now: float, *, settings: TsdbSettings, tunnels: SshTunnelPool, timeout_s: float
) -> GpuVerdict:
    """One early query against the live job's Prometheus (ssh forward; never a block copy), judged
    by the one GPU-hang judge (the hang page's verdict asks the same)."""
    if not ctx.live:
        return GpuVerdict(GpuHangState.NO_DATA, "not a live job: no early query", now)
    return await hang_power_verdict(ctx, now, settings=settings, tunnels=tunnels, timeout_s=timeout_s)


class EarlyConfirmer:
    def __init__(
        self, settings: TsdbSettings, tunnels: SshTunnelPool, *, query_fn: QueryFn | None = None
    ) -> None:
        self.settings = settings
        self.rule = EarlyRule(settings.early_overdue_factor, settings.early_overdue_slack_s)
        self.interval = settings.early_scrape_interval_s
        timeout = max(1.0, min(settings.query_timeout_s, self.interval))
        self._query: QueryFn = query_fn or (
            lambda ctx, now: live_early_verdict(
                ctx, now, settings=settings, tunnels=tunnels, timeout_s=timeout
            )
        )
        self._sem = asyncio.Semaphore(settings.early_max_concurrent)
        self._jobs: dict[str, _Job] = {}
        self._confirmed: set[str] = set()
        self._next: float | None = None
        self._hang: HangDetector | None = None  # the running hang detector: its budgets arm the page
        self.site: SiteJobs | None = None  # the site Prometheus, when configured and usable
        self.wake = asyncio.Event()
        self.queries = 0
        self._log = get_logger(component="early_page")

    def poll(self, views: Mapping[str, JobView], now: float, detectors: Sequence[Detector]) -> None:
        """Start the due queries (non-blocking); forget jobs that are no longer overdue. Without a
        hang detector among `detectors` nothing is overdue."""
        self._hang = next((d for d in detectors if isinstance(d, HangDetector)), None)
        nxt: float | None = None
        for key in list(self._jobs):
            if key not in views:
                self._drop(key)
        for key, view in views.items():
            due = self._due(view, now)
            job = self._jobs.get(key)
            if due is None:
                if job is not None:
                    self._drop(key)
                continue
            if due > now:
                nxt = due if nxt is None else min(nxt, due)
                continue
            last = view.last_step
            assert last is not None
            if job is None or (job.step, job.step_at) != (last, view.last_step_at):
                self._drop(key)
                site = self.site is not None and self.site.usable and self.site.placed(view)
                job = self._jobs[key] = _Job(last, view.last_step_at, _context(view, now), site)
            if job.ctx is None and not job.site:
                continue  # no Prometheus of its own (not RAY=1, no head/port) and no site: nothing to ask
            if job.task is None and now >= job.next_at:
                job.next_at = now + (
                    self.interval if job.ctx is not None or self.site is None else self.site.interval
                )
                job.task = asyncio.get_running_loop().create_task(self._ask(key, view, job, now))
            # In flight past its next slot: the loop looks again shortly (at most every MIN_EARLY_GAP_S).
            nxt = job.next_at if nxt is None else min(nxt, job.next_at)
        self._next = nxt

    def _due(self, view: JobView, now: float) -> float | None:
        if view.ended or view.main is None or (view.slurm is not None and view.slurm.state != "RUNNING"):
            return None
        memo = early_memo(view)
        if memo is not None and memo.verdict.confirmed:
            return None  # confirmed for this step: nothing more to ask
        window = self._hang.early_window(view, self.rule) if self._hang is not None else None
        if window is None or now > window[1]:
            return None  # not armed, or past the step budget (which pages on its own)
        return window[0]

    async def _verdict(self, view: JobView, job: _Job, now: float) -> GpuVerdict:
        """The job's own Prometheus first; the site's when it has none or its answer is `no-data`."""
        own = await self._query(job.ctx, now) if job.ctx is not None else None
        if own is not None and (own.state is not GpuHangState.NO_DATA or not job.site):
            return own
        assert self.site is not None  # `job.site` is set only with a site; `poll` skips a job with neither
        site = await self.site.early_verdict(view, now)
        return site if own is None or site.state is not GpuHangState.NO_DATA else own

    async def _ask(self, key: str, view: JobView, job: _Job, now: float) -> GpuVerdict:
        try:
            async with self._sem:
                self.queries += 1
                verdict = await self._verdict(view, job, now)
        except Exception as exc:  # a bug in one query must not stop the others
            verdict = GpuVerdict(
                GpuHangState.NO_DATA, f"early query failed: {type(exc).__name__}: {exc}", now
            )
        finally:
            job.task = None
        if (view.last_step, view.last_step_at) == (job.step, job.step_at):
            view.gpu_check = EarlyMemo(job.step, verdict, job.step_at)
            if verdict.confirmed:
                self._log.info("early_confirmed", job_id=key, state=verdict.state, suspects=verdict.suspects)
                self._confirmed.add(key)
                self.wake.set()
        return verdict

    def next_poll_at(self) -> float | None:
        return self._next

    def take_confirmed(self) -> set[str]:
        out, self._confirmed = self._confirmed, set()
        self.wake.clear()
        return out

    def _drop(self, key: str) -> None:
        job = self._jobs.pop(key, None)
        if job is not None and job.task is not None:
            job.task.cancel()

    async def close(self) -> None:
        tasks = [j.task for j in self._jobs.values() if j.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._jobs.clear()


def _context(view: JobView, now: float) -> DiagnosisContext | None:
    """The job's TSDB coordinates, if it is a live RAY=1 job with a head node and port in its log."""
    res = view.analysis(now)
    if not (res.ray and res.live.head_node and res.live.prometheus_port):
        return None
    ctx = context_from_result(res)
    return ctx if ctx.live else None
