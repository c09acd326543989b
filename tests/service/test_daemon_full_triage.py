"""Full triage of a paged hang agrees with the page (rules VIEW-1 to VIEW-4), end to end.

A real daemon in-process against the Telegram emulator, a simulated job that hangs, a tuned
`min_stall_seconds`: after the page, the on-call presses 📋 Full triage and asks `/job ID`, at
+10 s and at +150 s — before and after the 120 s at which `jobdiagd triage`'s built-in policy
would flip its own answer (running, then unknown-death or a 2 min budget). Every answer must say
what the page says: hanging, primary hang, the page's budget. Once with the job found through
`--watch` (no Slurm), once through squeue on the real Slurm cluster.

Waiting 150 s is stood in for by moving the daemon's clock (`jobdiagd.clock`, its only reader
of the real clock) 140 s ahead after the first answers: every reader of the daemon's time, and
the triage worker it starts (`--now`), then stand 150 s after the page, and the job's log — its
lines stamped on the real clock — is 150 s old, as it would be. No answer is timed by a sleep.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobdiagd import clock
from jobdiagd_sim import lines as L
from jobdiagd_sim import live
from tests.helpers.chat import ALICE, CHAT, daemon_config, start_daemon, until
from tests.helpers.emulators.telegram import StoredMessage, TelegramEmulator
from tests.helpers.joblog import JobLog
from tests.helpers.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.daemon

MIN_STALL = 5.0  # tuned: the page comes 5 s after the last step, not the default 120 s
BUDGET_RE = re.compile(r"budget (\d[^,]*), phase (\w+)")


class _LaterClock:
    """`time` as `jobdiagd.clock` reads it, `offset` seconds ahead on the wall clock."""

    monotonic = staticmethod(time.monotonic)
    thread_time = staticmethod(time.thread_time)
    _real = staticmethod(time.time)

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return self._real() + self.offset


@pytest.fixture
def later(monkeypatch: pytest.MonkeyPatch) -> Iterator[_LaterClock]:
    shifted = _LaterClock()
    monkeypatch.setattr(clock, "time", shifted)
    yield shifted


def _body(m: StoredMessage) -> str:
    return m.text or m.caption or ""


def _page(tg: TelegramEmulator, job_id: str) -> StoredMessage | None:
    return next(
        (m for m in tg.bot_messages(CHAT) if _body(m).startswith(f"🔴 hang on job {job_id}") and m.buttons),
        None,
    )


async def _full_triage(tg: TelegramEmulator, page: StoredMessage) -> str:
    """Press 📋 Full triage; the report as the chat shows it (the message, or its attached file)."""
    data = next(d for row in page.buttons for label, d in row if label == "📋 Full triage")
    before = set(tg.messages)
    await tg.press(CHAT, page.message_id, ALICE, data)

    def new() -> list[StoredMessage]:
        return [m for k, m in tg.messages.items() if k not in before and m.from_bot]

    (answer,) = await until(
        lambda: [m for m in new() if "Status:" in _body(m)], "the triage answer edited in", within=60
    )
    if "Full report attached" not in _body(answer):
        return _body(answer)
    (doc,) = await until(lambda: [m for m in new() if m.document is not None], "the report file")
    assert doc.document is not None
    return _body(answer) + "\n" + doc.document[1].decode()


async def _job(tg: TelegramEmulator, job_id: str) -> str:
    cmd = await tg.send_command(CHAT, ALICE, f"/job {job_id}")
    (reply,) = await until(lambda: [m for m in tg.bot_messages(CHAT) if m.reply_to == cmd], "the /job answer")
    return _body(reply)


def _agrees(page: str, report: str, job: str) -> str:
    """The triage and /job say the page's status and budget; returns status + primary + budget."""
    m = BUDGET_RE.search(page)
    assert m is not None, page
    budget = m.group(0)  # "budget 5s, phase steady", as the page words it
    assert "Status: hanging" in report and "Primary failure: hang" in report, report
    assert f"(the daemon's clock: {budget})" in report, report
    assert "triage: hanging, primary hang — no step for" in job and f"({budget})" in job, job
    return f"Status: hanging · Primary failure: hang · {budget}"


async def _ask_twice(tg: TelegramEmulator, later: _LaterClock, job_id: str) -> dict[int, str]:
    page = await until(lambda: _page(tg, job_id), "the hang page", within=120)
    answers: dict[int, str] = {}
    for after, move in ((10, 10.0), (150, 140.0)):
        later.offset += move
        report = await _full_triage(tg, page)
        answers[after] = _agrees(_body(page), report, await _job(tg, job_id))
    return answers


def _dated_hung_job(outputs: Path, job_id: str) -> JobLog:
    """8 steps stamped now on the real clock (as MaxText's absl lines are), then silence."""
    job = JobLog(outputs, job_id)
    for k in range(8):
        f = L.StepFields(step=k, seconds=0.2, tflops=47.0, tokens=3000.0, total_weights=196608, loss=2.5)
        for r in range(job.nnodes):
            job.task(r, L.absl_prefix(time.time(), 130000 + r, "metric_logger.py:232") + L.step_line(f))
    return job


async def test_full_triage_of_a_watched_hang_says_what_the_page_says(
    short_tmp: Path, tg: TelegramEmulator, later: _LaterClock, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs = short_tmp / "outputs"
    _dated_hung_job(outputs, "7031")
    d = await start_daemon(daemon_config(short_tmp, tg, min_stall=MIN_STALL), outputs)
    try:
        answers = await _ask_twice(tg, later, "7031")
    finally:
        await d.stop()
    with capsys.disabled():
        print(f"\n--watch: {answers}")


async def test_full_triage_of_a_slurm_hang_says_what_the_page_says(
    slurm_cluster: SlurmCluster,
    short_tmp: Path,
    tg: TelegramEmulator,
    later: _LaterClock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    outputs = short_tmp / "outputs"
    outputs.mkdir()
    outputs.chmod(0o777)
    cfg = daemon_config(short_tmp, tg, min_stall=MIN_STALL)
    text = cfg.read_text()
    text = text.replace("[daemon]\n", "[daemon]\nsqueue_interval_seconds = 1\n", 1)
    text = text.replace("[slurm]\n", f'[slurm]\nbackend = "cli"\nslurm_conf = "{slurm_cluster.conf}"\n', 1)
    cfg.write_text(text)
    job_id = ""
    d = await start_daemon(cfg, outputs, discover="slurm")
    try:
        job_id = slurm_cluster.sbatch(
            f"--export=ALL,SIM_PYTHON={sys.executable}",
            "--job-name=JAX-llama3.1-8b-view",
            f"--output={outputs}/%j-%x.log",
            "--ntasks=2",
            "--overcommit",
            str(Path(live.__file__).with_name("slurm_job.sh")),
            str(outputs),
            "--steps",
            "300",
            "--step-time",
            "0.3",
            "--hang-after",
            "12",
            "--compile-time",
            "0.2",
        )
        answers = await _ask_twice(tg, later, job_id)
        # The job-end report: the same Slurm state and policy (a scancel after a 5 s-budget stall).
        slurm_cluster.scancel(job_id)
        end = await until(
            lambda: next((m for m in tg.bot_messages(CHAT) if f"job {job_id} ended" in _body(m)), None),
            "the job-end report",
            within=120,
        )
        assert "cancelled (primary hang)" in _body(end) and "[Slurm CANCELLED]" in _body(end), _body(end)
    finally:
        if job_id and slurm_cluster.state(job_id) not in ("CANCELLED", "COMPLETED", "FAILED", None):
            slurm_cluster.scancel(job_id)
        await d.stop()
    with capsys.disabled():
        print(f"\nsqueue: {answers}")
