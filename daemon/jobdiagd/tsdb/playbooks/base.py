"""The playbook interface, the result/evidence model every playbook returns, and shared numeric helpers.

Every playbook's `run` is fetch -> judge -> render: `fetch_*` queries the TSDB through the client
into a frozen `*Series` of plain values (the only I/O); `judge_*` is pure (series and plain facts
in, a frozen `*Judgement` with its `Verdict` and the evidence of each rule out; no client, no
clock; unit-tested on in-memory series in tests/tsdb/test_*_judge.py); `render_*` words the
judgement into the `PlaybookResult` (root cause, chain, findings, evidence tables, next steps).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from jobdiagd.model.kinds import GpuState, JobStatus
from jobdiagd.tsdb.client import PromClient, Sample, multi_arm, regex_union, split_arms
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.context import short_host as short_host  # re-exported for playbooks and hooks
from jobdiagd.tsdb.discovery import Discovery
from jobdiagd.tsdb.settings import GpuProfile, Thresholds, TsdbSettings


class Verdict(StrEnum):
    """The fixed verdict set every playbook chooses from (rule PB-MAP-2); values are the report text."""

    HEALTHY = "healthy"
    RCCL_BUSY_WAIT_HANG = "rccl-busy-wait-hang"
    DEAD_NODE = "dead-node"
    NETWORK_PARTITION = "network-partition"
    HEARTBEAT_FALSE_POSITIVE = "heartbeat-false-positive"
    HANG_THEN_HEARTBEAT = "hang-then-heartbeat"
    HOST_OOM_RAMP = "host-oom-ramp"
    CHECKPOINT_OOM = "checkpoint-oom"
    HARDWARE_FAULT = "hardware-fault"
    RDMA_DEGRADATION = "rdma-degradation"
    RESTORE_RESOURCE_LEAK = "restore-resource-leak"
    THERMAL_THROTTLE = "thermal-throttle"
    IO_CONTENTION = "io-contention"


VERDICTS: tuple[str, ...] = tuple(v.value for v in Verdict)


@dataclass
class EvidenceTable:
    """Per-host (per-GPU) values straight from query results."""

    title: str
    query: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]] = field(default_factory=list)


@dataclass
class Finding:
    title: str
    summary: str
    severity: str = "info"  # info | warning | critical
    hosts: tuple[str, ...] = ()
    evidence: list[EvidenceTable] = field(default_factory=list)


@dataclass(kw_only=True, frozen=True)
class PlaybookResult:
    """One playbook's answer (rule PB-MAP-2); keyword-only, immutable: adjust with `dataclasses.replace`."""

    playbook: str
    analysis_type: str
    verdict: Verdict
    window: tuple[float, float]
    findings: list[Finding] = field(default_factory=list)
    anomalous_hosts: list[str] = field(default_factory=list)
    root_cause: str = ""
    chain: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    triage_correlation: str = ""
    incident: float | None = (
        None  # when the problem began, if the playbook located it (earliest-anomaly sweep)
    )
    applicable: bool = True  # False: the playbook's trigger is absent (nothing to sweep around)

    def __post_init__(self) -> None:
        # A plain string of the fixed set is accepted (and stored as the enum); anything else is a bug.
        try:
            verdict = Verdict(self.verdict)
        except ValueError:
            raise ValueError(f"unknown verdict {self.verdict!r}") from None
        object.__setattr__(self, "verdict", verdict)


def not_applicable(
    playbook: str, analysis_type: str, env: PlaybookEnv, title: str, root: str, next_step: str
) -> PlaybookResult:
    """The playbook's trigger is absent (no hang, no heartbeat error): say so, never invent one."""
    return PlaybookResult(
        playbook=playbook,
        analysis_type=analysis_type,
        verdict=Verdict.HEALTHY,
        window=(env.disc.min_time, env.disc.max_time),
        findings=[Finding(title, root, "info")],
        root_cause=root,
        next_steps=[next_step],
        applicable=False,
    )


@dataclass
class PlaybookEnv:
    client: PromClient
    ctx: DiagnosisContext
    disc: Discovery
    settings: TsdbSettings
    now: float

    @property
    def th(self) -> Thresholds:
        return self.settings.thresholds

    @property
    def profile(self) -> GpuProfile:
        return self.settings.profile(self.disc.gpu_model)

    async def arms(self, arms: Mapping[str, str], at: float) -> dict[str, list[Sample]]:
        """Evaluate several expressions in one request."""
        if not arms:
            return {}
        res = split_arms(await self.client.query_vector(multi_arm(arms), at))
        return {k: res.get(k, []) for k in arms}


class Playbook(Protocol):
    name: str
    analysis_type: str

    async def run(self, env: PlaybookEnv) -> PlaybookResult: ...


# --- helpers -------------------------------------------------------------------------------------------


def host_regex(hosts: Iterable[str]) -> str:
    """A PromQL `host=~` value matching these short names with or without a domain suffix."""
    return "(" + regex_union(sorted(set(hosts))) + ")(\\\\..+)?"


def host_of(labels: Mapping[str, str]) -> str:
    """Short host of a series. Ray exporters of some versions label by `ip` only; their scrape target
    (`instance`, e.g. node001:55080 in the job scripts) still names the host."""
    if labels.get("host"):
        return short_host(labels["host"])
    inst = labels.get("instance", "").rsplit(":", 1)[0]
    if inst and not inst.replace(".", "").isdigit():
        return short_host(inst)
    return labels.get("ip") or inst or "?"


def gpu_of(labels: Mapping[str, str]) -> str:
    return labels.get("gpu") or labels.get("GpuIndex") or ""


def by_host(samples: Iterable[Sample]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in samples:
        if not math.isnan(s.v):
            h = host_of(s.labels)
            out[h] = out.get(h, 0.0) + s.v
    return out


def by_gpu(samples: Iterable[Sample]) -> dict[tuple[str, str], float]:
    return {(host_of(s.labels), gpu_of(s.labels)): s.v for s in samples if not math.isnan(s.v)}


def dur(seconds: float) -> str:
    """A PromQL duration of at least one second."""
    return f"{max(1, int(math.ceil(seconds)))}s"


def median(vals: Iterable[float]) -> float:
    v = [x for x in vals if not math.isnan(x)]
    return statistics.median(v) if v else 0.0


def outliers_high(values: Mapping[str, float], *, factor: float, floor: float) -> list[str]:
    """Keys whose value exceeds both an absolute floor and `factor` x the median of the others."""
    out: list[str] = []
    for k, v in values.items():
        others = [x for kk, x in values.items() if kk != k]
        base = median(others) if others else 0.0
        if v > floor and v > factor * max(base, floor / factor if factor else 0.0):
            out.append(k)
    return sorted(out)


def fmt(v: float | None, unit: str = "", digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if abs(v) >= 1e6 and not unit:
        return f"{v:.3g}"
    return f"{v:.{digits}f}{unit}"


def gpu_state(util: float | None, power: float | None, prof: GpuProfile, th: Thresholds) -> GpuState:
    """Classify one GPU from mean utilization and power (Playbook 1's signature table)."""
    if power is None and util is None:
        return GpuState.ABSENT
    p = power if power is not None else float("nan")
    u = util if util is not None else float("nan")
    if not math.isnan(p) and p >= prof.train_power_min_w * 0.9:
        return GpuState.TRAINING
    if not math.isnan(u) and u >= th.busy_util_pct:
        if not math.isnan(p) and p <= prof.busy_wait_power_max_w * 1.15:
            return GpuState.BUSY_WAIT
        return GpuState.BUSY
    if not math.isnan(p) and p <= prof.idle_power_max_w and (math.isnan(u) or u <= th.idle_util_pct):
        return GpuState.IDLE
    if not math.isnan(p) and prof.busy_wait_power_min_w * 0.85 <= p <= prof.busy_wait_power_max_w * 1.15:
        return GpuState.BUSY_WAIT if math.isnan(u) else GpuState.LOW_UTIL
    return GpuState.PARTIAL


def linear_fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Slope (per second) and R^2 of a least-squares line."""
    n = len(points)
    if n < 3:
        return 0.0, 0.0
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    if sxx == 0 or syy == 0:
        return 0.0, 0.0
    slope = sxy / sxx
    return slope, (sxy * sxy) / (sxx * syy)


def iso(t: float) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(t, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


# --- windows and per-host/per-GPU collections shared by several playbooks --------------------------------


def scrape_interval(env: PlaybookEnv) -> float:
    return 10.0  # node_hw scrape interval of the job scripts; only used for tolerances


@dataclass(frozen=True)
class HangWindow:
    """The hang window of rule PB-HANG-1: from `start` (a couple of step times after the last step at
    `last`) to `end`, the end of the data."""

    last: float
    start: float
    end: float


def hang_window(env: PlaybookEnv, last_step_t: float | None = None) -> HangWindow:
    """The hang window: it starts a couple of step times after the last step (rule PB-HANG-1).

    last_step_t: when neither the TSDB nor triage dates a step, the caller's estimate (GPU power)."""
    tl = env.disc.timeline
    last = tl.last_time or env.ctx.last_step_time or last_step_t or env.disc.min_time
    st = tl.median_step_time() or env.ctx.step_time_s or 30.0
    end = env.disc.max_time
    start = last + max(2 * st, 60.0)
    if end - start < 60:
        start = max(last, end - 60)
    return HangWindow(last, start, end)


def stall_budget(env: PlaybookEnv) -> float:
    """Idle time after the last step that is still a normal job end (shutdown, final checkpoint), not a stall."""
    st = env.disc.timeline.median_step_time() or env.ctx.step_time_s or 30.0
    return max(5 * st, 300.0)


def final_step(env: PlaybookEnv) -> int | None:
    """The last step the job was configured to run (config steps=T runs steps 0..T-1)."""
    raw = env.ctx.config.get("steps", "")
    return int(raw) - 1 if raw.isdigit() and int(raw) > 0 else None


def no_stall_reason(env: PlaybookEnv) -> str | None:
    """Why there was no hang to explain (the job completed / reached its final step / never stalled), or None.

    The hang window is "from last successful training step to job end": after a successful finish that is
    normal idle time, not a hang.
    """
    tl = env.disc.timeline
    last_step = tl.last_step if tl.last_step is not None else env.ctx.last_step
    last_t = tl.last_time or env.ctx.last_step_time
    fin = final_step(env)
    status = (env.ctx.status or "").lower()
    if status == JobStatus.COMPLETED:
        return f"the job completed successfully (last step {last_step})"
    if fin is not None and last_step is not None and last_step >= fin:
        return f"the last step {last_step} is the configured final step (steps={fin + 1})"
    if last_t is not None and not tl.empty and env.ctx.primary_class is None and not env.ctx.live:
        gap = env.disc.max_time - last_t
        if gap <= stall_budget(env):
            return (
                f"training ran until {gap:.0f} s before the end of the data (within the "
                f"{stall_budget(env):.0f} s stall budget) and triage reports no failure"
            )
    return None


def training_span(env: PlaybookEnv) -> tuple[float, float]:
    """Wall-clock span of steady training (after warmup), or the whole TSDB range."""
    tl = env.disc.timeline
    if tl.empty or tl.first_time is None or tl.last_time is None:
        return env.disc.min_time, env.disc.max_time
    warm = tl.time_of_step((tl.first_step or 0) + env.th.warmup_steps) or tl.first_time
    if tl.last_time - warm < 120:
        warm = tl.first_time
    return warm, tl.last_time


def per_gpu_rows(  # noqa: D103
    keys: Iterable[tuple[str, str]],
    cols: Sequence[Mapping[tuple[str, str], float]],
    fmts: Sequence[str],
    note: Mapping[tuple[str, str], str],
) -> list[tuple[str, ...]]:
    rows = []
    for k in sorted(keys, key=lambda x: (x[0], int(x[1]) if x[1].isdigit() else 0)):
        vals = tuple(fmt(c.get(k), u) for c, u in zip(cols, fmts, strict=True))
        rows.append((k[0], k[1], *vals, note.get(k, "")))
    return rows


def present(env: PlaybookEnv, arms: Mapping[str, str], needs: Mapping[str, str]) -> dict[str, str]:
    """Keep the arms whose metric exists in this TSDB (needs: arm -> metric name)."""
    return {k: v for k, v in arms.items() if env.disc.has(needs.get(k, "")) or k not in needs}
