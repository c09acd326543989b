"""GPU confirmation of a RAY=1 hang before the step budget: the one query and its pure judgement.

The daemon asks a live job's Prometheus once per scrape interval, only while a step is overdue
(`detectors.hang.early_due_at`), with `early_query`: the raw samples of four metric families of
the runbook's metric catalog over the last few scrapes. `judge` turns them into an
`EarlyVerdict`; it reads no clock and does no I/O (series in, verdict out).

A hang is confirmed only on one of the two signatures of Playbook 1 (RCCL/NCCL Hang), held by
the last two samples of every GPU series of every host of the job:
- busy-wait: every GPU of every host at >= `busy_util_pct` utilization
  (`ray_node_gpus_utilization`) and in or below the busy-wait power band, well under training
  power (`hw_gpu_power_watts`; MI300X: 250-350 W against 600-750 W training, "Key thresholds") --
  the collective spins on a peer that never comes;
- dead node: one or more hosts (never more than the busy-waiting ones) whose GPUs are all idle
  (<= `idle_util_pct`, power below the busy-wait band) with no GPU process left
  (`hw_gpu_user_processes` 0), while every other host busy-waits -- the others wait for it.
  Those hosts are named as the suspects; a uniform busy-wait names none (every rank spins; the
  hang playbook's network trigger search names a host, on the step-budget page or the end report).

What must not confirm, and the catalog's signatures that tell it apart ("Checkpointing
interference", Playbook 3, Playbook 7):
- checkpoint save: GPU utilization and power drop (GPUs wait on the D2H copy and the write)
  while `hw_io_pressure_full_pct`, `hw_procs_blocked` and `hw_mem_dirty_bytes` rise: low
  utilization is not the busy-wait band, and a host with I/O pressure at or above
  `io_pressure_full_pct` vetoes the confirmation outright (a save that hangs in a collective
  is left to the step budget, whose checkpoint phase knows this job's save times);
- eval: forward passes keep the GPUs computing, at high utilization and high power (training
  band or just under it, far above the busy-wait band): state `training`/`busy`, not busy-wait;
- compilation (first step, recompilation): XLA compiles on the host CPU; the GPUs sit at idle
  utilization and near-idle power on every host with their process alive -- no host
  busy-waits, so neither signature holds;
- restore: storage reads (I/O pressure: veto) then compilation, GPUs idle as above. The early
  page is also not armed before this run's steady step time is known (startup and warmup
  phases of `triage.stall`), which is where compilation and restore happen.

Missing or stale data never confirm: a node of the job with no power or no utilization series,
fewer than two samples, a newest sample older than two scrape intervals, or (for a dead-node
suspect) no `hw_gpu_user_processes` series -- the verdict is `no-data` and the step budget stays
the page's only trigger. A host that stopped reporting altogether (a node that died with its
exporter) is therefore left to the step budget too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from jobdiagd.tsdb.client import Series
from jobdiagd.tsdb.context import short_host
from jobdiagd.tsdb.playbooks.base import gpu_of, gpu_state, host_of
from jobdiagd.tsdb.settings import GpuProfile, Thresholds, TsdbSettings, model_from_vram

POWER = "hw_gpu_power_watts"
UTIL = "ray_node_gpus_utilization"
PROCS = "hw_gpu_user_processes"
IO_FULL = "hw_io_pressure_full_pct"
VRAM = "hw_gpu_vram_total_bytes"  # names the GPU model when the config does not
METRICS = (POWER, UTIL, PROCS, IO_FULL, VRAM)

EarlyState = Literal["busy-wait", "dead-node", "not-a-hang", "no-data"]


def window_s(scrape_interval_s: float) -> int:
    """How far back the query reaches: three scrapes, so two samples of the slowest series are in it."""
    return max(1, math.ceil(3 * scrape_interval_s))


def early_query(scrape_interval_s: float) -> str:
    """One instant query of a range selector: the raw samples of the four families (no resampling)."""
    names = "|".join(METRICS)
    return f'{{__name__=~"{names}"}}[{window_s(scrape_interval_s)}s]'


@dataclass(frozen=True)
class EarlyVerdict:
    """What the last two scrapes say. Confirmed only for `busy-wait` and `dead-node`."""

    state: EarlyState
    summary: str
    at: float
    suspects: tuple[str, ...] = ()
    per_host: Mapping[str, str] = field(default_factory=dict)

    @property
    def confirmed(self) -> bool:
        return self.state in ("busy-wait", "dead-node")

    @property
    def mechanism(self) -> str:
        if self.state == "busy-wait":
            return "RCCL/NCCL busy-wait (every GPU spins in a collective at busy-wait power)"
        if self.state == "dead-node":
            return "dead node (its GPUs idle with no GPU process; the other hosts busy-wait on it)"
        return "none"


@dataclass
class _HostData:
    power: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    util: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    procs: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    io: list[tuple[float, float]] = field(default_factory=list)


def _points(s: Series, at: float) -> list[tuple[float, float]]:
    return [(t, v) for t, v in s.points if t <= at and not math.isnan(v)]


def profile_for(series: Sequence[Series], settings: TsdbSettings) -> GpuProfile:
    """The power bands to judge with: the configured model, else the one the VRAM size names (else MI300X)."""
    if settings.gpu_model:
        return settings.profile(settings.gpu_model)
    vram = [s.points[-1][1] for s in series if s.labels.get("__name__") == VRAM and s.points]
    return settings.profile(model_from_vram(max(vram)) if vram else None)


def _group(series: Sequence[Series], at: float) -> dict[str, _HostData]:
    hosts: dict[str, _HostData] = {}
    for s in series:
        name = s.labels.get("__name__", "")
        if name not in METRICS or name == VRAM:
            continue
        host = short_host(host_of(s.labels))
        pts = _points(s, at)
        d = hosts.setdefault(host, _HostData())
        if name == IO_FULL:
            if pts and (not d.io or pts[-1][0] > d.io[-1][0]):
                d.io = pts
            continue
        table = {POWER: d.power, UTIL: d.util, PROCS: d.procs}.get(name)
        if table is not None:
            table[gpu_of(s.labels)] = pts
    return hosts


def _fresh(pts: list[tuple[float, float]], at: float, stale_after: float) -> bool:
    return len(pts) >= 2 and at - pts[-1][0] <= stale_after


def _last_two_scrapes(
    d: _HostData, gpus: Sequence[str], prof: GpuProfile, th: Thresholds
) -> tuple[list[str], bool]:
    """(GPU states of the newest and the previous scrape, newest first per GPU; whether every GPU sat
    idle below the busy-wait band in both)."""
    states: list[str] = []
    dead = True
    for g in gpus:
        p, u = d.power[g], d.util[g]
        for i in (-1, -2):
            states.append(gpu_state(u[i][1], p[i][1], prof, th))
            if not (u[i][1] <= th.idle_util_pct and p[i][1] < prof.busy_wait_power_min_w * 0.85):
                dead = False
    return states, dead


def _idle_state(d: _HostData, gpus: Sequence[str], at: float, stale_after: float) -> tuple[str, str]:
    """An idle host: dead when its GPU process count is 0 for 2 scrapes, else alive or unknown."""
    procs = [d.procs.get(g) for g in gpus]
    if any(pts is None or not _fresh(pts, at, stale_after) for pts in procs):
        return "no-data", f"{len(gpus)} GPU(s) idle, no fresh {PROCS} to tell a dead process"
    if all(pts is not None and pts[-1][1] == 0 and pts[-2][1] == 0 for pts in procs):
        return "dead", f"{len(gpus)} GPU(s) idle with no GPU process for 2 scrapes"
    return "other", f"{len(gpus)} GPU(s) idle with their process alive (compilation, restore or a wait)"


def _host_state(
    d: _HostData, at: float, stale_after: float, prof: GpuProfile, th: Thresholds
) -> tuple[str, str]:
    """(category, description): category busy-wait | dead | io | no-data | other."""
    if not d.power or not d.util:
        missing = " and ".join(n for n, t in ((POWER, d.power), (UTIL, d.util)) if not t)
        return "no-data", f"no {missing} series"
    stale = [g for g, pts in (*d.power.items(), *d.util.items()) if not _fresh(pts, at, stale_after)]
    if stale:
        return "no-data", f"stale or short series on {len(set(stale))} GPU(s) (fewer than 2 fresh scrapes)"
    if d.io and at - d.io[-1][0] <= stale_after and d.io[-1][1] >= th.io_pressure_full_pct:
        return "io", f"I/O pressure {d.io[-1][1]:.0f}% (a checkpoint save or restore is writing/reading)"
    gpus = sorted(set(d.power) | set(d.util))
    if set(d.power) != set(d.util):
        return "no-data", "power and utilization name different GPUs"
    states, dead = _last_two_scrapes(d, gpus, prof, th)
    if all(s == "busy-wait" for s in states):
        return "busy-wait", f"{len(gpus)} GPU(s) busy-wait for 2 scrapes"
    if dead:
        return _idle_state(d, gpus, at, stale_after)
    counts: dict[str, int] = {}
    for s in states[::2]:  # the newest scrape
        counts[s] = counts.get(s, 0) + 1
    return "other", ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def judge(
    series: Sequence[Series],
    *,
    at: float,
    nodes: Sequence[str],
    profile: GpuProfile,
    thresholds: Thresholds,
    scrape_interval_s: float,
) -> EarlyVerdict:
    """The verdict of the last two scrapes at `at` (see the module docstring).

    `series`: the answer to `early_query` (samples after `at` are ignored); `nodes`: the job's
    node list (every node must report; empty: the hosts in the data); `scrape_interval_s`: the
    slowest scrape interval of the job's exporters (a newest sample older than twice that is stale).
    """
    stale_after = 2.0 * scrape_interval_s
    data = _group(series, at)
    expected = sorted({short_host(n) for n in nodes}) if nodes else sorted(h for h in data if data[h].power)
    if not expected:
        return EarlyVerdict("no-data", f"no {POWER} samples in the last {window_s(scrape_interval_s)} s", at)
    per_host: dict[str, str] = {}
    cats: dict[str, list[str]] = {}
    for h in expected:
        cat, text = _host_state(data.get(h, _HostData()), at, stale_after, profile, thresholds)
        if h not in data:
            cat, text = "no-data", "no samples at all (silent host)"
        per_host[h] = text
        cats.setdefault(cat, []).append(h)
    if cats.get("no-data"):
        hs = cats["no-data"]
        return EarlyVerdict(
            "no-data",
            f"metrics missing or stale on {', '.join(hs)}: no GPU confirmation (the step budget decides)",
            at,
            per_host=per_host,
        )
    if cats.get("io"):
        hs = cats["io"]
        return EarlyVerdict(
            "not-a-hang",
            f"I/O pressure on {', '.join(hs)}: a checkpoint save or restore, not a hang signature",
            at,
            per_host=per_host,
        )
    busy, dead = cats.get("busy-wait", []), cats.get("dead", [])
    if len(busy) == len(expected):
        return EarlyVerdict(
            "busy-wait",
            f"every GPU of all {len(expected)} host(s) at high utilization and busy-wait power for "
            f"2 scrapes ({profile.name}: {profile.busy_wait_power_min_w:.0f}-{profile.busy_wait_power_max_w:.0f} W): "
            "RCCL/NCCL busy-wait hang",
            at,
            per_host=per_host,
        )
    if dead and busy and len(dead) + len(busy) == len(expected) and len(dead) <= len(busy):
        return EarlyVerdict(
            "dead-node",
            f"{', '.join(dead)}: GPUs idle with no GPU process for 2 scrapes while the other "
            f"{len(busy)} host(s) busy-wait: dead node",
            at,
            suspects=tuple(dead),
            per_host=per_host,
        )
    return EarlyVerdict(
        "not-a-hang",
        "no hang signature on every host: " + "; ".join(f"{h}: {per_host[h]}" for h in expected[:4]),
        at,
        per_host=per_host,
    )
