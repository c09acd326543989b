"""Quiet hours: a daily local-time window (may wrap midnight) during which only critical alerts ring."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_HHMM = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")


@dataclass(frozen=True, slots=True)
class QuietHours:
    """A daily window (may wrap midnight) in `tz` during which only critical messages notify."""

    start: time
    end: time
    tz: tzinfo | None = None  # None: the daemon host's local time

    def active(self, now: float) -> bool:
        local = (
            datetime.fromtimestamp(now, tz=self.tz) if self.tz else datetime.fromtimestamp(now).astimezone()
        )
        t = local.time().replace(tzinfo=None)
        if self.start <= self.end:
            return self.start <= t < self.end
        return t >= self.start or t < self.end


def parse_quiet_hours(spec: str, tz_name: str = "") -> QuietHours | None:
    """'22:00-07:00' (empty: no quiet hours); raises ValueError naming what is wrong."""
    if not spec.strip():
        return None
    try:
        a, b = (x.strip() for x in spec.split("-", 1))
    except ValueError:
        raise ValueError(f"quiet hours must look like 22:00-07:00, got {spec!r}") from None
    ma, mb = _HHMM.match(a), _HHMM.match(b)
    if ma is None or mb is None:
        raise ValueError(f"quiet hours must look like 22:00-07:00, got {spec!r}")
    start = time(int(ma.group(1)), int(ma.group(2)))
    end = time(int(mb.group(1)), int(mb.group(2)))
    if start == end:
        raise ValueError("quiet hours must not start and end at the same time")
    return QuietHours(start, end, zone(tz_name))


def zone(name: str) -> tzinfo | None:
    """An IANA time zone by name; empty: None (the host's local time)."""
    if not name:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}") from None
