"""The notifier interface: a pure `render` and an async `send` that raises NotifierError on failure.

Notifiers whose destination holds state that must be refreshed (Alertmanager forgets an alert
that is not re-posted) also implement `StateMirror`: the service hands them the current state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from jobdiagd.alerts.messages import MessageStore
from jobdiagd.chat.auth import Authorizer
from jobdiagd.chat.router import ChatRouter
from jobdiagd.model.alerts import DaemonCondition, Incident, Notification

# Renders a notification's plot inputs to PNGs at send time: the page's picture first, then any
# further ones (a RAY=1 hang's GPU power strip); pictures that fail are left out.
PlotFn = Callable[[Mapping[str, Any]], Awaitable[list[bytes]]]


class NotifierError(Exception):
    """A send failed; the dispatcher records it and retries with backoff.

    `permanent=True` (e.g. the destination rejected this message's content) abandons this one
    notification at once instead of holding the notifier's queue until the give-up deadline.
    `retry_after` (seconds): the destination said when to come back (Telegram 429 retry_after,
    Slack Retry-After); the dispatcher waits at least that long.
    """

    def __init__(self, message: str, *, permanent: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.retry_after = retry_after


@runtime_checkable
class Notifier(Protocol):
    """Delivers notifications to one destination.

    `send` may be called again with a notification it already delivered (a crash between send and
    the outbox's mark); destinations that can, deduplicate on `notification.id`.
    """

    @property
    def name(self) -> str: ...

    def render(self, notification: Notification) -> str: ...

    async def send(self, notification: Notification) -> None: ...


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One line of `jobdiagd notify-test`: what was checked, whether it worked, and why not."""

    what: str
    ok: bool
    detail: str


@runtime_checkable
class ChatTransport(Notifier, Protocol):
    """A chat notifier that also takes commands and button presses (see `jobdiagd.chat`).

    The runner binds the message store, sets `router` (built with `auth`) and `render_plot`,
    then runs `start()`/`stop()` as a lifecycle step; `notify-test` calls `check()`.
    """

    router: ChatRouter | None
    render_plot: PlotFn | None

    @property
    def auth(self) -> Authorizer: ...

    def bind(self, messages: MessageStore) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def check(self, text: str) -> list[CheckResult]: ...


@dataclass(frozen=True)
class CurrentState:
    """What is true now, for notifiers that mirror state rather than relay messages.

    `incidents`: the open incidents people were told about, each with its newest open/remind
    notification (its current text; None when no longer stored). `conditions`: the daemon's own
    trouble (inputs failing, logs unreadable), derived from its status.
    """

    incidents: Sequence[tuple[Incident, Notification | None]] = ()
    conditions: Sequence[DaemonCondition] = ()


@runtime_checkable
class StateMirror(Protocol):
    """A notifier whose destination must be told the whole current state again and again.

    The service calls `attach` once with a lookup of stored incidents (open or resolved), then
    `resync` every `resync_interval` seconds and soon after `resync_wanted` is set. `resync`
    calls `state` itself, under the lock its `send` also takes, so a re-post never lands after,
    and undoes, a newer message.
    """

    @property
    def name(self) -> str: ...

    @property
    def resync_interval(self) -> float: ...

    @property
    def resync_wanted(self) -> asyncio.Event: ...

    def attach(self, lookup: Callable[[str], Incident | None]) -> None: ...

    async def resync(self, state: Callable[[], CurrentState]) -> bool: ...

    async def aclose(self) -> None: ...
