"""Slack Block Kit: the neutral chat message as blocks (header, mrkdwn sections, context, buttons) within
Slack's limits, with its plain-text fallback.

Slack's limits: 50 blocks a message, 3000 characters of section text, 150 of header text,
25 elements an actions block, 10 a context block, button text 75, value 2000, action_id 255.
Markdown becomes Slack mrkdwn (`**b**` -> `*b*`, headings bold, fenced blocks and pipe tables
as ``` blocks, `[t](u)` -> `<u|t>`), and `&`, `<`, `>` are escaped everywhere (Slack reads
`<...>` as a link or mention). Long bodies are split into sections at line ends; a code block
cut by a split is closed and reopened, so each section renders on its own. Beyond 50 blocks the
body is cut with a marker (the transports send long reports as a file before that happens).
Buttons carry the token ("<action>:<incident token>") as both value and action_id, so a press
names its action without server-side lookup tables and action ids stay unique in a message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from jobdiagd.chat.markdown import BlockKind, blocks, convert_inline
from jobdiagd.chat.model import Button, ChatMessage

MAX_BLOCKS = 50
SECTION_LIMIT = 3000
HEADER_LIMIT = 150
ACTIONS_PER_BLOCK = 25
CONTEXT_ELEMENTS = 10
BUTTON_TEXT_LIMIT = 75
VALUE_LIMIT = 2000
ACTION_ID_LIMIT = 255
FALLBACK_LIMIT = 3000  # the notification preview; the blocks carry the rest
ACTIONS_BLOCK_PREFIX = "jd_actions_"
CUT_MARKER = "_… cut: too long for one Slack message_"

_INLINE = re.compile(r"(`+)(.+?)\1|\*\*(.+?)\*\*|\[([^\]\n]+)\]\((https?://[^\s)]+)\)")
_ENTITY_TAIL = re.compile(r"&[a-z]{0,3}$")


def escape(text: str) -> str:
    """Slack's three control characters; everything else is shown as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def inline(text: str) -> str:
    """One line of the Markdown inline subset (`code`, **bold**, [link](url)) as escaped mrkdwn."""
    return convert_inline(text, _INLINE, escape, _inline_markup)


def _inline_markup(m: re.Match[str]) -> str:
    if m.group(2) is not None:
        return f"`{escape(m.group(2))}`"
    if m.group(3) is not None:
        return f"*{inline(m.group(3))}*"
    label = escape(m.group(4)).replace("|", "¦")
    return f"<{escape(m.group(5))}|{label}>"


# A rendered body is a list of (line, in_code) so the splitter knows where code blocks run.
Line = tuple[str, bool]


def markdown_lines(md: str) -> list[Line]:
    """The Markdown the reports and alerts use, as mrkdwn lines (code lines flagged, fences dropped)."""
    out: list[Line] = []
    for block in blocks(md):
        if block.kind in (BlockKind.CODE, BlockKind.TABLE):
            out += [(escape(line), True) for line in block.lines]
        elif block.kind is BlockKind.HEADING:
            out.append((f"*{inline(block.text)}*", False))
        elif block.kind is BlockKind.BULLET:
            out.append((f"{block.indent}• {inline(block.text)}", False))
        else:
            out.append((inline(block.text), False))
    return out


def _cut_escaped(text: str, size: int) -> int:
    """A cut position <= size that does not split an escape like `&amp;`."""
    m = _ENTITY_TAIL.search(text[:size])
    return m.start() if m is not None and m.start() > 0 else size


def _join(lines: Sequence[Line]) -> str:
    """Lines as one mrkdwn text, each code run wrapped in ``` fences."""
    out: list[str] = []
    in_code = False
    for text, code in lines:
        if code != in_code:  # a code run starts or ends
            out.append("```")
        in_code = code
        out.append(text)
    if in_code:
        out.append("```")
    return "\n".join(out).strip("\n")


def split_sections(lines: Sequence[Line], limit: int = SECTION_LIMIT) -> list[str]:
    """Cut mrkdwn lines into section texts of at most `limit` characters at line ends.

    A code run cut by a split is closed at the end of one section and reopened in the next (each
    section is rendered on its own); a line longer than a section is cut inside.
    """
    fence_cost = 8  # "```\n" + "\n```" around a code run
    room = limit - 2 * fence_cost
    pieces: list[Line] = []
    for text, code in lines:
        while len(text) > room:
            cut = _cut_escaped(text, room)
            pieces.append((text[:cut], code))
            text = text[cut:]
        pieces.append((text, code))
    sections: list[str] = []
    cur: list[Line] = []
    for piece in pieces:
        if cur and len(_join([*cur, piece])) > limit:
            sections.append(_join(cur))
            cur = []
        cur.append(piece)
    if cur:
        sections.append(_join(cur))
    return [s for s in sections if s.strip() and s.strip("`\n ")]


def _plain(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def header_block(title: str) -> dict[str, Any]:
    return {
        "type": "header",
        "text": {"type": "plain_text", "text": _plain(title or "jobdiagd", HEADER_LIMIT)},
    }


def context_block(*mrkdwn: str) -> dict[str, Any]:
    return {
        "type": "context",
        "elements": [{"type": "mrkdwn", "text": t[:SECTION_LIMIT]} for t in mrkdwn[:CONTEXT_ELEMENTS] if t],
    }


def button_element(b: Button) -> dict[str, Any]:
    el: dict[str, Any] = {
        "type": "button",
        "text": {"type": "plain_text", "text": _plain(b.label, BUTTON_TEXT_LIMIT), "emoji": True},
        "action_id": b.token[:ACTION_ID_LIMIT],
        "value": b.token[:VALUE_LIMIT],
    }
    if b.style != "default":
        el["style"] = b.style
    return el


def action_blocks(rows: Sequence[Sequence[Button]]) -> list[dict[str, Any]]:
    """One actions block per button row (at most 25 buttons each)."""
    out: list[dict[str, Any]] = []
    for i, row in enumerate(r for r in rows if r):
        out.append(
            {
                "type": "actions",
                "block_id": f"{ACTIONS_BLOCK_PREFIX}{i}",
                "elements": [button_element(b) for b in row[:ACTIONS_PER_BLOCK]],
            }
        )
    return out


def with_buttons(
    blocks: Sequence[Mapping[str, Any]], rows: Sequence[Sequence[Button]]
) -> list[dict[str, Any]]:
    """A posted message's blocks with its buttons replaced (a press changed the incident's state)."""
    kept = [
        dict(b)
        for b in blocks
        if not (b.get("type") == "actions" and str(b.get("block_id", "")).startswith(ACTIONS_BLOCK_PREFIX))
    ]
    return kept + action_blocks(rows)


def fallback_text(msg: ChatMessage, mention: str = "") -> str:
    """The message's `text`: what notifications, screen readers and old clients show."""
    text = escape(msg.title)
    if msg.status:
        text += f" — {escape(msg.status)}"
    if mention:
        text = f"{mention} {text}"
    return text[:FALLBACK_LIMIT]


def render(
    msg: ChatMessage, *, mention: str = "", notes: Sequence[str] = ()
) -> tuple[str, list[dict[str, Any]]]:
    """(text fallback, blocks) of a message: header, state line, body sections, footer, buttons.

    `mention` (already Slack syntax, e.g. "<!here>") goes first in the state line so the page
    rings; `notes` are extra mrkdwn context lines the transport adds ("plot in the thread").
    """
    blocks: list[dict[str, Any]] = [header_block(msg.title)]
    state = [t for t in (mention, f"_{escape(msg.status)}_" if msg.status else "") if t]
    if state:
        blocks.append(context_block(" ".join(state)))
    tail: list[dict[str, Any]] = []
    footer = [escape(msg.footer) if msg.footer else "", *notes]
    if any(footer):
        tail.append(context_block(*[f for f in footer if f]))
    tail += action_blocks(msg.buttons)
    sections: list[str] = []
    if msg.body:
        lines = (
            [(escape(ln), True) for ln in msg.body.splitlines()]
            if msg.preformatted
            else markdown_lines(msg.body)
        )
        sections += split_sections(lines)
    if msg.more:  # its own sections after the body's: a page's lead stands alone at the top
        sections += split_sections(markdown_lines(msg.more))
    room = MAX_BLOCKS - len(blocks) - len(tail)
    if len(sections) > room:
        note = f"_{escape(msg.cut_note)}_" if msg.cut_note else CUT_MARKER
        sections = [*sections[: room - 1], note]
    blocks += [{"type": "section", "text": {"type": "mrkdwn", "text": s}} for s in sections]
    return fallback_text(msg, mention), blocks + tail
