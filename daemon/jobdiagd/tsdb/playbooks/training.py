"""Playbook 7: training stability -- loss/grad/LR/MoE, step time and throughput, and the contention checklist.

A training-level event (MoE load-balance loss spike, gradient-norm spike, loss divergence/NaN) that starts
no later than a throughput regression which no contention source explains is reported as the root cause,
with the full chain (runbook: "MoE load balance loss spike -> ... uneven GPU utilization and TGS drop").
The verdict then stays `healthy`: the fixed verdict set names system failure mechanisms only, and every
one of them (io-contention, thermal-throttle, rdma-degradation, ...) would send the operator to fix
hardware that is fine. The root cause, chain and a warning finding carry the training-level regression.

Every contention source is checked per host, not only on the median host ("Check all rows"; "A per-node
delta points to background processes or different node allocations"): a host whose own value rose in the
degraded window (I/O pressure, RDMA/TCP retransmits, runnable processes) is named anomalous even when the
median host did not move.
- I/O pressure on one host -> io-contention with that host anomalous.
- Runnable processes up on some hosts only -> per-node CPU contention. The fixed set has no CPU-contention
  verdict and restore-resource-leak asserts the uniform restore signature a per-node delta refutes, so the
  verdict stays healthy (as in compare) and root_cause/anomalous_hosts name the hosts.
- TCP retransmits rising on some hosts at the time of the slowdown -> the network event caused it
  (runbook: "if retransmits spike at the same time as a step time increase or hang, the network event
  caused the training issue"). The closest verdict is rdma-degradation (network degradation slowing the
  collectives); the root cause says it is the IP/TCP path, with no RDMA errors, when that is so.

Single-job restore-leak suspicion (runbook "Checkpointing interference"): a job that ran with
enable_single_replica_ckpt_restoring=true, actually restored (triage: "restoring from this run's directory
step N") and shows an extra NCCL/RCCL communicator-init wave in the head node's Ray worker logs (3 waves
of `init.cc:... NCCL WARN MSCCL++` separated by time gaps, vs 2 for a fresh start) is flagged as a
suspected restore resource leak: verdict restore-resource-leak when nothing else was found (it is not
called healthy), otherwise a warning finding next to the other verdict. The hw_procs_running level after
the restore is reported per host, but the leak's signature is a uniform *delta* against a fresh start
with the same config, which one job cannot measure: the advice is `jobdiagd compare <fresh> <this>`.
Without worker logs the suspicion is only mentioned (info); with 2 waves the restore did not leak
communicators (e.g. Orbax's dispatcher path). `restore_leak_suspicion` is the pure part.

A slowdown is looked for as (a) a TGS drop between the first and last fifth, (b) a step-time trend, (c)
isolated > 2x spikes, and (d) a sustained slow segment in the middle of the run: >= 10 consecutive steady
steps (tolerating two normal ones) more than tgs_regression_pct slower than the median. (d) is what a
transient event (a retransmit burst of a few minutes) looks like; it is compared with the steps before it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from jobdiagd.tsdb.align import StepPoint, Timeline, checkpoint_steps, steady_state
from jobdiagd.tsdb.logevidence import head_worker_waves
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
    iso,
    linear_fit,
    median,
    outliers_high,
    present,
    training_span,
)
from jobdiagd.tsdb.settings import GpuProfile, Thresholds

# (arm, label, PromQL template over window {w}, metric needed, unit)
CHECKLIST: tuple[tuple[str, str, str, str, str], ...] = (
    ("procs", "CPU: runnable processes", "avg_over_time(hw_procs_running[{w}])", "hw_procs_running", ""),
    ("blocked", "CPU: blocked processes", "avg_over_time(hw_procs_blocked[{w}])", "hw_procs_blocked", ""),
    (
        "cpu",
        "CPU utilization (Ray)",
        "avg_over_time(ray_node_cpu_utilization[{w}])",
        "ray_node_cpu_utilization",
        "%",
    ),
    (
        "tcp",
        "Network: TCP retransmits/s",
        "rate(hw_tcp_retransmits_total[{w}])",
        "hw_tcp_retransmits_total",
        "",
    ),
    (
        "rdma",
        "Network: RDMA retransmits/s",
        "sum by (host) (rate(hw_rdma_tx_retx_pkts_total[{w}]))",
        "hw_rdma_tx_retx_pkts_total",
        "",
    ),
    (
        "io",
        "Storage: IO pressure full %",
        "avg_over_time(hw_io_pressure_full_pct[{w}])",
        "hw_io_pressure_full_pct",
        "%",
    ),
    (
        "dirty",
        "Storage: dirty pages",
        "avg_over_time(hw_mem_dirty_bytes[{w}]) / 1e9",
        "hw_mem_dirty_bytes",
        " GB",
    ),
    (
        "mem",
        "Memory: host RAM used",
        "max_over_time(ray_node_mem_used[{w}]) / max_over_time(ray_node_mem_total[{w}]) * 100",
        "ray_node_mem_used",
        "%",
    ),
    (
        "temp",
        "GPU thermal: max temp",
        "max by (host) (max_over_time(hw_gpu_temperature_celsius[{w}]))",
        "hw_gpu_temperature_celsius",
        "C",
    ),
    (
        "sclk",
        "GPU: core clock",
        'avg by (host) (avg_over_time(hw_gpu_clock_mhz{{type="sclk"}}[{w}]))',
        "hw_gpu_clock_mhz",
        "MHz",
    ),
    (
        "power",
        "GPU: power",
        "avg by (host) (avg_over_time(hw_gpu_power_watts[{w}]))",
        "hw_gpu_power_watts",
        "W",
    ),
    (
        "errs",
        "GPU hardware: RAS UE (lifetime)",
        "sum by (host) (max_over_time(hw_gpu_ras_umc_ue_total[{w}]))",
        "hw_gpu_ras_umc_ue_total",
        "",
    ),
)


@dataclass(frozen=True)
class RestoreLeakSuspicion:
    suspected: bool
    summary: str
    rows: tuple[tuple[str, str, str], ...]


def restore_leak_suspicion(
    single_replica: bool,
    restored_from: int | None,
    waves: int | None,
    procs_after: Mapping[str, float],
    th: Thresholds,
) -> RestoreLeakSuspicion | None:
    """Pure: what one job can say about the single-replica restore leak (module docstring); None when no
    single-replica restore ran (a fresh start with the flag set does not take the leaking path)."""
    if not single_replica or restored_from is None:
        return None
    rows: list[tuple[str, str, str]] = [
        ("enable_single_replica_ckpt_restoring", "true", "restore takes the single-replica broadcast path"),
        ("restored from step", str(restored_from), "the restore code path actually ran"),
        (
            "NCCL/RCCL init waves (head worker logs)",
            "n/a" if waves is None else str(waves),
            "fresh start: 2 (startup + training); single-replica restore: 3 (+ restore broadcast)",
        ),
    ]
    level = ""
    if procs_after:
        vals = sorted(procs_after.values())
        med = statistics.median(vals)
        # Uniform: no host differs from another by as much as the smallest leak delta.
        uniform = (
            "uniform across hosts"
            if vals[-1] - vals[0] < th.procs_leak_min_delta
            else "uneven across hosts (a per-node difference points to background processes)"
        )
        rows.append(
            (
                "hw_procs_running after the restore (per host)",
                f"median {med:.1f} ({vals[0]:.1f}..{vals[-1]:.1f}, {len(vals)} hosts)",
                uniform,
            )
        )
        level = (
            f" hw_procs_running after the restore: median {med:.1f} runnable processes per host "
            f"({vals[0]:.1f}..{vals[-1]:.1f}, {uniform}). Without a baseline job the leak's uniform delta "
            "(~3-8 extra runnable processes per host against a fresh start) cannot be measured from this job alone."
        )
    compare = (
        " Compare against a fresh start with the same config (`jobdiagd compare <fresh job> <this job>`): "
        "a uniform hw_procs_running delta on every host confirms the leak."
    )
    if waves is None:
        return RestoreLeakSuspicion(
            False,
            f"Single-replica restore from step {restored_from}: the Ray worker logs are not available to count "
            "communicator-init waves, so the restore leak can neither be suspected nor ruled out."
            + level
            + compare,
            tuple(rows),
        )
    if waves >= 3:
        return RestoreLeakSuspicion(
            True,
            f"Suspected restore resource leak: the job restored from step {restored_from} with single-replica "
            f"restore and its worker logs show {waves} NCCL/RCCL communicator-init waves (a fresh start shows 2): "
            "the restore broadcast created extra communicators, which stay cached with their polling threads "
            "(persistent extra runnable processes, ~0.5-1% TGS)." + level + compare,
            tuple(rows),
        )
    return RestoreLeakSuspicion(
        False,
        f"Single-replica restore from step {restored_from} without an extra communicator-init wave ({waves} "
        "waves, as a fresh start): no sign of the restore leak." + level,
        tuple(rows),
    )


def slow_segment(points: list[StepPoint], st_med: float, pct: float, min_steps: int = 10) -> list[StepPoint]:
    """The longest run of steps more than pct % slower than the median (two normal steps may interrupt it)."""
    if not st_med:
        return []
    limit = st_med * (1 + pct / 100)
    best: list[StepPoint] = []
    cur: list[StepPoint] = []
    ok_run = 0
    for p in points:
        if p.step_time and p.step_time > limit:
            cur.append(p)
            ok_run = 0
        elif cur:
            ok_run += 1
            if ok_run > 2:
                best = cur if len(cur) > len(best) else best
                cur, ok_run = [], 0
    best = cur if len(cur) > len(best) else best
    return best if len(best) >= min_steps else []


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


@dataclass(frozen=True)
class TrainingEvent:
    """The earliest training-level event (rule PB-TRAIN-5)."""

    label: str
    step: int
    time: float | None


def training_event(
    moe_spikes: list[StepPoint],
    grad_spikes: list[StepPoint],
    diverge: StepPoint | None,
    nan_steps: list[int],
    tl: Timeline,
) -> TrainingEvent | None:
    """The earliest training-level event: what, from which step, and when."""
    cands: list[tuple[int, str]] = []
    if moe_spikes:
        cands.append(
            (moe_spikes[0].step, "MoE load-balance loss spike (routing shift -> expert load imbalance)")
        )
    if grad_spikes:
        cands.append((grad_spikes[0].step, "gradient-norm spike"))
    if diverge is not None:
        cands.append((diverge.step, "loss divergence"))
    if nan_steps:
        cands.append((nan_steps[0], "loss NaN"))
    if not cands:
        return None
    step, label = min(cands)
    return TrainingEvent(label, step, tl.time_of_step(step))


async def uneven_gpus(env: PlaybookEnv, baseline: tuple[float, float], degraded: tuple[float, float]) -> str:
    """How many GPUs lost utilization in the degraded window while others kept theirs (symptom of imbalance)."""
    if not env.disc.has("ray_node_gpus_utilization"):
        return ""
    q = "avg_over_time(ray_node_gpus_utilization[{w}])"
    b = by_gpu(await env.client.query_vector(q.format(w=dur(baseline[1] - baseline[0])), baseline[1]))
    d = by_gpu(await env.client.query_vector(q.format(w=dur(degraded[1] - degraded[0])), degraded[1]))
    low = sorted(k for k, v in d.items() if k in b and b[k] - v >= 15.0)
    if not low or len(low) == len(d):
        return ""
    hosts = sorted({h for h, _ in low})
    return (
        f"GPU utilization became uneven: {len(low)}/{len(d)} GPUs dropped to ~{median(d[k] for k in low):.0f}% "
        f"(on {', '.join(hosts)}) while the rest stayed at ~{median(v for k, v in d.items() if k not in low):.0f}%"
    )


Checklist = dict[str, dict[str, float]]  # checklist arm -> host -> value
Window = tuple[float, float]


@dataclass(frozen=True)
class ContentionSeries:
    """The contention checklist per host (fetch step): over steady training, and over the baseline and
    degraded windows when there is a slowdown."""

    whole: Checklist
    windows: tuple[Window, Window] | None = None  # (baseline, degraded)
    baseline: Checklist = field(default_factory=dict)
    degraded: Checklist = field(default_factory=dict)


@dataclass(frozen=True)
class TrainingSignals:
    """What the timeline says (pure, rules PB-TRAIN-1/2): training-metric events and the slowdown."""

    steady: list[StepPoint]
    nan_steps: list[int]
    diverge: StepPoint | None
    grad_median: float
    grad_spikes: list[StepPoint]
    clip_ratios: list[float]  # raw_grad_norm / grad_norm
    moe_spikes: list[StepPoint]
    lrs: list[float]
    st_med: float  # median steady step time
    ck_spikes: list[StepPoint]  # > 2x step time at checkpoint steps (expected)
    odd_spikes: list[StepPoint]  # > 2x step time elsewhere
    tgs: list[tuple[float, float]]  # (time, TGS) of the steady steps
    n5: int  # a fifth of them
    early: float  # mean TGS of the first fifth
    late: float
    drop_pct: float
    r2: float
    growth_pct: float  # step-time trend over the run
    regression: bool  # (a) TGS drop or (b) step-time trend
    segment: list[StepPoint]  # (d) a sustained slow segment (only without a regression)


def divergence(after_warm: list[StepPoint]) -> StepPoint | None:
    """The first step from which four losses in a row exceed 1.5 x the running minimum."""
    run_min = math.inf
    for i, p in enumerate(after_warm):
        if p.loss is None or math.isnan(p.loss):
            continue
        ahead = [q.loss for q in after_warm[i : i + 4] if q.loss is not None]
        if len(ahead) == 4 and all(x > 1.5 * run_min for x in ahead):
            return p
        run_min = min(run_min, p.loss)
    return None


def training_signals(
    tl: Timeline, *, checkpoint_period: int | None, async_ckpt: bool, th: Thresholds
) -> TrainingSignals:
    """Pure: the timeline's real samples in, the training-level events and slowdown evidence out."""
    steady = steady_state(
        tl, checkpoint_period=checkpoint_period, async_ckpt=async_ckpt, warmup_steps=th.warmup_steps
    )
    after_warm = [p for p in tl.points if p.step >= (tl.first_step or 0) + th.warmup_steps]
    gn = [p.grad_norm for p in steady if p.grad_norm is not None]
    gmed = median(gn)
    moe = [p.moe_lb_loss for p in steady if p.moe_lb_loss is not None]
    sts = [p.step_time for p in steady if p.step_time]
    st_med = median(sts)
    ck = checkpoint_steps((p.step for p in tl.points), checkpoint_period, async_ckpt)
    spikes = [p for p in after_warm if p.step_time and st_med and p.step_time > 2 * st_med]
    tgs = [(p.t, p.tgs) for p in steady if p.tgs]
    n5 = max(1, len(tgs) // 5)
    early, late = _mean([v for _, v in tgs[:n5]]), _mean([v for _, v in tgs[-n5:]])
    drop_pct = 100 * (early - late) / early if tgs and early else 0.0
    slope, r2 = linear_fit([(float(i), p.step_time) for i, p in enumerate(steady) if p.step_time])
    growth_pct = 100 * slope * len(sts) / st_med if st_med else 0.0
    regression = bool(tgs) and (
        drop_pct >= th.tgs_regression_pct or (growth_pct >= th.tgs_regression_pct and r2 >= 0.5)
    )
    return TrainingSignals(
        steady=steady,
        nan_steps=[p.step for p in tl.points if p.loss is not None and math.isnan(p.loss)],
        diverge=divergence(after_warm),
        grad_median=gmed,
        grad_spikes=[p for p in steady if p.grad_norm is not None and gmed > 0 and p.grad_norm > 5 * gmed],
        clip_ratios=[p.raw_grad_norm / p.grad_norm for p in steady if p.raw_grad_norm and p.grad_norm],
        moe_spikes=[
            p for p in steady if p.moe_lb_loss is not None and moe and p.moe_lb_loss > 3 * median(moe)
        ],
        lrs=[p.lr for p in steady if p.lr is not None],
        st_med=st_med,
        ck_spikes=[p for p in spikes if p.step in ck],
        odd_spikes=[p for p in spikes if p.step not in ck],
        tgs=tgs,
        n5=n5,
        early=early,
        late=late,
        drop_pct=drop_pct,
        r2=r2,
        growth_pct=growth_pct,
        regression=regression,
        segment=[] if regression else slow_segment(steady, st_med, th.tgs_regression_pct),
    )


def contention_windows(sig: TrainingSignals, start: float) -> tuple[Window, Window] | None:
    """(baseline, degraded) windows of the contention checklist (each at least 60 s), or None without a
    slowdown: the first vs the last fifth of a regression, the steps next to a slow segment vs the
    segment, or the first fifth vs the worst isolated spike."""
    tgs, n5, st_med = sig.tgs, sig.n5, sig.st_med
    if sig.regression:
        baseline = (tgs[0][0], tgs[n5 - 1][0] if n5 > 1 else tgs[0][0] + 120)
        degraded = (tgs[-n5][0], tgs[-1][0])
    elif seg := sig.segment:
        degraded = (seg[0].t - (seg[0].step_time or st_med), seg[-1].t)
        before = [p for p in sig.steady if p.t < degraded[0]]
        after = [p for p in sig.steady if p.t > degraded[1]]
        ref = before if len(before) >= len(after) else after
        ref = ref[-n5:] if ref is before else ref[:n5]
        baseline = (ref[0].t - (ref[0].step_time or st_med), ref[-1].t) if ref else (start, start + 120)
    elif sig.odd_spikes and tgs:
        worst = max(sig.odd_spikes, key=lambda p: p.step_time or 0)
        baseline = (tgs[0][0], tgs[n5 - 1][0] if n5 > 1 else tgs[0][0] + 120)
        degraded = (worst.t - (worst.step_time or 60), worst.t)
    else:
        return None
    if degraded[1] - degraded[0] < 60:
        degraded = (degraded[1] - 60, degraded[1])
    if baseline[1] - baseline[0] < 60:
        baseline = (baseline[0], baseline[0] + 60)
    return baseline, degraded


def compare_checklists(b: Checklist, d: Checklist) -> dict[str, tuple[dict[str, float], dict[str, float]]]:
    """arm -> (baseline values, degraded values) per host, for the arms either window has."""
    return {arm: (b.get(arm, {}), d.get(arm, {})) for arm, *_ in CHECKLIST if arm in b or arm in d}


Comparison = Mapping[str, tuple[Mapping[str, float], Mapping[str, float]]]


def worse(cmp: Comparison, arm: str, factor: float, floor: float) -> bool:
    """The median host's value rose by `factor` to at least `floor` in the degraded window."""
    if arm not in cmp:
        return False
    bv, dv = median(cmp[arm][0].values()), median(cmp[arm][1].values())
    return dv >= floor and dv >= factor * max(bv, 1e-9)


def rose(cmp: Comparison, arm: str, factor: float, floor: float) -> list[str]:
    """Hosts whose own value rose in the degraded window (per-host, not only the median host)."""
    if arm not in cmp:
        return []
    bvals, dvals = cmp[arm]
    bmed = median(bvals.values())
    return sorted(h for h, v in dvals.items() if v >= floor and v >= factor * max(bvals.get(h, bmed), 1e-9))


class SlowdownCause(StrEnum):
    """The contention source the checklist blames (rules PB-TRAIN-3/4), in the order it is checked."""

    IO = "io"
    THERMAL = "thermal"
    RDMA = "rdma"
    TCP = "tcp"
    CPU_PER_NODE = "cpu-per-node"
    RESTORE_LEAK = "restore-leak"  # uniform runnable-process rise after a restore
    CPU = "cpu"  # runnable processes up, neither per-node nor a restore leak
    NONE = "none"


CAUSE_VERDICT = {
    SlowdownCause.IO: Verdict.IO_CONTENTION,
    SlowdownCause.THERMAL: Verdict.THERMAL_THROTTLE,
    SlowdownCause.RDMA: Verdict.RDMA_DEGRADATION,
    SlowdownCause.TCP: Verdict.RDMA_DEGRADATION,
    SlowdownCause.CPU_PER_NODE: Verdict.HEALTHY,
    SlowdownCause.RESTORE_LEAK: Verdict.RESTORE_RESOURCE_LEAK,
    SlowdownCause.CPU: Verdict.HEALTHY,
    SlowdownCause.NONE: Verdict.HEALTHY,
}


@dataclass(frozen=True)
class ContentionJudgement:
    """Which contention source moved between the baseline and the degraded window, and on which hosts."""

    cause: SlowdownCause
    anomalous: list[str]
    whole_cluster_io: bool = False
    rdma_hosts: list[str] = field(default_factory=list)
    tcp_named: list[str] = field(default_factory=list)  # TCP: hosts named in the root cause
    procs_deltas: list[float] = field(default_factory=list)
    procs_median_delta: float = 0.0
    uniform: bool = False


def judge_procs(cmp: Comparison, th: Thresholds, restored_from_step: int | None) -> ContentionJudgement:
    """Runnable processes: per-node rise (PB-TRAIN-4) or a uniform rise after a restore (PB-TRAIN-6)."""
    bvals, dvals = cmp["procs"]
    per_delta = {h: dvals[h] - bvals[h] for h in dvals if h in bvals}
    deltas = list(per_delta.values())
    md = median(deltas)
    per_node = sorted(
        h
        for h, dl in per_delta.items()
        if dl >= th.procs_leak_min_delta and dl - md >= th.procs_leak_min_delta
    )
    if per_node:
        return ContentionJudgement(SlowdownCause.CPU_PER_NODE, per_node, procs_median_delta=md)
    if deltas and md >= th.procs_leak_min_delta:
        uniform = statistics.pstdev(deltas) / abs(median(deltas)) <= th.procs_uniform_max_cv
        cause = (
            SlowdownCause.RESTORE_LEAK if uniform and restored_from_step is not None else SlowdownCause.CPU
        )
        return ContentionJudgement(cause, [], procs_deltas=deltas, procs_median_delta=md, uniform=uniform)
    return ContentionJudgement(SlowdownCause.NONE, [])


def judge_contention(
    cmp: Comparison, th: Thresholds, prof: GpuProfile, restored_from_step: int | None
) -> ContentionJudgement:
    """Pure: the checklist of both windows in, the contention source out (rule PB-TRAIN-3, then -4)."""
    io_hosts = rose(cmp, "io", 2.0, th.io_pressure_full_pct)
    rdma_hosts = rose(cmp, "rdma", th.rate_outlier_factor, th.rdma_retx_min_per_s)
    tcp_hosts = rose(cmp, "tcp", th.rate_outlier_factor, th.tcp_rate_min_per_s)
    if worse(cmp, "io", 2.0, th.io_pressure_full_pct) or io_hosts:
        anomalous = io_hosts or sorted(h for h, v in cmp["io"][1].items() if v >= th.io_pressure_full_pct)
        return ContentionJudgement(
            SlowdownCause.IO, anomalous, whole_cluster_io=worse(cmp, "io", 2.0, th.io_pressure_full_pct)
        )
    if hot := sorted(
        h
        for h, v in cmp.get("temp", ({}, {}))[1].items()
        if v >= prof.temp_limit_c and cmp["temp"][0].get(h, 0.0) < prof.temp_limit_c
    ):
        return ContentionJudgement(SlowdownCause.THERMAL, hot)
    if worse(cmp, "rdma", th.rate_outlier_factor, th.rdma_retx_min_per_s) or rdma_hosts:
        return ContentionJudgement(SlowdownCause.RDMA, rdma_hosts, rdma_hosts=rdma_hosts)
    if tcp_hosts or worse(cmp, "tcp", th.rate_outlier_factor, th.tcp_rate_min_per_s):
        return ContentionJudgement(
            SlowdownCause.TCP, tcp_hosts, rdma_hosts=rdma_hosts, tcp_named=tcp_hosts or sorted(cmp["tcp"][1])
        )
    if "procs" in cmp:
        return judge_procs(cmp, th, restored_from_step)
    return ContentionJudgement(SlowdownCause.NONE, [])


@dataclass(frozen=True)
class TrainingJudgement:
    """The verdict of the training-stability playbook and its evidence (judge step; no prose)."""

    verdict: Verdict
    anomalous: list[str]
    signals: TrainingSignals
    windows: tuple[Window, Window] | None  # (baseline, degraded)
    contention: ContentionJudgement | None  # with a slowdown
    rdma_out: list[str]  # without one: hosts with a constant RDMA retransmit load
    event: TrainingEvent | None  # the training-level root cause of an unexplained slowdown
    leak: RestoreLeakSuspicion | None
    leak_is_diagnosis: bool  # nothing else explains the job: the leak suspicion is the verdict


def judge_training(
    sig: TrainingSignals,
    tl: Timeline,
    series: ContentionSeries,
    leak: RestoreLeakSuspicion | None,
    *,
    restored_from_step: int | None,
    prof: GpuProfile,
    th: Thresholds,
) -> TrainingJudgement:
    """Pure: the signals and the checklists in, the verdict and its evidence out (rules PB-TRAIN-2..6)."""
    rdma_out = outliers_high(
        series.whole.get("rdma", {}), factor=th.rate_outlier_factor, floor=th.rdma_retx_min_per_s
    )
    contention = None
    event = None
    if series.windows is not None:
        cmp = compare_checklists(series.baseline, series.degraded)
        contention = judge_contention(cmp, th, prof, restored_from_step)
        verdict, anomalous = CAUSE_VERDICT[contention.cause], contention.anomalous
        if contention.cause == SlowdownCause.NONE:
            event = training_event(sig.moe_spikes, sig.grad_spikes, sig.diverge, sig.nan_steps, tl)
        # Every cause but a non-specific CPU rise and an unexplained slowdown carries its own chain.
        has_chain = contention.cause not in (SlowdownCause.CPU, SlowdownCause.NONE) or event is not None
    elif rdma_out:
        verdict, anomalous, has_chain = Verdict.RDMA_DEGRADATION, rdma_out, True
    else:
        verdict, anomalous, has_chain = Verdict.HEALTHY, [], False
    leak_is_diagnosis = (
        leak is not None and leak.suspected and verdict == Verdict.HEALTHY and not anomalous and not has_chain
    )
    return TrainingJudgement(
        verdict=Verdict.RESTORE_RESOURCE_LEAK if leak_is_diagnosis else verdict,
        anomalous=anomalous,
        signals=sig,
        windows=series.windows,
        contention=contention,
        rdma_out=rdma_out,
        event=event,
        leak=leak,
        leak_is_diagnosis=leak_is_diagnosis,
    )


# --- fetch ---------------------------------------------------------------------------------------------


async def checklist(env: PlaybookEnv, start: float, end: float) -> Checklist:
    w = dur(end - start)
    arms = present(
        env, {a: q.format(w=w) for a, _, q, _, _ in CHECKLIST}, {a: m for a, _, _, m, _ in CHECKLIST}
    )
    return {k: by_host(v) for k, v in (await env.arms(arms, end)).items()}


async def fetch_contention(
    env: PlaybookEnv, start: float, end: float, windows: tuple[Window, Window] | None
) -> ContentionSeries:
    """The checklist over steady training, and over both windows of a slowdown (the only PromQL I/O)."""
    whole = await checklist(env, start, end)
    if windows is None:
        return ContentionSeries(whole)
    baseline, degraded = windows
    return ContentionSeries(whole, windows, await checklist(env, *baseline), await checklist(env, *degraded))


def fetch_restore_leak(env: PlaybookEnv, whole: Checklist) -> RestoreLeakSuspicion | None:
    """Count the head worker logs' communicator-init waves (file I/O) and judge the restore leak."""
    ctx = env.ctx
    return restore_leak_suspicion(
        ctx.single_replica_restore,
        ctx.restored_from_step,
        head_worker_waves(ctx.job_dir, ctx.head_node) if ctx.single_replica_restore else None,
        whole.get("procs", {}),
        env.th,
    )


# --- render --------------------------------------------------------------------------------------------


def segment_text(sig: TrainingSignals) -> str:
    seg, st_med = sig.segment, sig.st_med
    if not seg:
        return ""
    seg_st = median(p.step_time for p in seg if p.step_time)
    return (
        f"step time +{100 * (seg_st / st_med - 1):.0f}% ({st_med:.2f} s -> {seg_st:.2f} s) for "
        f"{len(seg)} steps, steps {seg[0].step}-{seg[-1].step} ({iso(seg[0].t - (seg[0].step_time or 0))}.."
        f"{iso(seg[-1].t)}, {seg[-1].t - seg[0].t + (seg[0].step_time or 0):.0f} s)"
    )


def training_issues(sig: TrainingSignals, th: Thresholds) -> list[str]:
    """The training-metric and throughput issues, in the report's words (rules PB-TRAIN-1/2)."""
    issues: list[str] = []
    if sig.nan_steps:
        issues.append(f"loss NaN at steps {sig.nan_steps[:5]}")
    if sig.diverge:
        issues.append(
            f"loss divergence from step {sig.diverge.step} ({fmt(sig.diverge.loss, digits=3)} > 1.5x running minimum)"
        )
    if sig.grad_spikes:
        issues.append(
            f"gradient-norm spikes (> 5x median {sig.grad_median:.3g}) at steps {[p.step for p in sig.grad_spikes[:5]]}"
        )
    if sig.clip_ratios and median(sig.clip_ratios) > 1.5:
        issues.append(
            f"raw_grad_norm is {median(sig.clip_ratios):.1f}x grad_norm: gradient clipping active (maybe too aggressive)"
        )
    if sig.moe_spikes:
        issues.append(
            f"MoE load-balance loss spikes at steps {[p.step for p in sig.moe_spikes[:5]]}: routing shift -> uneven GPU use"
        )
    if sig.drop_pct >= th.tgs_regression_pct:
        issues.append(
            f"throughput regression: steady TGS {sig.early:.0f} -> {sig.late:.0f} ({sig.drop_pct:.1f}% drop)"
        )
    elif sig.growth_pct >= th.tgs_regression_pct and sig.r2 >= 0.5:
        issues.append(
            f"step time grows {sig.growth_pct:.0f}% over the run (R^2={sig.r2:.2f}): contention worsening"
        )
    if sig.odd_spikes:
        issues.append(f"{len(sig.odd_spikes)} step-time spikes outside checkpoint steps")
    if sig.segment:
        issues.append(f"sustained slowdown: {segment_text(sig)}")
    return issues


def metrics_finding(
    sig: TrainingSignals, tl: Timeline, issues: list[str], th: Thresholds, period: int | None
) -> Finding:
    lrs = sig.lrs
    perf_rows: list[tuple[str, ...]] = [
        (
            "steady steps analysed",
            str(len(sig.steady)),
            f"excluding warmup ({th.warmup_steps}) and checkpoint steps (period {period})",
        ),
        ("median step time", fmt(sig.st_med, " s", 2), ""),
        ("checkpoint-step spikes", str(len(sig.ck_spikes)), "expected (checkpoint saves)"),
        (
            "non-checkpoint spikes",
            str(len(sig.odd_spikes)),
            ", ".join(f"step {p.step}: {p.step_time:.1f}s" for p in sig.odd_spikes[:5] if p.step_time),
        ),
        (
            "TGS early -> late",
            f"{fmt(sig.early, digits=0)} -> {fmt(sig.late, digits=0)}",
            f"{sig.drop_pct:+.1f}% drop",
        ),
        ("step-time trend", f"{sig.growth_pct:+.1f}% over run", f"R^2={sig.r2:.2f}"),
        (
            "sustained slow segment",
            segment_text(sig) or "none",
            f"> {th.tgs_regression_pct:.0f}% over median",
        ),
        (
            "loss first -> last",
            f"{fmt(tl.points[0].loss if tl.points else None, digits=3)} -> {fmt(tl.points[-1].loss if tl.points else None, digits=3)}",
            "",
        ),
        (
            "learning rate range",
            f"{fmt(min(lrs), digits=6) if lrs else 'n/a'} .. {fmt(max(lrs), digits=6) if lrs else 'n/a'}",
            "",
        ),
    ]
    return Finding(
        "Training metrics",
        "; ".join(issues) if issues else "Loss, gradient norms and learning rate behave normally.",
        "critical" if (sig.nan_steps or sig.diverge) else ("warning" if issues else "info"),
        evidence=[
            EvidenceTable(
                "Training and throughput (tb_* real samples, staleness fills dropped)",
                "tb_* raw samples with tb_metrics_plugin_staleness_fill == 0",
                ("Metric", "Value", "Note"),
                perf_rows,
            )
        ],
    )


def checklist_table(series: ContentionSeries, start: float, end: float, th: Thresholds) -> EvidenceTable:
    rows: list[tuple[str, ...]] = []
    if series.windows is not None:
        (b0, b1), (d0, d1) = series.windows
        b, d = series.baseline, series.degraded
        for arm, label, _, _, unit in CHECKLIST:
            if arm in b or arm in d:
                bv, dv = median(b.get(arm, {}).values()), median(d.get(arm, {}).values())
                dmax = max(d.get(arm, {}).items(), key=lambda kv: kv[1], default=("", float("nan")))
                rows.append(
                    (
                        label,
                        fmt(bv, unit, 2),
                        fmt(dv, unit, 2),
                        f"{fmt(dmax[1], unit, 2)} ({dmax[0]})",
                        f"{dv - bv:+.2f}",
                    )
                )
        title = f"Contention checklist: baseline {iso(b0)}..{iso(b1)} vs degraded {iso(d0)}..{iso(d1)}"
        cols: tuple[str, ...] = (
            "Source",
            "baseline (median host)",
            "degraded (median host)",
            "degraded (max host)",
            "change (median)",
        )
    else:
        for arm, label, _, _, unit in CHECKLIST:
            if arm in series.whole:
                vals = series.whole[arm]
                out = (
                    outliers_high(vals, factor=th.rate_outlier_factor, floor=th.rdma_retx_min_per_s)
                    if arm in ("rdma", "tcp")
                    else []
                )
                rows.append(
                    (
                        label,
                        fmt(median(vals.values()), unit, 2),
                        fmt(max(vals.values(), default=float("nan")), unit, 2),
                        ", ".join(out) or "none",
                    )
                )
        title = f"Contention checklist over steady training {iso(start)}..{iso(end)}"
        cols = ("Source", "median host", "max host", "outlier hosts")
    return EvidenceTable(title, "per-host avg/rate over the window (see Source)", cols, rows)


def show(cmp: Comparison, arm: str, hosts: list[str], unit: str = "", digits: int = 1) -> str:
    bvals, dvals = cmp.get(arm, ({}, {}))
    others = [v for h, v in dvals.items() if h not in hosts]
    return ", ".join(
        f"{h} {fmt(bvals.get(h), unit, digits)} -> {fmt(dvals.get(h), unit, digits)}" for h in hosts
    ) + (f" (other hosts {fmt(median(others), unit, digits)})" if others else "")


def cause_root_and_chain(
    c: ContentionJudgement, cmp: Comparison, slow: str, prof: GpuProfile
) -> tuple[str, list[str]]:
    """The root cause and chain of the contention source the checklist blames ("" for none)."""
    anomalous = c.anomalous
    if c.cause == SlowdownCause.IO:
        extra = [
            f"blocked processes {show(cmp, 'blocked', anomalous)}" if "blocked" in cmp else "",
            f"dirty pages {show(cmp, 'dirty', anomalous, ' GB')}" if "dirty" in cmp else "",
        ]
        root = (
            "I/O pressure rose in the degraded window (checkpoint/NFS writes stall the data path)."
            if c.whole_cluster_io
            else (
                f"Per-node storage contention on {', '.join(anomalous)}: IO pressure full "
                f"{show(cmp, 'io', anomalous, '%')}"
                + "".join(f"; {x}" for x in extra if x)
                + f", while the median host did not move; {slow}. Every collective waits for the "
                "node stalled on I/O (NFS/local writes or a background process on that node)."
            )
        )
        return root, [
            "storage I/O pressure" + ("" if c.whole_cluster_io else f" on {', '.join(anomalous)}"),
            "host threads blocked on I/O",
            "step time up",
            "TGS down",
        ]
    if c.cause == SlowdownCause.THERMAL:
        hot = anomalous
        clk = {h: (cmp["sclk"][0].get(h), cmp["sclk"][1].get(h)) for h in hot} if "sclk" in cmp else {}
        drops = ", ".join(f"{h} {a:.0f}->{b:.0f} MHz" for h, (a, b) in clk.items() if a and b)
        root = (
            f"GPU temperatures on {', '.join(hot)} crossed {prof.temp_limit_c:.0f}C in the degraded window"
            + (f" and clocks dropped ({drops})" if drops else "")
            + "; every collective waits for the throttled node."
        )
        return root, ["GPU over thermal limit", "clock throttling", "step time up", "TGS down"]
    if c.cause == SlowdownCause.RDMA:
        rdma_hosts = c.rdma_hosts
        root = "RDMA retransmits rose in the degraded window" + (
            f" on {', '.join(rdma_hosts)} ({show(cmp, 'rdma', rdma_hosts, '/s')})." if rdma_hosts else "."
        )
        return root, ["RDMA retransmits", "slower collectives", "TGS down"]
    if c.cause == SlowdownCause.TCP:
        tcp_named = c.tcp_named
        root = (
            f"Network event on {', '.join(tcp_named)}: TCP retransmits rose to "
            f"{show(cmp, 'tcp', tcp_named, '/s')} at the same time as the slowdown ({slow}); "
            "the network event caused the training issue. "
            + (
                "No RDMA retransmit increase: an IP/TCP path issue (host network, NFS/gRPC traffic), not "
                "the RDMA fabric; rdma-degradation is the closest verdict of the fixed set."
                if not c.rdma_hosts
                else ""
            )
        )
        return root, [
            f"TCP retransmit burst on {', '.join(tcp_named)}",
            "slower collectives / host communication",
            "step time up",
            "TGS down",
        ]
    return procs_root_and_chain(c, cmp, slow)


def procs_root_and_chain(c: ContentionJudgement, cmp: Comparison, slow: str) -> tuple[str, list[str]]:
    if c.cause == SlowdownCause.CPU_PER_NODE:
        per_node = c.anomalous
        root = (
            f"Per-node CPU contention on {', '.join(per_node)}: runnable processes "
            f"{show(cmp, 'procs', per_node)} while the median host changed {c.procs_median_delta:+.1f}; {slow}. "
            "A per-node delta points to background processes or a different node allocation "
            "(not the uniform restore-leak signature); every collective waits for that node. "
            "Verdict healthy: the fixed set has no CPU-contention mechanism."
        )
        return root, [
            f"extra runnable processes on {', '.join(per_node)}",
            "CPU contention on that node",
            "slowest rank delays every collective",
            "step time up",
            "TGS down",
        ]
    if c.cause == SlowdownCause.RESTORE_LEAK:
        root = f"hw_procs_running up ~{median(c.procs_deltas):.1f} on every host after the restore: leaked RCCL communicator threads."
        return root, [
            "single-replica restore",
            "leaked RCCL communicators + polling threads",
            "CPU contention",
            "TGS down",
        ]
    if c.cause == SlowdownCause.CPU:
        return (
            f"CPU contention: runnable processes +{median(c.procs_deltas):.1f} per host ({'uniform' if c.uniform else 'per-node'}).",
            [],
        )
    return "", []


def event_root_and_chain(evt: TrainingEvent, sig: TrainingSignals, uneven: str) -> tuple[str, list[str]]:
    """A training-level event before an unexplained regression (rule PB-TRAIN-5)."""
    label, first_step, t_evt, drop_pct = evt.label, evt.step, evt.time, sig.drop_pct
    root = (
        f"Training-level root cause: {label} from step {first_step}"
        + (f" ({iso(t_evt)})" if t_evt else "")
        + f", before throughput dropped {drop_pct:.1f}% (steady TGS {sig.early:.0f} -> {sig.late:.0f}); "
        + (f"{uneven}; " if uneven else "")
        + "no contention source (CPU, network, I/O, memory, thermal, hardware) moved. "
        "The system metrics are passive symptoms of the model's changed computation."
    )
    return root, [
        f"{label} at step {first_step}",
        "uneven work across GPUs (some experts/devices overloaded, others waiting)"
        if "MoE" in label
        else "numerical instability changes the computation",
        *([uneven] if uneven else []),
        "every step waits for the slowest devices: step time up",
        f"TGS down {drop_pct:.1f}%",
    ]


def training_root_and_chain(
    j: TrainingJudgement, series: ContentionSeries, issues: list[str], uneven: str, prof: GpuProfile
) -> tuple[str, list[str]]:
    sig = j.signals
    if j.contention is not None:
        cmp = compare_checklists(series.baseline, series.degraded)
        slow = (
            f"throughput dropped {sig.drop_pct:.1f}% (steady TGS {sig.early:.0f} -> {sig.late:.0f})"
            if sig.regression
            else (segment_text(sig) or "step time rose")
        )
        root, chain = cause_root_and_chain(j.contention, cmp, slow, prof)
        if not root and j.event is not None:
            root, chain = event_root_and_chain(j.event, sig, uneven)
        if not root:
            root = (
                f"Throughput dropped {sig.drop_pct:.1f}% but no contention source moved clearly; compare with a baseline job (jobdiagd compare)."
                if sig.regression
                else f"Sustained slowdown ({slow}) but no contention source moved clearly; compare with a baseline job (jobdiagd compare)."
            )
        return root, chain
    if j.rdma_out:
        rdma_out = j.rdma_out
        return (
            f"Constant RDMA retransmit load on {', '.join(rdma_out)}: every collective pays for it (constant TGS drop). Run --playbook network-health for device/port.",
            [
                f"degraded RDMA link on {', '.join(rdma_out)}",
                "retransmits in every collective",
                "uniformly slower steps",
            ],
        )
    root = (
        "Training stable: step time consistent apart from checkpoint steps; no contention source stands out."
        if not issues
        else "; ".join(issues)
    )
    return root, []


TRAINING_NEXT_STEPS = {
    Verdict.IO_CONTENTION: [
        "Check NFS/storage health; consider async checkpointing or a longer checkpoint_period."
    ],
    Verdict.THERMAL_THROTTLE: ["Check cooling on the hot nodes."],
    Verdict.RDMA_DEGRADATION: [
        "Run --playbook network-health to find the device/port; exclude the node if it persists."
    ],
    Verdict.RESTORE_RESOURCE_LEAK: [
        "Known Orbax single-replica restore leak: use the dispatcher path (jax.device_put) or restart fresh."
    ],
    Verdict.HEALTHY: [],
}


def training_next_steps(j: TrainingJudgement, chain: list[str]) -> list[str]:
    nxt = list(TRAINING_NEXT_STEPS[j.verdict])
    if j.verdict == Verdict.RDMA_DEGRADATION and chain and chain[0].startswith("TCP"):
        nxt = [
            f"Check the host network of {', '.join(j.anomalous) or 'the nodes'} (NIC errors, NFS/gRPC traffic); "
            "run --playbook network-health."
        ]
    if j.verdict == Verdict.HEALTHY and j.anomalous:
        nxt = [
            f"Check {', '.join(j.anomalous)} for background processes (top/ps); exclude the node if it recurs."
        ]
    if j.leak is not None and j.leak.suspected:
        # A suspicion is confirmed by the comparison first; the known-leak advice comes after it.
        nxt = [
            *(x for x in nxt if "Known Orbax" not in x),
            "Compare against a fresh start with the same config: `jobdiagd compare <fresh job> <this job>` "
            "(a uniform hw_procs_running delta on every host confirms the leak).",
            "If confirmed: enable Orbax's dispatcher path (jax.device_put broadcast) or port it to "
            "_merge_globalized_replicas; jax.clear_caches() does not release the communicators.",
        ]
    return nxt


def render_training(
    env: PlaybookEnv,
    span: Window,
    series: ContentionSeries,
    j: TrainingJudgement,
    uneven: str,
) -> PlaybookResult:
    """The report of a judged training run: metrics, contention checklist, restore leak, next steps."""
    ctx, th, tl = env.ctx, env.th, env.disc.timeline
    start, end = span
    issues = training_issues(j.signals, th)
    root, chain = training_root_and_chain(j, series, issues, uneven, env.profile)
    leak = j.leak
    if j.leak_is_diagnosis and leak is not None:
        # Nothing else explains the job: the suspicion is the diagnosis, not "healthy".
        root = leak.summary + (f" Otherwise: {root}" if root else "")
        chain = [
            f"single-replica restore from step {ctx.restored_from_step}",
            "extra NCCL/RCCL communicator-init wave (restore broadcast)",
            "communicators + polling threads cached for the rest of the job (suspected)",
            "persistent CPU contention, small TGS drop",
        ]
    findings = [
        metrics_finding(j.signals, tl, issues, th, ctx.checkpoint_period),
        Finding(
            "Contention checklist",
            root,
            "warning" if root.startswith("Training-level root cause") else "info",
            evidence=[checklist_table(series, start, end, th)],
        ),
    ]
    if leak is not None:
        findings.append(
            Finding(
                "Single-replica checkpoint restore",
                leak.summary,
                "warning" if leak.suspected else "info",
                evidence=[
                    EvidenceTable(
                        "Restore-leak evidence (runbook: Checkpointing interference)",
                        "triage config/progress; ray_logs/<head>/worker-*.out; avg_over_time(hw_procs_running) over steady training",
                        ("Check", "Value", "Note"),
                        list(leak.rows),
                    )
                ],
            )
        )
    return PlaybookResult(
        playbook=TrainingStabilityPlaybook.name,
        analysis_type=TrainingStabilityPlaybook.analysis_type,
        verdict=j.verdict,
        window=(start, end),
        findings=findings,
        anomalous_hosts=j.anomalous,
        root_cause=root,
        chain=chain,
        next_steps=training_next_steps(j, chain),
        incident=j.windows[1][0] if j.windows is not None else None,
    )


class TrainingStabilityPlaybook:
    name = "training-stability"
    analysis_type = "training-stability"

    async def run(self, env: PlaybookEnv) -> PlaybookResult:
        ctx, th, tl = env.ctx, env.th, env.disc.timeline
        start, end = training_span(env)
        sig = training_signals(
            tl, checkpoint_period=ctx.checkpoint_period, async_ckpt=ctx.async_checkpointing, th=th
        )
        series = await fetch_contention(env, start, end, contention_windows(sig, start))
        judged = judge_training(
            sig,
            tl,
            series,
            fetch_restore_leak(env, series.whole),
            restored_from_step=ctx.restored_from_step,
            prof=env.profile,
            th=th,
        )
        uneven = ""
        if judged.event is not None and series.windows is not None:
            uneven = await uneven_gpus(env, *series.windows)
        return render_training(env, (start, end), series, judged, uneven)
