"""Playbook 1: RCCL/NCCL hang -- busy-wait vs dead node vs network partition, partial-init GPU patterns, TCP/RDMA.

Trigger (runbook "identify the trigger"): RDMA error counters (retry exhaustion, ACK timeouts, retransmit
bursts) that start on specific hosts in the minutes before the last step are the earliest anomaly of a
hang: those hosts are named anomalous and the link failure is put at the root of the chain. The verdict
stays rccl-busy-wait-hang when every node keeps reporting and the GPUs spin: the mechanism is the busy-wait
deadlock, the RDMA link failure is what triggered it. network-partition is kept for hosts that lost
connectivity altogether (scrape gaps, RDMA port down), where the remedy is the same node exclusion but the
evidence differs.

"Init-phase" is said only when no training step completed (neither the TSDB timeline nor the log has one);
a partial-GPU stuck pattern after completed steps is described as a mid-training deadlock after step N.

No hang: when the job completed, reached its configured final step, or (with no failure in triage) never
stalled beyond the stall budget before the end of the data, the time after the last step is normal idle
time after a finish, not a hang window. The playbook then says so with verdict healthy and does not read
those idle metrics as a crash (runbook: "risk misinterpreting metrics ... post-hang idle metrics").
"""

from __future__ import annotations

from collections import Counter

from jobdiagd.tsdb.playbooks.base import (
    EvidenceTable,
    Finding,
    PlaybookEnv,
    PlaybookResult,
    by_gpu,
    by_host,
    dur,
    fmt,
    gpu_state,
    hang_window,
    host_of,
    iso,
    median,
    no_stall_reason,
    not_applicable,
    outliers_high,
    per_gpu_rows,
    present,
)

RDMA_ERRORS = (
    ("hw_rdma_req_tx_retry_excd_err_total", "retry exhaustion"),
    ("hw_rdma_tx_ack_timeout_total", "ACK timeouts"),
    ("hw_rdma_tx_retx_pkts_total", "retransmits"),
)


async def rdma_trigger(env: PlaybookEnv, last: float, end: float) -> tuple[list[str], str, float | None]:
    """Hosts whose RDMA error counters started rising in the lead-up to the last step (before the hang).

    Returns (hosts, description, onset). Retry exhaustion or ACK timeouts count on their own; retransmits
    only as an outlier against the other hosts' rate in the same window.
    """
    names = [n for n, _ in RDMA_ERRORS if env.disc.has(n)]
    if not names:
        return [], "", None
    st = env.disc.timeline.median_step_time() or env.ctx.step_time_s or 30.0
    lo = max(env.disc.min_time, last - max(300.0, 10 * st))
    sel = '{__name__=~"' + "|".join(names) + '"}'
    # The lead-up and the first minutes of the hang are enough to see when the errors began.
    end = min(end, last + max(600.0, 10 * st))
    series = await env.client.query_range(f"sum by (__name__, host, device) ({sel})", lo, end, 10.0)
    # (host, device) -> name -> (onset, increase within [lo, end])
    per: dict[tuple[str, str], dict[str, tuple[float | None, float]]] = {}
    for x in series:
        pts = [(t, v) for t, v in x.points if v == v]
        if len(pts) < 2:
            continue
        onset = next((t for (_, a), (t, b) in zip(pts, pts[1:], strict=False) if b > a), None)
        key = (host_of(x.labels), x.labels.get("device", "?"))
        per.setdefault(key, {})[x.labels.get("__name__", "")] = (onset, max(0.0, pts[-1][1] - pts[0][1]))
    retx = {f"{h}\t{dev}": v.get("hw_rdma_tx_retx_pkts_total", (None, 0.0))[1] for (h, dev), v in per.items()}
    retx_out = {
        tuple(k.split("\t", 1))
        for k in outliers_high(
            retx, factor=env.th.rate_outlier_factor, floor=(end - lo) * env.th.rdma_retx_min_per_s
        )
    }
    hard_names = [n for n in names if n != "hw_rdma_tx_retx_pkts_total"]
    bad: dict[tuple[str, str], tuple[float | None, list[str]]] = {}
    for (h, dev), m in per.items():
        hard = [m[n] for n in hard_names if n in m and m[n][1] > 0]
        if not hard and (h, dev) not in retx_out:
            continue
        parts = [f"{label} +{m[n][1]:.0f}" for n, label in RDMA_ERRORS if n in m and m[n][1] > 0]
        # A busy retransmit counter has no onset of its own; only the error counters date the event.
        onsets = [o for o, _ in hard if o is not None]
        bad[(h, dev)] = (min(onsets) if onsets else None, parts)
    # Only a start before the hang (up to one step time after the last step) makes it the trigger.
    trig = {k: v for k, v in bad.items() if v[0] is None or v[0] <= last + st}
    if not trig:
        return [], "", None
    onset = min((v[0] for v in trig.values() if v[0] is not None), default=None)

    def when(o: float | None) -> str:
        if o is None:
            return " (elevated throughout the lead-up)"
        rel = f"{last - o:.0f} s before" if o <= last else f"{o - last:.0f} s after"
        return f", rising from {iso(o)} ({rel} the last step)"

    desc = "; ".join(
        f"{h} {dev}: {', '.join(parts)} by {iso(end)}{when(o)}"
        for (h, dev), (o, parts) in sorted(trig.items())
    )
    return sorted({h for h, _ in trig}), desc, onset


def no_step_completed(env: PlaybookEnv) -> bool:
    """Init phase: neither the TSDB timeline nor the log has a completed training step."""
    tl = env.disc.timeline
    if not tl.empty and tl.last_step is not None:
        return False
    return env.ctx.last_step is None and not env.ctx.steps


class HangPlaybook:
    name = "hang"
    analysis_type = "hang"

    async def run(self, env: PlaybookEnv) -> PlaybookResult:
        last, start, end = hang_window(env)
        why = no_stall_reason(env)
        if why is not None:
            root = (
                f"No hang: {why}. The GPUs' idle state after {iso(last)} is the normal end of the job, "
                "not a stuck collective or a dead node."
            )
            return not_applicable(
                self.name,
                self.analysis_type,
                env,
                "Hang mechanism",
                root,
                "No hang to diagnose; use --playbook training-stability for throughput questions.",
            )
        w = end - start
        # GPU state is judged on the last <= 10 minutes: an init-phase hang window may still contain compilation.
        ws = min(w, 600.0)
        before = max(60.0, min(600.0, last - env.disc.min_time))
        off = dur(end - last)
        full = dur(end - env.disc.min_time + 60)
        arms = present(
            env,
            {
                "util": f"avg_over_time(ray_node_gpus_utilization[{dur(ws)}])",
                "power": f"avg_over_time(hw_gpu_power_watts[{dur(ws)}])",
                "power_before": f"avg_over_time(hw_gpu_power_watts[{dur(before)}] offset {off})",
                "samples": f"count_over_time(hw_procs_running[{dur(w)}])",
                "samples_before": f"count_over_time(hw_procs_running[{dur(before)}] offset {off})",
                # Sample time of each host's newest scrape (absent once it is older than the lookback).
                "last_seen": "timestamp(hw_procs_running)",
                "tcp_hang": f"increase(hw_tcp_retransmits_total[{dur(w)}])",
                "tcp_total": f"last_over_time(hw_tcp_retransmits_total[{full}])",
                "rdma_retx": f"sum by (host) (increase(hw_rdma_tx_retx_pkts_total[{dur(w)}]))",
                "rdma_ack": f"sum by (host) (increase(hw_rdma_tx_ack_timeout_total[{dur(w)}]))",
                "rdma_excd": f"sum by (host) (increase(hw_rdma_req_tx_retry_excd_err_total[{dur(w)}]))",
                "port_min": f"min by (host) (min_over_time(hw_rdma_port_state[{dur(w)}]))",
            },
            {
                "util": "ray_node_gpus_utilization",
                "power": "hw_gpu_power_watts",
                "power_before": "hw_gpu_power_watts",
                "samples": "hw_procs_running",
                "samples_before": "hw_procs_running",
                "last_seen": "hw_procs_running",
                "tcp_hang": "hw_tcp_retransmits_total",
                "tcp_total": "hw_tcp_retransmits_total",
                "rdma_retx": "hw_rdma_tx_retx_pkts_total",
                "rdma_ack": "hw_rdma_tx_ack_timeout_total",
                "rdma_excd": "hw_rdma_req_tx_retry_excd_err_total",
                "port_min": "hw_rdma_port_state",
            },
        )
        r = await env.arms(arms, end)
        util, power, pbefore = (
            by_gpu(r.get("util", [])),
            by_gpu(r.get("power", [])),
            by_gpu(r.get("power_before", [])),
        )
        samples, sbefore, last_seen = (
            by_host(r.get("samples", [])),
            by_host(r.get("samples_before", [])),
            by_host(r.get("last_seen", [])),
        )
        tcp_hang, tcp_total = by_host(r.get("tcp_hang", [])), by_host(r.get("tcp_total", []))
        rdma_retx, rdma_ack, rdma_excd = (
            by_host(r.get("rdma_retx", [])),
            by_host(r.get("rdma_ack", [])),
            by_host(r.get("rdma_excd", [])),
        )
        port_min = by_host(r.get("port_min", []))

        prof, th = env.profile, env.th
        hosts = sorted(set(env.disc.hosts) | set(sbefore) | {h for h, _ in power} | {h for h, _ in pbefore})
        states = {k: gpu_state(util.get(k), power.get(k), prof, th) for k in set(util) | set(power)}
        interval = (before / sbefore[max(sbefore, key=lambda h: sbefore[h])]) if sbefore else 10.0
        # Compare with the best-reporting peer, not with w/interval: the TSDB may start after the hang began.
        expected = max(samples.values(), default=w / max(interval, 1.0))

        dead: list[str] = []
        partitioned: list[str] = []
        host_state: dict[str, str] = {}
        for h in hosts:
            n = samples.get(h, 0.0)
            seen = last_seen.get(h)
            gstates = Counter(s for (hh, _), s in states.items() if hh == h)
            if "samples" in arms and (n == 0 or seen is None or seen < end - max(3 * interval, 30.0)):
                host_state[h] = "stopped reporting" + (f" at {iso(seen)}" if seen else "")
                dead.append(h)
            elif n < 0.7 * expected:
                host_state[h] = f"scrape gaps ({int(n)}/{int(expected)} samples)"
                partitioned.append(h)
            elif gstates and gstates.get("idle", 0) == sum(gstates.values()):
                host_state[h] = "all GPUs idle (process gone)"
            else:
                host_state[h] = ", ".join(f"{c} {s}" for s, c in gstates.most_common()) or "no GPU data"

        total = max(1, len(states))
        counts = Counter(states.values())
        busy_frac = counts.get("busy-wait", 0) / total
        train_frac = counts.get("training", 0) / total
        idle_hosts = [h for h in hosts if host_state.get(h, "").startswith("all GPUs idle")]
        active_hosts = [h for h in hosts if h not in dead and h not in idle_hosts]

        # Partial-init pattern: which GPU indices spin on each host; hosts off the majority set are suspects.
        busy_sets = {
            h: frozenset(g for (hh, g), s in states.items() if hh == h and s in ("busy-wait", "busy"))
            for h in active_hosts
        }
        majority: frozenset[str] = (
            Counter(busy_sets.values()).most_common(1)[0][0] if busy_sets else frozenset()
        )
        # Init-phase pattern: on most nodes only a subset of GPUs entered the stuck collective.
        partial = 0 < len(majority) < max(1, env.disc.gpus_per_host)
        outlier_hosts = sorted(h for h, st in busy_sets.items() if st != majority) if majority else []

        tcp_rate_out = outliers_high(tcp_hang, factor=th.rate_outlier_factor, floor=100.0)
        tcp_life_out = outliers_high(tcp_total, factor=th.tcp_outlier_factor, floor=1e5)
        rdma_bad = sorted(
            h
            for h in hosts
            if rdma_ack.get(h, 0) > 0
            or rdma_excd.get(h, 0) > 0
            or h in outliers_high(rdma_retx, factor=th.rate_outlier_factor, floor=w * th.rdma_retx_min_per_s)
        )
        port_down = sorted(h for h, v in port_min.items() if v < 1)

        trig_hosts, trig_desc, trig_onset = await rdma_trigger(env, last, end)
        findings: list[Finding] = []
        host_table = EvidenceTable(
            "Per-host state during the hang window",
            f"avg_over_time(... [{dur(w)}]) at {iso(end)}",
            (
                "Host",
                "GPU states",
                "mean util %",
                "mean power W",
                "power before hang W",
                "hw samples",
                "TCP retx (hang)",
                "TCP retx lifetime",
                "RDMA retx (hang)",
            ),
        )
        for h in hosts:
            hu = [v for (hh, _), v in util.items() if hh == h]
            hp = [v for (hh, _), v in power.items() if hh == h]
            hb = [v for (hh, _), v in pbefore.items() if hh == h]
            host_table.rows.append(
                (
                    h,
                    host_state.get(h, ""),
                    fmt(sum(hu) / len(hu) if hu else None),
                    fmt(sum(hp) / len(hp) if hp else None),
                    fmt(sum(hb) / len(hb) if hb else None),
                    f"{int(samples.get(h, 0))}/{int(expected)}",
                    fmt(tcp_hang.get(h), digits=0),
                    fmt(tcp_total.get(h), digits=0),
                    fmt(rdma_retx.get(h), digits=0),
                )
            )
        interesting = set(dead) | set(outlier_hosts) | set(idle_hosts) | set(partitioned)
        gpu_keys = [
            k
            for k in states
            if len(states) <= 64 or k[0] in interesting or k[0] == (hosts[0] if hosts else "")
        ]
        gpu_table = EvidenceTable(
            "Per-GPU utilization and power during the hang"
            + (
                ""
                if len(gpu_keys) == len(states)
                else f" (first host and anomalous hosts; {len(states)} GPUs in total)"
            ),
            f"avg_over_time(ray_node_gpus_utilization[{dur(ws)}]), avg_over_time(hw_gpu_power_watts[{dur(ws)}]) at {iso(end)}",
            ("Host", "GPU", "util %", "power W", "power before W", "state"),
            per_gpu_rows(gpu_keys, [util, power, pbefore], ["", "", ""], states),
        )

        verdict = "healthy"
        anomalous: list[str] = []
        root = ""
        chain: list[str] = []
        window_txt = f"{iso(start)} to {iso(end)} ({int(w)} s after last step {env.disc.timeline.last_step} at {iso(last)})"
        if dead and active_hosts:
            verdict = "dead-node"
            anomalous = sorted(dead)
            root = f"{', '.join(dead)} stopped reporting metrics; the remaining nodes wait on it in the next collective."
            chain = [
                f"{', '.join(dead)} died",
                "surviving ranks block in the collective",
                f"{counts.get('busy-wait', 0)} GPUs spin at busy-wait power",
                "training steps stop",
            ]
        elif idle_hosts and busy_frac > 0:
            verdict = "dead-node"
            anomalous = sorted(idle_hosts)
            root = f"Training processes on {', '.join(idle_hosts)} were gone (0% utilization, idle power) while the other nodes spun in a collective."
            chain = [
                f"process death on {', '.join(idle_hosts)}",
                "peers block in the collective",
                "busy-wait on the other nodes",
            ]
        elif partitioned or port_down:
            verdict = "network-partition"
            anomalous = sorted(set(partitioned) | set(port_down))
            root = f"{', '.join(anomalous)} lost connectivity during the hang (scrape gaps / RDMA port down) while GPUs kept spinning."
            chain = ["network partition", "collective cannot complete", "busy-wait hang"]
        elif busy_frac >= 0.5 or (partial and busy_frac > 0):
            verdict = "rccl-busy-wait-hang"
            anomalous = outlier_hosts
            if partial:
                tl = env.disc.timeline
                phase = (
                    "Init-phase RCCL deadlock (no training step completed)"
                    if no_step_completed(env)
                    else f"Mid-training RCCL deadlock after step {tl.last_step if tl.last_step is not None else env.ctx.last_step} (not init-phase: steps had completed)"
                )
                root = (
                    f"{phase}: on most nodes GPUs {{{', '.join(sorted(majority, key=int))}}} spin in the stuck collective while the rest have not entered it."
                    + (
                        f" Nodes with a different stuck-GPU set: {', '.join(outlier_hosts)} -- likely where the deadlock originated."
                        if outlier_hosts
                        else ""
                    )
                )
            else:
                root = (
                    f"RCCL/NCCL busy-wait deadlock: {counts.get('busy-wait', 0)}/{total} GPUs at >= {th.busy_util_pct:.0f}% utilization "
                    f"but {prof.busy_wait_power_min_w:.0f}-{prof.busy_wait_power_max_w:.0f} W (idle-level) power; no node died."
                    + (
                        f" GPUs not spinning on {', '.join(outlier_hosts)} (off the majority pattern): investigate those nodes."
                        if outlier_hosts
                        else ""
                    )
                )
            chain = [
                "collective deadlock (RCCL/NCCL)",
                "GPUs spin in the polling loop (100% util, low watts)",
                "no step progress",
            ]
            if trig_hosts:
                hard = "retry exhaustion" in trig_desc
                anomalous = sorted(set(anomalous) | set(trig_hosts))
                root = (
                    f"Trigger: RDMA link errors on {', '.join(trig_hosts)} before the hang ({trig_desc})"
                    + (
                        " -- retry exhaustion means packets were permanently lost: a hard link failure, not congestion"
                        if hard
                        else ""
                    )
                    + ". The collective using that link could not complete and every rank blocked in it. "
                    + root
                )
                chain = [
                    f"RDMA link failure on {', '.join(trig_hosts)} ({trig_desc})",
                    "collective on that link cannot complete",
                    *chain,
                ]
        elif train_frac >= 0.5:
            verdict = "healthy"
            root = "GPUs were at training power during the supposed hang: training continued. The Slurm log may be truncated (RAY=1); check ray_logs/<head>/worker*.out."
        elif counts and counts.get("idle", 0) == total:
            verdict = "dead-node"
            anomalous = list(hosts)
            root = "All GPUs idle: the training processes were gone on every node (crash without a log signature?)."
        findings.append(
            Finding(
                "Hang mechanism",
                root or "No hang signature in the GPU metrics.",
                "critical" if verdict != "healthy" else "info",
                tuple(anomalous),
                [host_table, gpu_table],
            )
        )

        if tcp_rate_out:
            findings.append(
                Finding(
                    "TCP retransmits during the hang",
                    f"Retransmit increase during the hang is an outlier on {', '.join(tcp_rate_out)} -- an active network issue.",
                    "warning",
                    tuple(tcp_rate_out),
                )
            )
        if tcp_life_out:
            findings.append(
                Finding(
                    "TCP retransmit lifetime-total outliers (reported, not excluded)",
                    f"{', '.join(tcp_life_out)} carry lifetime totals orders of magnitude above peers "
                    f"(median {fmt(median(tcp_total.values()), digits=0)}). These are cumulative since boot: note them, "
                    "but do not exclude the nodes unless the hang recurs on them.",
                    "info",
                    tuple(tcp_life_out),
                )
            )
        if rdma_bad or port_down:
            findings.append(
                Finding(
                    "RDMA counters around the hang",
                    f"RDMA errors on {', '.join(sorted(set(rdma_bad) | set(port_down)))} (retransmits/ACK timeouts/retry exhaustion/port down).",
                    "warning",
                    tuple(sorted(set(rdma_bad) | set(port_down))),
                )
            )
        elif "rdma_retx" in r:
            findings.append(
                Finding(
                    "RDMA counters around the hang",
                    "No RDMA retransmit bursts, ACK timeouts or link-downs during the hang.",
                    "info",
                )
            )

        init_phase = no_step_completed(env)
        nxt = [
            ("Kill the job (scancel) and retry" if env.ctx.live else "Retry")
            + " on the same nodes first; "
            + ("init-phase hangs are often transient." if init_phase else "RCCL hangs are often transient."),
            "Only if the hang recurs on the same nodes: --exclude the outlier nodes, add _env_NCCL_DEBUG=INFO.",
        ]
        if trig_hosts and verdict == "rccl-busy-wait-hang":
            nxt = [
                f"Check the RDMA link of {', '.join(trig_hosts)} (cable, switch port, `ibstat`/`rdma link`); run --playbook network-health.",
                f"Resubmit with --exclude={','.join(trig_hosts)} until the link is repaired.",
            ]
        if verdict == "dead-node":
            nxt = [
                f"Inspect {', '.join(anomalous)}: dmesg (OOM kill, GPU errors), run --playbook hardware and --playbook oom.",
                "Resubmit excluding the node if it shows hardware errors.",
            ]
        corr = ""
        if env.ctx.primary_class in ("hang", "cancelled", "train-timeout"):
            corr = f"Triage classified this as {env.ctx.primary_class}. TSDB {'confirms' if verdict == 'rccl-busy-wait-hang' else 'refines'}: {verdict}."
        return PlaybookResult(
            self.name,
            self.analysis_type,
            verdict,
            (start, end),
            findings,
            anomalous,
            root,
            chain,
            nxt,
            corr + (f" Window: {window_txt}." if corr else ""),
        )
