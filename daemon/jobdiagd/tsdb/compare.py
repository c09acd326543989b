"""Multi-job comparison: config diff, fresh vs restored, step-aligned overlap, steady-state metric sweep, restore-leak check.

A per-node hw_procs_running delta (some hosts differ, the rest do not) points to background processes or
a different node allocation (runbook): those hosts are reported anomalous and named in the root cause. The
verdict stays `healthy` because the fixed verdict set has no per-node CPU-contention mechanism and the only
procs-based verdict, restore-resource-leak, asserts the uniform restore-leak signature a per-node delta
refutes; anomalous_hosts and root_cause carry the finding.

Config differences are part of the root cause ("the metric comparison should account for the config
change"): when parameters that change the work per step differ (batch size, sequence length, remat
policy, parallelism, node count, ...) and no system source explains the TGS gap, the root cause names the
config change as its explanation (verdict healthy: no system failure); when a system source is found, the
config change is still named as a confounder.

Jobs without overlapping steps cannot be compared by step: the verdict is null (no value of the fixed set
is meaningful) and the root cause says so. The communicator-wave log evidence "confirms the leaked
communicators" only for a job that ran with enable_single_replica_ckpt_restoring=true.

The JSON has the same top-level keys as a diagnosis (analysis_type, time_window, nodes, verdict,
anomalous_hosts, findings, root_cause) plus the comparison's own (jobs, config_diff, overlap, tgs,
metrics, ...). time_window holds each job's wall-clock span of the compared steps (null without overlap).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from jobdiagd.tsdb.access import NoTsdb, SshTunnelPool, open_tsdb
from jobdiagd.tsdb.align import StepPoint, Timeline, checkpoint_steps, timeline_from_log
from jobdiagd.tsdb.client import PromClient, multi_arm, split_arms_series
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.discovery import Discovery, WrongDatabase, discover
from jobdiagd.tsdb.logevidence import head_worker_waves
from jobdiagd.tsdb.playbooks.base import Verdict, fmt, host_of, iso, short_host
from jobdiagd.tsdb.settings import TsdbSettings

# (key, label, range-query expression, unit)
SWEEP: tuple[tuple[str, str, str, str], ...] = (
    ("procs", "hw_procs_running", "avg by (host) (hw_procs_running)", ""),
    ("blocked", "hw_procs_blocked", "avg by (host) (hw_procs_blocked)", ""),
    ("cpu", "ray_node_cpu_utilization", "avg by (host) (ray_node_cpu_utilization)", "%"),
    ("tcp", "rate(hw_tcp_retransmits_total[5m])", "sum by (host) (rate(hw_tcp_retransmits_total[5m]))", "/s"),
    (
        "rdma",
        "rate(hw_rdma_tx_retx_pkts_total[5m])",
        "sum by (host) (rate(hw_rdma_tx_retx_pkts_total[5m]))",
        "/s",
    ),
    ("io", "hw_io_pressure_full_pct", "avg by (host) (hw_io_pressure_full_pct)", "%"),
    ("dirty", "hw_mem_dirty_bytes (GB)", "avg by (host) (hw_mem_dirty_bytes) / 1e9", ""),
    (
        "mem",
        "host RAM used %",
        "max by (host) (ray_node_mem_used) / max by (host) (ray_node_mem_total) * 100",
        "%",
    ),
    ("temp", "hw_gpu_temperature_celsius (max)", "max by (host) (hw_gpu_temperature_celsius)", "C"),
    ("sclk", "hw_gpu_clock_mhz sclk", 'avg by (host) (hw_gpu_clock_mhz{type="sclk"})', "MHz"),
    ("power", "hw_gpu_power_watts", "avg by (host) (hw_gpu_power_watts)", "W"),
    ("util", "ray_node_gpus_utilization", "avg by (host) (ray_node_gpus_utilization)", "%"),
)
# Smallest absolute delta that counts as a difference, per family.
FLOORS = {
    "procs": 0.5,
    "blocked": 0.5,
    "cpu": 2.0,
    "tcp": 0.5,
    "rdma": 0.5,
    "io": 1.0,
    "dirty": 0.5,
    "mem": 2.0,
    "temp": 2.0,
    "sclk": 20.0,
    "power": 10.0,
    "util": 2.0,
}
CAUSE_HINTS = {
    "procs": "CPU contention (leaked threads / background processes)",
    "blocked": "processes blocked on I/O",
    "cpu": "CPU load",
    "tcp": "TCP path (NFS, gRPC)",
    "rdma": "RDMA link degradation",
    "io": "storage I/O contention",
    "dirty": "write-back pressure",
    "mem": "host memory (rarely affects GPU compute)",
    "temp": "thermal",
    "sclk": "clock throttling (symptom)",
    "power": "GPU power (symptom)",
    "util": "GPU utilization (symptom)",
}


@dataclass
class JobSide:
    ctx: DiagnosisContext
    timeline: Timeline
    disc: Discovery | None = None
    client: PromClient | None = None
    note: str = ""


@dataclass
class Comparison:
    a: JobSide
    b: JobSide
    config_diff: list[tuple[str, str, str]] = field(default_factory=list)
    overlap: tuple[int, int] | None = None
    rows: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    tgs: dict[str, Any] = field(default_factory=dict)
    procs: dict[str, Any] = field(default_factory=dict)
    verdict: str | None = Verdict.HEALTHY
    root_cause: str = ""
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)  # wall-clock span of compared steps
    notes: list[str] = field(default_factory=list)
    queries: int = 0
    waves: tuple[int | None, int | None] = (None, None)
    anomalous_hosts: list[str] = field(default_factory=list)


# Parameters that change the work per step or its distribution (and so TGS) -- substrings of the name.
PERF_CONFIG_KEYS = (
    "batch_size",
    "target_length",
    "seq_len",
    "remat",
    "parallelism",
    "nnodes",
    "model_name",
    "dtype",
    "quantization",
    "attention",
    "num_experts",
    "capacity_factor",
    "sparse_matmul",
    "megablox",
    "scan_layers",
    "gradient_accumulation",
    "fused",
)


def perf_config_diff(rows: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The config differences that change throughput (not steps, checkpointing or paths)."""
    return [r for r in rows if any(k in r[0].lower() for k in PERF_CONFIG_KEYS)]


def single_replica_restore(ctx: DiagnosisContext) -> bool:
    return ctx.single_replica_restore


def config_diff(a: DiagnosisContext, b: DiagnosisContext) -> list[tuple[str, str, str]]:
    rows = []
    for k in sorted(set(a.config) | set(b.config)):
        va, vb = a.config.get(k, "(unset)"), b.config.get(k, "(unset)")
        if va != vb:
            rows.append((k, va, vb))
    na, nb = a.nnodes or len(a.nodes), b.nnodes or len(b.nodes)
    if na != nb:
        rows.append(("NNODES", str(na), str(nb)))
    return rows


def steady_points(tl: Timeline, ctx: DiagnosisContext, lo: int, hi: int) -> list[StepPoint]:
    ck = checkpoint_steps((p.step for p in tl.points), ctx.checkpoint_period, ctx.async_checkpointing)
    return [p for p in tl.points if lo <= p.step <= hi and p.step not in ck]


def intervals(tl: Timeline, pts: list[StepPoint]) -> list[tuple[float, float]]:
    """Wall-clock spans of the kept steps (each from the previous step's completion to its own)."""
    prev = {p.step: q.t for q, p in zip(tl.points, tl.points[1:], strict=False)}
    return [(prev.get(p.step, p.t - (p.step_time or 0.0)), p.t) for p in pts]


def _mask(points: list[tuple[float, float]], spans: list[tuple[float, float]]) -> list[float]:
    spans = sorted(spans)
    out = []
    j = 0
    for t, v in points:
        while j < len(spans) and spans[j][1] < t:
            j += 1
        if j < len(spans) and spans[j][0] <= t <= spans[j][1] and not math.isnan(v):
            out.append(v)
    return out


async def sweep(side: JobSide, spans: list[tuple[float, float]]) -> dict[str, dict[str, float]]:
    """Per-family, per-host mean over the steady spans only (checkpoint steps and warmup masked out)."""
    if side.client is None or side.disc is None or not spans:
        return {}
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    step = max(15.0, (hi - lo) / 400)
    expr = multi_arm({k: q for k, _, q, _ in SWEEP})
    res = split_arms_series(await side.client.query_range(expr, lo, hi, step))
    out: dict[str, dict[str, float]] = {}
    for key, series in res.items():
        for s in series:
            vals = _mask(list(s.points), spans)
            if vals:
                out.setdefault(key, {})[host_of(s.labels)] = sum(vals) / len(vals)
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def analyse(
    cmp: Comparison, sa: dict[str, dict[str, float]], sb: dict[str, dict[str, float]], settings: TsdbSettings
) -> None:
    system = _analyse(cmp, sa, sb, settings)
    perf = perf_config_diff(cmp.config_diff)
    if not perf:
        return
    changes = ", ".join(f"{k} {a} -> {b}" for k, a, b in perf)
    gap = cmp.tgs.get("delta_pct")
    gap_txt = f"TGS gap {gap:+.2f}%" if gap is not None else "the throughput difference"
    if system:
        cmp.root_cause += (
            f" Config also differs ({changes}): part of {gap_txt} may come from the config change, "
            "not only from the system difference."
        )
    else:
        cmp.root_cause = (
            f"Config change explains {gap_txt}: {changes} -- these change the work per step (tokens per device, "
            "recomputation, parallel layout), so TGS is not directly comparable; no system metric differs "
            "systematically between the jobs."
            + (f" ({cmp.root_cause})" if cmp.root_cause.startswith("Differences in") else "")
        )


def _analyse(
    cmp: Comparison, sa: dict[str, dict[str, float]], sb: dict[str, dict[str, float]], settings: TsdbSettings
) -> bool:
    """The system-metric analysis; True when it found a system source of the difference."""
    th = settings.thresholds
    for key, label, _, unit in SWEEP:
        if key not in sa and key not in sb:
            continue
        va, vb = _mean(list(sa.get(key, {}).values())), _mean(list(sb.get(key, {}).values()))
        delta = vb - va
        rel = abs(delta) / max(abs(va), 1e-9) if not math.isnan(va) else float("nan")
        hint = (
            CAUSE_HINTS[key]
            if (not math.isnan(rel) and rel >= 0.05 and abs(delta) >= FLOORS[key])
            else "same"
        )
        cmp.rows.append((label, fmt(va, unit, 2), fmt(vb, unit, 2), f"{delta:+.2f}", hint))
    pa, pb = sa.get("procs", {}), sb.get("procs", {})
    if pa and pb:
        base_a = statistics.median(pa.values())
        common = set(pa) & set(pb)
        deltas = (
            [pb[h] - pa[h] for h in common]
            if len(common) >= max(1, len(pb) // 2)
            else [v - base_a for v in pb.values()]
        )
        md = statistics.median(deltas)
        cv = statistics.pstdev(deltas) / abs(md) if md else math.inf
        uniform = cv <= th.procs_uniform_max_cv and all((d > 0) == (md > 0) for d in deltas)
        cmp.procs = {
            "delta_median": md,
            "cv": cv,
            "uniform": uniform,
            "per_host_delta": {h: pb[h] - pa.get(h, base_a) for h in pb},
            "paired": len(common) > 0,
        }
    ta, tb = cmp.tgs.get("a_mean"), cmp.tgs.get("b_mean")
    ra, rb = cmp.a.ctx.restored_from_step, cmp.b.ctx.restored_from_step
    md = cmp.procs.get("delta_median", 0.0)
    leak_side = "b" if md > 0 else "a"
    restored_side = "b" if rb is not None and ra is None else ("a" if ra is not None and rb is None else None)
    if (
        cmp.procs
        and abs(md) >= th.procs_leak_min_delta
        and cmp.procs["uniform"]
        and restored_side == leak_side
    ):
        cmp.verdict = Verdict.RESTORE_RESOURCE_LEAK
        job = cmp.b if leak_side == "b" else cmp.a
        cmp.root_cause = (
            f"hw_procs_running is uniformly {abs(md):.1f} higher on every host of {job.ctx.label} (restored from step "
            f"{job.ctx.restored_from_step}): leaked RCCL communicators and polling threads from the single-replica restore "
            "(Orbax _merge_globalized_replicas -> jax.jit(jnp.sum) all-reduce -> new GpuCliqueKey cached forever). "
            "Training metrics are identical; the constant CPU contention explains the TGS gap. jax.clear_caches() does not help; "
            "use the dispatcher path (jax.device_put)."
        )
        return True
    rdma_a, rdma_b = _mean(list(sa.get("rdma", {}).values())), _mean(list(sb.get("rdma", {}).values()))
    io_a, io_b = _mean(list(sa.get("io", {}).values())), _mean(list(sb.get("io", {}).values()))
    if (
        ta
        and tb
        and not math.isnan(rdma_a)
        and not math.isnan(rdma_b)
        and abs(rdma_b - rdma_a) >= th.rdma_retx_min_per_s * 5
    ):
        cmp.verdict = Verdict.RDMA_DEGRADATION
        worse = cmp.b if rdma_b > rdma_a else cmp.a
        cmp.root_cause = f"{worse.ctx.label} ran with far more RDMA retransmits ({max(rdma_a, rdma_b):.1f}/s vs {min(rdma_a, rdma_b):.1f}/s)."
        return True
    if not math.isnan(io_a) and not math.isnan(io_b) and abs(io_b - io_a) >= th.io_pressure_full_pct:
        cmp.verdict = Verdict.IO_CONTENTION
        cmp.root_cause = f"I/O pressure differs ({io_a:.1f}% vs {io_b:.1f}%)."
        return True
    diff = [r for r in cmp.rows if r[4] != "same"]
    gap = cmp.tgs.get("delta_pct")
    per_node = (
        sorted(h for h, d in cmp.procs["per_host_delta"].items() if abs(d - md) >= th.procs_leak_min_delta)
        if cmp.procs and not cmp.procs["uniform"]
        else []
    )
    if per_node:
        per = cmp.procs["per_host_delta"]
        others = [d for h, d in per.items() if h not in per_node]
        cmp.anomalous_hosts = per_node
        cmp.root_cause = (
            "Per-node hw_procs_running delta (B - A): "
            + ", ".join(f"{h} {per[h]:+.1f}" for h in per_node)
            + (f" vs {statistics.median(others):+.1f} on the other hosts" if others else "")
            + ": background processes or a different node allocation on "
            + ", ".join(per_node)
            + " (not the uniform restore-leak signature). CPU contention there slows every collective"
            + (f"; TGS gap {gap:+.2f}%" if gap is not None else "")
            + "."
        )
        return True
    if cmp.procs and abs(md) >= th.procs_leak_min_delta:
        cmp.root_cause = f"hw_procs_running differs by {md:+.1f} per host ({'uniform' if cmp.procs['uniform'] else 'per-node'}): CPU contention."
        return True
    if diff:
        cmp.root_cause = (
            "Differences in: "
            + ", ".join(r[0] for r in diff)
            + (f"; TGS gap {gap:+.2f}%" if gap is not None else "")
        )
    else:
        cmp.root_cause = "No systematic difference between the jobs" + (
            f" (TGS gap {gap:+.2f}%)" if gap is not None else ""
        )
    return False


async def _open_side(
    stack: contextlib.AsyncExitStack,
    ctx: DiagnosisContext,
    settings: TsdbSettings,
    *,
    now: float,
    tunnels: SshTunnelPool | None,
) -> JobSide:
    """One job of the comparison: its TSDB (kept open on `stack`) and timeline, or its log only."""
    side = JobSide(ctx, timeline_from_log(ctx.steps))
    try:
        handle = await stack.enter_async_context(open_tsdb(ctx, settings, now=now, tunnels=tunnels))
        disc = await discover(handle, ctx, settings)
        if disc.crosscheck.status == "mismatch":
            raise WrongDatabase(
                f"wrong TSDB for {ctx.label} at {handle.client.label}: {disc.crosscheck.detail}"
            )
        side.disc, side.client = disc, handle.client
        if not disc.timeline.empty:
            side.timeline = disc.timeline
        side.note = f"{handle.mode} ({handle.client.label}); cross-check {disc.crosscheck.status}"
    except NoTsdb as exc:
        side.note = f"no TSDB ({exc}): log-based data only"
    return side


async def compare(
    ctx_a: DiagnosisContext,
    ctx_b: DiagnosisContext,
    settings: TsdbSettings,
    *,
    now: float,
    tunnels: SshTunnelPool | None = None,
) -> Comparison:
    async with contextlib.AsyncExitStack() as stack:
        sides = [await _open_side(stack, ctx, settings, now=now, tunnels=tunnels) for ctx in (ctx_a, ctx_b)]
        cmp = Comparison(sides[0], sides[1])
        cmp.config_diff = config_diff(ctx_a, ctx_b)
        cmp.waves = (
            head_worker_waves(ctx_a.job_dir, ctx_a.head_node),
            head_worker_waves(ctx_b.job_dir, ctx_b.head_node),
        )
        ta, tb = cmp.a.timeline, cmp.b.timeline
        if ta.empty or tb.empty:
            cmp.notes.append("one job has no step timeline: no step-aligned comparison")
            cmp.verdict = None
            cmp.root_cause = (
                "The jobs cannot be compared by step: "
                + ", ".join(s.ctx.label for s in (cmp.a, cmp.b) if s.timeline.empty)
                + " has no step timeline (neither TSDB tb_* metrics nor completed steps in the log)."
            )
            return cmp
        lo = max(ta.first_step or 0, tb.first_step or 0) + settings.thresholds.warmup_steps
        hi = min(ta.last_step or 0, tb.last_step or 0)
        if hi <= lo:
            cmp.notes.append(
                f"no overlapping steps (A {ta.first_step}-{ta.last_step}, B {tb.first_step}-{tb.last_step})"
            )
            cmp.verdict = None
            cmp.root_cause = (
                f"The jobs cannot be compared by step: no overlapping steps after warmup (A {cmp.a.ctx.label} steps "
                f"{ta.first_step}-{ta.last_step}, B {cmp.b.ctx.label} steps {tb.first_step}-{tb.last_step}). "
                "Compare with a job that covers the same step range (runbook: align by step, not wall-clock time)."
            )
            return cmp
        cmp.overlap = (lo, hi)
        pa, pb = steady_points(ta, ctx_a, lo, hi), steady_points(tb, ctx_b, lo, hi)
        ga, gb = [p.tgs for p in pa if p.tgs], [p.tgs for p in pb if p.tgs]
        if ga and gb:
            ma, mb = _mean(ga), _mean(gb)
            cmp.tgs = {
                "a_mean": ma,
                "b_mean": mb,
                "a_stdev": statistics.pstdev(ga),
                "b_stdev": statistics.pstdev(gb),
                "delta_pct": 100 * (mb - ma) / ma if ma else None,
            }
        la = {p.step: p.loss for p in pa if p.loss is not None}
        lb = {p.step: p.loss for p in pb if p.loss is not None}
        common = sorted(set(la) & set(lb))
        if common:
            same = sum(1 for s in common if abs((la[s] or 0) - (lb[s] or 0)) <= 0.002)
            cmp.tgs["loss_identical_steps"] = f"{same}/{len(common)}"
        ia, ib = intervals(ta, pa), intervals(tb, pb)
        for key, iv in (("a", ia), ("b", ib)):
            if iv:
                cmp.spans[key] = (min(x for x, _ in iv), max(y for _, y in iv))
        sa = await sweep(cmp.a, ia)
        sb = await sweep(cmp.b, ib)
        analyse(cmp, sa, sb, settings)
        cmp.queries = sum(s.client.query_count for s in sides if s.client is not None)
        return cmp


def _window(span: tuple[float, float]) -> dict[str, Any]:
    return {
        "start": iso(span[0]),
        "end": iso(span[1]),
        "start_ts": span[0],
        "end_ts": span[1],
        "duration_s": span[1] - span[0],
    }


def side_hosts(s: JobSide) -> list[str]:
    return list(s.disc.hosts) if s.disc is not None else [short_host(n) for n in s.ctx.nodes]


def wave_text(c: Comparison) -> str:
    """The communicator-wave log evidence; "confirming the leak" only with single-replica restoring on."""
    wa, wb = c.waves
    if wa is None or wb is None or wa == wb:
        return ""
    more = c.b if wb > wa else c.a
    txt = f"{more.ctx.label} created an extra communicator wave"
    if single_replica_restore(more.ctx) and more.ctx.restored_from_step is not None:
        return txt + " (restore broadcast), confirming the leaked communicators."
    return (
        txt + " (it did not run a single-replica restore with enable_single_replica_ckpt_restoring=true: "
        "not the restore-leak signature)."
    )


def findings(c: Comparison) -> list[dict[str, Any]]:
    """The comparison's findings in the diagnosis' finding shape."""
    out: list[dict[str, Any]] = []

    def add(
        title: str,
        summary: str,
        severity: str = "info",
        hosts: list[str] | None = None,
        evidence: list[dict[str, Any]] | None = None,
    ) -> None:
        out.append(
            {
                "title": title,
                "summary": summary,
                "severity": severity,
                "hosts": hosts or [],
                "evidence": evidence or [],
            }
        )

    perf = perf_config_diff(c.config_diff)
    add(
        "Config differences",
        ("; ".join(f"{k}: {a} -> {b}" for k, a, b in c.config_diff) or "none")
        + (f". Throughput-relevant: {', '.join(k for k, _, _ in perf)}." if perf else ""),
        "warning" if perf else "info",
        evidence=[
            {
                "title": "Config differences",
                "query": "log config (PASSTHROUGH_ARGS)",
                "columns": ["Parameter", "Job A", "Job B"],
                "rows": [list(r) for r in c.config_diff],
            }
        ],
    )
    add(
        "Step alignment",
        f"overlapping steps {c.overlap[0]}-{c.overlap[1]}"
        if c.overlap
        else "; ".join(c.notes) or "no overlap",
        "info" if c.overlap else "warning",
    )
    if c.tgs.get("a_mean") is not None:
        add(
            "Throughput",
            f"TGS {c.tgs['a_mean']:.1f} (A) vs {c.tgs['b_mean']:.1f} (B): {c.tgs['delta_pct']:+.2f}%"
            + (
                f"; loss identical on {c.tgs['loss_identical_steps']} steps"
                if "loss_identical_steps" in c.tgs
                else ""
            ),
        )
    if c.rows:
        diff = [r for r in c.rows if r[4] != "same"]
        add(
            "Metric comparison",
            "Differences in: " + ", ".join(r[0] for r in diff) if diff else "No system metric differs.",
            "warning" if diff else "info",
            evidence=[
                {
                    "title": "Steady-state averages over overlapping steps",
                    "query": "; ".join(q for _, _, q, _ in SWEEP),
                    "columns": ["Metric", "Job A", "Job B", "Delta", "Likely cause"],
                    "rows": [list(r) for r in c.rows],
                }
            ],
        )
    if c.procs:
        add(
            "hw_procs_running delta per host (B - A)",
            ", ".join(f"{h} {d:+.1f}" for h, d in sorted(c.procs["per_host_delta"].items()))
            + f" -> {'uniform' if c.procs['uniform'] else 'per-node'} (cv {c.procs['cv']:.2f})",
            "warning" if c.anomalous_hosts or c.verdict == Verdict.RESTORE_RESOURCE_LEAK else "info",
            list(c.anomalous_hosts),
        )
    if wt := wave_text(c):
        add("Log evidence", wt)
    return out


def to_json(c: Comparison) -> dict[str, Any]:
    hosts_a, hosts_b = side_hosts(c.a), side_hosts(c.b)
    return {
        "analysis_type": "multi-job-comparison",
        "time_window": {
            "overlap_steps": list(c.overlap) if c.overlap else None,
            **{k: _window(v) for k, v in sorted(c.spans.items())},
        }
        if c.overlap
        else None,
        "nodes": {
            "count": len(set(hosts_a) | set(hosts_b)),
            "hosts": sorted(set(hosts_a) | set(hosts_b)),
            "a": hosts_a,
            "b": hosts_b,
        },
        "verdict": c.verdict,
        "anomalous_hosts": sorted(c.procs.get("per_host_delta", {}))
        if c.verdict == Verdict.RESTORE_RESOURCE_LEAK
        else list(c.anomalous_hosts),
        "findings": findings(c),
        "root_cause": c.root_cause,
        "jobs": {"a": c.a.ctx.label, "b": c.b.ctx.label},
        "access": {"a": c.a.note, "b": c.b.note},
        "start": {
            "a": f"restored from step {c.a.ctx.restored_from_step}"
            if c.a.ctx.restored_from_step is not None
            else "fresh",
            "b": f"restored from step {c.b.ctx.restored_from_step}"
            if c.b.ctx.restored_from_step is not None
            else "fresh",
        },
        "config_diff": [{"parameter": k, "a": a, "b": b} for k, a, b in c.config_diff],
        "overlap": list(c.overlap) if c.overlap else None,
        "tgs": c.tgs,
        "metrics": [
            {"metric": r[0], "a": r[1], "b": r[2], "delta": r[3], "likely_cause": r[4]} for r in c.rows
        ],
        "procs_running": c.procs,
        "notes": c.notes,
        "log_evidence": {"nccl_init_waves": {"a": c.waves[0], "b": c.waves[1]}},
        "queries": c.queries,
    }


def to_markdown(c: Comparison) -> str:
    A, B = c.a.ctx.label, c.b.ctx.label
    out = [f"## Multi-Job Comparison: {A} vs {B}", ""]
    for tag, s in (("A", c.a), ("B", c.b)):
        start = (
            f"restored from step {s.ctx.restored_from_step}"
            if s.ctx.restored_from_step is not None
            else "fresh start"
        )
        rng = f"steps {s.timeline.first_step}-{s.timeline.last_step}" if not s.timeline.empty else "no steps"
        out.append(f"- Job {tag} = {s.ctx.label}: {start}, {rng}; {s.note}")
    out += ["", "### Config differences", "| Parameter | Job A | Job B |", "|-----------|-------|-------|"]
    out += [f"| {k} | {a} | {b} |" for k, a, b in c.config_diff] or ["| (none) | | |"]
    out += [
        "",
        f"### Overlapping step range: {c.overlap[0]} to {c.overlap[1]}"
        if c.overlap
        else "### Overlapping step range: none",
    ]
    out += [f"> {n}" for n in c.notes]
    out += [
        "",
        "### Metric comparison (steady-state averages over overlapping steps)",
        "| Metric | Job A | Job B | Delta | Likely cause |",
        "|--------|-------|-------|-------|--------------|",
    ]
    if c.tgs.get("a_mean") is not None:
        out.append(
            f"| tb_perf_per_device_tokens_per_sec | {c.tgs['a_mean']:.1f} (sd {c.tgs['a_stdev']:.1f}) | {c.tgs['b_mean']:.1f} (sd {c.tgs['b_stdev']:.1f}) | {c.tgs['delta_pct']:+.2f}% | TGS |"
        )
    if "loss_identical_steps" in c.tgs:
        out.append(
            f"| tb_learning_loss (identical steps) | | | {c.tgs['loss_identical_steps']} | training-level identical if all |"
        )
    out += [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} |" for r in c.rows]
    if c.procs:
        out += [
            "",
            "hw_procs_running delta per host (B - A): "
            + ", ".join(f"{h} {d:+.1f}" for h, d in sorted(c.procs["per_host_delta"].items()))
            + f" -> {'uniform' if c.procs['uniform'] else 'per-node'} (cv {c.procs['cv']:.2f})",
        ]
    out += ["", f"**Verdict:** {c.verdict or 'n/a (not comparable by step)'}"]
    if c.anomalous_hosts:
        out += ["", f"**Anomalous hosts:** {', '.join(c.anomalous_hosts)}"]
    out += ["", "### Root cause", c.root_cause or "n/a", ""]
    wa, wb = c.waves
    if wa is not None or wb is not None:
        out += [
            "### Log evidence",
            f"NCCL/RCCL communicator-init waves in the head node's worker logs: {A} {wa}, {B} {wb}.",
        ]
        if wt := wave_text(c):
            out.append(wt)
        out.append("")
    return "\n".join(out)
