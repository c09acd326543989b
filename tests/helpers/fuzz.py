"""Hypothesis budgets of the fuzz tests: a fixed CI profile; HYPOTHESIS_PROFILE=long or quick.

CI (the default) is derandomized, so every run tries the same inputs and a failure reproduces
as is; `long` multiplies each target's example count by LONG_FACTOR and draws new inputs each
run; `quick` (what `scripts/test.sh --unit` uses, a developer's loop) tries
1/QUICK_DIVISOR as many inputs (at least QUICK_MIN), derandomized too; CI keeps the full
budget. None writes an example database (a crasher found is kept as an explicit `@example`).

The deadline bounds the time of one input: it is far above what any input takes (milliseconds;
0.4 s for the largest, a 70 kB line, read and triaged four ways) so a loaded CI machine does
not trip it, and far below what a quadratic or backtracking parser takes on the inputs drawn
(seconds to minutes). It is wall time, so it grows with the xdist workers sharing each core
(`scripts/test.sh` runs five on two cores: 7.5 s), keeping the same margin over what an input
costs; one process or two workers on two cores keep 3 s. (Five workers and other engineers'
runs on the shared machine once took that 70 kB line to 4.1 s.) The too_slow health check is
timing-based too, and is off for the same reason.
"""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings

LONG_FACTOR = 25
QUICK_DIVISOR = 5
QUICK_MIN = 10
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("ci", "long", "quick"):
    raise RuntimeError(f"HYPOTHESIS_PROFILE={PROFILE!r}: expected 'ci', 'long' or 'quick'")

DEADLINE_S = 3.0


def _workers_per_core() -> float:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    return max(1.0, workers / (os.cpu_count() or 1))


_COMMON = {
    "deadline": timedelta(seconds=DEADLINE_S * _workers_per_core()),
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "print_blob": True,
}


def fuzz_settings(examples: int) -> settings:
    """The settings of one fuzz target that tries `examples` inputs in CI."""
    if PROFILE == "long":
        return settings(max_examples=examples * LONG_FACTOR, derandomize=False, **_COMMON)  # type: ignore[arg-type]
    if PROFILE == "quick":
        quick = max(QUICK_MIN, examples // QUICK_DIVISOR)
        return settings(max_examples=min(examples, quick), derandomize=True, **_COMMON)  # type: ignore[arg-type]
    return settings(max_examples=examples, derandomize=True, **_COMMON)  # type: ignore[arg-type]
