"""Playbook 1: RCCL/NCCL hang -- busy-wait vs dead node vs network partition, partial-init GPU patterns, TCP/RDMA.

Trigger (runbook "identify the trigger"): RDMA error counters (retry exhaustion, ACK timeouts, retransmit
bursts) that start on specific hosts in the minutes before the last step are the earliest anomaly of a
hang: those hosts are named anomalous and the link failure is put at the root of the chain. The verdict
stays rccl-busy-wait-hang when every node keeps reporting and the GPUs spin: the mechanism is the busy-wait
deadlock, the RDMA link failure is what triggered it. network-partition is kept for hosts that lost
connectivity altogether (scrape gaps, RDMA port down), where the remedy is the same node exclusion but the
evidence differs.

Background counts are not a trigger: a (host, device) error rate counts only when it stands out against
the same key before the incident (the hour's baseline before the lead-up) AND the other hosts, above a
minimum absolute rate from settings (jobdiagd.tsdb.patterns.standouts). Single-digit retransmit / ACK
timeout increments that most hosts show are reported as background in the RDMA/TCP finding.

Dead node: a host that stopped reporting, or whose training process is gone while it still reports --
hw_gpu_user_processes 0 on its GPUs, or that series stopped -- with no GPU spinning, while the others
busy-wait. A host whose GPUs all sit at idle utilization below the busy-wait power band (not only below
the idle-power bound: a just-freed GPU can idle a little above it) counts too (runbook: "0% utilization +
idle power on specific nodes while others are active, those nodes likely died"); when it still lists a
GPU process the root cause says so (a rank hung outside the collective, or a defunct process) -- the
verdict stays dead-node, the closest of the fixed set, naming the host the others wait for.

Hang then heartbeat: when triage reports a heartbeat error after the stall (the hang window's GPUs
busy-wait and the error came >= stall_min_s after the last step), the verdict is hang-then-heartbeat --
the hang is primary, the heartbeat timeout only the kill mechanism (triage runbook, hang item 7).

anomalous_hosts are the hosts off the majority pattern of any metric family read in the hang window
(patterns.minority_hosts; ties go to the healthy category, else the first host's):
- reporting: reporting | scrape gaps | silent (hw_procs_running samples and newest scrape);
- GPU activity: the set of GPU indices spinning or computing (>= busy_util_pct or training power);
- power band: the host's median GPU power in training / busy-wait / below busy-wait / idle bands;
- GPU processes: present | gone (hw_gpu_user_processes; only when the TSDB has it);
- RDMA ports: up | down; network rates: stands out | normal (the trigger rule above, over the lead-up
  and the first minutes of the hang; TCP lifetime totals are reported, never a pattern).
A uniform collective hang (every host the same) names no host; a dead node only itself.

"Init-phase" is said only when no training step completed (neither the TSDB timeline nor the log has one);
a partial-GPU stuck pattern after completed steps is described as a mid-training deadlock after step N.

No hang: when the job completed, reached its configured final step, or (with no failure in triage) never
stalled beyond the stall budget before the end of the data, the time after the last step is normal idle
time after a finish, not a hang window. The playbook then says so with verdict healthy and does not read
those idle metrics as a crash (runbook: "risk misinterpreting metrics ... post-hang idle metrics").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from jobdiagd.tsdb.client import Sample
from jobdiagd.tsdb.patterns import (
    RateWindow,
    StandOutRule,
    burst_floor,
    burst_onset,
    counter_increase,
    counter_rate,
    minority_hosts,
    standouts,
)
from jobdiagd.tsdb.playbooks.base import (
    EvidenceTable,
    Finding,
    PlaybookEnv,
    PlaybookResult,
    Verdict,
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
from jobdiagd.tsdb.playbooks.heartbeat import (
    StallJudgement,
    gpu_trend,
    heartbeat_reported,
    heartbeat_times,
    training_end_from_power,
)
from jobdiagd.tsdb.settings import GpuProfile, Thresholds

RDMA_ERRORS = (
    ("hw_rdma_req_tx_retry_excd_err_total", "retry exhaustion"),
    ("hw_rdma_tx_ack_timeout_total", "ACK timeouts"),
    ("hw_rdma_tx_retx_pkts_total", "retransmits"),
)
TCP_RETX = "hw_tcp_retransmits_total"
NETWORK_FAMILIES = (*(n for n, _ in RDMA_ERRORS), TCP_RETX)
LABELS = {**dict(RDMA_ERRORS), TCP_RETX: "TCP retransmits"}

# Categories of the families whose healthy state is known (ties are resolved towards it).
HEALTHY = {
    "reporting": "reporting",
    "GPU processes": "present",
    "RDMA ports": "up",
    "network rates": "normal",
}


# --- pure judgement (plain values in, verdict material out) ------------------------------------------------


@dataclass(frozen=True)
class NetworkWindows:
    """Windows of the network-counter judgement: the host's own baseline [lo, lead), the lead-up and
    first minutes of the hang [lead, hi]; an onset up to `grace` after the last step still precedes the hang."""

    lo: float
    lead: float
    last: float
    grace: float
    hi: float


@dataclass
class NetworkJudgement:
    # (host, device) -> (onset, ["retry exhaustion +N", ...]) of RDMA errors that began before the hang
    triggers: dict[tuple[str, str], tuple[float, list[str]]] = field(default_factory=dict)
    standout_hosts: list[str] = field(default_factory=list)  # error rates that stand out around the hang
    standout_parts: dict[str, list[str]] = field(default_factory=dict)  # host -> ["ACK timeouts 2.0/s", ...]
    background: dict[str, list[str]] = field(default_factory=dict)  # family -> hosts with counts that do not


def judge_network(
    series: Mapping[tuple[str, str, str], Sequence[tuple[float, float]]],
    before: Mapping[tuple[str, str, str], float],
    win: NetworkWindows,
    th: Thresholds,
) -> NetworkJudgement:
    """Which (host, device) error counters stand out around the hang (patterns.standouts), and which of
    those began before it (the trigger).

    series: (family, host, device) -> counter samples over [lead, hi]; before: the same key's rate (per
    second) over its own baseline [lo, lead) (missing: no data then)."""
    out = NetworkJudgement()
    hosts: set[str] = set()
    parts: dict[str, list[str]] = {}
    for fam in NETWORK_FAMILIES:
        rates: dict[tuple[str, str], RateWindow] = {}
        for (name, host, dev), pts in series.items():
            if name != fam:
                continue
            during = counter_rate(pts, win.lead, win.hi)
            if during is not None:
                rates[(host, dev)] = RateWindow(before.get((name, host, dev)), during)
        rule = StandOutRule.for_family(fam, th)
        keys = standouts(rates, rule, host_of=lambda k: k[0])
        loud = {h for h, _ in keys}
        noisy = sorted({h for (h, _), r in rates.items() if r.during > 0 and h not in loud})
        if noisy:
            out.background[fam] = noisy
        for host, dev in keys:
            r = rates[(host, dev)]
            hosts.add(host)
            parts.setdefault(host, []).append(
                f"{LABELS[fam]} {r.during:.3g}/s" + (f" on {dev}" if dev else "")
            )
            if fam == TCP_RETX:
                continue  # the host path, not an RDMA link: reported, not a link trigger
            pts = series[(fam, host, dev)]
            onset = burst_onset(pts, win.lead, burst_floor(r, rule))
            if onset is None or onset > win.last + win.grace:
                continue
            inc = (counter_increase(pts, win.lead, win.hi) or (0.0, 0.0))[0]
            old = out.triggers.get((host, dev))
            label = f"{LABELS[fam]} +{inc:.0f}"
            out.triggers[(host, dev)] = (min(old[0], onset), [*old[1], label]) if old else (onset, [label])
    out.standout_hosts = sorted(hosts)
    out.standout_parts = parts
    # Report the trigger's parts in rule PB-HANG-5's order (retry exhaustion first: a hard link failure).
    order = [label for _, label in RDMA_ERRORS]
    for key, (onset, labels) in out.triggers.items():
        out.triggers[key] = (
            onset,
            sorted(labels, key=lambda x: next(i for i, o in enumerate(order) if x.startswith(o))),
        )
    return out


def gpu_activity(gpu_states: Mapping[str, str]) -> frozenset[str]:
    """GPU indices that spin in a collective or compute (the partial-init pattern compares these sets)."""
    return frozenset(g for g, s in gpu_states.items() if s in ("busy-wait", "busy", "training"))


def power_band(watts: float | None, prof: GpuProfile) -> str:
    if watts is None:
        return "no data"
    if watts >= prof.train_power_min_w * 0.9:
        return "training"
    if watts >= prof.busy_wait_power_min_w * 0.85:
        return "busy-wait" if watts <= prof.busy_wait_power_max_w * 1.15 else "between"
    return "idle" if watts <= prof.idle_power_max_w else "below busy-wait"


def idle_like(gpu_states: Mapping[str, str], host_power: float | None, prof: GpuProfile) -> bool:
    """No GPU of the host spins or computes and its power sits below the busy-wait band: not in the collective."""
    if not gpu_states or gpu_activity(gpu_states):
        return False
    return all(s == "idle" for s in gpu_states.values()) or (
        host_power is not None and host_power < prof.busy_wait_power_min_w * 0.85
    )


def process_states(
    hosts: Sequence[str],
    procs_now: Mapping[str, float],
    procs_before: Mapping[str, float],
    reporting: Mapping[str, str],
) -> dict[str, str]:
    """present | gone | unknown per host, from hw_gpu_user_processes at the end of the hang window.

    gone: the host's GPUs have no user process, or its process series stopped while the host still
    reports and the series existed before the hang (or on its peers)."""
    if not procs_now and not procs_before:
        return {h: "unknown" for h in hosts}
    out: dict[str, str] = {}
    for h in hosts:
        if h in procs_now:
            out[h] = "gone" if procs_now[h] <= 0 else "present"
        elif reporting.get(h) == "reporting" and (h in procs_before or procs_now):
            out[h] = "gone"
        else:
            out[h] = "unknown"
    return out


def left_collective(
    hosts: Sequence[str],
    silent: Sequence[str],
    procs: Mapping[str, str],
    gpu_states: Mapping[str, Mapping[str, str]],
    host_power: Mapping[str, float],
    prof: GpuProfile,
) -> tuple[list[str], list[str]]:
    """(hosts whose GPUs left the collective, those of them that still list a GPU process).

    Left: the process is gone with no GPU spinning, or every GPU idles below the busy-wait band (runbook:
    "those nodes likely died") -- also while a process is still listed: it then hangs outside the
    collective or is defunct. Silent hosts are judged by the reporting family instead."""
    left = [
        h
        for h in hosts
        if h not in silent
        and (
            (procs.get(h) == "gone" and not gpu_activity(gpu_states.get(h, {})))
            or idle_like(gpu_states.get(h, {}), host_power.get(h), prof)
        )
    ]
    return left, [h for h in left if procs.get(h) == "present"]


def host_patterns(
    hosts: Sequence[str],
    reporting: Mapping[str, str],
    gpu_states: Mapping[str, Mapping[str, str]],
    host_power: Mapping[str, float],
    procs: Mapping[str, str],
    port_down: Sequence[str],
    network_standouts: Sequence[str],
    prof: GpuProfile,
) -> dict[str, dict[str, Hashable]]:
    """family -> host -> category: the per-family pattern each host shows during the hang window."""
    fams: dict[str, dict[str, Hashable]] = {
        "reporting": {h: reporting.get(h, "reporting") for h in hosts},
        "GPU activity": {
            h: gpu_activity(gpu_states[h]) if gpu_states.get(h) else "no GPU data" for h in hosts
        },
        "power band": {h: power_band(host_power.get(h), prof) for h in hosts},
        "RDMA ports": {h: "down" if h in port_down else "up" for h in hosts},
        "network rates": {h: "stands out" if h in network_standouts else "normal" for h in hosts},
    }
    if any(v != "unknown" for v in procs.values()):
        fams["GPU processes"] = {h: procs.get(h, "unknown") for h in hosts}
    return fams


def deviations(patterns: Mapping[str, Mapping[str, Hashable]]) -> dict[str, list[str]]:
    """family -> hosts off that family's majority pattern (empty families left out)."""
    out = {fam: minority_hosts(cats, HEALTHY.get(fam)) for fam, cats in patterns.items()}
    return {fam: hosts for fam, hosts in out.items() if hosts}


# --- fetch ---------------------------------------------------------------------------------------------


def baseline_arms(env: PlaybookEnv, win: NetworkWindows, at: float) -> dict[str, str]:
    """Instant arms (evaluated at `at`) for each network counter's increase over the baseline [lo, lead)."""
    if win.lead - win.lo < 60:
        return {}
    return {
        f"base:{fam}": f"sum by (host, device) (increase({fam}[{dur(win.lead - win.lo)}] offset {dur(at - win.lead)}))"
        for fam in NETWORK_FAMILIES
        if env.disc.has(fam)
    }


def baseline_rates(
    arms: Mapping[str, Sequence[Sample]], win: NetworkWindows
) -> dict[tuple[str, str, str], float]:
    out: dict[tuple[str, str, str], float] = {}
    for arm, samples in arms.items():
        if arm.startswith("base:"):
            for x in samples:
                if x.v == x.v:
                    out[(arm[5:], host_of(x.labels), x.labels.get("device", ""))] = x.v / (win.lead - win.lo)
    return out


async def network_series(
    env: PlaybookEnv, lo: float, hi: float
) -> dict[tuple[str, str, str], list[tuple[float, float]]]:
    """RDMA error and TCP retransmit counters per (family, host, device) over [lo, hi]."""
    names = [n for n in NETWORK_FAMILIES if env.disc.has(n)]
    if not names or hi - lo < 20:
        return {}
    sel = '{__name__=~"' + "|".join(names) + '"}'
    step = max(10.0, (hi - lo) / 400)
    series = await env.client.query_range(f"sum by (__name__, host, device) ({sel})", lo, hi, step)
    out: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for x in series:
        key = (x.labels.get("__name__", ""), host_of(x.labels), x.labels.get("device", ""))
        out.setdefault(key, []).extend(p for p in x.points if p[1] == p[1])
    return out


def describe_triggers(j: NetworkJudgement, last: float, hi: float) -> str:
    def when(o: float) -> str:
        rel = f"{last - o:.0f} s before" if o <= last else f"{o - last:.0f} s after"
        return f", rising from {iso(o)} ({rel} the last step)"

    return "; ".join(
        f"{h} {dev}: {', '.join(parts)} by {iso(hi)}{when(o)}"
        for (h, dev), (o, parts) in sorted(j.triggers.items())
    )


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
        power_end = None
        if env.disc.timeline.empty and env.ctx.last_step_time is None:
            # No step is dated anywhere: the hang began when the GPUs left training power.
            power_t, _ = await gpu_trend(env, env.disc.min_time, env.disc.max_time)
            power_end = training_end_from_power(power_t, env.profile, env.disc.max_time)
        last, start, end = hang_window(env, power_end)
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
        # The process count is read at the very end: a process that died during the window is gone now.
        tail = min(ws, 180.0)
        prof, th = env.profile, env.th
        st = env.disc.timeline.median_step_time() or env.ctx.step_time_s or 30.0
        # Network counters: the host's own baseline before the lead-up (increase() in the instant query),
        # then the lead-up and the first minutes of the hang at scrape resolution (when errors began,
        # whether they stand out).
        lead = last - max(300.0, 10 * st)
        win = NetworkWindows(
            max(env.disc.min_time, lead - th.anomaly_baseline_s),
            lead,
            last,
            st,
            min(end, last + max(600.0, 10 * st)),
        )
        arms = baseline_arms(env, win, end) | present(
            env,
            {
                "util": f"avg_over_time(ray_node_gpus_utilization[{dur(ws)}])",
                "power": f"avg_over_time(hw_gpu_power_watts[{dur(ws)}])",
                "power_before": f"avg_over_time(hw_gpu_power_watts[{dur(before)}] offset {off})",
                "samples": f"count_over_time(hw_procs_running[{dur(w)}])",
                "samples_before": f"count_over_time(hw_procs_running[{dur(before)}] offset {off})",
                # Sample time of each host's newest scrape (absent once it is older than the lookback).
                "last_seen": "timestamp(hw_procs_running)",
                "gpu_procs": f"sum by (host) (last_over_time(hw_gpu_user_processes[{dur(tail)}]))",
                "gpu_procs_before": f"sum by (host) (last_over_time(hw_gpu_user_processes[{dur(before)}] offset {off}))",
                "tcp_hang": f"increase(hw_tcp_retransmits_total[{dur(w)}])",
                "tcp_total": f"last_over_time(hw_tcp_retransmits_total[{full}])",
                "rdma_retx": f"sum by (host) (increase(hw_rdma_tx_retx_pkts_total[{dur(w)}]))",
                "port_min": f"min by (host) (min_over_time(hw_rdma_port_state[{dur(w)}]))",
            },
            {
                "util": "ray_node_gpus_utilization",
                "power": "hw_gpu_power_watts",
                "power_before": "hw_gpu_power_watts",
                "samples": "hw_procs_running",
                "samples_before": "hw_procs_running",
                "last_seen": "hw_procs_running",
                "gpu_procs": "hw_gpu_user_processes",
                "gpu_procs_before": "hw_gpu_user_processes",
                "tcp_hang": "hw_tcp_retransmits_total",
                "tcp_total": "hw_tcp_retransmits_total",
                "rdma_retx": "hw_rdma_tx_retx_pkts_total",
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
        gpu_procs, gpu_procs_before = by_host(r.get("gpu_procs", [])), by_host(r.get("gpu_procs_before", []))
        tcp_hang, tcp_total = by_host(r.get("tcp_hang", [])), by_host(r.get("tcp_total", []))
        rdma_retx = by_host(r.get("rdma_retx", []))
        port_min = by_host(r.get("port_min", []))

        net = judge_network(await network_series(env, win.lead, win.hi), baseline_rates(r, win), win, th)

        hosts = sorted(set(env.disc.hosts) | set(sbefore) | {h for h, _ in power} | {h for h, _ in pbefore})
        states = {k: gpu_state(util.get(k), power.get(k), prof, th) for k in set(util) | set(power)}
        host_gpus: dict[str, dict[str, str]] = {}
        for (h, g), state in states.items():
            host_gpus.setdefault(h, {})[g] = state
        host_power = {h: median(v for (hh, _), v in power.items() if hh == h) for h in {h for h, _ in power}}
        interval = (before / sbefore[max(sbefore, key=lambda h: sbefore[h])]) if sbefore else 10.0
        # Compare with the best-reporting peer, not with w/interval: the TSDB may start after the hang began.
        expected = max(samples.values(), default=w / max(interval, 1.0))

        dead: list[str] = []
        partitioned: list[str] = []
        reporting: dict[str, str] = {}
        for h in hosts:
            n = samples.get(h, 0.0)
            seen = last_seen.get(h)
            if "samples" in arms and (n == 0 or seen is None or seen < end - max(3 * interval, 30.0)):
                reporting[h] = "silent"
                dead.append(h)
            elif n < 0.7 * expected:
                reporting[h] = "scrape gaps"
                partitioned.append(h)
            else:
                reporting[h] = "reporting"
        procs = process_states(hosts, gpu_procs, gpu_procs_before, reporting)
        gone, still_listed = left_collective(hosts, dead, procs, host_gpus, host_power, prof)
        host_state: dict[str, str] = {}
        for h in hosts:
            gstates = Counter(host_gpus.get(h, {}).values())
            summary = ", ".join(f"{c} {s}" for s, c in gstates.most_common()) or "no GPU data"
            if h in dead:
                host_state[h] = "stopped reporting" + (f" at {iso(last_seen[h])}" if h in last_seen else "")
            elif h in partitioned:
                host_state[h] = f"scrape gaps ({int(samples.get(h, 0))}/{int(expected)} samples)"
            elif h in still_listed:
                host_state[h] = f"GPUs idle, process still listed ({summary})"
            elif h in gone:
                why = {"gone": "no GPU user process" if h in gpu_procs else "GPU process series stopped"}.get(
                    procs[h], "all GPUs idle"
                )
                host_state[h] = f"process gone ({why}; {summary})"
            else:
                host_state[h] = summary

        total = max(1, len(states))
        counts = Counter(states.values())
        busy_frac = counts.get("busy-wait", 0) / total
        train_frac = counts.get("training", 0) / total
        active_hosts = [h for h in hosts if h not in dead and h not in gone]

        # Partial-init pattern: which GPU indices spin on each host; hosts off the majority set are suspects.
        busy_sets = {
            h: frozenset(g for g, s in host_gpus.get(h, {}).items() if s in ("busy-wait", "busy"))
            for h in active_hosts
        }
        majority: frozenset[str] = (
            Counter(busy_sets.values()).most_common(1)[0][0] if busy_sets else frozenset()
        )
        # Init-phase pattern: on most nodes only a subset of GPUs entered the stuck collective.
        partial = 0 < len(majority) < max(1, env.disc.gpus_per_host)
        outlier_hosts = sorted(h for h, s in busy_sets.items() if s != majority) if majority else []

        port_down = sorted(h for h, v in port_min.items() if v < 1)
        patterns = host_patterns(
            hosts, reporting, host_gpus, host_power, procs, port_down, net.standout_hosts, prof
        )
        deviating = deviations(patterns)
        # anomalous_hosts: the hosts off the majority pattern of any family (module docstring).
        anomalous = sorted({h for hs in deviating.values() for h in hs})

        tcp_life_out = outliers_high(tcp_total, factor=th.tcp_outlier_factor, floor=1e5)
        trig_hosts = sorted({h for h, _ in net.triggers})
        trig_desc = describe_triggers(net, last, win.hi)
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
                "GPU processes",
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
                    fmt(gpu_procs.get(h), digits=0)
                    if h in gpu_procs
                    else ("none" if procs.get(h) == "gone" else "n/a"),
                    fmt(tcp_hang.get(h), digits=0),
                    fmt(tcp_total.get(h), digits=0),
                    fmt(rdma_retx.get(h), digits=0),
                )
            )
        interesting = set(dead) | set(outlier_hosts) | set(gone) | set(partitioned) | set(anomalous)
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
        pattern_table = EvidenceTable(
            "Majority pattern per metric family (hosts off it are anomalous)",
            "hang-window values above, per host",
            ("Family", "majority pattern", "hosts off it"),
            [
                (
                    fam,
                    _pattern_text(cats, deviating.get(fam, [])),
                    ", ".join(deviating.get(fam, [])) or "none",
                )
                for fam, cats in patterns.items()
            ],
        )

        verdict = "healthy"
        root = ""
        chain: list[str] = []
        window_txt = (
            f"{iso(start)} to {iso(end)} ({int(w)} s after last step {env.disc.timeline.last_step} at {iso(last)})"
            if power_end is None
            else f"{iso(start)} to {iso(end)} ({int(w)} s after the GPUs left training power at {iso(last)}; no dated step)"
        )
        if dead and active_hosts:
            verdict = "dead-node"
            root = f"{', '.join(dead)} stopped reporting metrics; the remaining nodes wait on it in the next collective."
            chain = [
                f"{', '.join(dead)} died",
                "surviving ranks block in the collective",
                f"{counts.get('busy-wait', 0)} GPUs spin at busy-wait power",
                "training steps stop",
            ]
        elif gone and busy_frac > 0:
            verdict = "dead-node"
            evidence = "; ".join(f"{h}: {host_state[h]}" for h in gone)
            root = (
                f"Training processes on {', '.join(gone)} were gone ({evidence}) while the other nodes spun in a "
                "collective waiting for them."
                + (
                    f" {', '.join(still_listed)} still lists a GPU process but its GPUs are idle: the rank hangs outside "
                    "the collective (host-side stall) or its process is defunct -- either way the others wait for it."
                    if still_listed
                    else ""
                )
            )
            chain = [
                f"process death on {', '.join(gone)}",
                "peers block in the collective",
                "busy-wait on the other nodes",
            ]
        elif partitioned or port_down:
            verdict = "network-partition"
            cut = sorted(set(partitioned) | set(port_down))
            root = f"{', '.join(cut)} lost connectivity during the hang (scrape gaps / RDMA port down) while GPUs kept spinning."
            chain = ["network partition", "collective cannot complete", "busy-wait hang"]
        elif busy_frac >= 0.5 or (partial and busy_frac > 0):
            verdict = "rccl-busy-wait-hang"
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
            root = "All GPUs idle: the training processes were gone on every node (crash without a log signature?)."

        killed = heartbeat_kill(env, last, busy_frac)
        if verdict == "rccl-busy-wait-hang" and killed is not None and killed[1].hang_first(th):
            crash, judged = killed
            verdict = "hang-then-heartbeat"
            root += (
                f" The heartbeat error at {iso(crash)} came {judged.stall_s / 60 if judged.stall_s else 0:.0f} min after the last step, "
                "with the GPUs busy-waiting in between: the hang is the primary failure and the heartbeat timeout "
                "(gRPC channel deadlock after a long hang) was only the kill mechanism."
            )
            chain += ["gRPC channel deadlock after a long hang", "heartbeat timeout kills the job"]

        findings.append(
            Finding(
                "Hang mechanism",
                root or "No hang signature in the GPU metrics.",
                "critical" if verdict != "healthy" else "info",
                tuple(anomalous),
                [host_table, gpu_table, pattern_table],
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
        bad_net = sorted(set(net.standout_hosts) | set(port_down))
        background = {LABELS[f]: hs for f, hs in net.background.items()}
        bg_txt = (
            " Background counts that do not stand out against the hosts' own baseline and their peers "
            f"(minimum rates: retransmits {th.rdma_retx_min_per_s:g}/s, ACK timeouts {th.rdma_ack_timeout_min_per_s:g}/s, "
            f"TCP {th.tcp_rate_min_per_s:g}/s): "
            + "; ".join(f"{k} on {len(hs)}/{len(hosts)} hosts" for k, hs in sorted(background.items()))
            + " -- not a trigger."
            if background
            else ""
        )
        if bad_net:
            findings.append(
                Finding(
                    "RDMA/TCP counters around the hang",
                    "Error rates standing out around the hang: "
                    + "; ".join(
                        f"{h}: {', '.join(net.standout_parts.get(h, ['RDMA port down']))}" for h in bad_net
                    )
                    + "."
                    + bg_txt,
                    "warning",
                    tuple(bad_net),
                )
            )
        elif "rdma_retx" in r or net.background:
            findings.append(
                Finding(
                    "RDMA/TCP counters around the hang",
                    "No RDMA retransmit bursts, ACK timeouts, TCP retransmit outliers or link-downs around the hang."
                    + bg_txt,
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
        if trig_hosts and verdict in ("rccl-busy-wait-hang", "hang-then-heartbeat"):
            nxt = [
                f"Check the RDMA link of {', '.join(trig_hosts)} (cable, switch port, `ibstat`/`rdma link`); run --playbook network-health.",
                f"Resubmit with --exclude={','.join(trig_hosts)} until the link is repaired.",
            ]
        if verdict == "hang-then-heartbeat":
            nxt.append(
                "Raising jax_distributed_heartbeat_timeout_seconds only delays the kill; fix the hang "
                "(and detect it early from step progress rather than heartbeats)."
            )
        if verdict == "dead-node":
            named = sorted(set(dead) | set(gone)) or anomalous
            nxt = [
                f"Inspect {', '.join(named) or 'every node'}: dmesg (OOM kill, GPU errors), run --playbook hardware and --playbook oom.",
                "Resubmit excluding the node if it shows hardware errors.",
            ]
        corr = ""
        if env.ctx.primary_class in ("hang", "cancelled", "train-timeout", "heartbeat-timeout"):
            confirms = verdict == "rccl-busy-wait-hang" or (
                verdict == "hang-then-heartbeat" and env.ctx.primary_class == "hang"
            )
            corr = f"Triage classified this as {env.ctx.primary_class}. TSDB {'confirms' if confirms else 'refines'}: {verdict}."
        return PlaybookResult(
            playbook=self.name,
            analysis_type=self.analysis_type,
            verdict=Verdict(verdict),
            window=(start, end),
            findings=findings,
            anomalous_hosts=anomalous,
            root_cause=root,
            chain=chain,
            next_steps=nxt,
            triage_correlation=corr + (f" Window: {window_txt}." if corr else ""),
            incident=power_end,
        )


def _pattern_text(cats: Mapping[str, Hashable], off: Sequence[str]) -> str:
    rest = [c for h, c in cats.items() if h not in off]
    if not rest:
        return "n/a"
    c = Counter(rest).most_common(1)[0][0]
    if isinstance(c, frozenset):
        return (
            "GPUs {" + ", ".join(sorted(c, key=lambda g: int(g) if g.isdigit() else 0)) + "} active"
            if c
            else "no GPU active"
        )
    return str(c)


def heartbeat_kill(env: PlaybookEnv, last: float, busy_frac: float) -> tuple[float, StallJudgement] | None:
    """The heartbeat error that ended a hung job (triage context) and the stall before it: from the last
    step to the heartbeat error, with the hang window's busy-wait share of GPUs as the GPU evidence."""
    if not heartbeat_reported(env):
        return None
    crash = heartbeat_times(env)[0]
    if crash <= last:
        return None
    tl = env.disc.timeline
    step = tl.last_step if tl.last_step is not None else env.ctx.last_step
    return crash, StallJudgement(last, step, tl.source, crash - last, (last, crash), busy_frac)
