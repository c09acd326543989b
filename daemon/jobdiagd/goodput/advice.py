"""Checkpoint-interval advice from measured numbers, pure (docs/rules.md rules GP-8, GP-9).

Formulas (Tc: the checkpoint period in time, a save included; Ts: the save's cost; M: the mean
time between interruptions):
- Young (1974) / Daly (2006), lost-time optimal: Tc = √(2·Ts·M).
- Saxena, Hukerikar, Blaz, Raj (NVIDIA), "Optimal Checkpoint Interval with Availability as an
  Objective Function", arXiv 2410.18124 (2024), availability optimal:
  Tc = Ts + √(2·(M + Tr)·Ts + Ts²), Tr the recovery time; and when the error-detection latency
  Te is large, the optimal interval is at least Te.

The loss compared between intervals is 1 − A(Tc) with the availability
A(Tc) = (1 − Ts/Tc) · M / (M + Te + Tr + Tc/2): a fraction Ts/Tc of the up-time goes to saves,
and each interruption costs the stall until it is detected (Te), the restart (Tr) and on average
half an interval of progress redone. dA/dTc = 0 gives Tc² − 2·Ts·Tc − 2·Ts·(M + Te + Tr) = 0,
i.e. exactly the paper's optimum with Tr read as detection plus restart, Te + Tr, which is what
ties jobdiagd's detection speed to the advice. The paper's bound Tc ≥ Te is applied on top
(then the sentence names the bound instead of a gain: the availability above does not model
why the bound exists, checkpoints taken between a fault and its detection). The advice also
says what the interval would be with the old 30-min log-mtime monitor's latency (at least
30 min, the bound alone), which jobdiagd's detection makes unnecessary.

Measured inputs, per job configuration (job name and node count):
- Ts: the median cost of the saves its runs showed (`RunFacts.save_costs`);
- M: run-hours of the archive's runs with the same node count over their interruptions (rule
  GP-8); with fewer than `MIN_EVENTS` interruptions there, the fleet's rate per node-hour
  scaled to the node count (interruptions on N nodes come N times as often);
- Te: the mean time from an interruption's last step to its detection (jobdiagd's page for
  a hang; the job's end for a crash, which is its own detection) — a mean, not a median: the
  model charges every interruption its expected cost, and the rare slow hang is most of it;
- Tr: the mean time from an interrupted run's end to the first step of the run that
  restarted it (queue, start-up, restore), over the chains' restarts; else the mean start-up
  of the configuration's runs.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from jobdiagd.durations import rounded_duration
from jobdiagd.goodput.facts import is_interruption
from jobdiagd.goodput.ledger import Chain, Run

MIN_EVENTS = 3  # interruptions a node count needs before its own MTBF is used
MIN_GAIN = 0.01  # below 1 % fewer GPU-hours lost, the current interval is called fine
MIN_SAVE_S = 1.0
# The old log-mtime monitor's detection latency at best: 1800 s of silence plus half a poll
# (goodput.monitor); a hang whose log keeps chatter is never detected by it at all.
MONITOR_TE_S = 1830.0  # a save measured cheaper than this is noise in the step times, not a cost
CITATION = "Saxena et al., arXiv 2410.18124"


def young_daly(ts: float, mtbf: float) -> float:
    """Tc = √(2·Ts·M)."""
    return math.sqrt(2.0 * ts * mtbf)


def availability_optimal(ts: float, mtbf: float, recovery: float) -> float:
    """Tc = Ts + √(2·(M + Tr)·Ts + Ts²) (arXiv 2410.18124); `recovery`: Te + Tr here."""
    return ts + math.sqrt(2.0 * (mtbf + recovery) * ts + ts * ts)


def availability(tc: float, ts: float, mtbf: float, recovery: float) -> float:
    """A(Tc) = (1 − Ts/Tc) · M / (M + Te + Tr + Tc/2); `recovery` = Te + Tr."""
    if tc <= ts or mtbf <= 0:
        return 0.0
    return (1.0 - ts / tc) * mtbf / (mtbf + recovery + tc / 2.0)


@dataclass(frozen=True, slots=True)
class Rates:
    """Interruptions and run-hours per node count, and over the fleet per node-hour."""

    hours: dict[int, float]
    events: dict[int, int]

    @property
    def node_hours(self) -> float:
        return sum(n * h for n, h in self.hours.items())

    @property
    def node_events(self) -> int:
        return sum(self.events.values())

    def mtbf_s(self, nnodes: int) -> tuple[float | None, str]:
        """(MTBF in seconds, how it was measured) for jobs on `nnodes` nodes."""
        events, hours = self.events.get(nnodes, 0), self.hours.get(nnodes, 0.0)
        if events >= MIN_EVENTS and hours > 0:
            return (
                hours * 3600.0 / events,
                f"{events} interruptions in {hours:.0f} run-hours on {nnodes} nodes",
            )
        if self.node_events and self.node_hours > 0:
            per_node = self.node_events / self.node_hours
            return 3600.0 / (per_node * nnodes), (
                f"fleet rate: {self.node_events} interruptions in {self.node_hours:.0f} node-hours, "
                f"scaled to {nnodes} nodes"
            )
        return None, f"no interruption in {self.node_hours:.0f} node-hours"


def rates(runs: Iterable[Run]) -> Rates:
    hours: dict[int, float] = {}
    events: dict[int, int] = {}
    for r in runs:
        n = r.facts.nnodes
        hours[n] = hours.get(n, 0.0) + max(0.0, r.end - r.start) / 3600.0
        if is_interruption(r.facts):
            events[n] = events.get(n, 0) + 1
    return Rates(hours, events)


def _median(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None and math.isfinite(x)]
    return statistics.median(v) if v else None


def _mean(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None and math.isfinite(x)]
    return statistics.fmean(v) if v else None


def detection_latencies(runs: Iterable[Run]) -> list[float]:
    """Per interruption: its last step (or start) to its detection (Te)."""
    out: list[float] = []
    for r in runs:
        f = r.facts
        if not is_interruption(f):
            continue
        origin = f.last_step_at if f.last_step_at is not None else (f.stall_origin or r.start)
        at = r.detected_at if r.detected_at is not None else r.end
        out.append(max(0.0, at - origin))
    return out


def restart_latencies(chains: Iterable[Chain]) -> list[float]:
    """Per restart after an interruption: the interrupted run's end to the next run's first step."""
    out: list[float] = []
    for ch in chains:
        for prev, nxt in zip(ch.runs, ch.runs[1:], strict=False):
            g = nxt.facts
            if not is_interruption(prev.facts) or g.first_step_at is None:
                continue
            begin = g.first_step_at - (g.first_step_s or 0.0)
            out.append(max(0.0, begin - prev.end))
    return out


@dataclass(frozen=True, slots=True)
class Advice:
    config: str
    nnodes: int
    step_time_s: float
    period_steps: int
    save_s: float  # Ts
    mtbf_s: float
    mtbf_basis: str
    detection_s: float  # Te
    restart_s: float  # Tr
    now_s: float  # the current interval between saves (compute only)
    best_s: float  # the proposed one
    best_steps: int
    young_s: float  # Young/Daly's Tc, for comparison
    loss_now: float
    loss_best: float
    bound_by_detection: bool
    monitor_best_s: float  # the best interval with the 30-min log-mtime monitor's detection latency

    @property
    def fewer_lost(self) -> float:
        """How much smaller the lost share would be at the proposed interval (0.06: 6 % fewer)."""
        return 0.0 if self.loss_now <= 0 else max(0.0, (self.loss_now - self.loss_best) / self.loss_now)

    def sentence(self) -> str:
        now = f"checkpoint every {self.period_steps} steps ({rounded_duration(self.now_s)}) now"
        mtbf = f"at your measured MTBF of {self.mtbf_s / 3600:.1f} h"
        if self.bound_by_detection:
            return (
                f"{now}; a detection latency of {rounded_duration(self.detection_s)} bounds the interval "
                f"from below (Tc >= Te): every {self.best_steps} steps ({rounded_duration(self.best_s)}) {mtbf}"
            )
        if self.fewer_lost < MIN_GAIN or self.best_steps == self.period_steps:
            return f"{now}; that is within 1 % of the best interval {mtbf}"
        best = f"every {self.best_steps} steps ({rounded_duration(self.best_s)})"
        return f"{now}; {best} would lose {self.fewer_lost * 100:.0f} % fewer GPU-hours {mtbf}"

    def formula(self) -> str:
        te = rounded_duration(self.detection_s)
        tr = rounded_duration(self.restart_s)
        text = (
            f"Tc = Ts + √(2(MTBF + Te + Tr)Ts + Ts²) ({CITATION}) with Ts = {rounded_duration(self.save_s)} "
            f"(measured saves), Te = {te} (detection), Tr = {tr} (restart); "
            f"Young/Daly √(2·Ts·MTBF) gives {rounded_duration(self.young_s)}"
        )
        if self.bound_by_detection:
            text += f"; raised to Te = {te}: the paper's bound Tc ≥ Te"
        if self.monitor_best_s > self.best_s + self.step_time_s:
            text += (
                f"; with the 30-min log-mtime monitor's detection (Te = {rounded_duration(MONITOR_TE_S)}) "
                f"it would be {rounded_duration(self.monitor_best_s)}"
            )
        return text

    def to_dict(self) -> dict[str, object]:
        return {
            "config": self.config,
            "nnodes": self.nnodes,
            "step_time_s": round(self.step_time_s, 3),
            "period_steps": self.period_steps,
            "save_s": round(self.save_s, 1),
            "mtbf_s": round(self.mtbf_s, 1),
            "mtbf_basis": self.mtbf_basis,
            "detection_s": round(self.detection_s, 1),
            "restart_s": round(self.restart_s, 1),
            "interval_now_s": round(self.now_s, 1),
            "interval_best_s": round(self.best_s, 1),
            "best_steps": self.best_steps,
            "young_daly_s": round(self.young_s, 1),
            "loss_now": round(self.loss_now, 5),
            "loss_best": round(self.loss_best, 5),
            "fewer_lost": round(self.fewer_lost, 4),
            "bound_by_detection": self.bound_by_detection,
            "interval_best_with_mtime_monitor_s": round(self.monitor_best_s, 1),
            "sentence": self.sentence(),
            "formula": self.formula(),
        }


def advise(
    *,
    config: str,
    nnodes: int,
    step_time_s: float,
    period_steps: int,
    save_s: float,
    mtbf_s: float,
    detection_s: float,
    restart_s: float,
    mtbf_basis: str = "",
) -> Advice | None:
    """The advice for one configuration from its numbers (None: nothing to compute from)."""
    if step_time_s <= 0 or period_steps <= 0 or save_s <= 0 or mtbf_s <= 0:
        return None
    recovery = detection_s + restart_s
    now_tc = period_steps * step_time_s + save_s
    best_tc = availability_optimal(save_s, mtbf_s, recovery)
    bound = detection_s > best_tc
    if bound:
        best_tc = detection_s
    best_steps = max(1, round((best_tc - save_s) / step_time_s))
    best_tc = best_steps * step_time_s + save_s
    monitor_tc = max(availability_optimal(save_s, mtbf_s, MONITOR_TE_S + restart_s), MONITOR_TE_S)
    return Advice(
        config=config,
        nnodes=nnodes,
        step_time_s=step_time_s,
        period_steps=period_steps,
        save_s=save_s,
        mtbf_s=mtbf_s,
        mtbf_basis=mtbf_basis,
        detection_s=detection_s,
        restart_s=restart_s,
        now_s=period_steps * step_time_s,
        best_s=best_steps * step_time_s,
        best_steps=best_steps,
        young_s=young_daly(save_s, mtbf_s),
        loss_now=1.0 - availability(now_tc, save_s, mtbf_s, recovery),
        loss_best=1.0 - availability(best_tc, save_s, mtbf_s, recovery),
        bound_by_detection=bound,
        monitor_best_s=max(0.0, monitor_tc - save_s),
    )


def advise_chains(chains: Sequence[Chain]) -> list[Advice]:
    """Advice for every configuration of the chains' runs that checkpoints and measured its saves."""
    runs = [r for ch in chains for r in ch.runs]
    fleet = rates(runs)
    te_all = _mean(detection_latencies(runs))
    tr_all = _mean(restart_latencies(chains))
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.facts.config_key, []).append(r)
    out: list[Advice] = []
    for config, members in sorted(groups.items()):
        a = _advise_group(config, members, fleet, te_all, tr_all)
        if a is not None:
            out.append(a)
    return out


def _advise_group(
    config: str, members: list[Run], fleet: Rates, te_all: float | None, tr_all: float | None
) -> Advice | None:
    facts = [r.facts for r in members]
    periods = Counter(f.checkpoint_period for f in facts if f.checkpoint_period)
    ts = _median(c for f in facts for c in f.save_costs)
    step = _median(f.step_time_s for f in facts if f.step_time_s)
    if not periods or ts is None or ts < MIN_SAVE_S or step is None:
        return None
    nnodes = facts[0].nnodes
    mtbf, basis = fleet.mtbf_s(nnodes)
    if mtbf is None:
        return None
    te = _mean(detection_latencies(members)) or te_all or 0.0
    startup = _mean(
        f.first_step_at - (f.first_step_s or 0.0) - r.start
        for r, f in zip(members, facts, strict=True)
        if f.first_step_at
    )
    tr = tr_all if tr_all is not None else (startup or 0.0)
    return advise(
        config=config,
        nnodes=nnodes,
        step_time_s=step,
        period_steps=periods.most_common(1)[0][0],
        save_s=ts,
        mtbf_s=mtbf,
        detection_s=te,
        restart_s=tr,
        mtbf_basis=basis,
    )
