"""`jobdiagd run` against hostile or unlucky log files. Real daemon processes, real
files, real permissions: `nobody` is the second local user owning foreign files, and the daemon
that must not read a mode-000 log runs without the capabilities that let root bypass file
permissions. Every wait is bounded, so a wedged daemon fails a test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from jobdiagd_sim import lines as L
from tests.helpers.daemon import MakeRig, notes, start_daemon, status, stop, wait_for, write_cfg
from tests.helpers.joblog import JobLog
from tests.helpers.slurm_cluster import SlurmCluster

# Runs the real daemon on real time (tests/conftest.py: service markers).
pytestmark = pytest.mark.daemon

NOBODY = pwd.getpwnam("nobody")
SECRET = "root:$y$j9T$SECRET-HASH-0123456789:19000:0:99999:7:::"


def bad_job(outputs: Path, job_id: str) -> tuple[Path, Path]:
    """A job dir whose `log` link points at `<id>-JAX-bad.log`, which the caller creates."""
    d = outputs / f"{job_id}-JAX-bad"
    d.mkdir(parents=True)
    log = outputs / f"{d.name}.log"
    (d / "log").symlink_to(f"../{log.name}")
    return d, log


def of(job_id: str, work: Path, event: str | None = None) -> list[dict[str, Any]]:
    """Notifications about a job: its incidents and reports, and notices naming it in the title."""
    return [
        n
        for n in notes(work)
        if (n["job_id"] == job_id or n["title"].endswith(f"job {job_id}"))
        and (event is None or n["event"] == event)
    ]


def blind_notices(work: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for n in notes(work):
        if n["title"].startswith("monitoring blind: job "):
            out.setdefault(n["title"].rsplit(" ", 1)[1], []).append(n)
    return out


def jobs(cfg: Path) -> dict[str, dict[str, Any]]:
    """The status' jobs by id ({} while the daemon is not answering yet)."""
    return {j["job_id"]: j for j in status(cfg).get("status", {}).get("jobs", [])}


# -- a log unreadable from the start --------------------------------------------------------------
# Tests run as root, who reads mode-000 files: the daemon runs as root *without* the two
# capabilities that bypass file permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), dropped
# from its bounding set by `setpriv` (util-linux) before exec — so, like any other user, it
# cannot open a mode-000 file, and it is still a real `jobdiagd run` process.

NO_DAC_BYPASS = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


def test_a_log_unreadable_from_the_start_is_reported_blind_then_restored(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work, outputs = short_tmp, short_tmp / "outputs"
    job = JobLog(outputs, "7301")
    for k in range(5):
        job.step(k, seconds=0.2)
    job.path.chmod(0o000)  # before the daemon ever reads it
    readable = JobLog(outputs, "7302")
    readable.step(0, seconds=0.2)
    cfg = write_cfg(work, min_stall=600, grace=120)
    daemon = start_daemon(cfg, outputs, work / "daemon.out", prefix=NO_DAC_BYPASS)
    procs.append(daemon)
    wait_for(lambda: jobs(cfg).get("7302", {}).get("last_step") == 0, "the readable job read")
    wait_for(lambda: bool(blind_notices(work).get("7301")), "the blind notice", timeout=30)
    (n,) = blind_notices(work)["7301"]
    assert "Permission denied" in n["body"] and n["severity"] == "warning"
    st = jobs(cfg)["7301"]
    assert st["phase"] == "blind" and st["blind"] == [str(job.dir / "log")]
    assert "7302" not in blind_notices(work)

    job.path.chmod(0o644)  # fixed: the daemon says so and reads it
    wait_for(lambda: any(x["title"] == "monitoring restored: job 7301" for x in notes(work)), "restored")
    wait_for(lambda: jobs(cfg)["7301"]["last_step"] == 4, "the log read after the fix")
    assert jobs(cfg)["7301"]["blind"] == []
    assert len(blind_notices(work)["7301"]) == 1
    assert stop(daemon) == 0


# -- FIFOs, sockets, devices, directories; links out of the root; another user's file ------------


def test_fifo_socket_device_and_directory_logs_are_refused_while_other_jobs_stay_watched(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work, outputs = short_tmp, short_tmp / "outputs"
    outputs.mkdir()
    _, fifo = bad_job(outputs, "7101")
    os.mkfifo(fifo)  # open(O_RDONLY) on it blocks until a writer comes: none ever does
    _, directory = bad_job(outputs, "7102")
    directory.mkdir()
    _, sock_path = bad_job(outputs, "7103")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    _, device = bad_job(outputs, "7104")
    os.mknod(device, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    hanging = JobLog(outputs, "7105")
    for k in range(8):
        hanging.step(k, seconds=0.2)
    cfg = write_cfg(work, min_stall=3, grace=120)
    daemon = start_daemon(cfg, outputs, work / "daemon.out")
    procs.append(daemon)
    try:
        # A real hang elsewhere is still paged: the bad files did not stop the ticks.
        wait_for(lambda: bool(of("7105", work, "open")), "the hang page of the healthy job", timeout=60)
        wait_for(lambda: len(blind_notices(work)) == 4, "one blind notice per bad log", timeout=30)
        kinds = {"7101": "a FIFO", "7102": "a directory", "7103": "a socket", "7104": "a character device"}
        for job_id, kind in kinds.items():
            (n,) = blind_notices(work)[job_id]
            assert f"not a regular file ({kind})" in n["body"] and "refused" in n["body"]
        st = jobs(cfg)
        for job_id in kinds:
            assert st[job_id]["phase"] == "blind" and st[job_id]["blind"], st[job_id]
        assert st["7105"]["last_step"] == 7 and st["7105"]["open_incidents"] == ["hang"]
        ticks = status(cfg)["status"]["ticks"]
        wait_for(lambda: status(cfg)["status"]["ticks"] >= ticks + 6, "more ticks")
        assert {k: len(v) for k, v in blind_notices(work).items()} == dict.fromkeys(
            kinds, 1
        )  # edge-triggered
    finally:
        sock.close()
    assert stop(daemon) == 0  # SIGTERM stops it (bounded: 30 s, then the test fails)


def test_log_links_out_of_the_root_or_to_another_users_file_are_refused_and_never_quoted(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work, outputs = short_tmp, short_tmp / "outputs"
    outputs.mkdir()
    secret = work / "shadow"
    # A line a hang page would quote ("last line read") and a failure page too (oom signature).
    secret.write_text(f"{SECRET}\nslurmstepd: error: Detected 1 oom-kill event(s) {SECRET}\n")
    secret.chmod(0o600)
    d, _ = bad_job(outputs, "7201")
    (d / "log").unlink()
    (d / "log").symlink_to(secret)  # out of the root from the start
    moved = JobLog(outputs, "7202")  # repointed out of the root while watched
    for k in range(5):
        moved.step(k, seconds=0.2)
    tagged = JobLog(outputs, "7203")  # the TGS tagger's rename inside the root: keeps working
    for k in range(5):
        tagged.step(k, seconds=0.2)
    foreign = JobLog(outputs, "7204")  # a log inside the root, but another user's file
    os.chown(foreign.path, NOBODY.pw_uid, NOBODY.pw_gid)
    cfg = write_cfg(work, min_stall=600, grace=120)
    daemon = start_daemon(cfg, outputs, work / "daemon.out")
    procs.append(daemon)
    wait_for(lambda: jobs(cfg).get("7202", {}).get("last_step") == 4, "job 7202 read")
    wait_for(lambda: jobs(cfg).get("7203", {}).get("last_step") == 4, "job 7203 read")
    (moved.dir / "log").unlink()
    (moved.dir / "log").symlink_to("../../shadow")
    renamed = outputs / f"{tagged.path.stem}-2N-TGS_3000.log"
    os.rename(tagged.path, renamed)
    (tagged.dir / "log").unlink()
    (tagged.dir / "log").symlink_to(f"../{renamed.name}")
    tagged.path = renamed
    tagged.step(5, seconds=0.2)

    def told() -> bool:  # a blind notice for each, or (the old code) a page quoting the secret
        return set(blind_notices(work)) >= {"7201", "7202", "7204"} or SECRET in json.dumps(notes(work))

    wait_for(told, "a notice for each refused log", timeout=60)
    everything = json.dumps(notes(work)) + json.dumps(status(cfg)) + (work / "daemon.out").read_text()
    assert "SECRET" not in everything  # not a byte of the refused files, anywhere
    blind = blind_notices(work)
    assert sorted(blind) == ["7201", "7202", "7204"]
    assert all(len(v) == 1 for v in blind.values())
    for job_id in ("7201", "7202"):
        assert "outside the allowed log roots" in blind[job_id][0]["body"]
    assert f"owned by uid {NOBODY.pw_uid}, not by uid 0" in blind["7204"][0]["body"]
    wait_for(lambda: jobs(cfg)["7203"]["last_step"] == 5, "the renamed log followed")
    assert not jobs(cfg)["7203"]["blind"]
    assert stop(daemon) == 0


def test_under_slurm_a_log_repointed_to_another_users_file_is_refused(
    slurm_cluster: SlurmCluster, short_tmp: Path, daemon_rig: MakeRig
) -> None:
    """Slurm discovery: the job's Slurm user (root here) owns its logs; a `log` link repointed to
    a file of another user inside the same outputs root is refused, even in the end report."""
    rig = daemon_rig(short_tmp, cluster=slurm_cluster, min_stall=600, grace=None)
    work, outputs, cfg = rig.work, rig.outputs, rig.cfg
    stolen = outputs / "stolen.log"
    stolen.write_text(f"{SECRET}\nslurmstepd: error: Detected 1 oom-kill event(s) {SECRET}\n")
    os.chown(stolen, NOBODY.pw_uid, NOBODY.pw_gid)
    stolen.chmod(0o600)
    daemon = rig.start()
    try:
        job_id = rig.sbatch_sim(
            "JAX-llama3.1-8b-owner", *("--steps", "3000", "--step-time", "0.3", "--compile-time", "0.2")
        )
        link = outputs / f"{job_id}-JAX-llama3.1-8b-owner" / "log"
        wait_for(
            lambda: (
                jobs(cfg).get(job_id, {}).get("log") == str(link)
                and (jobs(cfg)[job_id]["last_step"] or 0) >= 3
            ),
            "the job's log followed through its job dir",
            timeout=120,
        )
        link.unlink()
        link.symlink_to("../stolen.log")

        def told() -> bool:
            return bool(blind_notices(work).get(job_id)) or SECRET in json.dumps(notes(work))

        wait_for(told, "the refusal", timeout=60)
        assert SECRET not in json.dumps(notes(work))
        (n,) = blind_notices(work)[job_id]
        assert f"owned by uid {NOBODY.pw_uid}, not by uid 0 (root, the job's Slurm user)" in n["body"]
        assert jobs(cfg)[job_id]["blind"] == [str(link)]
        slurm_cluster.scancel(job_id)
        wait_for(lambda: bool(of(job_id, work, "report")), "the job-end report", timeout=120)
        everything = json.dumps(notes(work)) + (work / "daemon.out").read_text()
        assert "SECRET" not in everything
    finally:
        assert stop(daemon) == 0


# -- progress: bogus step lines; the hang clock across a SIGKILL -------------------------------------


def test_a_bogus_step_line_is_ignored_and_the_hang_is_still_paged(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work, outputs = short_tmp, short_tmp / "outputs"
    outputs.mkdir()
    past_total = JobLog(outputs, "7401", steps=5000)
    jump = JobLog(outputs, "7402", steps=100000)
    restored = JobLog(outputs, "7403", steps=5000)  # legitimate: the first step is 3000
    final = JobLog(outputs, "7404", steps=10)  # legitimate: the last step is total - 1
    rerun = JobLog(outputs, "7405", steps=5000)  # legitimate: a re-run goes back to a checkpoint
    for k in range(10):
        past_total.step(k, seconds=0.2)
        jump.step(k, seconds=0.2)
        final.step(k, seconds=0.2)
        rerun.step(k, seconds=0.2)
    cfg = write_cfg(work, min_stall=4, grace=120)
    daemon = start_daemon(cfg, outputs, work / "daemon.out")
    procs.append(daemon)
    wait_for(lambda: len(jobs(cfg)) == 5 and jobs(cfg)["7402"]["last_step"] == 9, "the jobs read")
    past_total.write("completed step: 9999999, seconds: 1.000")  # the line, verbatim
    jump.task(0, "completed step: 50000, seconds: 0.200, Tokens/s/device: 3000.0, loss: 2.5")
    restored.task(0, L.restore_line(2999))  # the daemon saw no step of this job before
    for k in range(3000, 3006):
        restored.step(k, seconds=0.2)
    rerun.task(0, L.restore_line(4))  # requeued: re-does 5..9 from the checkpoint, then 10..12
    for k in range(5, 13):
        rerun.step(k, seconds=0.2)

    def hang_pages(job_id: str) -> list[dict[str, Any]]:
        return [n for n in of(job_id, work, "open") if n["kind"] == "hang"]

    # (A page may open and resolve before the new lines are read: the newest one counts.)
    for job_id, step in (("7401", 9), ("7402", 9), ("7403", 3005), ("7405", 12)):
        wait_for(
            lambda j=job_id, s=step: any(f"step {s} was read" in p["body"] for p in hang_pages(j)),
            f"the hang page of {job_id} at step {step}",
            timeout=60,
        )
    st = jobs(cfg)
    assert (st["7401"]["last_step"], st["7401"]["total_steps"]) == (9, 5000)
    assert st["7402"]["last_step"] == 9
    assert st["7404"]["last_step"] == 9 and st["7404"]["open_incidents"] == []  # finished, not hung
    ignored = {
        n["title"].rsplit(" ", 1)[1]: n
        for n in notes(work)
        if n["title"].startswith("implausible step line ignored: job ")
    }
    assert sorted(ignored) == ["7401", "7402"]
    assert "past the configured total of 5000 steps" in ignored["7401"]["body"]
    assert "step 50000 is 49991 steps after step 9" in ignored["7402"]["body"]
    assert ignored["7401"]["severity"] == "warning"
    # Real progress after the bogus line counts again, and resolves the page.
    past_total.step(10, seconds=0.2)
    wait_for(lambda: jobs(cfg)["7401"]["last_step"] == 10, "real progress after the bogus line")
    wait_for(lambda: bool(of("7401", work, "resolve")), "the hang resolved by step 10")
    assert len([n for n in notes(work) if n["title"].startswith("implausible")]) == 2  # said once
    assert stop(daemon) == 0


def test_the_hang_clock_survives_a_sigkill_right_after_a_step(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work, outputs = short_tmp, short_tmp / "outputs"
    job = JobLog(outputs, "7501")
    for k in range(8):
        job.step(k, seconds=0.2)
    cfg = write_cfg(work, min_stall=600, grace=120)
    daemon = start_daemon(cfg, outputs, work / "daemon.out")
    procs.append(daemon)
    wait_for(lambda: jobs(cfg).get("7501", {}).get("last_step") == 7, "the log read")
    job.step(8, seconds=0.2)
    job.step(9, seconds=0.2)
    wait_for(lambda: jobs(cfg)["7501"]["last_step"] == 9, "steps 8 and 9 read")
    read_at = jobs(cfg)["7501"]["last_step_at"]
    ticks = status(cfg)["status"]["ticks"]
    wait_for(lambda: status(cfg)["status"]["ticks"] > ticks, "the tick after")
    assert stop(daemon, signal.SIGKILL) == -signal.SIGKILL  # well within the minute of the old saves

    daemon2 = start_daemon(cfg, outputs, work / "daemon2.out")
    procs.append(daemon2)
    wait_for(lambda: status(cfg).get("running") is True, "restarted daemon")
    wait_for(lambda: jobs(cfg).get("7501", {}).get("last_step") == 9, "the log re-read")
    assert jobs(cfg)["7501"]["last_step_at"] == pytest.approx(read_at, abs=1e-3)  # the clock survived
    assert stop(daemon2) == 0
