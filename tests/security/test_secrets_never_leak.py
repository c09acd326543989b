"""Secrets never leave the daemon: planted tokens are absent from every output while sends fail.

A real daemon (`jobdiagd run`, debug logging) holds a Telegram bot token the Telegram emulator
refuses (401, the "bad token" answer), Slack bot and app tokens for an API that is not
listening, and an Alertmanager basic-auth password for an instance that is not listening. A
hung job makes it page through all three, so every send fails and is logged, retried and
recorded. Then everything the daemon wrote or said is searched for each secret (and the
basic-auth header value): its stdout/stderr, every file of its state dir, `jobdiagd status`
(text and JSON) and the triage report of the job.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from jobdiagd_sim import lines as L
from tests.helpers.emulators.telegram import TelegramEmulator

TG_TOKEN = "7012345678:AAH-planted-SECRET-tg-0123456789abcd"
SLACK_TOKEN = "xoxb-1111-2222-plantedSECRETslackBOT"
SLACK_APP_TOKEN = "xapp-1-A111-2222-plantedSECRETslackAPP"
AM_PASSWORD = "planted-SECRET-alertmanager-password"
AM_USER = "jobdiagd"
SECRETS = {
    "telegram token": TG_TOKEN,
    "telegram token secret part": TG_TOKEN.split(":")[1],
    "slack bot token": SLACK_TOKEN,
    "slack app token": SLACK_APP_TOKEN,
    "alertmanager password": AM_PASSWORD,
    "alertmanager basic auth header": base64.b64encode(f"{AM_USER}:{AM_PASSWORD}".encode()).decode(),
}
PY = sys.executable


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="jdsecret-", dir="/tmp") as d:
        yield Path(d)


class RecordingTelegram(TelegramEmulator):
    """The emulator, also noting the token of every request (the control that it was used)."""

    def __init__(self) -> None:
        super().__init__()  # its own token: the daemon's planted one is refused with 401
        self.tokens_seen: set[str] = set()

    async def _handle(self, request: web.Request) -> web.Response:
        self.tokens_seen.add(request.match_info["token"])
        return await super()._handle(request)


@pytest.fixture
async def tg() -> AsyncIterator[RecordingTelegram]:
    em = RecordingTelegram()
    await em.start()
    em.add_chat(-1001)
    try:
        yield em
    finally:
        await em.stop()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again on return: nothing listens there


def hung_job(outputs: Path, job_id: str = "8801", name: str = "JAX-llama3.1-8b-secret") -> None:
    job_dir = outputs / f"{job_id}-{name}"
    job_dir.mkdir(parents=True)
    log = outputs / f"{job_id}-{name}.log"
    (job_dir / "log").symlink_to(f"../{log.name}")
    lines = L.header_lines(
        job_id=job_id, name=name, nnodes=1, nodelist="node001", jax_port=12321, ray_port=None,
        passthrough={"steps": 1000}, model="llama3.1-8b",
    )
    for k in range(8):
        f = L.StepFields(step=k, seconds=0.2, tflops=40.0, tokens=3000.0, total_weights=196608, loss=2.5)
        lines.append(L.srun_prefix(0, 1) + L.step_line(f))
    log.write_text("\n".join(lines) + "\n")


def write_config(work: Path, tg: TelegramEmulator) -> Path:
    secrets = work / "secrets"
    secrets.mkdir(mode=0o700)
    for name, value in (("tg", TG_TOKEN), ("slack", SLACK_TOKEN), ("slack-app", SLACK_APP_TOKEN), ("am", AM_PASSWORD)):
        (secrets / name).write_text(value + "\n")
        os.chmod(secrets / name, 0o600)
    slack_port, am_port = closed_port(), closed_port()
    cfg = work / "cfg.toml"
    cfg.write_text(
        f"""
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jd.sock"
tick_seconds = 0.5
log_level = "debug"
[detectors.hang]
min_stall_seconds = 2
startup_grace_seconds = 60
[delivery]
retry_initial_seconds = 0.2
retry_max_seconds = 1
send_timeout_seconds = 4
[notifiers.console]
enabled = true
stream = "stdout"
color = "never"
[notifiers.jsonl]
enabled = true
[notifiers.telegram]
enabled = true
token_file = "{secrets}/tg"
chat_ids = [-1001]
allowed_users = [501]
api_base_url = "{tg.base_url}"
poll_timeout_seconds = 1
[notifiers.slack]
enabled = true
token_file = "{secrets}/slack"
app_token_file = "{secrets}/slack-app"
channel_ids = ["C0123456789"]
allowed_users = ["U0ALICE01"]
api_base_url = "http://127.0.0.1:{slack_port}/api/"
[notifiers.alertmanager]
enabled = true
urls = ["http://127.0.0.1:{am_port}"]
cluster = "test"
auth = "basic"
username = "{AM_USER}"
secret_file = "{secrets}/am"
timeout_seconds = 1
"""
    )
    return cfg


async def run_cli(*argv: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        PY, "-m", "jobdiagd.cli", *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return out.decode(errors="replace")


@pytest.mark.daemon
async def test_planted_tokens_appear_in_no_output_while_every_send_fails(work: Path, tg: RecordingTelegram) -> None:
    outputs = work / "outputs"
    hung_job(outputs)
    cfg = write_config(work, tg)
    out_path = work / "daemon.out"
    with out_path.open("wb") as out:  # noqa: ASYNC230 (a local file, opened once before the daemon starts)
        proc = await asyncio.create_subprocess_exec(
            PY, "-m", "jobdiagd.cli", "run", "--config", str(cfg), "--watch", str(outputs),
            stdout=out, stderr=asyncio.subprocess.STDOUT,
        )
    status_text = status_json = ""
    try:
        # Wait until the hang was paged on the console and the chat sends failed and were recorded.
        for _ in range(600):
            said = out_path.read_text(errors="replace")
            if all(f in said for f in ("OPEN     hang on job 8801", "InvalidToken", "slack_connect_failed",
                                       "alertmanager_failing")):
                break
            assert proc.returncode is None, said
            await asyncio.sleep(0.2)
        await asyncio.sleep(3)  # a few retries more of each failing send
        status_text = await run_cli("status", "--config", str(cfg))
        status_json = await run_cli("status", "--config", str(cfg), "--json")
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.wait(), 60)
    report = await run_cli("triage", str(outputs / "8801-JAX-llama3.1-8b-secret"), "--no-slurm")

    said = out_path.read_text(errors="replace")
    print(said[-3000:])
    # What was provoked: the hang paged, the planted Telegram token sent and refused (401), Slack and
    # Alertmanager unreachable, each failure logged.
    assert TG_TOKEN in tg.tokens_seen and tg.calls_of("getMe"), tg.tokens_seen
    for fragment in ("OPEN     hang on job 8801", "InvalidToken", "slack_connect_failed", "alertmanager_failing"):
        assert fragment in said, fragment
    assert "8801" in report and "8801" in status_json
    outputs_to_search = {"daemon stdout/stderr": said, "status": status_text, "status --json": status_json,
                         "triage report": report}
    state_files = [p for p in (work / "state").rglob("*") if p.is_file()]
    assert any(p.name.endswith(".sqlite3") for p in state_files) and any(p.suffix == ".jsonl" for p in state_files)
    for path in state_files:
        outputs_to_search[str(path)] = path.read_bytes().decode("latin-1")
    for where, text in outputs_to_search.items():
        for what, secret in SECRETS.items():
            assert secret not in text, f"the {what} is in {where}"
    print(f"searched {len(outputs_to_search)} outputs ({sum(map(len, outputs_to_search.values()))} bytes)"
          f" for {len(SECRETS)} secrets: none found")
