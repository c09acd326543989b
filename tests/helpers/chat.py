"""A real daemon with a chat transport in tests: its config, start, and waiting for what it posts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from jobdiagd.service import plots_bridge
from jobdiagd.service.engine import Engine
from jobdiagd.service.lifecycle import Lifecycle
from jobdiagd.service.runner import DiscoverMode, run_daemon
from jobdiagd.service.status_cli import PHONE_COLUMNS
from tests.helpers.daemon import chat_daemon_toml
from tests.helpers.emulators.telegram import StoredMessage, TelegramEmulator
from tests.helpers.joblog import JobLog
from tests.helpers.services import require_service

CHAT = -1001


OTHER_CHAT = -1002


ALICE = 501  # allowed user


MALLORY = 666  # not allowed


OPERATOR = 777


def daemon_config(work: Path, em: TelegramEmulator, *, extra: str = "", min_stall: float = 3.0) -> Path:
    token = work / "tg-token"
    token.write_text(em.token + "\n")
    cfg = work / "cfg.toml"
    cfg.write_text(
        chat_daemon_toml(work, min_stall=min_stall)
        + f"""[notifiers.telegram]
enabled = true
token_file = "{token}"
chat_ids = [{CHAT}, {OTHER_CHAT}]
allowed_users = [{ALICE}, {OPERATOR}]
operators = [{OPERATOR}]
api_base_url = "{em.base_url}"
poll_timeout_seconds = 1
{extra}
"""
    )
    return cfg


@dataclass
class RunningDaemon:
    task: asyncio.Task[None]
    lc: Lifecycle
    engine: Engine
    errors: list[BaseException] = field(default_factory=list)

    async def stop(self) -> None:
        self.lc.request_stop("test done")
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 30)


async def start_daemon(cfg: Path, outputs: Path, *, discover: DiscoverMode = "outputs") -> RunningDaemon:
    """`discover="outputs"` watches `outputs` (`--watch`); "slurm" finds jobs through squeue."""
    require_service("daemon", "the daemon (run_daemon, in-process)")
    got: dict[str, Any] = {}
    ready = asyncio.Event()

    def started(lc: Lifecycle, engine: Engine) -> None:
        got["lc"], got["engine"] = lc, engine
        ready.set()

    task = asyncio.get_running_loop().create_task(
        run_daemon(
            cfg,
            discover=discover,
            watch=[outputs] if discover == "outputs" else [],
            handle_signals=False,
            on_started=started,
            configure_logs=False,
        )
    )
    waiter = asyncio.ensure_future(ready.wait())
    done, _ = await asyncio.wait({task, waiter}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()  # raises the start-up error
    assert waiter in done, "daemon did not start"
    return RunningDaemon(task, got["lc"], got["engine"])


async def until(pred: Callable[[], Any], what: str, within: float = 60.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        got = pred()
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def hung_job(outputs: Path, job_id: str = "7001", steps: int = 8) -> JobLog:
    """A job that trained `steps` steps of 0.2 s and then went silent."""
    job = JobLog(outputs, job_id)
    for k in range(steps):
        job.step(k, seconds=0.2)
    return job


@contextlib.asynccontextmanager
async def telegram_emulator() -> AsyncIterator[TelegramEmulator]:
    """The Telegram Bot API emulator, serving the two test chats."""
    em = TelegramEmulator()
    await em.start()
    em.add_chat(CHAT)
    em.add_chat(OTHER_CHAT, title="elsewhere")
    try:
        yield em
    finally:
        await em.stop()


@pytest.fixture
async def tg() -> AsyncIterator[TelegramEmulator]:
    """The Telegram Bot API emulator, serving the two test chats."""
    async with telegram_emulator() as em:
        yield em


# -- one conversation over both transports (tests/service/test_daemon_chat.py) -------------------


def body(m: StoredMessage) -> str:
    return m.text or m.caption or ""


class Talk(Protocol):
    """A chat transport as the shared conversation drives it: how pages are found and read
    (`text`, `labels`, `buttons` read a message's current state, after edits), how a user
    presses a button or asks a command, and, as `check_*`, the transport's own assertions at a
    step of the conversation (Telegram's reply threading and silent flag, Slack's blocks,
    threads, ephemerals and Socket Mode acks). `TelegramTalk` here, `SlackTalk` in
    tests/helpers/slack.py."""

    alice: Any
    mallory: Any

    def config(self, work: Path) -> Path: ...
    def key(self, m: Any) -> Any: ...
    def open_pages(self) -> list[Any]: ...
    def all_pages(self) -> list[Any]: ...
    def text(self, m: Any) -> str: ...
    def labels(self, m: Any) -> list[str]: ...
    def buttons(self, m: Any) -> list[list[tuple[str, str]]]: ...
    def rings(self, m: Any) -> bool: ...
    def resolve_replies(self, page: Any) -> list[Any]: ...
    def said_elsewhere(self) -> list[Any]: ...
    def answers(self, page: Any) -> list[Any]: ...
    def fail_sends_once(self) -> None: ...
    def send_attempts(self, job_id: str) -> list[Any]: ...
    async def settle(self, page: Any, d: RunningDaemon) -> None: ...
    async def press(self, page: Any, user: Any, *, label: str = "", data: str = "") -> str: ...
    async def ask(self, text: str, user: Any = None) -> str: ...
    async def triage(self, job_id: str, d: RunningDaemon) -> Any: ...
    async def plot(self, job_id: str) -> None: ...
    async def check_page(self, page: Any) -> None: ...
    def check_acked(self, page: Any) -> None: ...
    def check_resolved(self, page: Any, reply: Any) -> None: ...
    async def check_refused_elsewhere(self) -> None: ...
    def check_untouched(self, d: RunningDaemon) -> None: ...
    def check_restart(self, page: Any) -> None: ...
    def check_answer(self, command: str, text: str) -> None: ...
    def check_muted(self, page: Any) -> None: ...
    async def more_commands(self, outputs: Path) -> None: ...


@dataclass
class TelegramTalk:
    """The conversation over Telegram: a command is a `/name args` message answered by a reply
    to it, a press is a callback query answered with a toast (a pop-up for a refusal), and a
    message rings unless it was sent silently."""

    em: TelegramEmulator
    alice: int = ALICE
    mallory: int = MALLORY

    def config(self, work: Path) -> Path:
        return daemon_config(work, self.em)

    def key(self, m: StoredMessage) -> int:
        return m.message_id

    def current(self, m: StoredMessage) -> StoredMessage:
        return self.em.messages[(CHAT, m.message_id)]

    def replies_to(self, mid: int) -> list[StoredMessage]:
        return [m for m in self.em.bot_messages(CHAT) if m.reply_to == mid]

    def open_pages(self) -> list[StoredMessage]:
        return [m for m in self.em.bot_messages(CHAT) if "hang on job" in body(m) and m.buttons]

    def all_pages(self) -> list[StoredMessage]:
        return [m for m in self.em.bot_messages(CHAT) if body(m).startswith(("🔴 hang", "✅ hang"))]

    def text(self, m: StoredMessage) -> str:
        return body(self.current(m))

    def buttons(self, m: StoredMessage) -> list[list[tuple[str, str]]]:
        return self.current(m).buttons

    def labels(self, m: StoredMessage) -> list[str]:
        return [label for row in self.buttons(m) for label, _ in row]

    def rings(self, m: StoredMessage) -> bool:
        return not m.silent

    def resolve_replies(self, page: StoredMessage) -> list[StoredMessage]:
        return self.replies_to(page.message_id)

    def said_elsewhere(self) -> list[StoredMessage]:
        return self.em.bot_messages(OTHER_CHAT)

    def answers(self, page: StoredMessage) -> list[StoredMessage]:
        return [m for m in self.em.bot_messages(CHAT) if m.message_id != page.message_id]

    def fail_sends_once(self) -> None:
        self.em.fail("sendMessage", 429, "Too Many Requests: retry after 1", retry_after=1)
        self.em.fail("sendPhoto", 429, "Too Many Requests: retry after 1", retry_after=1)

    def send_attempts(self, job_id: str) -> list[Any]:
        sends = ("sendMessage", "sendPhoto")
        return [c for c in self.em.calls if c.method in sends and f"hang on job {job_id}" in str(c.params)]

    async def settle(self, page: StoredMessage, d: RunningDaemon) -> None:
        return None  # the picture is the page's own photo: out with it

    async def press(self, page: StoredMessage, user: int, *, label: str = "", data: str = "") -> str:
        data = data or next(d for row in page.buttons for lb, d in row if lb == label)
        name = "alice" if user == ALICE else "mallory"
        qid = await self.em.press(CHAT, page.message_id, user, data, name=name)
        answer: dict[str, Any] = await until(lambda: self.em.answer_for(qid), f"the press of {data} answered")
        if user == MALLORY:
            assert answer["show_alert"]  # the stranger's refusal pops up
        return str(answer["text"])

    async def ask(self, text: str, user: int | None = None) -> str:
        user = user or ALICE
        name = "alice" if user == ALICE else "mallory"
        mid = await self.em.send_command(CHAT, user, f"/{text}", name=name)
        got = await until(lambda: self.replies_to(mid), f"answer to /{text}")
        if user == MALLORY:
            assert got[0].silent  # a refusal never rings (rule CHAT-3)
        return body(got[0])

    async def long_answer(self, text: str) -> str:
        mid = await self.em.send_command(CHAT, ALICE, f"/{text}")
        first = (await until(lambda: self.replies_to(mid), text))[0]
        await until(lambda: self.current(first).edits, f"result of /{text}")
        return self.text(first)

    async def triage(self, job_id: str, d: RunningDaemon) -> StoredMessage:
        await until(lambda: self.em.calls_of("getUpdates"), "polling")
        cmd = await self.em.send_command(CHAT, ALICE, f"/triage@jobdiagd_bot {job_id}")
        first = (await until(lambda: self.replies_to(cmd), "the working… answer"))[0]
        await until(lambda: "Status:" in self.text(first), "the report edited in")
        # the placeholder went out first, then was edited (never a second message for the same answer)
        sends = [
            c
            for c in self.em.calls_of("sendMessage")
            if c.params.get("reply_parameters", {}).get("message_id") == cmd
        ]
        assert len(sends) == 1 and "working" in sends[0].params["text"]
        return self.current(first)

    async def plot(self, job_id: str) -> None:
        mid = await self.em.send_command(CHAT, ALICE, f"/plot {job_id}")
        placeholder = (await until(lambda: self.replies_to(mid), "/plot"))[0]
        if plots_bridge.available():
            pic = await until(lambda: [m for m in self.replies_to(mid) if m.photo], "the plot")
            photo = pic[0].photo
            assert photo is not None and photo.startswith(b"\x89PNG") and f"job {job_id}" in body(pic[0])
        else:  # a build without the plotting modules says so instead of hanging
            await until(lambda: "not available" in self.text(placeholder), "the answer")

    # -- Telegram's own checks ------------------------------------------------------------------

    async def check_page(self, page: StoredMessage) -> None:
        # The lead first: what happened, the stall, the steps, the next step (rule CHAT-1).
        lead = body(page).split("\n\n")[1].splitlines()
        assert lead[0].startswith("Training stopped advancing at step 7")
        assert lead[-2].startswith("Last step 7 vs expected ≈") and lead[-1].startswith("Next: ")
        if plots_bridge.available():  # the plot is the page's photo
            assert page.photo is not None and page.photo.startswith(b"\x89PNG")

    def check_acked(self, page: StoredMessage) -> None:
        return None

    def check_resolved(self, page: StoredMessage, reply: StoredMessage) -> None:
        assert "resolved" in body(reply)
        assert len([m for m in self.em.bot_messages(CHAT) if "hang on job" in body(m)]) == 2  # page + reply

    async def check_refused_elsewhere(self) -> None:
        return None

    def check_untouched(self, d: RunningDaemon) -> None:
        return None

    def check_restart(self, page: StoredMessage) -> None:
        return None

    def check_answer(self, command: str, text: str) -> None:
        if command == "status":
            assert max(len(line) for line in text.splitlines()[1:]) <= PHONE_COLUMNS  # fits a phone
        elif command == "jobs":
            assert "`7006`" not in text
        elif command == "job 7006":
            assert "log:" in text
        elif command == "help":
            assert "scancel" not in text  # not enabled here

    def check_muted(self, page: StoredMessage) -> None:
        return None

    async def more_commands(self, outputs: Path) -> None:
        (outputs / "9999-escape").symlink_to("/etc")  # an id whose directory leads out of the root
        assert "no 9999-* directory or log" in await self.long_answer("triage 9999")
        assert "no 424242-* directory or log" in await self.long_answer("triage 424242")
