"""What "stands out" means across hosts (pure): the majority pattern per metric family and robust rate outliers.

Two judgements, shared by the playbooks and the earliest-anomaly sweep, on plain in-memory values:

- **Majority pattern** (`minority_hosts`). Each metric family gives every host one category (a GPU
  activity pattern, a power band, "process present/gone", "reporting/silent", ...). The majority
  category is the most common one; a tie is broken in favour of the family's healthy category when it
  is among the tied ones, else in favour of the first host in name order (the head node, usually).
  The hosts outside the majority category deviate. A pattern every host shares (a uniform collective
  hang, every node idle) names no host.
- **Rates that stand out** (`standouts`). A counter rate of one host (or one host's device) is an
  anomaly only if it stands out against the job's own baseline AND the other hosts:
  1. at or above a minimum absolute rate (per family, from settings: single-digit background counts
     never qualify),
  2. at least `baseline_factor` x the same key's rate before the incident (a link that has always
     retransmitted at that rate did not start anything; no pre-incident data skips this test),
  3. above the other hosts' median + `mad_k` x their MAD (scaled to a standard deviation) and at least
     `peer_factor` x their median (keys of the same host are not its peers). Without other hosts
     only 1 and 2 apply.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from jobdiagd.tsdb.settings import Thresholds

K = TypeVar("K", bound=Hashable)

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution x this = its standard deviation


def robust_center(values: Sequence[float]) -> tuple[float, float]:
    """(median, MAD scaled to a standard deviation) of the finite values; (0, 0) for none."""
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return 0.0, 0.0
    med = statistics.median(vals)
    return med, statistics.median(abs(v - med) for v in vals) * MAD_TO_SIGMA


def minority_hosts(categories: Mapping[str, Hashable], healthy: Hashable | None = None) -> list[str]:
    """Hosts whose category is not the majority's (see the module docstring for ties)."""
    if len(categories) < 2:
        return []
    counts = Counter(categories.values())
    top = max(counts.values())
    tied = [c for c, n in counts.items() if n == top]
    if len(tied) == 1:
        majority = tied[0]
    elif healthy is not None and healthy in tied:
        majority = healthy
    else:
        majority = categories[min(h for h, c in categories.items() if c in tied)]
    return sorted(h for h, c in categories.items() if c != majority)


@dataclass(frozen=True)
class RateWindow:
    """Counter rates (per second) of one key: before the incident (None: no data then) and during it."""

    before: float | None
    during: float


@dataclass(frozen=True)
class StandOutRule:
    min_rate: float  # per second; the rate must also be > 0
    baseline_factor: float
    peer_factor: float
    mad_k: float

    @classmethod
    def for_family(cls, family: str, th: Thresholds) -> StandOutRule:
        return cls(
            network_min_rate(family, th), th.baseline_rate_factor, th.rate_outlier_factor, th.peer_mad_k
        )


def standouts(
    rates: Mapping[K, RateWindow], rule: StandOutRule, host_of: Callable[[K], str] = str
) -> list[K]:
    """Keys whose rate stands out against their own baseline and the other hosts (module docstring)."""
    out: list[K] = []
    for key, r in rates.items():
        if r.during <= 0 or r.during < rule.min_rate:
            continue
        if r.before is not None and r.during < rule.baseline_factor * r.before:
            continue
        host = host_of(key)
        peers = [x.during for k, x in rates.items() if host_of(k) != host]
        if peers:
            med, mad = robust_center(peers)
            if r.during < rule.peer_factor * med or r.during <= med + rule.mad_k * mad:
                continue
        out.append(key)
    return sorted(out, key=str)


# Network error counters whose background rate is noise below a minimum; anything else network-shaped
# (errors, drops, congestion notifications, resets, retry exhaustion) counts from its first event.
RETX_BYTES_PER_PACKET = 4096.0  # RoCE MTU: the bytes counter's floor is the packet floor in bytes


def network_min_rate(family: str, th: Thresholds) -> float:
    if family == "hw_tcp_retransmits_total":
        return th.tcp_rate_min_per_s
    if family == "hw_rdma_tx_retx_pkts_total":
        return th.rdma_retx_min_per_s
    if family == "hw_rdma_tx_retx_bytes_total":
        return th.rdma_retx_min_per_s * RETX_BYTES_PER_PACKET
    if family == "hw_rdma_tx_ack_timeout_total":
        return th.rdma_ack_timeout_min_per_s
    return th.net_error_min_per_s


def counter_increase(
    points: Sequence[tuple[float, float]], lo: float, hi: float
) -> tuple[float, float] | None:
    """(increase, seconds covered) of a counter between lo and hi (resets clamp to 0); None with < 2 samples."""
    pts = [(t, v) for t, v in points if lo <= t <= hi and math.isfinite(v)]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    inc = sum(max(0.0, b - a) for (_, a), (_, b) in zip(pts, pts[1:], strict=False))
    return inc, pts[-1][0] - pts[0][0]


def counter_rate(points: Sequence[tuple[float, float]], lo: float, hi: float) -> float | None:
    """Per-second increase of a counter between lo and hi; None with < 2 samples."""
    got = counter_increase(points, lo, hi)
    return got[0] / got[1] if got else None


def burst_floor(rw: RateWindow, rule: StandOutRule) -> float:
    """The per-second rate that dates a burst: the family minimum, a multiple of the key's own baseline,
    and a quarter of the burst's average rate (a sparse background tick just before it is not its start)."""
    return max(rule.min_rate, rule.baseline_factor * (rw.before or 0.0), rw.during / 4, 1e-9)


def burst_onset(points: Sequence[tuple[float, float]], lo: float, rate_floor: float) -> float | None:
    """When a counter began rising at >= rate_floor per second after lo.

    The first interval at that rate followed by at least two more of the next three (a sustained burst;
    a sparse background increment is not an onset); without one, the first increment at that rate
    (a rare event such as a single retry exhaustion)."""
    pts = [(t, v) for t, v in points if t >= lo and math.isfinite(v)]
    fast = [
        (tb, b > a and tb > ta and (b - a) / (tb - ta) >= rate_floor)
        for (ta, a), (tb, b) in zip(pts, pts[1:], strict=False)
    ]
    for i, (t, hit) in enumerate(fast):
        nxt = [h for _, h in fast[i + 1 : i + 4]]
        if hit and nxt and sum(nxt) >= min(2, len(nxt)):
            return t
    return next((t for t, hit in fast if hit), None)
