"""Which chat gets which notification (kind, severity, Slurm owner; first match wins) and when to stay silent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobdiagd.model.alerts import Notification
from jobdiagd.quiet_hours import QuietHours, parse_quiet_hours, zone

__all__ = ["QuietHours", "Route", "destination_for", "is_silent", "parse_quiet_hours", "zone"]


@dataclass(frozen=True, slots=True)
class Route:
    """Send matching notifications to `destination`; an empty set matches anything."""

    destination: str
    kinds: frozenset[str] = frozenset()
    severities: frozenset[str] = frozenset()
    owners: frozenset[str] = frozenset()

    def matches(self, kind: str, severity: str, owner: str | None) -> bool:
        return (
            (not self.kinds or kind in self.kinds)
            and (not self.severities or severity in self.severities)
            and (not self.owners or (owner is not None and owner in self.owners))
        )


def destination_for(n: Notification, routes: Sequence[Route], default: str) -> str:
    """The first route matching the notification's kind, severity and owner; else the default."""
    kind = n.kind
    severity: str = n.severity
    if n.incident is not None and isinstance(n.incident.get("severity"), str):
        # A resolve/update is "info" but belongs where the incident's page went.
        severity = str(n.incident["severity"])
    for r in routes:
        if r.matches(kind, severity, n.owner):
            return r.destination
    return default


RINGING_EVENTS = frozenset({"open", "remind"})


def is_silent(n: Notification, quiet: QuietHours | None, now: float) -> bool:
    """Only pages and reminders ring (rule CHAT-3): resolutions, updates, reports and notices of
    any severity arrive silently, and so does every info-level message; in quiet hours nothing
    below critical rings."""
    if n.event not in RINGING_EVENTS or n.severity == "info":
        return True
    return quiet is not None and n.severity != "critical" and quiet.active(now)
