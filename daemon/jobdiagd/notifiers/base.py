"""The notifier interface: a pure `render` and an async `send` that raises NotifierError on failure.

Notifiers whose destination holds state that must be refreshed (Alertmanager forgets an alert
that is not re-posted) also implement `StateMirror`: the service hands them the current state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from jobdiagd.model.alerts import DaemonCondition, Incident, Notification


class NotifierError(Exception):
    """A send failed; the dispatcher records it and retries with backoff.

    `permanent=True` (e.g. the destination rejected this message's content) abandons this one
    notification at once instead of holding the notifier's queue until the give-up deadline.
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


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
