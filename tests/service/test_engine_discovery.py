"""The engine and its discovery: a slow poll does not hold the tick; job ends need a final Slurm state.

The discovery here is scripted (it stands for squeue, whose real misbehaviour is driven in
test_slurm_faults.py); files, alert store and detectors are the real ones.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.detectors import build
from jobdiagd.model.jobref import JobRef
from jobdiagd.service.discovery import Discovered, NewJob
from jobdiagd.service.engine import Engine
from jobdiagd.sources.slurm import SlurmJob
from tests.helpers.engine import T0, events, make_cfg, outbox
from tests.helpers.joblog import JobLog


class ScriptedDiscovery:
    """Answers from a queue; an answer that is an asyncio.Event makes the poll wait for it."""

    name = "squeue"

    def __init__(self) -> None:
        self.answers: list[Discovered | asyncio.Event] = []
        self.polls = 0

    async def poll(self, now: float, watched: set[str]) -> Discovered | None:
        self.polls += 1
        if not self.answers:
            return None
        answer = self.answers.pop(0)
        if isinstance(answer, asyncio.Event):
            await answer.wait()
            return Discovered()
        return answer

    def dirs(self) -> list[Path]:
        return []


def running(job: JobLog) -> SlurmJob:
    return SlurmJob(job.job_id, job.name, "u", "RUNNING", "p", stdout=str(job.path))


def new(job: JobLog) -> Discovered:
    ref = JobRef(job.job_id, job.name, job.dir, job.dir / "log", "slurm")
    return Discovered(new=[NewJob(job.job_id, ref, running(job))], slurm={job.job_id: running(job)})


def make_engine(state: Path) -> tuple[Engine, ScriptedDiscovery, AlertPipeline]:
    cfg = make_cfg(state)
    pipeline = AlertPipeline.open(state, cfg.incidents, ["jsonl"])
    disc = ScriptedDiscovery()
    return Engine(cfg, pipeline, build(cfg), disc), disc, pipeline


async def test_a_hung_discovery_poll_does_not_hold_file_reading_or_hang_detection(short_tmp: Path) -> None:
    state = short_tmp / "state"
    job = JobLog(short_tmp / "outputs", "8101")
    engine, disc, pipeline = make_engine(state)
    hung = asyncio.Event()
    disc.answers = [new(job), hung]
    await engine.tick(T0)
    assert list(engine.jobs) == ["8101"]
    for k in range(10):
        job.step(k)
    async with asyncio.timeout(30):  # squeue never answers: the tick must not wait for it
        await engine.tick(T0 + 15)
        assert engine.jobs["8101"].view.last_step == 9
        await engine.tick(T0 + 600)  # no step for ten minutes: paged while squeue still hangs
    assert disc.polls == 2 and not hung.is_set()
    assert events(state) == [("open", "hang")]
    hung.set()
    await asyncio.sleep(0.05)  # between ticks, as the daemon's loop does: the poll finishes
    await engine.tick(T0 + 615)  # the late answer is taken, and a new poll starts at once
    assert disc.polls == 3
    await engine.stop_discovery()
    pipeline.close()


async def test_stop_discovery_cancels_a_poll_in_flight(short_tmp: Path) -> None:
    engine, disc, pipeline = make_engine(short_tmp / "state")
    disc.answers = [asyncio.Event()]
    async with asyncio.timeout(30):
        await engine.tick(T0)
    task = engine.feed.task
    assert task is not None and not task.done()
    await engine.stop_discovery()
    assert task.cancelled()
    pipeline.close()


async def test_no_end_report_while_slurm_says_the_job_runs_and_each_real_end_is_sent(short_tmp: Path) -> None:
    state = short_tmp / "state"
    job = JobLog(short_tmp / "outputs", "8102")
    for k in range(3):
        job.step(k)
    engine, disc, pipeline = make_engine(state)
    first_end = replace(running(job), state="CANCELLED", end_time=T0 + 20, exit_signal=15)
    second_end = replace(running(job), state="COMPLETED", end_time=T0 + 90, exit_code=0)
    disc.answers = [
        new(job),
        # A broken answer claiming an end while Slurm's record says RUNNING: refused.
        Discovered(ended={"8102": ("RUNNING", running(job))}),
        Discovered(ended={"8102": ("CANCELLED", first_end)}),
        new(job),  # requeued: the same job id runs again ...
        Discovered(ended={"8102": ("COMPLETED", second_end)}),  # ... and ends again
    ]
    await engine.tick(T0)
    await engine.tick(T0 + 15)
    assert list(engine.jobs) == ["8102"] and events(state) == []
    for t in (30, 45, 60, 75):
        await engine.tick(T0 + t)
    reports = [n for n in outbox(state) if n["event"] == "report"]
    assert [r["id"] for r in reports] == [
        f"report:8102:job-end:end:{int(T0 + 20)}",
        f"report:8102:job-end:end:{int(T0 + 90)}",
    ]
    assert ["[Slurm CANCELLED]" in reports[0]["title"], "[Slurm COMPLETED]" in reports[1]["title"]] == [
        True,
        True,
    ]
    assert engine.jobs == {}
    pipeline.close()
