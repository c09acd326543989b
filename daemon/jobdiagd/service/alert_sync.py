"""Keeps state-mirroring notifiers (Alertmanager) in step with the incident book and the daemon's health."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

from jobdiagd import clock
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.logsetup import get_logger
from jobdiagd.model.alerts import DaemonCondition
from jobdiagd.notifiers.base import CurrentState, Notifier, StateMirror
from jobdiagd.service.health import assess
from jobdiagd.service.lifecycle import Lifecycle

StatusFn = Callable[[], Mapping[str, Any]]


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "?"
    return datetime.fromtimestamp(float(ts), tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def conditions_from_status(
    status: Mapping[str, Any], now: float, *, skip_notifiers: Collection[str] = ()
) -> list[DaemonCondition]:
    """The daemon's own trouble, read from its status snapshot (what `jobdiagd status` shows).

    Inputs failing, jobs whose logs cannot be read, notifiers failing (other than the mirror
    itself), and ticks not completing. Each lasts exactly as long as the status says so.
    """
    out: list[DaemonCondition] = []
    sources = status.get("sources")
    for name, st in sorted(sources.items()) if isinstance(sources, Mapping) else ():
        if isinstance(st, Mapping) and st.get("failing"):
            out.append(
                DaemonCondition(
                    "source-failing",
                    "warning",
                    f"jobdiagd input {name} is failing: jobs it reports are not followed",
                    f"failing since {_when(st.get('failing_since'))}: {st.get('last_error') or 'no detail'}",
                    component=str(name),
                    since=_number(st.get("failing_since")),
                )
            )
    jobs = status.get("jobs")
    for job in jobs if isinstance(jobs, Sequence) else ():
        blind = job.get("blind") if isinstance(job, Mapping) else None
        if blind:
            paths = ", ".join(str(p) for p in blind)
            out.append(
                DaemonCondition(
                    "monitoring-blind",
                    "warning",
                    f"job {job.get('job_id')}: log unreadable, hang and failure detection paused",
                    f"cannot read: {paths}",
                    job_id=str(job.get("job_id")),
                )
            )
    notifiers = status.get("notifiers")
    for name, st in sorted(notifiers.items()) if isinstance(notifiers, Mapping) else ():
        if name in skip_notifiers or not isinstance(st, Mapping) or not st.get("failing"):
            continue
        out.append(
            DaemonCondition(
                "notifier-failing",
                "warning",
                f"jobdiagd cannot deliver to {name}: its messages wait in the outbox",
                f"failing since {_when(st.get('failing_since'))}: {st.get('last_error') or 'no detail'}",
                component=str(name),
                since=_number(st.get("failing_since")),
            )
        )
    verdict = assess(status, now)
    if not verdict.ok:
        out.append(
            DaemonCondition(
                "unhealthy",
                "critical",
                "jobdiagd is not completing its ticks: detection is stalled",
                "; ".join(verdict.problems),
                component="engine",
            )
        )
    return out


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def current_state(pipeline: AlertPipeline, status: StatusFn, skip_notifiers: Collection[str]) -> CurrentState:
    """Open incidents people were told about (with their newest text) and the daemon's conditions."""
    incidents = [
        (inc, pipeline.outbox.latest_for_incident(inc.id))
        for inc in pipeline.book.open_incidents()
        if inc.announced_at is not None
    ]
    return CurrentState(
        incidents, conditions_from_status(status(), clock.wall(), skip_notifiers=skip_notifiers)
    )


async def resync_loop(mirror: StateMirror, state: Callable[[], CurrentState]) -> None:
    """Re-post the current state every `resync_interval`, and soon after a notice asks for it."""
    log = get_logger(component="alert_sync", notifier=mirror.name)
    while True:
        try:
            await mirror.resync(state)
        except Exception as exc:  # a bug here must not stop the re-posting that keeps alerts firing
            log.error("resync_failed", error=f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(mirror.resync_wanted.wait(), mirror.resync_interval)


def add_state_mirrors(
    lc: Lifecycle, notifiers: Sequence[Notifier], pipeline: AlertPipeline, status: StatusFn
) -> list[StateMirror]:
    """Attach the store, start one resync task per mirror, and close their connections at stop.

    Call it before the "final delivery" step is added: cleanups run in reverse, so the
    connections close after the last delivery.
    """
    mirrors: list[StateMirror] = [n for n in notifiers if isinstance(n, StateMirror)]
    for m in mirrors:
        m.attach(pipeline.store.load_incident)
        state = partial(current_state, pipeline, status, (m.name,))
        lc.add_task(f"resync:{m.name}", partial(resync_loop, m, state), drain=False)

    async def close() -> None:
        for m in mirrors:
            await m.aclose()

    if mirrors:
        lc.add_step("notifier connections", cleanup=close)
    return mirrors
