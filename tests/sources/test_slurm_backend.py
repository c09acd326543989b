"""Backend plumbing without a cluster: command errors, input validation, paths, pyslurm mapping."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sys
import time
import types
from collections.abc import Awaitable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from jobdiagd.sources.slurm import (
    CliSlurmBackend,
    PyslurmBackend,
    SlurmBackend,
    SlurmCommandError,
    SlurmError,
    SlurmJob,
    SlurmWatcher,
    make_backend,
    resolve_job_paths,
)
from tests.helpers.procs import (
    alive,
    children,
    exists,
    live_group_members,
    open_fds,
    pids_in,
    zombie_children,
)

T = TypeVar("T")


def _exe(tmp_path: Path, name: str, body: str) -> str:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return str(p)


async def test_missing_binary_names_the_command(tmp_path: Path) -> None:
    b = CliSlurmBackend(squeue=str(tmp_path / "no-such-squeue"))
    with pytest.raises(SlurmCommandError) as ei:
        await b.list_jobs()
    assert ei.value.kind == "missing"
    assert "no-such-squeue" in str(ei.value)


async def test_nonzero_exit_carries_stderr(tmp_path: Path) -> None:
    squeue = _exe(
        tmp_path, "squeue", 'echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1'
    )
    b = CliSlurmBackend(squeue=squeue)
    with pytest.raises(SlurmCommandError) as ei:
        await b.list_jobs(["alice"], ["gpu"])
    e = ei.value
    assert (e.kind, e.returncode) == ("exit", 1)
    assert "Unable to contact slurm controller" in e.stderr
    assert "exit 1" in str(e) and "Unable to contact" in str(e)
    # The filters reached the command as single argv words, never through a shell.
    assert "--user=alice" in e.argv and "--partition=gpu" in e.argv


async def test_timeout_kills_the_command(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    squeue = _exe(tmp_path, "squeue", f'echo $$ > "{pidfile}"; exec sleep 30')
    b = CliSlurmBackend(squeue=squeue, timeout_s=0.5)
    with pytest.raises(SlurmCommandError) as ei:
        await b.list_jobs()
    assert ei.value.kind == "timeout"
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def bounded(aw: Awaitable[T], seconds: float) -> T:
    """Await `aw`, failing the test after `seconds` even if the code under test ignores one
    cancellation (as a cancel handler that waits for a stuck child does)."""
    task = asyncio.ensure_future(aw)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        await _cancel_hard(task)
        pytest.fail(f"call did not finish within {seconds:g} s")
    return task.result()


async def _cancel_hard(task: asyncio.Future[Any]) -> None:
    for _ in range(5):
        if task.done():
            return
        task.cancel()
        await asyncio.wait({task}, timeout=2)


@pytest.fixture
def pids(tmp_path: Path) -> Iterator[Path]:
    """File the test's wrapper scripts append their PIDs to (the shell's, its children's);
    whatever of them still runs is killed at the end, so a failing run leaks nothing."""
    path = tmp_path / "pids"
    yield path
    for pid in pids_in(path):
        for victim in [pid, *live_group_members(pid)]:
            if alive(victim):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)


async def _gone(pid: int) -> bool:
    """Whether `pid` was reaped (asyncio's child watcher does it soon after the exit)."""
    for _ in range(100):
        if not exists(pid):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_timeout_kills_a_wrapper_scripts_whole_process_group(tmp_path: Path, pids: Path) -> None:
    # The wrapper: sleep, then the real command. Killing only the shell left `sleep`
    # holding our pipes, and the call returned when it ended (here: 600 s; bounded at 30).
    squeue = _exe(
        tmp_path, "squeue", f'echo $$ >> "{pids}"; sleep 600 & echo $! >> "{pids}"; wait $!; exec squeue "$@"'
    )
    b = CliSlurmBackend(squeue=squeue, timeout_s=0.5)
    # Garbage of earlier tests (an unclosed loop, a pool's pipes) closes its fds when collected:
    # collect it now, not in the middle of this count (seen: 31 before, 26 after).
    gc.collect()
    fds = open_fds()
    for _ in range(3):
        with pytest.raises(SlurmCommandError) as ei:
            await bounded(b.list_jobs(), 30)
        assert ei.value.kind == "timeout" and "no answer within 0.5 s" in str(ei.value)
    started = pids_in(pids)
    assert len(started) == 6
    assert [p for p in started if alive(p)] == []  # the sleeps too, not only the shells
    for shell in started[::2]:
        assert await _gone(shell)  # reaped: no zombie left behind
    assert zombie_children(os.getpid()) == []
    assert open_fds() == fds  # no pipe left open


async def test_cancelling_a_call_kills_the_commands_process_group(tmp_path: Path, pids: Path) -> None:
    squeue = _exe(
        tmp_path,
        "squeue",
        f'echo $$ >> "{pids}"; sleep 600 & echo $! >> "{pids}"; sleep 600 & echo $! >> "{pids}"; wait',
    )
    b = CliSlurmBackend(squeue=squeue, timeout_s=300)
    task = asyncio.ensure_future(b.list_jobs())
    try:
        for _ in range(200):
            if len(pids_in(pids)) == 3:
                break
            await asyncio.sleep(0.05)
        started = pids_in(pids)
        assert len(started) == 3 and all(alive(p) for p in started)  # the shell and both sleeps
        task.cancel()
        await bounded(asyncio.gather(task, return_exceptions=True), 30)
        assert task.cancelled()
        assert [p for p in started if alive(p)] == []
        assert await _gone(started[0])
    finally:
        await _cancel_hard(task)


async def test_cancelling_a_call_while_its_command_starts_kills_the_process_group(
    tmp_path: Path, pids: Path
) -> None:
    # The cancellation comes while asyncio still connects the command's pipes (a busy loop: the
    # full suite on parallel workers hit it). asyncio then kills the shell alone and waits for
    # the pipes to close, which the sleeps hold: the call hung for their 600 s.
    squeue = _exe(
        tmp_path,
        "squeue",
        f'echo $$ >> "{pids}"; sleep 600 & echo $! >> "{pids}"; sleep 600 & echo $! >> "{pids}"; wait',
    )
    b = CliSlurmBackend(squeue=squeue, timeout_s=300)
    before = set(children(os.getpid()))
    task = asyncio.ensure_future(b.list_jobs())
    try:
        # One loop turn at a time until the command is forked: its pipes are connected on later
        # turns. Then block the loop (no turn for the pipes) until the sleeps run, and cancel.
        for _ in range(100):
            if set(children(os.getpid())) - before:
                break
            await asyncio.sleep(0)
        for _ in range(400):
            if len(pids_in(pids)) == 3:
                break
            time.sleep(0.05)  # noqa: ASYNC251 - holding the loop is the point
        started = pids_in(pids)
        assert len(started) == 3 and all(alive(p) for p in started)  # the shell and both sleeps
        task.cancel()
        await bounded(asyncio.gather(task, return_exceptions=True), 30)
        assert task.cancelled()
        assert [p for p in started if alive(p)] == []
        assert await _gone(started[0])
    finally:
        await _cancel_hard(task)


async def test_leftover_children_of_a_finished_command_are_stopped(tmp_path: Path, pids: Path) -> None:
    # Exits at once, leaving a child that does not hold our pipes.
    squeue = _exe(
        tmp_path, "squeue", f'echo $$ >> "{pids}"; sleep 600 >/dev/null 2>&1 & echo $! >> "{pids}"; exit 0'
    )
    assert await bounded(CliSlurmBackend(squeue=squeue, timeout_s=30).list_jobs(), 30) == []
    started = pids_in(pids)
    assert len(started) == 2 and [p for p in started if alive(p)] == []


@pytest.mark.parametrize(
    "body",
    [
        'echo "slurm_load_jobs: <html>502 Bad Gateway</html>"',
        "echo garbage; echo '1 2 3'",
        "printf 'x\\037RUNNING\\037me\\n'",  # separators, but not a job line
        "head -c 4096 /dev/urandom",
    ],
)
async def test_unparseable_squeue_output_is_an_error_not_an_empty_cluster(tmp_path: Path, body: str) -> None:
    b = CliSlurmBackend(squeue=_exe(tmp_path, "squeue", body + "; exit 0"))
    with pytest.raises(SlurmCommandError) as ei:
        await b.list_jobs()
    assert ei.value.kind == "output" and "unparseable output" in str(ei.value)


async def test_json_listing_garbage_is_an_error(tmp_path: Path) -> None:
    b = CliSlurmBackend(squeue=_exe(tmp_path, "squeue", "echo '{oops'"), listing="json")
    with pytest.raises(SlurmCommandError) as ei:
        await b.list_jobs()
    assert ei.value.kind == "output"


async def test_empty_squeue_output_is_an_empty_list(tmp_path: Path) -> None:
    assert await CliSlurmBackend(squeue=_exe(tmp_path, "squeue", "exit 0")).list_jobs() == []


async def test_endless_output_is_cut_off_and_the_command_killed(tmp_path: Path, pids: Path) -> None:
    squeue = _exe(tmp_path, "squeue", f'echo $$ >> "{pids}"; exec yes 1')
    with pytest.raises(SlurmCommandError) as ei:
        await bounded(CliSlurmBackend(squeue=squeue, timeout_s=10).list_jobs(), 30)
    assert ei.value.kind == "output" and "more than 64 MiB" in str(ei.value)
    assert [p for p in pids_in(pids) if alive(p)] == []


async def test_environment_reaches_the_command(tmp_path: Path) -> None:
    # squeue stand-in that prints one job line built from what it was given.
    squeue = _exe(
        tmp_path,
        "squeue",
        'printf "7\\037RUNNING\\037me\\037p\\037n1\\037100\\0370:01\\0375:00\\037%s\\037None\\037%s\\n"'
        ' "$SLURM_CONF" "$SLURM_TIME_FORMAT"',
    )
    scontrol = _exe(tmp_path, "scontrol", 'echo "JobId=7 JobName=x JobState=RUNNING StdOut=/o/7-x.log"')
    b = CliSlurmBackend(env={"SLURM_CONF": "/etc/test.conf"}, squeue=squeue, scontrol=scontrol)
    (job,) = await b.list_jobs()
    assert job.work_dir == "/etc/test.conf"
    assert job.start_time == 100.0
    assert job.name == "%s"  # the backend asks for epoch timestamps
    assert job.stdout == "/o/7-x.log"  # filled from scontrol, as squeue cannot expand it


@pytest.mark.parametrize(
    ("users", "partitions"),
    [(["-a"], []), (["alice;id"], []), ([], ["--all"]), ([], ["a b"]), (["$(reboot)"], [])],
)
async def test_list_jobs_rejects_unsafe_filters_before_running_anything(
    tmp_path: Path, users: list[str], partitions: list[str]
) -> None:
    marker = tmp_path / "ran"
    squeue = _exe(tmp_path, "squeue", f'touch "{marker}"')
    b = CliSlurmBackend(squeue=squeue)
    with pytest.raises(ValueError):
        await b.list_jobs(users, partitions)
    assert not marker.exists()


@pytest.mark.parametrize("job_id", ["--help", "1 2", "1;id", "", "x"])
async def test_job_info_rejects_unsafe_ids(tmp_path: Path, job_id: str) -> None:
    marker = tmp_path / "ran"
    scontrol = _exe(tmp_path, "scontrol", f'touch "{marker}"')
    with pytest.raises(ValueError):
        await CliSlurmBackend(scontrol=scontrol).job_info(job_id)
    assert not marker.exists()


async def test_job_info_falls_back_to_sacct_then_jobcomp(tmp_path: Path) -> None:
    scontrol = _exe(
        tmp_path, "scontrol", 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1'
    )
    sacct = _exe(
        tmp_path,
        "sacct",
        'case " $* " in *" -c "*) printf "42\\037u\\037COMPLETED\\037p\\037n1\\03710\\03720\\03700:00:10'
        '\\037UNLIMITED\\037/w\\0370:0\\037\\037name\\n";; '
        '*) echo "Slurm accounting storage is disabled" >&2; exit 1;; esac',
    )
    job = await CliSlurmBackend(scontrol=scontrol, sacct=sacct).job_info("42")
    assert job is not None
    assert (job.job_id, job.state, job.exit_code, job.run_time_s) == ("42", "COMPLETED", 0, 10)
    assert await CliSlurmBackend(scontrol=scontrol, sacct=None).job_info("42") is None
    assert await CliSlurmBackend(scontrol=scontrol, sacct=sacct).job_info("43") is None


async def test_job_info_other_scontrol_errors_propagate(tmp_path: Path) -> None:
    scontrol = _exe(tmp_path, "scontrol", 'echo "Unable to contact slurm controller" >&2; exit 1')
    with pytest.raises(SlurmCommandError, match="Unable to contact"):
        await CliSlurmBackend(scontrol=scontrol).job_info("1")


# --- make_backend / pyslurm ----------------------------------------------------------------------------


def test_make_backend_cli_and_missing_pyslurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # makes `import pyslurm` raise ImportError
    assert isinstance(make_backend("cli"), CliSlurmBackend)
    assert isinstance(make_backend("auto"), CliSlurmBackend)
    with pytest.raises(SlurmError, match="pyslurm"):
        make_backend("pyslurm")
    with pytest.raises(ValueError):
        make_backend("slurmrestd")  # type: ignore[arg-type]
    assert isinstance(make_backend("cli"), SlurmBackend)


class _FakeRPCError(Exception):
    pass


def _fake_pyslurm() -> types.ModuleType:
    """Stand-in with the attribute names of pyslurm >= 23.2's Job (pyslurm/core/job/job.pyx)."""

    def job(**kw: Any) -> types.SimpleNamespace:
        base: dict[str, Any] = {
            "id": 1,
            "name": "JAX-x",
            "user_name": "alice",
            "state": "RUNNING",
            "state_reason": "None",
            "partition": "gpu",
            "allocated_nodes": "node[001-002]",
            "start_time": 1795945920,
            "end_time": 1795949520,
            "run_time": 100,
            "time_limit": 60,
            "standard_output": "/o/1-JAX-x.log",
            "working_directory": "/w",
            "exit_code": 0,
            "exit_code_signal": 0,
        }
        base.update(kw)
        return types.SimpleNamespace(**base)

    jobs = {
        1: job(),
        2: job(id=2, user_name="bob"),
        3: job(id=3, state="COMPLETED"),
        4: job(
            id=4, state="PENDING", allocated_nodes=None, start_time=0, run_time=0, state_reason="Priority"
        ),
    }

    class Jobs:
        @staticmethod
        def load() -> dict[int, types.SimpleNamespace]:
            return jobs

    class Job:
        @staticmethod
        def load(job_id: int) -> types.SimpleNamespace:
            if job_id == 3:
                return job(id=3, state="FAILED", exit_code=3)
            raise _FakeRPCError("Invalid job id specified")

    mod = types.ModuleType("pyslurm")
    mod.Jobs = Jobs  # type: ignore[attr-defined]
    mod.Job = Job  # type: ignore[attr-defined]
    mod.RPCError = _FakeRPCError  # type: ignore[attr-defined]
    return mod


async def test_pyslurm_backend_maps_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", _fake_pyslurm())
    b = make_backend("auto")
    assert isinstance(b, PyslurmBackend)
    jobs = await b.list_jobs(["alice"])
    assert [j.job_id for j in jobs] == ["1", "4"]
    run, pend = jobs
    assert run.node_list == ("node001", "node002")
    assert (run.time_limit_s, run.run_time_s, run.stdout, run.end_time) == (3600, 100, "/o/1-JAX-x.log", None)
    assert (pend.state, pend.start_time, pend.nodes, pend.reason) == ("PENDING", None, "", "Priority")
    assert [j.job_id for j in await b.list_jobs(["alice"], include_finished=True)] == ["1", "3", "4"]
    failed = await b.job_info("3")
    assert failed is not None and (failed.state, failed.exit_code, failed.end_time) == (
        "FAILED",
        3,
        1795949520.0,
    )
    assert await b.job_info("99") is None


# --- resolve_job_paths ------------------------------------------------------------------------------------


def _job(job_id: str = "123", stdout: str | None = None, work_dir: str | None = None) -> SlurmJob:
    return SlurmJob(
        job_id=job_id,
        name="JAX-x",
        user="u",
        state="RUNNING",
        partition="p",
        stdout=stdout,
        work_dir=work_dir,
    )


def test_paths_from_stdout_and_sibling_dir(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    (out / "123-JAX-x").mkdir(parents=True)
    (out / "123-JAX-x.log").write_text("JOB_ID=123\n")
    (out / "123-JAX-x" / "log").symlink_to("../123-JAX-x.log")
    log, d = resolve_job_paths(_job(stdout=str(out / "123-JAX-x.log")), [])
    assert (log, d) == (out / "123-JAX-x.log", out / "123-JAX-x")


def test_paths_pending_job_stdout_not_created_yet(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    (out / "123-JAX-x").mkdir(parents=True)
    (out / "123-JAX-x" / "log").symlink_to("../123-JAX-x.log")  # dangles until the job starts
    log, d = resolve_job_paths(_job(stdout=str(out / "123-JAX-x.log")), [out])
    assert (log, d) == (out / "123-JAX-x.log", out / "123-JAX-x")


def test_paths_renamed_log_followed_through_link(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    (out / "123-JAX-x").mkdir(parents=True)
    (out / "123-JAX-x-8N-TGS_812.log").write_text("x\n")
    (out / "123-JAX-x" / "log").symlink_to("../123-JAX-x-8N-TGS_812.log")
    log, d = resolve_job_paths(_job(stdout=str(out / "123-JAX-x.log")), [out])
    assert log == out / "123-JAX-x-8N-TGS_812.log"
    assert d == out / "123-JAX-x"


def test_paths_from_outputs_naming_when_stdout_unknown(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    out.mkdir()
    (out / "1234-other.log").write_text("")  # id prefix 123 must not match 1234
    (out / "1234-other").mkdir()
    (out / "123-JAX-x.log").write_text("")
    (out / "123-ckpt").mkdir()  # shared checkpoint dir: no log link
    (out / "123-JAX-x").mkdir()
    (out / "123-JAX-x" / "log").symlink_to("../123-JAX-x.log")
    log, d = resolve_job_paths(_job(), [tmp_path / "elsewhere", out])
    assert (log, d) == (out / "123-JAX-x.log", out / "123-JAX-x")


def test_paths_relative_stdout_and_nothing_found(tmp_path: Path) -> None:
    (tmp_path / "slurm-5.out").write_text("")
    log, d = resolve_job_paths(_job("5", stdout="slurm-5.out", work_dir=str(tmp_path)), [tmp_path])
    assert (log, d) == (tmp_path / "slurm-5.out", None)
    assert resolve_job_paths(_job("6"), [tmp_path]) == (None, None)
    assert resolve_job_paths(_job("6", stdout="/dev/null"), [tmp_path]) == (None, None)


def test_paths_reject_non_numeric_ids(tmp_path: Path) -> None:
    for bad in ["../1", "*", "1-*", "k8s-20260310"]:
        with pytest.raises(ValueError):
            resolve_job_paths(_job(bad), [tmp_path])
    # array task: looked up by its array's base id
    (tmp_path / "77-arr.log").write_text("")
    assert resolve_job_paths(_job("77_3"), [tmp_path])[0] == tmp_path / "77-arr.log"


# --- watcher ------------------------------------------------------------------------------------------------


class _ScriptedBackend:
    def __init__(self) -> None:
        self.listings: list[list[SlurmJob]] = []
        self.final: dict[str, SlurmJob | Exception] = {}
        self.asked: list[str] = []

    async def list_jobs(
        self, users: Any = (), partitions: Any = (), *, include_finished: bool = False
    ) -> list[SlurmJob]:
        return self.listings.pop(0)

    async def job_info(self, job_id: str) -> SlurmJob | None:
        self.asked.append(job_id)
        info = self.final.get(job_id)
        if isinstance(info, Exception):
            raise info
        return info


async def test_watcher_reports_appeared_changed_finished_lost() -> None:
    a = _job("1", stdout="/o/1-a.log")
    b = _job("2")
    fake = _ScriptedBackend()
    fake.listings = [[replace(a, state="PENDING"), b], [a, b], [], [], []]
    fake.final = {"1": replace(a, state="COMPLETED", exit_code=0, stdout=None)}
    w = SlurmWatcher(fake, users=["u"])
    p1 = await w.poll()
    assert [j.job_id for j in p1.appeared] == ["1", "2"]
    p2 = await w.poll()
    assert (p2.appeared, [j.job_id for j in p2.changed]) == ((), ["1"])
    p3 = await w.poll()
    assert [(j.job_id, j.state, j.stdout) for j in p3.finished] == [("1", "COMPLETED", "/o/1-a.log")]
    # Nobody remembers job 2: lost only after LOST_AFTER_POLLS answers in a row without it.
    assert (p3.lost, list(w.known)) == ((), ["2"])
    assert (await w.poll()).lost == ()
    assert (await w.poll()).lost == ("2",)
    assert fake.asked == ["1", "2", "2", "2"]
    assert w.known == {} and w.missing == {}


async def test_watcher_does_not_end_a_job_scontrol_still_runs() -> None:
    a, b = _job("1", stdout="/o/1-a.log"), _job("2")
    fake = _ScriptedBackend()
    # Empty answers while both run: scontrol says job 1 runs, and cannot be asked about job 2.
    fake.listings = [[a, b], [], [], [a, b]]
    fake.final = {"1": replace(a, stdout=None), "2": SlurmCommandError(["scontrol"], "timeout", "slow")}
    w = SlurmWatcher(fake)
    await w.poll()
    for _ in range(2):
        p = await w.poll()
        assert (p.finished, p.lost) == ((), ())
        assert [(j.job_id, j.state, j.stdout) for j in p.jobs] == [("1", "RUNNING", "/o/1-a.log")]
        assert len(p.problems) == 2
        assert "omits job 1, which scontrol reports RUNNING" in p.problems[0]
        assert "job 2 is missing from squeue and its end cannot be confirmed" in p.problems[1]
        assert sorted(w.known) == ["1", "2"]
    p = await w.poll()
    assert (p.appeared, p.finished, p.problems) == ((), (), ())


async def test_watcher_keeps_a_job_moved_out_of_the_watched_partitions_without_a_problem() -> None:
    a = _job("1")
    fake = _ScriptedBackend()
    fake.listings = [[a], []]
    fake.final = {"1": replace(a, partition="other")}  # scontrol update Partition=other
    w = SlurmWatcher(fake, partitions=[a.partition])
    await w.poll()
    p = await w.poll()
    assert (p.finished, p.lost, p.problems) == ((), (), ())
    assert list(w.known) == ["1"]
