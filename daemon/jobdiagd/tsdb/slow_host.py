"""Which host is slowing everyone: each host of a job compared with its peers over a TGS slide (pure).

When the TGS detector opens a degradation, the question of the runbook's next step is *which
host*. A fail-slow component (a throttling GPU, a NIC retransmitting, a host swapping) makes
its host differ from the others while they wait for it (Greyhound: fail-slow stretches jobs
1.34x; Holmes and Minder find the machine by comparing each machine with its peers). This judge
does that comparison, per metric, over the slide's window (rules SLOW-1 to SLOW-4):

- the per-host mean of each metric over the window (from per-host series: the same
  `HostSeries` the strip picture draws), hosts with fewer than `min_points` samples left out;
- each host against the *others*: their median, and their median absolute deviation (MAD,
  x 1.4826, floored by the metric's noise so identical peers do not make every small
  difference infinite). A host stands out on a metric when its difference from the peer
  median is at least `mad_k` (5) noise units, at least the metric's minimum absolute difference
  (50 W of mean GPU power, 15 points of utilization, 5 retransmits/s of TCP, 1/s of RDMA, 5
  points of memory pressure), and -- for rates -- at least 5 x the peer median;
- GPU power, utilization and memory activity count in both directions (a host at lower power
  while the others wait in collectives, or the reverse); retransmit rates and memory
  pressure only upwards;
- at least 3 hosts with data, else nothing is compared (with two, either could be the odd one);
- at most a quarter of the hosts (at least one) may stand out on one metric: more is a slide
  of the job, not of a host, and that metric names nobody ("a uniform slide is not a host
  problem");
- with a baseline (the same per-host means before the slide), a host is named only if it also
  moved away from its own baseline by the minimum difference: a host that was always a little
  different is not what slid.

The verdict names the hosts that stand out (most metrics first) with one line of evidence per
metric, or none.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from jobdiagd.model.plotdata import HostSeries

MAD_SCALE = 1.4826  # MAD -> standard deviation of a normal distribution
# The fact a TGS page carries the verdict under (the page's lead shows it).
SLOW_HOST_FACT = "slow host"
# The live window (rule SLOW-5): the steps the TGS detector found slow, at least this many
# scrape intervals (the judge needs `min_points` samples per host), at most this long.
MIN_WINDOW_INTERVALS = 4
MAX_WINDOW_S = 1800.0


@dataclass(frozen=True)
class RoleRule:
    """How one metric is compared: direction, the smallest difference that counts, noise floor."""

    label: str
    unit: str
    direction: Literal["both", "high"]
    min_abs: float
    noise_floor: float
    min_rel: float = 0.0  # the difference must also be >= min_rel x |peer median|


# Defaults (rule SLOW-2); rates reuse the playbooks' floors (tsdb.settings.Thresholds:
# tcp_rate_min_per_s 5, rdma_retx_min_per_s 1, rate_outlier_factor 5 -> min_rel 4).
RULES: Mapping[str, RoleRule] = {
    "power": RoleRule("GPU power", "W", "both", min_abs=50.0, noise_floor=10.0, min_rel=0.10),
    "util": RoleRule("GPU utilization", "%", "both", min_abs=15.0, noise_floor=3.0),
    "mem_activity": RoleRule("GPU memory activity", "%", "both", min_abs=15.0, noise_floor=3.0),
    "rdma_retrans": RoleRule("RDMA retransmits", "/s", "high", min_abs=1.0, noise_floor=0.2, min_rel=4.0),
    "tcp_retrans": RoleRule("TCP retransmits", "/s", "high", min_abs=5.0, noise_floor=1.0, min_rel=4.0),
    "mem_pressure": RoleRule("memory pressure", "%", "high", min_abs=5.0, noise_floor=1.0),
}


@dataclass(frozen=True)
class SlowHostPolicy:
    mad_k: float = 5.0  # tsdb.settings.Thresholds.peer_mad_k
    min_hosts: int = 3
    max_outlier_fraction: float = 0.25
    min_points: int = 2
    rules: Mapping[str, RoleRule] = field(default_factory=lambda: dict(RULES))


@dataclass(frozen=True)
class Deviation:
    role: str
    host: str
    value: float
    peer_median: float
    direction: Literal["high", "low"]
    baseline: float | None = None

    def text(self, rule: RoleRule) -> str:
        was = f", {_fmt(self.baseline, rule.unit)} before the slide" if self.baseline is not None else ""
        return (
            f"{rule.label} {_fmt(self.value, rule.unit)} vs the other hosts' median "
            f"{_fmt(self.peer_median, rule.unit)} ({self.direction}er{was})"
        )


@dataclass(frozen=True)
class SlowHostVerdict:
    """`hosts`: the hosts that stand out (empty: none does); `evidence`: host -> lines."""

    hosts: tuple[str, ...]
    deviations: tuple[Deviation, ...]
    evidence: Mapping[str, tuple[str, ...]]
    summary: str
    compared: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _fmt(v: float, unit: str) -> str:
    if unit == "/s":
        return f"{v:.3g}{unit}"
    return f"{v:.0f}{unit}" if abs(v) >= 10 else f"{v:.1f}{unit}"


def host_means(series: Sequence[HostSeries], start: float, end: float, min_points: int) -> dict[str, float]:
    """Mean of each host's finite samples inside [start, end]; hosts with too few are left out."""
    out: dict[str, float] = {}
    for hs in series:
        vals = [v for t, v in zip(hs.times, hs.mean, strict=False) if start <= t <= end and math.isfinite(v)]
        if len(vals) >= min_points:
            out[hs.host] = statistics.fmean(vals)
    return out


def _stands_out(v: float, peers: list[float], rule: RoleRule, k: float) -> tuple[bool, float]:
    med = statistics.median(peers)
    mad = statistics.median(abs(x - med) for x in peers)
    noise = max(MAD_SCALE * mad, rule.noise_floor)
    dev = v - med
    if rule.direction == "high" and dev <= 0:
        return False, med
    big = abs(dev) >= rule.min_abs and abs(dev) >= rule.min_rel * abs(med) and abs(dev) >= k * noise
    return big, med


def _role_deviations(
    role: str, means: Mapping[str, float], baseline: Mapping[str, float] | None, policy: SlowHostPolicy
) -> tuple[list[Deviation], str | None]:
    rule = policy.rules[role]
    if len(means) < policy.min_hosts:
        return (
            [],
            f"{rule.label}: {len(means)} host(s) with data, fewer than {policy.min_hosts}: not compared",
        )
    found: list[Deviation] = []
    for host, v in means.items():
        peers = [x for h, x in means.items() if h != host]
        big, med = _stands_out(v, peers, rule, policy.mad_k)
        if not big:
            continue
        direction: Literal["high", "low"] = "high" if v > med else "low"
        base = baseline.get(host) if baseline else None
        if base is not None and not (
            abs(v - base) >= rule.min_abs and (v - base > 0) == (direction == "high")
        ):
            continue  # it was already this different before the slide
        found.append(Deviation(role, host, v, med, direction, base))
    cap = max(1, math.floor(policy.max_outlier_fraction * len(means)))
    if len(found) > cap:
        return [], f"{rule.label}: {len(found)} of {len(means)} hosts differ: the job, not one host"
    return found, None


def judge_slow_hosts(
    series: Mapping[str, Sequence[HostSeries]],
    *,
    start: float,
    end: float,
    baseline: Mapping[str, Mapping[str, float]] | None = None,
    policy: SlowHostPolicy | None = None,
) -> SlowHostVerdict:
    """Compare every host with its peers over [start, end] on each metric of `series` (role ->
    per-host series; unknown roles are ignored). `baseline`: role -> host -> mean before."""
    policy = policy or SlowHostPolicy()
    deviations: list[Deviation] = []
    notes: list[str] = []
    compared: list[str] = []
    hosts_seen: set[str] = set()
    for role in policy.rules:
        if role not in series:
            continue
        means = host_means(series[role], start, end, policy.min_points)
        hosts_seen |= set(means)
        found, note = _role_deviations(role, means, (baseline or {}).get(role), policy)
        if note:
            notes.append(note)
        else:
            compared.append(role)
        deviations.extend(found)
    return _verdict(deviations, compared, notes, len(hosts_seen), policy)


def _verdict(
    deviations: list[Deviation], compared: list[str], notes: list[str], n_hosts: int, policy: SlowHostPolicy
) -> SlowHostVerdict:
    by_host: dict[str, list[Deviation]] = {}
    for d in deviations:
        by_host.setdefault(d.host, []).append(d)
    order = sorted(by_host, key=lambda h: (-len(by_host[h]), h))
    evidence = {h: tuple(d.text(policy.rules[d.role]) for d in by_host[h]) for h in order}
    labels = ", ".join(policy.rules[r].label for r in compared) or "no metric"
    if not order:
        summary = (
            f"no host stands out among {n_hosts} on {labels}: the slide is the job's, not one host's"
            if compared
            else "no host compared (too few hosts with data)"
        )
    else:
        parts = [f"{h} ({'; '.join(evidence[h])})" for h in order]
        summary = f"{'host' if len(order) == 1 else 'hosts'} standing out of {n_hosts}: " + ", ".join(parts)
    return SlowHostVerdict(tuple(order), tuple(deviations), evidence, summary, tuple(compared), tuple(notes))


def not_compared(why: str) -> SlowHostVerdict:
    """The verdict when no comparison ran: no host named, and why (the page still goes out)."""
    return SlowHostVerdict((), (), {}, f"no host compared: {why}")


def slide_window(
    arrivals: Mapping[int, float],
    last_step: int | None,
    now: float,
    *,
    recent_steps: int,
    scrape_interval_s: float,
) -> tuple[float, float]:
    """The window a live slide is compared over (rule SLOW-5): from when the first of the last
    `recent_steps` steps was read (the TGS detector's recent window, the steps it found slow)
    until `now`, widened to `MIN_WINDOW_INTERVALS` scrape intervals and cut to `MAX_WINDOW_S`."""
    start = now
    if last_step is not None:
        first = arrivals.get(last_step - recent_steps)
        if first is None and arrivals:
            first = min(arrivals.values())
        if first is not None:
            start = first
    start = min(start, now - MIN_WINDOW_INTERVALS * scrape_interval_s)
    return max(start, now - MAX_WINDOW_S), now
