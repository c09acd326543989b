"""TGS analysis on synthetic step series: the patterns (rules TGS-3 to TGS-7) and the configurable windows."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from jobdiagd.model.records import StepRecord
from jobdiagd.model.triage import CheckpointConfig
from jobdiagd.triage.progress import checkpoint_config
from jobdiagd.triage.tgs import analyze_tgs

NO_CKPT = CheckpointConfig(False, None, False)


def series(n: int, tgs: Callable[[int], float]) -> list[StepRecord]:
    return [StepRecord(k, 3290.0 / tgs(k) * 5.0, tgs(k), None, None, None, k + 1, 0, "t") for k in range(n)]


@pytest.mark.parametrize(
    ("shape", "pattern", "degraded"),
    [
        (lambda k: 3290.0, "none", False),
        (lambda k: 3290.0 if k < 30 else 2520.0, "constant-drop", True),
        (lambda k: 3290.0 if k < 80 else 2600.0, "one-time", True),
        (lambda k: 3290.0 * (1 - 0.003 * max(0, k - 20)), "gradual", True),
        (lambda k: 2800.0 if 40 <= k < 60 else (2400.0 if k >= 75 else 3290.0), "phased", True),
    ],
)
def test_patterns(shape: Callable[[int], float], pattern: str, degraded: bool) -> None:
    a = analyze_tgs(series(100, shape), NO_CKPT)
    assert (a.pattern, a.degraded) == (pattern, degraded)
    if degraded:
        assert a.range is not None and a.magnitude is not None and "→" in a.magnitude


def test_checkpoint_spikes_are_periodic_not_degradation() -> None:
    ckpt = CheckpointConfig(True, 20, False)
    a = analyze_tgs(series(100, lambda k: 500.0 if k % 20 in (0, 1) and k > 0 else 3290.0), ckpt)
    assert (a.pattern, a.degraded) == ("periodic", False)
    assert set(a.periodic_steps) >= {20, 21, 40, 41}


def test_windows_are_configurable() -> None:
    steps = series(60, lambda k: 3290.0 if k < 50 else 2500.0)
    assert analyze_tgs(steps, NO_CKPT).degraded  # last 10 steps are all low
    assert not analyze_tgs(steps, NO_CKPT, recent_steps=40).degraded  # mostly healthy over 40
    assert analyze_tgs(steps, NO_CKPT, baseline_steps=(50, 55)).baseline == pytest.approx(2500.0)


def noisy(
    n: int, tgs: Callable[[int], float], seed: int, sigma: float, outliers: float = 0.0
) -> list[StepRecord]:
    """A seeded step series: gaussian jitter on every step, rare one-off steps at half speed."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        v = tgs(k) * (1 + rng.gauss(0, sigma)) * (0.5 if rng.random() < outliers else 1.0)
        out.append(StepRecord(k, 3290.0 / v * 5.0, v, None, None, None, k + 1, 0, "t"))
    return out


SEEDS = range(12)


@pytest.mark.parametrize("sigma", [0.01, 0.03, 0.05])
@pytest.mark.parametrize(
    "shape",
    [
        lambda k: 3290.0 * (1 - 0.25 * k / 300),  # slides from the start
        lambda k: 3290.0 * (1 - 0.18 * max(0, k - 60) / 240),  # flat, then slides
    ],
    ids=["slides-from-start", "flat-then-slides"],
)
def test_a_steady_slide_under_jitter_is_gradual(shape: Callable[[int], float], sigma: float) -> None:
    for seed in SEEDS:
        a = analyze_tgs(noisy(300, shape, seed, sigma), NO_CKPT)
        assert (a.pattern, a.degraded) == ("gradual", True), (seed, a)


@pytest.mark.parametrize(("sigma", "outliers"), [(0.02, 0.0), (0.05, 0.0), (0.08, 0.0), (0.03, 0.02)])
def test_jitter_on_a_healthy_job_is_no_pattern(sigma: float, outliers: float) -> None:
    for seed in SEEDS:
        for n in (120, 1500):
            a = analyze_tgs(noisy(n, lambda k: 3290.0, seed, sigma, outliers), NO_CKPT)
            assert (a.pattern, a.degraded) == ("none", False), (seed, n, a)


@pytest.mark.parametrize("window", [(1, 7), (20, 26), (100, 106)])
@pytest.mark.parametrize("configured", [True, False])
def test_a_profiler_window_is_not_a_periodic_pattern(window: tuple[int, int], configured: bool) -> None:
    # Runbook: the profiled steps may be slower; a one-off window, not periodic spikes.
    ckpt = CheckpointConfig(False, None, False, profile=window) if configured else NO_CKPT
    for seed in SEEDS:
        steps = noisy(300, lambda k: 3290.0 / (3.0 if window[0] <= k <= window[1] else 1.0), seed, 0.03)
        a = analyze_tgs(steps, ckpt)
        assert (a.pattern, a.degraded, a.periodic_steps) == ("none", False, ()), (seed, a)


def test_the_profiler_window_the_log_printed_is_excluded_from_the_baseline() -> None:
    ckpt = checkpoint_config({}, {}, [], profiler_steps=[8, 12])
    assert ckpt.profile == (8, 13) and ckpt.profiled(10) and not ckpt.periodic(10)
    steps = series(100, lambda k: 1000.0 if 8 <= k <= 13 else 3290.0)
    assert analyze_tgs(steps, ckpt).baseline == pytest.approx(3290.0)


@pytest.mark.parametrize(
    ("shape", "pattern"),
    [
        (lambda k: 3290.0 if k < 30 else 2520.0, "constant-drop"),
        (lambda k: 3290.0 if k < 80 else 2600.0, "one-time"),
        (lambda k: 2800.0 if 40 <= k < 60 else (2400.0 if k >= 75 else 3290.0), "phased"),
    ],
)
def test_the_other_patterns_hold_under_jitter(shape: Callable[[int], float], pattern: str) -> None:
    for seed in SEEDS:
        a = analyze_tgs(noisy(100, shape, seed, 0.03), NO_CKPT)
        assert (a.pattern, a.degraded) == (pattern, True), (seed, a)


def test_isolated_spikes_at_one_interval_are_periodic_without_a_known_period() -> None:
    for seed in SEEDS:
        a = analyze_tgs(noisy(200, lambda k: 500.0 if k % 20 == 0 and k > 0 else 3290.0, seed, 0.03), NO_CKPT)
        assert (a.pattern, a.degraded) == ("periodic", False), (seed, a)
