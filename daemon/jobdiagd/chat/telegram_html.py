"""Telegram HTML: the project's Markdown bodies as Telegram's HTML subset, escaped, split under the limits.

Telegram accepts only b, i, u, s, code, pre, a, blockquote, tg-spoiler and rejects a whole
message with an unclosed tag, so the converter emits balanced tags from a small Markdown subset
(headings, **bold**, `code`, fenced blocks, pipe tables as aligned <pre>, lists) and escapes
everything else. `split_html` cuts at line ends where it can and closes/reopens the tags open
at a cut, so a code block split over two messages is a code block in both.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

from jobdiagd.chat.markdown import BlockKind, blocks, convert_inline
from jobdiagd.chat.model import CUT_NOTE, ChatMessage

MESSAGE_LIMIT = 4096
CAPTION_LIMIT = 1024

_INLINE = re.compile(r"(`+)(.+?)\1|\*\*(.+?)\*\*")
_TOKEN = re.compile(r"<[^>]*>|&[#A-Za-z0-9]+;|[^<&]")
_TAG = re.compile(r"<(/?)([a-zA-Z-]+)[^>]*>")


def escape(text: str) -> str:
    """Escape text for Telegram HTML (quotes too: the text may land in an attribute)."""
    return html.escape(text, quote=True)


def inline(text: str) -> str:
    """One line of Markdown's inline subset (`code`, **bold**) as escaped HTML."""
    return convert_inline(text, _INLINE, escape, _inline_markup)


def _inline_markup(m: re.Match[str]) -> str:
    if m.group(2) is not None:
        return f"<code>{escape(m.group(2))}</code>"
    return f"<b>{inline(m.group(3))}</b>"


def markdown_to_html(md: str) -> str:
    """The Markdown the reports and alerts use, as Telegram HTML (balanced tags only)."""
    out: list[str] = []
    for block in blocks(md):
        if block.kind is BlockKind.CODE:
            out.append("<pre>" + escape("\n".join(block.lines)) + "</pre>")
        elif block.kind is BlockKind.TABLE:
            out.append("<pre>" + escape("\n".join(block.lines)) + "</pre>" if block.lines else "")
        elif block.kind is BlockKind.HEADING:
            out.append(f"<b>{inline(block.text)}</b>")
        elif block.kind is BlockKind.BULLET:
            out.append(f"{block.indent}• {inline(block.text)}")
        else:
            out.append(inline(block.text))
    return "\n".join(out).strip("\n")


def visible_length(fragment: str) -> int:
    """Characters Telegram counts (after entity parsing): tags dropped, entities one character."""
    return sum(0 if t.startswith("<") else 1 for t in _TOKEN.findall(fragment))


def _atoms(fragment: str) -> Iterator[str]:
    yield from _TOKEN.findall(fragment)


def split_html(fragment: str, limit: int = MESSAGE_LIMIT) -> list[str]:
    """Cut Telegram HTML into parts of at most `limit` characters (markup included, so each part
    is also under Telegram's limit on visible characters), each with balanced tags.

    Cuts go after the last newline that fits; a line longer than a part is cut inside. Tags open
    at a cut are closed at the end of one part and reopened at the start of the next.
    """
    if limit < 64:
        raise ValueError("limit too small to hold reopened tags")
    if len(fragment) <= limit:
        return [fragment] if fragment.strip() else []
    parts: list[str] = []
    stack: list[tuple[str, str]] = []  # (name, opening tag as written)
    cur: list[str] = []
    cur_len = 0
    # The last newline in `cur`: (index in cur after it, the stack then).
    last_nl: tuple[int, list[tuple[str, str]]] | None = None

    def closers(st: list[tuple[str, str]]) -> str:
        return "".join(f"</{name}>" for name, _ in reversed(st))

    def openers(st: list[tuple[str, str]]) -> list[str]:
        return [tag for _, tag in st]

    for atom in _atoms(fragment):
        m = _TAG.fullmatch(atom)
        # Room needed: this atom plus closing every tag that would then be open.
        nxt_stack = stack
        if m is not None:
            name = m.group(2).lower()
            if m.group(1):
                nxt_stack = stack[:-1] if stack and stack[-1][0] == name else stack
            else:
                nxt_stack = [*stack, (name, atom)]
        need = cur_len + len(atom) + len(closers(nxt_stack))
        if need > limit and cur_len > len("".join(openers(stack))):
            tail_len = 0 if last_nl is None else sum(len(a) for a in cur[last_nl[0] :])
            if last_nl is not None and last_nl[0] > 0 and tail_len < limit // 2:
                cut, st_at = last_nl
                head, tail = cur[:cut], cur[cut:]
                parts.append("".join(head) + closers(st_at))
                cur = openers(st_at) + tail
            else:
                parts.append("".join(cur) + closers(stack))
                cur = openers(stack)
            cur_len = sum(len(a) for a in cur)
            last_nl = None
        cur.append(atom)
        cur_len += len(atom)
        stack = nxt_stack
        if atom == "\n":
            last_nl = (len(cur), list(stack))
    parts.append("".join(cur) + closers(stack))
    return [p.strip("\n") for p in parts if visible_length(p.strip("\n"))]


def truncate_html(fragment: str, limit: int, marker: str = "\n…") -> str:
    """The first part of `fragment` that fits `limit` with `marker` appended when cut (tags
    closed before it: the marker is balanced HTML of its own)."""
    if len(fragment) <= limit:
        return fragment
    head = split_html(fragment, max(64, limit - len(marker)))
    return (head[0] if head else "") + marker


def cut_marker(msg: ChatMessage) -> str:
    """The line a cut message ends with: where the rest is (the message's `cut_note`)."""
    return f"\n<i>{escape(msg.cut_note or CUT_NOTE)}</i>"


def _parts(msg: ChatMessage) -> tuple[str, str]:
    head = f"<b>{escape(msg.title)}</b>"
    if msg.status:
        head += f"\n<i>{escape(msg.status)}</i>"
    if msg.preformatted:
        body = f"<pre>{escape(msg.body)}</pre>" if msg.body else ""
    else:
        body = markdown_to_html(msg.body)
    if msg.more:
        body = (body + "\n\n" if body else "") + markdown_to_html(msg.more)
    if msg.footer:
        body = (body + "\n\n" if body else "") + f"<i>{escape(msg.footer)}</i>"
    return head, body


def utf16_length(fragment: str) -> int:
    """Visible length in UTF-16 code units (Telegram counts an emoji like 🔴 as two)."""
    return sum(
        0 if t.startswith("<") else (2 if len(t) == 1 and ord(t) > 0xFFFF else 1)
        for t in _TOKEN.findall(fragment)
    )


def render_single(msg: ChatMessage, limit: int = MESSAGE_LIMIT) -> str:
    """One message (an incident's, or a photo caption): the body is cut to fit, never the head;
    a cut ends with the message's `cut_note` (where the rest is).

    Telegram's limits count visible characters, not markup: a cut first made to fit `limit`
    characters of markup is widened while its visible length (UTF-16 units) stays within it.
    """
    head, body = _parts(msg)
    full = f"{head}\n\n{body}" if body else head
    if len(full) <= limit or utf16_length(full) <= limit:
        return full
    best = _cut(head, body, limit, cut_marker(msg))
    budget = limit
    for _ in range(4):
        shown = utf16_length(best)
        if shown >= limit - 16:
            break
        budget += limit - shown
        wider = _cut(head, body, budget, cut_marker(msg))
        if utf16_length(wider) > limit or wider == best:
            break
        best = wider
    return best


def _cut(head: str, body: str, budget: int, marker: str) -> str:
    """`head` and as much of `body` as `budget` characters of markup hold, then `marker`."""
    full = f"{head}\n\n{body}" if body else head
    if len(full) <= budget:
        return full
    room = budget - len(head) - 2
    if not body or room < 80 + len(marker):
        return truncate_html(head, budget, marker)
    return f"{head}\n\n{truncate_html(body, room, marker)}"


def render_parts(msg: ChatMessage, limit: int = MESSAGE_LIMIT) -> list[str]:
    """The whole message over as many parts as it needs (replies, command answers)."""
    head, body = _parts(msg)
    return split_html(f"{head}\n\n{body}" if body else head, limit)
