"""Playbook 2: heartbeat false positive -- state of the accused hosts from (crash - heartbeat timeout) to the crash.

The accused hosts are judged in the window in which their heartbeats went missing, (crash - timeout, crash]:
a real death there (series stop well before the crash while peers go on, `up` == 0, all GPUs idle) makes
the timeout a true positive (dead-node). A long average ending at crash - timeout is not used: it is
dominated by earlier healthy training and hides a host that died just before or after that instant.
Hosts are matched by short name (log node list vs labels with a domain suffix).

Trigger: "Triage reports heartbeat-timeout". Without a heartbeat-timeout failure (or heartbeat record) in
triage the playbook does not apply: verdict healthy, the root cause says there is no heartbeat error in the
log, and no window is invented from the end of the data.

Hang first (runbook checklist item 3, "check whether training was progressing or stalled before the
heartbeat error"): the stall is measured from the last step to the heartbeat *error* (the crash), not to
the heartbeat-stop time -- with a long configured timeout the heartbeats can stop before the steps do.
The last step comes from the TSDB timeline, else the log's dated steps or triage's last-step time, else
the power series (the last time the median host was at training power). The GPUs between that step and
the crash are read from the per-host power/utilization series: when most host samples show the busy-wait
signature (>= busy_util_pct utilization at busy-wait power) and the stall is at least stall_min_s, the
verdict is hang-then-heartbeat (hang primary, heartbeat the kill mechanism), unless a host really died
(dead-node is checked first). `judge_stall` is the pure part, unit-tested on literal series.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jobdiagd.model.kinds import FailureClass, GpuState
from jobdiagd.tsdb.client import Sample, multi_arm, split_arms_series
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
    host_of,
    iso,
    not_applicable,
    present,
    short_host,
)
from jobdiagd.tsdb.settings import GpuProfile, Thresholds

Points = Sequence[tuple[float, float]]


@dataclass(frozen=True)
class HeartbeatTimes:
    """The heartbeat error (`crash`), the configured timeout and the heartbeat-stop time before it."""

    crash: float
    timeout: float
    stop: float


def heartbeat_times(env: PlaybookEnv) -> HeartbeatTimes:
    """The heartbeat error, timeout and heartbeat-stop time from triage, falling back to the end of the data."""
    hb = env.ctx.heartbeat
    crash = (hb.time if hb and hb.time else None) or env.ctx.incident_time or env.disc.max_time
    timeout = hb.timeout_s if hb and hb.timeout_s else None
    if timeout is None:
        raw = env.ctx.config.get("jax_distributed_heartbeat_timeout_seconds")
        timeout = (
            float(raw) if raw and raw.replace(".", "", 1).isdigit() else env.th.heartbeat_timeout_default_s
        )
    return HeartbeatTimes(crash, timeout, crash - timeout)


def heartbeat_reported(env: PlaybookEnv) -> bool:
    """Playbook 2's trigger: triage reports a heartbeat-timeout."""
    ctx = env.ctx
    return (
        ctx.primary_class == FailureClass.HEARTBEAT_TIMEOUT
        or ctx.heartbeat is not None
        or any(f.cls == FailureClass.HEARTBEAT_TIMEOUT for f in ctx.failures)
    )


def accused_hosts(env: PlaybookEnv) -> list[str]:
    hb = env.ctx.heartbeat
    if hb is None:
        return []
    hosts = [short_host(h) for h in hb.accused_hosts]
    nodes = [short_host(n) for n in env.ctx.nodes]
    for t in hb.accused_tasks:
        # One task per node in these jobs: task i runs on the i-th node of the expanded list.
        if 0 <= t < len(nodes) and nodes[t] not in hosts:
            hosts.append(nodes[t])
    return hosts


def by_host_max(samples: list[Sample]) -> dict[str, float]:
    """Newest value per short host (several label spellings of one host collapse into one)."""
    out: dict[str, float] = {}
    for x in samples:
        if x.v == x.v:
            h = host_of(x.labels)
            out[h] = max(out.get(h, x.v), x.v)
    return out


def last_step_before(env: PlaybookEnv, t: float) -> tuple[float | None, int | None, str]:
    """(time, step, source) of the last completed step at or before t: TSDB timeline, else the log/triage."""
    tl = env.disc.timeline
    pts = [p for p in tl.points if p.t <= t]
    if pts:
        return pts[-1].t, pts[-1].step, tl.source
    dated = [s for s in env.ctx.steps if s.time is not None and s.time <= t]
    if dated:
        return dated[-1].time, dated[-1].step, "log"
    lt = env.ctx.last_step_time
    if lt is not None and lt <= t:
        return lt, env.ctx.last_step, "triage"
    return None, None, "none"


async def gpu_trend(env: PlaybookEnv, lo: float, hi: float) -> tuple[dict[str, Points], dict[str, Points]]:
    """Per-host mean GPU power and utilization over [lo, hi] (one range query)."""
    arms = present(
        env,
        {
            "power": "avg by (host) (hw_gpu_power_watts)",
            "util": "avg by (host) (ray_node_gpus_utilization)",
        },
        {"power": "hw_gpu_power_watts", "util": "ray_node_gpus_utilization"},
    )
    if not arms or hi - lo < 30:
        return {}, {}
    step = max(15.0, (hi - lo) / 240)
    res = split_arms_series(await env.client.query_range(multi_arm(arms), lo, hi, step))

    def per_host(arm: str) -> dict[str, Points]:
        return {host_of(x.labels): [p for p in x.points if p[1] == p[1]] for x in res.get(arm, [])}

    return per_host("power"), per_host("util")


@dataclass(frozen=True)
class StallJudgement:
    """Was training stalled before the heartbeat error, and what did the GPUs do in between?"""

    last_step_t: float | None
    last_step: int | None
    source: str  # where the last step time came from: tsdb | log | triage | power | none
    stall_s: float | None  # crash - last step
    window: tuple[float, float] | None  # the stall window read from the GPU series
    busy_wait_frac: float = 0.0  # share of host samples with the busy-wait signature in the window
    training_frac: float = 0.0
    samples: int = 0
    # host -> (mean utilization or None, mean power, busy-wait share) over the window
    per_host: Mapping[str, tuple[float | None, float, float]] = field(default_factory=dict)

    def hang_first(self, th: Thresholds) -> bool:
        """Runbook: stalled well before the heartbeat error, GPUs at 100% utilization and busy-wait power."""
        return self.stall_s is not None and self.stall_s >= th.stall_min_s and self.busy_wait_frac >= 0.5


def training_end_from_power(power: Mapping[str, Points], prof: GpuProfile, before: float) -> float | None:
    """Last time (<= before) at which the median host drew training power: the stall began after it."""
    times = sorted({t for pts in power.values() for t, _ in pts if t <= before})
    by_t: dict[float, list[float]] = {}
    for pts in power.values():
        for t, v in pts:
            by_t.setdefault(t, []).append(v)
    train = [t for t in times if statistics.median(by_t[t]) >= prof.train_power_min_w * 0.9]
    return train[-1] if train else None


def judge_stall(
    crash: float,
    last: tuple[float | None, int | None, str],
    power: Mapping[str, Points],
    util: Mapping[str, Points],
    prof: GpuProfile,
    th: Thresholds,
    step_time: float,
) -> StallJudgement:
    """Pure: the stall before the heartbeat error and the GPU signature during it (module docstring)."""
    last_t, last_step, source = last
    if last_t is None:
        last_t = training_end_from_power(power, prof, crash)
        source = "power" if last_t is not None else "none"
    if last_t is None:
        return StallJudgement(None, None, source, None, None)
    # The first couple of step times after the last step may still be a (slow) step in flight.
    lo = last_t + max(2 * step_time, 60.0)
    if lo >= crash:
        return StallJudgement(last_t, last_step, source, crash - last_t, None)
    busy = training = n = 0
    per_host: dict[str, tuple[float | None, float, float]] = {}
    for host, pts in sorted(power.items()):
        util_at = dict(util.get(host, ()))
        inside = [(t, p) for t, p in pts if lo <= t <= crash]
        if not inside:
            continue
        states = [gpu_state(util_at.get(t), p, prof, th) for t, p in inside]
        utils = [util_at[t] for t, _ in inside if t in util_at]
        h_busy = sum(1 for x in states if x == GpuState.BUSY_WAIT)
        per_host[host] = (
            statistics.fmean(utils) if utils else None,
            statistics.fmean(p for _, p in inside),
            h_busy / len(states),
        )
        n += len(states)
        busy += h_busy
        training += sum(1 for x in states if x == GpuState.TRAINING)
    return StallJudgement(
        last_t,
        last_step,
        source,
        crash - last_t,
        (lo, crash),
        busy / n if n else 0.0,
        training / n if n else 0.0,
        n,
        per_host,
    )


@dataclass(frozen=True)
class HeartbeatSeries:
    """What the heartbeat judgement reads (fetch step): the heartbeat window's per-host state and
    liveness, and the GPU power/utilization trend from before the last step to the heartbeat error."""

    crash: float  # the heartbeat error
    timeout: float
    stop: float  # heartbeat-stop time: crash - timeout
    at: float  # liveness read at min(crash, end of data)
    at_state: float  # GPU state read at the start of the heartbeat window
    util: Mapping[tuple[str, str], float] = field(default_factory=dict)
    power: Mapping[tuple[str, str], float] = field(default_factory=dict)
    tcp: Mapping[str, float] = field(default_factory=dict)
    io: Mapping[str, float] = field(default_factory=dict)
    mem: Mapping[str, float] = field(default_factory=dict)
    oom: Mapping[str, float] = field(default_factory=dict)
    dmesg: Mapping[str, float] = field(default_factory=dict)
    samples: Mapping[str, float] = field(default_factory=dict)
    seen: Mapping[str, float] = field(default_factory=dict)  # host -> newest sample time up to the crash
    up_down: Sequence[str] = ()  # scrape target down for most of the window
    last_step: tuple[float | None, int | None, str] = (None, None, "none")  # last_step_before(crash)
    step_time: float = 30.0
    power_trend: Mapping[str, Points] = field(default_factory=dict)
    util_trend: Mapping[str, Points] = field(default_factory=dict)

    @property
    def w(self) -> float:
        return max(self.timeout, 60.0)

    @property
    def ws(self) -> float:
        return min(self.w, 120.0)


@dataclass(frozen=True)
class HeartbeatJudgement:
    """The verdict of the heartbeat playbook and its evidence (judge step; no prose)."""

    verdict: Verdict
    states: Mapping[tuple[str, str], str]
    stall: StallJudgement
    stopped: Mapping[str, float | None]  # host -> its last metrics, well before the crash
    dead: list[str]
    idle_accused: list[str]
    anomalous: list[str]
    accused_states: Mapping[str, int]  # GPU state -> GPUs of the accused hosts (all hosts if none)


def judge_heartbeat(
    data: HeartbeatSeries, accused: Sequence[str], hosts: Sequence[str], prof: GpuProfile, th: Thresholds
) -> HeartbeatJudgement:
    """Pure: the heartbeat window in, the verdict and its evidence out (rules PB-HB-1..4)."""
    states = {
        k: gpu_state(data.util.get(k), data.power.get(k), prof, th) for k in set(data.util) | set(data.power)
    }
    stall = judge_stall(
        data.crash, data.last_step, data.power_trend, data.util_trend, prof, th, data.step_time
    )
    seen = data.seen
    # Metrics that end well before the crash (while the newest peer goes on) mean the host died in or
    # before the heartbeat window; the job's own end stops everyone at the crash.
    ref = min(data.at, max(seen.values(), default=data.at))
    margin = max(3 * 10.0, 30.0)
    judged = list(accused) or list(hosts)
    stopped = {h: seen.get(h) for h in judged if seen and seen.get(h, 0.0) < ref - margin}
    dead = [
        h
        for h in judged
        if data.samples.get(h, 0) == 0
        or h in stopped
        or h in data.up_down
        or data.oom.get(h, 0) > 0.5
        or data.dmesg.get(h, 0) > 0.5
    ]
    idle_accused = [
        h
        for h in accused
        if states
        and all(s == GpuState.IDLE for (hh, _), s in states.items() if hh == h)
        and any(hh == h for hh, _ in states)
    ]
    anomalous: list[str] = []
    if dead or idle_accused:
        verdict = Verdict.DEAD_NODE
        anomalous = sorted(set(dead) | set(idle_accused))
    elif stall.hang_first(th) and stall.stall_s is not None:
        verdict = Verdict.HANG_THEN_HEARTBEAT
    else:
        verdict = Verdict.HEARTBEAT_FALSE_POSITIVE
    return HeartbeatJudgement(
        verdict=verdict,
        states=states,
        stall=stall,
        stopped=stopped,
        dead=dead,
        idle_accused=idle_accused,
        anomalous=anomalous,
        accused_states=Counter(s for (hh, _), s in states.items() if not accused or hh in accused),
    )


# --- fetch ---------------------------------------------------------------------------------------------


async def fetch_heartbeat(env: PlaybookEnv) -> HeartbeatSeries:
    """The heartbeat window's host state and liveness, and the GPU trend before the error (the only I/O)."""
    times = heartbeat_times(env)
    crash, timeout, stop = times.crash, times.timeout, times.stop
    # Liveness is judged over the heartbeat window itself (heartbeats stopped -> kill); the GPU state
    # over its first <= 2 minutes, right after the heartbeats stopped (a long window would mix in a
    # hang that began later and say "busy" for GPUs that were training when the heartbeats failed).
    w = max(timeout, 60.0)
    at = min(crash, env.disc.max_time)
    ws = min(w, 120.0)
    at_state = min(stop + ws, at)
    full = dur(at - env.disc.min_time + 60)
    state_arms = present(
        env,
        {
            "util": f"avg_over_time(ray_node_gpus_utilization[{dur(ws)}])",
            "power": f"avg_over_time(hw_gpu_power_watts[{dur(ws)}])",
            "tcp": f"rate(hw_tcp_retransmits_total[{dur(ws)}])",
            "io": f"avg_over_time(hw_io_pressure_full_pct[{dur(ws)}])",
            "mem": f"max_over_time(ray_node_mem_used[{dur(ws)}]) / max_over_time(ray_node_mem_total[{dur(ws)}])",
        },
        {
            "util": "ray_node_gpus_utilization",
            "power": "hw_gpu_power_watts",
            "tcp": "hw_tcp_retransmits_total",
            "io": "hw_io_pressure_full_pct",
            "mem": "ray_node_mem_used",
        },
    )
    live_arms = present(
        env,
        {
            "oom": f"increase(hw_oom_kills_total[{full}])",
            "dmesg": f"increase(hw_dmesg_gpu_errors_total[{full}])",
            "samples": f"count_over_time(hw_procs_running[{dur(w)}])",
            # Newest sample time per host up to the crash, and whether a scrape target was down.
            "seen": f"max by (host) (max_over_time(timestamp(hw_procs_running)[{dur(w + 600)}:10s]))",
            # Down for most of the window (one failed scrape of a training host is not a death).
            "up_min": f"avg_over_time(up[{dur(w)}])",
        },
        {
            "oom": "hw_oom_kills_total",
            "dmesg": "hw_dmesg_gpu_errors_total",
            "samples": "hw_procs_running",
            "seen": "hw_procs_running",
            "up_min": "up",
        },
    )
    r = await env.arms(state_arms, at_state) | await env.arms(live_arms, at)
    st = env.disc.timeline.median_step_time() or env.ctx.step_time_s or 30.0
    last = last_step_before(env, crash)
    # Enough history to see training end before a long hang (runbook: "30-60 minutes before").
    span = max(3600.0, crash - last[0] + 600.0) if last[0] is not None else 4 * 3600.0
    power_t, util_t = await gpu_trend(env, max(env.disc.min_time, crash - span), at)
    return HeartbeatSeries(
        crash=crash,
        timeout=timeout,
        stop=stop,
        at=at,
        at_state=at_state,
        util=by_gpu(r.get("util", [])),
        power=by_gpu(r.get("power", [])),
        tcp=by_host(r.get("tcp", [])),
        io=by_host(r.get("io", [])),
        mem=by_host(r.get("mem", [])),
        oom=by_host(r.get("oom", [])),
        dmesg=by_host(r.get("dmesg", [])),
        samples=by_host(r.get("samples", [])),
        seen=by_host_max(r.get("seen", [])),
        up_down=sorted({host_of(x.labels) for x in r.get("up_min", []) if x.v < 0.5}),
        last_step=last,
        step_time=st,
        power_trend=power_t,
        util_trend=util_t,
    )


# --- render --------------------------------------------------------------------------------------------


def host_table(
    data: HeartbeatSeries, j: HeartbeatJudgement, accused: Sequence[str], hosts: Sequence[str]
) -> EvidenceTable:
    states = j.states

    def host_summary(h: str) -> str:
        c = Counter(s for (hh, _), s in states.items() if hh == h)
        return ", ".join(f"{n} {s}" for s, n in c.most_common()) or "no GPU samples"

    table = EvidenceTable(
        f"Host state from heartbeat-stop time {iso(data.stop)} to crash {iso(data.crash)} (timeout {data.timeout:.0f} s)",
        f"avg_over_time(...[{dur(data.ws)}]) at {iso(data.at_state)}; liveness (last sample, up, samples) over [{dur(data.w)}] at {iso(data.at)}",
        (
            "Host",
            "accused",
            "GPU states",
            "mean util %",
            "mean power W",
            "TCP retx/s",
            "IO full %",
            "mem used",
            "OOM kills",
            "dmesg GPU errs",
            "last metrics",
        ),
    )
    for h in hosts:
        hu = [v for (hh, _), v in data.util.items() if hh == h]
        hp = [v for (hh, _), v in data.power.items() if hh == h]
        table.rows.append(
            (
                h,
                "yes" if h in accused else "",
                host_summary(h),
                fmt(sum(hu) / len(hu) if hu else None),
                fmt(sum(hp) / len(hp) if hp else None),
                fmt(data.tcp.get(h), digits=2),
                fmt(data.io.get(h)),
                fmt(100 * data.mem[h], "%") if h in data.mem else "n/a",
                fmt(data.oom.get(h), digits=0),
                fmt(data.dmesg.get(h), digits=0),
                iso(data.seen[h]) if h in data.seen else "none in window",
            )
        )
    return table


def dead_root(data: HeartbeatSeries, j: HeartbeatJudgement) -> str:
    """Why each anomalous host counts as dead (rule PB-HB-2)."""
    why = []
    for h in j.anomalous:
        if data.oom.get(h, 0) > 0.5:
            why.append(f"{h}: OOM kill")
        elif data.dmesg.get(h, 0) > 0.5:
            why.append(f"{h}: GPU driver errors in dmesg")
        elif h in j.stopped or data.samples.get(h, 0) == 0:
            t_last = j.stopped.get(h)
            why.append(
                f"{h}: metrics stop at {iso(t_last)}, {data.crash - t_last:.0f} s before the crash (heartbeat-stop time {iso(data.stop)}) while the other hosts kept reporting"
                if t_last
                else f"{h}: no metrics in the heartbeat window"
            )
        elif h in data.up_down:
            why.append(f"{h}: scrape target down (up == 0) in the heartbeat window")
        else:
            why.append(f"{h}: GPUs idle")
    return "The heartbeat timeout was a true positive: " + "; ".join(why) + "."


def false_positive_root(j: HeartbeatJudgement, accused: Sequence[str], th: Thresholds) -> str:
    """The wording of rule PB-HB-4 (init-phase kill, live accused hosts, or a stall without busy-wait)."""
    stall_j, stall = j.stall, j.stall.stall_s
    if stall_j.last_step_t is None:
        return "No training step had completed: init-phase kill -- the heartbeat timeout is shorter than XLA compilation + initial checkpoint time. Increase it."
    if stall is not None and stall >= th.stall_min_s:
        # A stall without the busy-wait signature: say what the GPUs did instead of claiming training.
        return (
            f"Training had stalled {stall / 60:.0f} min before the heartbeat error (last step {stall_j.last_step}), "
            f"but the GPUs did not show the busy-wait signature in between ({100 * stall_j.busy_wait_frac:.0f}% busy-wait, "
            f"{100 * stall_j.training_frac:.0f}% training of {stall_j.samples} host samples); no host died. "
            "The heartbeat mechanism declared live tasks dead (shared gRPC channel bug, "
            "docs/jax-heartbeat-false-positive-postmortem.md); check the stall in the log."
        )
    n_acc = max(1, sum(j.accused_states.values()))
    return (
        f"Between the heartbeat-stop time and the crash the accused hosts ({', '.join(accused) or 'all'}) were alive and training "
        f"({j.accused_states.get(GpuState.TRAINING, 0)}/{n_acc} GPUs at training power; last step {stall_j.last_step} {int(stall or 0)} s before the heartbeat error), "
        "TCP retransmits near zero and no I/O pressure. Root cause: the shared gRPC channel bug (docs/jax-heartbeat-false-positive-postmortem.md)."
    )


def heartbeat_root_and_chain(
    data: HeartbeatSeries, j: HeartbeatJudgement, accused: Sequence[str], th: Thresholds
) -> tuple[str, list[str]]:
    if j.verdict == Verdict.DEAD_NODE:
        return dead_root(data, j), [
            f"{', '.join(j.anomalous)} died (metrics stop / target down / GPUs idle)",
            "its heartbeats stop",
            f"coordinator kills the job after the {data.timeout:.0f} s timeout",
        ]
    stall_j = j.stall
    if j.verdict == Verdict.HANG_THEN_HEARTBEAT:
        win = stall_j.window
        when = (
            f"last step {stall_j.last_step} at {iso(stall_j.last_step_t or 0)}, from the {stall_j.source}"
            if stall_j.source != "power"
            else f"no dated step; the GPUs left training power at {iso(stall_j.last_step_t or 0)}"
        )
        root = (
            f"Training had stalled {(stall_j.stall_s or 0) / 60:.0f} min before the heartbeat error ({when}; "
            f"heartbeat error at {iso(data.crash)}), and the GPUs were spinning at busy-wait power in between "
            f"({100 * stall_j.busy_wait_frac:.0f}% of {stall_j.samples} host samples"
            + (f" from {iso(win[0])} to {iso(win[1])}" if win else "")
            + "): an RCCL hang came first; the heartbeat timeout (gRPC deadlock after a long hang) was only the kill mechanism."
        )
        return root, [
            "RCCL/NCCL collective hang",
            "GPUs busy-wait, no step progress",
            "gRPC channel deadlock after a long hang",
            "heartbeat timeout kills the job",
        ]
    return false_positive_root(j, accused, th), [
        "gRPC channel blocks heartbeat RPCs",
        "coordinator declares healthy tasks dead",
        "job killed",
    ]


def render_heartbeat(
    env: PlaybookEnv, data: HeartbeatSeries, j: HeartbeatJudgement, accused: Sequence[str]
) -> PlaybookResult:
    """The report of a judged heartbeat kill: host table, the stall's GPUs, root cause, chain, next steps."""
    root, chain = heartbeat_root_and_chain(data, j, accused, env.th)
    stall_j = j.stall
    evidence = [host_table(data, j, accused, sorted(set(env.disc.hosts)))]
    if stall_j.per_host and stall_j.window is not None:
        lo_w, hi_w = stall_j.window
        evidence.append(
            EvidenceTable(
                f"GPUs between the last step ({iso(stall_j.last_step_t or lo_w)}, from the {stall_j.source}) "
                f"and the heartbeat error ({iso(data.crash)})",
                f"avg by (host) (ray_node_gpus_utilization), avg by (host) (hw_gpu_power_watts) over {iso(lo_w)}..{iso(hi_w)}",
                ("Host", "accused", "mean util %", "mean power W", "busy-wait share"),
                [
                    (h, "yes" if h in accused else "", fmt(u), fmt(pw), f"{100 * b:.0f}%")
                    for h, (u, pw, b) in stall_j.per_host.items()
                ],
            )
        )
    findings = [
        Finding(
            "Accused hosts from heartbeat-stop time to crash",
            root,
            "critical" if j.verdict != Verdict.HEARTBEAT_FALSE_POSITIVE else "warning",
            tuple(accused),
            evidence,
        )
    ]
    nxt = {
        Verdict.HEARTBEAT_FALSE_POSITIVE: [
            "Increase jax_distributed_heartbeat_timeout_seconds to several hours (e.g. 14400).",
            "Rely on step-progress hang detection (jobdiagd) rather than heartbeats.",
        ],
        Verdict.HANG_THEN_HEARTBEAT: [
            "Treat as a hang: run --playbook hang for the stall window.",
            "Raising the heartbeat timeout only delays the kill; fix the hang.",
        ],
        Verdict.DEAD_NODE: [
            f"Investigate {', '.join(j.anomalous)} (dmesg, --playbook oom / --playbook hardware)."
        ],
    }[j.verdict]
    corr = f"Triage reported heartbeat-timeout accusing {', '.join(accused) or 'unknown tasks'}; TSDB verdict: {j.verdict}."
    return PlaybookResult(
        playbook=HeartbeatPlaybook.name,
        analysis_type=HeartbeatPlaybook.analysis_type,
        verdict=j.verdict,
        window=(data.stop, data.at),
        findings=findings,
        anomalous_hosts=j.anomalous,
        root_cause=root,
        chain=chain,
        next_steps=nxt,
        triage_correlation=corr,
        # the hang, not the kill, is what the earliest anomaly explains
        incident=stall_j.last_step_t if j.verdict == Verdict.HANG_THEN_HEARTBEAT else None,
    )


class HeartbeatPlaybook:
    name = "heartbeat"
    analysis_type = "heartbeat"

    async def run(self, env: PlaybookEnv) -> PlaybookResult:
        if not heartbeat_reported(env):
            root = (
                "Playbook does not apply: triage reports no heartbeat-timeout (no heartbeat error in the log"
                + (f"; primary failure {env.ctx.primary_class}" if env.ctx.primary_class else "")
                + (f"; status {env.ctx.status}" if env.ctx.status else "")
                + "), so there is no heartbeat kill to classify as a false or true positive."
            )
            return not_applicable(
                self.name,
                self.analysis_type,
                env,
                "Heartbeat",
                root,
                "Run the playbook matching triage's primary failure (default `jobdiagd diagnose` without --playbook).",
            )
        data = await fetch_heartbeat(env)
        accused = accused_hosts(env)
        judged = judge_heartbeat(data, accused, sorted(set(env.disc.hosts)), env.profile, env.th)
        return render_heartbeat(env, data, judged, accused)
