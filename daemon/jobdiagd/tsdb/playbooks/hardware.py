"""Playbook 4: node failure / hardware -- RAS UE/CE, PCIe, RDMA port state, dmesg GPU errors, temperature before the crash.

Runbook: "healthy nodes should have zero RAS/PCIe errors. Any node with non-zero values is the problem."
So any non-zero RAS or PCIe counter makes its host anomalous and the verdict hardware-fault; with
correctable errors only (no UE, no PCIe fatal) the root cause says "degrading" (not immediately fatal).
`ce_warn_count` only grades the wording ("high" correctable-error counts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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
from jobdiagd.tsdb.playbooks.errors import GpuErrors, collect_errors, error_arms
from jobdiagd.tsdb.settings import GpuProfile, Thresholds


@dataclass(frozen=True)
class PortState:
    """The lowest state of one RDMA port over the job (1 = up)."""

    host: str
    device: str
    port: str
    state: float


@dataclass(frozen=True)
class HardwareSeries:
    """What the hardware judgement reads from the TSDB (fetch step)."""

    lo: float
    hi: float
    crash: float
    errors: GpuErrors
    dmesg: Mapping[str, float] = field(default_factory=dict)  # host -> new dmesg GPU errors in the job
    dmesg_total: Mapping[str, float] = field(default_factory=dict)
    oom: Mapping[str, float] = field(default_factory=dict)
    last_seen: Mapping[str, float] = field(default_factory=dict)  # host -> newest scrape
    ports: Sequence[PortState] = ()
    temp_pre: Mapping[tuple[str, str], float] = field(
        default_factory=dict
    )  # max in the 10 min before the crash
    temp_med: Mapping[tuple[str, str], float] = field(default_factory=dict)

    @property
    def counter_keys(self) -> set[tuple[str, str]]:
        """Every (host, gpu) with a RAS or PCIe counter."""
        err = self.errors
        return set(err.ue) | set(err.ce) | {k for v in err.pcie.values() for k in v}


@dataclass(frozen=True)
class HardwareJudgement:
    """The verdict of the hardware playbook and the evidence per rule (judge step; no prose)."""

    verdict: Verdict
    anomalous: list[str]
    ue_gpus: list[tuple[str, str]]  # uncorrectable RAS errors (PB-HW-1)
    pcie_fatal: list[tuple[str, str]]  # PCIe fatal errors (PB-HW-1)
    dmesg_hosts: list[str]  # kernel GPU driver errors (PB-HW-1)
    down: list[tuple[str, str, str]]  # RDMA ports down: (host, device, port) (PB-HW-2)
    ce_any: list[tuple[str, str]]  # any correctable RAS error (PB-HW-3)
    ce_high: list[tuple[str, str]]  # >= ce_warn_count correctable errors (PB-HW-3)
    pcie_soft: list[tuple[str, str]]  # PCIe correctable / non-fatal errors (PB-HW-3)
    degrading: bool  # correctable errors only: "degrading, not immediately fatal" (PB-HW-3)
    hot: list[tuple[str, str]]  # at or above the thermal limit before the crash (PB-HW-4)
    early_stop: list[str]  # stopped reporting before the crash (PB-HW-5)


def judge_hardware(
    data: HardwareSeries, hosts: Sequence[str], prof: GpuProfile, th: Thresholds
) -> HardwareJudgement:
    """Pure: the error counters in, the verdict and its evidence out (rules PB-HW-1..5, in that order)."""
    err = data.errors
    ue_gpus = sorted(k for k, v in err.ue.items() if v > 0)
    pcie_fatal = sorted(k for k, v in err.pcie.get("fatal", {}).items() if v > 0)
    dmesg_hosts = sorted(h for h, v in data.dmesg.items() if v > 0)
    down = sorted({(p.host, p.device, p.port) for p in data.ports if p.state < 1})
    hot = sorted(k for k, v in data.temp_pre.items() if v >= prof.temp_limit_c)
    # Hosts whose newest scrape is older than the crash (or beyond the lookback: absent) stopped early.
    early_stop = (
        sorted(h for h in hosts if data.last_seen.get(h, 0.0) < data.crash - 60) if data.last_seen else []
    )
    ce_any = sorted(k for k, v in err.ce.items() if v > 0)
    pcie_soft = sorted(
        {k for kind in ("correctable", "nonfatal") for k, v in err.pcie.get(kind, {}).items() if v > 0}
    )
    verdict = Verdict.HEALTHY
    anomalous: set[str] = set()
    if ue_gpus or pcie_fatal or dmesg_hosts:
        verdict = Verdict.HARDWARE_FAULT
        anomalous |= {h for h, _ in ue_gpus} | {h for h, _ in pcie_fatal} | set(dmesg_hosts)
    if down:
        verdict = Verdict.HARDWARE_FAULT
        anomalous |= {h for h, _, _ in down}
    degrading = False
    if ce_any or pcie_soft:
        degrading = verdict == Verdict.HEALTHY
        verdict = Verdict.HARDWARE_FAULT
        anomalous |= {h for h, _ in ce_any} | {h for h, _ in pcie_soft}
    if hot and verdict == Verdict.HEALTHY:
        verdict = Verdict.THERMAL_THROTTLE
        anomalous |= {h for h, _ in hot}
    if verdict == Verdict.HEALTHY and early_stop:
        verdict = Verdict.DEAD_NODE
        anomalous |= set(early_stop)
    return HardwareJudgement(
        verdict=verdict,
        anomalous=sorted(anomalous),
        ue_gpus=ue_gpus,
        pcie_fatal=pcie_fatal,
        dmesg_hosts=dmesg_hosts,
        down=down,
        ce_any=ce_any,
        ce_high=sorted(k for k, v in err.ce.items() if v >= th.ce_warn_count),
        pcie_soft=pcie_soft,
        degrading=degrading,
        hot=hot,
        early_stop=early_stop,
    )


# --- fetch ---------------------------------------------------------------------------------------------


async def fetch_hardware(env: PlaybookEnv) -> HardwareSeries:
    """Error counters over the job, link state, liveness, and temperature before the crash (the only I/O)."""
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
    return HardwareSeries(
        lo=lo,
        hi=hi,
        crash=crash,
        errors=collect_errors({k: v for k, v in r.items() if k.startswith(("ras", "pcie"))}),
        dmesg=by_host(r.get("dmesg", [])),
        dmesg_total=by_host(r.get("dmesg_total", [])),
        oom=by_host(r.get("oom", [])),
        last_seen=by_host(r.get("last_seen", [])),
        ports=[
            PortState(host_of(s.labels), s.labels.get("device", "?"), s.labels.get("port", "?"), s.v)
            for s in r.get("port_min", [])
        ],
        temp_pre=by_gpu(rt.get("temp_pre", [])),
        temp_med=by_gpu(rt.get("temp_med", [])),
    )


# --- render --------------------------------------------------------------------------------------------


def hardware_tables(data: HardwareSeries, j: HardwareJudgement, hosts: Sequence[str]) -> list[EvidenceTable]:
    err, hot, full = data.errors, j.hot, dur(data.hi - data.lo + 60)
    rows: list[tuple[str, ...]] = []
    keys = data.counter_keys
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
                fmt(data.temp_pre.get(k), "C"),
                fmt(data.temp_med.get(k), "C"),
                "; ".join(err.blocks.get(k, [])) or ("hot" if k in hot else ""),
            )
        )
    gpu_table = EvidenceTable(
        "GPU error counters over the job and temperature before the crash"
        + ("" if len(keys) <= 32 else " (GPUs with non-zero values only; all others are zero)"),
        f"max_over_time(hw_gpu_ras_*_{{ue,ce}}_total[{full}]), hw_gpu_pcie_*_total, max_over_time(hw_gpu_temperature_celsius[10m]) at {iso(data.crash)}",
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
                f"{fmt(data.dmesg.get(h, 0), digits=0)} / {fmt(data.dmesg_total.get(h, 0), digits=0)}",
                ", ".join(f"{d}:{p}" for hh, d, p in j.down if hh == h) or "none",
                fmt(data.oom.get(h, 0), digits=0),
                iso(data.last_seen[h]) if h in data.last_seen else "n/a",
            )
            for h in sorted(set(hosts))
        ],
    )
    return [gpu_table, host_table]


def soft_error_causes(data: HardwareSeries, j: HardwareJudgement, th: Thresholds) -> list[str]:
    """The correctable / non-fatal error parts of the root cause (rule PB-HW-3)."""
    err = data.errors
    soft: list[str] = []
    if j.ce_any:
        soft.append(
            ("high " if any(err.ce[k] >= th.ce_warn_count for k in j.ce_any) else "")
            + "correctable RAS errors on "
            + ", ".join(
                f"{h}:gpu{g} ({err.ce[(h, g)]:.0f} CE, {err.ce_new.get((h, g), 0):.0f} new in job)"
                for h, g in j.ce_any
            )
        )
    if j.pcie_soft:
        soft.append(
            "PCIe correctable/non-fatal errors on " + ", ".join(f"{h}:gpu{g}" for h, g in j.pcie_soft)
        )
    return soft


def hardware_causes(
    data: HardwareSeries, j: HardwareJudgement, prof: GpuProfile, th: Thresholds
) -> tuple[list[str], list[str]]:
    """(causes, chain): the parts of the root cause in rule order, and the failure chain."""
    causes: list[str] = []
    chain: list[str] = []
    if j.ue_gpus or j.pcie_fatal or j.dmesg_hosts:
        if j.ue_gpus:
            causes.append("uncorrectable RAS errors on " + ", ".join(f"{h}:gpu{g}" for h, g in j.ue_gpus))
        if j.pcie_fatal:
            causes.append("PCIe fatal errors on " + ", ".join(f"{h}:gpu{g}" for h, g in j.pcie_fatal))
        if j.dmesg_hosts:
            causes.append("kernel GPU driver errors on " + ", ".join(j.dmesg_hosts))
        chain = [
            "GPU hardware fault (" + "; ".join(causes) + ")",
            "driver error / process abort",
            "node exits",
            "job fails",
        ]
    if j.down:
        causes.append(
            "RDMA link down on "
            + ", ".join(f"{h} {d}:{p}" for h, d, p in j.down)
            + " (physical layer: check cable/switch port)"
        )
    soft = soft_error_causes(data, j, th)
    if soft and j.degrading:
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
    if j.verdict == Verdict.THERMAL_THROTTLE:
        causes.append(
            f"GPU temperature >= {prof.temp_limit_c:.0f}C before the crash on "
            + ", ".join(f"{h}:gpu{g}" for h, g in j.hot)
        )
    if j.verdict == Verdict.DEAD_NODE:
        causes.append(
            f"{', '.join(j.early_stop)} stopped reporting before the crash without hardware counters moving"
            + (" (OOM kill)" if any(data.oom.get(h, 0) > 0 for h in j.early_stop) else "")
        )
    return causes, chain


def render_hardware(env: PlaybookEnv, data: HardwareSeries, j: HardwareJudgement) -> PlaybookResult:
    """The report of a judged hardware check: counters tables, root cause, chain, next steps."""
    hosts = env.disc.hosts
    causes, chain = hardware_causes(data, j, env.profile, env.th)
    root = (
        "; ".join(causes)
        if causes
        else (
            "No hardware errors: all RAS/PCIe counters zero, RDMA links up, no dmesg GPU errors, temperatures normal."
            if data.counter_keys
            else "No hardware errors found: RDMA links up, no dmesg GPU errors, temperatures normal (no RAS/PCIe counters in this TSDB)."
        )
    )
    findings = [
        Finding(
            "Hardware counters",
            root,
            "critical" if j.verdict != Verdict.HEALTHY else "info",
            tuple(j.anomalous),
            hardware_tables(data, j, hosts),
        )
    ]
    if j.ce_high:
        findings.append(
            Finding(
                "Correctable errors",
                "High correctable-error counts (degrading hardware, not immediately fatal) on "
                + ", ".join(f"{h}:gpu{g}" for h, g in j.ce_high),
                "warning",
                tuple(sorted({h for h, _ in j.ce_high})),
            )
        )
    if any(data.oom.get(h, 0) > 0 for h in hosts):
        findings.append(
            Finding(
                "Host OOM",
                "hw_oom_kills_total increased on "
                + ", ".join(h for h in hosts if data.oom.get(h, 0) > 0)
                + ": run --playbook oom.",
                "warning",
            )
        )
    nxt: list[str] = []
    if j.verdict == Verdict.HARDWARE_FAULT:
        nxt = [
            "Drain the affected node(s) for maintenance and resubmit with --exclude=" + ",".join(j.anomalous)
        ]
    if j.verdict == Verdict.THERMAL_THROTTLE:
        nxt = ["Check cooling on the hot node(s); compare clocks during the hot period."]
    if j.verdict == Verdict.HEALTHY:
        nxt = ["No hardware cause in the TSDB; check core dumps and the failed task's output."]
    return PlaybookResult(
        playbook=HardwarePlaybook.name,
        analysis_type=HardwarePlaybook.analysis_type,
        verdict=j.verdict,
        window=(data.lo, data.hi),
        findings=findings,
        anomalous_hosts=j.anomalous,
        root_cause=root,
        chain=chain,
        next_steps=nxt,
    )


class HardwarePlaybook:
    name = "hardware"
    analysis_type = "hardware"

    async def run(self, env: PlaybookEnv) -> PlaybookResult:
        data = await fetch_hardware(env)
        return render_hardware(env, data, judge_hardware(data, env.disc.hosts, env.profile, env.th))
