"""The Telegram transport through the outbox and dispatcher, real python-telegram-bot against the emulator."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web
from structlog.testing import capture_logs
from telegram.warnings import PTBDeprecationWarning

from jobdiagd.alerts.messages import MessageStore
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.chat.model import ChatMessage
from jobdiagd.chat.ports import TaskResult
from jobdiagd.chat.router import ChatRouter
from jobdiagd.chat.routes import Route, parse_quiet_hours
from jobdiagd.config import IncidentsConfig
from jobdiagd.model.alerts import Finding
from jobdiagd.notifiers.base import NotifierError
from jobdiagd.notifiers.dispatcher import Dispatcher, RetryPolicy
from jobdiagd.notifiers.telegram import TelegramSettings, TelegramTransport
from tests.helpers.chat import ALICE, CHAT, MALLORY, OTHER_CHAT, until
from tests.helpers.emulators.telegram import StoredMessage, TelegramEmulator

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC).timestamp()  # noon UTC
FOREIGN_CHAT = -1009


@dataclass
class Harness:
    tg: TelegramEmulator
    pipeline: AlertPipeline
    transport: TelegramTransport
    dispatcher: Dispatcher
    clock: list[float]

    @property
    def now(self) -> float:
        return self.clock[0]

    async def deliver(self) -> tuple[int, int]:
        r = await self.dispatcher.drain(self.now)
        return r.sent, r.failed

    def hang(
        self,
        job: str = "123",
        *,
        resolved: bool = False,
        severity: str = "critical",
        owner: str | None = None,
    ) -> Finding:
        return Finding(
            "hang",
            job,
            "hang",
            severity,  # type: ignore[arg-type]
            "steps resumed" if resolved else "no training step for 5 min",
            {"last step": 41},
            ("last line read: step 41",),
            at_step=41,
            resolved=resolved,
            owner=owner,
        )


def body(m: StoredMessage) -> str:
    return m.text or m.caption or ""


async def make(tg: TelegramEmulator, tmp: Path, **kw: object) -> Harness:
    clock = [T0]
    pipeline = AlertPipeline.open(tmp, IncidentsConfig(reminder_interval_seconds=600), ["telegram"])
    settings = TelegramSettings(
        **{  # type: ignore[arg-type]
            "token": tg.token,
            "chat_ids": (CHAT, OTHER_CHAT),
            "default_chat": CHAT,
            "api_base_url": tg.base_url,
            "commands": False,
            **kw,
        }
    )
    transport = TelegramTransport(settings, MessageStore(pipeline.store), now=lambda: clock[0])
    await transport.start()
    await until(lambda: transport._ready.is_set(), "bot connected")
    policy = RetryPolicy(initial=0.01, maximum=0.05, send_timeout=20)
    dispatcher = Dispatcher(pipeline.outbox, [transport], policy=policy, now=lambda: clock[0])
    return Harness(tg, pipeline, transport, dispatcher, clock)


@pytest.fixture
async def h(tg: TelegramEmulator, tmp_path: Path) -> AsyncIterator[Harness]:
    harness = await make(tg, tmp_path)
    try:
        yield harness
    finally:
        await harness.transport.stop()
        harness.pipeline.close()


async def test_reminders_reply_under_the_page_and_keep_it_current(h: Harness) -> None:
    h.pipeline.observe([h.hang()], h.now)
    assert await h.deliver() == (1, 0)
    (page,) = h.tg.bot_messages(CHAT)
    assert "OPEN since 12:00" in body(page) and not page.silent
    h.clock[0] += 600
    h.pipeline.observe([h.hang()], h.now)  # a reminder
    h.clock[0] += 60
    h.pipeline.observe([h.hang(severity="critical")], h.now)  # nothing new
    assert await h.deliver() == (1, 0)
    replies = [m for m in h.tg.bot_messages(CHAT) if m.reply_to == page.message_id]
    assert len(replies) == 1 and body(replies[0]).startswith("still open: hang on job 123")
    assert "reminders: 1" in body(h.tg.messages[(CHAT, page.message_id)])
    h.pipeline.mute("123", "*", h.now + 3600, h.now, by="bob")
    await h.deliver()
    assert "muted until 13:11 UTC by bob" in body(h.tg.messages[(CHAT, page.message_id)])
    assert [b for row in h.tg.messages[(CHAT, page.message_id)].buttons for b, _ in row][0] == "✔ Ack"
    assert "🔔 Unmute" in [b for row in h.tg.messages[(CHAT, page.message_id)].buttons for b, _ in row]
    h.clock[0] += 60
    h.pipeline.observe([h.hang(resolved=True)], h.now)  # resolved while muted: a silent edit only
    await h.deliver()
    final = h.tg.messages[(CHAT, page.message_id)]
    assert "RESOLVED after 12 min" in body(final) and final.buttons == []
    assert (
        len([m for m in h.tg.bot_messages(CHAT) if m.reply_to == page.message_id]) == 1
    )  # no reply while muted


async def test_the_job_end_report_replies_as_a_document_with_a_summary(h: Harness) -> None:
    h.pipeline.observe([h.hang()], h.now)
    await h.deliver()
    (page,) = h.tg.bot_messages(CHAT)
    report = "## Job triage: x.log\n\n**Status:** cancelled\n**Primary failure:** hang\n\n### Evidence\n" + (
        "| step | seconds |\n|---|---|\n" + "| 1 | 2.0 |\n" * 600
    )
    h.pipeline.report("123", "job-end", "end", "job 123 ended: cancelled", report, h.now)
    await h.deliver()
    replies = [m for m in h.tg.bot_messages(CHAT) if m.reply_to == page.message_id]
    summary, doc = replies
    assert "Status: cancelled" in body(summary) and "Full report attached" in body(summary)
    assert (
        doc.document is not None
        and doc.document[0] == "123-job-end.md"
        and doc.document[1].decode() == report
    )
    assert all(m.silent for m in replies)  # reports are info: silent


async def test_routes_by_owner_and_quiet_hours(tg: TelegramEmulator, tmp_path: Path) -> None:
    quiet = parse_quiet_hours("11:00-13:00", "UTC")
    h = await make(tg, tmp_path, routes=(Route(str(OTHER_CHAT), owners=frozenset({"alice"})),), quiet=quiet)
    try:
        h.pipeline.observe([h.hang("1", owner="alice"), h.hang("2", owner="bob", severity="warning")], h.now)
        h.pipeline.observe(
            [Finding("tgs", "3", "tgs-degradation", "critical", "TGS -30%", owner="bob")], h.now
        )
        await h.deliver()
        (alice,) = tg.bot_messages(OTHER_CHAT)
        assert "job 1 (alice)" in body(alice) and not alice.silent  # critical rings in quiet hours
        warn, crit = tg.bot_messages(CHAT)
        assert "job 2 (bob)" in body(warn) and warn.silent  # below critical: silent in quiet hours
        assert "job 3" in body(crit) and not crit.silent
        h.clock[0] += 900
        h.pipeline.observe([h.hang("1", owner="alice", resolved=True)], h.now)
        await h.deliver()
        assert [m for m in tg.bot_messages(OTHER_CHAT) if m.reply_to == alice.message_id]  # follows the page
    finally:
        await h.transport.stop()
        h.pipeline.close()


async def test_retries_never_duplicate_and_server_errors_back_off(h: Harness) -> None:
    h.pipeline.observe([h.hang()], h.now)
    (n,) = [d.notification for d in h.pipeline.outbox.due("telegram", h.now)]
    await h.transport.send(n)  # sent, then "crash" before the outbox marked it
    assert await h.deliver() == (1, 0)  # the retry finds the recorded message
    assert len(h.tg.bot_messages(CHAT)) == 1
    h.tg.fail("sendMessage", 502, "Bad Gateway")
    h.pipeline.notice("n1", "source down", "squeue failed", h.now, severity="warning")
    assert await h.deliver() == (0, 1)
    error = h.pipeline.store.conn.execute(
        "SELECT last_error FROM deliveries WHERE notification_id = 'notice:n1'"
    ).fetchone()[0]
    assert error.startswith("NotifierError: telegram: NetworkError: Bad Gateway"), error
    h.clock[0] += 1
    assert await h.deliver() == (1, 0)
    assert [body(m) for m in h.tg.bot_messages(CHAT)][1].startswith("source down")


async def test_content_errors_drop_one_message_and_unknown_chats_wait(h: Harness) -> None:
    h.tg.fail("sendMessage", 400, "Bad Request: can't parse entities: unsupported start tag")
    h.pipeline.notice("bad", "first", "x", h.now)
    h.pipeline.notice("good", "second", "y", h.now)
    assert await h.deliver() == (1, 0)  # the bad one is dropped (dead), the queue goes on
    assert h.pipeline.outbox.counts()["telegram"] == {"dead": 1, "sent": 1}
    del h.tg.chats[CHAT]  # the bot was removed from the chat / wrong id
    h.pipeline.notice("lost", "third", "z", h.now)
    assert await h.deliver() == (0, 1)
    assert (
        "unknown chat"
        in (
            h.pipeline.store.conn.execute(
                "SELECT last_error FROM deliveries WHERE notification_id = 'notice:lost'"
            ).fetchone()[0]
        )
    )
    assert h.pipeline.outbox.pending_count("telegram") == 1  # kept, not dropped


async def test_a_deleted_incident_message_is_posted_again(h: Harness) -> None:
    h.pipeline.observe([h.hang()], h.now)
    await h.deliver()
    (page,) = h.tg.bot_messages(CHAT)
    del h.tg.messages[(CHAT, page.message_id)]  # someone deleted the page
    h.clock[0] += 5
    h.pipeline.ack("123", "hang", h.now, by="carol")
    await h.deliver()
    (again,) = h.tg.bot_messages(CHAT)
    assert again.message_id != page.message_id and "acked by carol" in body(again)
    h.clock[0] += 1
    h.pipeline.mute("123", "hang", h.now + 600, h.now, by="carol")
    await h.deliver()
    assert "muted until" in body(h.tg.messages[(CHAT, again.message_id)])  # the new one is kept current
    assert len(h.tg.bot_messages(CHAT)) == 1


async def test_notify_test_names_each_problem(h: Harness, tmp_path: Path) -> None:
    h.tg.forbidden[OTHER_CHAT] = "bot is not a member of the group chat"
    results = await h.transport.check("hello")
    assert [(r.what, r.ok) for r in results] == [
        ("token", True),
        (f"chat {CHAT}", True),
        (f"chat {OTHER_CHAT}", False),
    ]
    assert "missing permission" in results[2].detail
    del h.tg.chats[CHAT]
    assert "unknown chat" in (await h.transport.check("x"))[1].detail

    token = tmp_path / "tok"
    token.write_text("123:wrong\n")
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{tmp_path}/st"\n[notifiers.console]\nstream = "stdout"\n'
        f'[notifiers.telegram]\nenabled = true\ntoken_file = "{token}"\nchat_ids = [{OTHER_CHAT}]\n'
        f'api_base_url = "{h.tg.base_url}"\n'
    )

    async def cli() -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "jobdiagd.cli",
            "notify-test",
            "--config",
            str(cfg),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        return proc.returncode or 0, out.decode()

    rc, out = await cli()
    assert rc == 1 and "telegram   token                  FAIL  bad token" in out
    assert "console    send                   ok" in out
    token.write_text(h.tg.token + "\n")
    rc, out = await cli()
    assert rc == 1 and f"chat {OTHER_CHAT}" in out and "missing permission" in out
    del h.tg.forbidden[OTHER_CHAT]
    rc, out = await cli()
    assert rc == 0 and "notify-test: 3 ok, 0 failed" in out, out
    assert h.tg.token not in out


async def test_a_ray_hang_page_is_its_chart_with_the_power_strip_replied_under_it(h: Harness) -> None:
    rendered: list[object] = []

    async def render(payload: object) -> list[bytes]:
        rendered.append(payload)
        return [b"\x89PNG chart", b"\x89PNG strip"]

    h.transport.render_plot = render  # type: ignore[assignment]
    f = dataclasses.replace(
        h.hang(), plot={"type": "step_chart/1", "spec": {}, "strip": {"type": "power_strip/1"}}
    )
    h.pipeline.observe([f], h.now)
    (n,) = [d.notification for d in h.pipeline.outbox.due("telegram", h.now)]
    await h.transport.send(n)
    page, strip = h.tg.bot_messages(CHAT)
    assert (
        page.photo == b"\x89PNG chart"
        and page.caption is not None
        and page.caption.startswith("🔴 hang on job 123")
    )
    assert (
        page.buttons
        and strip.photo == b"\x89PNG strip"
        and strip.reply_to == page.message_id
        and strip.silent
    )
    assert "GPU power and utilization per host" in (strip.caption or "")
    assert await h.deliver() == (1, 0)  # the outbox's retry of a delivered page posts nothing
    assert len(h.tg.bot_messages(CHAT)) == 2 and len(rendered) == 1
    h.clock[0] += 5
    h.pipeline.ack("123", "hang", h.now, by="dan")
    await h.deliver()
    assert "acked by dan" in (
        h.tg.messages[(CHAT, page.message_id)].caption or ""
    )  # a photo's text is its caption


async def test_a_429_hands_its_wait_on_without_a_ptb_deprecation_warning(
    tg: TelegramEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PTB >= 22.2 warns whenever RetryAfter.retry_after is read as seconds, and reads it itself
    # while building the exception: only its documented opt-in (PTB_TIMEDELTA) silences that.
    monkeypatch.setenv("PTB_TIMEDELTA", "unset by this test")  # restored afterwards
    monkeypatch.delenv("PTB_TIMEDELTA")
    harness = await make(tg, tmp_path)
    try:
        tg.fail("sendMessage", 429, "Too Many Requests: retry after 1", retry_after=1, times=2)
        harness.pipeline.notice("busy", "flood", "x", harness.now)
        (n,) = [d.notification for d in harness.pipeline.outbox.due("telegram", harness.now)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(NotifierError) as raised:
                await harness.transport.send(n)  # PTB retries once itself, then hands it on
        assert raised.value.retry_after == 1.0
        assert str(raised.value) == "telegram: flood control, retry in 1 s"
        assert [w for w in caught if issubclass(w.category, PTBDeprecationWarning)] == []
        await harness.transport.send(n)  # the wait over, it goes out once
        assert [body(m) for m in tg.bot_messages(CHAT)] == [body(tg.bot_messages(CHAT)[0])]
        assert body(tg.bot_messages(CHAT)[0]).startswith("flood")
    finally:
        await harness.transport.stop()
        harness.pipeline.close()


async def test_a_page_delivered_late_dates_its_numbers(tg: TelegramEmulator, tmp_path: Path) -> None:
    h = await make(tg, tmp_path, tz=UTC)
    try:
        tg.fail("sendMessage", 502, "Bad Gateway", times=2)  # Telegram down at first
        finding = dataclasses.replace(
            h.hang(), details={"stalled for": "25m 0s", "last step": 41, "expected step": 189}
        )
        h.pipeline.observe([finding], h.now)
        assert await h.deliver() == (0, 1)
        h.clock[0] += 30
        assert await h.deliver() == (0, 1)
        h.clock[0] += 270  # back, five minutes after the page was made
        assert await h.deliver() == (1, 0)
        (page,) = tg.bot_messages(CHAT)
        lines = body(page).splitlines()
        assert lines[1].startswith("OPEN since 12:00 UTC (5 min)")  # the state line is as of now
        assert "Stalled for 25m 0s — as of 12:00 UTC" in lines  # the finding's numbers are dated
        # Delivered at once, a page has nothing to date.
        h.pipeline.observe([dataclasses.replace(finding, job_id="124")], h.now)
        assert await h.deliver() == (1, 0)
        assert "as of" not in body(tg.bot_messages(CHAT)[1])
    finally:
        await h.transport.stop()
        h.pipeline.close()


async def test_a_base_url_ending_in_bot_reaches_the_same_server(tg: TelegramEmulator, tmp_path: Path) -> None:
    h = await make(tg, tmp_path, api_base_url=tg.base_url + "/bot/")
    try:
        h.pipeline.observe([h.hang()], h.now)
        assert await h.deliver() == (1, 0)
        assert [c.method for c in tg.calls][:1] == ["getMe"] and len(tg.bot_messages(CHAT)) == 1
        assert [r.ok for r in await h.transport.check("hi")] == [True, True, True]
    finally:
        await h.transport.stop()
        h.pipeline.close()


async def test_notify_test_tells_a_wrong_server_from_a_bad_token_without_a_traceback(
    tg: TelegramEmulator, tmp_path: Path
) -> None:
    async def nginx(request: web.Request) -> web.Response:  # a web server, not a Bot API server
        return web.Response(status=404, text="<html><body><h1>404 Not Found</h1></body></html>")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", nginx)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    other = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    token = tmp_path / "tok"
    cfg = tmp_path / "cfg.toml"

    async def notify_test(api: str, secret: str) -> tuple[int, str, str]:
        token.write_text(secret + "\n")
        cfg.write_text(
            f'[daemon]\nstate_dir = "{tmp_path}/st"\n[notifiers.console]\nenabled = false\n'
            f'[notifiers.telegram]\nenabled = true\ntoken_file = "{token}"\nchat_ids = [{CHAT}]\n'
            f'api_base_url = "{api}"\n'
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "jobdiagd.cli",
            "notify-test",
            "--config",
            str(cfg),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        return proc.returncode or 0, out.decode(), err.decode()

    try:
        rc, out, err = await notify_test(other, tg.token)
        assert rc == 1 and f"FAIL  this is not a Bot API server (HTTP 404 at {other})" in out, out
        assert err == ""  # PTB's "Can not load invalid JSON data" traceback stays off stderr ...
        (line,) = [ln for ln in out.splitlines() if "telegram_ptb_error" in ln]  # ... one line instead
        assert "Traceback" not in out and tg.token not in out
        rc, out, err = await notify_test(tg.base_url + "/wrong/path", tg.token)
        assert rc == 1 and "this is not a Bot API server (HTTP 404 at" in out and err == ""
        rc, out, err = await notify_test(tg.base_url + "/bot", "123456:not-the-token-of-this-bot-at-all")
        assert rc == 1 and "FAIL  bad token: the server rejected it (HTTP 401)" in out and err == ""
        rc, out, err = await notify_test(tg.base_url + "/bot", tg.token)
        assert rc == 0 and "notify-test: 2 ok, 0 failed" in out and err == "", out
    finally:
        await runner.cleanup()


class LongReports:
    """The daemon's side of the router, answering /triage with a report too long for a message."""

    outputs_roots: tuple[Path, ...] = ()
    playbooks: tuple[str, ...] = ()
    report = (
        "## Job triage\n\n**Status:** hanging\n\n### Evidence\n| step | s |\n|---|---|\n"
        + "| 1 | 2.0 |\n" * 600
    )

    def status(self, now: float) -> ChatMessage:
        return ChatMessage("jobdiagd status", "OK", preformatted=True)

    async def run_task(self, name: str, args: tuple[str, ...]) -> TaskResult:
        return TaskResult(f"📋 triage: {args[0]}", self.report)


async def test_answers_are_silent_and_a_long_triage_is_two_messages(
    tg: TelegramEmulator, tmp_path: Path
) -> None:
    h = await make(tg, tmp_path, commands=True, poll_timeout_s=1.0, allowed_users=(ALICE,))
    h.transport.router = ChatRouter(LongReports(), h.transport.auth, transport="telegram")  # type: ignore[arg-type]
    try:
        await until(lambda: tg.calls_of("getUpdates"), "polling")

        def answers(cmd: int) -> list[StoredMessage]:
            return [m for m in tg.bot_messages() if m.reply_to == cmd]

        cmd = await tg.send_command(CHAT, ALICE, "/triage 7001")
        summary, doc = await until(lambda: len(answers(cmd)) == 2 and answers(cmd), "summary and document")
        await until(
            lambda: "Full report attached" in body(tg.messages[(CHAT, summary.message_id)]), "the summary"
        )
        assert "Status: hanging" in body(tg.messages[(CHAT, summary.message_id)])
        assert doc.document is not None and doc.document[1].decode() == LongReports.report
        assert doc.caption == "📋 triage: 7001" and doc.text is None  # the document alone, titled
        assert len(answers(cmd)) == 2  # not a third message for the document's title
        for text, who in (("/status", ALICE), ("/help", ALICE), ("/ack 1", MALLORY)):
            mid = await tg.send_command(CHAT, who, text)
            await until(lambda mid=mid: answers(mid), f"the answer to {text}")  # type: ignore[misc]
        refusal = answers(mid)[0]
        assert "Not allowed" in body(refusal)  # a stranger in an allowed chat is told why not
        assert all(m.silent for m in tg.bot_messages())  # answers and refusals never ring
        tg.add_chat(FOREIGN_CHAT, title="random")  # the bot is in it, but it is not on the list
        with capture_logs() as logs:
            await tg.send_command(FOREIGN_CHAT, ALICE, "/status")
            await until(lambda: [e for e in logs if e["event"] == "chat_ignored"], "the command ignored")
        assert tg.bot_messages(FOREIGN_CHAT) == []  # not a word: the bot does not reveal itself there
    finally:
        await h.transport.stop()
        h.pipeline.close()


async def test_a_report_with_a_picture_is_its_text_then_the_photo_once(h: Harness) -> None:
    rendered: list[object] = []

    async def render(payload: object) -> list[bytes]:
        rendered.append(payload)
        return [b"\x89PNG digest"]

    h.transport.render_plot = render  # type: ignore[assignment]
    plot = {"type": "goodput_chart/1", "spec": {}}
    title = "Goodput, week to 2026-03-02"
    h.pipeline.report("", "goodput-digest", "2026-W10", title, "**Where**\n- x", h.now, plot=plot)
    (n,) = [d.notification for d in h.pipeline.outbox.due("telegram", h.now)]
    await h.transport.send(n)
    await h.transport.send(n)  # a retry after a lost mark posts nothing again, renders nothing
    text, photo = h.tg.bot_messages(CHAT)
    assert body(text).startswith(title) and "Where" in body(text)
    assert photo.photo == b"\x89PNG digest" and body(photo) == title
    assert text.silent and photo.silent and rendered == [plot]
    # Without a renderer a report is its text alone.
    h.transport.render_plot = None
    assert await h.deliver() == (1, 0)
    h.pipeline.report("", "goodput-digest", "2026-W11", "Goodput, week to 2026-03-09", "x", h.now, plot=plot)
    assert await h.deliver() == (1, 0)
    (last,) = h.tg.bot_messages(CHAT)[2:]
    assert body(last).startswith("Goodput, week to 2026-03-09") and last.photo is None
