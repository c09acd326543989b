"""Playbook 2: heartbeat false positive -- state of the accused hosts from (crash - heartbeat timeout) to the crash.

The accused hosts are judged in the window in which their heartbeats went missing, (crash - timeout, crash]:
a real death there (series stop well before the crash while peers go on, `up` == 0, all GPUs idle) makes
the timeout a true positive (dead-node). A long average ending at crash - timeout is not used: it is
dominated by earlier healthy training and hides a host that died just before or after that instant.
Hosts are matched by short name (log node list vs labels with a domain suffix).

Trigger: "Triage reports heartbeat-timeout". Without a heartbeat-timeout failure (or heartbeat record) in
triage the playbook does not apply: verdict healthy, the root cause says there is no heartbeat error in the
log, and no window is invented from the end of the data.
"""

from __future__ import annotations

from collections import Counter

from jobdiagd.tsdb.client import Sample
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
    host_of,
    iso,
    not_applicable,
    present,
    short_host,
)


def heartbeat_times(env: PlaybookEnv) -> tuple[float, float, float]:
    """(crash time, timeout, heartbeat-stop time) from triage, falling back to the end of the data."""
    hb = env.ctx.heartbeat
    crash = (hb.time if hb and hb.time else None) or env.ctx.incident_time or env.disc.max_time
    timeout = hb.timeout_s if hb and hb.timeout_s else None
    if timeout is None:
        raw = env.ctx.config.get("jax_distributed_heartbeat_timeout_seconds")
        timeout = (
            float(raw) if raw and raw.replace(".", "", 1).isdigit() else env.th.heartbeat_timeout_default_s
        )
    return crash, timeout, crash - timeout


def heartbeat_reported(env: PlaybookEnv) -> bool:
    """Playbook 2's trigger: triage reports a heartbeat-timeout."""
    ctx = env.ctx
    return (
        ctx.primary_class == "heartbeat-timeout"
        or ctx.heartbeat is not None
        or any(f.cls == "heartbeat-timeout" for f in ctx.failures)
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
        crash, timeout, stop = heartbeat_times(env)
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
        util, power = by_gpu(r.get("util", [])), by_gpu(r.get("power", []))
        tcp, io, mem = by_host(r.get("tcp", [])), by_host(r.get("io", [])), by_host(r.get("mem", []))
        oom, dmesg, samples = (
            by_host(r.get("oom", [])),
            by_host(r.get("dmesg", [])),
            by_host(r.get("samples", [])),
        )
        seen = by_host_max(r.get("seen", []))
        up_down = sorted({host_of(x.labels) for x in r.get("up_min", []) if x.v < 0.5})
        prof, th = env.profile, env.th
        states = {k: gpu_state(util.get(k), power.get(k), prof, th) for k in set(util) | set(power)}
        accused = accused_hosts(env)
        hosts = sorted(set(env.disc.hosts))

        def host_summary(h: str) -> str:
            c = Counter(s for (hh, _), s in states.items() if hh == h)
            return ", ".join(f"{n} {s}" for s, n in c.most_common()) or "no GPU samples"

        table = EvidenceTable(
            f"Host state from heartbeat-stop time {iso(stop)} to crash {iso(crash)} (timeout {timeout:.0f} s)",
            f"avg_over_time(...[{dur(ws)}]) at {iso(at_state)}; liveness (last sample, up, samples) over [{dur(w)}] at {iso(at)}",
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
            hu = [v for (hh, _), v in util.items() if hh == h]
            hp = [v for (hh, _), v in power.items() if hh == h]
            table.rows.append(
                (
                    h,
                    "yes" if h in accused else "",
                    host_summary(h),
                    fmt(sum(hu) / len(hu) if hu else None),
                    fmt(sum(hp) / len(hp) if hp else None),
                    fmt(tcp.get(h), digits=2),
                    fmt(io.get(h)),
                    fmt(100 * mem[h], "%") if h in mem else "n/a",
                    fmt(oom.get(h), digits=0),
                    fmt(dmesg.get(h), digits=0),
                    iso(seen[h]) if h in seen else "none in window",
                )
            )

        tl = env.disc.timeline
        last_before = None
        if not tl.empty:
            pts = [p for p in tl.points if p.t <= stop]
            last_before = pts[-1] if pts else None
        stall = (stop - last_before.t) if last_before else None
        st = tl.median_step_time() or 30.0
        progressing = stall is not None and stall <= max(5 * st, 300.0)
        # Metrics that end well before the crash (while the newest peer goes on) mean the host died in or
        # before the heartbeat window; the job's own end stops everyone at the crash.
        ref = min(at, max(seen.values(), default=at))
        margin = max(3 * 10.0, 30.0)
        stopped = {h: seen.get(h) for h in (accused or hosts) if seen and seen.get(h, 0.0) < ref - margin}
        dead = [
            h
            for h in (accused or hosts)
            if samples.get(h, 0) == 0
            or h in stopped
            or h in up_down
            or oom.get(h, 0) > 0.5
            or dmesg.get(h, 0) > 0.5
        ]
        idle_accused = [
            h
            for h in accused
            if states
            and all(s == "idle" for (hh, _), s in states.items() if hh == h)
            and any(hh == h for hh, _ in states)
        ]
        acc_states = Counter(s for (hh, _), s in states.items() if not accused or hh in accused)
        n_acc = max(1, sum(acc_states.values()))

        anomalous: list[str] = []
        chain: list[str] = []
        if dead or idle_accused:
            verdict = "dead-node"
            anomalous = sorted(set(dead) | set(idle_accused))
            why = []
            for h in anomalous:
                if oom.get(h, 0) > 0.5:
                    why.append(f"{h}: OOM kill")
                elif dmesg.get(h, 0) > 0.5:
                    why.append(f"{h}: GPU driver errors in dmesg")
                elif h in stopped or samples.get(h, 0) == 0:
                    t_last = stopped.get(h)
                    why.append(
                        f"{h}: metrics stop at {iso(t_last)}, {crash - t_last:.0f} s before the crash (heartbeat-stop time {iso(stop)}) while the other hosts kept reporting"
                        if t_last
                        else f"{h}: no metrics in the heartbeat window"
                    )
                elif h in up_down:
                    why.append(f"{h}: scrape target down (up == 0) in the heartbeat window")
                else:
                    why.append(f"{h}: GPUs idle")
            root = "The heartbeat timeout was a true positive: " + "; ".join(why) + "."
            chain = [
                f"{', '.join(anomalous)} died (metrics stop / target down / GPUs idle)",
                "its heartbeats stop",
                f"coordinator kills the job after the {timeout:.0f} s timeout",
            ]
        elif (
            not progressing
            and stall is not None
            and stall >= th.stall_min_s
            and acc_states.get("busy-wait", 0) / n_acc >= 0.5
        ):
            verdict = "hang-then-heartbeat"
            root = (
                f"Training had stalled {stall / 60:.0f} min before the heartbeats stopped (last step {last_before.step if last_before else '?'}), "
                "and the GPUs were spinning at busy-wait power: an RCCL hang came first; the heartbeat timeout (gRPC deadlock after a long hang) was only the kill mechanism."
            )
            chain = [
                "RCCL/NCCL collective hang",
                "GPUs busy-wait, no step progress",
                "gRPC channel deadlock after a long hang",
                "heartbeat timeout kills the job",
            ]
        else:
            verdict = "heartbeat-false-positive"
            if last_before is None:
                root = "No training step had completed: init-phase kill -- the heartbeat timeout is shorter than XLA compilation + initial checkpoint time. Increase it."
            else:
                root = (
                    f"Between the heartbeat-stop time and the crash the accused hosts ({', '.join(accused) or 'all'}) were alive and training "
                    f"({acc_states.get('training', 0)}/{n_acc} GPUs at training power; last step {last_before.step} {int(stall or 0)} s earlier), "
                    "TCP retransmits near zero and no I/O pressure. Root cause: the shared gRPC channel bug (docs/jax-heartbeat-false-positive-postmortem.md)."
                )
            chain = [
                "gRPC channel blocks heartbeat RPCs",
                "coordinator declares healthy tasks dead",
                "job killed",
            ]
        findings = [
            Finding(
                "Accused hosts from heartbeat-stop time to crash",
                root,
                "critical" if verdict != "heartbeat-false-positive" else "warning",
                tuple(accused),
                [table],
            )
        ]
        nxt = {
            "heartbeat-false-positive": [
                "Increase jax_distributed_heartbeat_timeout_seconds to several hours (e.g. 14400).",
                "Rely on step-progress hang detection (jobdiagd) rather than heartbeats.",
            ],
            "hang-then-heartbeat": [
                "Treat as a hang: run --playbook hang for the stall window.",
                "Raising the heartbeat timeout only delays the kill; fix the hang.",
            ],
            "dead-node": [
                f"Investigate {', '.join(anomalous)} (dmesg, --playbook oom / --playbook hardware)."
            ],
        }[verdict]
        corr = f"Triage reported heartbeat-timeout accusing {', '.join(accused) or 'unknown tasks'}; TSDB verdict: {verdict}."
        return PlaybookResult(
            self.name,
            self.analysis_type,
            verdict,
            (stop, at),
            findings,
            anomalous,
            root,
            chain,
            nxt,
            corr,
        )
