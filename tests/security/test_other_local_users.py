"""Other local users cannot talk to the running daemon's status socket nor read its state dir.

A real daemon (`jobdiagd run`, as root here) and two real local users: `jobdiagd-probe`,
created by the fixture (useradd) and named in `[daemon] socket_group`, and `nobody`, in no
group of the daemon. Each probe runs as that user (`runuser`) in a separate Python process
and reports what the kernel let it do. Controls prove the probes could succeed: both users
can enter the work directory and connect to a world-writable socket in it, and the group
member gets the daemon's status through the group socket.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PROBE_USER = "jobdiagd-probe"
SYSTEM_PY = "/usr/bin/python3"  # the probes must not need the (root-owned) venv

# What a local user would try: list and read the state dir, connect and ask for the status.
PROBE = r"""
import json, os, socket, sys
state, sock, control = sys.argv[1:4]
out = {}
def attempt(name, fn):
    try:
        out[name] = ["ok", fn()]
    except OSError as exc:
        out[name] = ["denied" if exc.errno in (1, 13) else "error", exc.strerror]
def listdir():
    return os.listdir(state)
def read_files():
    return [open(os.path.join(state, n), "rb").read(16).hex() for n in sorted(os.listdir(state))]
def talk(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    s.sendall(b'{"cmd": "status"}\n')
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return json.loads(data or b"null") is not None
attempt("list_state", listdir)
attempt("read_state", read_files)
attempt("read_db", lambda: open(os.path.join(state, "alerts.sqlite3"), "rb").read(16).hex())
attempt("status_socket", lambda: talk(sock))
attempt("control_socket", lambda: socket.socket(socket.AF_UNIX).connect(control) or True)
attempt("enter_work_dir", lambda: os.listdir(os.path.dirname(sock)) is not None)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe_user() -> str:
    assert os.geteuid() == 0, "this test creates a local user: run it as root (as CI does)"
    try:
        pwd.getpwnam(PROBE_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", PROBE_USER],
            check=True,
        )
    return PROBE_USER


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="jdsec-", dir="/tmp") as d:
        os.chmod(d, 0o755)  # others may enter: only the daemon's own modes may stop them
        yield Path(d)


def _control_socket(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    os.chmod(path, 0o666)
    s.listen(8)
    return s


def probe_as(user: str, work: Path) -> dict[str, list[object]]:
    done = subprocess.run(
        ["runuser", "-u", user, "--", SYSTEM_PY, "-c", PROBE, str(work / "state"), str(work / "jd.sock"),
         str(work / "control.sock")],
        capture_output=True, text=True, timeout=60, check=False, cwd="/",
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, list[object]] = json.loads(done.stdout)
    print(user, result)
    return result


@pytest.mark.daemon
def test_other_users_cannot_connect_to_the_socket_nor_read_the_state_dir(probe_user: str, work: Path) -> None:
    outputs = work / "outputs"
    outputs.mkdir()
    cfg = work / "cfg.toml"
    cfg.write_text(
        f"""
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jd.sock"
socket_group = "{probe_user}"
tick_seconds = 0.5
log_level = "info"
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
"""
    )
    control = _control_socket(work / "control.sock")
    with open(work / "daemon.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobdiagd.cli", "run", "--config", str(cfg), "--watch", str(outputs)],
            stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 90
        while not (work / "jd.sock").exists() or not (work / "state" / "alerts.sqlite3").exists():
            assert proc.poll() is None, (work / "daemon.log").read_text()
            assert time.monotonic() < deadline, "the daemon did not start"
            time.sleep(0.2)
        root_view = subprocess.run(
            [sys.executable, "-m", "jobdiagd.cli", "status", "--config", str(cfg), "--json"],
            capture_output=True, text=True, timeout=30, check=False,
        )
        assert json.loads(root_view.stdout)["status"]["pid"] == proc.pid  # the daemon answers its own user

        member = probe_as(probe_user, work)
        outsider = probe_as("nobody", work)
        sock = os.stat(work / "jd.sock")
    finally:
        control.close()
        proc.terminate()
        proc.wait(timeout=30)

    # Controls: both users reach the work dir and can connect to a socket that allows them.
    for seen in (member, outsider):
        assert seen["enter_work_dir"][0] == "ok" and seen["control_socket"][0] == "ok", seen
    # The socket group's member gets the status; nobody else can even connect.
    assert member["status_socket"] == ["ok", True], member
    assert outsider["status_socket"][0] == "denied", outsider
    # The state dir (incidents, outbox, chat message ids) is the daemon user's alone.
    for seen in (member, outsider):
        for what in ("list_state", "read_state", "read_db"):
            assert seen[what][0] == "denied", (what, seen)
    assert sock.st_gid == grp.getgrnam(probe_user).gr_gid and oct(sock.st_mode & 0o777) == oct(0o660)
