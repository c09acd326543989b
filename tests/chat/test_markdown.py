"""The Markdown subset read into blocks, shared by the Telegram HTML and Slack mrkdwn renderers."""

from __future__ import annotations

import re

from jobdiagd.chat.markdown import Block, BlockKind, aligned_table, blocks, convert_inline


def test_each_construct_becomes_its_block_in_order() -> None:
    md = "\n".join(
        [
            "## Verdict **hang**",
            "- rank `3` stuck",
            "  * nested",
            "```",
            "a <b>",
            "```",
            "| host | rank |",
            "|---|:--:|",
            "| n1 | 0 |",
            "plain & text",
        ]
    )
    assert list(blocks(md)) == [
        Block(BlockKind.HEADING, "Verdict **hang**"),
        Block(BlockKind.BULLET, "rank `3` stuck"),
        Block(BlockKind.BULLET, "nested", indent="  "),
        Block(BlockKind.CODE, lines=("a <b>",)),
        Block(BlockKind.TABLE, lines=("host  rank", "n1    0")),
        Block(BlockKind.TEXT, "plain & text"),
    ]


def test_an_unclosed_fence_runs_to_the_end_and_an_empty_one_stays_a_block() -> None:
    assert list(blocks("```\n```\nafter\n```\nx\n# not a heading")) == [
        Block(BlockKind.CODE),
        Block(BlockKind.TEXT, "after"),
        Block(BlockKind.CODE, lines=("x", "# not a heading")),
    ]


def test_a_table_of_separators_only_is_an_empty_table_block() -> None:
    assert list(blocks("|---|---|")) == [Block(BlockKind.TABLE)]
    assert aligned_table(["| a | bb |", "| ccc |"]) == ["a    bb", "ccc"]


def test_inline_markup_replaces_each_match_and_escapes_only_the_text_between() -> None:
    code = re.compile(r"`([^`]+)`")
    shout = str.upper
    assert convert_inline("a `b` c `d`", code, shout, lambda m: f"[{m.group(1)}]") == "A [b] C [d]"
    assert convert_inline("no markup", code, shout, lambda m: "never") == "NO MARKUP"
