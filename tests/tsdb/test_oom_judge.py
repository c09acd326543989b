"""The host-OOM playbook's pure judge (`judge_oom`) on in-memory memory series: no Prometheus.

Four hosts, one sample a minute, a step every 10 s; each test shapes the memory fraction and
checks the verdict, the cause and the evidence at the thresholds of rules PB-OOM-1..4.
"""

from __future__ import annotations

from collections.abc import Callable

from jobdiagd.tsdb.align import StepPoint, Timeline
from jobdiagd.tsdb.playbooks.base import Verdict
from jobdiagd.tsdb.playbooks.oom import OomCause, OomFacts, OomSeries, classify_trajectory, judge_oom
from jobdiagd.tsdb.settings import Thresholds

TH = Thresholds()
HOSTS = ("node001", "node002", "node003", "node004")
T_END = 3600.0
TIMELINE = Timeline(tuple(StepPoint(s, 10.0 * s) for s in range(360)), "tsdb")
FACTS = OomFacts(timeline=TIMELINE, checkpoint_period=100, nodes=HOSTS)
Curve = Callable[[float], float]


def flat(t: float) -> float:
    return 0.40


def spike_at(start: float, top: float = 0.97) -> Curve:
    """40 % of RAM, then from `start` a jump to `top` until the series ends (the OOM kill)."""
    return lambda t: top if t >= start else 0.40


def memory(curves: dict[str, Curve]) -> OomSeries:
    pts = {h: [(t, curves.get(h, flat)(t)) for t in range(0, int(T_END) + 1, 60)] for h in HOSTS}
    return OomSeries(
        lo=0.0, hi=T_END, step=60.0, memory={h: [(float(t), v) for t, v in p] for h, p in pts.items()}
    )


def kills(data: OomSeries, *hosts: str) -> OomSeries:
    return OomSeries(
        lo=data.lo, hi=data.hi, step=data.step, memory=data.memory, oom_kills={h: 1.0 for h in hosts}
    )


def test_no_oom_kill_and_memory_below_the_limit_is_healthy() -> None:
    """Rule PB-OOM-2: no kill in the metrics, memory under mem_oom_fraction (0.95)."""
    j = judge_oom(memory({"node002": spike_at(3000.0, top=0.949)}), FACTS, TH)
    assert (j.verdict, j.cause) == (Verdict.HEALTHY, OomCause.NONE) and j.oom_hosts == []


def test_memory_at_the_limit_counts_as_an_oom_without_the_kill_counter() -> None:
    """Rule PB-OOM-1: at the limit = at or above 95 % of RAM."""
    j = judge_oom(memory({"node002": spike_at(3000.0, top=0.95)}), FACTS, TH)
    assert j.oom_hosts == ["node002"] and j.verdict != Verdict.HEALTHY


def test_triage_blamed_host_is_the_fallback() -> None:
    facts = OomFacts(
        timeline=TIMELINE, checkpoint_period=100, nodes=HOSTS, oom_failure_hosts=frozenset({"node003"})
    )
    assert judge_oom(memory({}), facts, TH).oom_hosts == ["node003"]


def test_linear_ramp_until_the_kill_is_a_leak() -> None:
    """Rule PB-OOM-2: a ramp (R^2 >= 0.8, growth >= 15 % of RAM) until the kill -> host-oom-ramp."""
    data = kills(memory({"node004": lambda t: 0.40 + 0.55 * t / T_END}), "node004")
    j = judge_oom(data, FACTS, TH)
    assert (j.verdict, j.cause) == (Verdict.HOST_OOM_RAMP, OomCause.RAMP)
    assert j.patterns["node004"][0] == "ramp" and j.oom_hosts == ["node004"]


def test_ramp_growth_boundary() -> None:
    """Rule PB-OOM-1: growth of exactly 15 % of RAM is a ramp; 14 % is not."""
    kw = {
        "ckpt_times": [],
        "tol_s": 80.0,
        "min_r2": TH.ramp_min_r2,
        "min_growth": TH.ramp_min_growth_fraction,
    }
    line = [(float(t), 0.40 + 0.15 * t / T_END) for t in range(0, int(T_END) + 1, 60)]
    assert classify_trajectory(line, spike=TH.spike_min_fraction, **kw)[0] == "ramp"  # type: ignore[arg-type]
    shallow = [(t, 0.40 + 0.14 * t / T_END) for t, _ in line]
    assert classify_trajectory(shallow, spike=TH.spike_min_fraction, **kw)[0] == "flat"  # type: ignore[arg-type]


def test_spike_at_a_checkpoint_step_is_checkpoint_oom() -> None:
    """Rule PB-OOM-3: the fatal excursion lines up with a checkpoint step (step 300 at t=3000)."""
    j = judge_oom(kills(memory({"node001": spike_at(3000.0)}), "node001"), FACTS, TH)
    assert (j.verdict, j.cause) == (Verdict.CHECKPOINT_OOM, OomCause.CHECKPOINT)


def test_spike_away_from_checkpoints_is_a_sudden_spike() -> None:
    """Rule PB-OOM-3: a spike at step 350 (checkpoints at 100, 200, 300) is not a checkpoint OOM."""
    j = judge_oom(kills(memory({"node001": spike_at(3500.0)}), "node001"), FACTS, TH)
    assert (j.verdict, j.cause) == (Verdict.HOST_OOM_RAMP, OomCause.SPIKE)


def test_earlier_recovered_save_spikes_do_not_make_a_later_oom_a_checkpoint_oom() -> None:
    """Rule PB-OOM-3 decision: only the fatal (last) excursion counts."""

    def curve(t: float) -> float:
        return 0.97 if t >= 3500 or 2000 <= t <= 2060 or 1000 <= t <= 1060 else 0.40

    j = judge_oom(kills(memory({"node001": curve}), "node001"), FACTS, TH)
    assert j.patterns["node001"][0] == "periodic" and j.cause == OomCause.SPIKE
    assert j.pattern == "periodic"


def test_all_nodes_spiking_together_away_from_a_checkpoint() -> None:
    """Rule PB-OOM-4: every node OOM-killed by a simultaneous spike -> host-oom-ramp, cause simultaneous."""
    data = kills(memory(dict.fromkeys(HOSTS, spike_at(3480.0))), *HOSTS)
    j = judge_oom(data, FACTS, TH)
    assert (j.verdict, j.cause) == (Verdict.HOST_OOM_RAMP, OomCause.SIMULTANEOUS)
    assert j.all_nodes and j.simultaneous and j.spike_step == 349


def test_replica0_only_spikes_are_checkpoint_oom() -> None:
    """Rule PB-OOM-3: with dcn_data_parallelism=2 the first two nodes are DP replica 0."""
    facts = OomFacts(timeline=TIMELINE, checkpoint_period=100, nodes=HOSTS, dcn_data_parallelism="2")
    data = kills(memory({"node001": spike_at(3500.0), "node002": spike_at(3520.0)}), "node001")
    j = judge_oom(data, facts, TH)
    assert j.replica0 == frozenset({"node001", "node002"}) and j.replica0_pattern
    assert (j.verdict, j.cause) == (Verdict.CHECKPOINT_OOM, OomCause.CHECKPOINT)
