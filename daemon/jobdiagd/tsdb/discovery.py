"""Discovery first: metric families, hosts vs NNODES, the whole time range, targets, and the log cross-check.

Hosts are compared and reported by short name (labels may carry a domain suffix the log's node list lacks).
A Prometheus that serves no series at all from a prometheus/ directory that holds blocks is not a healthy
job: it is an unusable database (wrong path, unreadable blocks), reported as "no TSDB data" (runbook step 2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from jobdiagd.tsdb.access import NoTsdb, TsdbHandle, read_blocks
from jobdiagd.tsdb.align import (
    TB_QUERY_NAMES,
    CrossCheck,
    Timeline,
    cross_check,
    timeline_from_log,
    timeline_from_series,
)
from jobdiagd.tsdb.client import multi_arm, split_arms
from jobdiagd.tsdb.context import DiagnosisContext, short_host
from jobdiagd.tsdb.settings import TsdbSettings, model_from_vram, normalize_model

FAMILY_PREFIXES = (
    "hw_gpu_",
    "hw_tcp_",
    "hw_rdma_",
    "hw_io_",
    "hw_mem_",
    "hw_oom_",
    "hw_net_",
    "hw_procs_",
    "hw_dmesg_",
    "ray_node_",
    "tb_",
)


class WrongDatabase(Exception):
    """The TSDB's tb_step/tb_learning_loss do not match the job log."""


@dataclass(frozen=True)
class Discovery:
    metric_names: tuple[str, ...]
    families: dict[str, int]
    hosts: tuple[str, ...]
    missing_hosts: tuple[str, ...]
    extra_hosts: tuple[str, ...]
    min_time: float
    max_time: float
    range_source: str
    targets: tuple[tuple[str, str, float, float], ...]  # (job, instance, value, last scrape)
    gpus_per_host: int
    gpu_model: str
    timeline: Timeline
    crosscheck: CrossCheck
    notes: tuple[str, ...] = field(default_factory=tuple)

    def has(self, name: str) -> bool:
        return name in self.metric_names

    def names(self, prefix: str) -> list[str]:
        return [n for n in self.metric_names if n.startswith(prefix)]

    @property
    def duration_s(self) -> float:
        return max(0.0, self.max_time - self.min_time)


def family_counts(names: Sequence[str]) -> dict[str, int]:
    out = {p: sum(1 for n in names if n.startswith(p)) for p in FAMILY_PREFIXES}
    return {k: v for k, v in out.items() if v}


def _valid_ms(x: object) -> float | None:
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    # An empty head reports int64 extremes.
    return v / 1000.0 if math.isfinite(v) and 0 < v < 4e12 else None


async def time_range(handle: TsdbHandle) -> tuple[float, float, str]:
    """Whole-TSDB range: block meta.json when on disk, else Prometheus' own lowest-timestamp gauge; head stats extend it."""
    lo: float | None = None
    hi: float | None = None
    sources: list[str] = []
    if handle.tsdb_dir is not None:
        blocks = read_blocks(handle.tsdb_dir)
        if blocks:
            lo = min(b.min_time for b in blocks)
            hi = max(b.max_time for b in blocks)
            sources.append(f"{len(blocks)} block meta.json")
    status = await handle.client.status_tsdb()
    head = status.get("headStats") or {}
    if int(head.get("numSeries", 0) or 0) > 0:
        hmin, hmax = _valid_ms(head.get("minTime")), _valid_ms(head.get("maxTime"))
        if hmin is not None and hmax is not None:
            lo = hmin if lo is None else min(lo, hmin)
            hi = hmax if hi is None else max(hi, hmax)
            sources.append("head stats")
    if lo is None or handle.tsdb_dir is None:
        m = await handle.client.self_metrics()
        low = m.get("prometheus_tsdb_lowest_timestamp_seconds")
        if low and low > 0:
            lo = low if lo is None else min(lo, low)
            sources.append("prometheus_tsdb_lowest_timestamp_seconds")
        hmax_s = m.get("prometheus_tsdb_head_max_time_seconds")
        if hmax_s and 0 < hmax_s < 4e9:
            hi = hmax_s if hi is None else max(hi, hmax_s)
    if lo is None or hi is None:
        raise WrongDatabase("cannot determine the TSDB time range (no blocks, empty head)")
    return lo, hi, " + ".join(sources)


async def discover(handle: TsdbHandle, ctx: DiagnosisContext, settings: TsdbSettings) -> Discovery:
    client = handle.client
    names = tuple(await client.label_values("__name__"))
    if not any(n.startswith(FAMILY_PREFIXES) for n in names):
        blocks = read_blocks(handle.tsdb_dir) if handle.tsdb_dir is not None else []
        raise NoTsdb(
            f"no TSDB data: {handle.client.label} serves no job metrics"
            + (f" although {handle.tsdb_dir} holds {len(blocks)} block(s)" if blocks else "")
            + " -- unusable database, log-only diagnosis"
        )
    hosts = tuple(sorted({short_host(h) for h in await client.label_values("host")}))
    lo, hi, src = await time_range(handle)
    span = max(60, int(math.ceil(hi - lo)) + 60)
    arms = {
        "up": "up",
        "vram": f"max(last_over_time(hw_gpu_vram_total_bytes[{span}s]))",
        "gpus": f"count by (host) (last_over_time(hw_gpu_power_watts[{span}s]))",
    }
    res = split_arms(await client.query_vector(multi_arm(arms), hi))
    targets = tuple(
        sorted((s.labels.get("job", "?"), s.labels.get("instance", "?"), s.v, s.t) for s in res.get("up", []))
    )
    gpus = max((int(s.v) for s in res.get("gpus", [])), default=0)
    model = settings.gpu_model
    notes: list[str] = []
    if model is None and ctx.platform:
        guess = normalize_model(ctx.platform)
        model = guess if guess in settings.gpu_profiles else None
    if model is None and res.get("vram"):
        model = model_from_vram(res["vram"][0].v)
    if model is None:
        model = "MI300X"
        notes.append("GPU model unknown: using MI300X thresholds")
    tb_names = [n for n in TB_QUERY_NAMES if n in names]
    if tb_names:
        sel = '{__name__=~"' + "|".join(tb_names) + f'"}}[{span}s]'
        tl = timeline_from_series(await client.query_matrix(sel, hi))
    else:
        tl = Timeline((), "none")
    check = cross_check(tl, ctx.steps)
    if tl.empty:
        tl = timeline_from_log(ctx.steps)
        if not tl.empty:
            notes.append("no tb_* samples in the TSDB: step timing taken from the log")
    nodes = {short_host(n) for n in ctx.nodes}
    missing = tuple(sorted(nodes - set(hosts))) if nodes else ()
    extra = tuple(sorted(set(hosts) - nodes)) if nodes else ()
    if ctx.nnodes and len(hosts) != ctx.nnodes:
        notes.append(f"TSDB has {len(hosts)} hosts, job has NNODES={ctx.nnodes}")
    return Discovery(
        metric_names=names,
        families=family_counts(names),
        hosts=hosts,
        missing_hosts=missing,
        extra_hosts=extra,
        min_time=lo,
        max_time=hi,
        range_source=src,
        targets=targets,
        gpus_per_host=gpus,
        gpu_model=model,
        timeline=tl,
        crosscheck=check,
        notes=tuple(notes),
    )
