"""Prune the alert store's history, so a daemon that runs for months keeps a small database.

Without it the outbox (every notification and its deliveries) and the chat-message links grow
by every page, reminder and report forever. A notification is pruned only when every delivery
of it is finished (a pending page is never dropped); a chat-message link only when its incident
is resolved (its buttons would act on nothing) or it belongs to no incident. Both after
`delivery.keep_history_seconds` (default 30 days).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from jobdiagd import clock
from jobdiagd.alerts.messages import MessageStore
from jobdiagd.alerts.outbox import Outbox
from jobdiagd.logsetup import get_logger

PRUNE_EVERY_SECONDS = 3600.0


@dataclass(frozen=True)
class Pruned:
    notifications: int
    chat_messages: int


def prune_history(outbox: Outbox, messages: MessageStore, now: float, keep_seconds: float) -> Pruned:
    """One pass; sqlite3 errors (disk full, locked) propagate to the caller."""
    cutoff = now - keep_seconds
    return Pruned(notifications=outbox.prune(cutoff), chat_messages=messages.prune(cutoff))


async def prune_loop(
    outbox: Outbox,
    messages: MessageStore,
    keep_seconds: Callable[[], float],
    sleep: Callable[[float], Awaitable[bool]],
    every: float = PRUNE_EVERY_SECONDS,
) -> None:
    """Prune at start and then every `every` seconds until `sleep` says the service stops.

    A failing pass is logged and retried at the next interval: history can wait, pages cannot,
    so this never stops the daemon."""
    log = get_logger(component="housekeeping")
    while True:
        try:
            pruned = prune_history(outbox, messages, clock.wall(), keep_seconds())
        except sqlite3.Error as exc:
            log.warning("history_prune_failed", error=str(exc), retry_in_seconds=every)
        else:
            if pruned.notifications or pruned.chat_messages:
                log.info(
                    "history_pruned",
                    notifications=pruned.notifications,
                    chat_messages=pruned.chat_messages,
                )
        if await sleep(every):
            return
