"""Tailing: incremental reads through the pre-filter, a partial last line, persisted offsets."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from jobdiagd.alerts.store import DB_NAME
from jobdiagd.logs.reader import read_file
from jobdiagd.logs.safeopen import LogAccess
from jobdiagd.logs.state import LogState
from jobdiagd.sources import tail
from jobdiagd.sources.tail import (
    RESOLVE_EVERY,
    ChangeWatcher,
    FileTail,
    OffsetStore,
    PrefilterTailReader,
    Saved,
)
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


# -- the descriptor kept open between polls: same reads, same refusals ---------------------


class CountingOpens:
    """Counts the access-checked opens (`LogAccess.open`), which a held descriptor skips."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        real = LogAccess.open

        def counted(access: LogAccess, path: str | os.PathLike[str], *, resolved: bool = False) -> int:
            self.n += 1
            return real(access, path, resolved=resolved)

        monkeypatch.setattr(LogAccess, "open", counted)


def held_tail(outputs: Path, job_id: str) -> tuple[JobLog, FileTail]:
    job = JobLog(outputs, job_id, nnodes=2)
    job.step(0)
    ft = FileTail(job.dir / "log", ref_time=0.0, access=LogAccess.within([outputs]))
    ft.poll()  # the first read (closes its descriptor)
    ft.poll()  # a checked open, kept
    return job, ft


def held_fd(ft: FileTail) -> int | None:
    assert isinstance(ft.reader, PrefilterTailReader)
    return ft.reader._held


def steps_of(ft: FileTail) -> list[int]:
    assert ft.state is not None
    return [s.step for s in ft.state.sorted_steps()]


def test_a_growing_file_is_read_exactly_once_through_the_held_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opens = CountingOpens(monkeypatch)
    job, ft = held_tail(tmp_path, "8101")
    assert held_fd(ft) is not None
    before = opens.n
    for k in range(1, 40):
        job.step(k)
        job.task(1, "node002:1:2 [1] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read")
        if k % 7 == 0:
            with open(job.path, "a") as fh:
                fh.write("1: XLA compil")  # a line finished only by the next write
            ft.poll()
            job.write("ation cache miss for module jit_train_step")
        ft.poll()
    job.summary(0)
    ft.poll()
    assert opens.n == before  # no checked open after the first one: the descriptor was reused
    full = read_file(job.path, LogState(str(job.path), ref_time=0.0))
    assert ft.state is not None
    assert steps_of(ft) == [s.step for s in full.sorted_steps()] == list(range(40))
    assert ft.state.lines == full.lines and ft.state.bytes == full.bytes == job.path.stat().st_size
    assert {k: v.count for k, v in ft.state.hits.items()} == {k: v.count for k, v in full.hits.items()}
    assert ft.state.summary is not None and ft.state.summary.exit_code == 0


def test_a_file_replaced_under_the_same_name_is_read_from_the_start(tmp_path: Path) -> None:
    job, ft = held_tail(tmp_path, "8102")
    for k in range(1, 5):
        job.step(k)
    ft.poll()
    held = tail.HELD.held
    assert held_fd(ft) is not None and steps_of(ft) == [0, 1, 2, 3, 4]
    JobLog(tmp_path / "other", "8102").step(7)  # a new file, then renamed over the old name
    os.replace(tmp_path / "other" / job.path.name, job.path)
    n, replaced = ft.poll()
    assert replaced and n == job.path.stat().st_size
    assert steps_of(ft) == [7]
    assert held_fd(ft) is not None and tail.HELD.held == held  # the old file's descriptor was closed
    job.step(8)
    ft.poll()
    assert steps_of(ft) == [7, 8] and held_fd(ft) is not None


def test_a_truncated_file_is_detected_with_the_descriptor_held(tmp_path: Path) -> None:
    job, ft = held_tail(tmp_path, "8103")
    for k in range(1, 6):
        job.step(k)
    ft.poll()
    assert held_fd(ft) is not None
    # Truncated in place (same inode), rewritten shorter: the offset is past the end.
    with open(job.path, "r+") as fh:
        fh.truncate(0)
    job.write("0: restarted")
    job.step(0)
    _, replaced = ft.poll()
    assert replaced and steps_of(ft) == [0]
    # Truncated and regrown past the old offset between two polls: the head differs.
    size = job.path.stat().st_size
    with open(job.path, "r+") as fh:
        fh.truncate(0)
    job.write("x" * (size + 100))
    job.step(3)
    _, replaced = ft.poll()
    assert replaced and steps_of(ft) == [3]


def test_a_symlink_swapped_in_for_the_held_file_is_refused(tmp_path: Path) -> None:
    outputs, outside = tmp_path / "outputs", tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.log"
    secret.write_text("0: completed step: 999, seconds: 1.0, SECRET\n")
    job, ft = held_tail(outputs, "8104")
    assert held_fd(ft) is not None
    job.path.unlink()
    job.path.symlink_to(secret)
    for _ in range(RESOLVE_EVERY + 1):
        with pytest.raises(OSError):
            ft.poll()
        assert held_fd(ft) is None
    assert steps_of(ft) == [0]  # nothing of the linked file was read


def test_a_directory_on_the_way_swapped_for_a_link_out_of_the_root_is_refused(tmp_path: Path) -> None:
    outputs, outside = tmp_path / "outputs", tmp_path / "outside"
    logs = outputs / "logs"
    logs.mkdir(parents=True)
    (outside / "logs").mkdir(parents=True)
    job = JobLog(outputs, "8105")
    job.step(0)
    os.replace(job.path, logs / job.path.name)
    (job.dir / "log").unlink()
    (job.dir / "log").symlink_to(f"../logs/{job.path.name}")
    ft = FileTail(job.dir / "log", ref_time=0.0, access=LogAccess.within([outputs]))
    ft.poll()
    ft.poll()
    assert held_fd(ft) is not None
    (outside / "logs" / job.path.name).write_text("0: completed step: 999, seconds: 1.0, SECRET\n")
    os.rename(logs, outputs / "logs.old")
    (outputs / "logs").symlink_to(outside / "logs")
    with pytest.raises(OSError):
        ft.poll()
    assert held_fd(ft) is None
    assert steps_of(ft) == [0]


def test_a_chown_or_chmod_makes_the_checked_open_decide_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opens = CountingOpens(monkeypatch)
    job = JobLog(tmp_path, "8106", nnodes=1)
    job.step(0)
    me = os.getuid()
    ft = FileTail(job.dir / "log", ref_time=0.0, access=LogAccess.within([tmp_path], owner=me))
    ft.poll()
    ft.poll()
    assert held_fd(ft) is not None
    job.path.chmod(0o600)
    before = opens.n
    job.step(1)
    ft.poll()
    assert opens.n == before + 1 and steps_of(ft) == [0, 1]  # permissions changed: checked again
    if me != 0:
        pytest.skip("chown to another user needs root")  # the chmod half above still ran
    os.chown(job.path, 65534, 65534)
    job.step(2)
    with pytest.raises(OSError, match="owned by uid 65534"):
        ft.poll()
    assert held_fd(ft) is None and steps_of(ft) == [0, 1]


def test_new_access_rules_apply_to_a_held_file_at_the_next_poll(tmp_path: Path) -> None:
    job, ft = held_tail(tmp_path, "8110")
    assert held_fd(ft) is not None and ft.reader is not None
    # What the engine does when a Slurm job's dir appears: the job's rules are set anew.
    ft.access = ft.reader.access = LogAccess.within([tmp_path], owner=os.getuid() + 1)
    job.step(1)
    with pytest.raises(OSError, match="owned by uid"):
        ft.poll()
    assert held_fd(ft) is None and steps_of(ft) == [0]


def test_deletion_and_a_dropped_tail_give_their_descriptor_back(tmp_path: Path) -> None:
    gc.collect()  # tails of earlier tests
    start = tail.HELD.held
    job, ft = held_tail(tmp_path, "8107")
    other, ft2 = held_tail(tmp_path, "8108")
    assert tail.HELD.held == start + 2
    job.path.unlink()
    with pytest.raises(OSError):
        ft.poll()
    assert tail.HELD.held == start + 1
    fd = held_fd(ft2)
    assert fd is not None
    del ft2
    gc.collect()
    assert tail.HELD.held == start
    with pytest.raises(OSError):
        os.fstat(fd)  # closed (nothing else opened meanwhile to reuse the number)


def test_past_the_budget_a_tail_opens_its_file_every_poll_and_reads_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tail, "HELD", tail._HeldBudget())
    tail.HELD.limit = 0
    opens = CountingOpens(monkeypatch)
    job, ft = held_tail(tmp_path, "8109")
    assert held_fd(ft) is None
    before = opens.n
    for k in range(1, 4):
        job.step(k)
        ft.poll()
    assert opens.n == before + 3 and steps_of(ft) == [0, 1, 2, 3]
