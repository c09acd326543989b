"""The heartbeat playbook's pure judge (`judge_heartbeat`) on in-memory series: no Prometheus.

Four hosts of eight GPUs; the heartbeat error at 3600 s with a 100 s timeout. Each test shapes
the heartbeat window and the GPU trend before it and checks the verdict and its evidence at the
thresholds of rules PB-HB-2..4.
"""

from __future__ import annotations

from dataclasses import replace

from jobdiagd.tsdb.playbooks.base import Verdict
from jobdiagd.tsdb.playbooks.heartbeat import HeartbeatSeries, judge_heartbeat
from jobdiagd.tsdb.settings import DEFAULT_PROFILES, Thresholds

TH = Thresholds()
MI300X = DEFAULT_PROFILES["MI300X"]
HOSTS = ("node001", "node002", "node003", "node004")
CRASH = 3600.0
TRAINING = (98.0, 680.0)
IDLE = (0.0, 80.0)


def trend(train_until: float, after: tuple[float, float]) -> tuple[dict[str, list[tuple[float, float]]], ...]:
    """Per-host power and utilization every 30 s: training power until `train_until`, then `after`."""
    ts = [float(t) for t in range(0, int(CRASH) + 1, 30)]
    power = {h: [(t, TRAINING[1] if t <= train_until else after[1]) for t in ts] for h in HOSTS}
    util = {h: [(t, TRAINING[0] if t <= train_until else after[0]) for t in ts] for h in HOSTS}
    return power, util


def series(gpu: dict[str, tuple[float, float]] | None = None, **kw: object) -> HeartbeatSeries:
    """Every host alive and training through the heartbeat window, the last step 6 s before the error."""
    power_t, util_t = trend(CRASH, TRAINING)
    state = {(h, str(g)): (gpu or {}).get(h, TRAINING) for h in HOSTS for g in range(8)}
    base: dict[str, object] = {
        "crash": CRASH,
        "timeout": 100.0,
        "stop": CRASH - 100.0,
        "at": CRASH,
        "at_state": CRASH,
        "util": {k: u for k, (u, _) in state.items()},
        "power": {k: p for k, (_, p) in state.items()},
        "samples": dict.fromkeys(HOSTS, 10.0),
        "seen": dict.fromkeys(HOSTS, CRASH),
        "last_step": (CRASH - 6.0, 599, "tsdb"),
        "step_time": 6.0,
        "power_trend": power_t,
        "util_trend": util_t,
    }
    base.update(kw)
    return HeartbeatSeries(**base)  # type: ignore[arg-type]


def test_live_training_hosts_make_a_false_positive() -> None:
    """Rule PB-HB-4: the accused host was alive and training, no stall."""
    j = judge_heartbeat(series(), ["node003"], HOSTS, MI300X, TH)
    assert j.verdict == Verdict.HEARTBEAT_FALSE_POSITIVE and j.anomalous == []
    assert j.accused_states == {"training": 8} and j.stall.stall_s == 6.0


def test_metrics_stopping_before_the_crash_is_dead_node() -> None:
    """Rule PB-HB-2: the accused host's newest sample more than 30 s before its newest peer's."""
    j = judge_heartbeat(
        series(seen={**dict.fromkeys(HOSTS, CRASH), "node003": CRASH - 31}), ["node003"], HOSTS, MI300X, TH
    )
    assert (j.verdict, j.anomalous) == (Verdict.DEAD_NODE, ["node003"]) and j.stopped == {
        "node003": CRASH - 31
    }
    at = judge_heartbeat(
        series(seen={**dict.fromkeys(HOSTS, CRASH), "node003": CRASH - 30}), ["node003"], HOSTS, MI300X, TH
    )
    assert at.verdict == Verdict.HEARTBEAT_FALSE_POSITIVE and at.stopped == {}


def test_oom_dmesg_down_target_or_no_samples_is_dead_node() -> None:
    """Rule PB-HB-2: each of an OOM kill, dmesg GPU errors, `up` == 0 and no sample at all."""
    for kw in (
        {"oom": {"node002": 1.0}},
        {"dmesg": {"node002": 1.0}},
        {"up_down": ["node002"]},
        {"samples": {**dict.fromkeys(HOSTS, 10.0), "node002": 0.0}},
    ):
        j = judge_heartbeat(series(**kw), ["node002"], HOSTS, MI300X, TH)
        assert (j.verdict, j.anomalous, j.dead) == (Verdict.DEAD_NODE, ["node002"], ["node002"]), kw
    # Half an OOM kill (a rate artefact) is no kill; a peer's kill does not make the accused dead.
    assert judge_heartbeat(series(oom={"node002": 0.5}), ["node002"], HOSTS, MI300X, TH).dead == []
    assert judge_heartbeat(series(oom={"node001": 1.0}), ["node002"], HOSTS, MI300X, TH).dead == []


def test_accused_host_with_every_gpu_idle_is_dead_node() -> None:
    """Rule PB-HB-2: all GPUs idle on the accused host."""
    j = judge_heartbeat(series({"node004": IDLE}), ["node004"], HOSTS, MI300X, TH)
    assert (j.verdict, j.idle_accused, j.dead) == (Verdict.DEAD_NODE, ["node004"], [])


def test_no_accused_host_judges_every_host() -> None:
    j = judge_heartbeat(series(samples={**dict.fromkeys(HOSTS, 10.0), "node001": 0.0}), [], HOSTS, MI300X, TH)
    assert j.dead == ["node001"] and j.verdict == Verdict.DEAD_NODE


def test_busy_wait_stall_of_stall_min_s_is_hang_then_heartbeat() -> None:
    """Rule PB-HB-3: stalled >= stall_min_s (600 s) before the error with >= 50 % busy-wait samples."""
    last_t = CRASH - TH.stall_min_s
    power_t, util_t = trend(last_t, (100.0, 300.0))
    data = series(last_step=(last_t, 500, "tsdb"), power_trend=power_t, util_trend=util_t)
    j = judge_heartbeat(data, ["node002"], HOSTS, MI300X, TH)
    assert j.verdict == Verdict.HANG_THEN_HEARTBEAT and j.stall.stall_s == TH.stall_min_s
    assert j.stall.busy_wait_frac == 1.0
    shorter = replace(data, last_step=(last_t + 1, 500, "tsdb"))
    j = judge_heartbeat(shorter, ["node002"], HOSTS, MI300X, TH)
    assert j.verdict == Verdict.HEARTBEAT_FALSE_POSITIVE and j.stall.stall_s == TH.stall_min_s - 1


def test_long_stall_with_idle_gpus_is_not_a_hang() -> None:
    """Rule PB-HB-3: without the busy-wait signature a long stall stays a false positive (no host died)."""
    power_t, util_t = trend(1200.0, IDLE)
    data = series(last_step=(1200.0, 200, "tsdb"), power_trend=power_t, util_trend=util_t)
    j = judge_heartbeat(data, ["node002"], HOSTS, MI300X, TH)
    assert j.verdict == Verdict.HEARTBEAT_FALSE_POSITIVE and j.stall.busy_wait_frac == 0.0


def test_a_dead_host_outranks_a_busy_wait_stall() -> None:
    last_t = CRASH - 2400
    power_t, util_t = trend(last_t, (100.0, 300.0))
    data = series(
        last_step=(last_t, 300, "tsdb"), power_trend=power_t, util_trend=util_t, oom={"node002": 1.0}
    )
    assert judge_heartbeat(data, ["node002"], HOSTS, MI300X, TH).verdict == Verdict.DEAD_NODE
