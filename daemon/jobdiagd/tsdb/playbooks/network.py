"""Playbook 6: network health -- TCP retransmits, RDMA retransmits/ACK timeouts/CNP/retry exhaustion, port state, correlation with step time.

Window: the full job as stored in the TSDB ("Queries (range over full job or recent window)"), not only
steady training: a link that goes down during a hang after the last step must be seen ("Port state 0 ->
RDMA link is down").

Every warning reaches the root cause and the verdict:
- RDMA port down -> hardware-fault (physical layer); RDMA retransmit/ACK-timeout/retry-exhaustion outliers
  -> rdma-degradation.
- "TCP retransmits only, no RDMA errors -> IP/TCP path issue": the TCP outlier hosts are anomalous. The
  fixed set has no TCP verdict; rdma-degradation (network degradation) is the closest and the root cause
  states that the RDMA fabric is clean.
- "Congestion notifications (CNP) across many nodes -> switch-level congestion": verdict rdma-degradation
  (RDMA fabric congestion). The nodes are not anomalous: a cluster-wide signal is no node fault, and
  excluding them would not help.
- TCP lifetime-total outliers (cumulative since boot, orders of magnitude above peers) are reported, not
  excluded (finding only; no verdict, not anomalous) -- as in the hang playbook.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jobdiagd.tsdb.align import Timeline
from jobdiagd.tsdb.playbooks.base import (
    EvidenceTable,
    Finding,
    PlaybookEnv,
    PlaybookResult,
    Verdict,
    by_host,
    dur,
    fmt,
    host_of,
    host_regex,
    outliers_high,
    present,
)
from jobdiagd.tsdb.settings import Thresholds

RDMA_COUNTERS = {
    "retx": "hw_rdma_tx_retx_pkts_total",
    "ack": "hw_rdma_tx_ack_timeout_total",
    "cnp_rx": "hw_rdma_rx_cnp_pkts_total",
    "cnp_tx": "hw_rdma_tx_cnp_pkts_total",
    "ecn": "hw_rdma_rx_ecn_pkts_total",
    "excd": "hw_rdma_req_tx_retry_excd_err_total",
    "cqe": "hw_rdma_req_rx_cqe_err_total",
}


def pearson(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 5 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


DeviceKey = tuple[str, str]  # (host, "device:port")


@dataclass(frozen=True)
class NetworkSeries:
    """What the network judgement reads from the TSDB over the whole job (fetch step)."""

    start: float
    end: float
    tcp: Mapping[str, float] = field(default_factory=dict)  # host -> TCP retransmits in the window
    tcp_total: Mapping[str, float] = field(default_factory=dict)  # host -> lifetime total
    retx: Mapping[DeviceKey, float] = field(default_factory=dict)  # RDMA retransmitted packets
    ack: Mapping[DeviceKey, float] = field(default_factory=dict)  # ACK timeouts
    excd: Mapping[DeviceKey, float] = field(default_factory=dict)  # retry exhaustion
    cqe: Mapping[DeviceKey, float] = field(default_factory=dict)
    cnp: Mapping[DeviceKey, float] = field(default_factory=dict)  # congestion notifications, rx + tx
    ports: Mapping[DeviceKey, float] = field(default_factory=dict)  # lowest port state
    neterr: Mapping[str, float] = field(default_factory=dict)
    netdrop: Mapping[str, float] = field(default_factory=dict)

    @property
    def w(self) -> float:
        return max(self.end - self.start, 60.0)


@dataclass(frozen=True)
class NetworkHealthJudgement:
    """The verdict of the network playbook and its evidence (judge step; no prose)."""

    verdict: Verdict
    anomalous: list[str]
    down: list[str]  # "host|device:port" with the link down (PB-HW-2)
    bad_dev: list[str]  # retransmit / ACK-timeout outliers (PB-NET-2)
    excd_dev: list[str]  # retry exhaustion (PB-NET-2)
    tcp_out: list[str]  # TCP retransmit outlier hosts (PB-NET-3)
    tcp_life_out: list[str]  # lifetime-total outliers, reported only (PB-HANG-6)
    cnp_hosts: list[str]
    congestion: bool  # CNP on at least half the hosts and at least 2 (PB-NET-4)
    hosts: list[str]

    @property
    def rdma_clean(self) -> bool:
        return not (self.bad_dev or self.excd_dev or self.down)


def judge_network_health(data: NetworkSeries, hosts: Sequence[str], th: Thresholds) -> NetworkHealthJudgement:
    """Pure: the job's network counters in, the verdict and its evidence out (rules PB-NET-2..4, PB-HW-2)."""
    w = data.w
    floor = th.rdma_retx_min_per_s * w
    bad_dev = sorted(
        set(
            outliers_high(
                {f"{h}|{d}": v for (h, d), v in data.retx.items()}, factor=th.rate_outlier_factor, floor=floor
            )
        )
        | {f"{h}|{d}" for (h, d), v in data.ack.items() if v > max(1.0, 0.01 * w)}
    )
    excd_dev = sorted(f"{h}|{d}" for (h, d), v in data.excd.items() if v > 0)
    down = sorted(f"{h}|{d}" for (h, d), v in data.ports.items() if v < 1)
    cnp_hosts = sorted({h for (h, _), v in data.cnp.items() if v > floor})
    tcp_out = outliers_high(data.tcp, factor=th.rate_outlier_factor, floor=max(100.0, 0.5 * w))
    tcp_life_out = [
        h for h in outliers_high(data.tcp_total, factor=th.tcp_outlier_factor, floor=1e5) if h not in tcp_out
    ]
    host_list = sorted(set(hosts))
    congestion = bool(cnp_hosts) and len(cnp_hosts) >= max(2, len(host_list) // 2)
    verdict = Verdict.HEALTHY
    anomalous: set[str] = set()
    if down:
        verdict = Verdict.HARDWARE_FAULT
        anomalous |= {k.split("|")[0] for k in down}
    if bad_dev or excd_dev:
        anomalous |= {k.split("|")[0] for k in bad_dev + excd_dev}
    anomalous |= set(tcp_out)
    rdma_clean = not (bad_dev or excd_dev or down)
    if verdict == Verdict.HEALTHY and (bad_dev or excd_dev or (tcp_out and rdma_clean) or congestion):
        verdict = Verdict.RDMA_DEGRADATION
    return NetworkHealthJudgement(
        verdict=verdict,
        anomalous=sorted(anomalous),
        down=down,
        bad_dev=bad_dev,
        excd_dev=excd_dev,
        tcp_out=tcp_out,
        tcp_life_out=tcp_life_out,
        cnp_hosts=cnp_hosts,
        congestion=congestion,
        hosts=host_list,
    )


@dataclass(frozen=True)
class RetransmitCorrelation:
    """Do retransmit bursts of the anomalous hosts line up with slow steps (rule PB-NET-5)?"""

    mean_rate: float  # retransmits per second over the window
    rho: float | None  # Pearson r of step time vs rate; None: the rate is steady (or too few steps)


def judge_correlation(
    rate: Sequence[tuple[float, float]], timeline: Timeline, start: float, end: float
) -> RetransmitCorrelation:
    """Pure: the anomalous hosts' retransmit rate series against each step's step time."""
    xs, ys = [], []
    for p in timeline.points:
        if p.step_time is None or not (start <= p.t <= end):
            continue
        j = min(range(len(rate)), key=lambda i: abs(rate[i][0] - p.t))
        xs.append(rate[j][1])
        ys.append(p.step_time)
    mean_rate = sum(v for _, v in rate) / len(rate)
    rates = [v for _, v in rate]
    steady_rate = mean_rate > 0 and statistics.pstdev(rates) / mean_rate < 0.2
    return RetransmitCorrelation(mean_rate, None if steady_rate else pearson(xs, ys))


# --- fetch ---------------------------------------------------------------------------------------------


async def fetch_network(env: PlaybookEnv) -> NetworkSeries:
    """The whole job's TCP, Ethernet and RDMA counters per host/device (rule PB-NET-1)."""
    start, end = env.disc.min_time, env.disc.max_time
    W = dur(max(end - start, 60.0))
    arms: dict[str, str] = {
        "tcp": f"increase(hw_tcp_retransmits_total[{W}])",
        "tcp_total": f"last_over_time(hw_tcp_retransmits_total[{W}])",
        "port": f"min by (host, device, port) (min_over_time(hw_rdma_port_state[{W}]))",
        "neterr": f"sum by (host) (increase(hw_net_rx_errors_total[{W}])) + sum by (host) (increase(hw_net_tx_errors_total[{W}]))",
        "netdrop": f"sum by (host) (increase(hw_net_rx_drop_total[{W}])) + sum by (host) (increase(hw_net_tx_drop_total[{W}]))",
    }
    needs = {
        "tcp": "hw_tcp_retransmits_total",
        "tcp_total": "hw_tcp_retransmits_total",
        "port": "hw_rdma_port_state",
        "neterr": "hw_net_rx_errors_total",
        "netdrop": "hw_net_rx_drop_total",
    }
    for k, name in RDMA_COUNTERS.items():
        arms[k] = f"sum by (host, device, port) (increase({name}[{W}]))"
        needs[k] = name
    r = await env.arms(present(env, arms, needs), end)

    def per_dev(arm: str) -> dict[DeviceKey, float]:
        return {
            (host_of(s.labels), f"{s.labels.get('device', '?')}:{s.labels.get('port', '?')}"): s.v
            for s in r.get(arm, [])
            if not math.isnan(s.v)
        }

    cnp = dict(per_dev("cnp_rx"))
    for dk, v in per_dev("cnp_tx").items():
        cnp[dk] = cnp.get(dk, 0.0) + v
    return NetworkSeries(
        start=start,
        end=end,
        tcp=by_host(r.get("tcp", [])),
        tcp_total=by_host(r.get("tcp_total", [])),
        retx=per_dev("retx"),
        ack=per_dev("ack"),
        excd=per_dev("excd"),
        cqe=per_dev("cqe"),
        cnp=cnp,
        ports=per_dev("port"),
        neterr=by_host(r.get("neterr", [])),
        netdrop=by_host(r.get("netdrop", [])),
    )


async def fetch_correlation(
    env: PlaybookEnv, data: NetworkSeries, anomalous: Sequence[str]
) -> RetransmitCorrelation | None:
    """Read the anomalous hosts' retransmit rate and correlate it with the step times (rule PB-NET-5)."""
    tl = env.disc.timeline
    if not (anomalous and not tl.empty and env.disc.has("hw_rdma_tx_retx_pkts_total")):
        return None
    sel = host_regex(anomalous)
    step = max(30.0, data.w / 300)
    series = await env.client.query_range(
        f'sum(rate(hw_rdma_tx_retx_pkts_total{{host=~"{sel}"}}[2m]))', data.start, data.end, step
    )
    if not series:
        return None
    return judge_correlation(series[0].points, tl, data.start, data.end)


# --- render --------------------------------------------------------------------------------------------


def network_tables(data: NetworkSeries, j: NetworkHealthJudgement) -> list[EvidenceTable]:
    w, W = data.w, dur(data.w)
    dev_table = EvidenceTable(
        "RDMA counters per device over the window",
        f"sum by (host, device, port) (increase(hw_rdma_*_total[{W}]))",
        (
            "Host",
            "device:port",
            "retx pkts",
            "retx/s",
            "ACK timeouts",
            "CNP",
            "retry exhausted",
            "CQE errors",
            "port state (min)",
            "interpretation",
        ),
    )
    for dk in sorted(set(data.retx) | set(data.ports)):
        key = f"{dk[0]}|{dk[1]}"
        interp = []
        if key in j.bad_dev:
            interp.append("retransmit/ACK-timeout outlier: bad cable, port or switch")
        if key in j.excd_dev:
            interp.append("retry exhaustion: hard link failure")
        if key in j.down:
            interp.append("link DOWN")
        dev_table.rows.append(
            (
                dk[0],
                dk[1],
                fmt(data.retx.get(dk), digits=0),
                fmt(data.retx.get(dk, 0) / w if w else None, digits=2),
                fmt(data.ack.get(dk), digits=0),
                fmt(data.cnp.get(dk), digits=0),
                fmt(data.excd.get(dk), digits=0),
                fmt(data.cqe.get(dk), digits=0),
                fmt(data.ports.get(dk), digits=0),
                "; ".join(interp),
            )
        )
    host_table = EvidenceTable(
        "TCP and Ethernet per host",
        f"increase(hw_tcp_retransmits_total[{W}]), hw_net_*_{{errors,drop}}_total",
        ("Host", "TCP retx", "TCP retx/s", "TCP retx lifetime", "net errors", "net drops"),
        [
            (
                h,
                fmt(data.tcp.get(h), digits=0),
                fmt(data.tcp.get(h, 0) / w if w else None, digits=2),
                fmt(data.tcp_total.get(h), digits=0),
                fmt(data.neterr.get(h), digits=0),
                fmt(data.netdrop.get(h), digits=0),
            )
            for h in j.hosts
        ],
    )
    return [dev_table, host_table]


def network_root(
    data: NetworkSeries, j: NetworkHealthJudgement
) -> tuple[list[str], list[str], list[Finding]]:
    """(root cause parts, chain, findings of TCP, congestion and lifetime outliers) in rule order."""
    chain: list[str] = []
    root_parts: list[str] = []
    findings: list[Finding] = []
    rdma_clean, tcp_out, tcp = j.rdma_clean, j.tcp_out, data.tcp
    if j.down:
        root_parts.append(
            "RDMA link down on " + ", ".join(k.replace("|", " ") for k in j.down) + " (physical layer)"
        )
    if j.bad_dev or j.excd_dev:
        root_parts.append(
            "RDMA retransmits/ACK timeouts concentrated on "
            + ", ".join(k.replace("|", " ") for k in sorted(set(j.bad_dev + j.excd_dev)))
        )
        chain = [
            "degraded RDMA link",
            "retransmits slow every collective",
            "step time up / TGS down on all nodes",
        ]
    if tcp_out:
        if rdma_clean:
            chain = chain or [
                f"TCP retransmits on {', '.join(tcp_out)}",
                "IP/TCP path issue (NFS, coordinator gRPC, host network)",
                "slower host communication / stalls",
            ]
        root_parts.append(
            f"TCP retransmit outliers on {', '.join(f'{h} ({fmt(tcp.get(h), digits=0)})' for h in tcp_out)} "
            f"vs median {fmt(statistics.median(tcp.values()), digits=0)}"
            + (
                " with no RDMA errors: IP/TCP path issue (NFS, coordinator gRPC), not the RCCL data path"
                " (rdma-degradation is the closest verdict of the fixed set)"
                if rdma_clean
                else ""
            )
        )
        findings.append(
            Finding(
                "TCP retransmits" + (" only" if rdma_clean else ""),
                f"TCP retransmit outliers on {', '.join(tcp_out)}"
                + (
                    " with no RDMA errors: IP/TCP path (NFS, coordinator gRPC), not the RCCL data path."
                    if rdma_clean
                    else "."
                ),
                "warning",
                tuple(tcp_out),
            )
        )
    if j.congestion:
        n = f"{len(j.cnp_hosts)}/{len(j.hosts)} nodes"
        root_parts.append(
            f"Congestion notifications (CNP) on {n}: switch-level congestion "
            "(ECN tuning / traffic engineering), not a node fault"
        )
        chain = chain or ["switch-level congestion", "CNP rate limiting", "slower collectives on all nodes"]
        findings.append(
            Finding(
                "Congestion",
                f"Congestion notifications on {n}: switch-level congestion (ECN tuning / traffic engineering).",
                "warning",
                tuple(j.cnp_hosts),
            )
        )
    if j.tcp_life_out:
        findings.append(
            Finding(
                "TCP retransmit lifetime-total outliers (reported, not excluded)",
                f"{', '.join(f'{h} ({fmt(data.tcp_total.get(h), digits=0)})' for h in j.tcp_life_out)} carry lifetime "
                f"totals orders of magnitude above peers (median {fmt(statistics.median(data.tcp_total.values()), digits=0)}). "
                "These are cumulative since boot, not from this job: reported, not excluded, unless problems "
                "recur on them.",
                "info",
                tuple(j.tcp_life_out),
            )
        )
    return root_parts, chain, findings


def network_next_steps(j: NetworkHealthJudgement) -> list[str]:
    if j.verdict == Verdict.RDMA_DEGRADATION and j.rdma_clean:
        return (
            [f"Check the host network / NFS / gRPC path of {', '.join(j.tcp_out)} (NIC errors, switch port)."]
            if j.tcp_out
            else []
        ) + (
            ["Switch-level congestion: review ECN/CNP tuning and traffic placement with the network team."]
            if j.congestion
            else []
        )
    if j.verdict == Verdict.RDMA_DEGRADATION:
        return [
            f"Resubmit with --exclude={','.join(j.anomalous)} (RDMA retry exhaustion first, then sustained retransmits).",
            "Report the device/port to the network team (cable/switch port).",
        ]
    if j.verdict == Verdict.HARDWARE_FAULT:
        return ["Check cable and switch port of the down link; drain the node."]
    return []


def render_network(
    data: NetworkSeries, j: NetworkHealthJudgement, corr: RetransmitCorrelation | None
) -> PlaybookResult:
    """The report of a judged network: device and host tables, root cause, chain, correlation, next steps."""
    root_parts, chain, findings = network_root(data, j)
    if corr is not None:
        corr_txt = (
            f"retransmit rate {corr.mean_rate:.1f}/s throughout the window (constant degradation: every step pays it)"
            if corr.rho is None
            else f"Pearson r={corr.rho:.2f} between per-step step time and retransmit rate"
        )
        findings.append(Finding("Correlation with training", corr_txt, "info"))
    root = (
        "; ".join(root_parts) + "."
        if root_parts
        else "Network healthy: no RDMA retransmit/ACK-timeout outliers, links up, TCP retransmits at background level"
        + (
            f" (lifetime-total outliers {', '.join(j.tcp_life_out)} reported, not excluded)."
            if j.tcp_life_out
            else "."
        )
    )
    findings.insert(
        0,
        Finding(
            "Network health",
            root,
            "critical" if j.verdict != Verdict.HEALTHY else "info",
            tuple(j.anomalous),
            network_tables(data, j),
        ),
    )
    return PlaybookResult(
        playbook=NetworkPlaybook.name,
        analysis_type=NetworkPlaybook.analysis_type,
        verdict=j.verdict,
        window=(data.start, data.end),
        findings=findings,
        anomalous_hosts=j.anomalous,
        root_cause=root,
        chain=chain,
        next_steps=network_next_steps(j),
    )


class NetworkPlaybook:
    name = "network-health"
    analysis_type = "network-health"

    async def run(self, env: PlaybookEnv) -> PlaybookResult:
        data = await fetch_network(env)
        judged = judge_network_health(data, env.disc.hosts, env.th)
        corr = await fetch_correlation(env, data, judged.anomalous)
        return render_network(data, judged, corr)
