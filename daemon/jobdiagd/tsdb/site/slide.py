"""The site series of a slide's window as per-host series: what the slow-host judge compares and the
strip picture draws (`model.plotdata.HostSeries`: per host, the mean over its GPUs per step and
their min and max)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from jobdiagd.model.plotdata import HostSeries
from jobdiagd.tsdb.site.placement import SiteSeries
from jobdiagd.tsdb.site.profiles import GPU_ROLES


def host_series(series: Sequence[SiteSeries], nodes: Sequence[str]) -> dict[str, tuple[HostSeries, ...]]:
    """Role -> one `HostSeries` per node that has data (GPU roles: mean/min/max over its GPUs)."""
    grouped: dict[str, dict[str, list[SiteSeries]]] = {}
    for s in series:
        grouped.setdefault(s.role, {}).setdefault(s.node, []).append(s)
    out: dict[str, tuple[HostSeries, ...]] = {}
    order = {n: i for i, n in enumerate(nodes)}
    for role, by_node in grouped.items():
        rows = [
            _per_host(node, parts, role in GPU_ROLES)
            for node, parts in sorted(by_node.items(), key=lambda kv: order.get(kv[0], len(order)))
        ]
        out[role] = tuple(rows)
    return out


def _per_host(node: str, parts: Sequence[SiteSeries], per_gpu: bool) -> HostSeries:
    at: dict[float, list[float]] = {}
    for s in parts:
        for t, v in s.points:
            if math.isfinite(v):
                at.setdefault(t, []).append(v)
    times = tuple(sorted(at))
    mean = tuple(sum(at[t]) / len(at[t]) for t in times)
    if not per_gpu:
        return HostSeries(node, times, mean)
    return HostSeries(
        node,
        times,
        mean,
        low=tuple(min(at[t]) for t in times),
        high=tuple(max(at[t]) for t in times),
        gpus=len({s.gpu for s in parts}),
    )

