"""Slack Block Kit rendering: escaping, Markdown as mrkdwn, Slack's limits, buttons."""

from __future__ import annotations

from jobdiagd.chat import slack_blocks as S
from jobdiagd.chat.buttons import keyboard
from jobdiagd.chat.model import Button, ChatMessage
from tests.helpers.emulators.slack import block_errors, stray_markup, visible_text


def sections(blocks: list[dict[str, object]]) -> list[str]:
    return [b["text"]["text"] for b in blocks if b["type"] == "section"]  # type: ignore[index]


def test_text_is_escaped_and_reads_back_unchanged() -> None:
    body = "rank 3: <unknown> & exit 139 > 128; `a<b && c>d`\n```\nif (x < 3 && y > 2) {}\n```"
    text, blocks = S.render(ChatMessage("hang <on> job 7 & more", body, status="OPEN <1 min>"))
    assert block_errors(blocks) == []
    for t in [text, *sections(blocks)]:
        assert stray_markup(t) == [], t  # no raw < or > Slack would read as a link or mention
    shown = visible_text("\n".join(sections(blocks)))
    assert "rank 3: <unknown> & exit 139 > 128" in shown
    assert "if (x < 3 && y > 2) {}" in shown
    assert blocks[0] == {"type": "header", "text": {"type": "plain_text", "text": "hang <on> job 7 & more"}}
    assert visible_text(text) == "hang <on> job 7 & more — OPEN <1 min>"


def test_markdown_becomes_mrkdwn() -> None:
    md = (
        "## Job triage\n**Status:** failed\n- one `x`\n"
        "see [the docs](https://example.org/a_b)\n| step | s |\n|---|---|\n| 1 | 2.0 |\n| 10 | 12.5 |"
    )
    (body,) = sections(S.render(ChatMessage("t", md))[1])
    assert body.splitlines()[:4] == [
        "*Job triage*",
        "**Status:** failed".replace("**", "*"),
        "• one `x`",
        "see <https://example.org/a_b|the docs>",
    ]
    assert "```\nstep  s\n1     2.0\n10    12.5\n```" in body  # a table as aligned monospace


def test_long_bodies_split_at_lines_keeping_code_blocks_whole() -> None:
    code = "\n".join(f"line {i:04d} <x> & y" for i in range(400))
    md = "intro\n```\n" + code + "\n```\n" + "\n".join(f"after {i}" for i in range(300))
    _, blocks = S.render(ChatMessage("report", md))
    assert block_errors(blocks) == []
    texts = sections(blocks)
    assert len(texts) > 3 and all(len(t) <= S.SECTION_LIMIT for t in texts)
    assert all(t.count("```") % 2 == 0 for t in texts)  # each section's code is closed in it
    shown = "\n".join(visible_text(t).replace("```\n", "").replace("\n```", "") for t in texts)
    for i in (0, 199, 399):
        assert f"line {i:04d} <x> & y" in shown
    assert "after 299" in shown


def test_a_line_longer_than_a_section_is_cut_without_breaking_an_escape() -> None:
    md = "&" * 7000
    texts = sections(S.render(ChatMessage("t", md))[1])
    assert all(len(t) <= S.SECTION_LIMIT for t in texts)
    assert "".join(texts).count("&amp;") == 7000  # no `&am` + `p;` across a cut
    assert visible_text("".join(texts)) == md


def test_never_more_than_50_blocks_and_the_buttons_survive() -> None:
    rows = keyboard({"job_id": "123", "severity": "critical"}, 42, now=0.0, scancel=True)
    msg = ChatMessage(
        "t", "x" * 2900 + "\n" + ("y" * 2900 + "\n") * 80, buttons=rows, footer="incident 123:hang:1"
    )
    _, blocks = S.render(msg)
    assert len(blocks) == S.MAX_BLOCKS and block_errors(blocks) == []
    assert S.CUT_MARKER in sections(blocks)[-1]
    actions = [b for b in blocks if b["type"] == "actions"]
    assert [[e["value"] for e in b["elements"]] for b in actions] == [
        ["ack:42", "m1h:42", "m24h:42"],
        ["triage:42"],
        ["scancel:42"],
    ]
    first = actions[0]["elements"][0]
    assert first["action_id"] == "ack:42" and first["style"] == "primary" and first["text"]["text"] == "✔ Ack"
    assert actions[2]["elements"][0]["style"] == "danger"


def test_limits_on_titles_and_labels() -> None:
    long_label = Button("a" * 200, "ack:1")
    _, blocks = S.render(ChatMessage("T" * 400, "", buttons=((long_label,),)))
    assert block_errors(blocks) == []
    assert len(blocks[0]["text"]["text"]) == S.HEADER_LIMIT and blocks[0]["text"]["text"].endswith("…")


def test_mention_and_notes_go_in_context_lines() -> None:
    text, blocks = S.render(
        ChatMessage("hang", "b", status="OPEN"), mention="<!here>", notes=("📈 plot in the thread",)
    )
    assert text.startswith("<!here> hang") and stray_markup(text) == []
    contexts = [e["text"] for b in blocks if b["type"] == "context" for e in b["elements"]]
    assert contexts == ["<!here> _OPEN_", "📈 plot in the thread"]


def test_with_buttons_replaces_only_the_keyboard() -> None:
    rows = ((Button("✔ Ack", "ack:5"),),)
    _, blocks = S.render(ChatMessage("t", "body", buttons=rows, footer="f"))
    confirm = ((Button("⛔ Yes", "scancel_yes:5", "danger"), Button("Keep", "scancel_no:5")),)
    swapped = S.with_buttons(blocks, confirm)
    assert swapped[:-1] == blocks[:-1]
    assert [e["value"] for e in swapped[-1]["elements"]] == ["scancel_yes:5", "scancel_no:5"]
    assert [b["type"] for b in S.with_buttons(blocks, ())] == ["header", "section", "context"]
