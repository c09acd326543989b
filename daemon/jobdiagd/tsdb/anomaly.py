"""Earliest anomaly: around an incident, sweep every metric family (hw_*, ray_*, tb_*) and order deviations in time.

Network error counters (RDMA retransmits / ACK timeouts / errors, TCP retransmits, NIC errors) are judged
against the job's own baseline AND the other hosts (jobdiagd.tsdb.patterns): a host's rise below the
family's minimum absolute rate is background and is not a deviation; a rise above it that the other hosts
show alike (it does not stand out) stays in the sweep marked `peers_alike` -- a cluster-wide event, never
one host's trigger.

A host whose GPU user processes drop to zero gets the same head start as a host that stopped reporting:
the process was gone somewhere in the scrape interval before the zero shows, while its peers' power drops
(the symptom) at once.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from jobdiagd.tsdb.align import Timeline, checkpoint_steps
from jobdiagd.tsdb.client import PromClient, Series, multi_arm, regex_union, split_arms_series
from jobdiagd.tsdb.discovery import Discovery
from jobdiagd.tsdb.patterns import (
    RateWindow,
    StandOutRule,
    burst_floor,
    burst_onset,
    counter_rate,
    standouts,
)
from jobdiagd.tsdb.playbooks.base import host_of, host_regex, iso, linear_fit
from jobdiagd.tsdb.settings import Thresholds

# Families that move *because* something else happened (runbook pitfall 4: symptoms are not root causes).
SYMPTOM_PREFIXES = (
    "hw_gpu_power_watts",
    "hw_gpu_clock_mhz",
    "ray_node_gpus_utilization",
    "ray_node_cpu_utilization",
    "tb_perf_",
    "tb_step",
    "hw_rdma_tx_pkts_total",
    "hw_rdma_rx_pkts_total",
    "hw_rdma_tx_bytes_total",
    "hw_rdma_rx_bytes_total",
    "hw_net_rx_bytes_total",
    "hw_net_tx_bytes_total",
    "hw_context_switches_total",
    "hw_gpu_vram_used_bytes",
    "hw_scrape_duration_seconds",
)


def is_symptom(name: str) -> bool:
    return name.startswith(SYMPTOM_PREFIXES)


class Shift(StrEnum):
    """How a metric left its baseline (`Deviation.kind`)."""

    UP = "up"
    DOWN = "down"
    ABSENT = "absent"  # the series stopped reporting
    STALLED = "stalled"  # training steps stopped advancing
    RAMP = "ramp"  # a steady ramp already under way in the baseline


@dataclass(frozen=True)
class Deviation:
    family: str
    host: str
    onset: float
    baseline: float
    value: float
    kind: Shift
    threshold: float = 0.0
    counter: bool = False
    peers_alike: bool = False  # a network counter rise the other hosts show alike: not this host's trigger

    @property
    def symptom(self) -> bool:
        # A GPU that cools down follows its power (symptom); one that heats up may be the cause.
        if self.family == "hw_gpu_temperature_celsius":
            return self.kind == Shift.DOWN
        return is_symptom(self.family)

    def describe(self) -> str:
        if self.kind == Shift.ABSENT:
            return f"{self.family} on {self.host}: stopped reporting at {iso(self.onset)}"
        if self.kind == Shift.STALLED:
            return f"training steps stopped advancing at {iso(self.onset)} (last step {self.value:.0f})"
        if self.kind == Shift.RAMP:
            return f"{self.family} on {self.host}: steady ramp from {self.baseline:.4g} to {self.value:.4g}, under way by {iso(self.onset)}"
        alike = " (the other hosts alike)" if self.peers_alike else ""
        return f"{self.family} on {self.host}: {self.kind} from {self.baseline:.4g} to {self.value:.4g} at {iso(self.onset)}{alike}"

    @property
    def process_gone(self) -> bool:
        return self.family == "hw_gpu_user_processes" and (
            self.kind == Shift.ABSENT or (self.kind == Shift.DOWN and self.value <= 0)
        )


@dataclass
class AnomalyReport:
    incident: float
    window: tuple[float, float]
    deviations: list[Deviation] = field(default_factory=list)
    families_checked: int = 0

    @property
    def root(self) -> Deviation | None:
        return self.deviations[0] if self.deviations else None

    def chain(self) -> list[str]:
        """root cause -> intermediate effects -> observed symptoms, one entry per family (earliest host)."""
        if not self.deviations:
            return []
        seen: set[str] = set()
        firsts: list[Deviation] = []
        for d in self.deviations:
            if d.family not in seen:
                seen.add(d.family)
                firsts.append(d)
        root, rest = firsts[0], firsts[1:]
        effects = [d for d in rest if not d.symptom][:4]
        symptoms = [d for d in rest if d.symptom][:4]
        if root.symptom:
            cause = next((d for d in rest if not d.symptom), None)
            note = "no cause-type family deviated before the symptoms (consistent with a pure collective deadlock or a software event)"
            out = [f"root cause: {note}; first symptom: {root.describe()}"]
            if cause is not None:
                out.append(f"first non-symptom change (after the symptoms): {cause.describe()}")
            out += [f"symptom: {d.describe()}" for d in rest if d.symptom][:4]
            return out
        out = [f"root cause: {root.describe()}"]
        out += [f"effect: {d.describe()}" for d in effects]
        out += [f"symptom: {d.describe()}" for d in symptoms]
        return out


# Counters where a single increment is significant on its own (no persistence needed).
RARE_EVENT = ("_ue_", "fatal", "nonfatal", "oom_kills", "dmesg", "retry_excd", "cqe_err")
UP_ONLY = (
    "retx",
    "retransmit",
    "err",
    "drop",
    "timeout",
    "oom",
    "_ue_",
    "_ce_",
    "fatal",
    "correctable",
    "cnp",
    "ecn",
    "overflow",
    "reset",
)


NETWORK_PREFIXES = ("hw_rdma_", "hw_tcp_", "hw_net_")


def is_network_error(name: str) -> bool:
    return name.startswith(NETWORK_PREFIXES) and name.endswith("_total") and any(u in name for u in UP_ONLY)


def judge_network_deviations(
    devs: Sequence[Deviation],
    series: Sequence[Series],
    split: float,
    start: float,
    end: float,
    th: Thresholds,
) -> list[Deviation]:
    """Drop background network-counter deviations; mark those that do not stand out from the other hosts.

    Rates compare each host's counter after `split` (lead-up and incident) with the same host before it.
    A kept deviation is dated by its burst (patterns.burst_onset at the family's floor: a sparse
    background increment before the burst is not its onset), and `threshold` carries that floor (per s).
    """
    rates: dict[str, dict[str, RateWindow]] = {}
    points: dict[tuple[str, str], Sequence[tuple[float, float]]] = {}
    for s in series:
        name = s.labels.get("__name__", "")
        if not is_network_error(name):
            continue
        during = counter_rate(s.points, split, end)
        if during is not None:
            host = host_of(s.labels)
            rates.setdefault(name, {})[host] = RateWindow(counter_rate(s.points, start, split), during)
            points[(name, host)] = s.points
    out: list[Deviation] = []
    cache: dict[str, list[str]] = {}
    for d in devs:
        fam = rates.get(d.family)
        if fam is None or d.host not in fam:
            out.append(d)
            continue
        rule = StandOutRule.for_family(d.family, th)
        rw = fam[d.host]
        if rw.during < rule.min_rate:
            continue  # background counts: not an anomaly at all
        if d.family not in cache:
            cache[d.family] = standouts(fam, rule)
        floor = burst_floor(rw, rule)
        onset = burst_onset(points[(d.family, d.host)], split, floor) or d.onset
        out.append(replace(d, onset=onset, threshold=floor, peers_alike=d.host not in cache[d.family]))
    return out


def detect(
    points: Sequence[tuple[float, float]],
    split: float,
    *,
    k: float,
    counter: bool,
    up_only: bool = False,
    rare: bool = False,
    trend: bool = True,
    ignore: Callable[[float], bool] | None = None,
) -> tuple[float, float, float, Shift, float] | None:
    """First persistent deviation after `split` relative to the robust baseline before it.

    `ignore` masks timestamps (checkpoint saves) that are expected to look anomalous.
    """
    if counter:
        diffs = []
        for (_, a), (t, b) in zip(points, points[1:], strict=False):
            diffs.append((t, max(0.0, b - a)))
        points = diffs
    skip = ignore or (lambda _t: False)
    base = [v for t, v in points if t <= split and not math.isnan(v) and not skip(t)]
    after = [(t, v) for t, v in points if t > split and not math.isnan(v) and not skip(t)]
    if len(base) < 3 or not after:
        return None
    if trend and not counter and len(base) >= 5:
        # A steady ramp already under way in the baseline (a leak) is itself the anomaly.
        bpts = [(t, v) for t, v in points if t <= split and not math.isnan(v) and not skip(t)]
        slope, r2 = linear_fit(bpts)
        growth = slope * (bpts[-1][0] - bpts[0][0])
        if r2 >= 0.9 and abs(growth) >= 0.2 * abs(statistics.median(base)) and abs(growth) > 0:
            return bpts[0][0], bpts[0][1], bpts[-1][1], Shift.RAMP, 0.0
    med = statistics.median(base)
    mad = statistics.median(abs(v - med) for v in base) * 1.4826
    floor = 0.5 if counter else 1e-6
    thr = max(k * mad, 0.25 * abs(med), floor)
    for i, (t, v) in enumerate(after):
        if abs(v - med) > thr and not (up_only and v < med):
            nxt = after[i + 1 : i + 4]
            hits = sum(1 for _, x in nxt if abs(x - med) > thr)
            persistent = rare or (bool(nxt) and hits >= min(2, len(nxt)))
            if persistent:
                return t, med, v, Shift.UP if v > med else Shift.DOWN, thr
    return None


def sweep_window(disc: Discovery, incident: float, th: Thresholds) -> tuple[float, float]:
    """[start, end] of the sweep: steady training before the incident (at least 300 s) and a little after."""
    tl = disc.timeline
    # The baseline must be steady training: start after warmup, never in the init/compile phase.
    train_from = tl.time_of_step((tl.first_step or 0) + th.warmup_steps) if not tl.empty else None
    start = max(disc.min_time, incident - th.anomaly_baseline_s, train_from or disc.min_time)
    if incident - start < 300:
        start = max(disc.min_time, incident - 300)
    return start, min(disc.max_time, incident + th.anomaly_after_s)


def checkpoint_windows(tl: Timeline, checkpoint_period: int | None, step: float) -> list[tuple[float, float]]:
    """Time spans of checkpoint saves, expected to look anomalous (masked from the sweep)."""
    windows: list[tuple[float, float]] = []
    if not tl.empty:
        st = tl.median_step_time() or 30.0
        for ck in sorted(checkpoint_steps((p.step for p in tl.points), checkpoint_period, False)):
            t_s = tl.time_of_step(ck)
            if t_s is not None:
                secs = next((p.step_time for p in tl.points if p.step == ck and p.step_time), st)
                windows.append((t_s - secs - step, t_s + 2 * st + step))
    return windows


def stale_stamps(stamps: Sequence[Series], split: float, step: float) -> dict[str, float]:
    """host -> when its newest sample fell behind the evaluation time (after the split), i.e. stopped."""
    out: dict[str, float] = {}
    for s in stamps:
        host = host_of(s.labels)
        for t, v in s.points:
            if t > split and t - v > 3 * 10.0 + step:
                out[host] = v + 10.0
                break
    return out


def series_deviations(
    series: Sequence[Series],
    split: float,
    step: float,
    th: Thresholds,
    in_ckpt: Callable[[float], bool],
    absent_hosts: dict[str, float],
) -> list[Deviation]:
    """Pure: each hw_*/ray_* series' first persistent deviation after the split; a series that ends
    early (while its family goes on) adds its host to `absent_hosts`."""
    last_by_name: dict[str, float] = {}
    for s in series:
        name = s.labels.get("__name__", "")
        if s.points:
            last_by_name[name] = max(last_by_name.get(name, 0.0), s.points[-1][0])
    devs: list[Deviation] = []
    for s in series:
        name = s.labels.get("__name__", "")
        host = host_of(s.labels)
        pts = [(t, v) for t, v in s.points]
        if not pts:
            continue
        if (
            pts[-1][0] < last_by_name.get(name, 0.0) - 2 * step
            and pts[-1][0] > split
            and host not in absent_hosts
        ):
            absent_hosts[host] = pts[-1][0] + step
        is_counter = name.endswith("_total")
        found = detect(
            pts,
            split,
            k=th.anomaly_k,
            counter=is_counter,
            up_only=any(u in name for u in UP_ONLY),
            rare=any(r in name for r in RARE_EVENT),
            ignore=in_ckpt,
        )
        if found:
            t, base, val, kind, thr = found
            devs.append(Deviation(name, host, t, base, val, kind, thr, is_counter))
    return devs


def training_deviations(
    tl: Timeline, start: float, end: float, split: float, th: Thresholds, in_ckpt: Callable[[float], bool]
) -> list[Deviation]:
    """Pure: training stalled before the end, and jumps of the tb_* training metrics after the split."""
    devs: list[Deviation] = []
    if not tl.empty and tl.last_time is not None and tl.last_time < end - 120:
        st = tl.median_step_time() or 30.0
        if tl.last_time + 2 * st <= end:
            devs.append(
                Deviation(
                    "tb_step", "rank0", tl.last_time + 2 * st, 0.0, float(tl.last_step or 0), Shift.STALLED
                )
            )
    pre = [p for p in tl.points if start <= p.t <= end]
    for attr, fam in (
        ("loss", "tb_learning_loss"),
        ("grad_norm", "tb_learning_grad_norm"),
        ("moe_lb_loss", "tb_learning_moe_lb_loss"),
        ("step_time", "tb_perf_step_time_seconds"),
    ):
        pts2 = [(p.t, float(getattr(p, attr))) for p in pre if getattr(p, attr) is not None]
        # Loss and LR trend by design; only jumps count for training metrics.
        found = detect(pts2, split, k=th.anomaly_k, counter=False, trend=False, ignore=in_ckpt)
        if found:
            t, base, val, kind, thr = found
            devs.append(Deviation(fam, "rank0", t, base, val, kind, thr))
    return devs


def earliest_first(devs: list[Deviation]) -> list[Deviation]:
    """Earliest first; on a tie a cause-type family wins over a symptom. A host (or its process) that
    vanished was already gone somewhere in the two scrape intervals before its absence shows, so it
    gets that much head start over symptoms seen on its peers at the same time."""
    return sorted(
        devs,
        key=lambda d: (
            d.onset - (2 * 10.0 if d.kind == Shift.ABSENT or d.process_gone else 0.0),
            d.symptom,
            d.family,
            d.host,
        ),
    )


async def earliest_anomaly(
    client: PromClient,
    disc: Discovery,
    incident: float,
    th: Thresholds,
    *,
    checkpoint_period: int | None = None,
) -> AnomalyReport:
    tl = disc.timeline
    start, end = sweep_window(disc, incident, th)
    if end - start < 120:
        return AnomalyReport(incident, (start, end))
    # A multiple of the 10 s node_hw scrape so counter deltas always span whole scrape intervals.
    step = max(20.0, 10.0 * math.ceil((end - start) / 240 / 10.0))
    windows = checkpoint_windows(tl, checkpoint_period, step)

    def in_ckpt(t: float) -> bool:
        return any(a <= t <= b for a, b in windows)

    # Baseline: the first 60% of the pre-incident part; the incident lead-up is searched.
    split = start + 0.6 * max(0.0, incident - start)
    # Counters summed per host (deltas are taken client-side), gauges averaged per host.
    series = await client.query_range(
        'sum by (__name__, host) ({__name__=~"(hw|ray)_.+_total"})', start, end, step
    )
    series += await client.query_range(
        'avg by (__name__, host) ({__name__=~"(hw|ray)_.+", __name__!~".+_total"})', start, end, step
    )
    rep = AnomalyReport(incident, (start, end))
    # Sample timestamps (not evaluation times): a host whose last scrape falls behind has stopped
    # reporting, even while the lookback window still shows its stale values; so has a training process
    # whose GPU process series stops while the host still reports.
    # Only evaluated after the split (where an absence counts), on the same grid as the sweep.
    after_split = start + math.ceil((split - start) / step) * step
    stamps = split_arms_series(
        await client.query_range(
            multi_arm(
                {
                    "host": "max by (host) (timestamp(hw_procs_running))",
                    "procs": "max by (host) (timestamp(hw_gpu_user_processes))",
                }
            ),
            min(after_split, end),
            end,
            step,
        )
    )
    absent_hosts = stale_stamps(stamps.get("host", []), split, step)
    procs_absent = stale_stamps(stamps.get("procs", []), split, step)
    devs = series_deviations(series, split, step, th, in_ckpt, absent_hosts)
    devs += [Deviation("up (scrapes)", host, t, 1.0, 0.0, Shift.ABSENT) for host, t in absent_hosts.items()]
    devs += [
        Deviation("hw_gpu_user_processes", host, t, 1.0, 0.0, Shift.ABSENT)
        for host, t in procs_absent.items()
        if host not in absent_hosts
    ]
    devs += training_deviations(tl, start, end, split, th, in_ckpt)
    devs = judge_network_deviations(devs, series, split, start, end, th)
    rep.deviations = earliest_first(await refine(client, devs, step))
    rep.families_checked = len({s.labels.get("__name__", "") for s in series} | {"tb_*"})
    return rep


async def refine(
    client: PromClient, devs: list[Deviation], step: float, max_candidates: int = 8
) -> list[Deviation]:
    """Sharpen the onsets that compete for "first" with raw samples (the range query only resolves `step`)."""
    if not devs:
        return devs
    first = min(d.onset for d in devs)
    # Counters are only sharpened when idle in the baseline (any increment is the event), or -- network
    # error counters -- by their burst (a sustained rate at the floor judge_network_deviations set);
    # a rate change of another busy counter cannot be read off two raw samples.
    cands = [
        d
        for d in devs
        if d.onset <= first + 2 * step
        and d.kind in (Shift.UP, Shift.DOWN)
        and d.host != "rank0"
        and (not d.counter or is_network_error(d.family) or (d.kind == Shift.UP and d.baseline == 0))
    ][:max_candidates]
    if len(cands) < 2:
        return devs
    names = sorted({d.family for d in cands})
    hosts = sorted({d.host for d in cands})
    hi = max(d.onset for d in cands)
    lo = first - 3 * step
    # A few steps past the latest onset, so a burst can show it is sustained.
    until = hi + 3 * step
    sel = '{__name__=~"' + regex_union(names) + '",host=~"' + host_regex(hosts) + '"}'
    raw = await client.query_matrix(f"{sel}[{max(1, int(until - lo))}s]", until)
    out = []
    for d in devs:
        if d not in cands:
            out.append(d)
            continue
        best: float | None = None
        for s in raw:
            if s.labels.get("__name__") != d.family or host_of(s.labels) != d.host:
                continue
            pts = list(s.points)
            if d.counter and is_network_error(d.family):
                hit_t = burst_onset(pts, lo, d.threshold)
            else:
                hit_t = next(
                    (
                        t
                        for (_, a), (t, b) in zip(pts, pts[1:], strict=False)
                        if t <= hi and ((b > a) if d.counter else abs(b - d.baseline) > d.threshold)
                    ),
                    None,
                )
            if hit_t is not None:
                best = hit_t if best is None else min(best, hit_t)
        out.append(replace(d, onset=best) if best is not None else d)
    return out
