"""The training-stability playbook's pure judges on in-memory timelines and checklists: no Prometheus.

`training_signals` (the slowdown and training-metric events of the timeline), `contention_windows`,
`judge_contention` (which contention source moved) and `judge_training` (the verdict), each at the
thresholds of rules PB-TRAIN-1..6.
"""

from __future__ import annotations

from collections.abc import Callable

from jobdiagd.tsdb.align import StepPoint, Timeline
from jobdiagd.tsdb.playbooks.base import Verdict
from jobdiagd.tsdb.playbooks.training import (
    ContentionSeries,
    RestoreLeakSuspicion,
    SlowdownCause,
    TrainingSignals,
    contention_windows,
    judge_contention,
    judge_training,
    training_signals,
)
from jobdiagd.tsdb.settings import DEFAULT_PROFILES, Thresholds

TH = Thresholds()
MI300X = DEFAULT_PROFILES["MI300X"]
HOSTS = ("node001", "node002", "node003", "node004")
N = 105  # steps 0..104: 100 steady steps after the 5 warmup steps


def timeline(
    tgs: Callable[[int], float] = lambda s: 1000.0,
    step_time: Callable[[int], float] = lambda s: 6.0,
    **fields: Callable[[int], float | None],
) -> Timeline:
    pts = []
    t = 0.0
    for s in range(N):
        t += step_time(s)
        extra = {k: f(s) for k, f in fields.items()}
        pts.append(StepPoint(s, t, step_time=step_time(s), tgs=tgs(s), loss=extra.pop("loss", 2.0), **extra))  # type: ignore[arg-type]
    return Timeline(tuple(pts), "tsdb")


def signals(tl: Timeline) -> TrainingSignals:
    return training_signals(tl, checkpoint_period=None, async_ckpt=False, th=TH)


def test_tgs_drop_of_ten_percent_is_a_regression() -> None:
    """Rule PB-TRAIN-2 (a): steady TGS drop >= tgs_regression_pct between the first and last fifth."""
    at = signals(timeline(tgs=lambda s: 900.0 if s >= 85 else 1000.0))
    assert at.n5 == 20 and round(at.drop_pct, 6) == TH.tgs_regression_pct and at.regression
    below = signals(timeline(tgs=lambda s: 901.0 if s >= 85 else 1000.0))
    assert not below.regression and below.drop_pct < TH.tgs_regression_pct


def test_sustained_slow_segment_needs_ten_steps() -> None:
    """Rule PB-TRAIN-2 (d): >= 10 consecutive steps > 10 % slower than the median (two normal ones tolerated)."""
    ten = signals(timeline(step_time=lambda s: 6.7 if 50 <= s < 60 else 6.0))
    assert [p.step for p in ten.segment] == list(range(50, 60)) and not ten.regression
    nine = signals(timeline(step_time=lambda s: 6.7 if 50 <= s < 59 else 6.0))
    assert nine.segment == []
    # Two normal steps inside do not break it; exactly 10 % slower is not slow.
    gap = signals(timeline(step_time=lambda s: 6.7 if 50 <= s < 62 and s not in (55, 56) else 6.0))
    assert len(gap.segment) == 10
    assert signals(timeline(step_time=lambda s: 6.6 if 50 <= s < 70 else 6.0)).segment == []


def test_training_metric_events() -> None:
    """Rule PB-TRAIN-1/5: NaN loss, divergence (4 losses > 1.5 x the running minimum), grad-norm spikes
    (> 5 x median) and MoE load-balance spikes (> 3 x median) on steady steps."""
    sig = signals(
        timeline(
            loss=lambda s: float("nan") if s == 100 else (3.1 if 80 <= s < 84 else 2.0),
            grad_norm=lambda s: 5.01 if s == 40 else 1.0,
            moe_lb_loss=lambda s: 0.31 if s == 30 else 0.1,
        )
    )
    assert sig.nan_steps == [100] and sig.diverge is not None and sig.diverge.step == 80
    assert [p.step for p in sig.grad_spikes] == [40] and [p.step for p in sig.moe_spikes] == [30]
    calm = signals(timeline(loss=lambda s: 2.9, grad_norm=lambda s: 5.0 if s == 40 else 1.0))
    assert calm.diverge is None and calm.grad_spikes == []


def test_contention_windows_of_a_regression_are_the_first_and_last_fifth() -> None:
    sig = signals(timeline(tgs=lambda s: 800.0 if s >= 85 else 1000.0))
    windows = contention_windows(sig, 0.0)
    assert windows is not None
    (b0, b1), (d0, d1) = windows
    assert (b0, b1) == (sig.tgs[0][0], sig.tgs[19][0]) and (d0, d1) == (sig.tgs[-20][0], sig.tgs[-1][0])
    assert contention_windows(signals(timeline()), 0.0) is None


def cmp(
    arm: str, before: dict[str, float], after: dict[str, float]
) -> dict[str, tuple[dict[str, float], dict[str, float]]]:
    return {arm: (before, after)}


def test_io_pressure_on_one_host_is_io_contention() -> None:
    """Rule PB-TRAIN-3: a host whose own I/O pressure doubled to >= 10 % is anomalous even when the
    median host did not move."""
    base = dict.fromkeys(HOSTS, 1.0)
    c = judge_contention(cmp("io", base, {**base, "node003": 10.0}), TH, MI300X, None)
    assert (c.cause, c.anomalous, c.whole_cluster_io) == (SlowdownCause.IO, ["node003"], False)
    c = judge_contention(cmp("io", base, {**base, "node003": 9.9}), TH, MI300X, None)
    assert c.cause == SlowdownCause.NONE
    everywhere = judge_contention(cmp("io", base, dict.fromkeys(HOSTS, 12.0)), TH, MI300X, None)
    assert everywhere.whole_cluster_io and everywhere.anomalous == list(HOSTS)


def test_temperature_crossing_the_limit_is_thermal_throttle() -> None:
    base = dict.fromkeys(HOSTS, 70.0)
    c = judge_contention(cmp("temp", base, {**base, "node002": MI300X.temp_limit_c}), TH, MI300X, None)
    assert (c.cause, c.anomalous) == (SlowdownCause.THERMAL, ["node002"])
    already = judge_contention(
        cmp("temp", {**base, "node002": MI300X.temp_limit_c}, {**base, "node002": 95.0}), TH, MI300X, None
    )
    assert already.cause == SlowdownCause.NONE


def test_network_rates_rising_per_host() -> None:
    """Rule PB-TRAIN-3: RDMA (5 x, >= 1/s) before TCP (5 x, >= 5/s); TCP names the IP path."""
    base = dict.fromkeys(HOSTS, 0.2)
    c = judge_contention(cmp("rdma", base, {**base, "node004": 1.0}), TH, MI300X, None)
    assert (c.cause, c.anomalous) == (SlowdownCause.RDMA, ["node004"])
    assert (
        judge_contention(cmp("rdma", base, {**base, "node004": 0.99}), TH, MI300X, None).cause
        == SlowdownCause.NONE
    )
    tcp = dict.fromkeys(HOSTS, 1.0)
    c = judge_contention(cmp("tcp", tcp, {**tcp, "node001": 5.0}), TH, MI300X, None)
    assert (c.cause, c.anomalous, c.tcp_named, c.rdma_hosts) == (
        SlowdownCause.TCP,
        ["node001"],
        ["node001"],
        [],
    )
    assert (
        judge_contention(cmp("tcp", tcp, {**tcp, "node001": 4.9}), TH, MI300X, None).cause
        == SlowdownCause.NONE
    )


def test_runnable_processes_per_node_or_uniform_after_a_restore() -> None:
    """Rules PB-TRAIN-4 and -6: a per-node rise (>= 2 and >= 2 above the median change) names the host
    (verdict healthy); a uniform rise after a restore is the restore leak."""
    base = dict.fromkeys(HOSTS, 10.0)
    c = judge_contention(cmp("procs", base, {**base, "node002": 12.0}), TH, MI300X, None)
    assert (c.cause, c.anomalous) == (SlowdownCause.CPU_PER_NODE, ["node002"])
    assert (
        judge_contention(cmp("procs", base, {**base, "node002": 11.9}), TH, MI300X, None).cause
        == SlowdownCause.NONE
    )
    uniform = dict.fromkeys(HOSTS, 15.0)
    c = judge_contention(cmp("procs", base, uniform), TH, MI300X, 1000)
    assert (c.cause, c.uniform, c.procs_median_delta) == (SlowdownCause.RESTORE_LEAK, True, 5.0)
    assert judge_contention(cmp("procs", base, uniform), TH, MI300X, None).cause == SlowdownCause.CPU


def regression_series(
    baseline: dict[str, dict[str, float]], degraded: dict[str, dict[str, float]]
) -> tuple[TrainingSignals, ContentionSeries]:
    sig = signals(
        timeline(tgs=lambda s: 800.0 if s >= 85 else 1000.0, moe_lb_loss=lambda s: 0.5 if s >= 84 else 0.1)
    )
    windows = contention_windows(sig, 0.0)
    return sig, ContentionSeries({}, windows, baseline, degraded)


def test_training_event_is_the_root_of_an_unexplained_regression() -> None:
    """Rule PB-TRAIN-5: nothing moved, a MoE load-balance spike came first: the event, verdict healthy."""
    flat = {"procs": dict.fromkeys(HOSTS, 10.0)}
    sig, series = regression_series(flat, flat)
    j = judge_training(sig, timeline(), series, None, restored_from_step=None, prof=MI300X, th=TH)
    assert j.verdict == Verdict.HEALTHY and j.contention is not None
    assert j.contention.cause == SlowdownCause.NONE and j.event is not None and j.event.step == 84
    assert "MoE" in j.event.label


def test_a_contention_source_outranks_the_training_event() -> None:
    before, after = {"io": dict.fromkeys(HOSTS, 1.0)}, {"io": dict.fromkeys(HOSTS, 20.0)}
    sig, series = regression_series(before, after)
    j = judge_training(sig, timeline(), series, None, restored_from_step=None, prof=MI300X, th=TH)
    assert j.verdict == Verdict.IO_CONTENTION and j.event is None and j.anomalous == list(HOSTS)


def test_restore_leak_suspicion_is_the_verdict_only_when_nothing_else_explains_the_job() -> None:
    """Rule PB-TRAIN-6: a suspected leak on a stable job -> restore-resource-leak; next to a constant
    RDMA load (its own verdict and chain) it stays a warning."""
    leak = RestoreLeakSuspicion(True, "Suspected restore resource leak", ())
    stable = signals(timeline())
    j = judge_training(
        stable, timeline(), ContentionSeries({}), leak, restored_from_step=1000, prof=MI300X, th=TH
    )
    assert j.verdict == Verdict.RESTORE_RESOURCE_LEAK and j.leak_is_diagnosis
    rdma = {"rdma": {**dict.fromkeys(HOSTS, 0.2), "node003": 50.0}}
    j = judge_training(
        stable, timeline(), ContentionSeries(rdma), leak, restored_from_step=1000, prof=MI300X, th=TH
    )
    assert (j.verdict, j.anomalous, j.leak_is_diagnosis) == (Verdict.RDMA_DEGRADATION, ["node003"], False)
    not_suspected = RestoreLeakSuspicion(False, "no sign", ())
    j = judge_training(
        stable, timeline(), ContentionSeries({}), not_suspected, restored_from_step=1000, prof=MI300X, th=TH
    )
    assert j.verdict == Verdict.HEALTHY
