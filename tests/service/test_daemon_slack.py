"""Conversations through a running daemon: the real slack-sdk (Web API + Socket Mode) against the Slack emulator."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from jobdiagd.service import plots_bridge
from tests.helpers.chat import RunningDaemon, hung_job, start_daemon, until
from tests.helpers.emulators.slack import Envelope, SlackEmulator, SlackMessage
from tests.helpers.slack import (
    ALICE,
    CHAN,
    FOREIGN_CHAN,
    MALLORY,
    OPERATOR,
    OTHER_CHAN,
    slack_daemon_config,
)

# Runs the real daemon on real time (tests/conftest.py: service markers).
pytestmark = pytest.mark.daemon


def pages(em: SlackEmulator, channel: str = CHAN) -> list[SlackMessage]:
    return [m for m in em.bot_messages(channel) if m.thread_ts is None and "hang on job" in m.visible]


def open_pages(em: SlackEmulator) -> list[SlackMessage]:
    return [m for m in pages(em) if m.buttons]


async def acked(em: SlackEmulator, envelope_id: str) -> Envelope:
    """The envelope, once acked; and the ack came before any API call the envelope caused.

    Tests send envelopes once the page and its pictures are out (`settled`), so the calls after
    an envelope are its own.
    """
    env: Envelope = await until(
        lambda: em.envelopes[envelope_id] if em.envelopes[envelope_id].acked_seq else None, "the ack"
    )
    assert env.acked_seq is not None
    first = em.first_call_after(env.seq)
    assert first is None or first.seq > env.acked_seq, f"{first} before the ack"
    return env


async def settled(em: SlackEmulator, page: SlackMessage, d: RunningDaemon) -> None:
    """The page's pictures are in its thread (when this build draws them) and nothing is pending."""
    if plots_bridge.available():
        await until(lambda: [m for m in em.thread(CHAN, page.ts) if m.files], "the plot in the thread")
    await until(lambda: d.engine.pipeline.outbox.pending_count() == 0, "deliveries done")


async def test_hang_pages_the_channel_with_its_plot_and_a_button_press_acks_it(
    short_tmp: Path, slack: SlackEmulator
) -> None:
    outputs = short_tmp / "outputs"
    job = hung_job(outputs)
    d = await start_daemon(slack_daemon_config(short_tmp, slack), outputs)
    try:
        (page,) = await until(lambda: open_pages(slack), "the hang page")
        assert page.visible.startswith("🔴 hang on job 7001") and "OPEN since" in page.visible
        assert page.text.startswith("<!here>")  # critical: rings
        # The lead first: what happened, the stall, the steps, the next step (rule CHAT-1).
        lead = page.blocks[2]["text"]["text"]
        assert "Training stopped advancing" in lead and "Last step 7 vs expected" in lead and "Next:" in lead
        assert page.labels[:3] == ["✔ Ack", "🔕 Mute 1 h", "🔕 Mute 24 h"] and "📋 Full triage" in page.labels
        assert "🩺 Diagnose" not in page.labels  # not a RAY=1 job
        if plots_bridge.available():
            pic = await until(lambda: [m for m in slack.thread(CHAN, page.ts) if m.files], "the plot")
            data = pic[0].files[0].data
            assert data is not None and data.startswith(b"\x89PNG")
            assert "plot in the thread" in slack.messages[(CHAN, page.ts)].visible
        await settled(slack, page, d)
        await slack.wait_connected()
        env = await slack.press(CHAN, page.ts, ALICE, page.value_of("✔ Ack"))
        await acked(slack, env)
        toast = await until(lambda: slack.ephemerals_for(ALICE), "feedback to the presser")
        assert "Acked by alice" in toast[0].visible and toast[0].via == "response_url"
        await until(
            lambda: "acked by alice" in slack.messages[(CHAN, page.ts)].visible, "the page shows the ack"
        )
        after = slack.messages[(CHAN, page.ts)]
        assert after.labels[0] == "🔕 Mute 1 h"  # no Ack any more
        assert slack.calls_of("chat.update")  # edited in place, not reposted

        job.step(8, seconds=5.0)  # steps resume: resolved in place + a quiet thread reply
        await until(lambda: "RESOLVED" in slack.messages[(CHAN, page.ts)].visible, "resolved in place")
        assert slack.messages[(CHAN, page.ts)].buttons == []
        reply = await until(
            lambda: [m for m in slack.thread(CHAN, page.ts) if m.visible.startswith("resolved:")],
            "the resolve reply",
        )
        assert not reply[0].reply_broadcast and "<!here>" not in reply[0].text
        assert len(pages(slack)) == 1 and open_pages(slack) == []
        assert slack.bot_messages(OTHER_CHAN) == []  # the default channel only
    finally:
        await d.stop()


async def test_triage_slash_command_answers_working_then_the_report(
    short_tmp: Path, slack: SlackEmulator
) -> None:
    outputs = short_tmp / "outputs"
    job = hung_job(outputs, "7002", steps=30)
    job.summary(0)
    d = await start_daemon(slack_daemon_config(short_tmp, slack), outputs)
    try:
        # The daemon has done its first tick (the finished job is not watched: it ended before the
        # daemon started) and has nothing in flight: the calls after the command are its own.
        await until(lambda: d.engine.durations["startup"], "the first tick")
        await until(lambda: d.engine.pipeline.outbox.pending_count() == 0, "deliveries done")
        before = len(slack.calls_of("chat.postMessage"))
        env = await slack.slash(CHAN, ALICE, "triage 7002")
        await acked(slack, env)

        def answers() -> list[SlackMessage]:
            return [m for m in slack.bot_messages(CHAN) if "/jobdiagd triage 7002" in m.visible]

        (answer,) = await until(answers, "the working… answer")
        await until(lambda: "Status:" in slack.messages[(CHAN, answer.ts)].visible, "the report edited in")
        final = slack.messages[(CHAN, answer.ts)]
        assert final.edits and "working" in final.edits[0]["text"] or "⏳" not in final.visible
        first = slack.calls_of("chat.postMessage")[before]
        assert "working" in first.params["text"]  # the placeholder went out first
        assert "triage: 7002" in final.visible and "completed" in final.visible.lower()
        assert "asked by alice" in final.visible
        assert len(answers()) == 1  # edited, never a second message for the same answer
    finally:
        await d.stop()


async def test_strangers_are_refused_commands_and_forged_buttons(
    short_tmp: Path, slack: SlackEmulator
) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7003")
    d = await start_daemon(slack_daemon_config(short_tmp, slack), outputs)
    try:
        (page,) = await until(lambda: open_pages(slack), "the hang page")
        await settled(slack, page, d)
        before = len(slack.bot_messages())
        await acked(slack, await slack.slash(CHAN, MALLORY, "ack 7003"))
        refusal = await until(lambda: slack.ephemerals_for(MALLORY), "a refusal")
        assert "Not allowed" in refusal[0].visible and "allowed users" in refusal[0].visible
        assert refusal[0].via == "response_url"  # only mallory sees it
        with capture_logs() as logs:  # alice, but in a channel off the list: not a word there
            await acked(slack, await slack.slash(FOREIGN_CHAN, ALICE, "status"))
            await until(lambda: [e for e in logs if e["event"] == "chat_ignored"], "the command ignored")
        assert slack.ephemerals_for(ALICE) == []
        mention, _ = await slack.mention(CHAN, MALLORY, "mute 7003 1d")
        await acked(slack, mention)
        await until(lambda: len(slack.ephemerals_for(MALLORY)) == 2, "a refused mention")
        assert slack.ephemerals_for(MALLORY)[1].via == "chat.postEphemeral"
        await acked(slack, await slack.press(CHAN, page.ts, MALLORY, page.value_of("✔ Ack")))
        await until(lambda: len(slack.ephemerals_for(MALLORY)) == 3, "answer to the stranger's press")
        assert "allowed users" in slack.ephemerals_for(MALLORY)[2].visible
        await acked(slack, await slack.press(CHAN, page.ts, ALICE, "ack:99999999"))  # forged token
        await until(
            lambda: any("expired" in e.visible for e in slack.ephemerals_for(ALICE)), "a forged press"
        )
        await acked(slack, await slack.press(CHAN, page.ts, ALICE, "rm -rf /:1"))  # not a token at all
        await until(lambda: any("not valid" in e.visible for e in slack.ephemerals_for(ALICE)), "garbage")
        inc = d.engine.pipeline.book.get("7003", "hang")
        assert inc is not None and inc.acked_at is None  # nobody acked it
        assert not d.engine.pipeline.store.conn.execute("SELECT 1 FROM mutes").fetchall()  # nobody muted it
        assert "acked" not in slack.messages[(CHAN, page.ts)].visible
        assert len(slack.bot_messages()) == before  # nothing said in public
    finally:
        await d.stop()


async def test_a_429_is_retried_after_retry_after_and_the_page_arrives_once(
    short_tmp: Path, slack: SlackEmulator
) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7004")
    slack.fail("chat.postMessage", "ratelimited", status=429, retry_after=1)
    d = await start_daemon(slack_daemon_config(short_tmp, slack), outputs)
    try:
        await until(lambda: open_pages(slack), "the hang page")
        await until(lambda: d.engine.pipeline.outbox.pending_count() == 0, "delivery marked")
        attempts = [c for c in slack.calls_of("chat.postMessage") if "hang on job 7004" in str(c.params)]
        assert len(attempts) == 2  # refused once with Retry-After, accepted once
        assert attempts[1].at - attempts[0].at >= 1.0  # Retry-After honoured
        assert len(pages(slack)) == 1
    finally:
        await d.stop()


async def test_a_restart_between_alert_and_resolution_updates_the_original_message(
    short_tmp: Path, slack: SlackEmulator
) -> None:
    outputs = short_tmp / "outputs"
    job = hung_job(outputs, "7005")
    cfg = slack_daemon_config(short_tmp, slack)
    d = await start_daemon(cfg, outputs)
    (page,) = await until(lambda: open_pages(slack), "the hang page")
    await until(lambda: d.engine.pipeline.outbox.pending_count() == 0, "delivery marked")
    await d.stop()

    d2 = await start_daemon(cfg, outputs)
    try:
        job.step(8, seconds=5.0)
        await until(
            lambda: "RESOLVED" in slack.messages[(CHAN, page.ts)].visible, "the original message updated"
        )
        assert [m.ts for m in pages(slack)] == [page.ts]  # no new page after the restart
        updates = [c for c in slack.calls_of("chat.update") if c.params.get("ts") == page.ts]
        assert updates and all(c.params["channel"] == CHAN for c in updates)
        reply = await until(
            lambda: [m for m in slack.thread(CHAN, page.ts) if m.visible.startswith("resolved:")],
            "the resolve reply",
        )
        assert len(reply) == 1
        assert slack.connections_opened == 2  # one Socket Mode connection per daemon run
    finally:
        await d2.stop()


async def test_mentions_and_short_commands_status_jobs_job_mute_unmute_help_plot(
    short_tmp: Path, slack: SlackEmulator
) -> None:
    outputs = short_tmp / "outputs"
    hung_job(outputs, "7006")
    d = await start_daemon(slack_daemon_config(short_tmp, slack), outputs)
    try:
        (page,) = await until(lambda: open_pages(slack), "the hang page")
        await settled(slack, page, d)

        async def mention(text: str) -> str:
            env, ts = await slack.mention(CHAN, ALICE, text)
            await acked(slack, env)
            got = await until(lambda: slack.thread(CHAN, ts), f"answer to @jobdiagd {text}")
            return got[0].visible

        async def slash(text: str, command: str = "/jobdiagd") -> str:
            seen = {m.ts for m in slack.bot_messages(CHAN)}
            await acked(slack, await slack.slash(CHAN, ALICE, text, command=command))
            got = await until(
                lambda: [m for m in slack.bot_messages(CHAN) if m.ts not in seen and m.thread_ts is None],
                f"answer to {command} {text}",
            )
            return got[0].visible

        status = await mention("status")
        assert "jobs watched: 1" in status and "7006" in status
        jobs = await slash("jobs")
        assert "7006 LIVE" in jobs and "⚠ hang" in jobs and "`/jobdiagd jobs` asked by alice" not in jobs
        assert "/jobdiagd jobs asked by alice" in jobs
        assert "incident 7006:hang:1 (critical)" in await slash("7006", command="/job")  # per-command slash
        assert "not being watched" in await mention("job 999")
        assert "muted for 2 h 00 min by alice" in await mention("mute 7006 2h")
        await until(lambda: "muted until" in slack.messages[(CHAN, page.ts)].visible, "page shows the mute")
        assert "🔔 Unmute" in slack.messages[(CHAN, page.ts)].labels
        assert "unmuted" in await slash("unmute 7006")
        await until(lambda: "muted until" not in slack.messages[(CHAN, page.ts)].visible, "page unmuted")
        assert "outside the configured outputs roots" in await slash("triage /etc/passwd")
        assert "/diagnose ID [PLAYBOOK]" in await slash("")  # a bare /jobdiagd is help
        assert "unknown command" in await mention("rm -rf")
        env, ts = await slack.mention(CHAN, ALICE, "plot 7006")
        await acked(slack, env)
        placeholder = (await until(lambda: slack.thread(CHAN, ts), "/plot"))[0]
        if plots_bridge.available():
            pic = await until(lambda: [m for m in slack.thread(CHAN, ts) if m.files], "the plot")
            data = pic[0].files[0].data
            assert data is not None and data.startswith(b"\x89PNG") and pic[0].files[0].title == "📈 job 7006"
        else:  # a build without the plotting modules says so instead of hanging
            await until(
                lambda: "not available" in slack.messages[(CHAN, placeholder.ts)].visible, "the answer"
            )
        answers = [m for m in slack.bot_messages(CHAN) if m.ts != page.ts]
        assert answers and not any("<!here>" in m.text or m.reply_broadcast for m in answers)  # rule CHAT-3
    finally:
        await d.stop()


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
