"""Tailing: incremental reads through the pre-filter, a partial last line, persisted offsets."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd.alerts.store import DB_NAME
from jobdiagd.logs.reader import read_file
from jobdiagd.logs.state import LogState
from jobdiagd.sources import tail
from jobdiagd.sources.tail import RESOLVE_EVERY, ChangeWatcher, FileTail, OffsetStore, Saved
from tests.helpers.joblog import JobLog


def test_incremental_tail_builds_the_same_state_as_a_full_read(tmp_path: Path) -> None:
    job = JobLog(tmp_path, "8001")
    ft = FileTail(job.dir / "log", ref_time=0.0)
    for k in range(30):
        job.step(k)
        job.task(1, "node002:1:2 [1] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read")
        if k == 20:
            job.task(0, "node001:1:2 [0] NCCL WARN Timeout waiting for proxy response")
        ft.poll()
    job.summary(1, "Training FAILED (exit=1)")
    ft.poll()
    live = ft.state
    assert live is not None
    full = read_file(job.path, LogState(str(job.path), ref_time=0.0))
    assert [s.step for s in live.sorted_steps()] == [s.step for s in full.sorted_steps()]
    assert {k: v.count for k, v in live.hits.items()} == {k: v.count for k, v in full.hits.items()}
    assert live.summary is not None and full.summary is not None
    assert live.summary.exit_code == full.summary.exit_code == 1
    assert live.header == full.header and live.lines == full.lines


def test_first_read_of_a_file_ending_mid_line_finishes_that_line_later(tmp_path: Path) -> None:
    job = JobLog(tmp_path, "8002", nnodes=1)
    job.step(0)
    with open(job.path, "a") as fh:
        fh.write("0: completed step: 1, seconds: 2.0")  # the writer is mid-line
    ft = FileTail(job.dir / "log", ref_time=0.0)
    ft.poll()
    with open(job.path, "a") as fh:
        fh.write("00, TFLOP/s/device: 1.0, Tokens/s/device: 3000.0, loss: 2.0\n")
    job.step(2)
    ft.poll()
    assert ft.state is not None
    assert [s.step for s in ft.state.sorted_steps()] == [0, 1, 2]
    rec = ft.state.steps.get(1)
    assert rec is not None and rec.seconds == pytest.approx(2.0)


def test_deleted_file_raises_for_the_blind_notice(tmp_path: Path) -> None:
    job = JobLog(tmp_path, "8003")
    ft = FileTail(job.dir / "log", ref_time=0.0)
    ft.poll()
    job.path.unlink()
    with pytest.raises(OSError):
        ft.poll()


def test_offsets_survive_reopening(tmp_path: Path) -> None:
    store = OffsetStore(tmp_path / DB_NAME)
    store.save([Saved("/a/log", "12", 7, 1234, 99, 1.5e9, None)], now=1.0)
    store.close()
    again = OffsetStore(tmp_path / DB_NAME)
    assert again.load("/a/log") == Saved("/a/log", "12", 7, 1234, 99, 1.5e9, None)
    assert again.known_jobs() == {"12"}
    again.forget_job("12")
    assert again.load("/a/log") is None
    again.close()


def test_a_repointed_link_further_down_a_chain_is_followed_within_a_few_polls(tmp_path: Path) -> None:
    first = JobLog(tmp_path, "8004")
    first.step(0)
    second = JobLog(tmp_path, "8005")
    second.step(0)
    second.step(1)
    hop = tmp_path / "current.log"  # job dir `log` -> current.log -> one of the two logs
    hop.symlink_to(first.path.name)
    (first.dir / "log").unlink()
    (first.dir / "log").symlink_to("../current.log")
    ft = FileTail(first.dir / "log", ref_time=0.0)
    ft.poll()
    assert ft.state is not None and ft.state.steps.max_step == 0
    hop.unlink()
    hop.symlink_to(second.path.name)  # the `log` link itself is unchanged
    for _ in range(RESOLVE_EVERY):
        ft.poll()
    assert ft.state.steps.max_step == 1


def test_change_watcher_keeps_what_the_default_filter_keeps_asking_once_per_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from watchfiles import Change, DefaultFilter

    asked: list[str] = []
    real = DefaultFilter()

    def counting(change: Change, path: str) -> bool:
        asked.append(path)
        return real(change, path)

    monkeypatch.setattr(tail, "_default_filter", lambda: counting)
    w = ChangeWatcher()
    log, swap, cache = "/o/1-job.log", "/o/.1-job.log.swp", "/o/__pycache__/x.pyc"
    for _ in range(3):
        w.record({(Change.modified, log), (Change.modified, swap), (Change.modified, cache)})
    w.record({(Change.added, "/o/2-job")})
    assert w.wake.is_set()
    changed, added = w.take()
    assert changed == {log, "/o/2-job"}
    assert added == {"/o/2-job"}
    assert sorted(asked) == sorted([log, swap, cache, "/o/2-job"])  # once per path, not per event
    # A batch of only filtered paths wakes nothing, as watchfiles' own filter did.
    w.record({(Change.modified, swap)})
    assert not w.wake.is_set()
    assert w.take() == (set(), set())


async def test_change_watcher_wakes_on_a_real_write_and_not_on_a_swap_file(tmp_path: Path) -> None:
    import asyncio

    log = tmp_path / "1-job.log"
    log.write_text("start\n")
    w = ChangeWatcher(debounce_ms=50)
    w.set_dirs([tmp_path])
    task = asyncio.ensure_future(w.run())
    try:
        await asyncio.sleep(0.5)  # the watch is set up in a thread
        (tmp_path / ".1-job.log.swp").write_text("editor\n")
        with log.open("a") as fh:
            fh.write("more\n")
        await asyncio.wait_for(w.wake.wait(), 30)
        await asyncio.sleep(0.3)  # the swap file's event may come in a later batch
        changed, _added = w.take()
        assert str(log) in changed
        assert str(tmp_path / ".1-job.log.swp") not in changed
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
