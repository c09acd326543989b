"""A real daemon with a chat transport in tests: its config, start, and waiting for what it posts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.service.engine import Engine
from jobdiagd.service.lifecycle import Lifecycle
from jobdiagd.service.runner import DiscoverMode, run_daemon
from tests.helpers.daemon import chat_daemon_toml
from tests.helpers.emulators.telegram import TelegramEmulator
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


@pytest.fixture
async def tg() -> AsyncIterator[TelegramEmulator]:
    """The Telegram Bot API emulator, serving the two test chats."""
    em = TelegramEmulator()
    await em.start()
    em.add_chat(CHAT)
    em.add_chat(OTHER_CHAT, title="elsewhere")
    try:
        yield em
    finally:
        await em.stop()
