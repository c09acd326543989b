"""Telegram HTML: escaping, the Markdown subset, and splitting under the limits with balanced tags."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from jobdiagd.chat.model import ChatMessage
from jobdiagd.chat.telegram_html import (
    CAPTION_LIMIT,
    escape,
    markdown_to_html,
    render_parts,
    render_single,
    split_html,
    visible_length,
)
from tests.helpers.emulators.telegram import parse_html

TAG = re.compile(r"<(/?)([a-z-]+)[^>]*>")


def balanced(fragment: str) -> bool:
    stack: list[str] = []
    for m in TAG.finditer(fragment):
        if m.group(1):
            if not stack or stack.pop() != m.group(2):
                return False
        else:
            stack.append(m.group(2))
    return not stack


def test_escaping_and_the_markdown_subset() -> None:
    assert escape('a<b>&"c"') == "a&lt;b&gt;&amp;&quot;c&quot;"
    html = markdown_to_html(
        "## Job triage: x<y>\n**Status:** hang & more\n- `a<b>` item\n```text\n<tag> & stuff\n```\n"
        "| A | B |\n|---|---|\n| 1 | 22 |"
    )
    assert html.splitlines()[:3] == [
        "<b>Job triage: x&lt;y&gt;</b>",
        "<b>Status:</b> hang &amp; more",
        "• <code>a&lt;b&gt;</code> item",
    ]
    assert "<pre>&lt;tag&gt; &amp; stuff</pre>" in html
    assert "<pre>A  B\n1  22</pre>" in html  # a table as aligned monospace
    text, error = parse_html(html)  # what Telegram's parser makes of it
    assert error is None and "<tag> & stuff" in text


def test_an_unclosed_fence_still_closes_its_pre() -> None:
    html = markdown_to_html("before\n```\nnever closed <x>")
    assert html.endswith("<pre>never closed &lt;x&gt;</pre>") and balanced(html)


def test_split_keeps_code_blocks_code_blocks_and_prefers_line_ends() -> None:
    lines = [f"line {i} <&> with some padding text" for i in range(400)]
    html = "<b>head</b>\n" + markdown_to_html("```\n" + "\n".join(lines) + "\n```")
    parts = split_html(html, 4096)
    assert len(parts) > 3
    for p in parts:
        assert len(p) <= 4096 and balanced(p) and parse_html(p)[1] is None
    assert all(p.startswith("<pre>") for p in parts[1:])  # reopened in every part
    # Cut at line ends: every visible line survives whole, in order.
    seen = [ln for p in parts for ln in parse_html(p)[0].splitlines() if ln.startswith("line ")]
    assert seen == lines


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(alphabet="ab <>&\n\"'é🔴", min_size=0, max_size=300),
            st.sampled_from(
                ["**bold**", "`code <x>`", "```\nblock & <b>\n```", "## head", "- item", "| a | b |"]
            ),
        ),
        max_size=60,
    ),
    st.sampled_from([64, 200, 1024, 4096]),
)
def test_split_invariants(chunks: list[str], limit: int) -> None:
    html = markdown_to_html("\n".join(chunks))
    parts = split_html(html, limit)
    assert all(len(p) <= limit for p in parts)
    assert all(balanced(p) and parse_html(p)[1] is None for p in parts)
    visible = parse_html(html)[0]
    if not visible.strip():
        # Telegram refuses a blank message: nothing to send, rather than a part of only spaces.
        assert parts == []
        return
    # Nothing visible is lost or invented (cuts may only drop the newline they cut at).
    joined = "".join(parse_html(p)[0] for p in parts).replace("\n", "")
    assert joined == visible.replace("\n", "")


def test_a_caption_keeps_title_and_status_and_cuts_the_body() -> None:
    msg = ChatMessage("🔴 hang on job 1 [critical]", "x & y " * 1000, status="OPEN since 03:00")
    cap = render_single(msg, CAPTION_LIMIT)
    assert cap.startswith("<b>🔴 hang on job 1 [critical]</b>\n<i>OPEN since 03:00</i>")
    # Telegram counts what it shows (UTF-16 units): the cut uses the room markup would waste.
    shown = parse_html(cap)[0]
    assert 900 < len(shown.encode("utf-16-le")) // 2 <= CAPTION_LIMIT and balanced(cap)
    assert shown.endswith("… (cut: too long for one message)")  # never a bare "…"
    parts = render_parts(msg)
    assert sum(visible_length(p) for p in parts) >= 6000 and all(len(p) <= 4096 for p in parts)
