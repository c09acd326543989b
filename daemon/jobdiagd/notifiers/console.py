"""Console notifier: a readable block per notification on stderr (or stdout), coloured on a terminal."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from typing import Literal, TextIO

from jobdiagd.model.alerts import Notification
from jobdiagd.notifiers.base import NotifierError

_RESET = "\x1b[0m"
_BOLD = "\x1b[1m"
_DIM = "\x1b[2m"
_COLOURS = {"critical": "\x1b[31m", "warning": "\x1b[33m", "info": "\x1b[36m"}
_RESOLVED = "\x1b[32m"
_LABELS = {
    "open": "OPEN",
    "remind": "STILL",
    "resolve": "RESOLVED",
    "report": "REPORT",
    "notice": "NOTICE",
    "update": "UPDATE",
}


def use_colour(mode: Literal["auto", "always", "never"], stream: TextIO) -> bool:
    if mode != "auto":
        return mode == "always"
    # https://no-color.org: any non-empty NO_COLOR disables colour.
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class ConsoleNotifier:
    name = "console"

    def __init__(
        self, stream: TextIO | None = None, *, color: Literal["auto", "always", "never"] = "auto"
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.color = use_colour(color, self.stream)

    def render(self, notification: Notification) -> str:
        n = notification
        when = datetime.fromtimestamp(n.created_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        label = _LABELS[n.event]
        sev = (
            ""
            if n.event in ("resolve", "report", "notice", "update") and n.severity == "info"
            else f" [{n.severity}]"
        )
        head = f"{label:<8} {n.title}{sev}"
        body = "\n".join("    " + line if line else "" for line in n.body.splitlines())
        if self.color:
            colour = _RESOLVED if n.event == "resolve" else _COLOURS[n.severity]
            head = f"{colour}{_BOLD}{head}{_RESET}"
            when = f"{_DIM}{when}{_RESET}"
        return f"{when}  {head}\n{body}\n" if body else f"{when}  {head}\n"

    async def send(self, notification: Notification) -> None:
        try:
            self.stream.write(self.render(notification))
            self.stream.flush()
        except (OSError, ValueError) as exc:  # ValueError: stream closed
            raise NotifierError(f"console: {exc}") from exc
