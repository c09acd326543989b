"""The Markdown subset of reports and alerts read into blocks, which each chat format renders its own way.

The subset: fenced code blocks (an unclosed fence runs to the end), pipe tables (separator rows
dropped, columns padded to line up in a monospace block), `#` headings, `-`/`*` bullets, and
plain lines. Inline markup (`code`, **bold**, links) is left in the block's text for the format's
own inline converter: Telegram HTML and Slack mrkdwn escape and mark it differently.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum

_FENCE = re.compile(r"^\s*```")
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_BULLET = re.compile(r"^(\s*)[-*]\s+(.*)$")
_TABLE_SEP = re.compile(r"^\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")


class BlockKind(StrEnum):
    CODE = "code"
    TABLE = "table"
    HEADING = "heading"
    BULLET = "bullet"
    TEXT = "text"


@dataclass(frozen=True, slots=True)
class Block:
    kind: BlockKind
    text: str = ""  # heading, bullet, text: one line of inline Markdown
    lines: tuple[str, ...] = ()  # code: its lines as written; table: its rows aligned
    indent: str = ""  # bullet: the white space before its marker


def convert_inline(
    text: str, pattern: re.Pattern[str], escape: Callable[[str], str], markup: Callable[[re.Match[str]], str]
) -> str:
    """One line with each `pattern` match turned into markup by `markup`, the text between escaped."""
    out: list[str] = []
    pos = 0
    for m in pattern.finditer(text):
        out.append(escape(text[pos : m.start()]))
        out.append(markup(m))
        pos = m.end()
    out.append(escape(text[pos:]))
    return "".join(out)


def aligned_table(rows: list[str]) -> list[str]:
    """Pipe-table rows as lines of padded cells (two spaces apart), separator rows dropped."""
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows if not _TABLE_SEP.match(r)]
    if not cells:
        return []
    n = max(len(r) for r in cells)
    widths = [max((len(r[i]) if i < len(r) else 0) for r in cells) for i in range(n)]
    return [
        "  ".join((r[i] if i < len(r) else "").ljust(widths[i]) for i in range(n)).rstrip() for r in cells
    ]


def blocks(md: str) -> Iterator[Block]:
    """`md` as blocks, in order (fence lines and table separator rows dropped)."""
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            body: list[str] = []
            i += 1
            while i < len(lines) and not _FENCE.match(lines[i]):
                body.append(lines[i])
                i += 1
            i += 1  # the closing fence (or the end: an unclosed fence still ends its block)
            yield Block(BlockKind.CODE, lines=tuple(body))
            continue
        if line.lstrip().startswith("|"):
            rows = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(lines[i])
                i += 1
            yield Block(BlockKind.TABLE, lines=tuple(aligned_table(rows)))
            continue
        if (m := _HEADING.match(line)) is not None:
            yield Block(BlockKind.HEADING, m.group(2))
        elif (b := _BULLET.match(line)) is not None:
            yield Block(BlockKind.BULLET, b.group(2), indent=b.group(1))
        else:
            yield Block(BlockKind.TEXT, line)
        i += 1
