"""Step <-> wall-clock alignment: real samples only, checkpoint and warmup exclusion, log cross-check."""

from __future__ import annotations

from jobdiagd.tsdb.align import checkpoint_steps, cross_check, steady_state, timeline_from_series
from jobdiagd.tsdb.client import Series
from jobdiagd.tsdb.context import LogStep


def _series() -> list[Series]:
    steps = [
        (100.0, 0),
        (110.0, 1),
        (120.0, 2),
        (270.0, 2),
        (280.0, 3),
    ]  # 270: a staleness fill re-emitting step 2
    fill = [(t, 1.0 if t == 270.0 else 0.0) for t, _ in steps]
    loss = [(t, 10.0 - s) for t, s in steps]
    st = [(100.0, 40.0), (110.0, 10.0), (120.0, 10.0), (270.0, 10.0), (280.0, 160.0)]
    return [
        Series({"__name__": "tb_step", "host": "n1"}, tuple((t, float(s)) for t, s in steps)),
        Series({"__name__": "tb_metrics_plugin_staleness_fill", "host": "n1"}, tuple(fill)),
        Series({"__name__": "tb_learning_loss", "host": "n1"}, tuple(loss)),
        Series({"__name__": "tb_perf_step_time_seconds", "host": "n1"}, tuple(st)),
    ]


def test_fills_dropped_and_mapping() -> None:
    tl = timeline_from_series(_series())
    assert [p.step for p in tl.points] == [0, 1, 2, 3]
    assert tl.fills_dropped == 1
    assert tl.time_of_step(2) == 120.0 and tl.time_of_step(3) == 280.0
    assert tl.step_at(200.0) == 2 and tl.step_at(99.0) is None
    assert tl.points[3].step_time == 160.0 and tl.points[2].loss == 8.0


def test_checkpoint_and_warmup_exclusion() -> None:
    assert checkpoint_steps(range(0, 450), 200, False) == {200, 201, 400, 401}
    assert checkpoint_steps(range(0, 250), 200, True) == {200, 201, 202}
    assert checkpoint_steps(range(10), None, False) == set()
    tl = timeline_from_series(_series())
    kept = [p.step for p in steady_state(tl, checkpoint_period=3, async_ckpt=False, warmup_steps=1)]
    assert kept == [1, 2]  # step 0 is warmup, step 3 a checkpoint


def test_cross_check() -> None:
    tl = timeline_from_series(_series())
    ok = cross_check(tl, [LogStep(2, loss=8.0004), LogStep(3, loss=7.0)])
    assert ok.status == "verified" and ok.compared == 2
    bad = cross_check(tl, [LogStep(2, loss=5.0), LogStep(3, loss=4.0)])
    assert bad.status == "mismatch" and "loss differs" in bad.detail
    disjoint = cross_check(tl, [LogStep(500, loss=1.0)])
    assert disjoint.status == "mismatch" and "do not overlap" in disjoint.detail
    assert cross_check(tl, []).status == "unverifiable"
