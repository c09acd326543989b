"""The transport-neutral chat message: what Telegram and Slack renderers translate, and what the router answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from jobdiagd.model.alerts import Severity

ButtonStyle = Literal["default", "primary", "danger"]


@dataclass(frozen=True, slots=True)
class Button:
    """A button whose `token` ("<action>:<incident token>", see chat.buttons) comes back on a press."""

    label: str
    token: str
    style: ButtonStyle = "default"


@dataclass(frozen=True, slots=True)
class Picture:
    png: bytes
    filename: str = "plot.png"


@dataclass(frozen=True, slots=True)
class Document:
    """A long report sent as a file (Markdown) beside a short summary message."""

    filename: str
    content: str
    mime: str = "text/markdown"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message for people.

    `body` is Markdown as the rest of jobdiagd writes it (headings, **bold**, `code`, fenced
    blocks, pipe tables); `status` is a one-line state ("acked by alice 12:03"); `buttons` are
    rows of buttons. A transport shows `title` prominently and `body` below it, and keeps
    `compact` messages (photo captions, summaries) short. `more` (Markdown) follows the body
    and is what a message too long for its room loses first (a page's facts after its lead);
    a cut body or `more` ends with `cut_note` (where the rest is), never a bare "…".
    """

    title: str
    body: str = ""
    status: str = ""
    severity: Severity | None = None
    buttons: tuple[tuple[Button, ...], ...] = ()
    picture: Picture | None = None
    document: Document | None = None
    silent: bool = False
    preformatted: bool = False  # body is plain text to show in monospace (status tables)
    footer: str = ""
    more: str = ""
    cut_note: str = ""
    tags: tuple[str, ...] = field(default=())  # free labels for logs/tests ("incident", "report")


CUT_NOTE = "… (cut: too long for one message)"
SEVERITY_MARK = {"critical": "🔴", "warning": "🟠", "info": "🔵"}
RESOLVED_MARK = "✅"
