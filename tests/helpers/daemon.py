"""`jobdiagd run` as a real process in tests: its config, start, status, notes, stop, `procs` fixture."""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import multiprocessing.process
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.cli import main

PY = sys.executable


def write_cfg(work: Path, *, min_stall: float, tick: float = 0.5) -> Path:
    cfg = work / "cfg.toml"
    cfg.write_text(
        f"""
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jd.sock"
tick_seconds = {tick}
log_level = "info"
[detectors.hang]
min_stall_seconds = {min_stall}
startup_grace_seconds = 60
[notifiers.console]
stream = "stdout"
color = "never"
[notifiers.jsonl]
enabled = true
"""
    )
    return cfg


def chat_daemon_toml(work: Path, *, min_stall: float) -> str:
    """The part of a chat conversation daemon's config both transports share (quiet console,
    jsonl on, fast retries); the Telegram and Slack rigs append their notifier's section."""
    return f"""
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jd.sock"
tick_seconds = 0.5
log_level = "error"
[slurm]
outputs_roots = ["{work}/outputs"]
[detectors.hang]
min_stall_seconds = {min_stall}
startup_grace_seconds = 60
[delivery]
retry_initial_seconds = 0.2
retry_max_seconds = 1
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
"""


def start_daemon(cfg: Path, outputs: Path, log: Path) -> subprocess.Popen[bytes]:
    fh = open(log, "ab")  # noqa: SIM115 - owned by the child for its lifetime
    return subprocess.Popen(
        [PY, "-m", "jobdiagd.cli", "run", "--config", str(cfg), "--watch", str(outputs)],
        stdout=fh,
        stderr=subprocess.STDOUT,
    )


def notes(work: Path) -> list[dict[str, Any]]:
    p = work / "state" / "notifications.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def wait_for(pred: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def status_cli(cfg: Path, *args: str) -> tuple[int, str]:
    """`jobdiagd status --config CFG ARGS...`: its exit code and what it printed.

    Run in this process (the same `jobdiagd.cli.main` a subprocess would run), not as a new
    Python: tests poll it every 0.2 s while they wait, and a fresh interpreter per poll cost
    about 0.1 s of CPU each, a fifth of a core per waiting test on the 2-core CI machine."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["status", "--config", str(cfg), *args])
    return rc, out.getvalue() or err.getvalue()


def status(cfg: Path) -> dict[str, Any]:
    rc, out = status_cli(cfg, "--json")
    assert rc in (0, 1, 3), out  # 3: not (yet) running
    res: dict[str, Any] = json.loads(out)
    return res


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    return proc.wait(timeout=30)


# What `jobdiagd run` imports before its first tick (python-telegram-bot and slack_sdk included).
RUN_MODULES = ["jobdiagd.cli", "jobdiagd.service.cli", "jobdiagd.service.runner", "tests.helpers.daemon"]


def _run_cli(argv: list[str], log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.exit(main(argv))


class ForkedDaemon:
    """A `jobdiagd run` process forked from a server that has imported the daemon already (see
    `fork_daemon`); the part of subprocess.Popen the tests use."""

    def __init__(self, proc: multiprocessing.process.BaseProcess) -> None:
        self._proc = proc

    @property
    def pid(self) -> int:
        assert self._proc.pid is not None
        return self._proc.pid

    def poll(self) -> int | None:
        return None if self._proc.is_alive() else self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(f"jobdiagd run (pid {self.pid})", timeout or 0)
        return self._proc.exitcode


def fork_daemon(argv: list[str], log: Path) -> ForkedDaemon:
    """`jobdiagd <argv>` (`jobdiagd.cli.main`, as `python -m jobdiagd.cli` runs it), output
    appended to `log`, forked from this test process's multiprocessing fork server, which
    imported the daemon's modules once. For a test that starts the daemon dozens of times (the
    kill -9 loop): a fresh interpreter spends about a second of CPU importing them, each time.
    The forked daemons share the server's multiprocessing resource tracker: the semaphores of
    the plot pools of daemons killed with SIGKILL are cleaned up when the test process exits
    (with a "leaked semaphore" warning), not when each daemon dies."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(RUN_MODULES)
    proc = ctx.Process(target=_run_cli, args=(argv, str(log)), daemon=False)
    proc.start()
    return ForkedDaemon(proc)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Daemons started by a test; killed at its end whatever happened (a wedged one too)."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
