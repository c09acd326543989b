"""Hypothesis budgets of the fuzz tests: a fixed CI profile, and a long one chosen with HYPOTHESIS_PROFILE=long.

CI (the default) is derandomized, so every run tries the same inputs and a failure reproduces
as is; `long` multiplies each target's example count by LONG_FACTOR and draws new inputs each
run. Neither writes an example database (a crasher found is kept as an explicit `@example`).

The deadline bounds the time of one input: it is far above what any input takes (milliseconds)
so a loaded CI machine does not trip it, and far below what a quadratic or backtracking parser
takes on the inputs drawn (seconds to minutes). The too_slow health check is timing-based too,
and is off for the same reason.
"""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings

LONG_FACTOR = 25
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("ci", "long"):
    raise RuntimeError(f"HYPOTHESIS_PROFILE={PROFILE!r}: expected 'ci' or 'long'")

_COMMON = {
    "deadline": timedelta(seconds=3),
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "print_blob": True,
}


def fuzz_settings(examples: int) -> settings:
    """The settings of one fuzz target that tries `examples` inputs in CI."""
    if PROFILE == "long":
        return settings(max_examples=examples * LONG_FACTOR, derandomize=False, **_COMMON)  # type: ignore[arg-type]
    return settings(max_examples=examples, derandomize=True, **_COMMON)  # type: ignore[arg-type]
