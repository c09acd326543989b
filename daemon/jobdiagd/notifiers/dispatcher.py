"""Delivers outbox notifications to every notifier: one worker per notifier, retries with backoff.

A worker never ends on an error: a failing send is retried with backoff, a stored notification
that does not parse is marked dead and logged (`delivery_unreadable`), and an error of the loop
itself (the store unreadable) is logged once per episode (`delivery_loop_failing`) and retried.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from jobdiagd import clock
from jobdiagd.alerts.outbox import Delivery, Outbox
from jobdiagd.config import DeliveryConfig
from jobdiagd.edge_trigger import EdgeTrigger
from jobdiagd.logsetup import get_logger
from jobdiagd.notifiers.base import Notifier, NotifierError


class DeliveryObserver(Protocol):
    """Receives one call per send attempt (DaemonMetrics implements it)."""

    def delivery_result(self, notifier: str, ok: bool, seconds: float) -> None: ...


# While the store refuses delivery marks, the workers retry writing them this often.
HELD_MARK_RETRY_S = 5.0
# A notifier's trouble is told to people (`on_degraded`) once it has failed this many sends in
# a row AND for as long as the backoff cap (5 min by default): a refused send (a 429, a blip, a
# bot still connecting at start) is retried and is not news.
NOTICE_AFTER_FAILURES = 2

# (notifier, last error, failing since, now); (notifier, failing since, now).
DegradedHook = Callable[[str, str, float, float], None]
RecoveredHook = Callable[[str, float, float], None]


@dataclass(frozen=True)
class RetryPolicy:
    initial: float = 5.0
    maximum: float = 300.0
    give_up_after: float = 86400.0
    send_timeout: float = 10.0

    @classmethod
    def from_config(cls, cfg: DeliveryConfig) -> RetryPolicy:
        return cls(
            cfg.retry_initial_seconds,
            cfg.retry_max_seconds,
            cfg.give_up_after_seconds,
            cfg.send_timeout_seconds,
        )

    def delay(self, attempts: int) -> float:
        """Wait after the `attempts`-th failed attempt (1-based): initial, 2x, 4x, ... capped."""
        return float(min(self.maximum, self.initial * 2 ** max(0, attempts - 1)))


@dataclass
class NotifierState:
    sent: int = 0
    failed: int = 0
    dead: int = 0
    blocked_until: float = 0.0
    edge: EdgeTrigger = field(default_factory=lambda: EdgeTrigger("?", kind="notifier"))
    loop_edge: EdgeTrigger = field(default_factory=lambda: EdgeTrigger("?", kind="delivery_loop"))


@dataclass(frozen=True)
class DrainResult:
    sent: int
    failed: int
    dropped: int = 0


class Dispatcher:
    """Fan-out from the outbox. `kick()` is synchronous and cheap: the tick never waits on a send.

    A failing notifier backs off on its own (its queue waits, in order, until the retry time);
    the others keep delivering. Deliveries older than `give_up_after` are marked dead.
    `on_degraded` runs once per episode when a notifier has failed NOTICE_AFTER_FAILURES sends
    in a row for at least the backoff cap, `on_recovered` once it has delivered what waited (the
    runner queues a notice for each).
    """

    def __init__(
        self,
        outbox: Outbox,
        notifiers: Sequence[Notifier],
        *,
        policy: RetryPolicy | None = None,
        now: Callable[[], float] = clock.wall,
        observer: DeliveryObserver | None = None,
    ) -> None:
        names = [n.name for n in notifiers]
        if len(set(names)) != len(names):
            raise ValueError(f"notifier names must be unique: {names}")
        unknown = set(names) - set(outbox.notifiers)
        if unknown:
            raise ValueError(f"notifiers not known to the outbox: {sorted(unknown)}")
        self.outbox = outbox
        self.notifiers = {n.name: n for n in notifiers}
        self.policy = policy or RetryPolicy()
        self._now = now
        self.observer = observer
        self._log = get_logger(component="dispatcher")
        self.state = {
            name: NotifierState(
                edge=EdgeTrigger(name, kind="notifier", logger=self._log),
                loop_edge=EdgeTrigger(name, kind="delivery_loop", logger=self._log),
            )
            for name in self.notifiers
        }
        self._wake = {name: asyncio.Event() for name in self.notifiers}
        self.on_degraded: DegradedHook | None = None
        self.on_recovered: RecoveredHook | None = None
        self._told: dict[str, float] = {}  # notifier -> failing since, once on_degraded ran

    def kick(self) -> None:
        """New notifications are in the outbox: wake every worker that is not backing off."""
        for event in self._wake.values():
            event.set()

    async def drain(self, now: float | None = None) -> DrainResult:
        """One pass over every notifier's due deliveries, notifiers concurrently (used at start and by tests)."""
        t = self._now() if now is None else now
        results = await asyncio.gather(*(self._drain_one(name, t) for name in self.notifiers))
        return DrainResult(
            sum(r.sent for r in results), sum(r.failed for r in results), sum(r.dropped for r in results)
        )

    async def run(self) -> None:
        """Deliver until cancelled; pending deliveries from before a restart go first."""
        async with asyncio.TaskGroup() as tg:
            for name in self.notifiers:
                tg.create_task(self._worker(name), name=f"notifier:{name}")

    def snapshot(self) -> dict[str, Any]:
        return {
            name: {"sent": s.sent, "failed": s.failed, "dead": s.dead, **s.edge.state()}
            for name, s in self.state.items()
        }

    async def _worker(self, name: str) -> None:
        wake = self._wake[name]
        st = self.state[name]
        while True:
            wake.clear()
            try:
                now = self._now()
                if now >= st.blocked_until:
                    await self._drain_one(name, now)
                now = self._now()
                nxt = self.outbox.next_attempt_at(name)
                st.loop_edge.success(now)
            except Exception as exc:  # e.g. the store unreadable: retry later, never end the worker
                now = self._now()
                st.loop_edge.failure(exc, now)
                await asyncio.sleep(self.policy.initial)
                continue
            if self.outbox.held_marks:
                # Marks the store refused: retry them soon even if nothing else happens.
                nxt = min(nxt if nxt is not None else float("inf"), now + HELD_MARK_RETRY_S)
            until = max(nxt if nxt is not None else float("inf"), st.blocked_until)
            if st.blocked_until > now:
                # Backing off: a kick must not cut the wait short, or a dead endpoint gets hammered.
                await asyncio.sleep(st.blocked_until - now)
                continue
            timeout = None if until == float("inf") else max(0.0, until - now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout)

    async def _drain_one(self, name: str, now: float) -> DrainResult:
        counts = {"sent": 0, "failed": 0, "dropped": 0}
        notifier = self.notifiers[name]
        self.outbox.flush_marks()
        while batch := self._due(name, now):
            for delivery in batch:
                outcome = await self._attempt(notifier, delivery, now)
                counts[outcome] += 1
                if outcome == "failed":
                    # The destination is failing: stop this pass (the outbox keeps the order).
                    return DrainResult(**counts)
        return DrainResult(**counts)

    def _due(self, name: str, now: float) -> list[Delivery]:
        batch = self.outbox.due(name, now)
        for notifier, nid, error in self.outbox.bad_rows:
            self.state[notifier].dead += 1
            self._log.error("delivery_unreadable", notifier=notifier, notification=nid, error=error)
        self.outbox.bad_rows.clear()
        return batch

    async def _attempt(
        self, notifier: Notifier, delivery: Delivery, now: float
    ) -> Literal["sent", "failed", "dropped"]:
        name = notifier.name
        st = self.state[name]
        nid = delivery.notification.id
        started = clock.monotonic()
        try:
            async with asyncio.timeout(self.policy.send_timeout):
                await notifier.send(delivery.notification)
        except Exception as exc:  # a notifier bug must not kill its worker; CancelledError passes
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            attempts = delivery.attempts + 1
            permanent = isinstance(exc, NotifierError) and exc.permanent
            backoff_until = now + self.policy.delay(attempts)
            if isinstance(exc, NotifierError) and exc.retry_after is not None:
                # The server said when, counted from its answer (not from the start of this pass,
                # which a slow request predates): sooner is refused again.
                backoff_until = max(backoff_until, self._now() + exc.retry_after)
            retry_at: float | None = backoff_until
            if permanent or now - delivery.notification.created_at >= self.policy.give_up_after:
                retry_at = None
                st.dead += 1
                self._log.error(
                    "delivery_abandoned", notifier=name, notification=nid, attempts=attempts, error=error
                )
            self.outbox.mark_failed(nid, name, error, retry_at)
            st.failed += 1
            self._observe(name, False, started)
            if permanent:
                return "dropped"  # this message is the problem, not the destination: go on with the queue
            st.blocked_until = retry_at if retry_at is not None else now
            st.edge.failure(error, now)
            self._tell_degraded(name, st, error, now)
            return "failed"
        self.outbox.mark_sent(nid, name, self._now())
        st.sent += 1
        st.edge.success(now)
        self._observe(name, True, started)
        self._tell_recovered(name, now)
        return "sent"

    def _tell_degraded(self, name: str, st: NotifierState, error: str, now: float) -> None:
        if self.on_degraded is None or name in self._told or st.edge.failures < NOTICE_AFTER_FAILURES:
            return
        since = st.edge.failing_since if st.edge.failing_since is not None else now
        if now - since < self.policy.maximum:
            return
        try:
            self.on_degraded(name, error, since, now)
        except Exception as exc:  # told at the next failure instead
            self._log.error("notifier_notice_failed", notifier=name, error=f"{type(exc).__name__}: {exc}")
            return
        self._told[name] = since

    def _tell_recovered(self, name: str, now: float) -> None:
        since = self._told.get(name)
        if since is None or self.on_recovered is None:
            return
        if self.outbox.pending_count(name):
            return  # recovered = what waited is delivered: a flapping notifier (a 429 storm) is told once
        try:
            self.on_recovered(name, since, now)
        except Exception as exc:  # told after the next send instead
            self._log.error("notifier_notice_failed", notifier=name, error=f"{type(exc).__name__}: {exc}")
            return
        del self._told[name]

    def _observe(self, name: str, ok: bool, started: float) -> None:
        if self.observer is not None:
            self.observer.delivery_result(name, ok, clock.monotonic() - started)
