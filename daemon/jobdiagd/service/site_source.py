"""Building the site Prometheus source from `[site_prometheus]`, and a job's placement from Slurm.

The seam the engine wiring uses (docs/site-prometheus.md): `build_site_source` once at start-up
(secret read now, a missing secret a ConfigError), then `SitePrometheus.check_map()` (one
query per mapped metric; errors are logged by name, a failing map disables the source), and
per job `placement_for` from squeue's node list and, on non-exclusive nodes, the output of
`scontrol -d show job <id>`.
"""

from __future__ import annotations

from collections.abc import Mapping

from jobdiagd.config import Config
from jobdiagd.notifiers.registry import read_authorization
from jobdiagd.sources.slurm_gres import parse_job_gpus
from jobdiagd.tsdb.access import SshTunnelPool
from jobdiagd.tsdb.site import HostRewrite, JobPlacement, SiteConfig, SitePrometheus, resolve

GIB = float(2**30)


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
