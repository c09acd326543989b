"""Scale faults: 10 000 finished job dirs in the outputs root, then 500 jobs appearing at once.

`jobdiagd run` starts on a root holding 10 000 finished jobs (their logs last written two hours
ago): none is watched or reported. Then 500 new job dirs appear within a second or two: all are
watched, each job's steps are read, and one job's failure among them is paged, once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.service.status_socket import StatusUnavailable, request
from jobdiagd_sim import lines as L
from tests.helpers.daemon import notes, start_daemon, stop, wait_for, write_cfg
from tests.helpers.faults import record_fault, short_dir  # noqa: F401  (fixture)
from tests.helpers.joblog import JobLog

FINISHED = 10_000
NEW = 500
NAME = "JAX-llama3.1-8b-old"

pytestmark = [pytest.mark.daemon, pytest.mark.timeout(300)]


def finished_jobs(outputs: Path, n: int) -> None:
    """n job dirs with a header-and-summary log each, last written two hours ago."""
    old = time.time() - 7200
    header = "\n".join(
        L.header_lines(
            job_id="1",
            name=NAME,
            nnodes=1,
            nodelist="node001",
            jax_port=12321,
            ray_port=None,
            passthrough={"steps": 10},
            model="llama3.1-8b",
        )
    )
    for i in range(n):
        job_id = str(100_000 + i)
        log = outputs / f"{job_id}-{NAME}.log"
        log.write_text(
            header
            + "\n"
            + "\n".join(L.job_summary(job_id=job_id, name=NAME, model="m", nnodes=1, wall=60, rc=0))
        )
        d = outputs / f"{job_id}-{NAME}"
        d.mkdir()
        (d / "log").symlink_to(f"../{log.name}")
        os.utime(log, (old, old))
        os.utime(d / "log", (old, old), follow_symlinks=False)


def snapshot(sock: Path) -> dict[str, Any]:
    try:
        return dict(request(sock, "status", timeout=20)["result"])
    except StatusUnavailable:
        return {}


def test_ten_thousand_finished_jobs_then_five_hundred_at_once(short_dir: Path) -> None:  # noqa: F811
    work, outputs = short_dir, short_dir / "outputs"
    sock = work / "jd.sock"
    outputs.mkdir()
    finished_jobs(outputs, FINISHED)
    cfg = write_cfg(work, min_stall=600, tick=1.0)
    t0 = time.monotonic()
    daemon = start_daemon(cfg, outputs, work / "daemon.out")
    try:
        wait_for(lambda: snapshot(sock).get("ticks", 0) >= 2, "two ticks over the finished jobs")
        started_s = time.monotonic() - t0
        assert snapshot(sock)["jobs"] == []

        t1 = time.monotonic()
        jobs = [JobLog(outputs, str(200_000 + i), "JAX-llama3.1-8b-new", nnodes=1) for i in range(NEW)]
        for job in jobs:
            job.step(0, seconds=0.2)
            job.step(1, seconds=0.2)
        appeared_s = time.monotonic() - t1
        jobs[137].task(0, L.xla_oom(32 * 2**30))
        wait_for(lambda: len(snapshot(sock).get("jobs", [])) == NEW, f"{NEW} jobs watched", timeout=180)
        watched_s = time.monotonic() - t1
        wait_for(
            lambda: all(j["last_step"] == 1 for j in snapshot(sock)["jobs"]),
            "every job's steps read",
            timeout=120,
        )
        wait_for(lambda: any(n["event"] == "open" for n in notes(work)), "the failure paged", timeout=60)
        ticks = snapshot(sock)["ticks"]
        wait_for(lambda: snapshot(sock)["ticks"] >= ticks + 3, "ticks going on")
        st = snapshot(sock)
        full = st["tick_durations"]["full"]
        pages = [(n["job_id"], n["kind"]) for n in notes(work) if n["event"] == "open"]
        reports = [n for n in notes(work) if n["event"] == "report"]
        assert pages == [("200137", pages[0][1])], pages
        assert reports == []  # none of the 10 000 finished jobs reported
        assert st["last_tick_ok"] is True
        assert stop(daemon) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
    record_fault(
        "10 000 finished jobs, then 500 at once",
        injected=f"{FINISHED} finished job dirs in the outputs root at start; {NEW} new job dirs written "
        f"in {appeared_s:.1f} s, one of them failing",
        daemon=f"watched none of the finished ones; watched all {NEW} new ones {watched_s:.1f} s after they "
        "began to appear, read their steps, paged the failure",
        delivered=f"pages {len(pages)}, end reports {len(reports)}",
        figures={
            "start_to_second_tick_s": round(started_s, 1),
            "all_500_watched_after_s": round(watched_s, 1),
            "full_tick_p50_ms": full["p50_ms"],
            "full_tick_p99_ms": full["p99_ms"],
            "full_tick_max_ms": full["max_ms"],
        },
    )
