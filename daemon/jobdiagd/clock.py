"""The only place that reads the real clock; everything else takes `now` as an argument."""

from __future__ import annotations

import time


def wall() -> float:
    """Seconds since the epoch (UTC)."""
    return time.time()


def monotonic() -> float:
    """Monotonic seconds for measuring durations and scheduling ticks."""
    return time.monotonic()
