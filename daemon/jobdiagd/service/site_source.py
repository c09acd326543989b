"""The site Prometheus as the daemon uses it: built and checked at start-up, a job's placement from
Slurm, the early verdict for every job, and the slow host of a TGS slide (docs/site-prometheus.md).

- **Start-up** (`open_site`): the source from `[site_prometheus]` (`build_site_source`, the
  secret read now), then the map check (`SitePrometheus.check_map`, one query per mapped metric,
  rule SITE-7). Every error is logged by name (`site_prometheus_map_error`). Rule SITE-8: a map that does
  not match, or a secret that cannot be read, is one line (`site_prometheus_disabled`) and one
  notice, and the daemon runs without the source. **Decision:** a site Prometheus that does
  not answer at start-up is kept, its map unchecked: it is the degraded state of rule SITE-6
  (one notice, verdicts unknown, the step budget pages), and the map is checked again, at most
  every `RECHECK_S`, until it answers; only then is anything asked.
- **Placement** (`SiteJobs.placement`, rule SITE-8): squeue's node list and raw job id (`%A`, what DCGM's job
  mapping and AMD's prolog write) from the view's Slurm record and, unless `exclusive_nodes`,
  `scontrol -d show job <id>` for the GPU indices of shared nodes (rule SITE-4). **Decision:**
  asked once per job (and again only if Slurm moves it to other nodes), at most
  `DETAIL_IN_FLIGHT` at a time, and only when the job needs the site (an overdue step, a TGS
  slide); a failed `scontrol` leaves the placement without indices (the exporter's job label
  or the refusal of rule SITE-4 decides), it is not asked again for that job.
- **The early verdict** (`SiteJobs.early_verdict`): the source's bounded, cached query (rule
  SITE-5) judged by the one GPU-hang judge; `service.early_page` asks it for jobs without their
  own Prometheus, or whose own answered `no-data`.
- **The slow host** (`SiteJobs.compare`, asked by the `slow host` stage's hold,
  `service.host_compare`, rule SLOW-5): one `slide` query fetches the job's hosts over the
  slide's window and `slow_hosts` compares them.
- **Health**: the source's degraded/recovered edge becomes one notice each (`take_notices`,
  words in `alerts.notices`); `status()` is the `site_prometheus` part of `jobdiagd status`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

from jobdiagd.alerts import notices
from jobdiagd.alerts.notices import Notice
from jobdiagd.config import Config, ConfigError
from jobdiagd.logsetup import get_logger
from jobdiagd.notifiers.registry import read_authorization
from jobdiagd.service.jobs import JobView
from jobdiagd.sources.slurm import SlurmError
from jobdiagd.sources.slurm_gres import parse_job_gpus
from jobdiagd.tsdb.access import SshTunnelPool
from jobdiagd.tsdb.gpu_hang import GpuVerdict
from jobdiagd.tsdb.site import HostRewrite, JobPlacement, SiteConfig, SitePrometheus, SlowHostResult, resolve
from jobdiagd.tsdb.site.verdict import unknown_verdict
from jobdiagd.tsdb.slow_host import not_compared, slide_window

GIB = float(2**30)
DETAIL_IN_FLIGHT = 2  # scontrol -d show job calls at once
RECHECK_S = 60.0  # an unchecked map (the server did not answer at start-up) is checked again this often
SITE_NAME = "the site Prometheus"  # which source answered, as the `slow host` fact says it

# `scontrol -d show job <id>` text, None when Slurm does not know the job (raises SlurmError on failure).
DetailFn = Callable[[str], Awaitable[str | None]]


def site_config(cfg: Config, env: Mapping[str, str] | None = None) -> SiteConfig | None:
    """The source's settings, or None when `[site_prometheus]` is not enabled."""
    sp = cfg.site_prometheus
    if not sp.enabled:
        return None
    authorization = read_authorization(
        sp.auth,
        sp.username,
        sp.secret_file,
        sp.secret_credential,
        where=f"{cfg.source}: [site_prometheus]",
        env=env,
    )
    if sp.host_rewrite == "regex":
        rewrite = HostRewrite("regex", sp.host_regex[0], sp.host_regex[1])
    else:
        rewrite = HostRewrite(sp.host_rewrite)
    return SiteConfig(
        url=sp.url,
        metrics=resolve(sp.profile, sp.metrics.overrides()),
        rewrite=rewrite,
        scrape_interval_s=sp.scrape_interval_seconds,
        max_in_flight=sp.max_in_flight,
        timeout_s=sp.timeout_seconds,
        idle_vram_bytes=sp.idle_vram_gib * GIB,
        ssh_host=sp.ssh_host,
        authorization=authorization,
    )


def build_site_source(
    cfg: Config, tunnels: SshTunnelPool | None = None, env: Mapping[str, str] | None = None
) -> SitePrometheus | None:
    """The source, or None when not enabled. `tunnels`: the pool of the TSDB enricher (needed
    with `ssh_host`)."""
    site = site_config(cfg, env)
    if site is None:
        return None
    return SitePrometheus(site, cfg.tsdb, tunnels=tunnels if site.ssh_host else None)


def placement_for(
    cfg: Config, job_id: str, nodelist: str, scontrol_detail: str | None = None
) -> JobPlacement:
    """A job's placement: squeue's node list, and `scontrol -d show job` text when it was asked."""
    detail = parse_job_gpus(scontrol_detail) if scontrol_detail else None
    return JobPlacement.from_slurm(
        job_id, nodelist, detail, exclusive_nodes=cfg.site_prometheus.exclusive_nodes
    )


class SiteJobs:
    """The checked site source and what the daemon keeps per job for it (module docstring)."""

    def __init__(
        self,
        cfg: Config,
        source: SitePrometheus,
        *,
        detail: DetailFn | None = None,
        checked: bool = True,
    ) -> None:
        self.cfg = cfg
        self.source = source
        self.checked = checked
        self.disabled: str | None = None  # why the source is no longer used (a map error found later)
        self._detail = detail
        self._detail_sem = asyncio.Semaphore(DETAIL_IN_FLIGHT)
        self._check_lock = asyncio.Lock()
        self._next_check = float("-inf")
        self._placements: dict[str, tuple[str, JobPlacement]] = {}  # job -> (node list, placement)
        self._placing: dict[str, asyncio.Task[JobPlacement]] = {}
        self._notices: list[Notice] = []
        self._degraded_since: float | None = None
        self.details_asked = 0  # scontrol -d calls made (bounded: once per job)
        self._log = get_logger(component="site_prometheus")

    @property
    def interval(self) -> float:
        return self.source.cfg.scrape_interval_s

    @property
    def usable(self) -> bool:
        return self.disabled is None

    # -- placement ---------------------------------------------------------------------------------
    @staticmethod
    def placed(view: JobView) -> bool:
        """Slurm names the job's nodes (the site can be asked about it)."""
        return view.slurm is not None and bool(view.slurm.nodes)

    async def placement(self, view: JobView) -> JobPlacement | None:
        """The job's placement (cached; `scontrol -d` at most once per job and node list)."""
        slurm = view.slurm
        if slurm is None or not slurm.nodes:
            return None
        known = self._placements.get(view.key)
        if known is not None and known[0] == slurm.nodes:
            return known[1]
        task = self._placing.get(view.key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._place(slurm.job_id, slurm.nodes))
            self._placing[view.key] = task
        try:
            placement = await asyncio.shield(task)
        finally:
            if task.done():
                self._placing.pop(view.key, None)
        self._placements[view.key] = (slurm.nodes, placement)
        return placement

    async def _place(self, job_id: str, nodes: str) -> JobPlacement:
        text: str | None = None
        if self._detail is not None and not self.cfg.site_prometheus.exclusive_nodes:
            async with self._detail_sem:
                self.details_asked += 1
                try:
                    text = await self._detail(job_id)
                except (SlurmError, ValueError) as exc:
                    self._log.warning("gres_detail_failed", job_id=job_id, error=str(exc))
        try:
            return placement_for(self.cfg, job_id, nodes, text)
        except ValueError as exc:  # a host list Slurm would not print: no node to ask about
            self._log.warning("placement_failed", job_id=job_id, error=str(exc))
            return JobPlacement(job_id, ())

    def retain(self, keys: Collection[str]) -> None:
        """Forget the jobs that left the watch."""
        for key in [k for k in (*self._placements, *self._placing) if k not in keys]:
            self.forget(key)

    def forget(self, key: str) -> None:
        self._placements.pop(key, None)
        task = self._placing.pop(key, None)
        if task is not None:
            task.cancel()

    # -- the map check -------------------------------------------------------------------------------
    async def ready(self, now: float) -> str | None:
        """None when the source may be asked; else why not (the map not checked yet, or disabled).
        An unchecked map is checked again at most every RECHECK_S."""
        if self.disabled is not None:
            return self.disabled
        if self.checked:
            return None
        async with self._check_lock:
            if not self.checked and self.disabled is None and now >= self._next_check:
                self._next_check = now + RECHECK_S
                await self._recheck(now)
        if self.disabled is not None:
            return self.disabled
        return None if self.checked else "its metric map is not checked yet (it did not answer)"

    async def _recheck(self, now: float) -> None:
        check = await self.source.check_map()
        if self.source.degraded:
            return  # still not answering: asked again later
        _log_check(self._log, check.errors, check.warnings)
        if check.ok:
            self.checked = True
            self._log.info("site_prometheus_checked", server=self.source.label)
            return
        self.disabled = "its metric map does not match (see the daemon's log)"
        self._log.error("site_prometheus_disabled", server=self.source.label, reason=self.disabled)
        self._notices.append(notices.site_prometheus_unusable(self.source.label, check.errors, now))

    # -- the early verdict ----------------------------------------------------------------------------
    async def early_verdict(self, view: JobView, now: float) -> GpuVerdict:
        """The site's early verdict for a job (rule SITE-1); unknown when it cannot be asked."""
        why = await self.ready(now)
        if why is not None:
            return unknown_verdict(why, now)
        placement = await self.placement(view)
        if placement is None or not placement.nodes:
            return unknown_verdict("Slurm names no node of the job", now)
        return await self.source.early_verdict(placement, now)

    # -- the slow host (a TGS slide) ------------------------------------------------------------------
    async def compare(self, view: JobView, now: float) -> SlowHostResult:
        """One slide query over the job's hosts in the slide's window, judged (rule SLOW-5)."""
        why = await self.ready(now)
        if why is not None:
            return SlowHostResult(not_compared(f"site Prometheus: {why}"))
        placement = await self.placement(view)
        if placement is None or not placement.nodes:
            return SlowHostResult(not_compared("Slurm names no node of the job"))
        start, end = slide_window(
            view.arrivals,
            view.last_step,
            now,
            recent_steps=self.cfg.detectors.tgs.recent_steps,
            scrape_interval_s=self.interval,
        )
        slide = await self.source.slide(placement, start, end)
        return SlowHostResult(self.source.slow_hosts(slide), slide, SITE_NAME)

    # -- health ----------------------------------------------------------------------------------------
    def take_notices(self) -> list[Notice]:
        """The source's degraded/recovered transitions as the daemon's notices (one per episode)."""
        out, self._notices = self._notices, []
        for n in self.source.take_notices():
            if n.kind == "degraded":
                self._degraded_since = n.at
                out.append(
                    notices.site_prometheus_degraded(self.source.label, self.source.health.last_error, n.at)
                )
            else:
                since = self._degraded_since if self._degraded_since is not None else n.at
                self._degraded_since = None
                out.append(notices.site_prometheus_recovered(self.source.label, since, n.at))
        return out

    def status(self) -> dict[str, Any]:
        """The `site_prometheus` part of `jobdiagd status`."""
        return {
            **self.source.status(),
            "checked": self.checked,
            "disabled": self.disabled,
            "placements": len(self._placements),
            "scontrol_details": self.details_asked,
        }

    async def close(self) -> None:
        tasks = list(self._placing.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._placing.clear()
        await self.source.close()


def _log_check(log: Any, errors: Sequence[str], warnings: Sequence[str]) -> None:
    for e in errors:
        log.error("site_prometheus_map_error", error=e)
    for w in warnings:
        log.warning("site_prometheus_map_warning", warning=w)


async def open_site(
    cfg: Config,
    *,
    tunnels: SshTunnelPool | None,
    detail: DetailFn | None,
    announce: Callable[[Notice, float], object],
    now: float,
) -> SiteJobs | None:
    """Start-up (module docstring): the checked source, or None (not enabled, or not usable: one
    line and one notice, the daemon runs without it)."""
    log = get_logger(component="site_prometheus")
    if not cfg.site_prometheus.enabled:
        return None
    try:
        src = build_site_source(cfg, tunnels)
    except ConfigError as exc:
        errors = list(exc.errors)
        log.error("site_prometheus_disabled", server=cfg.site_prometheus.url, reason="; ".join(errors))
        announce(notices.site_prometheus_unusable(cfg.site_prometheus.url, errors, now, map_check=False), now)
        return None
    assert src is not None
    check = await src.check_map()
    if src.degraded:
        log.warning(
            "site_prometheus_unreachable",
            server=src.label,
            error=src.health.last_error,
            consequence="verdicts unknown until it answers; its map is checked then",
        )
        return SiteJobs(cfg, src, detail=detail, checked=False)
    _log_check(log, check.errors, check.warnings)
    if not check.ok:
        await src.close()
        log.error(
            "site_prometheus_disabled",
            server=src.label,
            reason=f"{len(check.errors)} error(s) in its metric map; running without it",
        )
        announce(notices.site_prometheus_unusable(src.label, check.errors, now), now)
        return None
    log.info("site_prometheus_checked", server=src.label, roles=list(check.metrics.roles()))
    return SiteJobs(cfg, src, detail=detail)
