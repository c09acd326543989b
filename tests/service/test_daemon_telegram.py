"""Conversations through a running daemon: the real python-telegram-bot against the Telegram emulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd.service import plots_bridge
from jobdiagd.service.status_cli import PHONE_COLUMNS
from tests.helpers.chat import (
    ALICE,
    CHAT,
    MALLORY,
    OTHER_CHAT,
    daemon_config,
    hung_job,
    start_daemon,
    until,
)
from tests.helpers.emulators.telegram import StoredMessage, TelegramEmulator

# Runs the real daemon on real time (tests/conftest.py: service markers).
pytestmark = pytest.mark.daemon


def incident_messages(tg: TelegramEmulator, chat: int = CHAT) -> list[StoredMessage]:
    return [m for m in tg.bot_messages(chat) if "hang on job" in (m.text or m.caption or "") and m.buttons]


def body(m: StoredMessage) -> str:
    return m.text or m.caption or ""


async def test_hang_pages_the_chat_and_a_button_press_acks_it(short_tmp: Path, tg: TelegramEmulator) -> None:
    outputs = short_tmp / "outputs"
    job = hung_job(outputs)
    d = await start_daemon(daemon_config(short_tmp, tg), outputs)
    try:
        (page,) = await until(lambda: incident_messages(tg), "the hang page")
        assert body(page).startswith("🔴 hang on job 7001") and "OPEN since" in body(page)
        assert not page.silent  # critical: it rings
        # The lead first: what happened, the stall, the steps, the next step (rule CHAT-1).
        lead = body(page).split("\n\n")[1].splitlines()
        assert lead[0].startswith("Training stopped advancing at step 7")
        assert lead[-2].startswith("Last step 7 vs expected ≈") and lead[-1].startswith("Next: ")
        labels = [label for row in page.buttons for label, _ in row]
        assert labels[:3] == ["✔ Ack", "🔕 Mute 1 h", "🔕 Mute 24 h"] and "📋 Full triage" in labels
        assert "🩺 Diagnose" not in labels  # not a RAY=1 job
        if plots_bridge.available():
            assert page.photo is not None and page.photo.startswith(b"\x89PNG")
        ack = next(data for row in page.buttons for label, data in row if label == "✔ Ack")
        qid = await tg.press(CHAT, page.message_id, ALICE, ack, name="alice")
        answer = await until(lambda: tg.answer_for(qid), "the press answered")
        assert "Acked by alice" in answer["text"]
        edited = await until(
            lambda: "acked by alice" in body(tg.messages[(CHAT, page.message_id)]),
            "the message shows the ack",
        )
        assert edited
        after = tg.messages[(CHAT, page.message_id)]
        assert [label for row in after.buttons for label, _ in row][0] == "🔕 Mute 1 h"  # no Ack any more

        job.step(8, seconds=5.0)  # steps resume: resolved in place + a short reply
        await until(lambda: "RESOLVED" in body(tg.messages[(CHAT, page.message_id)]), "resolved in place")
        assert tg.messages[(CHAT, page.message_id)].buttons == []  # keyboard stripped
        reply = await until(
            lambda: [m for m in tg.bot_messages(CHAT) if m.reply_to == page.message_id], "the resolve reply"
        )
        assert "resolved" in body(reply[0]) and reply[0].silent
        assert (
            len(incident_messages(tg)) == 0
            and len([m for m in tg.bot_messages(CHAT) if "hang on job" in body(m)]) == 2
        )
        assert tg.bot_messages(OTHER_CHAT) == []  # default chat only
    finally:
        await d.stop()


async def test_triage_command_answers_working_then_the_report(short_tmp: Path, tg: TelegramEmulator) -> None:
    outputs = short_tmp / "outputs"
    job = hung_job(outputs, "7002", steps=30)
    job.summary(0)
    d = await start_daemon(daemon_config(short_tmp, tg), outputs)
    try:
        await until(lambda: tg.calls_of("getUpdates"), "polling")
        cmd = await tg.send_command(CHAT, ALICE, "/triage@jobdiagd_bot 7002")
        working = await until(
            lambda: [m for m in tg.bot_messages(CHAT) if m.reply_to == cmd], "the working… answer"
        )
        first = working[0]
        done = await until(
            lambda: "Status:" in body(tg.messages[(CHAT, first.message_id)]), "the report edited in"
        )
        assert done
        final = tg.messages[(CHAT, first.message_id)]
        assert final.edits and "working" in (final.edits[0].get("text") or "") or "⏳" not in body(final)
        assert "triage: 7002" in body(final) and "completed" in body(final).lower()
        # the placeholder went out first, then was edited (never a second message for the same answer)
        sends = [
            c
            for c in tg.calls_of("sendMessage")
            if c.params.get("reply_parameters", {}).get("message_id") == cmd
        ]
        assert len(sends) == 1 and "working" in sends[0].params["text"]
    finally:
        await d.stop()


async def test_strangers_are_refused_commands_and_forged_buttons(
    short_tmp: Path, tg: TelegramEmulator
) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7003")
    d = await start_daemon(daemon_config(short_tmp, tg), outputs)
    try:
        (page,) = await until(lambda: incident_messages(tg), "the hang page")
        cmd = await tg.send_command(CHAT, MALLORY, "/ack 7003", name="mallory")
        refusal = await until(lambda: [m for m in tg.bot_messages(CHAT) if m.reply_to == cmd], "a refusal")
        assert "Not allowed" in body(refusal[0]) and "allowed users" in body(refusal[0])
        assert refusal[0].silent  # a refusal never rings (rule CHAT-3)
        ack = next(data for row in page.buttons for label, data in row if label == "✔ Ack")
        q1 = await tg.press(CHAT, page.message_id, MALLORY, ack, name="mallory")
        a1 = await until(lambda: tg.answer_for(q1), "answer to the stranger's press")
        assert a1["show_alert"] and "allowed users" in a1["text"]
        q2 = await tg.press(CHAT, page.message_id, ALICE, "ack:99999999", name="alice")  # forged token
        a2 = await until(lambda: tg.answer_for(q2), "answer to a forged press")
        assert "expired" in a2["text"]
        q3 = await tg.press(CHAT, page.message_id, ALICE, "rm -rf /:1", name="alice")  # not a token at all
        a3 = await until(lambda: tg.answer_for(q3), "answer to garbage callback data")
        assert "not valid" in a3["text"]
        inc = d.engine.pipeline.book.get("7003", "hang")
        assert inc is not None and inc.acked_at is None  # nobody acked it
        assert "acked" not in body(tg.messages[(CHAT, page.message_id)])
    finally:
        await d.stop()


async def test_a_429_is_retried_and_the_page_arrives_once(short_tmp: Path, tg: TelegramEmulator) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7004")
    tg.fail("sendMessage", 429, "Too Many Requests: retry after 1", retry_after=1)
    tg.fail("sendPhoto", 429, "Too Many Requests: retry after 1", retry_after=1)
    d = await start_daemon(daemon_config(short_tmp, tg), outputs)
    try:
        await until(lambda: incident_messages(tg), "the hang page")
        await until(lambda: d.engine.pipeline.outbox.pending_count() == 0, "delivery marked")
        attempts = [
            c
            for c in tg.calls
            if c.method in ("sendMessage", "sendPhoto") and "hang on job 7004" in str(c.params)
        ]
        assert len(attempts) == 2  # refused once with retry_after, accepted once
        assert attempts[1].at - attempts[0].at >= 1.0  # retry_after honoured
        assert len(incident_messages(tg)) == 1
    finally:
        await d.stop()


async def test_a_restart_between_alert_and_resolution_edits_the_original_message(
    short_tmp: Path, tg: TelegramEmulator
) -> None:
    outputs = short_tmp / "outputs"
    job = hung_job(outputs, "7005")
    cfg = daemon_config(short_tmp, tg)
    d = await start_daemon(cfg, outputs)
    (page,) = await until(lambda: incident_messages(tg), "the hang page")
    await until(lambda: d.engine.pipeline.outbox.pending_count() == 0, "delivery marked")
    await d.stop()

    d2 = await start_daemon(cfg, outputs)
    try:
        job.step(8, seconds=5.0)
        await until(
            lambda: "RESOLVED" in body(tg.messages[(CHAT, page.message_id)]), "the original message edited"
        )
        pages = [m for m in tg.bot_messages(CHAT) if body(m).startswith(("🔴 hang", "✅ hang"))]
        assert [m.message_id for m in pages] == [page.message_id]  # no new page after the restart
        reply = await until(
            lambda: [m for m in tg.bot_messages(CHAT) if m.reply_to == page.message_id], "the resolve reply"
        )
        assert len(reply) == 1
    finally:
        await d2.stop()


async def test_short_commands_status_jobs_job_mute_unmute_help(short_tmp: Path, tg: TelegramEmulator) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7006")
    d = await start_daemon(daemon_config(short_tmp, tg), outputs)
    try:
        (page,) = await until(lambda: incident_messages(tg), "the hang page")

        async def ask(text: str) -> str:
            mid = await tg.send_command(CHAT, ALICE, text)
            got = await until(
                lambda: [m for m in tg.bot_messages(CHAT) if m.reply_to == mid], f"answer to {text}"
            )
            return body(got[0])

        status = await ask("/status")
        assert "jobs watched: 1" in status and "7006" in status
        assert max(len(line) for line in status.splitlines()[1:]) <= PHONE_COLUMNS  # fits a phone
        assert "`7006`" not in (jobs := await ask("/jobs")) and "7006 LIVE" in jobs and "⚠ hang" in jobs
        job = await ask("/job 7006")
        assert "incident 7006:hang:1 (critical)" in job and "log:" in job
        assert "not being watched" in await ask("/job 999")
        assert "muted for 2 h 00 min by alice" in await ask("/mute 7006 2h")
        await until(
            lambda: "muted until" in body(tg.messages[(CHAT, page.message_id)]), "page shows the mute"
        )
        assert "unmuted" in await ask("/unmute 7006")
        await until(lambda: "muted until" not in body(tg.messages[(CHAT, page.message_id)]), "page unmuted")
        assert "outside the configured outputs roots" in await ask("/triage /etc/passwd")
        (outputs / "9999-escape").symlink_to("/etc")  # an id whose directory leads out of the root

        async def long_answer(text: str) -> str:
            mid = await tg.send_command(CHAT, ALICE, text)
            first = (await until(lambda: [m for m in tg.bot_messages(CHAT) if m.reply_to == mid], text))[0]
            await until(lambda: tg.messages[(CHAT, first.message_id)].edits, f"result of {text}")
            return body(tg.messages[(CHAT, first.message_id)])

        assert "no 9999-* directory or log" in await long_answer("/triage 9999")
        assert "no 424242-* directory or log" in await long_answer("/triage 424242")
        help_text = await ask("/help")
        assert "/diagnose ID [PLAYBOOK]" in help_text and "scancel" not in help_text  # not enabled here
        assert "unknown command" in await ask("/rm -rf")
        mid = await tg.send_command(CHAT, ALICE, "/plot 7006")
        placeholder = (await until(lambda: [m for m in tg.bot_messages(CHAT) if m.reply_to == mid], "/plot"))[
            0
        ]
        if plots_bridge.available():
            pic = await until(
                lambda: [m for m in tg.bot_messages(CHAT) if m.reply_to == mid and m.photo], "the plot"
            )
            assert (
                pic[0].photo is not None
                and pic[0].photo.startswith(b"\x89PNG")
                and "job 7006" in body(pic[0])
            )
        else:  # a build without the plotting modules says so instead of hanging
            await until(
                lambda: "not available" in body(tg.messages[(CHAT, placeholder.message_id)]), "the answer"
            )
        sent = [m for m in tg.bot_messages(CHAT) if m.message_id != page.message_id]
        assert sent and all(m.silent for m in sent)  # every answer arrives silently (rule CHAT-3)
    finally:
        await d.stop()
