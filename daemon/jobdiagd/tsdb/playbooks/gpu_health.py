"""Playbook 5: GPU health summary -- temperatures, power, clocks, VRAM, utilization, RAS/PCIe error counters.

"Anomalous GPUs: <list of host:gpu with any non-zero errors or outlier metrics>": any non-zero RAS (CE or UE)
or PCIe counter makes that host:gpu anomalous. The verdict follows the hardware playbook: uncorrectable or
fatal errors are a hardware fault; correctable-only (RAS CE, PCIe correctable/non-fatal) counters are
degrading hardware, also reported as hardware-fault with a root cause that says "degrading" and not fatal.
"""

from __future__ import annotations

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
from jobdiagd.tsdb.playbooks.errors import collect_errors, error_arms


def _stats(vals: dict[tuple[str, str], float]) -> tuple[float, float, float]:
    v = list(vals.values())
    return (min(v), max(v), sum(v) / len(v)) if v else (float("nan"),) * 3


class GpuHealthPlaybook:
    name = "gpu-health"
    analysis_type = "gpu-health"

    async def run(self, env: PlaybookEnv) -> PlaybookResult:
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
        g = {k: by_gpu(v) for k, v in r.items() if not k.startswith(("ras", "pcie"))}
        err = collect_errors({k: v for k, v in r.items() if k.startswith(("ras", "pcie"))})
        prof = env.profile
        t_avg, t_max, p_avg, s_avg = (
            g.get("temp_avg", {}),
            g.get("temp_max", {}),
            g.get("power_avg", {}),
            g.get("sclk_avg", {}),
        )
        gpus = set(t_avg) | set(p_avg)
        med_p, med_s = median(p_avg.values()), median(s_avg.values())
        notes: dict[tuple[str, str], str] = {}
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
        for k in hot:
            notes[k] = notes.get(k, "") + f"max temp >= {prof.temp_limit_c:.0f}C; "
        for k in low_p:
            notes[k] = notes.get(k, "") + "power < 85% of cluster median; "
        for k in low_s:
            notes[k] = notes.get(k, "") + "clock < 90% of cluster median; "
        for k in ue:
            notes[k] = notes.get(k, "") + "uncorrectable RAS errors; "
        for k in fatal:
            notes[k] = notes.get(k, "") + "PCIe fatal; "
        for k in ce:
            notes[k] = notes.get(k, "") + f"{err.ce[k]:.0f} correctable RAS errors; "
        for k in pcie_soft:
            notes[k] = notes.get(k, "") + "PCIe correctable/non-fatal errors; "
        tmin, _, _ = _stats(g.get("temp_min", {}) or t_avg)
        _, _, tav = _stats(t_avg)
        pmin, _, _ = _stats(g.get("power_min", {}) or p_avg)
        _, pmax, pav = _stats(p_avg)
        smin, smax, _ = _stats(g.get("sclk_min", {}) or s_avg)
        _, _, umean = _stats(g.get("util_avg", {}))
        umin, umax, _ = _stats(g.get("util_avg", {}))
        vu, vt = sum(g.get("vram_used", {}).values()), sum(g.get("vram_total", {}).values())
        pcie = {k: sum(v.values()) for k, v in err.pcie.items()}
        hosts = sorted({h for h, _ in gpus})
        anomalous_gpus = sorted(notes)
        summary = "\n".join(
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
                "Anomalous GPUs: " + (", ".join(f"{h}:{gg}" for h, gg in anomalous_gpus) or "none"),
            ]
        )
        keys = gpus if len(gpus) <= 64 else set(anomalous_gpus)
        table = EvidenceTable(
            "Per-GPU averages over steady training" + ("" if len(gpus) <= 64 else " (anomalous GPUs only)"),
            f"avg/max_over_time(hw_gpu_*[{w}]) at end of training",
            ("Host", "GPU", "avg temp", "max temp", "avg power", "avg sclk", "RAS CE", "RAS UE", "notes"),
            per_gpu_rows(
                keys, [t_avg, t_max, p_avg, s_avg, err.ce, err.ue], ["C", "C", "W", "MHz", "", ""], notes
            ),
        )
        verdict = "healthy"
        root = "All GPUs within normal bands; no error counters."
        if ue or fatal:
            verdict = "hardware-fault"
            root = "Uncorrectable/fatal GPU errors on " + ", ".join(
                f"{h}:gpu{gg}" for h, gg in sorted(set(ue) | set(fatal))
            )
        elif ce or pcie_soft:
            verdict = "hardware-fault"
            root = (
                "Degrading GPU hardware -- non-zero correctable error counters only (no uncorrectable or fatal "
                "errors: not immediately fatal, but an uncorrectable error or a crash may follow) on "
                + ", ".join(
                    f"{h}:gpu{gg}"
                    + (
                        f" ({err.ce[(h, gg)]:.0f} RAS CE)"
                        if (h, gg) in err.ce and err.ce[(h, gg)] > 0
                        else ""
                    )
                    + (" (PCIe correctable/non-fatal)" if (h, gg) in pcie_soft else "")
                    for h, gg in sorted(set(ce) | set(pcie_soft))
                )
            )
        elif hot and (set(hot) & (set(low_s) | set(low_p))):
            verdict = "thermal-throttle"
            root = "GPUs over the thermal limit with reduced clocks/power: " + ", ".join(
                f"{h}:gpu{gg}" for h, gg in sorted(hot)
            )
        elif anomalous_gpus:
            root = "Outlier GPUs (no error counters): " + ", ".join(
                f"{h}:gpu{gg}" for h, gg in anomalous_gpus
            )
        findings = [
            Finding(
                "GPU health",
                summary,
                "critical" if verdict != "healthy" else ("warning" if anomalous_gpus else "info"),
                tuple(sorted({h for h, _ in anomalous_gpus})),
                [table],
            )
        ]
        return PlaybookResult(
            playbook=self.name,
            analysis_type=self.analysis_type,
            verdict=Verdict(verdict),
            window=(start, end),
            findings=findings,
            anomalous_hosts=sorted({h for h, _ in anomalous_gpus}),
            root_cause=root,
            chain=[],
            next_steps=[] if verdict == "healthy" else ["Drain/inspect the listed GPUs' nodes."],
        )
