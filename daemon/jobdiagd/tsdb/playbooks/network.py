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


class NetworkPlaybook:
    name = "network-health"
    analysis_type = "network-health"

    async def run(self, env: PlaybookEnv) -> PlaybookResult:
        start, end = env.disc.min_time, env.disc.max_time
        w = max(end - start, 60.0)
        W = dur(w)
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
        th = env.th

        def per_dev(arm: str) -> dict[tuple[str, str], float]:
            return {
                (host_of(s.labels), f"{s.labels.get('device', '?')}:{s.labels.get('port', '?')}"): s.v
                for s in r.get(arm, [])
                if not math.isnan(s.v)
            }

        tcp = by_host(r.get("tcp", []))
        tcp_total = by_host(r.get("tcp_total", []))
        retx, ack, excd, cqe = per_dev("retx"), per_dev("ack"), per_dev("excd"), per_dev("cqe")
        cnp = dict(per_dev("cnp_rx"))
        for dk, v in per_dev("cnp_tx").items():
            cnp[dk] = cnp.get(dk, 0.0) + v
        ports = per_dev("port")
        neterr, netdrop = by_host(r.get("neterr", [])), by_host(r.get("netdrop", []))

        floor = th.rdma_retx_min_per_s * w
        bad_dev = sorted(
            set(
                outliers_high(
                    {f"{h}|{d}": v for (h, d), v in retx.items()}, factor=th.rate_outlier_factor, floor=floor
                )
            )
            | {f"{h}|{d}" for (h, d), v in ack.items() if v > max(1.0, 0.01 * w)}
        )
        excd_dev = sorted(f"{h}|{d}" for (h, d), v in excd.items() if v > 0)
        down = sorted(f"{h}|{d}" for (h, d), v in ports.items() if v < 1)
        cnp_hosts = sorted({h for (h, _), v in cnp.items() if v > floor})
        tcp_out = outliers_high(tcp, factor=th.rate_outlier_factor, floor=max(100.0, 0.5 * w))
        tcp_life_out = [
            h for h in outliers_high(tcp_total, factor=th.tcp_outlier_factor, floor=1e5) if h not in tcp_out
        ]
        hosts = sorted(set(env.disc.hosts))

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
        for dk in sorted(set(retx) | set(ports)):
            key = f"{dk[0]}|{dk[1]}"
            interp = []
            if key in bad_dev:
                interp.append("retransmit/ACK-timeout outlier: bad cable, port or switch")
            if key in excd_dev:
                interp.append("retry exhaustion: hard link failure")
            if key in down:
                interp.append("link DOWN")
            dev_table.rows.append(
                (
                    dk[0],
                    dk[1],
                    fmt(retx.get(dk), digits=0),
                    fmt(retx.get(dk, 0) / w if w else None, digits=2),
                    fmt(ack.get(dk), digits=0),
                    fmt(cnp.get(dk), digits=0),
                    fmt(excd.get(dk), digits=0),
                    fmt(cqe.get(dk), digits=0),
                    fmt(ports.get(dk), digits=0),
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
                    fmt(tcp.get(h), digits=0),
                    fmt(tcp.get(h, 0) / w if w else None, digits=2),
                    fmt(tcp_total.get(h), digits=0),
                    fmt(neterr.get(h), digits=0),
                    fmt(netdrop.get(h), digits=0),
                )
                for h in hosts
            ],
        )
        findings: list[Finding] = []
        verdict = "healthy"
        anomalous: set[str] = set()
        chain: list[str] = []
        root_parts: list[str] = []
        if down:
            verdict = "hardware-fault"
            anomalous |= {k.split("|")[0] for k in down}
            root_parts.append(
                "RDMA link down on " + ", ".join(k.replace("|", " ") for k in down) + " (physical layer)"
            )
        if bad_dev or excd_dev:
            verdict = "rdma-degradation" if verdict == "healthy" else verdict
            anomalous |= {k.split("|")[0] for k in bad_dev + excd_dev}
            root_parts.append(
                "RDMA retransmits/ACK timeouts concentrated on "
                + ", ".join(k.replace("|", " ") for k in sorted(set(bad_dev + excd_dev)))
            )
            chain = [
                "degraded RDMA link",
                "retransmits slow every collective",
                "step time up / TGS down on all nodes",
            ]
        rdma_clean = not (bad_dev or excd_dev or down)
        if tcp_out:
            anomalous |= set(tcp_out)
            if rdma_clean:
                verdict = "rdma-degradation" if verdict == "healthy" else verdict
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
        congestion = bool(cnp_hosts) and len(cnp_hosts) >= max(2, len(hosts) // 2)
        if congestion:
            verdict = "rdma-degradation" if verdict == "healthy" else verdict
            root_parts.append(
                f"Congestion notifications (CNP) on {len(cnp_hosts)}/{len(hosts)} nodes: switch-level congestion "
                "(ECN tuning / traffic engineering), not a node fault"
            )
            chain = chain or [
                "switch-level congestion",
                "CNP rate limiting",
                "slower collectives on all nodes",
            ]
            findings.append(
                Finding(
                    "Congestion",
                    f"Congestion notifications on {len(cnp_hosts)}/{len(hosts)} nodes: switch-level congestion (ECN tuning / traffic engineering).",
                    "warning",
                    tuple(cnp_hosts),
                )
            )
        if tcp_life_out:
            findings.append(
                Finding(
                    "TCP retransmit lifetime-total outliers (reported, not excluded)",
                    f"{', '.join(f'{h} ({fmt(tcp_total.get(h), digits=0)})' for h in tcp_life_out)} carry lifetime "
                    f"totals orders of magnitude above peers (median {fmt(statistics.median(tcp_total.values()), digits=0)}). "
                    "These are cumulative since boot, not from this job: reported, not excluded, unless problems "
                    "recur on them.",
                    "info",
                    tuple(tcp_life_out),
                )
            )

        # Phase correlation: do retransmit bursts line up with slow steps?
        corr_txt = ""
        tl = env.disc.timeline
        if anomalous and not tl.empty and env.disc.has("hw_rdma_tx_retx_pkts_total"):
            sel = host_regex(anomalous)
            step = max(30.0, w / 300)
            series = await env.client.query_range(
                f'sum(rate(hw_rdma_tx_retx_pkts_total{{host=~"{sel}"}}[2m]))', start, end, step
            )
            if series:
                pts = series[0].points
                xs, ys = [], []
                for p in tl.points:
                    if p.step_time is None or not (start <= p.t <= end):
                        continue
                    j = min(range(len(pts)), key=lambda i: abs(pts[i][0] - p.t))
                    xs.append(pts[j][1])
                    ys.append(p.step_time)
                mean_rate = sum(v for _, v in pts) / len(pts)
                rates = [v for _, v in pts]
                steady_rate = mean_rate > 0 and statistics.pstdev(rates) / mean_rate < 0.2
                rho = None if steady_rate else pearson(xs, ys)
                corr_txt = (
                    f"retransmit rate {mean_rate:.1f}/s throughout the window (constant degradation: every step pays it)"
                    if rho is None
                    else f"Pearson r={rho:.2f} between per-step step time and retransmit rate"
                )
                findings.append(Finding("Correlation with training", corr_txt, "info"))
        root = (
            "; ".join(root_parts) + "."
            if root_parts
            else "Network healthy: no RDMA retransmit/ACK-timeout outliers, links up, TCP retransmits at background level"
            + (
                f" (lifetime-total outliers {', '.join(tcp_life_out)} reported, not excluded)."
                if tcp_life_out
                else "."
            )
        )
        findings.insert(
            0,
            Finding(
                "Network health",
                root,
                "critical" if verdict != "healthy" else "info",
                tuple(sorted(anomalous)),
                [dev_table, host_table],
            ),
        )
        nxt = []
        if verdict == "rdma-degradation" and rdma_clean:
            nxt = (
                [
                    f"Check the host network / NFS / gRPC path of {', '.join(tcp_out)} (NIC errors, switch port)."
                ]
                if tcp_out
                else []
            ) + (
                [
                    "Switch-level congestion: review ECN/CNP tuning and traffic placement with the network team."
                ]
                if congestion
                else []
            )
        elif verdict == "rdma-degradation":
            nxt = [
                f"Resubmit with --exclude={','.join(sorted(anomalous))} (RDMA retry exhaustion first, then sustained retransmits).",
                "Report the device/port to the network team (cable/switch port).",
            ]
        elif verdict == "hardware-fault":
            nxt = ["Check cable and switch port of the down link; drain the node."]
        return PlaybookResult(
            playbook=self.name,
            analysis_type=self.analysis_type,
            verdict=Verdict(verdict),
            window=(start, end),
            findings=findings,
            anomalous_hosts=sorted(anomalous),
            root_cause=root,
            chain=chain,
            next_steps=nxt,
        )
