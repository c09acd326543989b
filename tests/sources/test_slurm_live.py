"""CliSlurmBackend against the real one-node Slurm 22.05 cluster (scripts/services/slurm.sh)."""

from __future__ import annotations

import asyncio
import getpass
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from jobdiagd.sources.slurm import (
    CliSlurmBackend,
    SlurmCommandError,
    SlurmJob,
    SlurmWatcher,
    resolve_job_paths,
)
from tests.helpers.slurm_cluster import SlurmCluster

T = TypeVar("T")

JOB_SCRIPT = """#!/bin/bash
echo "JOB_ID=$SLURM_JOB_ID"
echo "JOB_NODELIST=$SLURM_JOB_NODELIST"
srun -l -n 2 bash -c 'echo "hello from task $SLURM_PROCID on $SLURMD_NODENAME"; sleep 300'
"""


async def eventually(
    probe: Callable[[], Awaitable[T]], ok: Callable[[T], bool], what: str, within_s: float = 60
) -> T:
    """Poll until `ok(probe())`; the timeout only bounds a broken run, it asserts nothing."""
    deadline = time.monotonic() + within_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if ok(last):
            return last
        await asyncio.sleep(0.2)
    pytest.fail(f"{what}: not reached in {within_s:g} s; last value: {last!r}")


@pytest.fixture
def backend(slurm_cluster: SlurmCluster) -> CliSlurmBackend:
    return CliSlurmBackend(env=slurm_cluster.backend_env, timeout_s=20)


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    d = tmp_path / "outputs"
    d.mkdir()
    return d


def _find(jobs: list[SlurmJob], job_id: str) -> SlurmJob | None:
    return next((j for j in jobs if j.job_id == job_id), None)


async def test_running_job_listed_then_cancelled(
    slurm_cluster: SlurmCluster, backend: CliSlurmBackend, outputs: Path, tmp_path: Path
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(JOB_SCRIPT)
    name = "JAX-live-srun"
    job_id = slurm_cluster.sbatch(
        "-J",
        name,
        "-n",
        "2",
        "--time=10",
        f"--output={outputs}/%j-%x.log",
        f"--chdir={tmp_path}",
        str(script),
    )
    # What submit.sh does at submit time: the job dir with a `log` link to the future log.
    (outputs / f"{job_id}-{name}").mkdir()
    (outputs / f"{job_id}-{name}" / "log").symlink_to(f"../{job_id}-{name}.log")
    try:
        me = getpass.getuser()

        async def listed() -> SlurmJob | None:
            return _find(await backend.list_jobs([me], [slurm_cluster.partition]), job_id)

        job = await eventually(
            listed, lambda j: j is not None and j.state == "RUNNING", "job RUNNING in squeue"
        )
        assert job is not None
        assert job.user == me
        assert job.partition == slurm_cluster.partition
        assert job.name == name
        assert job.node_list == (slurm_cluster.node,)
        assert job.stdout == f"{outputs}/{job_id}-{name}.log"  # expanded, via scontrol
        assert job.work_dir == str(tmp_path)
        assert job.time_limit_s == 600
        assert job.start_time is not None and job.run_time_s is not None
        assert resolve_job_paths(job, [outputs]) == (
            outputs / f"{job_id}-{name}.log",
            outputs / f"{job_id}-{name}",
        )

        # squeue --json (22.05 ignores its filters and leaves StdOut unexpanded) gives the same view.
        via_json = CliSlurmBackend(env=slurm_cluster.backend_env, listing="json")
        jj = _find(await via_json.list_jobs([me], [slurm_cluster.partition]), job_id)
        assert jj is not None
        assert (jj.state, jj.user, jj.partition, jj.node_list, jj.stdout, jj.time_limit_s, jj.start_time) == (
            "RUNNING",
            me,
            slurm_cluster.partition,
            (slurm_cluster.node,),
            job.stdout,
            600,
            job.start_time,
        )

        # Another partition or user filters it out.
        assert _find(await backend.list_jobs(["nobody"], []), job_id) is None

        log = outputs / f"{job_id}-{name}.log"

        async def log_text() -> str:
            return log.read_text() if log.exists() else ""

        text = await eventually(
            log_text, lambda t: "0: hello from task 0" in t and "1: hello from task 1" in t, "srun -l output"
        )
        assert f"JOB_ID={job_id}" in text

        slurm_cluster.scancel(job_id)
        final = await eventually(
            lambda: backend.job_info(job_id),
            lambda j: j is not None and j.is_finished,
            "job finished after scancel",
        )
        assert final is not None
        assert final.state == "CANCELLED"
        assert (final.exit_code, final.exit_signal) == (0, 15)
        assert final.stdout == str(log)
        assert final.end_time is not None and final.start_time is not None
        assert final.end_time >= final.start_time
        # squeue no longer lists it as active, but still knows it with --states=all.
        assert _find(await backend.list_jobs([me]), job_id) is None
        gone = _find(await backend.list_jobs([me], include_finished=True), job_id)
        assert gone is not None and gone.state == "CANCELLED" and gone.exit_signal == 15
        tail = await eventually(
            log_text, lambda t: "CANCELLED AT" in t, "cancel line in the log", within_s=30
        )
        assert f"JOB {job_id} ON {slurm_cluster.node} CANCELLED AT" in tail
    finally:
        slurm_cluster.scancel(job_id)


async def test_finished_jobs_get_final_state_and_exit_code(
    slurm_cluster: SlurmCluster, backend: CliSlurmBackend, outputs: Path
) -> None:
    ok_id = slurm_cluster.sbatch(
        "-J", "ok", "-n", "1", f"--output={outputs}/%j-%x.log", "--wrap", "echo done"
    )
    bad_id = slurm_cluster.sbatch(
        "-J", "bad", "-n", "1", f"--output={outputs}/%j-%x.log", "--wrap", "echo bad; exit 3"
    )
    try:
        ok = await eventually(
            lambda: backend.job_info(ok_id), lambda j: j is not None and j.is_finished, "ok done"
        )
        bad = await eventually(
            lambda: backend.job_info(bad_id), lambda j: j is not None and j.is_finished, "bad done"
        )
        assert ok is not None and bad is not None
        assert (ok.state, ok.exit_code, ok.exit_signal) == ("COMPLETED", 0, None)
        assert (bad.state, bad.exit_code, bad.reason) == ("FAILED", 3, "NonZeroExitCode")
        assert ok.stdout == f"{outputs}/{ok_id}-ok.log"
        assert (outputs / f"{ok_id}-ok.log").read_text() == "done\n"

        listed = await backend.list_jobs([getpass.getuser()], include_finished=True)
        got = {j.job_id: (j.state, j.exit_code) for j in listed if j.job_id in (ok_id, bad_id)}
        assert got == {ok_id: ("COMPLETED", 0), bad_id: ("FAILED", 3)}

        # After MinJobAge only accounting remembers a job; here that is the jobcomp file (sacct -c).
        acct = await backend.job_info_from_accounting(bad_id)
        assert acct is not None
        assert (acct.state, acct.exit_code, acct.name, acct.stdout) == ("FAILED", 3, "bad", None)
    finally:
        slurm_cluster.scancel(ok_id, bad_id)


async def test_watcher_sees_a_job_leave_squeue(
    slurm_cluster: SlurmCluster, backend: CliSlurmBackend, outputs: Path
) -> None:
    me = getpass.getuser()
    job_id = slurm_cluster.sbatch(
        "-J", "watched", "-n", "1", f"--output={outputs}/%j-%x.log", "--wrap", "sleep 2"
    )
    try:
        watcher = SlurmWatcher(backend, users=[me], partitions=[slurm_cluster.partition])
        first = await watcher.poll()
        assert job_id in {j.job_id for j in first.appeared}
        seen = await eventually(
            watcher.poll,
            lambda p: any(j.job_id == job_id for j in p.finished),
            "watcher reports the job finished",
        )
        final = next(j for j in seen.finished if j.job_id == job_id)
        assert (final.state, final.exit_code) == ("COMPLETED", 0)
        assert final.stdout == f"{outputs}/{job_id}-watched.log"
        assert job_id not in watcher.known
    finally:
        slurm_cluster.scancel(job_id)


async def test_unknown_job_and_bad_user(backend: CliSlurmBackend) -> None:
    assert await backend.job_info("987654") is None
    with pytest.raises(SlurmCommandError) as ei:
        await backend.list_jobs(["no_such_user_jd"])
    assert ei.value.kind == "exit"
    assert "no_such_user_jd" in ei.value.stderr
