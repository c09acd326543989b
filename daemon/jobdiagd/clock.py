"""The only place that reads the real clock; everything else takes `now` as an argument."""

from __future__ import annotations

import time


def wall() -> float:
    """Seconds since the epoch (UTC)."""
    return time.time()


def monotonic() -> float:
    """Monotonic seconds for measuring durations and scheduling ticks."""
    return time.monotonic()


def thread_cpu() -> float:
    """CPU seconds the calling thread has used: what a tick costs, apart from the time a loaded
    machine kept it waiting for a core."""
    return time.thread_time()
