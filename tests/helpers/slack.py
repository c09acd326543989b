"""Slack test helpers: the Slack emulator as a fixture and a daemon config pointing at it (the daemon runner
and the simulated jobs are shared with the Telegram tests, in tests/helpers/chat.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from jobdiagd.service import plots_bridge
from tests.helpers.chat import RunningDaemon, until
from tests.helpers.daemon import chat_daemon_toml
from tests.helpers.emulators.slack import Envelope, Ephemeral, SlackEmulator, SlackMessage

CHAN = "C0OPS0001"
OTHER_CHAN = "C0ELSE001"
FOREIGN_CHAN = "C0FOREIGN"  # the app is a member, but it is not an allowed channel
ALICE = "U0ALICE01"  # allowed user
MALLORY = "U0MALL001"  # not allowed
OPERATOR = "U0OPER001"


@contextlib.asynccontextmanager
async def slack_emulator() -> AsyncIterator[SlackEmulator]:
    """The Slack emulator with the test channels (one the app is in but may not answer) and users."""
    em = SlackEmulator()
    await em.start()
    em.add_channel(CHAN, "ops")
    em.add_channel(OTHER_CHAN, "elsewhere")
    em.add_channel(FOREIGN_CHAN, "random")
    em.add_user(ALICE, "alice")
    em.add_user(MALLORY, "mallory")
    em.add_user(OPERATOR, "olga")
    try:
        yield em
    finally:
        await em.stop()


@pytest.fixture
async def slack() -> AsyncIterator[SlackEmulator]:
    async with slack_emulator() as em:
        yield em


def slack_daemon_config(
    work: Path, em: SlackEmulator, *, extra: str = "", min_stall: float = 3.0, section_extra: str = ""
) -> Path:
    bot = work / "slack-bot-token"
    bot.write_text(em.bot_token + "\n")
    app = work / "slack-app-token"
    app.write_text(em.app_token + "\n")
    cfg = work / "cfg.toml"
    cfg.write_text(
        chat_daemon_toml(work, min_stall=min_stall)
        + f"""[notifiers.slack]
enabled = true
token_file = "{bot}"
app_token_file = "{app}"
channel_ids = ["{CHAN}", "{OTHER_CHAN}"]
allowed_users = ["{ALICE}", "{OPERATOR}"]
operators = ["{OPERATOR}"]
api_base_url = "{em.base_url}"
page_mention = "<!here>"
{section_extra}
{extra}
"""
    )
    return cfg


# -- the shared conversation over Slack (tests/service/test_daemon_chat.py) -----------------------

# How SlackTalk asks a command: these through a slash command (`/jobdiagd TEXT`, or the command of
# their own), every other through a mention (`@jobdiagd TEXT`, answered in its thread), so the
# conversation covers both ways in.
SLASHED = {
    "jobs": ("/jobdiagd", "jobs"),
    "job 7006": ("/job", "7006"),  # a per-command slash command
    "unmute 7006": ("/jobdiagd", "unmute 7006"),
    "triage /etc/passwd": ("/jobdiagd", "triage /etc/passwd"),
    "help": ("/jobdiagd", ""),  # a bare /jobdiagd is help
    "ack 7003": ("/jobdiagd", "ack 7003"),
}


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


def pages(em: SlackEmulator, channel: str = CHAN) -> list[SlackMessage]:
    return [m for m in em.bot_messages(channel) if m.thread_ts is None and "hang on job" in m.visible]


def open_pages(em: SlackEmulator) -> list[SlackMessage]:
    return [m for m in pages(em) if m.buttons]


@dataclass
class SlackTalk:
    """The conversation over Slack: commands are slash commands or mentions (`SLASHED`), every
    envelope is acked before the daemon calls the API, a press is answered to the presser alone
    (an ephemeral), and a message rings when it says <!here> or is broadcast from a thread."""

    em: SlackEmulator
    alice: str = ALICE
    mallory: str = MALLORY
    public: int = 0  # bot messages once the page settled (check_untouched: nothing said in public)
    feedback: list[Ephemeral] = field(default_factory=list)  # the presses' answers, in order

    def config(self, work: Path) -> Path:
        return slack_daemon_config(work, self.em)

    def key(self, m: SlackMessage) -> str:
        return m.ts

    def open_pages(self) -> list[SlackMessage]:
        return open_pages(self.em)

    def all_pages(self) -> list[SlackMessage]:
        return pages(self.em)

    def text(self, m: SlackMessage) -> str:
        return self.em.messages[(m.channel, m.ts)].visible

    def buttons(self, m: SlackMessage) -> list[list[tuple[str, str]]]:
        return self.em.messages[(m.channel, m.ts)].buttons

    def labels(self, m: SlackMessage) -> list[str]:
        return self.em.messages[(m.channel, m.ts)].labels

    def rings(self, m: SlackMessage) -> bool:
        return "<!here>" in m.text or m.reply_broadcast

    def resolve_replies(self, page: SlackMessage) -> list[SlackMessage]:
        return [m for m in self.em.thread(CHAN, page.ts) if m.visible.startswith("resolved:")]

    def said_elsewhere(self) -> list[SlackMessage]:
        return self.em.bot_messages(OTHER_CHAN)

    def answers(self, page: SlackMessage) -> list[SlackMessage]:
        return [m for m in self.em.bot_messages(CHAN) if m.ts != page.ts]

    def fail_sends_once(self) -> None:
        self.em.fail("chat.postMessage", "ratelimited", status=429, retry_after=1)

    def send_attempts(self, job_id: str) -> list[Any]:
        return [c for c in self.em.calls_of("chat.postMessage") if f"hang on job {job_id}" in str(c.params)]

    async def settle(self, page: SlackMessage, d: RunningDaemon) -> None:
        await settled(self.em, page, d)
        self.public = len(self.em.bot_messages())

    async def press(self, page: SlackMessage, user: str, *, label: str = "", data: str = "") -> str:
        await self.em.wait_connected()
        before = len(self.em.ephemerals_for(user))
        await acked(self.em, await self.em.press(CHAN, page.ts, user, data or page.value_of(label)))
        toast: list[Ephemeral] = await until(
            lambda: self.em.ephemerals_for(user)[before:], "the press answered"
        )
        self.feedback.append(toast[0])
        return toast[0].visible

    async def ask(self, text: str, user: str | None = None) -> str:
        if user is not None and user != ALICE:  # refused: said to the asker alone, through response_url
            before = len(self.em.ephemerals_for(user))
            command, arg = SLASHED[text]
            await acked(self.em, await self.em.slash(CHAN, user, arg, command=command))
            refusal: list[Ephemeral] = await until(lambda: self.em.ephemerals_for(user)[before:], "a refusal")
            assert refusal[0].via == "response_url"  # only the asker sees it
            return refusal[0].visible
        if text in SLASHED:
            command, arg = SLASHED[text]
            seen = {m.ts for m in self.em.bot_messages(CHAN)}
            await acked(self.em, await self.em.slash(CHAN, ALICE, arg, command=command))
            got: list[SlackMessage] = await until(
                lambda: [m for m in self.em.bot_messages(CHAN) if m.ts not in seen and m.thread_ts is None],
                f"answer to {command} {arg}",
            )
            return got[0].visible
        env, ts = await self.em.mention(CHAN, ALICE, text)
        await acked(self.em, env)
        said: list[SlackMessage] = await until(
            lambda: self.em.thread(CHAN, ts), f"answer to @jobdiagd {text}"
        )
        return said[0].visible

    async def triage(self, job_id: str, d: RunningDaemon) -> SlackMessage:
        # The daemon has done its first tick (the finished job is not watched: it ended before the
        # daemon started) and has nothing in flight: the calls after the command are its own.
        await until(lambda: d.engine.durations["startup"], "the first tick")
        await until(lambda: d.engine.pipeline.outbox.pending_count() == 0, "deliveries done")
        before = len(self.em.calls_of("chat.postMessage"))
        await acked(self.em, await self.em.slash(CHAN, ALICE, f"triage {job_id}"))

        def answers() -> list[SlackMessage]:
            return [m for m in self.em.bot_messages(CHAN) if f"/jobdiagd triage {job_id}" in m.visible]

        (answer,) = await until(answers, "the working… answer")
        await until(lambda: "Status:" in self.text(answer), "the report edited in")
        first = self.em.calls_of("chat.postMessage")[before]
        assert "working" in first.params["text"]  # the placeholder went out first
        final = self.em.messages[(CHAN, answer.ts)]
        assert "asked by alice" in final.visible
        assert len(answers()) == 1  # edited, never a second message for the same answer
        return final

    async def plot(self, job_id: str) -> None:
        env, ts = await self.em.mention(CHAN, ALICE, f"plot {job_id}")
        await acked(self.em, env)
        placeholder = (await until(lambda: self.em.thread(CHAN, ts), "/plot"))[0]
        if plots_bridge.available():
            pic = await until(lambda: [m for m in self.em.thread(CHAN, ts) if m.files], "the plot")
            data = pic[0].files[0].data
            assert data is not None and data.startswith(b"\x89PNG")
            assert pic[0].files[0].title == f"📈 job {job_id}"
        else:  # a build without the plotting modules says so instead of hanging
            await until(lambda: "not available" in self.text(placeholder), "the answer")

    # -- Slack's own checks ---------------------------------------------------------------------

    async def check_page(self, page: SlackMessage) -> None:
        assert page.text.startswith("<!here>")  # critical: rings the channel
        # The lead first: what happened, the stall, the steps, the next step (rule CHAT-1).
        lead = page.blocks[2]["text"]["text"]
        assert "Training stopped advancing" in lead and "Last step 7 vs expected" in lead and "Next:" in lead
        if plots_bridge.available():  # the plot goes into the page's thread
            pic = await until(lambda: [m for m in self.em.thread(CHAN, page.ts) if m.files], "the plot")
            data = pic[0].files[0].data
            assert data is not None and data.startswith(b"\x89PNG")
            assert "plot in the thread" in self.text(page)

    def check_acked(self, page: SlackMessage) -> None:
        assert self.feedback[-1].via == "response_url"
        assert self.em.calls_of("chat.update")  # edited in place, not reposted

    def check_resolved(self, page: SlackMessage, reply: SlackMessage) -> None:
        assert not reply.reply_broadcast and "<!here>" not in reply.text
        assert len(pages(self.em)) == 1

    async def check_refused_elsewhere(self) -> None:
        with capture_logs() as logs:  # alice, but in a channel off the list: not a word there
            await acked(self.em, await self.em.slash(FOREIGN_CHAN, ALICE, "status"))
            await until(lambda: [e for e in logs if e["event"] == "chat_ignored"], "the command ignored")
        assert self.em.ephemerals_for(ALICE) == []
        before = len(self.em.ephemerals_for(MALLORY))
        mention, _ = await self.em.mention(CHAN, MALLORY, "mute 7003 1d")
        await acked(self.em, mention)
        refused = await until(lambda: self.em.ephemerals_for(MALLORY)[before:], "a refused mention")
        assert refused[0].via == "chat.postEphemeral"

    def check_untouched(self, d: RunningDaemon) -> None:
        assert not d.engine.pipeline.store.conn.execute("SELECT 1 FROM mutes").fetchall()  # nobody muted it
        assert len(self.em.bot_messages()) == self.public  # nothing said in public

    def check_restart(self, page: SlackMessage) -> None:
        updates = [c for c in self.em.calls_of("chat.update") if c.params.get("ts") == page.ts]
        assert updates and all(c.params["channel"] == CHAN for c in updates)
        assert self.em.connections_opened == 2  # one Socket Mode connection per daemon run

    def check_answer(self, command: str, text: str) -> None:
        if command == "jobs":
            assert "`/jobdiagd jobs` asked by alice" not in text and "/jobdiagd jobs asked by alice" in text

    def check_muted(self, page: SlackMessage) -> None:
        assert "🔔 Unmute" in self.labels(page)

    async def more_commands(self, outputs: Path) -> None:
        return None
