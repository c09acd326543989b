"""A RAY=1 job's own Prometheus as the source of its TGS slide's slow-host comparison (rule SLOW-6).

A RAY=1 job runs its own Prometheus on its head node (loopback-bound, reached through the ssh
tunnel pool the early page and the hang verdict use, `tsdb.access.SshTunnelPool`), scraping the
job scripts' `node_hw` and Ray exporters on every node of the job. Its metric names are the
runbook's catalog, which is what the site map's built-in `generic` profile reads
(`tsdb.site.profiles`, host label `host`): so the job's own Prometheus is compared through the
very same machinery as a site's -- `SitePrometheus.slide` (one bounded `query_range`),
`decode`, `host_series`, `slow_hosts` -- with a `SiteConfig` pointed at it, not a second query path.

**Decision (the map):** the `generic` profile unchanged, no overrides (the exporters are the job
scripts' own; `[site_prometheus.metrics]` overrides apply to the site only). Of the slide's
roles the job's Prometheus has GPU power (`hw_gpu_power_watts`), GPU utilization
(`ray_node_gpus_utilization`, GPU label `GpuIndex`), TCP retransmits
(`hw_tcp_retransmits_total`) and RDMA retransmitted packets (`hw_rdma_tx_retx_pkts_total`,
summed over the host's devices: what the network playbook rates); it has no GPU memory
activity and no memory pressure (only I/O pressure, which the slide does not compare), so those
are not compared. The map is not checked first (a role without series is just absent from the
answer, and the verdict names the metrics it compared).

**Decision (the rest):** the job's nodes are the log's node list (`DiagnosisContext.nodes`),
only valid names reach the query (`valid_nodes`; the selector is built from escaped names); the
head node must be one of them and the port a port (`validate_host`, `validate_port`) before
anything is forwarded. Its series are all the job's (it scrapes only the job's nodes), so the
placement holds its nodes whole (rule SITE-4 never refuses). The scrape interval that paces the
rate windows is `[tsdb] early_scrape_interval_s` (node_hw's). One source per comparison, closed
after it: nothing is cached, no health edge is kept (a failure is the page's "no host compared:
the job's own Prometheus: ..." and nothing else).
"""

from __future__ import annotations

from jobdiagd.tsdb.access import AccessError, SshTunnelPool, validate_host, validate_port
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.settings import TsdbSettings
from jobdiagd.tsdb.site.hosts import HostRewrite, valid_nodes
from jobdiagd.tsdb.site.placement import JobPlacement
from jobdiagd.tsdb.site.profiles import builtin
from jobdiagd.tsdb.site.source import SiteConfig, SitePrometheus, SlowHostResult
from jobdiagd.tsdb.slow_host import not_compared

OWN_PROFILE = "generic"
OWN_NAME = "the job's own Prometheus"


def own_config(ctx: DiagnosisContext, settings: TsdbSettings, *, timeout_s: float) -> SiteConfig:
    """The source settings of a live RAY=1 job's own Prometheus; AccessError when the job has none
    that may be asked (not live, no head node or port in its log, a head or port not valid)."""
    if not ctx.live:
        raise AccessError("not a live job")
    if not ctx.head_node or not ctx.port:
        raise AccessError("no head node or Prometheus port in the job's log")
    head = validate_host(ctx.head_node, ctx.nodes)
    port = validate_port(ctx.port)
    return SiteConfig(
        url=f"http://127.0.0.1:{port}",
        metrics=builtin(OWN_PROFILE),
        rewrite=HostRewrite("short"),
        scrape_interval_s=settings.early_scrape_interval_s,
        max_in_flight=1,
        timeout_s=timeout_s,
        ssh_host=head,
        name=OWN_NAME,
        log_kind="job_prometheus",
    )


def own_placement(ctx: DiagnosisContext) -> JobPlacement:
    """The job's valid node names, held whole: its own Prometheus scrapes only its nodes."""
    good, _ = valid_nodes(ctx.nodes)
    return JobPlacement(ctx.job_id or ctx.label, good, exclusive=True)


async def own_slow_hosts(
    ctx: DiagnosisContext,
    settings: TsdbSettings,
    tunnels: SshTunnelPool,
    *,
    start: float,
    end: float,
    timeout_s: float,
) -> SlowHostResult:
    """One slide query on the job's own Prometheus over [start, end] (cut off after `timeout_s`,
    the ssh forward included), judged by the slow-host judge; never raises for a source that
    cannot be reached (its verdict says "no host compared: ...")."""
    try:
        cfg = own_config(ctx, settings, timeout_s=timeout_s)
    except AccessError as exc:
        return SlowHostResult(not_compared(f"{OWN_NAME}: {exc}"), None, OWN_NAME)
    src = SitePrometheus(cfg, settings, tunnels=tunnels)
    try:
        slide = await src.slide(own_placement(ctx), start, end)
    finally:
        await src.close()
    return SlowHostResult(src.slow_hosts(slide, source=OWN_NAME), slide, OWN_NAME)
