"""The Slack transport through the outbox and dispatcher, the real slack-sdk against the Slack emulator."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.alerts.messages import MessageStore
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.chat.routes import Route, parse_quiet_hours
from jobdiagd.config import IncidentsConfig
from jobdiagd.model.alerts import Finding
from jobdiagd.notifiers.dispatcher import Dispatcher, RetryPolicy
from jobdiagd.notifiers.slack import PLOT_NOTE, SlackSettings, SlackTransport, from_slack_text, retry_after_s
from tests.helpers.chat import until
from tests.helpers.emulators.slack import SlackEmulator, SlackMessage, stray_markup
from tests.helpers.slack import CHAN, OTHER_CHAN

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC).timestamp()  # noon UTC
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


@dataclass
class Harness:
    em: SlackEmulator
    pipeline: AlertPipeline
    transport: SlackTransport
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
        plot: Mapping[str, Any] | None = None,
    ) -> Finding:
        return Finding(
            "hang",
            job,
            "hang",
            severity,  # type: ignore[arg-type]
            "steps resumed" if resolved else "no training step for 5 min",
            {"last step": 41},
            ("last line read: step 41 <rank 0> & more",),
            at_step=41,
            resolved=resolved,
            owner=owner,
            plot=plot,
        )

    def error_of(self, notification_id: str) -> str:
        row = self.pipeline.store.conn.execute(
            "SELECT last_error FROM deliveries WHERE notification_id = ?", (notification_id,)
        ).fetchone()
        return str(row[0])


async def make(
    em: SlackEmulator,
    tmp: Path,
    *,
    render_plot: Callable[[Mapping[str, Any]], Awaitable[list[bytes]]] | None = None,
    **kw: Any,
) -> Harness:
    clock = [T0]
    pipeline = AlertPipeline.open(tmp, IncidentsConfig(reminder_interval_seconds=600), ["slack"])
    settings = SlackSettings(
        bot_token=em.bot_token,
        app_token=None,
        channel_ids=(CHAN, OTHER_CHAN),
        default_channel=CHAN,
        api_base_url=em.base_url,
        commands=False,
        **kw,
    )
    transport = SlackTransport(
        settings, MessageStore(pipeline.store), render_plot=render_plot, now=lambda: clock[0]
    )
    await transport.start()
    await until(lambda: transport._ready.is_set(), "app connected")
    policy = RetryPolicy(initial=0.01, maximum=0.05, send_timeout=20)
    dispatcher = Dispatcher(pipeline.outbox, [transport], policy=policy, now=lambda: clock[0])
    return Harness(em, pipeline, transport, dispatcher, clock)


@pytest.fixture
async def h(slack: SlackEmulator, tmp_path: Path) -> AsyncIterator[Harness]:
    harness = await make(slack, tmp_path, page_mention="<!here>")
    try:
        yield harness
    finally:
        await harness.transport.stop()
        harness.pipeline.close()


def page_of(em: SlackEmulator, channel: str = CHAN) -> SlackMessage:
    (page,) = [m for m in em.bot_messages(channel) if m.thread_ts is None and m.buttons]
    return page


async def test_reminders_reply_in_the_thread_and_keep_the_page_current(h: Harness) -> None:
    h.pipeline.observe([h.hang()], h.now)
    assert await h.deliver() == (1, 0)
    page = page_of(h.em)
    assert page.visible.startswith("🔴 hang on job 123 [critical]") and "OPEN since 12:00" in page.visible
    assert page.text.startswith("<!here> 🔴 hang on job 123")  # it rings: the mention is in the fallback
    assert "last line read: step 41 <rank 0> & more" in page.visible
    assert all(stray_markup(t) == [] for t in page.mrkdwn)
    assert page.labels == ["✔ Ack", "🔕 Mute 1 h", "🔕 Mute 24 h", "📋 Full triage"]
    assert page.value_of("✔ Ack") == f"ack:{h.pipeline.store.incident_token('123:hang:1')}"
    h.clock[0] += 600
    h.pipeline.observe([h.hang()], h.now)  # a reminder
    assert await h.deliver() == (1, 0)
    (reminder,) = h.em.thread(CHAN, page.ts)
    assert reminder.visible.startswith("still open: hang on job 123")
    assert reminder.reply_broadcast and reminder.text.startswith("<!here>")  # a critical reminder re-pages
    assert "reminders: 1" in h.em.messages[(CHAN, page.ts)].visible
    h.pipeline.mute("123", "*", h.now + 3600, h.now, by="bob")
    await h.deliver()
    shown = h.em.messages[(CHAN, page.ts)]
    assert "muted until 13:10 UTC by bob" in shown.visible and "🔔 Unmute" in shown.labels
    h.clock[0] += 60
    h.pipeline.observe([h.hang(resolved=True)], h.now)  # resolved while muted: an edit only
    await h.deliver()
    final = h.em.messages[(CHAN, page.ts)]
    assert "RESOLVED after 11 min" in final.visible and final.buttons == []
    assert len(h.em.thread(CHAN, page.ts)) == 1  # no reply while muted
    assert len(h.em.calls_of("chat.update")) == 3  # reminder count, mute, resolution
    assert len([m for m in h.em.bot_messages(CHAN) if m.thread_ts is None]) == 1


async def test_resolution_replies_quietly_in_the_thread(h: Harness) -> None:
    h.pipeline.observe([h.hang()], h.now)
    await h.deliver()
    page = page_of(h.em)
    h.clock[0] += 120
    h.pipeline.observe([h.hang(resolved=True)], h.now)
    await h.deliver()
    (reply,) = h.em.thread(CHAN, page.ts)
    assert reply.visible.startswith("resolved: ") and not reply.reply_broadcast
    assert "<!here>" not in reply.text  # info: no mention, stays in the thread
    assert "RESOLVED after 2 min" in h.em.messages[(CHAN, page.ts)].visible


async def test_the_picture_goes_into_the_thread_through_files_upload_v2(
    slack: SlackEmulator, tmp_path: Path
) -> None:
    rendered: list[Mapping[str, Any]] = []

    async def render_plot(payload: Mapping[str, Any]) -> list[bytes]:
        rendered.append(payload)
        return [PNG]

    h = await make(slack, tmp_path, render_plot=render_plot)
    try:
        slack.fail("files.completeUploadExternal", "ratelimited", status=429, retry_after=1)
        h.pipeline.observe([h.hang(plot={"type": "step_chart/1", "spec": {}})], h.now)
        assert await h.deliver() == (0, 1)  # the page went out, the picture hit a rate limit
        assert "rate limited, retry in 1 s" in h.error_of("123:hang:1:open")
        h.clock[0] += 1
        assert await h.deliver() == (1, 0)
        page = page_of(slack)
        assert PLOT_NOTE in page.visible
        (pic,) = slack.thread(CHAN, page.ts)
        (f,) = pic.files
        assert f.data == PNG and f.filename == "123-hang.png" and f.alt_txt
        assert [c.method for c in slack.calls if c.method.startswith(("files.", "upload"))] == [
            "files.getUploadURLExternal",
            "upload",
            "files.completeUploadExternal",  # 429
            "files.getUploadURLExternal",
            "upload",
            "files.completeUploadExternal",
        ]
        assert len(slack.calls_of("chat.postMessage")) == 1  # the page was not posted twice
        assert len(rendered) == 2  # rendered again for the retry, not stored in the outbox
        h.clock[0] += 60
        h.pipeline.ack("123", "hang", h.now, by="carol")
        await h.deliver()
        assert PLOT_NOTE in slack.messages[(CHAN, page.ts)].visible  # edits keep the pointer
    finally:
        await h.transport.stop()
        h.pipeline.close()


async def test_a_ray_hang_page_gets_its_gpu_power_strip_after_the_chart(
    slack: SlackEmulator, tmp_path: Path
) -> None:
    strip = b"\x89PNG\r\n\x1a\n" + b"\x01" * 80

    async def render_plot(payload: Mapping[str, Any]) -> list[bytes]:
        return [PNG, strip] if payload.get("strip") else [PNG]

    h = await make(slack, tmp_path, render_plot=render_plot)
    try:
        slack.fail("files.getUploadURLExternal", "internal_error", status=500, times=1)
        plot = {"type": "step_chart/1", "spec": {}, "strip": {"hosts": []}}
        h.pipeline.observe([h.hang(plot=plot)], h.now)
        assert await h.deliver() == (0, 1)  # the page is out, its chart upload hit a 500
        h.clock[0] += 1
        assert await h.deliver() == (1, 0)
        page = page_of(slack)
        chart, gpu = slack.thread(CHAN, page.ts)
        assert chart.files[0].data == PNG and gpu.files[0].data == strip
        assert gpu.files[0].title is not None and gpu.files[0].title.startswith("GPU power and utilization")
        assert len(slack.calls_of("chat.postMessage")) == 1
        assert len(slack.calls_of("files.completeUploadExternal")) == 2  # each picture once
    finally:
        await h.transport.stop()
        h.pipeline.close()


async def test_a_picture_slack_refuses_is_dropped_and_the_page_stops_pointing_at_it(
    slack: SlackEmulator, tmp_path: Path
) -> None:
    async def render_plot(payload: Mapping[str, Any]) -> list[bytes]:
        return [PNG]

    slack.scopes = "chat:write,commands,app_mentions:read"  # files:write was never granted
    h = await make(slack, tmp_path, render_plot=render_plot)
    try:
        h.pipeline.observe([h.hang(plot={"type": "step_chart/1", "spec": {}})], h.now)
        assert await h.deliver() == (1, 0)  # the page is out: a missing picture does not hold the queue
        page = page_of(slack)
        assert slack.thread(CHAN, page.ts) == []
        h.pipeline.ack("123", "hang", h.now, by="carol")
        await h.deliver()
        assert PLOT_NOTE not in slack.messages[(CHAN, page.ts)].visible
    finally:
        await h.transport.stop()
        h.pipeline.close()


async def test_the_job_end_report_replies_in_the_thread_as_a_file_with_a_summary(h: Harness) -> None:
    h.pipeline.observe([h.hang()], h.now)
    await h.deliver()
    page = page_of(h.em)
    report = "## Job triage: x.log\n\n**Status:** cancelled\n**Primary failure:** hang\n\n### Evidence\n" + (
        "| step | seconds |\n|---|---|\n" + "| 1 | 2.0 |\n" * 600
    )
    h.pipeline.report("123", "job-end", "end", "job 123 ended: cancelled", report, h.now)
    await h.deliver()
    summary, doc = h.em.thread(CHAN, page.ts)
    assert "Status: cancelled" in summary.visible and "Full report attached" in summary.visible
    assert not summary.reply_broadcast and "<!here>" not in summary.text  # info: quiet
    (f,) = doc.files
    assert f.filename == "123-job-end.md" and f.data is not None and f.data.decode() == report


async def test_a_report_without_an_incident_is_a_channel_message_with_its_file_in_its_thread(
    h: Harness,
) -> None:
    h.pipeline.report("77", "job-end", "end", "job 77 ended", "## r\n" + "x\n" * 3000, h.now)
    assert await h.deliver() == (1, 0)
    (summary,) = [m for m in h.em.bot_messages(CHAN) if m.thread_ts is None]
    (doc,) = h.em.thread(CHAN, summary.ts)
    assert doc.files[0].filename == "77-job-end.md"


async def test_routes_by_owner_and_quiet_hours_decide_where_and_whether_it_rings(
    slack: SlackEmulator, tmp_path: Path
) -> None:
    quiet = parse_quiet_hours("11:00-13:00", "UTC")
    h = await make(
        slack,
        tmp_path,
        routes=(Route(OTHER_CHAN, owners=frozenset({"alice"})),),
        quiet=quiet,
        page_mention="<!subteam^S0ONCALL>",
    )
    try:
        h.pipeline.observe([h.hang("1", owner="alice"), h.hang("2", owner="bob", severity="warning")], h.now)
        await h.deliver()
        (alice,) = slack.bot_messages(OTHER_CHAN)
        assert "job 1 (alice)" in alice.visible and alice.text.startswith("<!subteam^S0ONCALL>")
        (warn,) = slack.bot_messages(CHAN)
        assert "job 2 (bob)" in warn.visible and "<!subteam" not in warn.text  # below critical: quiet
        h.clock[0] += 900
        h.pipeline.observe([h.hang("1", owner="alice", resolved=True)], h.now)
        await h.deliver()
        assert slack.thread(OTHER_CHAN, alice.ts)  # the resolution follows the page to alice's channel
    finally:
        await h.transport.stop()
        h.pipeline.close()


async def test_retries_never_duplicate_and_rate_limits_wait_for_retry_after(h: Harness) -> None:
    h.pipeline.observe([h.hang()], h.now)
    (n,) = [d.notification for d in h.pipeline.outbox.due("slack", h.now)]
    await h.transport.send(n)  # sent, then "crash" before the outbox marked it
    assert await h.deliver() == (1, 0)  # the retry finds the recorded message
    assert len(h.em.bot_messages(CHAN)) == 1
    h.em.fail("chat.postMessage", "ratelimited", status=429, retry_after=30)
    h.pipeline.notice("n1", "source down", "squeue failed", h.now, severity="warning")
    assert await h.deliver() == (0, 1)
    assert h.error_of("notice:n1") == "NotifierError: slack: rate limited, retry in 30 s"
    assert h.dispatcher.state["slack"].blocked_until == h.now + 30  # Retry-After, not the 0.01 s backoff
    h.em.fail("chat.postMessage", "internal_error", status=503)
    h.clock[0] += 30
    assert await h.deliver() == (0, 1)
    assert "server error (HTTP 503, internal_error)" in h.error_of("notice:n1")
    h.clock[0] += 1
    assert await h.deliver() == (1, 0)
    assert [m.visible.splitlines()[0] for m in h.em.bot_messages(CHAN)][1] == "source down"
    assert "<!here>" not in h.em.bot_messages(CHAN)[1].text  # a notice never rings: pages do


async def test_content_errors_drop_one_message_and_channel_errors_wait(h: Harness) -> None:
    h.em.fail("chat.postMessage", "invalid_blocks", errors=["something Slack disliked"])
    h.pipeline.notice("bad", "first", "x", h.now)
    h.pipeline.notice("good", "second", "y", h.now)
    assert await h.deliver() == (1, 0)  # the bad one is dropped (dead), the queue goes on
    assert h.pipeline.outbox.counts()["slack"] == {"dead": 1, "sent": 1}
    h.em.channels[CHAN]["member"] = False  # the app was removed from the channel
    h.pipeline.notice("lost", "third", "z", h.now)
    assert await h.deliver() == (0, 1)
    assert "not a member of the channel" in h.error_of("notice:lost")
    del h.em.channels[CHAN]
    h.clock[0] += 1
    assert await h.deliver() == (0, 1)
    assert "unknown channel" in h.error_of("notice:lost")
    assert h.pipeline.outbox.pending_count("slack") == 1  # kept, not dropped


async def test_a_deleted_incident_message_is_posted_again(h: Harness) -> None:
    h.pipeline.observe([h.hang()], h.now)
    await h.deliver()
    page = page_of(h.em)
    del h.em.messages[(CHAN, page.ts)]  # someone deleted the page
    h.clock[0] += 5
    h.pipeline.ack("123", "hang", h.now, by="carol")
    await h.deliver()
    again = page_of(h.em)
    assert again.ts != page.ts and "acked by carol" in again.visible
    h.clock[0] += 1
    h.pipeline.mute("123", "hang", h.now + 600, h.now, by="carol")
    await h.deliver()
    assert "muted until" in h.em.messages[(CHAN, again.ts)].visible  # the new one is kept current
    assert len(h.em.bot_messages(CHAN)) == 1


async def test_a_long_incident_body_stays_within_block_kit_limits(h: Harness) -> None:
    evidence = tuple(f"rank {i}: <stuck> in all-reduce & waiting" for i in range(400))
    f = Finding("hang", "9", "hang", "critical", "no step for 9 min", {"last step": 1}, evidence)
    h.pipeline.observe([f], h.now)
    assert await h.deliver() == (1, 0)  # the emulator rejects anything over Slack's limits
    page = page_of(h.em)
    assert len(page.blocks) <= 50 and page.labels[0] == "✔ Ack"


async def test_notify_test_names_each_problem(h: Harness, tmp_path: Path) -> None:
    h.em.channels[OTHER_CHAN]["member"] = False
    results = await h.transport.check("hello <world>")
    assert [(r.what, r.ok) for r in results] == [
        ("bot token", True),
        ("scopes", True),
        (f"channel {CHAN}", True),
        (f"channel {OTHER_CHAN}", False),
    ]
    assert "not a member of the channel" in results[3].detail
    assert h.em.bot_messages(CHAN)[-1].text == "hello &lt;world&gt;"
    del h.em.channels[CHAN]
    assert "unknown channel" in (await h.transport.check("x"))[2].detail
    h.em.scopes = "chat:write"
    assert (
        "missing permission: files:write (pictures and long reports)"
        in (await h.transport.check("x"))[1].detail
    )

    bot = tmp_path / "bot"
    bot.write_text("xoxb-wrong\n")
    app = tmp_path / "app"
    app.write_text(h.em.bot_token + "\n")  # a bot token where the app-level token belongs
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{tmp_path}/st"\n[notifiers.console]\nstream = "stdout"\n'
        f'[notifiers.slack]\nenabled = true\ntoken_file = "{bot}"\napp_token_file = "{app}"\n'
        f'channel_ids = ["{OTHER_CHAN}"]\napi_base_url = "{h.em.base_url}"\n'
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
    assert (
        rc == 1
        and "slack      bot token              FAIL  bad token: Slack rejected it (invalid_auth)" in out
    ), out
    assert "console    send                   ok" in out
    bot.write_text(h.em.bot_token + "\n")
    rc, out = await cli()
    assert rc == 1 and "missing permission: files:write" in out
    assert "app-level token        FAIL  not an app-level token" in out
    assert f"channel {OTHER_CHAN}" in out and "not a member of the channel" in out
    h.em.scopes = "chat:write,files:write,commands,app_mentions:read"
    h.em.channels[OTHER_CHAN]["member"] = True
    app.write_text(h.em.app_token + "\n")
    rc, out = await cli()
    assert rc == 0 and "notify-test: 5 ok, 0 failed" in out, out
    assert h.em.bot_token not in out and h.em.app_token not in out


async def test_a_bad_token_waits_in_the_outbox_and_is_never_logged(
    slack: SlackEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = "xoxb-999-888-a-token-slack-does-not-know"
    settings = SlackSettings(
        bot_token=wrong,
        app_token=slack.app_token,
        channel_ids=(CHAN,),
        default_channel=CHAN,
        api_base_url=slack.base_url,
    )
    assert wrong not in repr(settings) and slack.app_token not in repr(settings)
    pipeline = AlertPipeline.open(tmp_path, IncidentsConfig(), ["slack"])
    transport = SlackTransport(settings, MessageStore(pipeline.store))
    await transport.start()
    try:
        await until(lambda: slack.calls_of("auth.test"), "a connection attempt")
        await until(lambda: transport._connect_error, "the failure noted")
        assert transport._connect_error == "bad token: Slack rejected it (invalid_auth)"
        dispatcher = Dispatcher(pipeline.outbox, [transport], policy=RetryPolicy(initial=60))
        pipeline.notice("n", "hello", "x", T0)
        assert (await dispatcher.drain()).failed == 1
        error = pipeline.store.conn.execute("SELECT last_error FROM deliveries").fetchone()[0]
        assert "not connected yet (bad token" in error and wrong not in error
        assert slack.calls_of("apps.connections.open") == []  # no socket before the bot token works
    finally:
        await transport.stop()
        pipeline.close()
    out = capsys.readouterr()
    assert "slack_connect_failed" in out.out + out.err
    assert wrong not in out.out + out.err and slack.app_token not in out.out + out.err


def test_the_registry_reads_both_tokens_from_systemd_credentials(tmp_path: Path) -> None:
    from jobdiagd.config import loads
    from jobdiagd.notifiers.registry import build_notifiers

    cfg = loads(
        f'[daemon]\nstate_dir = "{tmp_path}"\n[notifiers.slack]\nenabled = true\n'
        "token_credential = 'slack-bot'\napp_token_credential = 'slack-app'\nchannel_ids = ['C1', 'C2']\n"
        "default_channel = 'C2'\n[[notifiers.slack.routes]]\nchannel = 'C1'\nowners = ['alice']\n",
        source="t.toml",
    )
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "slack-bot").write_text("xoxb-1\n")
    env = {"CREDENTIALS_DIRECTORY": str(creds)}
    notifiers, skipped = build_notifiers(cfg, env=env)
    assert [n.name for n in notifiers] == ["console"]
    assert skipped == [
        "slack: no app-level token (credential 'slack-app' missing or empty; or set commands = false)"
    ]
    (creds / "slack-app").write_text("xapp-1\n")
    notifiers, skipped = build_notifiers(cfg, env=env)
    assert skipped == [] and [n.name for n in notifiers] == ["console", "slack"]
    transport = notifiers[1]
    assert isinstance(transport, SlackTransport)
    s = transport.settings
    assert (s.bot_token, s.app_token, s.default_channel) == ("xoxb-1", "xapp-1", "C2")
    assert s.routes == (Route("C1", owners=frozenset({"alice"})),)


def test_text_typed_in_slack_is_read_back_as_plain_text() -> None:
    assert from_slack_text("<@U0BOT0001> triage 123") == "triage 123"
    assert from_slack_text("<@U0BOT0001|jobdiagd>  <@U0X> status") == "status"
    assert from_slack_text("triage /outputs/a&amp;b/&lt;x&gt;.log") == "triage /outputs/a&b/<x>.log"
    assert (
        from_slack_text("compare <http://a.example|a.example> <mailto:x@y>") == "compare a.example mailto:x@y"
    )


def test_retry_after_header_is_read_in_seconds() -> None:
    assert retry_after_s({"Retry-After": "30"}) == 30.0
    assert retry_after_s({"retry-after": ["7"]}) == 7.0
    assert retry_after_s({"Retry-After": "soon"}) is None
    assert retry_after_s({}) is None


async def test_a_page_delivered_late_dates_its_numbers_in_its_lead(
    slack: SlackEmulator, tmp_path: Path
) -> None:
    h = await make(slack, tmp_path, page_mention="<!here>", tz=UTC)
    try:
        slack.fail("chat.postMessage", "internal_error", status=503)  # Slack down at first
        finding = Finding(
            "hang",
            "123",
            "hang",
            "critical",
            "no training step for 25m 0s since step 41 was read",
            {"triage": "Training stopped advancing at step 41.", "stalled for": "25m 0s", "last step": 41},
            at_step=41,
        )
        h.pipeline.observe([finding], h.now)
        assert await h.deliver() == (0, 1)
        h.clock[0] += 300
        assert await h.deliver() == (1, 0)
        page = page_of(slack)
        lead = [b["text"]["text"] for b in page.blocks if b["type"] == "section"][0]
        assert lead.splitlines() == [
            "Training stopped advancing at step 41.",
            "*Stalled for 25m 0s* — as of 12:00 UTC",
            "Last step 41",
        ]
        assert page.text.startswith("<!here>")  # late, the page still rings
    finally:
        await h.transport.stop()
        h.pipeline.close()


async def test_a_report_with_a_picture_is_its_message_then_the_file_in_the_channel(h: Harness) -> None:
    rendered: list[object] = []

    async def render(payload: object) -> list[bytes]:
        rendered.append(payload)
        return [PNG]

    h.transport.render_plot = render  # type: ignore[assignment]
    plot = {"type": "goodput_chart/1", "spec": {}}
    title = "Goodput, week to 2026-03-02"
    h.pipeline.report("", "goodput-digest", "2026-W10", title, "**Where**\n- x", h.now, plot=plot)
    (n,) = [d.notification for d in h.pipeline.outbox.due("slack", h.now)]
    await h.transport.send(n)
    await h.transport.send(n)  # a retry after a lost mark posts nothing again, renders nothing
    msg, shared = h.em.bot_messages(CHAN)
    assert title in msg.visible and not msg.files and "<!here>" not in msg.text  # a report: silent
    assert shared.thread_ts is None  # in the channel, beside the text
    (f,) = shared.files
    assert f.filename == "goodput-digest.png" and f.data == PNG and rendered == [plot]
