"""Forged button presses through a running daemon: the chat and user allow-lists and the operator list hold.

The real python-telegram-bot and slack-sdk against their emulators; `scancel` is a recording
stand-in on PATH (the daemon runs it by name), so a press that got through would leave a line
in its record. Forged callback data for a real incident token is pressed by a stranger, by an
allowed user who is not an operator, and by allowed users in a chat or channel that is not
allowed (they get no answer at all); then, as the control, by an operator in an allowed chat,
which does cancel the job.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tests.helpers import slack as S
from tests.helpers.chat import ALICE, CHAT, MALLORY, OPERATOR, daemon_config, hung_job, start_daemon, until
from tests.helpers.emulators.slack import SlackEmulator
from tests.helpers.emulators.telegram import TelegramEmulator

pytestmark = pytest.mark.daemon  # both tests run the in-process daemon

FOREIGN_CHAT = -1009  # the bot is in it, but it is not in chat_ids


@pytest.fixture
def scancel_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir, record = tmp_path / "bin", tmp_path / "scancel.calls"
    bindir.mkdir()
    script = bindir / "scancel"
    script.write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return record


def calls(record: Path) -> list[str]:
    return record.read_text().splitlines() if record.exists() else []


async def test_forged_telegram_presses_are_refused_and_only_an_operator_cancels(
    short_tmp: Path, tg: TelegramEmulator, scancel_record: Path
) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7101")
    tg.add_chat(FOREIGN_CHAT, title="random")
    d = await start_daemon(daemon_config(short_tmp, tg, extra="[chat]\nscancel_button = true"), outputs)
    try:
        page = (await until(lambda: [m for m in tg.bot_messages(CHAT) if "hang on job 7101" in (m.text or m.caption or "") and m.buttons], "the page"))[0]
        ack = next(data for row in page.buttons for label, data in row if label == "✔ Ack")
        token = ack.split(":")[1]
        forged = f"scancel_yes:{token}"  # the confirmation, without ever being shown the button

        async def answered(chat: int, user: int, data: str, name: str) -> dict[str, object]:
            qid = await tg.press(chat, page.message_id, user, data, name=name)
            got: dict[str, object] = await until(lambda: tg.answer_for(qid), f"the answer to {name}'s press")
            return got

        async def answer(chat: int, user: int, data: str, name: str) -> str:
            return str((await answered(chat, user, data, name))["text"])

        assert "allowed users" in await answer(CHAT, MALLORY, forged, "mallory")
        assert "Only operators" in await answer(CHAT, ALICE, forged, "alice")
        # A chat off the list: the spinner is stopped, not a word said (the bot is not revealed).
        before = len(tg.bot_messages())
        for user, data, name in ((OPERATOR, forged, "olga"), (ALICE, ack, "alice")):
            got = await answered(FOREIGN_CHAT, user, data, name)
            assert got["text"] is None and got["show_alert"] is False
        assert len(tg.bot_messages()) == before
        inc = d.engine.pipeline.book.get("7101", "hang")
        assert inc is not None and inc.acked_at is None and calls(scancel_record) == []

        # Control: the same forged data from an operator in an allowed chat does cancel the job.
        assert "scancel 7101: requested by olga" in await answer(CHAT, OPERATOR, forged, "olga")
        assert calls(scancel_record) == ["7101"]
    finally:
        await d.stop()


async def test_forged_slack_actions_are_refused_and_only_an_operator_cancels(
    short_tmp: Path, slack: SlackEmulator, scancel_record: Path
) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7102")
    cfg = S.slack_daemon_config(short_tmp, slack, extra="[chat]\nscancel_button = true")
    d = await start_daemon(cfg, outputs)
    try:
        (page,) = await until(
            lambda: [m for m in slack.bot_messages(S.CHAN) if m.thread_ts is None and "hang on job 7102" in m.visible and m.buttons],
            "the page",
        )
        await until(lambda: d.engine.pipeline.outbox.pending_count() == 0, "deliveries done")
        await slack.wait_connected()
        token = page.value_of("✔ Ack").split(":")[1]
        forged = f"scancel_yes:{token}"

        async def press(channel: str, user: str, value: str, n: int) -> str:
            await slack.press(channel, page.ts, user, value)
            got = await until(lambda: len(slack.ephemerals_for(user)) >= n and slack.ephemerals_for(user), "an answer")
            return str(got[n - 1].visible)

        assert "allowed users" in await press(S.CHAN, S.MALLORY, forged, 1)
        assert "Only operators" in await press(S.CHAN, S.ALICE, forged, 1)
        # A channel off the list: ignored (logged), not a word said there, not even ephemeral.
        with capture_logs() as logs:
            await slack.press(S.FOREIGN_CHAN, page.ts, S.OPERATOR, forged)
            await slack.press(S.FOREIGN_CHAN, page.ts, S.ALICE, page.value_of("✔ Ack"))
            await until(lambda: len([e for e in logs if e["event"] == "chat_ignored"]) == 2, "both ignored")
        assert slack.ephemerals_for(S.OPERATOR) == [] and len(slack.ephemerals_for(S.ALICE)) == 1
        inc = d.engine.pipeline.book.get("7102", "hang")
        assert inc is not None and inc.acked_at is None and calls(scancel_record) == []

        # Control: an operator in an allowed channel.
        assert "scancel 7102: requested by" in await press(S.CHAN, S.OPERATOR, forged, 1)
        assert calls(scancel_record) == ["7102"]
    finally:
        await d.stop()
