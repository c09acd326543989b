"""The site Prometheus as a source: bounded queries, a shared cache, one degraded state (the I/O edge).

What it answers, for a job given as a `JobPlacement` (Slurm id, nodes, GPU allotment):

- `early_verdict(placement)`: the GPU-confirmed early hang verdict from the site's exporters,
  through the one judge (`site.verdict`, rule SITE-1);
- `slide(placement, start, end)`: per-host series of the slide's window for the slow-host
  judge (`tsdb.slow_host`) and the strip picture (rule SLOW-1);
- `check_map()`: the start-up check of the metric map, one query per mapped metric, each wrong
  name reported by name (rule SITE-7).

Bounds (rule SITE-5): one `query_range` per node set per scrape interval for the early verdict
-- the answer is cached for the rest of that interval and shared by every job on the same
nodes, and a query in flight is awaited by the jobs asking meanwhile, never sent twice; at
most `max_in_flight` queries run at once (a semaphore: the others wait their turn); each query
is cut off after `timeout_s`.

Failure (rule SITE-6): a site Prometheus that is down, slow (timeout), or answers garbage makes
the verdict `no-data` ("unknown") for the jobs asking -- never a confirmation; the step budget
still pages. The failure is cached for the interval like an answer, so 1000 jobs cost one
attempt, and it is one edge-triggered degraded state (`EdgeTrigger`): one notice when it
starts failing, one when it answers again (`take_notices`), not one per job.

Reaching it: the URL directly, or through `ssh_host` with the ssh tunnel pool the per-job
Prometheus uses (`tsdb.access.SshTunnelPool`: one persistent connection, a local forward to
the URL's host and port as seen from `ssh_host`). An `Authorization` header (basic or bearer,
read by the caller from a file or a systemd credential) goes with every request and is never
logged nor part of an error.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import math
import urllib.parse
from collections.abc import Callable, Coroutine, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import aiohttp

from jobdiagd import clock
from jobdiagd.edge_trigger import EdgeTrigger
from jobdiagd.logsetup import get_logger
from jobdiagd.model.plotdata import HostSeries
from jobdiagd.tsdb.access import AccessError, SshTunnelPool
from jobdiagd.tsdb.client import PromClient, PromError, Sample, Series
from jobdiagd.tsdb.settings import TsdbSettings
from jobdiagd.tsdb.site.hosts import HostRewrite, valid_nodes
from jobdiagd.tsdb.site.placement import JobPlacement, SiteSeries, select
from jobdiagd.tsdb.site.profiles import GPU_ROLES, REQUIRED, MetricMap, MetricSpec
from jobdiagd.tsdb.site.query import (
    check_expr,
    decode,
    early_expr,
    early_step_s,
    slide_expr,
    slide_step_s,
    window_s,
)
from jobdiagd.tsdb.site.slide import host_series
from jobdiagd.tsdb.site.verdict import GpuVerdict, site_early_verdict, unknown_verdict
from jobdiagd.tsdb.slow_host import (
    SlowHostPolicy,
    SlowHostVerdict,
    host_means,
    judge_slow_hosts,
    not_compared,
)

GIB = float(2**30)


@dataclass(frozen=True)
class SiteConfig:
    """The source's runtime settings (the service builds them from `[site_prometheus]`)."""

    url: str
    metrics: MetricMap
    rewrite: HostRewrite = field(default_factory=HostRewrite)
    scrape_interval_s: float = 15.0
    max_in_flight: int = 4
    timeout_s: float = 5.0
    idle_vram_bytes: float = 2 * GIB
    ssh_host: str = ""
    authorization: str | None = field(default=None, repr=False)
    # How verdicts and errors name it, and its log lines' kind: the site's, or a RAY=1 job's own
    # (`tsdb.site.own`).
    name: str = "site Prometheus"
    log_kind: str = "site_prometheus"


@dataclass(frozen=True)
class SiteAnswer:
    """One query's decoded answer for a node set (shared by the jobs on it), or why there is none."""

    ok: bool
    at: float
    series: tuple[SiteSeries, ...] = ()
    error: str = ""
    foreign: int = 0


@dataclass(frozen=True)
class SlideAnswer:
    ok: bool
    start: float
    end: float
    series: Mapping[str, tuple[HostSeries, ...]] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    step_s: float = 0.0
    error: str = ""


@dataclass(frozen=True)
class SlowHostResult:
    """What one slow-host comparison of a TGS slide found, and on which source (`slide` is None
    when no query was sent)."""

    verdict: SlowHostVerdict
    slide: SlideAnswer | None = None
    source: str = "the site Prometheus"


@dataclass(frozen=True)
class SiteNotice:
    """One transition of the source's health, for the daemon's one notice."""

    kind: Literal["degraded", "recovered"]
    text: str
    at: float


@dataclass(frozen=True)
class MapCheck:
    """The start-up check: the map to use (host labels settled, missing optional roles dropped),
    one line per problem that stops it, one per warning."""

    metrics: MetricMap
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors


class SitePrometheus:
    def __init__(
        self,
        cfg: SiteConfig,
        settings: TsdbSettings,
        *,
        tunnels: SshTunnelPool | None = None,
        wall: Callable[[], float] = clock.wall,
    ) -> None:
        if cfg.ssh_host and tunnels is None:
            raise ValueError("ssh_host needs an ssh tunnel pool")
        self.cfg = cfg
        self.settings = settings
        self._tunnels = tunnels
        self._wall = wall
        self._sem = asyncio.Semaphore(cfg.max_in_flight)
        self._session: aiohttp.ClientSession | None = None
        self._cache: dict[Hashable, SiteAnswer] = {}
        self._inflight: dict[Hashable, asyncio.Task[SiteAnswer]] = {}
        self.health = EdgeTrigger(name=self.label, kind=cfg.log_kind)
        self._notices: list[SiteNotice] = []
        self.queries = 0  # HTTP queries sent (the load on the site Prometheus)
        self.answers = 0  # early answers handed out, cache hits included
        self._log = get_logger(component="site_prometheus")

    # -- reaching it ------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        """The server as errors and notices name it (the URL never carries credentials)."""
        return f"{self.cfg.url} via ssh {self.cfg.ssh_host}" if self.cfg.ssh_host else self.cfg.url

    def _headers(self) -> dict[str, str]:
        return {"Authorization": self.cfg.authorization} if self.cfg.authorization else {}

    async def _base_url(self) -> str:
        if not self.cfg.ssh_host:
            return self.cfg.url
        parts = urllib.parse.urlsplit(self.cfg.url)
        assert self._tunnels is not None and parts.hostname
        port = parts.port or (443 if parts.scheme == "https" else 80)
        local = await self._tunnels.forward(self.cfg.ssh_host, port, parts.hostname)
        return f"http://127.0.0.1:{local}{parts.path}"

    async def _client(self) -> PromClient:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return PromClient(
            await self._base_url(),
            label=self.label,
            timeout_s=self.cfg.timeout_s,
            session=self._session,
            headers=self._headers(),
        )

    async def _bounded(self, call: Callable[[PromClient], Coroutine[Any, Any, Any]]) -> Any:
        """One request: waits for a slot (at most max_in_flight), then at most timeout_s."""
        async with self._sem:
            self.queries += 1
            async with asyncio.timeout(self.cfg.timeout_s):
                return await call(await self._client())

    async def close(self) -> None:
        tasks = list(self._inflight.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- health -----------------------------------------------------------------------------------
    def _record(self, error: str | None, now: float) -> None:
        if error is None:
            if self.health.success(now):
                self._notices.append(
                    SiteNotice("recovered", f"site Prometheus {self.label} answers again", now)
                )
            return
        if self.health.failure(error, now):
            self._notices.append(
                SiteNotice(
                    "degraded",
                    f"site Prometheus {self.label} is not answering ({error}): GPU confirmation of "
                    "hangs and the slow-host comparison are unknown until it does; hangs are "
                    "still paged by the step budget",
                    now,
                )
            )

    def take_notices(self) -> list[SiteNotice]:
        out, self._notices = self._notices, []
        return out

    @property
    def degraded(self) -> bool:
        return self.health.failing

    def status(self) -> dict[str, Any]:
        return {"server": self.label, "queries": self.queries, "answers": self.answers, **self.health.state()}

    # -- early verdict ------------------------------------------------------------------------------
    async def fetch_early(self, nodes: Sequence[str], now: float | None = None) -> SiteAnswer:
        """The early query's answer for this node set: cached for the scrape interval it falls in,
        shared by every job on the same nodes (an answer in flight is awaited, not re-asked)."""
        good, _ = valid_nodes(nodes)
        now = self._wall() if now is None else now
        bucket = math.floor(now / self.cfg.scrape_interval_s)
        key = ("early", tuple(sorted(good)), bucket)
        self.answers += 1
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._early_query(key[1], now))
            self._inflight[key] = task
            task.add_done_callback(functools.partial(self._settle, key, bucket))
        return await asyncio.shield(task)

    def _settle(self, key: Hashable, bucket: int, task: asyncio.Task[SiteAnswer]) -> None:
        self._inflight.pop(key, None)
        if task.cancelled() or task.exception() is not None:
            return
        for k in [k for k in self._cache if isinstance(k, tuple) and k[-1] < bucket]:
            del self._cache[k]
        self._cache[key] = task.result()

    async def _early_query(self, nodes: tuple[str, ...], now: float) -> SiteAnswer:
        interval = self.cfg.scrape_interval_s
        if not nodes:
            return SiteAnswer(False, now, error="no valid node name to ask about")
        expr = early_expr(self.cfg.metrics, self.cfg.rewrite, nodes, interval)
        start = now - window_s(interval)
        try:
            answer: list[Series] = await self._bounded(
                lambda c: c.query_range(expr, start, now, early_step_s(interval))
            )
        except TimeoutError:
            return self._failed(f"timed out after {self.cfg.timeout_s:g}s", now)
        except (PromError, AccessError, OSError, aiohttp.ClientError) as exc:
            return self._failed(str(exc), now)
        self._record(None, self._wall())
        d = decode(answer, self.cfg.metrics, self.cfg.rewrite, nodes)
        return SiteAnswer(True, now, d.series, foreign=d.foreign)

    def _failed(self, error: str, now: float) -> SiteAnswer:
        self._record(error, self._wall())
        return SiteAnswer(False, now, error=error)

    def _job_label(self) -> bool:
        power = self.cfg.metrics.get("power")
        return bool(power and power.job_label)

    async def early_verdict(self, placement: JobPlacement, now: float | None = None) -> GpuVerdict:
        """The early verdict for one job (rule SITE-1): `no-data` when the site does not answer,
        when a shared node cannot be told apart, or when the judge says so."""
        ans = await self.fetch_early(placement.nodes, now)
        if not ans.ok:
            return unknown_verdict(ans.error, ans.at)
        mine, refused = select(ans.series, placement, self._job_label())
        return site_early_verdict(
            mine,
            at=ans.at,
            nodes=placement.nodes,
            refused=refused,
            settings=self.settings,
            scrape_interval_s=self.cfg.scrape_interval_s,
            idle_vram_bytes=self.cfg.idle_vram_bytes,
        )

    # -- slow host ------------------------------------------------------------------------------------
    async def slide(self, placement: JobPlacement, start: float, end: float) -> SlideAnswer:
        """Per-host series of [start, end] for the slow-host judge (one query; not cached)."""
        good, _ = valid_nodes(placement.nodes)
        if not good or end <= start:
            return SlideAnswer(False, start, end, error="no valid node name or an empty window")
        step = slide_step_s(start, end, self.cfg.scrape_interval_s)
        expr = slide_expr(self.cfg.metrics, self.cfg.rewrite, good, self.cfg.scrape_interval_s, step)
        try:
            answer: list[Series] = await self._bounded(lambda c: c.query_range(expr, start, end, step))
        except TimeoutError:
            self._record(f"timed out after {self.cfg.timeout_s:g}s", self._wall())
            return SlideAnswer(False, start, end, error=f"timed out after {self.cfg.timeout_s:g}s")
        except (PromError, AccessError, OSError, aiohttp.ClientError) as exc:
            self._record(str(exc), self._wall())
            # The page says why in a line: the server and the reason, not the query.
            brief = f"{exc.server}: {exc.reason}" if isinstance(exc, PromError) else str(exc)
            return SlideAnswer(False, start, end, error=brief)
        self._record(None, self._wall())
        d = decode(answer, self.cfg.metrics, self.cfg.rewrite, good)
        mine, refused = select(d.series, placement, self._job_label())
        return SlideAnswer(True, start, end, host_series(mine, good), refused, float(step))

    @staticmethod
    def slow_hosts(
        slide: SlideAnswer,
        baseline: SlideAnswer | None = None,
        policy: SlowHostPolicy | None = None,
        *,
        source: str = "site Prometheus",
    ) -> SlowHostVerdict:
        """The slow-host verdict of a slide (and the same hosts before it, when given); `source`
        names the server in the reason when the slide has no answer."""
        if not slide.ok:
            return not_compared(f"{source}: {slide.error}")
        base = None
        if baseline is not None and baseline.ok:
            pol = policy or SlowHostPolicy()
            base = {
                role: host_means(rows, baseline.start, baseline.end, pol.min_points)
                for role, rows in baseline.series.items()
            }
        return judge_slow_hosts(slide.series, start=slide.start, end=slide.end, baseline=base, policy=policy)

    # -- start-up check ---------------------------------------------------------------------------------
    async def check_map(self) -> MapCheck:
        """One query per mapped metric (rule SITE-7): a metric with no series, or whose series lack
        the host or GPU label the map names, is one error line naming the role and the metric."""
        metrics = self.cfg.metrics
        errors: list[str] = []
        warnings: list[str] = []
        names: list[str] | None = None
        now = self._wall()
        for role in metrics.roles():
            spec = metrics.get(role)
            assert spec is not None
            try:
                res = await self._instant(check_expr(spec))
            except (TimeoutError, PromError, AccessError, OSError, aiohttp.ClientError) as exc:
                reason = (
                    f"timed out after {self.cfg.timeout_s:g}s" if isinstance(exc, TimeoutError) else str(exc)
                )
                self._record(reason, now)
                return MapCheck(metrics, (f"[site_prometheus] {self.label} does not answer: {reason}",))
            if not res and names is None:
                names = await self._metric_names()
            spec2, err, warn = _check_role(role, spec, res, names or [], self.label)
            errors += err
            warnings += warn
            metrics = metrics.with_spec(role, spec2)
        self._record(None, now)
        self.cfg = replace(self.cfg, metrics=metrics)
        return MapCheck(metrics, tuple(errors), tuple(warnings))

    async def _instant(self, expr: str) -> list[Sample]:
        res: list[Sample] = await self._bounded(
            functools.partial(PromClient.query_vector, promql=expr, at=None)
        )
        return res

    async def _metric_names(self) -> list[str]:
        try:
            names: list[str] = await self._bounded(lambda c: c.label_values("__name__"))
        except (TimeoutError, PromError, AccessError, OSError, aiohttp.ClientError):
            return []
        return names


def _check_role(
    role: str, spec: MetricSpec, res: Sequence[Sample], known: Sequence[str], server: str
) -> tuple[MetricSpec, list[str], list[str]]:
    """(the spec to use, errors, warnings) for one role from its check query's answer."""
    where = f"[site_prometheus] {role}"
    present = {s.labels.get("__name__", "") for s in res}
    missing = [n for n in spec.names if n not in present]
    if not res:
        hints = [difflib.get_close_matches(n, known, n=1) for n in spec.names]
        hint = "; ".join(f"did you mean {h[0]!r}?" for h in hints if h)
        text = f"{where}: no series named {' or '.join(repr(n) for n in spec.names)} on {server}"
        text += f" ({hint})" if hint else ""
        if role in REQUIRED:
            return spec, [text], []
        return replace(spec, names=()), [], [text + ": not used"]
    warnings = [f"{where}: no series named {n!r}: not used" for n in missing]
    spec = replace(spec, names=tuple(n for n in spec.names if n in present))
    # Every candidate the series carry is kept: a site upgrading DCGM exporters has both spellings.
    hosts = tuple(hl for hl in spec.host_labels if any(s.labels.get(hl) for s in res))
    if not hosts:
        labels = " or ".join(spec.host_labels)
        return spec, [f"{where}: metric {spec.names[0]!r} has no host label {labels} on its series"], warnings
    spec = replace(spec, host_labels=hosts)
    if role in GPU_ROLES and not any(s.labels.get(spec.gpu_label) for s in res):
        return (
            spec,
            [f"{where}: metric {spec.names[0]!r} has no GPU label {spec.gpu_label!r} on its series"],
            warnings,
        )
    if role == "util" and spec.scale == 1.0 and max(s.v for s in res) <= 1.0:
        warnings.append(
            f"{where}: every {spec.names[0]!r} is at most 1: a 0-1 ratio? set scale = 100 "
            "(DCGM exporter >= 4.9, DCGM_FI_PROF_GR_ENGINE_ACTIVE)"
        )
    if spec.job_label and role == "power" and not any(s.labels.get(spec.job_label) for s in res):
        warnings.append(
            f"{where}: no series carries the job label {spec.job_label!r} (yet): shared nodes are told "
            "apart only by Slurm's GPU indices"
        )
    return spec, [], warnings
