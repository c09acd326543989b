"""Durations as people read them: exact for reports (`2m 10s`), rounded for chat and status (`12 min`)."""

from __future__ import annotations

import math


def exact_duration(seconds: float | None) -> str:
    """Exact to the second, for reports and findings: '1d 2h 3m', '2h 0m 5s', '2m 10s', '-5s'; 'unknown' for
    None and for what is not a number of seconds (NaN, infinite)."""
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    s = int(round(seconds))
    sign = "-" if s < 0 else ""
    s = abs(s)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{d}d"] if d else []
    if h or d:
        parts.append(f"{h}h")
    if m or h or d:
        parts.append(f"{m}m")
    if not d:
        parts.append(f"{s}s")
    return sign + " ".join(parts)


def rounded_duration(seconds: float) -> str:
    """Human duration for messages: '45 s', '12 min', '3 h 05 min', '2 d 4 h' ('unknown': NaN, infinite)."""
    if not math.isfinite(seconds):
        return "unknown"
    s = max(0, round(seconds))
    if s < 90:
        return f"{s} s"
    m = round(s / 60)
    if m < 90:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m:02d} min"
    d, h = divmod(h, 24)
    return f"{d} d {h} h"
