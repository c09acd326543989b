"""The notifier interface: a pure `render` and an async `send` that raises NotifierError on failure."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from jobdiagd.model.alerts import Notification


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
