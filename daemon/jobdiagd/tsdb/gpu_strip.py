"""GPU power and utilization per host over a window (the RAY=1 power strip), in one range query.

Decisions where the issue is silent:
- Cost is bounded by the window, not the job's size: one `query_range` whose step keeps at
  most `max_points` points per series (never below 20 s, twice the node_hw scrape interval),
  aggregated per host in PromQL (mean, min, max and count over the host's GPUs), so 64 hosts
  x 8 GPUs cost 64 series per arm, not 512.
- Each point is `avg_over_time` over one step, not the last sample: a host that stopped
  reporting drops out within one step instead of being carried for the 5 min lookback.
- Utilization is grouped by `host`, `ip` and `instance` because its labels vary by Ray version;
  the host comes from `host`, else the scrape target's host name, else the IP (then noted).
- Host names from labels are validated: well-formed, and in the job's node list when one is
  given (IPs are kept only as IPs); others are dropped with a note. Nodes of the list that sent
  no power sample at all are returned empty, so the picture shows them as silent.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jobdiagd.model.plotdata import HostSeries
from jobdiagd.tsdb.access import AccessError, validate_host
from jobdiagd.tsdb.client import PromClient, Series, multi_arm, split_arms_series
from jobdiagd.tsdb.context import short_host
from jobdiagd.tsdb.playbooks.base import host_of

POWER_METRIC = "hw_gpu_power_watts"
UTIL_METRIC = "ray_node_gpus_utilization"
MAX_POINTS = 240
MIN_STEP_S = 20
WINDOW_S = 3600.0

_HOST_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*\Z")


@dataclass(frozen=True)
class GpuStrip:
    """Per-host series on one time grid (`start`, `start + step_s`, ... <= `end`)."""

    power: tuple[HostSeries, ...]
    util: tuple[HostSeries, ...]
    start: float
    end: float
    step_s: float
    notes: tuple[str, ...] = ()
    queries: int = 1


def strip_step(start: float, end: float, max_points: int = MAX_POINTS) -> int:
    """Whole seconds between points so a series has at most `max_points` points."""
    if end <= start:
        raise ValueError(f"empty window: start {start} >= end {end}")
    return max(MIN_STEP_S, math.ceil((end - start) / max(1, max_points - 1)))


def strip_query(step_s: int) -> str:
    w = f"{step_s}s"
    by_util = "host, ip, instance"
    arms = {
        "p_mean": f"avg by (host) (avg_over_time({POWER_METRIC}[{w}]))",
        "p_min": f"min by (host) (avg_over_time({POWER_METRIC}[{w}]))",
        "p_max": f"max by (host) (avg_over_time({POWER_METRIC}[{w}]))",
        "p_n": f"count by (host) (avg_over_time({POWER_METRIC}[{w}]))",
        "u_mean": f"avg by ({by_util}) (avg_over_time({UTIL_METRIC}[{w}]))",
        "u_min": f"min by ({by_util}) (avg_over_time({UTIL_METRIC}[{w}]))",
        "u_max": f"max by ({by_util}) (avg_over_time({UTIL_METRIC}[{w}]))",
        "u_n": f"count by ({by_util}) (avg_over_time({UTIL_METRIC}[{w}]))",
    }
    return multi_arm(arms)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def check_host(name: str, nodes: Sequence[str]) -> str:
    """The label's host if it may be shown: an IP, or a well-formed name (in `nodes` when given)."""
    if _is_ip(name):
        return name
    if nodes:
        return short_host(validate_host(name, nodes))
    if not _HOST_RE.match(name) or len(name) > 253:
        raise AccessError(f"invalid host name in metrics: {name[:80]!r}")
    return short_host(name)


class _Acc:
    """Per-host accumulation on the grid (several label sets can name one host)."""

    def __init__(self, n: int) -> None:
        self.sums = [0.0] * n
        self.counts = [0] * n
        self.low = [math.inf] * n
        self.high = [-math.inf] * n
        self.gpus = 0

    def add(self, kind: str, i: int, v: float) -> None:
        """Fold one sample of the `kind` arm (mean | min | max | n) at grid index i."""
        if kind == "mean":
            self.sums[i] += v
            self.counts[i] += 1
        elif kind == "min":
            self.low[i] = min(self.low[i], v)
        elif kind == "max":
            self.high[i] = max(self.high[i], v)
        else:
            self.gpus = max(self.gpus, int(v))


def _fold(
    arms: dict[str, list[Series]], prefix: str, grid: list[float], nodes: Sequence[str], dropped: set[str]
) -> dict[str, _Acc]:
    index = {round(t, 3): i for i, t in enumerate(grid)}
    out: dict[str, _Acc] = {}

    def acc_for(labels: Mapping[str, str]) -> _Acc | None:
        raw = host_of(labels)
        try:
            host = check_host(raw, nodes)
        except AccessError:
            dropped.add(raw[:80])
            return None
        return out.setdefault(host, _Acc(len(grid)))

    for kind in ("mean", "min", "max", "n"):
        for s in arms.get(f"{prefix}_{kind}", []):
            acc = acc_for(s.labels)
            if acc is None:
                continue
            for t, v in s.points:
                i = index.get(round(t, 3))
                if i is not None and not math.isnan(v):
                    acc.add(kind, i, v)
    return out


def _series(host: str, acc: _Acc, grid: list[float]) -> HostSeries:
    nan = float("nan")
    mean = tuple(s / c if c else nan for s, c in zip(acc.sums, acc.counts, strict=True))
    low = tuple(v if math.isfinite(v) else nan for v in acc.low)
    high = tuple(v if math.isfinite(v) else nan for v in acc.high)
    return HostSeries(host, tuple(grid), mean, low, high, acc.gpus or None)


async def fetch_gpu_strip(
    client: PromClient,
    *,
    start: float,
    end: float,
    nodes: Sequence[str] = (),
    max_points: int = MAX_POINTS,
) -> GpuStrip:
    """Per-host GPU power (W) and utilization (%) between `start` and `end` (epoch seconds).

    `nodes`: the job's node list (from the log/Slurm); hosts outside it are dropped. Raises
    `PromError` when Prometheus fails, `ValueError` for an empty window.
    """
    step = strip_step(start, end, max_points)
    res = await client.query_range(strip_query(step), start, end, step)
    arms = split_arms_series(res)
    n = int((end - start) // step) + 1
    grid = [round(start + i * step, 3) for i in range(n)]
    dropped: set[str] = set()
    power = _fold(arms, "p", grid, nodes, dropped)
    util = _fold(arms, "u", grid, nodes, dropped)
    notes: list[str] = []
    short_nodes = [short_host(x) for x in nodes]
    for h in short_nodes:
        if h not in power:
            power[h] = _Acc(len(grid))
    if util and all(_is_ip(h) for h in util):
        notes.append("GPU utilization is labelled by IP only (this Ray version): shown per IP")
    elif util:
        for h in short_nodes:
            util.setdefault(h, _Acc(len(grid)))
    if dropped:
        shown = ", ".join(sorted(dropped)[:3])
        notes.append(f"ignored {len(dropped)} host label(s) not in the job's node list: {shown}")
    if not arms.get("p_mean"):
        notes.append(f"no {POWER_METRIC} samples in this window")
    if not arms.get("u_mean"):
        notes.append(f"no {UTIL_METRIC} samples in this window")
    return GpuStrip(
        power=tuple(_series(h, power[h], grid) for h in sorted(power)),
        util=tuple(_series(h, util[h], grid) for h in sorted(util)),
        start=start,
        end=end,
        step_s=float(step),
        notes=tuple(notes),
    )
