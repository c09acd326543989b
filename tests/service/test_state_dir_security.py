"""The state dir belongs to the daemon's user alone: 0700/0600 whatever the umask, foreign or
world-writable dirs and files refused, planted symlinks never followed.

Real daemon processes, real permissions, and a second real local user (`nobody`): dirs and
files are chown'ed to it, and links are planted as it (`setpriv`), as an attacker would.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.daemon import notes, start_daemon, status, stop, wait_for, write_cfg
from tests.helpers.joblog import JobLog

# Runs the real daemon on real time (tests/conftest.py: service markers).
pytestmark = pytest.mark.daemon

PY = sys.executable
NOBODY = pwd.getpwnam("nobody")
AS_NOBODY = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups"]
SECRET = "root-only: the daemon must never write here\n"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def run_once(cfg: Path, outputs: Path, *, as_nobody: bool = False) -> subprocess.CompletedProcess[str]:
    """Start `jobdiagd run`; a refusal ends it at once (a daemon that starts is killed at the timeout)."""
    argv = [PY, "-m", "jobdiagd.cli", "run", "--config", str(cfg), "--watch", str(outputs)]
    try:
        return subprocess.run(
            (AS_NOBODY if as_nobody else []) + argv, capture_output=True, text=True, timeout=20, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the daemon started instead of refusing its state dir")


def assert_one_line_refusal(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def root_only_file(work: Path) -> Path:
    target = work / "root-only"
    target.write_text(SECRET)
    os.chmod(target, 0o600)
    return target


def test_state_files_are_private_whatever_the_umask(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work = short_tmp
    cfg = write_cfg(work, min_stall=3)
    job = JobLog(work / "outputs", "6401")
    for k in range(8):
        job.step(k, seconds=0.2)
    old = os.umask(0o022)  # outside systemd: the usual login umask, inherited by the daemon
    try:
        daemon = start_daemon(cfg, work / "outputs", work / "daemon.out")
    finally:
        os.umask(old)
    procs.append(daemon)
    wait_for(lambda: any(n["event"] == "open" for n in notes(work)), "a hang page")
    state = work / "state"
    names = [
        "alerts.sqlite3",
        "alerts.sqlite3-wal",
        "alerts.sqlite3-shm",
        "notifications.jsonl",
        "jobdiagd.lock",
    ]
    assert mode(state) == 0o700
    assert {n: oct(mode(state / n)) for n in names} == {n: "0o600" for n in names}
    assert stop(daemon) == 0

    # Files left loose by an older version (or a hand-made dir) are tightened at the next start.
    os.chmod(state, 0o755)
    for n in ("alerts.sqlite3", "notifications.jsonl"):
        os.chmod(state / n, 0o644)
    daemon2 = start_daemon(cfg, work / "outputs", work / "daemon2.out")
    procs.append(daemon2)
    wait_for(lambda: bool(status(cfg).get("running")), "the restarted daemon")
    assert mode(state) == 0o700
    assert mode(state / "alerts.sqlite3") == 0o600 and mode(state / "notifications.jsonl") == 0o600
    assert stop(daemon2) == 0


@pytest.mark.parametrize("dir_mode", [0o777, 0o700], ids=["world-writable", "private"])
def test_a_state_dir_owned_by_another_user_is_refused_and_its_planted_link_never_followed(
    short_tmp: Path, dir_mode: int
) -> None:
    """The reported attack: a world-writable state dir another user made, with a link in it."""
    work = short_tmp
    os.chmod(work, 0o755)  # nobody must reach the state dir to plant its link
    cfg = write_cfg(work, min_stall=3)
    (work / "outputs").mkdir()
    target = root_only_file(work)
    state = work / "state"
    state.mkdir()
    os.chown(state, NOBODY.pw_uid, NOBODY.pw_gid)
    os.chmod(state, 0o777)
    subprocess.run([*AS_NOBODY, "ln", "-s", str(target), str(state / "notifications.jsonl")], check=True)
    os.chmod(state, dir_mode)
    assert os.lstat(state / "notifications.jsonl").st_uid == NOBODY.pw_uid

    done = run_once(cfg, work / "outputs")
    assert_one_line_refusal(done, f"state dir {state} is owned by nobody", "refusing")
    assert target.read_text() == SECRET
    assert sorted(os.listdir(state)) == ["notifications.jsonl"]  # nothing created in there either


def test_a_state_dir_writable_by_others_is_refused_even_when_the_daemon_user_owns_it(short_tmp: Path) -> None:
    work = short_tmp
    cfg = write_cfg(work, min_stall=3)
    (work / "outputs").mkdir()
    (work / "state").mkdir(mode=0o700)
    os.chmod(work / "state", 0o777)
    done = run_once(cfg, work / "outputs")
    assert_one_line_refusal(done, "is writable by group or others (mode 0777)", "chmod go-w")
    assert os.listdir(work / "state") == []


def test_a_notifier_file_owned_by_another_user_is_refused(short_tmp: Path) -> None:
    work = short_tmp
    cfg = write_cfg(work, min_stall=3)
    (work / "outputs").mkdir()
    (work / "state").mkdir(mode=0o700)
    jsonl = work / "state" / "notifications.jsonl"
    jsonl.write_text("")
    os.chown(jsonl, NOBODY.pw_uid, NOBODY.pw_gid)
    done = run_once(cfg, work / "outputs")
    assert_one_line_refusal(done, f"notifier file {jsonl} is owned by nobody")


@pytest.mark.parametrize(
    "name", ["alerts.sqlite3", "alerts.sqlite3-wal", "notifications.jsonl", "jobdiagd.lock"]
)
def test_a_link_planted_in_place_of_a_state_file_is_refused(short_tmp: Path, name: str) -> None:
    work = short_tmp
    cfg = write_cfg(work, min_stall=3)
    (work / "outputs").mkdir()
    (work / "state").mkdir(mode=0o700)
    target = root_only_file(work)
    (work / "state" / name).symlink_to(target)
    done = run_once(cfg, work / "outputs")
    assert_one_line_refusal(done, f"{work / 'state' / name} is a symbolic link", "refusing to follow it")
    assert target.read_text() == SECRET


def test_a_link_planted_after_start_is_not_written_through(
    short_tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work = short_tmp
    cfg = write_cfg(work, min_stall=3)
    (work / "outputs").mkdir()
    target = root_only_file(work)
    daemon = start_daemon(cfg, work / "outputs", work / "daemon.out")
    procs.append(daemon)
    wait_for(lambda: bool(status(cfg).get("running")), "the daemon")
    jsonl = work / "state" / "notifications.jsonl"
    jsonl.symlink_to(target)  # however it got there, the daemon must not follow it
    job = JobLog(work / "outputs", "6402")
    for k in range(8):
        job.step(k, seconds=0.2)
    out = work / "daemon.out"
    wait_for(lambda: b'"notifier_failing"' in out.read_bytes(), "the jsonl send to fail")
    assert target.read_text() == SECRET and daemon.poll() is None
    failing = [json.loads(x) for x in out.read_text().splitlines() if '"notifier_failing"' in x]
    assert failing[0]["notifier"] == "jsonl" and "Too many levels of symbolic links" in failing[0]["error"]

    jsonl.unlink()  # the operator removes it: the page, retried, arrives
    wait_for(lambda: [n["job_id"] for n in notes(work)] == ["6402"], "the retried page")
    assert stat.S_ISREG(os.lstat(jsonl).st_mode) and mode(jsonl) == 0o600
    assert target.read_text() == SECRET
    assert stop(daemon) == 0


def test_a_state_dir_that_is_a_file_gives_one_line(short_tmp: Path) -> None:
    work = short_tmp
    cfg = write_cfg(work, min_stall=3)
    (work / "outputs").mkdir()
    (work / "state").write_text("not a dir\n")
    done = run_once(cfg, work / "outputs")
    assert_one_line_refusal(done, f"state dir {work / 'state'} is not a directory")


def test_a_state_dir_the_daemon_user_cannot_read_gives_one_line(short_tmp: Path) -> None:
    """The daemon runs as `nobody` here; the state dir is root's (0700)."""
    work = short_tmp
    os.chmod(work, 0o755)
    cfg = write_cfg(work, min_stall=3)
    os.chmod(cfg, 0o644)
    (work / "outputs").mkdir(mode=0o755)
    (work / "state").mkdir(mode=0o700)
    done = run_once(cfg, work / "outputs", as_nobody=True)
    assert_one_line_refusal(done, f"state dir {work / 'state'} is owned by root (uid 0)")

    # A path it cannot even look into.
    (work / "locked").mkdir(mode=0o700)
    cfg.write_text(cfg.read_text().replace(f'"{work}/state"', f'"{work}/locked/state"'))
    done = run_once(cfg, work / "outputs", as_nobody=True)
    assert_one_line_refusal(done, f"state dir {work / 'locked' / 'state'}: cannot", "Permission denied")


def test_a_state_dir_link_counts_only_when_the_daemon_user_or_root_made_it(short_tmp: Path) -> None:
    from jobdiagd.privatefs import UnsafePathError, ensure_private_dir

    os.chmod(short_tmp, 0o755)
    real = short_tmp / "real-state"
    real.mkdir(mode=0o700)
    mine = short_tmp / "mine"
    mine.symlink_to(real)  # an admin moving the state to another disk
    assert ensure_private_dir(mine) == mine
    links = short_tmp / "links"
    links.mkdir()
    os.chmod(links, 0o777)
    theirs = links / "theirs"
    subprocess.run([*AS_NOBODY, "ln", "-s", str(real), str(theirs)], check=True)
    with pytest.raises(UnsafePathError, match="is a symlink owned by nobody"):
        ensure_private_dir(theirs)
