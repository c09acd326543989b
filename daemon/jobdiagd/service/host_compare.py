"""The `slow host` stage's hold: a TGS page waits for its slow-host comparison (rules SLOW-5, SLOW-6).

When the TGS detector opens a degradation, each host of the job is compared with its peers over
the slide's window (`tsdb.slow_host`), and the page carries the verdict: the `slow host` fact
(the named hosts with their evidence, or why none is named), the named hosts as its `suspect
host` (the fact the suspect-node memory reads, `recovery.nodes.suspects_from`) and, with
pictures, the per-host strip of the evidence.

Which source compares (decided here; docs/site-prometheus.md, "The daemon", item 5):

1. the site Prometheus (`service.site_source.SiteJobs.compare`) when `[site_prometheus]` is
   usable and Slurm names the job's nodes: every job, RAY=1 or not (rule SLOW-5);
2. a live RAY=1 job's own Prometheus (`tsdb.site.own`, the same query and judge, through the
   enricher's ssh tunnel pool) when there is no usable site source, when Slurm names no node of
   the job, or when the site's comparison compared nothing (no answer, or too few hosts with
   data) (rule SLOW-6);
3. neither: the finding goes on at once, without the fact.

The fact says which source answered ("… (compared on the job's own Prometheus)"); "no host
compared: …" names the source(s) that did not answer and why.

Bounds: one comparison per slide (only the finding that would open the TGS incident; a reminder
is never held), one query per source asked, each cut off (the site's `timeout_seconds`; the
job's own at `[tsdb] query_timeout_s`, at most 0.8 of a tick, the ssh forward included). The
finding is held while the comparison runs, at most one tick more than the tick that started it:
then it goes out with "… did not answer within a tick" and the comparison is cancelled. Nothing
here waits on the network inside a tick.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobdiagd.alerts.incidents import IncidentBook
from jobdiagd.config import TgsConfig
from jobdiagd.detectors.tgs import KIND as TGS_KIND
from jobdiagd.logsetup import get_logger
from jobdiagd.model.alerts import Finding
from jobdiagd.service.jobs import JobView
from jobdiagd.service.plots_bridge import host_strip_payload
from jobdiagd.service.site_source import SITE_NAME, SiteJobs
from jobdiagd.tsdb.access import SshTunnelPool
from jobdiagd.tsdb.context import DiagnosisContext, context_from_result
from jobdiagd.tsdb.settings import TsdbSettings
from jobdiagd.tsdb.site import SlowHostResult
from jobdiagd.tsdb.site.own import OWN_NAME, own_slow_hosts
from jobdiagd.tsdb.slow_host import SLOW_HOST_FACT, SlowHostVerdict, not_compared, slide_window

SUSPECT_FACT = "suspect host"  # the fact the page's lead and the suspect-node memory read
DEFAULT_RECENT_STEPS = TgsConfig().recent_steps


@dataclass
class _Held:
    """A TGS finding held for its slow-host comparison."""

    task: asyncio.Task[SlowHostResult]
    source: str  # the first source asked: named when the comparison does not end in time
    timeout_s: float
    ticks: int = 0


class SlowHostHold:
    """The held TGS findings and their comparisons (module docstring)."""

    def __init__(
        self,
        settings: TsdbSettings,
        tunnels: SshTunnelPool,
        *,
        tick_s: float,
        recent_steps: int = DEFAULT_RECENT_STEPS,
    ) -> None:
        self.settings = settings
        self.tunnels = tunnels
        self.recent_steps = recent_steps  # the TGS detector's recent window (the slide's steps)
        self.timeout_s = max(1.0, min(settings.query_timeout_s, tick_s * 0.8))
        self.site: SiteJobs | None = None  # the site Prometheus, when configured and usable
        self._held: dict[str, _Held] = {}
        self.started = 0  # comparisons started (bounded: one per slide)
        self._log = get_logger(component="slow_host")

    def hold_tgs(
        self, findings: Sequence[Finding], views: Mapping[str, JobView], now: float, book: IncidentBook
    ) -> list[Finding]:
        """Hold the finding that would open a TGS incident while its comparison runs; then (or at
        once when no source can compare the job) let it go, carrying the verdict."""
        out: list[Finding] = []
        for f in findings:
            view = views.get(f.job_id)
            if f.kind != TGS_KIND or view is None:
                out.append(f)
                continue
            if f.resolved:
                self.forget(f.job_id)
                out.append(f)
                continue
            inc = book.get(f.job_id, f.kind)
            if inc is not None and inc.announced_at is not None:
                out.append(f)  # paged already: a reminder goes as it is
                continue
            held = self._held.get(f.job_id)
            if held is None:
                if not self._start(view, now):
                    out.append(f)
                continue  # held: goes out with its comparison on the next tick
            if not held.task.done() and held.ticks < 1:
                held.ticks += 1
                continue
            del self._held[f.job_id]
            out.append(self._with_slow_host(f, _result(held), view))
        return out

    def _start(self, view: JobView, now: float) -> bool:
        site = self.site
        if site is not None and not (site.usable and site.placed(view)):
            site = None
        ctx = own_context(view, now)
        if site is None and ctx is None:
            return False
        source, timeout = (
            (SITE_NAME, site.source.cfg.timeout_s) if site is not None else (OWN_NAME, self.timeout_s)
        )
        task = asyncio.get_running_loop().create_task(self._compare(view, now, site, ctx))
        self._held[view.key] = _Held(task, source, timeout)
        self.started += 1
        return True

    async def _compare(
        self, view: JobView, now: float, site: SiteJobs | None, ctx: DiagnosisContext | None
    ) -> SlowHostResult:
        """The site's comparison, then the job's own when the site compared nothing (SLOW-6)."""
        first = await site.compare(view, now) if site is not None else None
        if ctx is None or (first is not None and _answered(first)):
            assert first is not None  # `_start` asks nothing without a source
            return first
        start, end = slide_window(
            view.arrivals,
            view.last_step,
            now,
            recent_steps=self.recent_steps,
            scrape_interval_s=self.settings.early_scrape_interval_s,
        )
        own = await own_slow_hosts(
            ctx, self.settings, self.tunnels, start=start, end=end, timeout_s=self.timeout_s
        )
        if first is None or _answered(own):
            return own
        return SlowHostResult(
            not_compared(f"{_why(first)}; {_why(own)}"), None, f"{SITE_NAME} and {OWN_NAME}"
        )

    def _with_slow_host(self, f: Finding, result: SlowHostResult, view: JobView) -> Finding:
        """The finding carrying the comparison: the `slow host` fact, the named hosts as its
        `suspect host` (what the suspect-node memory reads), and the strip picture."""
        v = result.verdict
        details = dict(f.details)
        details[SLOW_HOST_FACT] = fact_text(result)
        if v.hosts:
            details[SUSPECT_FACT] = ", ".join(v.hosts)
        self._log.info(
            "slow_host", job_id=f.job_id, hosts=list(v.hosts), source=result.source, summary=v.summary
        )
        plot = f.plot
        slide = result.slide
        if plot is not None and slide is not None and slide.ok and slide.series:
            try:
                strip = host_strip_payload(slide, v, view)
            except Exception as exc:  # the page goes out with its step chart alone
                self._log.warning("host_strip_failed", job_id=f.job_id, error=f"{type(exc).__name__}: {exc}")
            else:
                plot = {**plot, "strip": strip}
        return dataclasses.replace(f, details=details, plot=plot)

    async def settled(self) -> None:
        """Until the comparisons in flight are done (they are not cancelled)."""
        tasks = [h.task for h in self._held.values()]
        if tasks:
            await asyncio.wait(tasks)

    def retain(self, keys: Collection[str]) -> None:
        """Forget the jobs that left the watch (and the site's placements of them)."""
        if self.site is not None:
            self.site.retain(keys)
        for key in [k for k in self._held if k not in keys]:
            self.forget(key)

    def forget(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            held.task.cancel()

    def status(self) -> dict[str, Any]:
        return {"held_tgs": len(self._held), "comparisons": self.started}

    async def close(self) -> None:
        tasks = [h.task for h in self._held.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._held.clear()


def own_context(view: JobView, now: float) -> DiagnosisContext | None:
    """The job's TSDB coordinates, if it is a live RAY=1 job with a head node and port in its log."""
    if view.main is None or view.ended:
        return None
    res = view.analysis(now)
    if not (res.ray and res.live.head_node and res.live.prometheus_port):
        return None
    ctx = context_from_result(res)
    return ctx if ctx.live else None


def slow_host_text(v: SlowHostVerdict) -> str:
    """The named hosts with their evidence, else why none is named."""
    if not v.hosts:
        return v.summary
    return ", ".join(f"{h} ({'; '.join(v.evidence.get(h, ()))})" for h in v.hosts)


def fact_text(result: SlowHostResult) -> str:
    """The `slow host` fact: the verdict and, when a source answered, which one."""
    text = slow_host_text(result.verdict)
    if result.slide is not None and result.slide.ok:
        return f"{text} (compared on {result.source})"
    return text


def _answered(result: SlowHostResult) -> bool:
    """The source answered and compared at least one metric (enough hosts with data)."""
    return result.slide is not None and result.slide.ok and bool(result.verdict.compared)


def _why(result: SlowHostResult) -> str:
    if result.slide is not None and result.slide.ok:
        return f"{result.source}: too few hosts with data"
    return result.verdict.summary.removeprefix("no host compared: ")


def _result(held: _Held) -> SlowHostResult:
    task = held.task
    if not task.done():
        task.cancel()
        return SlowHostResult(
            not_compared(f"{held.source} did not answer within a tick ({held.timeout_s:g}s)")
        )
    try:
        return task.result()
    except asyncio.CancelledError:
        return SlowHostResult(not_compared("the comparison was cancelled"))
    except Exception as exc:
        return SlowHostResult(not_compared(f"{type(exc).__name__}: {exc}"))
