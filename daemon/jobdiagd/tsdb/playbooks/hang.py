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
from enum import StrEnum

from jobdiagd.model.kinds import FailureClass, GpuState
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
    return frozenset(
        g for g, s in gpu_states.items() if s in (GpuState.BUSY_WAIT, GpuState.BUSY, GpuState.TRAINING)
    )


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
    return all(s == GpuState.IDLE for s in gpu_states.values()) or (
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


class HangMechanism(StrEnum):
    """Which branch of the hang decision fired (rules PB-HANG-2..4, PB-HANG-7); the render step words it."""

    SILENT_HOSTS = "silent-hosts"  # hosts stopped reporting while others run (PB-HANG-2)
    PROCESS_GONE = "process-gone"  # training process gone while peers busy-wait (PB-HANG-2)
    PARTITION = "partition"  # scrape gaps / RDMA port down (PB-HANG-3)
    BUSY_WAIT = "busy-wait"  # collective deadlock (PB-HANG-4)
    TRAINING = "training"  # most GPUs at training power (PB-HANG-7)
    ALL_IDLE = "all-idle"  # every GPU idle (PB-HANG-7)
    NONE = "none"  # no hang signature


@dataclass(frozen=True)
class HangSeries:
    """What the hang judgement reads from the TSDB (fetch step): per-GPU and per-host values of the hang
    window, the network counters of the lead-up, and the windows they were read over."""

    last: float  # last step (or when the GPUs left training power)
    start: float
    end: float
    before: float  # length of the pre-hang window read for "power before" and sample counts
    net_windows: NetworkWindows
    util: Mapping[tuple[str, str], float] = field(default_factory=dict)
    power: Mapping[tuple[str, str], float] = field(default_factory=dict)
    power_before: Mapping[tuple[str, str], float] = field(default_factory=dict)
    samples: Mapping[str, float] = field(default_factory=dict)
    samples_before: Mapping[str, float] = field(default_factory=dict)
    last_seen: Mapping[str, float] = field(default_factory=dict)
    gpu_procs: Mapping[str, float] = field(default_factory=dict)
    gpu_procs_before: Mapping[str, float] = field(default_factory=dict)
    tcp_hang: Mapping[str, float] = field(default_factory=dict)
    tcp_total: Mapping[str, float] = field(default_factory=dict)
    rdma_retx: Mapping[str, float] = field(default_factory=dict)
    port_min: Mapping[str, float] = field(default_factory=dict)
    network: Mapping[tuple[str, str, str], Sequence[tuple[float, float]]] = field(default_factory=dict)
    network_before: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    has_reporting: bool = True  # the TSDB has hw_procs_running (liveness can be judged)
    has_rdma: bool = False  # the TSDB has hw_rdma_tx_retx_pkts_total
    power_end: float | None = None  # no dated step: when the GPUs left training power

    @property
    def w(self) -> float:
        return self.end - self.start

    @property
    def ws(self) -> float:
        """GPU state is judged on the last <= 10 minutes: an init-phase hang window may still contain compilation."""
        return min(self.w, 600.0)


@dataclass(frozen=True)
class HangFacts:
    """Plain facts of the job (discovery and triage) the hang judgement needs besides the series."""

    hosts: tuple[str, ...]
    gpus_per_host: int
    heartbeat_crash: float | None = None  # triage's heartbeat error time, when it reports one
    last_step: int | None = None  # TSDB timeline, else the log
    step_source: str = "none"


@dataclass(frozen=True)
class HeartbeatKill:
    """The heartbeat error that ended a hung job and the stall before it (rule PB-HANG-8)."""

    crash: float
    stall: StallJudgement


@dataclass(frozen=True)
class HangJudgement:
    """The verdict of the hang window and the evidence it rests on (judge step; no prose)."""

    verdict: Verdict
    mechanism: HangMechanism
    hosts: list[str]
    states: Mapping[tuple[str, str], str]
    host_gpus: Mapping[str, Mapping[str, str]]
    expected: float  # hw samples the best-reporting host has in the hang window
    dead: list[str]  # stopped reporting
    partitioned: list[str]  # scrape gaps
    procs: Mapping[str, str]  # present | gone | unknown
    gone: list[str]  # left the collective
    still_listed: list[str]  # of those, still listing a GPU process
    counts: Mapping[str, int]  # GPU state -> GPUs
    total: int
    busy_frac: float
    majority: frozenset[str]  # GPU indices spinning on most hosts
    partial: bool  # only a subset of GPUs entered the collective
    outlier_hosts: list[str]  # stuck-GPU set differs from the majority
    port_down: list[str]
    patterns: Mapping[str, Mapping[str, Hashable]]
    deviating: Mapping[str, list[str]]
    anomalous: list[str]
    tcp_lifetime_outliers: list[str]
    net: NetworkJudgement
    trigger_hosts: list[str]
    kill: HeartbeatKill | None = None  # set only when the verdict is hang-then-heartbeat


def reporting_states(
    data: HangSeries, hosts: Sequence[str]
) -> tuple[dict[str, str], list[str], list[str], float]:
    """(host -> reporting | scrape gaps | silent, silent hosts, hosts with gaps, expected samples)."""
    sbefore = data.samples_before
    interval = (data.before / sbefore[max(sbefore, key=lambda h: sbefore[h])]) if sbefore else 10.0
    # Compare with the best-reporting peer, not with w/interval: the TSDB may start after the hang began.
    expected = max(data.samples.values(), default=data.w / max(interval, 1.0))
    dead: list[str] = []
    partitioned: list[str] = []
    reporting: dict[str, str] = {}
    for h in hosts:
        n = data.samples.get(h, 0.0)
        seen = data.last_seen.get(h)
        if data.has_reporting and (n == 0 or seen is None or seen < data.end - max(3 * interval, 30.0)):
            reporting[h] = "silent"
            dead.append(h)
        elif n < 0.7 * expected:
            reporting[h] = "scrape gaps"
            partitioned.append(h)
        else:
            reporting[h] = "reporting"
    return reporting, dead, partitioned, expected


def hang_mechanism(
    *,
    dead: Sequence[str],
    active_hosts: Sequence[str],
    gone: Sequence[str],
    partitioned: Sequence[str],
    port_down: Sequence[str],
    counts: Mapping[str, int],
    total: int,
    partial: bool,
) -> HangMechanism:
    """The decision of rules PB-HANG-2 (dead node), -3 (partition), -4 (busy-wait) and -7, in that order."""
    busy_frac = counts.get(GpuState.BUSY_WAIT, 0) / total
    if dead and active_hosts:
        return HangMechanism.SILENT_HOSTS
    if gone and busy_frac > 0:
        return HangMechanism.PROCESS_GONE
    if partitioned or port_down:
        return HangMechanism.PARTITION
    if busy_frac >= 0.5 or (partial and busy_frac > 0):
        return HangMechanism.BUSY_WAIT
    if counts.get(GpuState.TRAINING, 0) / total >= 0.5:
        return HangMechanism.TRAINING
    if counts and counts.get(GpuState.IDLE, 0) == total:
        return HangMechanism.ALL_IDLE
    return HangMechanism.NONE


MECHANISM_VERDICT = {
    HangMechanism.SILENT_HOSTS: Verdict.DEAD_NODE,
    HangMechanism.PROCESS_GONE: Verdict.DEAD_NODE,
    HangMechanism.PARTITION: Verdict.NETWORK_PARTITION,
    HangMechanism.BUSY_WAIT: Verdict.RCCL_BUSY_WAIT_HANG,
    HangMechanism.TRAINING: Verdict.HEALTHY,
    HangMechanism.ALL_IDLE: Verdict.DEAD_NODE,
    HangMechanism.NONE: Verdict.HEALTHY,
}


def heartbeat_kill(facts: HangFacts, last: float, busy_frac: float) -> HeartbeatKill | None:
    """The heartbeat error that ended a hung job (triage context) and the stall before it: from the last
    step to the heartbeat error, with the hang window's busy-wait share of GPUs as the GPU evidence."""
    crash = facts.heartbeat_crash
    if crash is None or crash <= last:
        return None
    return HeartbeatKill(
        crash,
        StallJudgement(last, facts.last_step, facts.step_source, crash - last, (last, crash), busy_frac),
    )


def judge_hang(data: HangSeries, facts: HangFacts, prof: GpuProfile, th: Thresholds) -> HangJudgement:
    """Pure: the hang window's series in, the verdict and its evidence out (rules PB-HANG-2..8)."""
    net = judge_network(data.network, data.network_before, data.net_windows, th)
    hosts = sorted(
        set(facts.hosts)
        | set(data.samples_before)
        | {h for h, _ in data.power}
        | {h for h, _ in data.power_before}
    )
    states: dict[tuple[str, str], str] = {
        k: gpu_state(data.util.get(k), data.power.get(k), prof, th) for k in set(data.util) | set(data.power)
    }
    host_gpus: dict[str, dict[str, str]] = {}
    for (h, g), state in states.items():
        host_gpus.setdefault(h, {})[g] = state
    host_power = {
        h: median(v for (hh, _), v in data.power.items() if hh == h) for h in {h for h, _ in data.power}
    }
    reporting, dead, partitioned, expected = reporting_states(data, hosts)
    procs = process_states(hosts, data.gpu_procs, data.gpu_procs_before, reporting)
    gone, still_listed = left_collective(hosts, dead, procs, host_gpus, host_power, prof)

    total = max(1, len(states))
    counts = Counter(states.values())
    busy_frac = counts.get(GpuState.BUSY_WAIT, 0) / total
    active_hosts = [h for h in hosts if h not in dead and h not in gone]

    # Partial-init pattern: which GPU indices spin on each host; hosts off the majority set are suspects.
    busy_sets = {
        h: frozenset(g for g, s in host_gpus.get(h, {}).items() if s in (GpuState.BUSY_WAIT, GpuState.BUSY))
        for h in active_hosts
    }
    majority: frozenset[str] = Counter(busy_sets.values()).most_common(1)[0][0] if busy_sets else frozenset()
    # Init-phase pattern: on most nodes only a subset of GPUs entered the stuck collective.
    partial = 0 < len(majority) < max(1, facts.gpus_per_host)
    outlier_hosts = sorted(h for h, s in busy_sets.items() if s != majority) if majority else []

    port_down = sorted(h for h, v in data.port_min.items() if v < 1)
    patterns = host_patterns(
        hosts, reporting, host_gpus, host_power, procs, port_down, net.standout_hosts, prof
    )
    deviating = deviations(patterns)
    # anomalous_hosts: the hosts off the majority pattern of any family (module docstring).
    anomalous = sorted({h for hs in deviating.values() for h in hs})

    mechanism = hang_mechanism(
        dead=dead,
        active_hosts=active_hosts,
        gone=gone,
        partitioned=partitioned,
        port_down=port_down,
        counts=counts,
        total=total,
        partial=partial,
    )
    verdict = MECHANISM_VERDICT[mechanism]
    kill = heartbeat_kill(facts, data.last, busy_frac)
    if verdict == Verdict.RCCL_BUSY_WAIT_HANG and kill is not None and kill.stall.hang_first(th):
        verdict = Verdict.HANG_THEN_HEARTBEAT
    return HangJudgement(
        verdict=verdict,
        mechanism=mechanism,
        hosts=hosts,
        states=states,
        host_gpus=host_gpus,
        expected=expected,
        dead=dead,
        partitioned=partitioned,
        procs=procs,
        gone=gone,
        still_listed=still_listed,
        counts=counts,
        total=total,
        busy_frac=busy_frac,
        majority=majority,
        partial=partial,
        outlier_hosts=outlier_hosts,
        port_down=port_down,
        patterns=patterns,
        deviating=deviating,
        anomalous=anomalous,
        tcp_lifetime_outliers=outliers_high(data.tcp_total, factor=th.tcp_outlier_factor, floor=1e5),
        net=net,
        trigger_hosts=sorted({h for h, _ in net.triggers}),
        kill=kill if verdict == Verdict.HANG_THEN_HEARTBEAT else None,
    )


# --- fetch ---------------------------------------------------------------------------------------------


async def fetch_hang(
    env: PlaybookEnv, last: float, start: float, end: float, power_end: float | None
) -> HangSeries:
    """Query the hang window's GPU, liveness and network series (the playbook's only I/O)."""
    w = end - start
    ws = min(w, 600.0)
    before = max(60.0, min(600.0, last - env.disc.min_time))
    off = dur(end - last)
    full = dur(end - env.disc.min_time + 60)
    # The process count is read at the very end: a process that died during the window is gone now.
    tail = min(ws, 180.0)
    th = env.th
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
    return HangSeries(
        last=last,
        start=start,
        end=end,
        before=before,
        net_windows=win,
        util=by_gpu(r.get("util", [])),
        power=by_gpu(r.get("power", [])),
        power_before=by_gpu(r.get("power_before", [])),
        samples=by_host(r.get("samples", [])),
        samples_before=by_host(r.get("samples_before", [])),
        last_seen=by_host(r.get("last_seen", [])),
        gpu_procs=by_host(r.get("gpu_procs", [])),
        gpu_procs_before=by_host(r.get("gpu_procs_before", [])),
        tcp_hang=by_host(r.get("tcp_hang", [])),
        tcp_total=by_host(r.get("tcp_total", [])),
        rdma_retx=by_host(r.get("rdma_retx", [])),
        port_min=by_host(r.get("port_min", [])),
        network=await network_series(env, win.lead, win.hi),
        network_before=baseline_rates(r, win),
        has_reporting="samples" in arms,
        has_rdma="rdma_retx" in r,
        power_end=power_end,
    )


def hang_facts(env: PlaybookEnv) -> HangFacts:
    tl = env.disc.timeline
    return HangFacts(
        hosts=tuple(env.disc.hosts),
        gpus_per_host=env.disc.gpus_per_host,
        heartbeat_crash=heartbeat_times(env).crash if heartbeat_reported(env) else None,
        last_step=tl.last_step if tl.last_step is not None else env.ctx.last_step,
        step_source=tl.source,
    )


# --- render --------------------------------------------------------------------------------------------


def host_states(data: HangSeries, j: HangJudgement) -> dict[str, str]:
    """The per-host state column (and the evidence of a gone process in the root cause)."""
    out: dict[str, str] = {}
    for h in j.hosts:
        gstates = Counter(j.host_gpus.get(h, {}).values())
        summary = ", ".join(f"{c} {s}" for s, c in gstates.most_common()) or "no GPU data"
        if h in j.dead:
            out[h] = "stopped reporting" + (f" at {iso(data.last_seen[h])}" if h in data.last_seen else "")
        elif h in j.partitioned:
            out[h] = f"scrape gaps ({int(data.samples.get(h, 0))}/{int(j.expected)} samples)"
        elif h in j.still_listed:
            out[h] = f"GPUs idle, process still listed ({summary})"
        elif h in j.gone:
            why = {
                "gone": "no GPU user process" if h in data.gpu_procs else "GPU process series stopped"
            }.get(j.procs[h], "all GPUs idle")
            out[h] = f"process gone ({why}; {summary})"
        else:
            out[h] = summary
    return out


def evidence_tables(data: HangSeries, j: HangJudgement, host_state: Mapping[str, str]) -> list[EvidenceTable]:
    """Per-host, per-GPU and majority-pattern tables of the hang window."""
    hosts = j.hosts
    host_table = EvidenceTable(
        "Per-host state during the hang window",
        f"avg_over_time(... [{dur(data.w)}]) at {iso(data.end)}",
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
        hu = [v for (hh, _), v in data.util.items() if hh == h]
        hp = [v for (hh, _), v in data.power.items() if hh == h]
        hb = [v for (hh, _), v in data.power_before.items() if hh == h]
        host_table.rows.append(
            (
                h,
                host_state.get(h, ""),
                fmt(sum(hu) / len(hu) if hu else None),
                fmt(sum(hp) / len(hp) if hp else None),
                fmt(sum(hb) / len(hb) if hb else None),
                f"{int(data.samples.get(h, 0))}/{int(j.expected)}",
                fmt(data.gpu_procs.get(h), digits=0)
                if h in data.gpu_procs
                else ("none" if j.procs.get(h) == "gone" else "n/a"),
                fmt(data.tcp_hang.get(h), digits=0),
                fmt(data.tcp_total.get(h), digits=0),
                fmt(data.rdma_retx.get(h), digits=0),
            )
        )
    states = j.states
    interesting = set(j.dead) | set(j.outlier_hosts) | set(j.gone) | set(j.partitioned) | set(j.anomalous)
    gpu_keys = [
        k for k in states if len(states) <= 64 or k[0] in interesting or k[0] == (hosts[0] if hosts else "")
    ]
    gpu_table = EvidenceTable(
        "Per-GPU utilization and power during the hang"
        + (
            ""
            if len(gpu_keys) == len(states)
            else f" (first host and anomalous hosts; {len(states)} GPUs in total)"
        ),
        f"avg_over_time(ray_node_gpus_utilization[{dur(data.ws)}]), avg_over_time(hw_gpu_power_watts[{dur(data.ws)}]) at {iso(data.end)}",
        ("Host", "GPU", "util %", "power W", "power before W", "state"),
        per_gpu_rows(gpu_keys, [data.util, data.power, data.power_before], ["", "", ""], states),
    )
    pattern_table = EvidenceTable(
        "Majority pattern per metric family (hosts off it are anomalous)",
        "hang-window values above, per host",
        ("Family", "majority pattern", "hosts off it"),
        [
            (
                fam,
                _pattern_text(cats, j.deviating.get(fam, [])),
                ", ".join(j.deviating.get(fam, [])) or "none",
            )
            for fam, cats in j.patterns.items()
        ],
    )
    return [host_table, gpu_table, pattern_table]


def busy_wait_root(
    j: HangJudgement, prof: GpuProfile, th: Thresholds, *, init_phase: bool, last_step: int | None
) -> str:
    """The root cause of a collective deadlock (rule PB-HANG-4), before any trigger."""
    if j.partial:
        phase = (
            "Init-phase RCCL deadlock (no training step completed)"
            if init_phase
            else f"Mid-training RCCL deadlock after step {last_step} (not init-phase: steps had completed)"
        )
        return (
            f"{phase}: on most nodes GPUs {{{', '.join(sorted(j.majority, key=int))}}} spin in the stuck collective while the rest have not entered it."
            + (
                f" Nodes with a different stuck-GPU set: {', '.join(j.outlier_hosts)} -- likely where the deadlock originated."
                if j.outlier_hosts
                else ""
            )
        )
    return (
        f"RCCL/NCCL busy-wait deadlock: {j.counts.get(GpuState.BUSY_WAIT, 0)}/{j.total} GPUs at >= {th.busy_util_pct:.0f}% utilization "
        f"but {prof.busy_wait_power_min_w:.0f}-{prof.busy_wait_power_max_w:.0f} W (idle-level) power; no node died."
        + (
            f" GPUs not spinning on {', '.join(j.outlier_hosts)} (off the majority pattern): investigate those nodes."
            if j.outlier_hosts
            else ""
        )
    )


def root_and_chain(
    j: HangJudgement,
    host_state: Mapping[str, str],
    trig_desc: str,
    prof: GpuProfile,
    th: Thresholds,
    *,
    init_phase: bool,
    last_step: int | None,
) -> tuple[str, list[str]]:
    """The root cause and failure chain of the judged mechanism, in the report's words."""
    root = ""
    chain: list[str] = []
    m = j.mechanism
    if m == HangMechanism.SILENT_HOSTS:
        root = f"{', '.join(j.dead)} stopped reporting metrics; the remaining nodes wait on it in the next collective."
        chain = [
            f"{', '.join(j.dead)} died",
            "surviving ranks block in the collective",
            f"{j.counts.get(GpuState.BUSY_WAIT, 0)} GPUs spin at busy-wait power",
            "training steps stop",
        ]
    elif m == HangMechanism.PROCESS_GONE:
        evidence = "; ".join(f"{h}: {host_state[h]}" for h in j.gone)
        root = (
            f"Training processes on {', '.join(j.gone)} were gone ({evidence}) while the other nodes spun in a "
            "collective waiting for them."
            + (
                f" {', '.join(j.still_listed)} still lists a GPU process but its GPUs are idle: the rank hangs outside "
                "the collective (host-side stall) or its process is defunct -- either way the others wait for it."
                if j.still_listed
                else ""
            )
        )
        chain = [
            f"process death on {', '.join(j.gone)}",
            "peers block in the collective",
            "busy-wait on the other nodes",
        ]
    elif m == HangMechanism.PARTITION:
        cut = sorted(set(j.partitioned) | set(j.port_down))
        root = f"{', '.join(cut)} lost connectivity during the hang (scrape gaps / RDMA port down) while GPUs kept spinning."
        chain = ["network partition", "collective cannot complete", "busy-wait hang"]
    elif m == HangMechanism.BUSY_WAIT:
        root = busy_wait_root(j, prof, th, init_phase=init_phase, last_step=last_step)
        chain = [
            "collective deadlock (RCCL/NCCL)",
            "GPUs spin in the polling loop (100% util, low watts)",
            "no step progress",
        ]
        if j.trigger_hosts:
            trig = ", ".join(j.trigger_hosts)
            hard = "retry exhaustion" in trig_desc
            root = (
                f"Trigger: RDMA link errors on {trig} before the hang ({trig_desc})"
                + (
                    " -- retry exhaustion means packets were permanently lost: a hard link failure, not congestion"
                    if hard
                    else ""
                )
                + ". The collective using that link could not complete and every rank blocked in it. "
                + root
            )
            chain = [
                f"RDMA link failure on {trig} ({trig_desc})",
                "collective on that link cannot complete",
                *chain,
            ]
    elif m == HangMechanism.TRAINING:
        root = "GPUs were at training power during the supposed hang: training continued. The Slurm log may be truncated (RAY=1); check ray_logs/<head>/worker*.out."
    elif m == HangMechanism.ALL_IDLE:
        root = (
            "All GPUs idle: the training processes were gone on every node (crash without a log signature?)."
        )
    if j.kill is not None:
        judged = j.kill.stall
        root += (
            f" The heartbeat error at {iso(j.kill.crash)} came {judged.stall_s / 60 if judged.stall_s else 0:.0f} min after the last step, "
            "with the GPUs busy-waiting in between: the hang is the primary failure and the heartbeat timeout "
            "(gRPC channel deadlock after a long hang) was only the kill mechanism."
        )
        chain += ["gRPC channel deadlock after a long hang", "heartbeat timeout kills the job"]
    return root, chain


def network_findings(data: HangSeries, j: HangJudgement, th: Thresholds) -> list[Finding]:
    """TCP lifetime outliers (rule PB-HANG-6) and the RDMA/TCP counters around the hang (PB-HANG-5)."""
    findings: list[Finding] = []
    net = j.net
    if j.tcp_lifetime_outliers:
        findings.append(
            Finding(
                "TCP retransmit lifetime-total outliers (reported, not excluded)",
                f"{', '.join(j.tcp_lifetime_outliers)} carry lifetime totals orders of magnitude above peers "
                f"(median {fmt(median(data.tcp_total.values()), digits=0)}). These are cumulative since boot: note them, "
                "but do not exclude the nodes unless the hang recurs on them.",
                "info",
                tuple(j.tcp_lifetime_outliers),
            )
        )
    bad_net = sorted(set(net.standout_hosts) | set(j.port_down))
    background = {LABELS[f]: hs for f, hs in net.background.items()}
    bg_txt = (
        " Background counts that do not stand out against the hosts' own baseline and their peers "
        f"(minimum rates: retransmits {th.rdma_retx_min_per_s:g}/s, ACK timeouts {th.rdma_ack_timeout_min_per_s:g}/s, "
        f"TCP {th.tcp_rate_min_per_s:g}/s): "
        + "; ".join(f"{k} on {len(hs)}/{len(j.hosts)} hosts" for k, hs in sorted(background.items()))
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
    elif data.has_rdma or net.background:
        findings.append(
            Finding(
                "RDMA/TCP counters around the hang",
                "No RDMA retransmit bursts, ACK timeouts, TCP retransmit outliers or link-downs around the hang."
                + bg_txt,
                "info",
            )
        )
    return findings


def hang_next_steps(j: HangJudgement, *, live: bool, init_phase: bool) -> list[str]:
    nxt = [
        ("Kill the job (scancel) and retry" if live else "Retry")
        + " on the same nodes first; "
        + ("init-phase hangs are often transient." if init_phase else "RCCL hangs are often transient."),
        "Only if the hang recurs on the same nodes: --exclude the outlier nodes, add _env_NCCL_DEBUG=INFO.",
    ]
    verdict = j.verdict
    if j.trigger_hosts and verdict in (Verdict.RCCL_BUSY_WAIT_HANG, Verdict.HANG_THEN_HEARTBEAT):
        nxt = [
            f"Check the RDMA link of {', '.join(j.trigger_hosts)} (cable, switch port, `ibstat`/`rdma link`); run --playbook network-health.",
            f"Resubmit with --exclude={','.join(j.trigger_hosts)} until the link is repaired.",
        ]
    if verdict == Verdict.HANG_THEN_HEARTBEAT:
        nxt.append(
            "Raising jax_distributed_heartbeat_timeout_seconds only delays the kill; fix the hang "
            "(and detect it early from step progress rather than heartbeats)."
        )
    if verdict == Verdict.DEAD_NODE:
        named = sorted(set(j.dead) | set(j.gone)) or j.anomalous
        nxt = [
            f"Inspect {', '.join(named) or 'every node'}: dmesg (OOM kill, GPU errors), run --playbook hardware and --playbook oom.",
            "Resubmit excluding the node if it shows hardware errors.",
        ]
    return nxt


def render_hang(env: PlaybookEnv, data: HangSeries, j: HangJudgement) -> PlaybookResult:
    """The report of a judged hang: findings with their evidence tables, root cause, chain, next steps."""
    prof, th = env.profile, env.th
    init_phase = no_step_completed(env)
    tl = env.disc.timeline
    host_state = host_states(data, j)
    trig_desc = describe_triggers(j.net, data.last, data.net_windows.hi)
    root, chain = root_and_chain(
        j,
        host_state,
        trig_desc,
        prof,
        th,
        init_phase=init_phase,
        last_step=tl.last_step if tl.last_step is not None else env.ctx.last_step,
    )
    findings = [
        Finding(
            "Hang mechanism",
            root or "No hang signature in the GPU metrics.",
            "critical" if j.verdict != Verdict.HEALTHY else "info",
            tuple(j.anomalous),
            evidence_tables(data, j, host_state),
        ),
        *network_findings(data, j, th),
    ]
    start, end, last, w = data.start, data.end, data.last, data.w
    window_txt = (
        f"{iso(start)} to {iso(end)} ({int(w)} s after last step {tl.last_step} at {iso(last)})"
        if data.power_end is None
        else f"{iso(start)} to {iso(end)} ({int(w)} s after the GPUs left training power at {iso(last)}; no dated step)"
    )
    corr = ""
    if env.ctx.primary_class in (
        FailureClass.HANG,
        FailureClass.CANCELLED,
        FailureClass.TRAIN_TIMEOUT,
        FailureClass.HEARTBEAT_TIMEOUT,
    ):
        confirms = j.verdict == Verdict.RCCL_BUSY_WAIT_HANG or (
            j.verdict == Verdict.HANG_THEN_HEARTBEAT and env.ctx.primary_class == FailureClass.HANG
        )
        corr = f"Triage classified this as {env.ctx.primary_class}. TSDB {'confirms' if confirms else 'refines'}: {j.verdict}."
    return PlaybookResult(
        playbook=HangPlaybook.name,
        analysis_type=HangPlaybook.analysis_type,
        verdict=j.verdict,
        window=(start, end),
        findings=findings,
        anomalous_hosts=j.anomalous,
        root_cause=root,
        chain=chain,
        next_steps=hang_next_steps(j, live=env.ctx.live, init_phase=init_phase),
        triage_correlation=corr + (f" Window: {window_txt}." if corr else ""),
        incident=data.power_end,
    )


class HangPlaybook:
    name = "hang"
    analysis_type = "hang"

    async def run(self, env: PlaybookEnv) -> PlaybookResult:
        power_end = None
        if env.disc.timeline.empty and env.ctx.last_step_time is None:
            # No step is dated anywhere: the hang began when the GPUs left training power.
            power_t, _ = await gpu_trend(env, env.disc.min_time, env.disc.max_time)
            power_end = training_end_from_power(power_t, env.profile, env.disc.max_time)
        win = hang_window(env, power_end)
        last, start, end = win.last, win.start, win.end
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
        data = await fetch_hang(env, last, start, end, power_end)
        return render_hang(env, data, judge_hang(data, hang_facts(env), env.profile, env.th))


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
