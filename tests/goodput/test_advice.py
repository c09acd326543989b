"""Checkpoint-interval advice on literal numbers (rules GP-8, GP-9)."""

from __future__ import annotations

import math

import pytest

from jobdiagd.goodput.advice import (
    Rates,
    advise,
    availability,
    availability_optimal,
    young_daly,
)


def test_young_daly_and_the_availability_optimum() -> None:
    assert young_daly(60, 18_000) == pytest.approx(math.sqrt(2_160_000))  # 1469.7 s
    # Tc = Ts + sqrt(2 (M + Te + Tr) Ts + Ts^2) = 60 + sqrt(2 * 18600 * 60 + 3600)
    assert availability_optimal(60, 18_000, 600) == pytest.approx(60 + math.sqrt(2_235_600))


def test_the_optimum_is_where_the_availability_peaks() -> None:
    best = availability_optimal(45, 20_000, 900)
    a = availability(best, 45, 20_000, 900)
    for other in (best * 0.8, best - 5, best + 5, best * 1.25):
        assert availability(other, 45, 20_000, 900) < a
    assert availability(40, 45, 20_000, 900) == 0.0  # an interval shorter than the save


def test_the_sentence_the_issue_shows_from_measured_numbers() -> None:
    a = advise(
        config="JAX-llama3.1-70b x4",
        nnodes=4,
        step_time_s=6.0,
        period_steps=100,
        save_s=60.0,
        mtbf_s=5.2 * 3600,
        detection_s=180.0,
        restart_s=600.0,
    )
    assert a is not None
    # Tc* = 60 + sqrt(2 (18720 + 780) 60 + 3600) = 1590.9 s -> 255 steps of 6 s.
    assert a.best_steps == 255 and a.best_s == 1530
    assert a.loss_now == pytest.approx(1 - (1 - 60 / 660) * 18_720 / (18_720 + 780 + 330))
    assert a.loss_best == pytest.approx(1 - (1 - 60 / 1590) * 18_720 / (18_720 + 780 + 795))
    assert a.sentence() == (
        "checkpoint every 100 steps (10 min) now; every 255 steps (26 min) would lose 21 % fewer "
        "GPU-hours at your measured MTBF of 5.2 h"
    )
    assert "arXiv 2410.18124" in a.formula() and "Young/Daly" in a.formula()
    assert "30-min log-mtime monitor" in a.formula()  # slower detection would force >= 30 min


def test_a_slow_detection_bounds_the_interval_from_below() -> None:
    a = advise(
        config="c",
        nnodes=4,
        step_time_s=5.0,
        period_steps=20,
        save_s=10.0,
        mtbf_s=7200.0,
        detection_s=3600.0,
        restart_s=0.0,
    )
    assert a is not None and a.bound_by_detection
    assert a.best_steps == round((3600 - 10) / 5)
    assert "bounds the interval from below" in a.sentence()


def test_an_interval_near_the_optimum_is_left_alone() -> None:
    a = advise(
        config="c",
        nnodes=4,
        step_time_s=6.0,
        period_steps=250,
        save_s=60.0,
        mtbf_s=5.2 * 3600,
        detection_s=180.0,
        restart_s=600.0,
    )
    assert a is not None and "within 1 %" in a.sentence()


def test_nothing_to_advise_without_a_save_cost_or_an_mtbf() -> None:
    kw = {
        "config": "c",
        "nnodes": 1,
        "step_time_s": 5.0,
        "period_steps": 10,
        "detection_s": 0.0,
        "restart_s": 0.0,
    }
    assert advise(save_s=0.0, mtbf_s=3600.0, **kw) is None  # type: ignore[arg-type]
    assert advise(save_s=10.0, mtbf_s=0.0, **kw) is None  # type: ignore[arg-type]


def test_mtbf_per_node_count_falls_back_to_the_fleet_rate() -> None:
    r = Rates(hours={4: 100.0, 8: 10.0}, events={4: 5, 8: 1})
    mtbf4, basis4 = r.mtbf_s(4)
    assert mtbf4 == pytest.approx(100 * 3600 / 5) and "on 4 nodes" in basis4
    # 8 nodes: one interruption only -> the fleet's 6 per 480 node-hours, scaled to 8 nodes.
    mtbf8, basis8 = r.mtbf_s(8)
    assert mtbf8 == pytest.approx(3600 / (6 / 480 * 8)) and "fleet rate" in basis8
    assert Rates({2: 50.0}, {}).mtbf_s(2) == (None, "no interruption in 100 node-hours")
