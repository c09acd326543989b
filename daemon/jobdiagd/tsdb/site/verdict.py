"""The site source's early verdict: its series in the per-job catalog's names, through the one judge.

This module is the only place the site source touches the GPU-hang judge (`tsdb.gpu_hang`:
`judge`, `GpuVerdict`, the catalog names it reads; rule HANG-GPU). When the judge moves or
changes its signature, only this file changes.

What the judge reads, from the site's roles (rules SITE-1, SITE-2):
- `power` -> `hw_gpu_power_watts`, `util` -> `ray_node_gpus_utilization`, labels `host` (the
  job's node name) and `gpu` (the exporter's GPU index);
- `processes` -> `hw_gpu_user_processes`; without it, `vram_used` stands in: a GPU holding at
  least `idle_vram_bytes` has a process (1), one holding less has none (0);
- `io_pressure` -> `hw_io_pressure_full_pct`, per host.

The GPU model that sets the power bands: `[tsdb] gpu_model` when set, else the exporter's model
label (DCGM `modelName`, AMD `card_series`) when it names a configured model; a model label
that names no configured model gives `no-data` (another GPU's bands could read training as
busy-wait); without a model label, the judge's own choice (VRAM size, else MI300X). A verdict is `no-data` without asking the judge when a node of the job is shared and
its GPUs cannot be told apart (rule SITE-4), or when the site Prometheus did not answer
(`unknown_verdict`, rule SITE-6): both leave the step budget in charge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jobdiagd.model.kinds import GpuHangState
from jobdiagd.tsdb.client import Series
from jobdiagd.tsdb.gpu_hang import IO_FULL, POWER, PROCS, UTIL, GpuVerdict, judge, profile_for
from jobdiagd.tsdb.settings import TsdbSettings, normalize_model
from jobdiagd.tsdb.site.placement import SiteSeries

__all__ = [
    "GIB",
    "PROCS",
    "GpuVerdict",
    "catalog_series",
    "gpu_model",
    "site_early_verdict",
    "unknown_verdict",
]

GIB = float(2**30)
_NAMES = {"power": POWER, "util": UTIL, "processes": PROCS, "io_pressure": IO_FULL}


def catalog_series(series: Sequence[SiteSeries], idle_vram_bytes: float) -> list[Series]:
    """The site's series under the catalog names the judge reads (see the module docstring)."""
    has_procs = any(s.role == "processes" for s in series)
    out: list[Series] = []
    for s in series:
        labels = {"host": s.node} | ({"gpu": s.gpu} if s.gpu else {})
        if s.role in _NAMES:
            out.append(Series({"__name__": _NAMES[s.role], **labels}, s.points))
        elif s.role == "vram_used" and not has_procs:
            pts = tuple((t, 1.0 if v >= idle_vram_bytes else 0.0) for t, v in s.points)
            out.append(Series({"__name__": PROCS, **labels}, pts))
    return out


def gpu_model(series: Sequence[SiteSeries], settings: TsdbSettings) -> tuple[str | None, str | None]:
    """(the model whose power bands to use, a model label no profile knows). The configured
    model wins; else the first model label that names a known GPU profile; else none."""
    if settings.gpu_model:
        return settings.gpu_model, None
    unknown = None
    for s in series:
        if s.role != "power" or not s.model:
            continue
        if normalize_model(s.model) in settings.gpu_profiles:
            return normalize_model(s.model), None
        unknown = unknown or s.model
    return None, unknown


def site_early_verdict(
    series: Sequence[SiteSeries],
    *,
    at: float,
    nodes: Sequence[str],
    refused: Mapping[str, str],
    settings: TsdbSettings,
    scrape_interval_s: float,
    idle_vram_bytes: float,
) -> GpuVerdict:
    """The early verdict of the job's series (already selected for the job, rule SITE-4)."""
    if refused:
        why = "; ".join(f"{refused[n]}" for n in sorted(refused))
        return GpuVerdict(
            GpuHangState.NO_DATA,
            f"site Prometheus: no GPU confirmation from a shared node ({why}); the step budget decides",
            at,
            per_host={n: "shared node: not judged" for n in refused},
        )
    model, unknown = gpu_model(series, settings)
    if unknown is not None:
        # Another GPU's power bands could read its training as busy-wait (an A100 trains at the
        # MI300X busy-wait band): no confirmation without the right bands.
        return GpuVerdict(
            GpuHangState.NO_DATA,
            f"site Prometheus: no power bands for the GPU model {unknown!r}: set [tsdb] gpu_model or add "
            "[tsdb.gpu_profiles]; the step budget decides",
            at,
        )
    catalog = catalog_series(series, idle_vram_bytes)
    profile = settings.profile(model) if model else profile_for(catalog, settings)
    return judge(
        catalog,
        at=at,
        nodes=nodes,
        profile=profile,
        thresholds=settings.thresholds,
        scrape_interval_s=scrape_interval_s,
    )


def unknown_verdict(reason: str, at: float) -> GpuVerdict:
    """The site Prometheus did not answer: unknown, never a confirmation (rule SITE-6)."""
    return GpuVerdict(GpuHangState.NO_DATA, f"site Prometheus: {reason}; the step budget decides", at)
