"""TGS analysis on synthetic step series: the runbook's patterns and the configurable windows."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from jobdiagd.model.records import StepRecord
from jobdiagd.triage.progress import CheckpointConfig
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
