"""A site's central Prometheus as a source for every job (not only RAY=1 ones).

Most Slurm GPU sites run a Prometheus that scrapes a GPU exporter (NVIDIA's DCGM exporter,
AMD's Device Metrics Exporter) and node_exporter on every node. With it, the GPU-confirmed
early hang page and the slow-host comparison work for jobs without their own Prometheus.

- `profiles`: the metric map (built-in profiles `dcgm`, `amd`, `generic`; per-role overrides);
- `hosts`: Slurm node names <-> the exporter's host label (exact, short/FQDN, regex);
- `placement`: which GPU series are the job's on a shared node (rule SITE-4);
- `query`: the PromQL of the early, slide and check queries, and their answers read back;
- `verdict`: the one call into the GPU-hang judge (the only import of `tsdb.gpu_hang`);
- `slide`: per-host series of a slide's window for `tsdb.slow_host` and the strip picture;
- `source`: the I/O edge (`SitePrometheus`): bounded, cached, one degraded state;
- `own`: a RAY=1 job's own Prometheus through the same machinery, for its slow host (rule SLOW-6).

How the daemon uses it (`service.site_source`: start-up, placement, the early page, the slow-host
stage) is in docs/site-prometheus.md.
"""

from jobdiagd.tsdb.site.hosts import HostRewrite
from jobdiagd.tsdb.site.placement import JobPlacement, SiteSeries
from jobdiagd.tsdb.site.profiles import MetricMap, MetricSpec, builtin, resolve
from jobdiagd.tsdb.site.source import (
    MapCheck,
    SiteAnswer,
    SiteConfig,
    SiteNotice,
    SitePrometheus,
    SlideAnswer,
    SlowHostResult,
)

__all__ = [
    "HostRewrite",
    "JobPlacement",
    "MapCheck",
    "MetricMap",
    "MetricSpec",
    "SiteAnswer",
    "SiteConfig",
    "SiteNotice",
    "SitePrometheus",
    "SiteSeries",
    "SlideAnswer",
    "SlowHostResult",
    "builtin",
    "resolve",
]
