"""One conversation through a running daemon, over Telegram and over Slack: the real
python-telegram-bot and slack-sdk against their emulators.

Each test is the same conversation for both transports (a page arrives, its buttons are pressed,
commands are answered, strangers are refused, a rate limit and a restart are survived), driven
through a small per-transport adapter (`Talk`: `TelegramTalk` in tests/helpers/chat.py,
`SlackTalk` in tests/helpers/slack.py) whose `check_*` hooks add each transport's own
assertions at the step where they belong. What only one transport has (Telegram's caption
limit, Slack's triage thread, Socket Mode reconnects, the scancel confirmation) stays in
test_daemon_telegram.py and test_daemon_slack.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers.chat import Talk, TelegramTalk, hung_job, start_daemon, telegram_emulator, until
from tests.helpers.slack import SlackTalk, slack_emulator

# Runs the real daemon on real time (tests/conftest.py: service markers).
pytestmark = pytest.mark.daemon


@pytest.fixture(params=["telegram", "slack"])
async def talk(request: pytest.FixtureRequest) -> AsyncIterator[Talk]:
    if request.param == "telegram":
        async with telegram_emulator() as tg:
            yield TelegramTalk(tg)
    else:
        async with slack_emulator() as slack:
            yield SlackTalk(slack)


async def test_hang_pages_and_a_button_press_acks_it(short_tmp: Path, talk: Talk) -> None:
    outputs = short_tmp / "outputs"
    job = hung_job(outputs)
    d = await start_daemon(talk.config(short_tmp), outputs)
    try:
        (page,) = await until(talk.open_pages, "the hang page")
        assert talk.text(page).startswith("🔴 hang on job 7001") and "OPEN since" in talk.text(page)
        assert talk.rings(page)  # critical: it rings
        labels = talk.labels(page)
        assert labels[:3] == ["✔ Ack", "🔕 Mute 1 h", "🔕 Mute 24 h"] and "📋 Full triage" in labels
        assert "🩺 Diagnose" not in labels  # not a RAY=1 job
        await talk.check_page(page)  # the lead (rule CHAT-1) and the plot, as the transport shows them
        await talk.settle(page, d)
        assert "Acked by alice" in await talk.press(page, talk.alice, label="✔ Ack")
        await until(lambda: "acked by alice" in talk.text(page), "the page shows the ack")
        assert talk.labels(page)[0] == "🔕 Mute 1 h"  # no Ack any more
        talk.check_acked(page)

        job.step(8, seconds=5.0)  # steps resume: resolved in place + a quiet reply
        await until(lambda: "RESOLVED" in talk.text(page), "resolved in place")
        assert talk.buttons(page) == []  # keyboard stripped
        reply = await until(lambda: talk.resolve_replies(page), "the resolve reply")
        assert not talk.rings(reply[0])
        talk.check_resolved(page, reply[0])
        assert talk.open_pages() == []
        assert talk.said_elsewhere() == []  # the default chat only
    finally:
        await d.stop()


async def test_triage_command_answers_working_then_the_report(short_tmp: Path, talk: Talk) -> None:
    outputs = short_tmp / "outputs"
    job = hung_job(outputs, "7002", steps=30)
    job.summary(0)
    d = await start_daemon(talk.config(short_tmp), outputs)
    try:
        final = await talk.triage("7002", d)  # the placeholder first, edited into the report
        text = talk.text(final)
        assert final.edits and "working" in (final.edits[0].get("text") or "") or "⏳" not in text
        assert "triage: 7002" in text and "completed" in text.lower()
    finally:
        await d.stop()


async def test_strangers_are_refused_commands_and_forged_buttons(short_tmp: Path, talk: Talk) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7003")
    d = await start_daemon(talk.config(short_tmp), outputs)
    try:
        (page,) = await until(talk.open_pages, "the hang page")
        await talk.settle(page, d)
        refusal = await talk.ask("ack 7003", talk.mallory)
        assert "Not allowed" in refusal and "allowed users" in refusal
        await talk.check_refused_elsewhere()
        assert "allowed users" in await talk.press(page, talk.mallory, label="✔ Ack")
        assert "expired" in await talk.press(page, talk.alice, data="ack:99999999")  # forged token
        assert "not valid" in await talk.press(page, talk.alice, data="rm -rf /:1")  # not a token at all
        inc = d.engine.pipeline.book.get("7003", "hang")
        assert inc is not None and inc.acked_at is None  # nobody acked it
        assert "acked" not in talk.text(page)
        talk.check_untouched(d)
    finally:
        await d.stop()


async def test_a_429_is_retried_and_the_page_arrives_once(short_tmp: Path, talk: Talk) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7004")
    talk.fail_sends_once()
    d = await start_daemon(talk.config(short_tmp), outputs)
    try:
        await until(talk.open_pages, "the hang page")
        await until(lambda: d.engine.pipeline.outbox.pending_count() == 0, "delivery marked")
        attempts = talk.send_attempts("7004")
        assert len(attempts) == 2  # refused once with retry_after, accepted once
        assert attempts[1].at - attempts[0].at >= 1.0  # retry_after honoured
        assert len(talk.open_pages()) == 1 and len(talk.all_pages()) == 1
    finally:
        await d.stop()


async def test_a_restart_between_alert_and_resolution_edits_the_original_message(
    short_tmp: Path, talk: Talk
) -> None:
    outputs = short_tmp / "outputs"
    job = hung_job(outputs, "7005")
    cfg = talk.config(short_tmp)
    d = await start_daemon(cfg, outputs)
    (page,) = await until(talk.open_pages, "the hang page")
    await until(lambda: d.engine.pipeline.outbox.pending_count() == 0, "delivery marked")
    await d.stop()

    d2 = await start_daemon(cfg, outputs)
    try:
        job.step(8, seconds=5.0)
        await until(lambda: "RESOLVED" in talk.text(page), "the original message edited")
        assert [talk.key(m) for m in talk.all_pages()] == [talk.key(page)]  # no new page after the restart
        reply = await until(lambda: talk.resolve_replies(page), "the resolve reply")
        assert len(reply) == 1
        talk.check_restart(page)
    finally:
        await d2.stop()


async def test_short_commands_status_jobs_job_mute_unmute_help_plot(short_tmp: Path, talk: Talk) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7006")
    d = await start_daemon(talk.config(short_tmp), outputs)
    try:
        (page,) = await until(talk.open_pages, "the hang page")
        await talk.settle(page, d)

        async def ask(command: str) -> str:
            text = await talk.ask(command)
            talk.check_answer(command, text)
            return text

        status = await ask("status")
        assert "jobs watched: 1" in status and "7006" in status
        jobs = await ask("jobs")
        assert "7006 LIVE" in jobs and "⚠ hang" in jobs
        assert "incident 7006:hang:1 (critical)" in await ask("job 7006")
        assert "not being watched" in await ask("job 999")
        assert "muted for 2 h 00 min by alice" in await ask("mute 7006 2h")
        await until(lambda: "muted until" in talk.text(page), "page shows the mute")
        talk.check_muted(page)
        assert "unmuted" in await ask("unmute 7006")
        await until(lambda: "muted until" not in talk.text(page), "page unmuted")
        assert "outside the configured outputs roots" in await ask("triage /etc/passwd")
        await talk.more_commands(outputs)
        assert "/diagnose ID [PLAYBOOK]" in await ask("help")
        assert "unknown command" in await ask("rm -rf")
        await talk.plot("7006")
        answers = talk.answers(page)
        assert answers and not any(talk.rings(m) for m in answers)  # every answer is quiet (rule CHAT-3)
    finally:
        await d.stop()
