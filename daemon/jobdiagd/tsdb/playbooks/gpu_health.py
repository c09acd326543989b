"""Playbook 5: GPU health summary -- temperatures, power, clocks, VRAM, utilization, RAS/PCIe error counters.

"Anomalous GPUs: <list of host:gpu with any non-zero errors or outlier metrics>": any non-zero RAS (CE or UE)
or PCIe counter makes that host:gpu anomalous. The verdict follows the hardware playbook: uncorrectable or
fatal errors are a hardware fault; correctable-only (RAS CE, PCIe correctable/non-fatal) counters are
degrading hardware, also reported as hardware-fault with a root cause that says "degrading" and not fatal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from jobdiagd.tsdb.playbooks.base import (
    EvidenceTable,
    Finding,
    PlaybookEnv,
    PlaybookResult,
    Verdict,
    by_gpu,
    dur,
    fmt,
    median,
    per_gpu_rows,
    present,
    training_span,
)
from jobdiagd.tsdb.playbooks.errors import GpuErrors, collect_errors, error_arms
from jobdiagd.tsdb.settings import GpuProfile


def _stats(vals: dict[tuple[str, str], float]) -> tuple[float, float, float]:
    v = list(vals.values())
    return (min(v), max(v), sum(v) / len(v)) if v else (float("nan"),) * 3


GpuValues = dict[tuple[str, str], float]


@dataclass(frozen=True)
class GpuHealthSeries:
    """What the GPU-health judgement reads (fetch step): per-GPU aggregates over steady training
    (arm -> (host, gpu) -> value, arms as in `GPU_ARMS`) and the error counters over the job."""

    start: float
    end: float
    gauges: Mapping[str, GpuValues]
    errors: GpuErrors

    def arm(self, name: str) -> GpuValues:
        return dict(self.gauges.get(name, {}))


@dataclass(frozen=True)
class GpuHealthJudgement:
    """The verdict of the GPU-health playbook and the anomalous GPUs per rule PB-GH-1 (no prose)."""

    verdict: Verdict
    hot: list[tuple[str, str]]  # max temperature at or over the limit
    low_power: list[tuple[str, str]]  # < 85 % of the cluster median power
    low_clock: list[tuple[str, str]]  # < 90 % of the cluster median clock
    ue: list[tuple[str, str]]
    fatal: list[tuple[str, str]]  # PCIe fatal
    ce: list[tuple[str, str]]  # correctable RAS errors (GPUs without UE)
    pcie_soft: list[tuple[str, str]]  # PCIe correctable / non-fatal (GPUs without fatal)
    anomalous_gpus: list[tuple[str, str]]

    @property
    def anomalous_hosts(self) -> list[str]:
        return sorted({h for h, _ in self.anomalous_gpus})


def judge_gpu_health(data: GpuHealthSeries, prof: GpuProfile) -> GpuHealthJudgement:
    """Pure: the per-GPU aggregates and counters in, the verdict out (rule PB-GH-1)."""
    err = data.errors
    t_max, p_avg, s_avg = data.arm("temp_max"), data.arm("power_avg"), data.arm("sclk_avg")
    med_p, med_s = median(p_avg.values()), median(s_avg.values())
    hot = [k for k, v in t_max.items() if v >= prof.temp_limit_c]
    low_p = [k for k, v in p_avg.items() if med_p > 0 and v < 0.85 * med_p]
    low_s = [k for k, v in s_avg.items() if med_s > 0 and v < 0.9 * med_s]
    ue = [k for k, v in err.ue.items() if v > 0]
    fatal = [k for k, v in err.pcie.get("fatal", {}).items() if v > 0]
    ce = [k for k, v in err.ce.items() if v > 0 and k not in ue]
    pcie_soft = sorted(
        {k for kind in ("correctable", "nonfatal") for k, v in err.pcie.get(kind, {}).items() if v > 0}
        - set(fatal)
    )
    if ue or fatal or ce or pcie_soft:
        verdict = Verdict.HARDWARE_FAULT
    elif hot and (set(hot) & (set(low_s) | set(low_p))):
        verdict = Verdict.THERMAL_THROTTLE
    else:
        verdict = Verdict.HEALTHY
    return GpuHealthJudgement(
        verdict=verdict,
        hot=hot,
        low_power=low_p,
        low_clock=low_s,
        ue=ue,
        fatal=fatal,
        ce=ce,
        pcie_soft=pcie_soft,
        anomalous_gpus=sorted({*hot, *low_p, *low_s, *ue, *fatal, *ce, *pcie_soft}),
    )


# --- fetch ---------------------------------------------------------------------------------------------


async def fetch_gpu_health(env: PlaybookEnv) -> GpuHealthSeries:
    """Per-GPU aggregates over steady training and the error counters over the job (the only I/O)."""
    start, end = training_span(env)
    w = dur(end - start)
    arms = present(
        env,
        {
            "temp_avg": f"avg_over_time(hw_gpu_temperature_celsius[{w}])",
            "temp_max": f"max_over_time(hw_gpu_temperature_celsius[{w}])",
            "temp_min": f"min_over_time(hw_gpu_temperature_celsius[{w}])",
            "power_avg": f"avg_over_time(hw_gpu_power_watts[{w}])",
            "power_max": f"max_over_time(hw_gpu_power_watts[{w}])",
            "power_min": f"min_over_time(hw_gpu_power_watts[{w}])",
            "sclk_avg": f'avg_over_time(hw_gpu_clock_mhz{{type="sclk"}}[{w}])',
            "sclk_min": f'min_over_time(hw_gpu_clock_mhz{{type="sclk"}}[{w}])',
            "sclk_max": f'max_over_time(hw_gpu_clock_mhz{{type="sclk"}}[{w}])',
            "vram_used": f"max_over_time(hw_gpu_vram_used_bytes[{w}])",
            "vram_total": f"max_over_time(hw_gpu_vram_total_bytes[{w}])",
            "util_avg": f"avg_over_time(ray_node_gpus_utilization[{w}])",
        },
        {
            "temp_avg": "hw_gpu_temperature_celsius",
            "temp_max": "hw_gpu_temperature_celsius",
            "temp_min": "hw_gpu_temperature_celsius",
            "power_avg": "hw_gpu_power_watts",
            "power_max": "hw_gpu_power_watts",
            "power_min": "hw_gpu_power_watts",
            "sclk_avg": "hw_gpu_clock_mhz",
            "sclk_min": "hw_gpu_clock_mhz",
            "sclk_max": "hw_gpu_clock_mhz",
            "vram_used": "hw_gpu_vram_used_bytes",
            "vram_total": "hw_gpu_vram_total_bytes",
            "util_avg": "ray_node_gpus_utilization",
        },
    )
    arms |= error_arms(env, dur(env.disc.max_time - env.disc.min_time + 60))
    r = await env.arms(arms, end)
    return GpuHealthSeries(
        start=start,
        end=end,
        gauges={k: by_gpu(v) for k, v in r.items() if not k.startswith(("ras", "pcie"))},
        errors=collect_errors({k: v for k, v in r.items() if k.startswith(("ras", "pcie"))}),
    )


# --- render --------------------------------------------------------------------------------------------


def gpu_notes(data: GpuHealthSeries, j: GpuHealthJudgement, prof: GpuProfile) -> dict[tuple[str, str], str]:
    notes: dict[tuple[str, str], str] = {}
    for keys, text in (
        (j.hot, f"max temp >= {prof.temp_limit_c:.0f}C; "),
        (j.low_power, "power < 85% of cluster median; "),
        (j.low_clock, "clock < 90% of cluster median; "),
        (j.ue, "uncorrectable RAS errors; "),
        (j.fatal, "PCIe fatal; "),
    ):
        for k in keys:
            notes[k] = notes.get(k, "") + text
    for k in j.ce:
        notes[k] = notes.get(k, "") + f"{data.errors.ce[k]:.0f} correctable RAS errors; "
    for k in j.pcie_soft:
        notes[k] = notes.get(k, "") + "PCIe correctable/non-fatal errors; "
    return notes


def health_summary(data: GpuHealthSeries, j: GpuHealthJudgement, prof: GpuProfile) -> str:
    """The runbook's GPU Health Summary block."""
    g, err = data.gauges, data.errors
    t_avg, t_max, p_avg, s_avg = (
        data.arm("temp_avg"),
        data.arm("temp_max"),
        data.arm("power_avg"),
        data.arm("sclk_avg"),
    )
    gpus = set(t_avg) | set(p_avg)
    med_s = median(s_avg.values())
    tmin, _, _ = _stats(g.get("temp_min", {}) or t_avg)
    _, _, tav = _stats(t_avg)
    pmin, _, _ = _stats(g.get("power_min", {}) or p_avg)
    _, pmax, pav = _stats(p_avg)
    smin, smax, _ = _stats(g.get("sclk_min", {}) or s_avg)
    _, _, umean = _stats(data.arm("util_avg"))
    umin, umax, _ = _stats(data.arm("util_avg"))
    vu, vt = sum(g.get("vram_used", {}).values()), sum(g.get("vram_total", {}).values())
    pcie = {k: sum(v.values()) for k, v in err.pcie.items()}
    hosts = sorted({h for h, _ in gpus})
    return "\n".join(
        [
            f"GPU Health Summary ({len(hosts)} nodes, {len(gpus)} GPUs, {prof.name} thresholds)",
            "",
            f"Temperature:  min {fmt(tmin, 'C')}  max {fmt(max(t_max.values(), default=float('nan')), 'C')}  avg {fmt(tav, 'C')}  (threshold: {prof.temp_limit_c:.0f}C)",
            f"Power:        min {fmt(pmin, 'W')}  max {fmt(max(g.get('power_max', {}).values(), default=pmax), 'W')}  avg {fmt(pav, 'W')}  spread: {fmt(max(p_avg.values(), default=0) - min(p_avg.values(), default=0), 'W')}",
            f"Core clock:   min {fmt(smin, 'MHz', 0)}  max {fmt(max(g.get('sclk_max', {}).values(), default=smax), 'MHz', 0)}  (nominal: {fmt(med_s, 'MHz', 0)})",
            f"VRAM:         {fmt(100 * vu / vt if vt else None, '%')} used  ({vu / 1e9:.0f} GB / {vt / 1e9:.0f} GB)",
            f"Utilization:  min {fmt(umin, '%')}  max {fmt(umax, '%')}  avg {fmt(umean, '%')}",
            "",
            f"RAS Errors:   {sum(err.ce.values()):.0f} correctable, {sum(err.ue.values()):.0f} uncorrectable",
            f"PCIe Errors:  {pcie.get('correctable', 0):.0f} correctable, {pcie.get('nonfatal', 0):.0f} non-fatal, {pcie.get('fatal', 0):.0f} fatal",
            "",
            "Anomalous GPUs: " + (", ".join(f"{h}:{gg}" for h, gg in j.anomalous_gpus) or "none"),
        ]
    )


def gpu_health_root(data: GpuHealthSeries, j: GpuHealthJudgement) -> str:
    err = data.errors
    if j.ue or j.fatal:
        return "Uncorrectable/fatal GPU errors on " + ", ".join(
            f"{h}:gpu{gg}" for h, gg in sorted(set(j.ue) | set(j.fatal))
        )
    if j.ce or j.pcie_soft:
        return (
            "Degrading GPU hardware -- non-zero correctable error counters only (no uncorrectable or fatal "
            "errors: not immediately fatal, but an uncorrectable error or a crash may follow) on "
            + ", ".join(
                f"{h}:gpu{gg}"
                + (f" ({err.ce[(h, gg)]:.0f} RAS CE)" if (h, gg) in err.ce and err.ce[(h, gg)] > 0 else "")
                + (" (PCIe correctable/non-fatal)" if (h, gg) in j.pcie_soft else "")
                for h, gg in sorted(set(j.ce) | set(j.pcie_soft))
            )
        )
    if j.verdict == Verdict.THERMAL_THROTTLE:
        return "GPUs over the thermal limit with reduced clocks/power: " + ", ".join(
            f"{h}:gpu{gg}" for h, gg in sorted(j.hot)
        )
    if j.anomalous_gpus:
        return "Outlier GPUs (no error counters): " + ", ".join(f"{h}:gpu{gg}" for h, gg in j.anomalous_gpus)
    return "All GPUs within normal bands; no error counters."


def render_gpu_health(env: PlaybookEnv, data: GpuHealthSeries, j: GpuHealthJudgement) -> PlaybookResult:
    """The report of a judged GPU health check: the summary block, the per-GPU table, the root cause."""
    prof = env.profile
    t_avg, p_avg = data.arm("temp_avg"), data.arm("power_avg")
    gpus = set(t_avg) | set(p_avg)
    err = data.errors
    keys = gpus if len(gpus) <= 64 else set(j.anomalous_gpus)
    table = EvidenceTable(
        "Per-GPU averages over steady training" + ("" if len(gpus) <= 64 else " (anomalous GPUs only)"),
        f"avg/max_over_time(hw_gpu_*[{dur(data.end - data.start)}]) at end of training",
        ("Host", "GPU", "avg temp", "max temp", "avg power", "avg sclk", "RAS CE", "RAS UE", "notes"),
        per_gpu_rows(
            keys,
            [t_avg, data.arm("temp_max"), p_avg, data.arm("sclk_avg"), err.ce, err.ue],
            ["C", "C", "W", "MHz", "", ""],
            gpu_notes(data, j, prof),
        ),
    )
    findings = [
        Finding(
            "GPU health",
            health_summary(data, j, prof),
            "critical" if j.verdict != Verdict.HEALTHY else ("warning" if j.anomalous_gpus else "info"),
            tuple(j.anomalous_hosts),
            [table],
        )
    ]
    return PlaybookResult(
        playbook=GpuHealthPlaybook.name,
        analysis_type=GpuHealthPlaybook.analysis_type,
        verdict=j.verdict,
        window=(data.start, data.end),
        findings=findings,
        anomalous_hosts=j.anomalous_hosts,
        root_cause=gpu_health_root(data, j),
        chain=[],
        next_steps=[] if j.verdict == Verdict.HEALTHY else ["Drain/inspect the listed GPUs' nodes."],
    )


class GpuHealthPlaybook:
    name = "gpu-health"
    analysis_type = "gpu-health"

    async def run(self, env: PlaybookEnv) -> PlaybookResult:
        data = await fetch_gpu_health(env)
        return render_gpu_health(env, data, judge_gpu_health(data, env.profile))
