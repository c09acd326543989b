"""Many jobs found in one discovery pass: the file watcher's dirs are recomputed once, not per job.

Recomputing them walks every watched job's files (realpath on each): once per new job made
500 jobs appearing at once one 15-second tick that held the event loop (no reading, no status
answers). Counted here as calls, not timed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobdiagd.sources.tail import ChangeWatcher
from tests.helpers.engine import Daemon
from tests.helpers.joblog import JobLog

T0 = 1_780_000_000.0


class CountingWatcher(ChangeWatcher):
    def __init__(self) -> None:
        super().__init__()
        self.set_dirs_calls = 0

    def set_dirs(self, dirs: set[Path]) -> None:
        self.set_dirs_calls += 1
        super().set_dirs(dirs)


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="jds-", dir="/tmp") as d:
        yield Path(d)


async def test_five_hundred_new_jobs_update_the_watched_dirs_once(work: Path) -> None:
    outputs = work / "outputs"
    outputs.mkdir()
    watcher = CountingWatcher()
    daemon = Daemon(work / "state", outputs, watcher)
    engine = daemon.engine
    try:
        await engine.tick(T0)
        for i in range(500):
            JobLog(outputs, str(200_000 + i), nnodes=1).step(0, seconds=0.2)
        before = watcher.set_dirs_calls
        await engine.tick(T0 + 1)
        assert len(engine.jobs) == 500
        assert watcher.set_dirs_calls - before == 1
        # Every job's files are still watched: its log's dir and its job dir.
        assert {str(outputs / f"{200_000 + i}-JAX-llama3.1-8b-test" / "log") for i in range(500)} <= set(
            engine.room._path_jobs
        )
    finally:
        daemon.close()
