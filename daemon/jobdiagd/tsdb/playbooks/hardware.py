"""Playbook 4: node failure / hardware -- RAS UE/CE, PCIe, RDMA port state, dmesg GPU errors, temperature before the crash.

Runbook: "healthy nodes should have zero RAS/PCIe errors. Any node with non-zero values is the problem."
So any non-zero RAS or PCIe counter makes its host anomalous and the verdict hardware-fault; with
correctable errors only (no UE, no PCIe fatal) the root cause says "degrading" (not immediately fatal).
`ce_warn_count` only grades the wording ("high" correctable-error counts).
"""

from __future__ import annotations

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
    host_of,
    iso,
    present,
)
from jobdiagd.tsdb.playbooks.errors import collect_errors, error_arms


class HardwarePlaybook:
    name = "hardware"
    analysis_type = "hardware"

    async def run(self, env: PlaybookEnv) -> PlaybookResult:
        lo, hi = env.disc.min_time, env.disc.max_time
        crash = env.ctx.incident_time or env.disc.timeline.last_time or hi
        crash = min(max(crash, lo + 60), hi)
        full = dur(hi - lo + 60)
        arms = error_arms(env, full)
        arms |= present(
            env,
            {
                "dmesg": f"max_over_time(hw_dmesg_gpu_errors_total[{full}]) - min_over_time(hw_dmesg_gpu_errors_total[{full}])",
                "dmesg_total": f"max_over_time(hw_dmesg_gpu_errors_total[{full}])",
                "port_min": f"min by (host, device, port) (min_over_time(hw_rdma_port_state[{full}]))",
                "oom": f"increase(hw_oom_kills_total[{full}])",
                "last_seen": "timestamp(hw_procs_running)",
            },
            {
                "dmesg": "hw_dmesg_gpu_errors_total",
                "dmesg_total": "hw_dmesg_gpu_errors_total",
                "port_min": "hw_rdma_port_state",
                "oom": "hw_oom_kills_total",
                "last_seen": "hw_procs_running",
            },
        )
        r = await env.arms(arms, hi)
        # Temperature in the 10 minutes before the crash vs the job median.
        t_arms = present(
            env,
            {
                "temp_pre": "max_over_time(hw_gpu_temperature_celsius[10m])",
                "temp_med": f"quantile_over_time(0.5, hw_gpu_temperature_celsius[{dur(max(600.0, crash - lo))}])",
            },
            {"temp_pre": "hw_gpu_temperature_celsius", "temp_med": "hw_gpu_temperature_celsius"},
        )
        rt = await env.arms(t_arms, crash)
        err = collect_errors({k: v for k, v in r.items() if k.startswith(("ras", "pcie"))})
        dmesg, dmesg_total = by_host(r.get("dmesg", [])), by_host(r.get("dmesg_total", []))
        oom, last_seen = by_host(r.get("oom", [])), by_host(r.get("last_seen", []))
        ports = [
            (host_of(s.labels), s.labels.get("device", "?"), s.labels.get("port", "?"), s.v)
            for s in r.get("port_min", [])
        ]
        temp_pre, temp_med = by_gpu(rt.get("temp_pre", [])), by_gpu(rt.get("temp_med", []))
        prof, th = env.profile, env.th

        ue_gpus = sorted(k for k, v in err.ue.items() if v > 0)
        ce_gpus = sorted(k for k, v in err.ce.items() if v >= th.ce_warn_count)
        fatal = err.pcie.get("fatal", {})
        pcie_fatal = sorted(k for k, v in fatal.items() if v > 0)
        dmesg_hosts = sorted(h for h, v in dmesg.items() if v > 0)
        down = sorted({(h, d, p) for h, d, p, v in ports if v < 1})
        hot = sorted(k for k, v in temp_pre.items() if v >= prof.temp_limit_c)
        # Hosts whose newest scrape is older than the crash (or beyond the lookback: absent) stopped early.
        early_stop = (
            sorted(h for h in env.disc.hosts if last_seen.get(h, 0.0) < crash - 60) if last_seen else []
        )

        rows: list[tuple[str, ...]] = []
        keys = set(err.ue) | set(err.ce) | {k for v in err.pcie.values() for k in v}
        for k in sorted(keys, key=lambda x: (x[0], int(x[1]) if x[1].isdigit() else 0)):
            bad = (
                err.ue.get(k, 0) > 0
                or err.ce.get(k, 0) > 0
                or any(v.get(k, 0) > 0 for v in err.pcie.values())
                or k in hot
            )
            if not bad and len(keys) > 32:
                continue
            rows.append(
                (
                    k[0],
                    k[1],
                    fmt(err.ue.get(k, 0), digits=0),
                    fmt(err.ue_new.get(k, 0), digits=0),
                    fmt(err.ce.get(k, 0), digits=0),
                    fmt(err.ce_new.get(k, 0), digits=0),
                    "/".join(
                        fmt(err.pcie.get(kind, {}).get(k, 0), digits=0)
                        for kind in ("correctable", "nonfatal", "fatal")
                    ),
                    fmt(temp_pre.get(k), "C"),
                    fmt(temp_med.get(k), "C"),
                    "; ".join(err.blocks.get(k, [])) or ("hot" if k in hot else ""),
                )
            )
        gpu_table = EvidenceTable(
            "GPU error counters over the job and temperature before the crash"
            + ("" if len(keys) <= 32 else " (GPUs with non-zero values only; all others are zero)"),
            f"max_over_time(hw_gpu_ras_*_{{ue,ce}}_total[{full}]), hw_gpu_pcie_*_total, max_over_time(hw_gpu_temperature_celsius[10m]) at {iso(crash)}",
            (
                "Host",
                "GPU",
                "RAS UE",
                "UE new in job",
                "RAS CE",
                "CE new in job",
                "PCIe corr/nonfatal/fatal",
                "temp 10 min before crash",
                "temp median",
                "notes",
            ),
            rows,
        )
        host_table = EvidenceTable(
            "Per-host kernel and link state",
            f"hw_dmesg_gpu_errors_total, min_over_time(hw_rdma_port_state[{full}]), increase(hw_oom_kills_total[{full}])",
            ("Host", "dmesg GPU errors (new / lifetime)", "RDMA ports down", "OOM kills", "last metrics"),
            [
                (
                    h,
                    f"{fmt(dmesg.get(h, 0), digits=0)} / {fmt(dmesg_total.get(h, 0), digits=0)}",
                    ", ".join(f"{d}:{p}" for hh, d, p in down if hh == h) or "none",
                    fmt(oom.get(h, 0), digits=0),
                    iso(last_seen[h]) if h in last_seen else "n/a",
                )
                for h in sorted(set(env.disc.hosts))
            ],
        )
        findings: list[Finding] = []
        anomalous: set[str] = set()
        chain: list[str] = []
        verdict = "healthy"
        causes: list[str] = []
        if ue_gpus or pcie_fatal or dmesg_hosts:
            verdict = "hardware-fault"
            anomalous |= {h for h, _ in ue_gpus} | {h for h, _ in pcie_fatal} | set(dmesg_hosts)
            if ue_gpus:
                causes.append("uncorrectable RAS errors on " + ", ".join(f"{h}:gpu{g}" for h, g in ue_gpus))
            if pcie_fatal:
                causes.append("PCIe fatal errors on " + ", ".join(f"{h}:gpu{g}" for h, g in pcie_fatal))
            if dmesg_hosts:
                causes.append("kernel GPU driver errors on " + ", ".join(dmesg_hosts))
            chain = [
                "GPU hardware fault (" + "; ".join(causes) + ")",
                "driver error / process abort",
                "node exits",
                "job fails",
            ]
        if down:
            verdict = "hardware-fault" if verdict == "healthy" else verdict
            anomalous |= {h for h, _, _ in down}
            causes.append(
                "RDMA link down on "
                + ", ".join(f"{h} {d}:{p}" for h, d, p in down)
                + " (physical layer: check cable/switch port)"
            )
        ce_any = sorted(k for k, v in err.ce.items() if v > 0)
        pcie_soft = sorted(
            {k for kind in ("correctable", "nonfatal") for k, v in err.pcie.get(kind, {}).items() if v > 0}
        )
        if ce_any or pcie_soft:
            degrading = verdict == "healthy"
            verdict = "hardware-fault"
            anomalous |= {h for h, _ in ce_any} | {h for h, _ in pcie_soft}
            soft: list[str] = []
            if ce_any:
                soft.append(
                    ("high " if any(err.ce[k] >= th.ce_warn_count for k in ce_any) else "")
                    + "correctable RAS errors on "
                    + ", ".join(
                        f"{h}:gpu{g} ({err.ce[(h, g)]:.0f} CE, {err.ce_new.get((h, g), 0):.0f} new in job)"
                        for h, g in ce_any
                    )
                )
            if pcie_soft:
                soft.append(
                    "PCIe correctable/non-fatal errors on " + ", ".join(f"{h}:gpu{g}" for h, g in pcie_soft)
                )
            if degrading:
                causes.append(
                    "degrading hardware -- correctable errors only (no uncorrectable or fatal errors: not "
                    "immediately fatal, but healthy GPUs show zero): " + "; ".join(soft)
                )
                chain = [
                    "degrading GPU hardware (" + "; ".join(soft) + ")",
                    "errors still corrected; an uncorrectable error or a crash may follow",
                ]
            else:
                causes.extend(soft)
        if hot and verdict == "healthy":
            verdict = "thermal-throttle"
            anomalous |= {h for h, _ in hot}
            causes.append(
                f"GPU temperature >= {prof.temp_limit_c:.0f}C before the crash on "
                + ", ".join(f"{h}:gpu{g}" for h, g in hot)
            )
        if ce_gpus:
            findings.append(
                Finding(
                    "Correctable errors",
                    "High correctable-error counts (degrading hardware, not immediately fatal) on "
                    + ", ".join(f"{h}:gpu{g}" for h, g in ce_gpus),
                    "warning",
                    tuple(sorted({h for h, _ in ce_gpus})),
                )
            )
        if verdict == "healthy" and early_stop:
            verdict = "dead-node"
            anomalous |= set(early_stop)
            causes.append(
                f"{', '.join(early_stop)} stopped reporting before the crash without hardware counters moving"
                + (" (OOM kill)" if any(oom.get(h, 0) > 0 for h in early_stop) else "")
            )
        root = (
            "; ".join(causes)
            if causes
            else (
                "No hardware errors: all RAS/PCIe counters zero, RDMA links up, no dmesg GPU errors, temperatures normal."
                if keys
                else "No hardware errors found: RDMA links up, no dmesg GPU errors, temperatures normal (no RAS/PCIe counters in this TSDB)."
            )
        )
        findings.insert(
            0,
            Finding(
                "Hardware counters",
                root,
                "critical" if verdict != "healthy" else "info",
                tuple(sorted(anomalous)),
                [gpu_table, host_table],
            ),
        )
        if any(oom.get(h, 0) > 0 for h in env.disc.hosts):
            findings.append(
                Finding(
                    "Host OOM",
                    "hw_oom_kills_total increased on "
                    + ", ".join(h for h in env.disc.hosts if oom.get(h, 0) > 0)
                    + ": run --playbook oom.",
                    "warning",
                )
            )
        nxt = (
            [
                "Drain the affected node(s) for maintenance and resubmit with --exclude="
                + ",".join(sorted(anomalous))
            ]
            if verdict == "hardware-fault"
            else []
        )
        if verdict == "thermal-throttle":
            nxt = ["Check cooling on the hot node(s); compare clocks during the hot period."]
        if verdict == "healthy":
            nxt = ["No hardware cause in the TSDB; check core dumps and the failed task's output."]
        return PlaybookResult(
            playbook=self.name,
            analysis_type=self.analysis_type,
            verdict=Verdict(verdict),
            window=(lo, hi),
            findings=findings,
            anomalous_hosts=sorted(anomalous),
            root_cause=root,
            chain=chain,
            next_steps=nxt,
        )
