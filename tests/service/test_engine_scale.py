"""The engine with many jobs: work per tick linear in the jobs, catch-up of existing logs by priority.

Real files under an outputs root, the real alert store and detectors, a hand-driven clock.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.alerts.store import DB_NAME
from jobdiagd.detectors import build
from jobdiagd.model.jobref import JobRef
from jobdiagd.service.discovery import Discovered, NewJob, OutputsDiscovery
from jobdiagd.service.engine import Engine
from jobdiagd.sources.slurm import SlurmJob
from jobdiagd.sources.tail import ChangeWatcher
from jobdiagd_sim import lines as L
from tests.helpers.engine import make_cfg

T0 = 1_780_000_000.0


def write_job(outputs: Path, job_id: str, *extra: str) -> Path:
    """A job in the outputs layout (`<id>-<name>.log` and a dir with its `log` link)."""
    name = "JAX-llama3.1-8b-scale"
    log = outputs / f"{job_id}-{name}.log"
    job_dir = outputs / f"{job_id}-{name}"
    job_dir.mkdir(parents=True)
    (job_dir / "log").symlink_to(f"../{log.name}")
    header = L.header_lines(
        job_id=job_id,
        name=name,
        nnodes=2,
        nodelist="node[001-002]",
        jax_port=12321,
        ray_port=None,
        passthrough={"steps": 1000},
        model="llama3.1-8b",
    )
    log.write_text("\n".join([*header, *extra]) + "\n")
    return log


class CountingWatcher(ChangeWatcher):
    """The real watcher (never started here), counting how often its directories are set."""

    def __init__(self) -> None:
        super().__init__()
        self.dir_sets = 0

    def set_dirs(self, dirs: Iterable[Path]) -> None:
        self.dir_sets += 1
        super().set_dirs(dirs)


async def test_jobs_found_in_one_poll_set_the_watched_directories_once(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    logs = {str(9000 + i): write_job(outputs, str(9000 + i)) for i in range(40)}
    cfg = make_cfg(tmp_path / "state")
    pipeline = AlertPipeline.open(tmp_path / "state", cfg.incidents, ["jsonl"])
    watcher = CountingWatcher()
    engine = Engine(cfg, pipeline, build(cfg), OutputsDiscovery([outputs]), watcher=watcher)
    try:
        await engine.tick(T0)
        assert sorted(engine.jobs) == sorted(logs)
        # Once for the whole batch (it was once per job added: quadratic in the jobs found).
        assert watcher.dir_sets == 1
        for key, log in logs.items():
            assert engine.room.jobs_for_paths({str(log)}) == {key}
            assert engine.room.jobs_for_paths({str(log.parent / log.stem / "log")}) == {key}
        await engine.tick(T0 + 15)
        assert watcher.dir_sets == 1  # nothing changed
        stats = engine.tick_stats()  # wall and CPU time of each kind of tick (gc: wall only)
        assert [stats["startup"]["n"], stats["full"]["n"], stats["partial"]["n"]] == [1, 1, 0]
        assert stats["full"]["cpu_p99_ms"] is not None and stats["partial"]["cpu_p99_ms"] is None
        assert "cpu_p99_ms" not in stats["gc"]
    finally:
        await engine.stop_discovery()
        pipeline.close()


def step_lines(first: int, count: int) -> list[str]:
    """MaxText step lines as two `srun -l` tasks print them."""
    out = []
    for n in range(first, first + count):
        f = L.StepFields(step=n, seconds=2.0, tflops=47.0, tokens=3000.0, total_weights=196608, loss=2.5)
        out += [L.srun_prefix(r, 2) + L.step_line(f) for r in range(2)]
    return out


def quiet_for(log: Path, seconds: float) -> None:
    """The log was last written `seconds` ago (what catch-up ranks by, never what judges a hang)."""
    t = log.stat().st_mtime - seconds
    os.utime(log, (t, t))


def outbox(state: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(state / DB_NAME) as c:
        return [json.loads(r[0]) for r in c.execute("SELECT data FROM outbox ORDER BY rowid")]


def pages(state: Path) -> list[tuple[str, str, str]]:
    return [(n["event"], n["kind"], n["job_id"]) for n in outbox(state)]


def make_engine(tmp_path: Path, outputs: Path) -> tuple[Engine, AlertPipeline]:
    cfg = make_cfg(tmp_path / "state")
    pipeline = AlertPipeline.open(tmp_path / "state", cfg.incidents, ["jsonl"])
    engine = Engine(cfg, pipeline, build(cfg), OutputsDiscovery([outputs]))
    engine.room.backlog.inline_bytes = 0  # the first tick reads one job; the rest is the backlog
    return engine, pipeline


async def test_catch_up_reads_the_quietest_job_first_and_loses_no_page(tmp_path: Path) -> None:
    outputs, state = tmp_path / "outputs", tmp_path / "state"
    fresh = write_job(outputs, "9101", *step_lines(0, 20))
    crashed = write_job(
        outputs,
        "9102",
        *step_lines(0, 20),
        L.srun_prefix(1, 2) + "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=9102.0.",
    )
    quiet = write_job(outputs, "9103", *step_lines(0, 20))
    quiet_for(crashed, 1800)
    quiet_for(quiet, 600)
    quiet_for(fresh, 5)
    engine, pipeline = make_engine(tmp_path, outputs)
    try:
        await engine.tick(T0)
        # The job silent for longest is read in the first tick and paged in it ...
        assert [k for k, w in engine.jobs.items() if w.caught_up] == ["9102"]
        assert engine.room.catching_up == 2
        assert pages(state) == [("open", "failure", "9102")]
        # ... the others are not judged before they are read ...
        assert engine.jobs["9101"].view.main is None and engine.jobs["9103"].view.main is None
        # ... and are read next, quietest first, each stamped when its read began.
        assert await engine.room.backlog.read_next(T0 + 1) == "9103"
        assert await engine.room.backlog.read_next(T0 + 2) == "9101"
        assert await engine.room.backlog.read_next(T0 + 3) is None
        assert engine.room.catching_up == 0
        assert {k: w.view.last_step_at for k, w in engine.jobs.items()} == {
            "9101": T0 + 2,
            "9102": T0,
            "9103": T0 + 1,
        }
        await engine.tick(T0 + 15)
        assert {k: w.view.last_step for k, w in engine.jobs.items()} == {"9101": 19, "9102": 19, "9103": 19}
        assert pages(state) == [("open", "failure", "9102")]
        # No step since: both jobs read in the background are paged for the hang, as a job read
        # in the first tick would be (the hang clock runs from when their steps were read).
        await engine.tick(T0 + 600)
        opened = {(kind, job) for event, kind, job in pages(state) if event == "open"}
        assert opened == {("failure", "9102"), ("hang", "9101"), ("hang", "9103")}
    finally:
        await engine.stop_discovery()
        pipeline.close()


async def test_a_job_over_before_its_background_read_gets_no_end_report(tmp_path: Path) -> None:
    outputs, state = tmp_path / "outputs", tmp_path / "state"
    summary = L.job_summary(
        job_id="9202", name="JAX-llama3.1-8b-scale", model="llama3.1-8b", nnodes=2, wall=600, rc=0
    )
    quiet_for(write_job(outputs, "9201", *step_lines(0, 5)), 900)
    write_job(outputs, "9202", *step_lines(0, 5), *summary)
    engine, pipeline = make_engine(tmp_path, outputs)
    try:
        await engine.tick(T0)
        assert engine.room.catching_up == 1 and not engine.jobs["9202"].view.ended
        assert await engine.room.backlog.read_next(T0 + 1) == "9202"
        await engine.tick(T0 + 15)
        # Finished before the daemon watched it (its JOB SUMMARY was there at the first read):
        # dropped without a job-end report, as when it is read in the first tick.
        assert list(engine.jobs) == ["9201"]
        assert [p for p in pages(state) if p[0] == "report"] == []
    finally:
        await engine.stop_discovery()
        pipeline.close()


class ScriptedDiscovery:
    """Stands for squeue: one scripted answer per poll (its real misbehaviour is tested elsewhere)."""

    name = "squeue"

    def __init__(self, answers: list[Discovered]) -> None:
        self.answers = answers

    async def poll(self, now: float, watched: set[str]) -> Discovered | None:
        return self.answers.pop(0) if self.answers else None

    def dirs(self) -> list[Path]:
        return []


async def test_a_job_slurm_ends_before_its_catch_up_is_read_in_that_tick_and_reported(tmp_path: Path) -> None:
    outputs, state = tmp_path / "outputs", tmp_path / "state"
    logs = {
        "9301": write_job(outputs, "9301", *step_lines(0, 5)),
        "9302": write_job(outputs, "9302", *step_lines(0, 5)),
        "9303": write_job(outputs, "9303", *step_lines(0, 5)),
    }
    quiet_for(logs["9301"], 900)
    quiet_for(logs["9303"], 300)  # next in catch-up order, before 9302
    jobs = {
        k: SlurmJob(k, "JAX-llama3.1-8b-scale", "u", "RUNNING", "p", stdout=str(p)) for k, p in logs.items()
    }
    refs = {
        k: JobRef(k, jobs[k].name, p.parent / p.stem, p.parent / p.stem / "log", "slurm")
        for k, p in logs.items()
    }
    ended = replace(jobs["9302"], state="COMPLETED", end_time=T0 + 10, exit_code=0)
    disc = ScriptedDiscovery(
        [
            Discovered(new=[NewJob(k, refs[k], j) for k, j in jobs.items()], slurm=dict(jobs)),
            Discovered(slurm={k: jobs[k] for k in ("9301", "9303")}, ended={"9302": ("COMPLETED", ended)}),
        ]
    )
    cfg = make_cfg(state)
    pipeline = AlertPipeline.open(state, cfg.incidents, ["jsonl"])
    engine = Engine(cfg, pipeline, build(cfg), disc)
    engine.room.backlog.inline_bytes = 0
    try:
        await engine.tick(T0)
        assert engine.room.catching_up == 2 and engine.jobs["9302"].view.main is None
        # No background read happened; Slurm's end makes the tick read the job (out of catch-up
        # order: its end is due now) and report it.
        await engine.tick(T0 + 15)
        assert sorted(engine.jobs) == ["9301", "9303"] and engine.room.catching_up == 1
        assert engine.jobs["9303"].view.main is None  # the ended job took this tick's share
        reports = [n for n in outbox(state) if n["event"] == "report"]
        assert [(r["job_id"], r["id"]) for r in reports] == [
            ("9302", f"report:9302:job-end:end:{int(T0 + 10)}")
        ]
        assert "[Slurm COMPLETED]" in reports[0]["title"]
    finally:
        await engine.stop_discovery()
        pipeline.close()


async def test_the_background_catch_up_reads_only_between_ticks(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    for i in range(3):
        quiet_for(write_job(outputs, str(9501 + i), *step_lines(0, 5)), 60 * (3 - i))
    engine, pipeline = make_engine(tmp_path, outputs)
    try:
        await engine.tick(T0)
        assert engine.room.catching_up == 2
        engine.room.backlog.between_ticks.clear()  # as `_safe_tick` does while a tick runs
        engine.room.backlog.start()
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert engine.room.catching_up == 2  # held while the tick runs ...
        engine.room.backlog.between_ticks.set()
        task = engine.room.backlog._task
        assert task is not None
        await asyncio.wait_for(task, 30)  # ... and done once it is over
        assert engine.room.catching_up == 0
        assert all(w.caught_up and w.view.last_step == 4 for w in engine.jobs.values())
    finally:
        await engine.stop_discovery()
        pipeline.close()
