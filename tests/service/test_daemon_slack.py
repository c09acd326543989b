"""Slack-only conversations through a running daemon: the real slack-sdk (Web API + Socket Mode)
against the Slack emulator. The conversation both transports share (a page, its buttons, the
commands, strangers, a 429, a restart) is tests/service/test_daemon_chat.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.chat import hung_job, start_daemon, until
from tests.helpers.emulators.slack import SlackEmulator, SlackMessage
from tests.helpers.slack import ALICE, CHAN, OPERATOR, acked, open_pages, settled, slack_daemon_config

# Runs the real daemon on real time (tests/conftest.py: service markers).
pytestmark = pytest.mark.daemon


async def test_full_triage_button_answers_in_the_incident_thread(
    short_tmp: Path, slack: SlackEmulator
) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7007", steps=12)
    d = await start_daemon(slack_daemon_config(short_tmp, slack), outputs)
    try:
        (page,) = await until(lambda: open_pages(slack), "the hang page")
        await settled(slack, page, d)
        await acked(slack, await slack.press(CHAN, page.ts, ALICE, page.value_of("📋 Full triage")))

        def answer() -> list[SlackMessage]:
            return [m for m in slack.thread(CHAN, page.ts) if "triage: 7007" in m.visible]

        (report,) = await until(answer, "the triage report in the thread")
        assert "Primary failure" in report.visible or "Status" in report.visible
        (placeholder,) = [
            c for c in slack.calls_of("chat.postMessage") if c.params.get("thread_ts") == page.ts
        ]
        assert "working" in placeholder.params["text"] and report.edits  # "working…", then edited in
        assert any("working" in e.visible for e in slack.ephemerals_for(ALICE))
    finally:
        await d.stop()


async def test_socket_mode_reconnects_when_slack_refreshes_or_drops_the_connection(
    short_tmp: Path, slack: SlackEmulator
) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7008", steps=12)
    d = await start_daemon(slack_daemon_config(short_tmp, slack), outputs)
    try:
        (page,) = await until(lambda: open_pages(slack), "the hang page")
        await settled(slack, page, d)

        async def answered(text: str) -> None:
            seen = {m.ts for m in slack.bot_messages(CHAN)}
            await acked(slack, await slack.slash(CHAN, ALICE, text))
            await until(
                lambda: [m for m in slack.bot_messages(CHAN) if m.ts not in seen], f"answer to {text}"
            )

        await slack.wait_connected()
        await answered("status")
        await slack.refresh()  # Slack's periodic "disconnect": the client opens a new connection first
        await until(lambda: slack.connections_opened == 2 and slack.open_sockets() == 1, "a fresh connection")
        await answered("jobs")
        await slack.drop()  # the server side goes away without a word
        await until(lambda: slack.connections_opened == 3 and slack.open_sockets() == 1, "reconnected")
        await answered("help")
    finally:
        await d.stop()


async def test_scancel_asks_an_operator_to_confirm_and_refuses_everyone_else(
    short_tmp: Path, slack: SlackEmulator
) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7009", steps=12)
    cfg = slack_daemon_config(short_tmp, slack, extra="[chat]\nscancel_button = true\n")
    d = await start_daemon(cfg, outputs)
    try:
        (page,) = await until(lambda: open_pages(slack), "the hang page")
        await settled(slack, page, d)
        assert page.labels[-1] == "⛔ scancel…"
        scancel = page.value_of("⛔ scancel…")
        await acked(slack, await slack.press(CHAN, page.ts, ALICE, scancel))  # allowed, but no operator
        await until(
            lambda: any("Only operators" in e.visible for e in slack.ephemerals_for(ALICE)), "refusal"
        )
        assert slack.messages[(CHAN, page.ts)].labels[-1] == "⛔ scancel…"  # nothing changed
        await acked(slack, await slack.press(CHAN, page.ts, OPERATOR, scancel))
        await until(
            lambda: "⛔ Yes, scancel 7009" in slack.messages[(CHAN, page.ts)].labels,
            "the confirmation buttons",
        )
        confirm = slack.messages[(CHAN, page.ts)]
        assert confirm.labels == ["⛔ Yes, scancel 7009", "Keep the job"]
        assert "hang on job 7009" in confirm.visible  # the rest of the page is kept
        await acked(slack, await slack.press(CHAN, page.ts, OPERATOR, confirm.value_of("Keep the job")))
        await until(
            lambda: slack.messages[(CHAN, page.ts)].labels[-1] == "⛔ scancel…", "the buttons restored"
        )
        assert any("Kept the job" in e.visible for e in slack.ephemerals_for(OPERATOR))
        inc = d.engine.pipeline.book.get("7009", "hang")
        assert inc is not None and inc.resolved_at is None
    finally:
        await d.stop()
