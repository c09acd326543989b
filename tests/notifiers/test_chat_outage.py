"""The chat API down for a long outage while alerts pile up, then back: each delivered once, in order.

`jobdiagd run` (a real process, the real python-telegram-bot client) pages a Telegram emulator
that answers every call 502 Bad Gateway for the outage. An hour at the default retry policy
(5 s doubling to 300 s) is about 17 failed attempts at the head of the queue; the test scales
the policy down (0.1 s doubling to 1 s) and keeps the API down until the head has failed at
least that often, while twelve jobs hang, four of them resume and end. When the API answers
again every page, resolution and end report arrives exactly once, in the order the daemon
queued them (its outbox's order), with one "notifier degraded" and one "notifier
recovered" notice (not one per retry), and `jobdiagd status` goes from DEGRADED (notifier
telegram failing) back to OK.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from jobdiagd.alerts.store import DB_NAME
from tests.helpers.emulators.telegram import StoredMessage, TelegramEmulator
from tests.helpers.faults import record_fault, short_dir  # noqa: F401  (fixture)
from tests.helpers.joblog import JobLog

PY = sys.executable
CHAT = 5002  # private: python-telegram-bot holds groups to 20 messages a minute
JOBS = [str(9300 + i) for i in range(12)]
RESUMED = JOBS[:4]
HOUR_OF_RETRIES = 17
NOTICES = ("notifier degraded: telegram", "notifier recovered: telegram")

pytestmark = [pytest.mark.daemon, pytest.mark.timeout(240)]


class FlakyEmulator(TelegramEmulator):
    """Telegram behind a gateway that can be down (502 for every call, as a proxy says it)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.refused = 0

    async def _handle(self, request: web.Request) -> web.Response:
        if self.down:
            self.refused += 1
            return web.Response(status=502, text="<html><body><h1>502 Bad Gateway</h1></body></html>")
        return await super()._handle(request)


@pytest.fixture
async def tg() -> AsyncIterator[FlakyEmulator]:
    em = FlakyEmulator()
    await em.start()
    em.add_chat(CHAT, kind="private", title="oncall")
    try:
        yield em
    finally:
        await em.stop()


def start(work: Path, em: TelegramEmulator) -> subprocess.Popen[bytes]:
    (work / "tg-token").write_text(em.token + "\n")
    cfg = work / "cfg.toml"
    cfg.write_text(
        f"""
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jd.sock"
tick_seconds = 0.5
log_level = "warning"
[slurm]
outputs_roots = ["{work}/outputs"]
[detectors.hang]
min_stall_seconds = 2
startup_grace_seconds = 60
[delivery]
retry_initial_seconds = 0.1
retry_max_seconds = 1
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
[notifiers.telegram]
enabled = true
token_file = "{work}/tg-token"
chat_ids = [{CHAT}]
api_base_url = "{em.base_url}"
commands = false
"""
    )
    with open(work / "daemon.out", "ab") as out:
        return subprocess.Popen(
            [PY, "-m", "jobdiagd.cli", "run", "--config", str(cfg), "--watch", str(work / "outputs")],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def status(work: Path) -> tuple[int, str]:
    out = subprocess.run(
        [PY, "-m", "jobdiagd.cli", "status", "--config", str(work / "cfg.toml")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return out.returncode, out.stdout


def queued(work: Path) -> list[tuple[str, str]]:
    """(job, page|resolve|report) or ("-", notice title) in the daemon's queue order (its outbox)."""
    path = work / "state" / DB_NAME
    if not path.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        rows = [r[0] for r in db.execute("SELECT data FROM outbox ORDER BY created_at, rowid")]
    kinds = {"open": "page", "resolve": "resolve", "report": "report"}
    out = []
    for data in rows:
        n: dict[str, Any] = json.loads(data)
        if n["event"] in kinds:
            out.append((n["job_id"], kinds[n["event"]]))
        elif n["event"] == "notice":
            out.append(("-", n["title"]))
    return out


def delivered(tg: TelegramEmulator) -> list[tuple[str, str]]:
    """(job, page|resolve|report) per message in the chat, in the order they arrived."""

    def body(m: StoredMessage) -> str:
        return m.text or m.caption or ""

    out = []
    for m in sorted(tg.bot_messages(CHAT), key=lambda m: m.message_id):
        text = body(m)
        job = next((j for j in JOBS if f"job {j}" in text), "?")
        notice = next((t for t in NOTICES if t in text.split("\n", 1)[0]), None)
        if notice is not None:
            out.append(("-", notice))
        elif "hang on job" in text and m.reply_to is None:
            out.append((job, "page"))
        elif text.startswith("resolved:"):
            out.append((job, "resolve"))
        else:
            out.append((job, "report"))
    return out


async def until(pred: Any, what: str, within: float = 90.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def test_a_long_chat_outage_delivers_every_alert_once_in_order(
    short_dir: Path,  # noqa: F811 - the fixture
    tg: FlakyEmulator,
) -> None:
    work = short_dir
    (work / "outputs").mkdir()
    daemon = start(work, tg)
    try:
        await until(lambda: tg.calls_of("getMe"), "the bot connected")
        tg.down = True
        jobs = {}
        for job_id in JOBS:
            jobs[job_id] = JobLog(work / "outputs", job_id)
            for k in range(8):
                jobs[job_id].step(k, seconds=0.2)
            await asyncio.sleep(0.3)
        await until(
            lambda: len([q for q in queued(work) if q[1] == "page"]) == len(JOBS), "every hang queued"
        )
        for job_id in RESUMED:
            jobs[job_id].step(8, seconds=5.0)
            jobs[job_id].summary(0)
        incidents = len(JOBS) + 2 * len(RESUMED)
        await until(
            lambda: len([q for q in queued(work) if q[0] != "-"]) == incidents, "resolutions and reports"
        )
        await until(lambda: tg.refused >= HOUR_OF_RETRIES, f"{HOUR_OF_RETRIES} refused attempts", within=120)
        # One notice of the outage (in the JSONL now, in the chat once it is back), not one per retry.
        await until(lambda: ("-", NOTICES[0]) in queued(work), "the degraded notice")
        rc, text = await asyncio.to_thread(status, work)
        assert rc == 1 and "notifier telegram failing" in text, text
        assert tg.bot_messages(CHAT) == []
        refused = tg.refused

        tg.down = False
        await until(lambda: ("-", NOTICES[1]) in queued(work), "the recovered notice")
        want = queued(work)
        await until(lambda: len(delivered(tg)) >= len(want), "everything delivered")
        await asyncio.sleep(2)  # a repeat would come now
        got = delivered(tg)
        assert got == want, (got, want)
        assert [q for q in want if q[0] == "-"] == [("-", NOTICES[0]), ("-", NOTICES[1])]
        assert len(set(got)) == len(got)
        await until(lambda: status(work)[0] == 0, "status OK again", within=30)
        daemon.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(daemon.wait, 30) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
    record_fault(
        "chat API down for a simulated hour",
        injected=f"every Telegram call answered 502 until {refused} calls were refused (an hour at the "
        f"default retry policy is ~{HOUR_OF_RETRIES} attempts); 12 jobs hung, 4 resumed and ended meanwhile",
        daemon="kept the notifications in the outbox, retried the head with capped backoff; one "
        "'notifier degraded' notice during the outage and one 'notifier recovered' after it (to every "
        "notifier: the JSONL at once, the chat once back); status DEGRADED (notifier telegram failing), then OK",
        delivered=f"{len(got)} of {len(want)} queued, each once, in queue order",
        figures={"queued": len(want), "delivered": len(got), "duplicated": len(got) - len(set(got))},
    )


async def test_a_429_storm_delays_pages_but_delivers_each_once_in_order(
    short_dir: Path,  # noqa: F811 - the fixture
    tg: FlakyEmulator,
) -> None:
    work = short_dir
    (work / "outputs").mkdir()
    daemon = start(work, tg)
    storm = 10
    try:
        await until(lambda: tg.calls_of("getMe"), "the bot connected")
        # Every message call refused with "retry after 1 s", ten times in a row per method.
        for method in ("sendMessage", "sendPhoto"):
            tg.fail(method, 429, "Too Many Requests: retry after 1", retry_after=1, times=storm)
        for job_id in JOBS[:6]:
            job = JobLog(work / "outputs", job_id)
            for k in range(8):
                job.step(k, seconds=0.2)
        await until(lambda: len([q for q in queued(work) if q[1] == "page"]) == 6, "six hangs queued")
        # Refused for longer than the backoff cap (1 s here): told once, and once it is over.
        await until(lambda: ("-", NOTICES[1]) in queued(work), "the recovered notice", within=120)
        await until(lambda: len(delivered(tg)) >= len(queued(work)), "everything delivered")
        await asyncio.sleep(2)  # a repeat would come now
        want, got = queued(work), delivered(tg)
        assert got == want, (got, want)
        assert len(set(got)) == len(got)
        assert [q for q in want if q[0] == "-"] == [("-", NOTICES[0]), ("-", NOTICES[1])]
        sends = [c for c in tg.calls if c.method in ("sendMessage", "sendPhoto")]
        daemon.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(daemon.wait, 30) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
    record_fault(
        "429 storm from Telegram",
        injected=f"sendMessage and sendPhoto each answered 429 (retry after 1 s) {storm} times in a row "
        "while six jobs hung",
        daemon="waited retry_after before each new attempt, kept the queue's order; one 'notifier "
        "degraded' and one 'notifier recovered' notice",
        delivered=f"{len(got)} of {len(want)} queued, each once, in queue order",
        figures={"send_calls": len(sends), "delivered": len(got), "duplicated": len(got) - len(set(got))},
    )
