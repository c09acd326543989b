"""The pure parts of the earliest-anomaly sweep on in-memory series: no Prometheus.

Stale sample stamps (a host or its GPU process stopped), series that end early, the training
stall and tb_* jumps, and the order of the deviations (absent hosts get a head start).
"""

from __future__ import annotations

from jobdiagd.tsdb.align import StepPoint, Timeline
from jobdiagd.tsdb.anomaly import (
    Deviation,
    earliest_first,
    series_deviations,
    stale_stamps,
    training_deviations,
)
from jobdiagd.tsdb.client import Series
from jobdiagd.tsdb.settings import Thresholds

TH = Thresholds()
STEP = 20.0


def never(_t: float) -> bool:
    return False


def test_a_stamp_falling_behind_after_the_split_is_a_stop() -> None:
    """Stopped: the newest sample is more than 3 scrapes (30 s) + one step behind the evaluation time."""
    fresh = Series({"host": "node001"}, [(t, t - 10.0) for t in (1000.0, 1020.0, 1040.0)])
    stale = Series({"host": "node002"}, [(1000.0, 990.0), (1020.0, 995.0), (1040.0, 989.0)])
    at_limit = Series({"host": "node003"}, [(1040.0, 1040.0 - 50.0)])
    before_split = Series({"host": "node004"}, [(900.0, 100.0), (1040.0, 1039.0)])
    got = stale_stamps([fresh, stale, at_limit, before_split], split=950.0, step=STEP)
    assert got == {"node002": 989.0 + 10.0}  # gone within a scrape after its last sample


def test_a_series_ending_early_marks_its_host_absent() -> None:
    pts = [(float(t), 5.0) for t in range(0, 2001, 20)]
    series = [
        Series({"__name__": "hw_procs_running", "host": "node001"}, pts),
        Series({"__name__": "hw_procs_running", "host": "node002"}, [p for p in pts if p[0] <= 1500]),
    ]
    absent: dict[str, float] = {}
    devs = series_deviations(series, 1000.0, STEP, TH, never, absent)
    assert absent == {"node002": 1520.0} and devs == []
    # A host already known absent keeps its (earlier) time.
    known = {"node002": 1200.0}
    series_deviations(series, 1000.0, STEP, TH, never, known)
    assert known == {"node002": 1200.0}


def test_training_stall_and_metric_jumps() -> None:
    pts = tuple(
        StepPoint(s, 10.0 * s, loss=2.0, grad_norm=9.0 if s >= 120 else 1.0 + 0.01 * (s % 3), step_time=10.0)
        for s in range(150)
    )
    devs = training_deviations(Timeline(pts, "tsdb"), 0.0, 2000.0, 1000.0, TH, never)
    kinds = {(d.family, d.kind) for d in devs}
    assert ("tb_step", "stalled") in kinds and ("tb_learning_grad_norm", "up") in kinds
    stall = next(d for d in devs if d.family == "tb_step")
    assert stall.onset == 1490.0 + 2 * 10.0 and stall.value == 149.0
    grad = next(d for d in devs if d.family == "tb_learning_grad_norm")
    assert grad.onset == 1200.0


def test_absent_hosts_get_two_scrapes_of_head_start_and_causes_beat_symptoms() -> None:
    power = Deviation("hw_gpu_power_watts", "node001", 1000.0, 700.0, 300.0, "down")
    gone = Deviation("up (scrapes)", "node002", 1015.0, 1.0, 0.0, "absent")
    retx = Deviation("hw_rdma_tx_retx_pkts_total", "node003", 1000.0, 0.0, 9.0, "up", counter=True)
    assert [d.host for d in earliest_first([power, gone, retx])] == ["node002", "node003", "node001"]
    late = Deviation("up (scrapes)", "node002", 1021.0, 1.0, 0.0, "absent")
    assert [d.host for d in earliest_first([power, late])] == ["node001", "node002"]
