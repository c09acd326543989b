"""The daemon's own health: tick bookkeeping, per-source edge triggers, the status snapshot and its verdict."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from jobdiagd import __version__
from jobdiagd.durations import rounded_duration
from jobdiagd.edge_trigger import EdgeTrigger
from jobdiagd.logsetup import get_logger

STALE_FACTOR = 3.0


@dataclass(frozen=True)
class Verdict:
    """`ok`: ticks complete (what the systemd watchdog checks: a restart cannot fix a broken
    squeue). `degraded`: ticking, but something the daemon relies on fails — a source, a
    notifier, or a job's log — so some pages may be late or missing."""

    ok: bool
    problems: list[str] = field(default_factory=list)
    tick_age: float | None = None
    degraded: list[str] = field(default_factory=list)

    @property
    def state(self) -> Literal["ok", "degraded", "unhealthy"]:
        """One of "unhealthy" (ticks stale or failing), "degraded", or "ok"."""
        if not self.ok:
            return "unhealthy"
        return "degraded" if self.degraded else "ok"


def degradations(status: Mapping[str, Any], now: float) -> list[str]:
    """Failing sources, failing notifiers and blind jobs in a status snapshot, one line each."""
    out: list[str] = []
    for kind, key in (("source", "sources"), ("notifier", "notifiers")):
        entries = status.get(key)
        if not isinstance(entries, Mapping):
            continue
        for name, st in sorted(entries.items()):
            if isinstance(st, Mapping) and st.get("failing"):
                since = st.get("failing_since")
                ago = f" for {rounded_duration(now - float(since))}" if since is not None else ""
                out.append(f"{kind} {name} failing{ago}")
    for job in status.get("jobs") or []:
        if isinstance(job, Mapping) and job.get("blind"):
            out.append(f"job {job.get('job_id')} blind")
    return out


def assess(status: Mapping[str, Any], now: float) -> Verdict:
    """Healthy when the last tick is younger than 3 x tick (or the daemon is younger than that);
    degraded (but ok) when a source or notifier fails or a job is blind.

    One rule for `jobdiagd status` and the systemd watchdog, so they never disagree.
    """
    tick = float(status.get("tick_seconds") or 0) or None
    last = status.get("last_tick_at")
    started = status.get("started_at")
    if tick is None:
        return Verdict(False, ["daemon did not report tick_seconds"])
    problems: list[str] = []
    limit = STALE_FACTOR * tick
    age = None if last is None else now - float(last)
    if age is None:
        if started is None or now - float(started) > limit:
            problems.append(f"no tick completed (limit {rounded_duration(limit)})")
    elif age > limit:
        problems.append(f"last tick {rounded_duration(age)} ago (limit {rounded_duration(limit)})")
    if status.get("last_tick_ok") is False:
        problems.append("last tick failed")
    return Verdict(not problems, problems, age, degradations(status, now))


@dataclass
class Health:
    """What the engine reports after each tick; `snapshot()` is the status socket's answer."""

    tick_seconds: float
    started_at: float
    last_tick_at: float | None = None
    last_tick_ok: bool | None = None
    ticks: int = 0
    sources: dict[str, EdgeTrigger] = field(default_factory=dict)

    def source(self, name: str) -> EdgeTrigger:
        """The edge trigger for one input (squeue, log tailer, prometheus); created on first use."""
        if name not in self.sources:
            self.sources[name] = EdgeTrigger(name, kind="source", logger=get_logger(component="sources"))
        return self.sources[name]

    def tick_done(self, now: float, ok: bool) -> None:
        self.ticks += 1
        self.last_tick_at = now
        self.last_tick_ok = ok

    def base(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "tick_seconds": self.tick_seconds,
            "last_tick_at": self.last_tick_at,
            "last_tick_ok": self.last_tick_ok,
            "ticks": self.ticks,
            "sources": {name: edge.state() for name, edge in sorted(self.sources.items())},
        }

    def snapshot(self, *parts: Mapping[str, Any]) -> dict[str, Any]:
        """Base fields merged with e.g. pipeline.snapshot(now), {"notifiers": dispatcher.snapshot()}, {"jobs": [...]}."""
        out = self.base()
        for part in parts:
            out.update(part)
        return out

    def verdict(self, now: float) -> Verdict:
        return assess(self.base(), now)

    def watchdog_check(self, now: Callable[[], float]) -> Callable[[], bool]:
        """For Lifecycle(watchdog_check=...): ping systemd only while ticks keep completing."""
        return lambda: self.verdict(now()).ok
