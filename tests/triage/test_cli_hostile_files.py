"""`jobdiagd triage` against hostile log files: a FIFO, socket or directory where a
log (main, Ray worker or rank log) should be, symlinks out of the job's outputs root, another
user's file, and a bogus step line. Each run is a real CLI process with a timeout, so a reader
that blocks fails the test instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import sys
from pathlib import Path

from jobdiagd.triage.engine import triage
from tests.helpers.joblog import JobLog

NOBODY = pwd.getpwnam("nobody")
SECRET = "root:$y$j9T$SECRET-HASH-0123456789:19000:0:99999:7:::"
# What triage would quote: the oom signature's evidence line carries the secret.
SECRET_LINES = f"{SECRET}\nslurmstepd: error: Detected 1 oom-kill event(s) {SECRET}\n"


def run_triage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobdiagd.cli", "triage", *args, "--no-slurm", "--now", "2e9"],
        capture_output=True,
        text=True,
        timeout=60,  # a blocked open() fails the test here (TimeoutExpired), never hangs the suite
        check=False,
    )


def a_job(outputs: Path, job_id: str) -> JobLog:
    job = JobLog(outputs, job_id, steps=100)
    for k in range(5):
        job.step(k)
    return job


def test_a_fifo_as_the_main_log_is_one_clear_error_not_a_hang(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    job = a_job(outputs, "8101")
    job.path.unlink()
    os.mkfifo(job.path)
    res = run_triage(str(job.dir))
    assert res.returncode == 2
    assert res.stderr.strip() == f"jobdiagd triage: {job.dir}: log refused: not a regular file (a FIFO)"
    res = run_triage(str(job.path))  # the FIFO named directly
    assert res.returncode == 2 and "a FIFO, not a job directory or log file" in res.stderr


def test_a_fifo_or_socket_among_worker_and_rank_logs_is_skipped_and_named(short_tmp: Path) -> None:
    # short_tmp: the socket's path must stay under 108 bytes (a pytest-xdist worker's tmp_path is longer).
    outputs = short_tmp / "outputs"
    job = a_job(outputs, "8102")
    host = job.dir / "ray_logs" / "node001"
    host.mkdir(parents=True)
    os.mkfifo(host / "worker-0001-01000000-11.out")
    (host / "worker-0002-01000000-12.out").write_text("completed step: 3, seconds: 1.0\n")
    os.mkfifo(job.dir / "rank-1.log")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(job.dir / "rank-2.log"))
    try:
        res = run_triage(str(job.dir), "--json")
    finally:
        sock.close()
    assert res.returncode == 0, res.stderr
    notes = json.loads(res.stdout)["notes"]
    assert f"{host / 'worker-0001-01000000-11.out'}: not a regular file (a FIFO)" in notes
    assert f"{job.dir / 'rank-1.log'}: not a regular file (a FIFO)" in notes
    assert f"{job.dir / 'rank-2.log'}: not a regular file (a socket)" in notes


def test_a_log_link_out_of_the_outputs_root_is_refused_and_never_quoted(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    secret = tmp_path / "shadow"
    secret.write_text(SECRET_LINES)
    secret.chmod(0o600)
    job = a_job(outputs, "8103")
    (job.dir / "log").unlink()
    (job.dir / "log").symlink_to(secret)
    res = run_triage(str(job.dir))
    assert "SECRET" not in res.stdout + res.stderr
    assert res.returncode == 2
    assert f"log refused: resolves to {secret}, outside the allowed log roots ({outputs})" in res.stderr
    # A log given directly that is itself such a link: the same.
    link = outputs / "8104-JAX-x.log"
    link.symlink_to(secret)
    res = run_triage(str(link))
    assert res.returncode == 2 and "SECRET" not in res.stdout + res.stderr
    # The library entry point applies the same rule.
    try:
        triage(job.dir, now=2e9)
    except OSError as exc:
        assert "outside the allowed log roots" in str(exc)
    else:
        raise AssertionError("triage() read a log outside the outputs root")


def test_worker_and_rank_links_out_of_the_root_are_skipped_and_never_quoted(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    secret = tmp_path / "shadow"
    secret.write_text(SECRET_LINES)
    job = a_job(outputs, "8105")
    host = job.dir / "ray_logs" / "node001"
    host.mkdir(parents=True)
    (host / "worker-0001-01000000-11.err").symlink_to(secret)
    (job.dir / "rank-3.log").symlink_to(secret)
    res = run_triage(str(job.dir), "--json")
    assert res.returncode == 0, res.stderr
    assert "SECRET" not in res.stdout + res.stderr
    notes = json.loads(res.stdout)["notes"]
    assert sum("outside the allowed log roots" in n for n in notes) == 2


def test_another_users_file_is_refused_but_links_inside_the_roots_work(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    foreign = a_job(outputs, "8106")
    os.chown(foreign.path, NOBODY.pw_uid, NOBODY.pw_gid)  # root's job dir, nobody's log
    res = run_triage(str(foreign.dir))
    assert res.returncode == 2
    assert f"owned by uid {NOBODY.pw_uid}, not by uid 0 (the owner of the job directory)" in res.stderr

    tagged = a_job(outputs, "8107")  # the TGS tagger renames the log and repoints `log`
    renamed = outputs / f"{tagged.path.stem}-2N-TGS_3000.log"
    os.rename(tagged.path, renamed)
    (tagged.dir / "log").unlink()
    (tagged.dir / "log").symlink_to(f"../{renamed.name}")
    res = run_triage(str(tagged.dir), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["progress"]["last_step"] == 4

    archive = tmp_path / "archive"  # a second root the caller names with --outputs
    archived = a_job(archive, "8108")
    moved = a_job(outputs, "8109")
    (moved.dir / "log").unlink()
    (moved.dir / "log").symlink_to(archived.path)
    assert run_triage(str(moved.dir)).returncode == 2
    res = run_triage(str(moved.dir), "--outputs", str(archive), "--json")
    assert res.returncode == 0, res.stderr


def test_a_bogus_step_line_is_left_out_of_triage_progress(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    job = a_job(outputs, "8110")
    job.write("completed step: 9999999, seconds: 1.000")
    res = run_triage(str(job.dir), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["progress"]["last_step"] == 4
    assert any(
        "Implausible step line(s) ignored" in n
        and "9999999 (step 9999999 is past the configured total of 100" in n
        for n in doc["notes"]
    )
