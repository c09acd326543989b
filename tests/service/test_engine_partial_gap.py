"""File events settle longer before a partial tick once partial ticks read many jobs.

A partial tick costs a fixed amount per job it reads, so 1000 busy jobs read every 2.5 s spent
half the event loop on it. The settle time grows with the jobs the last partial tick read (past
PARTIAL_JOBS_AT_MIN_GAP), capped, and never past the next full tick. Checked on the sleeps the
engine asks for, not timed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from watchfiles import Change

from jobdiagd import clock
from jobdiagd.service.tick_loop import (
    MAX_PARTIAL_GAP_S,
    MIN_PARTIAL_GAP_S,
    PARTIAL_JOBS_AT_MIN_GAP,
    TickLoop,
    partial_gap,
)
from jobdiagd.sources.tail import ChangeWatcher
from tests.helpers.engine import Daemon
from tests.helpers.joblog import JobLog

T0 = 1_780_000_000.0


def test_partial_gap_grows_with_the_jobs_read_past_the_threshold_and_is_capped() -> None:
    assert partial_gap(0) == partial_gap(1) == partial_gap(PARTIAL_JOBS_AT_MIN_GAP) == MIN_PARTIAL_GAP_S
    assert partial_gap(2 * PARTIAL_JOBS_AT_MIN_GAP) == 2 * MIN_PARTIAL_GAP_S
    assert partial_gap(1000) == pytest.approx(MIN_PARTIAL_GAP_S * 1000 / PARTIAL_JOBS_AT_MIN_GAP)
    assert partial_gap(10**6) == MAX_PARTIAL_GAP_S


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="jds-", dir="/tmp") as d:
        yield Path(d)


async def _settle_after_events(loop: TickLoop, watcher: ChangeWatcher, paths: list[str], next_full: float) -> list[float]:
    """The sleeps the engine asks for after file events on `paths` and the partial tick they wake."""
    watcher.record([(Change.modified, p) for p in paths])
    assert watcher.wake.is_set()
    asked: list[float] = []

    async def sleep(seconds: float) -> bool:
        asked.append(seconds)
        return False

    await loop._tick_on_events(clock.wall(), None)
    watcher.record([(Change.modified, paths[0])])  # the next event wakes the pause at once
    await loop._pause(sleep, clock.wall() + 100.0, next_full, None)
    return asked[1:]  # [0]: the wait for an event, cut short by it


async def test_many_jobs_read_by_a_partial_tick_make_the_next_one_settle_longer(work: Path) -> None:
    outputs = work / "outputs"
    outputs.mkdir()
    watcher = ChangeWatcher()
    daemon = Daemon(work / "state", outputs, watcher)
    engine = daemon.engine
    loop = TickLoop(engine)
    jobs = 2 * PARTIAL_JOBS_AT_MIN_GAP
    try:
        logs = [JobLog(outputs, str(300_000 + i), nnodes=1) for i in range(jobs)]
        for log in logs:
            log.step(0, seconds=0.2)
        await engine.tick(T0)
        assert len(engine.jobs) == jobs
        paths = sorted(engine.room._path_jobs)
        far = clock.wall() + 3600.0
        few = await _settle_after_events(loop, watcher, paths[:10], far)
        assert few == [MIN_PARTIAL_GAP_S]
        many = await _settle_after_events(loop, watcher, paths, far)
        assert many == [partial_gap(jobs)] and many[0] == 2 * MIN_PARTIAL_GAP_S
        # Never past the next full tick.
        soon = await _settle_after_events(loop, watcher, paths, clock.wall() + 1.0)
        assert len(soon) == 1 and soon[0] <= 1.0
    finally:
        daemon.close()
