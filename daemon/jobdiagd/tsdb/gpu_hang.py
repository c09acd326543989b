"""The GPU-hang judge: whether a job's GPUs show a collective hang, by one rule (rule HANG-GPU).

Two callers ask it, with the same query and the same rule; only the moment differs:
- the early page (`service.early_page`, replayed by `service.backtest`): while a step is
  overdue, once per scrape interval; a confirmation pages before the step budget;
- the page's GPU verdict (`tsdb.hang_verdict.hang_power_verdict`): once the step budget pages a hang
  of a RAY=1 job, the verdict the page carries and, with `[tsdb] confirm_hang_with_power`,
  whether the page goes out (`tsdb.hang_verdict.should_page`).
Both send `gpu_query` (the raw samples of five metric families of the runbook's metric catalog
over the last three scrapes) and hand the answer to `judge`: series in, `GpuVerdict` out; it
reads no clock and does no I/O.

## The rule

**Power is the primary signal, utilization the second.** A wedged collective can read 100 %
utilization at frozen power, with no error and no timeout (marin-community/marin #7344: GB200
ranks at 100 % and 230-280 W each for over half an hour, a GPU rated about 1.2 kW): utilization
says "busy" for a spin and for real work alike, power tells them apart. Each GPU sample is
classified by `tsdb.playbooks.base.gpu_state` against its model's power bands (`GpuProfile`;
MI300X: training 600-750 W, busy-wait 250-350 W, idle < 100 W, Playbook 1 "Key thresholds").

A host's state holds for the newest two samples of every one of its GPU series (one sample is a
moment, two are a state). The job's state, in this order of precedence:

| state | what every host of the job shows | confirms | denies |
|---|---|---|---|
| `no-data` | some host has no power or utilization series, fewer than two samples, a newest sample older than two scrape intervals, or (idle) no `hw_gpu_user_processes` | no | no |
| `not-a-hang` | some host under I/O pressure >= `io_pressure_full_pct`: a checkpoint save or restore (veto) | no | yes |
| `busy-wait` | every GPU at >= `busy_util_pct` utilization in or below the busy-wait power band | **yes** | - |
| `dead-node` | hosts whose GPUs are idle with no GPU process, no more of them than busy-waiting hosts, which are all the others; those hosts are the suspects | **yes** | - |
| `no-process` | every host idle with no GPU process: the job's processes are gone everywhere | no | no |
| `training` | every host computing (training power, or high utilization above the busy-wait band), at least half the GPUs at training power: working, log output may lag | no | yes |
| `not-a-hang` | every host computing, idle with its GPU process alive (compilation, restore), or a mix of the two; no host spins and none lost its process | no | yes |
| `mixed` | anything else: some hosts spin while others idle with their process alive, or a host changed state between the two samples | no | no |

"Confirms": the early page pages now. "Denies": the GPUs show the job working or in a known
pause, so `confirm_hang_with_power` holds a step-budget page (and asks again next tick).
Neither: the step budget decides alone, as without a TSDB.

## Decisions

- "Frozen" power counts only in the busy-wait band (or below it). Power flat at a level
  between the busy-wait and the training band is what a steady eval or forward pass draws too,
  and a reading can stick after the work ended (ROCm/legacy-rocm-build #6530: a counter that
  did not fall back); a wrong band is fixed in `[tsdb.gpu_profiles.*]`, not guessed from flatness.
- GPUs idle with their process alive are compilation or restore (XLA compiles on the host
  CPU), never a hang, on every host or some: `not-a-hang` when no host spins, `mixed` when
  others spin on them (a compile a little later on one host looks the same for a while).
- Every GPU idle with no GPU process anywhere is not a collective hang -- nobody waits on
  anybody; the job ended or its processes were killed with the allocation still held. It
  neither confirms nor denies: the step budget's page stands (an allocation without its
  training processes deserves the page).
- A host with no samples at all (a node that died with its exporter) is `no-data`: the step
  budget pages it, with the verdict naming the silent host.
- The I/O veto comes before the signatures: a save that hangs in a collective is left to the
  step budget, whose checkpoint phase knows this job's save times (Checkpointing interference).

What must not confirm, and how the catalog tells it apart ("Checkpointing interference",
Playbooks 1, 3, 7): a checkpoint save drops utilization and power while I/O pressure, blocked
processes and dirty memory rise (I/O veto); an eval keeps the GPUs computing at high
utilization near training power, far above the busy-wait band (`training`/`not-a-hang`);
compilation and restore leave the GPUs idle with their processes alive (`not-a-hang`). The early
page is also not armed before this run's steady step time is known (startup and warmup phases
of `triage.stall`), which is where compilation and restore happen.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from jobdiagd.model.kinds import GpuHangState, GpuState
from jobdiagd.tsdb.client import Series
from jobdiagd.tsdb.context import short_host
from jobdiagd.tsdb.gpu_strip import GpuStrip
from jobdiagd.tsdb.playbooks.base import gpu_of, gpu_state, host_of
from jobdiagd.tsdb.settings import GpuProfile, Thresholds, TsdbSettings, model_from_vram

POWER = "hw_gpu_power_watts"
UTIL = "ray_node_gpus_utilization"
PROCS = "hw_gpu_user_processes"
IO_FULL = "hw_io_pressure_full_pct"
VRAM = "hw_gpu_vram_total_bytes"  # names the GPU model when the config does not
METRICS = (POWER, UTIL, PROCS, IO_FULL, VRAM)
HELD = 2  # samples a state must hold for, per GPU series

S = GpuHangState


def window_s(scrape_interval_s: float) -> int:
    """How far back the query reaches: three scrapes, so two samples of the slowest series are in it."""
    return max(1, math.ceil(3 * scrape_interval_s))


def gpu_query(scrape_interval_s: float) -> str:
    """One instant query of a range selector: the raw samples of the five families (no resampling)."""
    names = "|".join(METRICS)
    return f'{{__name__=~"{names}"}}[{window_s(scrape_interval_s)}s]'


@dataclass(frozen=True)
class GpuVerdict:
    """What the GPUs say about a stalled job at `at` (see the module docstring for the states).

    `strip`: the per-host power/utilization picture the page's verdict fetches beside it."""

    state: GpuHangState
    summary: str
    at: float | None = None
    suspects: tuple[str, ...] = ()
    per_host: Mapping[str, str] = field(default_factory=dict)
    gpu_model: str | None = None
    mean_util_pct: float | None = None
    mean_power_w: float | None = None
    strip: GpuStrip | None = None

    @property
    def confirmed(self) -> bool:
        return self.state.confirmed

    @property
    def denies(self) -> bool:
        return self.state.denies

    @property
    def mechanism(self) -> str:
        if self.state is S.BUSY_WAIT:
            return "RCCL/NCCL busy-wait (every GPU spins in a collective at busy-wait power)"
        if self.state is S.DEAD_NODE:
            return "dead node (its GPUs idle with no GPU process; the other hosts busy-wait on it)"
        return "none"


def profile_for(series: Sequence[Series], settings: TsdbSettings) -> GpuProfile:
    """The power bands to judge with: the configured model, else the one the VRAM size names (else MI300X)."""
    if settings.gpu_model:
        return settings.profile(settings.gpu_model)
    vram = [s.points[-1][1] for s in series if s.labels.get("__name__") == VRAM and s.points]
    return settings.profile(model_from_vram(max(vram)) if vram else None)


class _Host(Enum):
    """One host's state over the held samples."""

    NO_DATA = "no data"
    IO = "I/O pressure"
    BUSY_WAIT = "busy-wait"
    DEAD = "idle, no GPU process"
    IDLE_ALIVE = "idle, process alive"
    TRAINING = "training"
    COMPUTING = "computing"
    OTHER = "other"


@dataclass(frozen=True)
class _HostVerdict:
    kind: _Host
    text: str
    gpus: int = 0
    training: int = 0  # GPUs at training power in the newest sample
    util: tuple[float, ...] = ()  # the newest samples, for the means
    power: tuple[float, ...] = ()


@dataclass
class _HostData:
    power: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    util: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    procs: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    io: list[tuple[float, float]] = field(default_factory=list)


def _points(s: Series, at: float) -> list[tuple[float, float]]:
    return [(t, v) for t, v in s.points if t <= at and not math.isnan(v)]


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
    return len(pts) >= HELD and at - pts[-1][0] <= stale_after


def _idle(d: _HostData, gpus: Sequence[str], prof: GpuProfile, th: Thresholds) -> bool:
    """Every GPU at idle utilization and below the busy-wait band in every held sample."""
    return all(
        d.util[g][-i][1] <= th.idle_util_pct and d.power[g][-i][1] < prof.busy_wait_power_min_w * 0.85
        for g in gpus
        for i in range(1, HELD + 1)
    )


def _idle_host(d: _HostData, gpus: Sequence[str], at: float, stale_after: float) -> tuple[_Host, str]:
    """An idle host: its GPU process count tells a dead process from compilation or restore."""
    procs = [d.procs.get(g) for g in gpus]
    if any(pts is None or not _fresh(pts, at, stale_after) for pts in procs):
        return _Host.NO_DATA, f"{len(gpus)} GPU(s) idle, no fresh {PROCS} to tell a dead process"
    if all(pts is not None and all(v == 0 for _, v in pts[-HELD:]) for pts in procs):
        return _Host.DEAD, f"{len(gpus)} GPU(s) idle with no GPU process for {HELD} scrapes"
    return _Host.IDLE_ALIVE, f"{len(gpus)} GPU(s) idle with their process alive"


def _describe(states: Sequence[GpuState]) -> str:
    counts: dict[str, int] = {}
    for s in states:
        counts[s] = counts.get(s, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _signature(
    d: _HostData, gpus: Sequence[str], at: float, stale_after: float, prof: GpuProfile, th: Thresholds
) -> tuple[_Host, str]:
    """Which state every GPU of a host holds for the held samples (power first, see `gpu_state`)."""
    held = [
        gpu_state(d.util[g][-i][1], d.power[g][-i][1], prof, th) for i in range(1, HELD + 1) for g in gpus
    ]
    kinds = set(held)
    n = len(gpus)
    if kinds == {GpuState.BUSY_WAIT}:
        return _Host.BUSY_WAIT, f"{n} GPU(s) busy-wait for {HELD} scrapes"
    if _idle(d, gpus, prof, th):
        return _idle_host(d, gpus, at, stale_after)
    if kinds == {GpuState.TRAINING}:
        return _Host.TRAINING, f"{n} GPU(s) at training power for {HELD} scrapes"
    if kinds <= {GpuState.TRAINING, GpuState.BUSY}:
        return _Host.COMPUTING, f"{n} GPU(s) computing ({_describe(held[:n])})"
    return _Host.OTHER, _describe(held[:n])


def _host_verdict(
    d: _HostData, at: float, stale_after: float, prof: GpuProfile, th: Thresholds
) -> _HostVerdict:
    if not d.power or not d.util:
        missing = " and ".join(n for n, t in ((POWER, d.power), (UTIL, d.util)) if not t)
        return _HostVerdict(_Host.NO_DATA, f"no {missing} series")
    stale = [g for g, pts in (*d.power.items(), *d.util.items()) if not _fresh(pts, at, stale_after)]
    if stale:
        return _HostVerdict(
            _Host.NO_DATA,
            f"stale or short series on {len(set(stale))} GPU(s) (fewer than {HELD} fresh scrapes)",
        )
    if set(d.power) != set(d.util):
        return _HostVerdict(_Host.NO_DATA, "power and utilization name different GPUs")
    gpus = sorted(d.power)
    util = tuple(d.util[g][-1][1] for g in gpus)
    power = tuple(d.power[g][-1][1] for g in gpus)
    if d.io and at - d.io[-1][0] <= stale_after and d.io[-1][1] >= th.io_pressure_full_pct:
        text = f"I/O pressure {d.io[-1][1]:.0f}% (a checkpoint save or restore is writing/reading)"
        return _HostVerdict(_Host.IO, text, len(gpus), util=util, power=power)
    kind, text = _signature(d, gpus, at, stale_after, prof, th)
    training = sum(
        1 for u, p in zip(util, power, strict=True) if gpu_state(u, p, prof, th) is GpuState.TRAINING
    )
    return _HostVerdict(kind, text, len(gpus), training, util, power)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _decide(
    hosts: Mapping[str, _HostVerdict], prof: GpuProfile, mean_power: float | None
) -> tuple[GpuHangState, str, tuple[str, ...]]:
    """The job's state from its hosts' (the table of the module docstring, in its order)."""
    by: dict[_Host, list[str]] = {}
    for h, v in hosts.items():
        by.setdefault(v.kind, []).append(h)
    n, busy, dead = len(hosts), by.get(_Host.BUSY_WAIT, []), by.get(_Host.DEAD, [])
    watts = f"{mean_power:.0f} W avg" if mean_power is not None else "no power"
    if by.get(_Host.NO_DATA):
        hs = ", ".join(by[_Host.NO_DATA])
        return S.NO_DATA, f"metrics missing or stale on {hs}: no GPU evidence (the step budget decides)", ()
    if by.get(_Host.IO):
        hs = ", ".join(by[_Host.IO])
        return S.NOT_A_HANG, f"I/O pressure on {hs}: a checkpoint save or restore, not a hang signature", ()
    if len(busy) == n:
        band = f"{prof.name}: {prof.busy_wait_power_min_w:.0f}-{prof.busy_wait_power_max_w:.0f} W"
        return (
            S.BUSY_WAIT,
            f"every GPU of all {n} host(s) at high utilization and busy-wait power for {HELD} scrapes "
            f"({watts}; {band}): RCCL/NCCL busy-wait hang",
            (),
        )
    if dead and busy and len(dead) + len(busy) == n and len(dead) <= len(busy):
        return (
            S.DEAD_NODE,
            f"{', '.join(dead)}: GPUs idle with no GPU process for {HELD} scrapes while the other "
            f"{len(busy)} host(s) busy-wait: dead node",
            tuple(dead),
        )
    if len(dead) == n:
        return (
            S.NO_PROCESS,
            f"every GPU of all {n} host(s) idle with no GPU process: the job's processes are gone "
            "(ended or killed); not a collective hang",
            (),
        )
    return _undecided(hosts, by, watts)


def _undecided(
    hosts: Mapping[str, _HostVerdict], by: Mapping[_Host, list[str]], watts: str
) -> tuple[GpuHangState, str, tuple[str, ...]]:
    """No hang signature: working, pausing, or hosts that disagree."""
    n = len(hosts)
    working = len(by.get(_Host.TRAINING, [])) + len(by.get(_Host.COMPUTING, []))
    idle = len(by.get(_Host.IDLE_ALIVE, []))
    gpus = sum(v.gpus for v in hosts.values())
    training = sum(v.training for v in hosts.values())
    if working == n and 2 * training >= gpus:
        return (
            S.TRAINING,
            f"{training}/{gpus} GPUs at training power ({watts}): the GPUs are working -- "
            "not a hang (log output may lag)",
            (),
        )
    if working + idle == n:
        if idle == n:
            what = f"every GPU of all {n} host(s) idle with its process alive: compilation or restore"
        elif idle == 0:
            what = f"every host computing under training power ({watts}): an eval or forward passes"
        else:
            what = f"{working} host(s) computing, {idle} idle with their process alive"
        return S.NOT_A_HANG, f"{what}; no host spins or lost its process: not a hang", ()
    detail = "; ".join(f"{h}: {v.text}" for h, v in sorted(hosts.items())[:4])
    return S.MIXED, f"no one signature on every host ({detail}): not confirmed", ()


def judge(
    series: Sequence[Series],
    *,
    at: float,
    nodes: Sequence[str],
    profile: GpuProfile,
    thresholds: Thresholds,
    scrape_interval_s: float,
) -> GpuVerdict:
    """The GPU verdict of the newest two samples at `at` (rule HANG-GPU, see the module docstring).

    `series`: the answer to `gpu_query` (samples after `at` are ignored); `nodes`: the job's
    node list (every node must report; empty: the hosts in the data); `scrape_interval_s`: the
    slowest scrape interval of the job's exporters (a newest sample older than twice that is stale).
    """
    stale_after = 2.0 * scrape_interval_s
    data = _group(series, at)
    expected = sorted({short_host(n) for n in nodes}) if nodes else sorted(h for h in data if data[h].power)
    if not expected:
        return GpuVerdict(
            S.NO_DATA,
            f"no {POWER} samples in the last {window_s(scrape_interval_s)} s",
            at,
            gpu_model=profile.name,
        )
    hosts: dict[str, _HostVerdict] = {}
    for h in expected:
        d = data.get(h)
        hosts[h] = (
            _host_verdict(d, at, stale_after, profile, thresholds)
            if d is not None
            else _HostVerdict(_Host.NO_DATA, "no samples at all (silent host)")
        )
    mean_util = _mean([u for v in hosts.values() for u in v.util])
    mean_power = _mean([p for v in hosts.values() for p in v.power])
    state, summary, suspects = _decide(hosts, profile, mean_power)
    return GpuVerdict(
        state,
        summary,
        at,
        suspects=suspects,
        per_host={h: v.text for h, v in hosts.items()},
        gpu_model=profile.name,
        mean_util_pct=mean_util,
        mean_power_w=mean_power,
    )
