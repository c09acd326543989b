"""Playbook 3: host OOM -- memory trajectory (ramp / spike / periodic), replica-0 pattern, all-nodes pattern.

checkpoint-oom needs the fatal excursion (the last one before each OOM kill) to line up with a checkpoint
step, or the DP-replica-0-only pattern; earlier save spikes that recovered do not make a later OOM a
checkpoint OOM. All nodes spiking together away from any checkpoint step is rule PB-OOM-4's "data pipeline
issue or XLA recompilation event": reported in the host-OOM family (host-oom-ramp, the fixed set's only
non-checkpoint host-OOM verdict) with a root cause that says it was a simultaneous spike, not a leak.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from jobdiagd.tsdb.align import checkpoint_steps
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
    iso,
    linear_fit,
    median,
    short_host,
)


def excursions(
    points: Sequence[tuple[float, float]], base: float, min_rise: float
) -> list[tuple[float, float, float]]:
    """(start, end, peak) of periods where the value rises >= min_rise above `base`."""
    out: list[tuple[float, float, float]] = []
    cur: list[tuple[float, float]] = []
    for t, v in points:
        if v - base >= min_rise:
            cur.append((t, v))
        elif cur:
            out.append((cur[0][0], cur[-1][0], max(x for _, x in cur)))
            cur = []
    if cur:
        out.append((cur[0][0], cur[-1][0], max(x for _, x in cur)))
    return out


def classify_trajectory(
    points: Sequence[tuple[float, float]],
    *,
    ckpt_times: Sequence[float],
    tol_s: float,
    min_r2: float,
    min_growth: float,
    spike: float,
) -> tuple[str, str]:
    """Pattern of one host's memory fraction series: ramp | periodic | spike | flat."""
    if len(points) < 4:
        return "flat", "too few samples"
    slope, r2 = linear_fit(points)
    span = points[-1][0] - points[0][0]
    growth = slope * span
    base = median(v for _, v in points)
    exc = excursions(points, base, spike)
    at_ckpt = [e for e in exc if any(e[0] - tol_s <= c <= e[1] + tol_s for c in ckpt_times)]
    if r2 >= min_r2 and growth >= min_growth:
        return "ramp", f"linear growth {growth * 100:.0f}% of RAM over {span / 60:.0f} min (R^2={r2:.2f})"
    if len(exc) >= 2:
        kind = "periodic (checkpoint)" if len(at_ckpt) >= max(1, len(exc) // 2) else "periodic"
        return (
            "periodic",
            f"{len(exc)} excursions of >= {spike * 100:.0f}% RAM that recover, {len(at_ckpt)} at checkpoint steps: {kind}",
        )
    if len(exc) == 1:
        e = exc[0]
        where = "at a checkpoint step" if at_ckpt else "not at a checkpoint step"
        return "spike", f"single spike to {e[2] * 100:.0f}% at {iso(e[0])} ({where})"
    return "flat", f"no growth (slope {slope * 3600 * 100:.1f}%/h)"


class OomPlaybook:
    name = "oom"
    analysis_type = "oom"

    async def run(self, env: PlaybookEnv) -> PlaybookResult:
        lo, hi = env.disc.min_time, env.disc.max_time
        full = dur(hi - lo + 60)
        step = max(15.0, (hi - lo) / 400)
        frac_q = "max by (host) (ray_node_mem_used) / max by (host) (ray_node_mem_total)"
        series = []
        if env.disc.has("ray_node_mem_used"):
            series = await env.client.query_range(frac_q, lo, hi, step)
        inst = {}
        if env.disc.has("hw_oom_kills_total"):
            inst = await env.arms(
                {
                    "oom": f"increase(hw_oom_kills_total[{full}])",
                    "oom_last": f"last_over_time(hw_oom_kills_total[{full}])",
                },
                hi,
            )
        oom = by_host(inst.get("oom", []))
        fr = {host_of(s.labels): [(t, v) for t, v in s.points if not math.isnan(v)] for s in series}
        th = env.th
        oom_hosts = sorted(h for h, v in oom.items() if v > 0.5)
        if not oom_hosts:
            oom_hosts = sorted(
                h for h, pts in fr.items() if pts and max(v for _, v in pts) >= th.mem_oom_fraction
            )
        if not oom_hosts:
            oom_hosts = sorted(
                {short_host(f.host) for f in env.ctx.failures if f.host and f.cls.startswith("oom")} & set(fr)
            )

        tl = env.disc.timeline
        period = env.ctx.checkpoint_period
        ck_steps = sorted(
            s
            for s in checkpoint_steps((p.step for p in tl.points), period, False)
            if period and s % period == 0
        )
        ck_times = [t for t in (tl.time_of_step(s) for s in ck_steps) if t is not None]
        st = tl.median_step_time() or 30.0

        patterns: dict[str, tuple[str, str]] = {}
        for h, pts in fr.items():
            # Up to the OOM (the series' last sample) only; the window after the kill is not part of the trajectory.
            patterns[h] = classify_trajectory(
                pts,
                ckpt_times=ck_times,
                tol_s=2 * st + step,
                min_r2=th.ramp_min_r2,
                min_growth=th.ramp_min_growth_fraction,
                spike=th.spike_min_fraction,
            )
        peaks = {h: max((v for _, v in pts), default=0.0) for h, pts in fr.items()}
        table = EvidenceTable(
            "Host memory trajectory (ray_node_mem_used / ray_node_mem_total)",
            f"{frac_q} over {iso(lo)}..{iso(hi)} step {step:.0f}s; increase(hw_oom_kills_total[{full}])",
            ("Host", "start", "peak", "end", "pattern", "detail", "OOM kills"),
        )
        for h in sorted(fr):
            pts = fr[h]
            table.rows.append(
                (
                    h,
                    fmt(100 * pts[0][1], "%") if pts else "n/a",
                    fmt(100 * peaks[h], "%"),
                    fmt(100 * pts[-1][1], "%") if pts else "n/a",
                    patterns[h][0],
                    patterns[h][1],
                    fmt(oom.get(h, 0.0), digits=0),
                )
            )

        # DP replica 0 = the first NNODES / dcn_data_parallelism nodes (MaxText saves from replica 0 only).
        dcn = env.ctx.config.get("dcn_data_parallelism", "")
        nodes = [short_host(n) for n in env.ctx.nodes] or sorted(fr)
        replica0: set[str] = set()
        if dcn.isdigit() and int(dcn) > 1:
            replica0 = set(nodes[: max(1, len(nodes) // int(dcn))])
        spiky = sorted(h for h, p in patterns.items() if p[0] in ("periodic", "spike"))
        replica0_pattern = bool(replica0) and bool(spiky) and set(spiky) <= replica0
        all_nodes = len(oom_hosts) >= max(2, len(fr)) and len(fr) > 1

        findings = [Finding("Memory trajectory", "", "info", tuple(oom_hosts), [table])]
        anomalous = oom_hosts
        chain: list[str] = []
        target = oom_hosts or sorted(peaks, key=lambda h: -peaks[h])[:1]
        pat = patterns.get(target[0], ("flat", ""))[0] if target else "flat"
        # The fatal excursion of each target host: the last one before its series ends.
        fatal: dict[str, tuple[float, float, float]] = {}
        for h in target:
            pts = fr.get(h, [])
            exc = excursions(pts, median(v for _, v in pts), th.spike_min_fraction) if pts else []
            if exc:
                fatal[h] = exc[-1]
        tol = 2 * st + step
        fatal_at_ckpt = {h: any(e[0] - tol <= c <= e[1] + tol for c in ck_times) for h, e in fatal.items()}
        ck_related = bool(fatal) and all(fatal_at_ckpt.values())
        starts = sorted(e[0] for e in fatal.values())
        simultaneous = (
            all_nodes and len(fatal) == len(target) and bool(starts) and starts[-1] - starts[0] <= tol
        )
        spike_step = None
        if starts:
            before = [p.step for p in tl.points if p.t <= starts[0]]
            spike_step = (before[-1] + 1) if before else None
        if not oom_hosts:
            verdict = "healthy"
            root = f"No host OOM in the metrics: no hw_oom_kills_total increase, peak memory {fmt(100 * max(peaks.values(), default=0), '%')}."
        elif pat == "ramp":
            verdict = "host-oom-ramp"
            root = f"Gradual memory ramp on {', '.join(oom_hosts)} until the OOM kill: a leak (Python objects, data pipeline buffers or an unbounded XLA compilation cache)."
            chain = [
                "memory leak",
                f"host RAM exhausted on {', '.join(oom_hosts)}",
                "OOM killer",
                "job fails",
            ]
        elif simultaneous and not ck_related:
            verdict = "host-oom-ramp"
            where = f"around step {spike_step}" if spike_step is not None else f"at {iso(starts[0])}"
            root = (
                f"All {len(target)} nodes ({', '.join(target)}) spiked together {where}, not a checkpoint step "
                f"(checkpoint_period {period}), and were OOM-killed: a simultaneous spike, not a leak and not a "
                "checkpoint save -- likely a data pipeline issue (loading burst) or an XLA recompilation event "
                "allocating new host buffers."
            )
            chain = [
                f"all-node host memory spike {where} (data pipeline burst / XLA recompilation)",
                "host RAM exhausted on every node at once",
                "OOM killer on all nodes",
                "job fails",
            ]
        elif ck_related or (replica0_pattern and set(oom_hosts) <= replica0):
            verdict = "checkpoint-oom"
            root = (
                f"Memory spikes at checkpoint saves on {', '.join(spiky or oom_hosts)}"
                + (
                    " (DP replica #0 nodes only: ~2x model size in host RAM during saves)"
                    if replica0_pattern
                    else ""
                )
                + "; one cycle exceeded the available RAM."
            )
            chain = ["checkpoint save (D2H copy of parameters)", "host RAM peak", "OOM killer"]
        else:
            verdict = "host-oom-ramp"
            root = f"Sudden memory spike on {', '.join(oom_hosts)} not aligned with a checkpoint: data-loading burst or XLA recompilation."
            if pat == "periodic":
                root = (
                    f"Memory excursions on {', '.join(oom_hosts)}; the fatal one was not at a checkpoint step: "
                    "data-loading burst or XLA recompilation rather than a checkpoint save."
                )
            chain = ["memory spike", "OOM killer"]
        if all_nodes and not simultaneous:
            root += (
                " All nodes hit the limit together: suspect the data pipeline or an XLA recompilation event."
            )
        if replica0_pattern:
            findings.append(
                Finding(
                    "DP replica #0 pattern",
                    f"Only replica-0 nodes ({', '.join(sorted(replica0))}) show save spikes -- expected for MaxText checkpointing.",
                    "info",
                    tuple(sorted(replica0)),
                )
            )
        findings[0].summary = root
        nxt = {
            "host-oom-ramp": [
                "Reduce per_device_batch_size or enable remat_policy=full.",
                "Profile host memory growth (data pipeline, compilation cache).",
            ],
            "checkpoint-oom": [
                "Budget ~2x model size of host RAM on replica-0 nodes, or use async/streaming checkpointing.",
                "Check for a checkpoint memory spike on DP replica #0.",
            ],
            "healthy": ["No OOM evidence in the TSDB; check dmesg on the failed node."],
        }[verdict]
        return PlaybookResult(
            playbook=self.name,
            analysis_type=self.analysis_type,
            verdict=Verdict(verdict),
            window=(lo, hi),
            findings=findings,
            anomalous_hosts=anomalous,
            root_cause=root,
            chain=chain,
            next_steps=nxt,
        )
