"""run_daemon closes each resource where it opened it: a failure while opening one closes those before it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobdiagd.alerts.store import DB_NAME
from jobdiagd.config import ConfigError
from jobdiagd.privatefs import lock_state_dir
from jobdiagd.service.runner import run_daemon

pytestmark = pytest.mark.daemon


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another process-level listener holds: binding the metrics server to it fails for real."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def write_config(work: Path, *, metrics_port: int = 0, outputs: bool = True) -> Path:
    roots = f'[slurm]\noutputs_roots = ["{work}/outputs"]\n' if outputs else ""
    (work / "outputs").mkdir(exist_ok=True)
    cfg = work / "cfg.toml"
    cfg.write_text(
        f"""
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jd.sock"
tick_seconds = 0.5
log_level = "error"
metrics_port = {metrics_port}
{roots}
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
"""
    )
    return cfg


def assert_state_dir_released(state: Path) -> None:
    # flock is per open file: a lock fd leaked by this process would refuse this one.
    os.close(lock_state_dir(state))
    # SQLite removes the WAL file when the last connection to the store closes.
    assert (state / DB_NAME).exists()
    assert not (state / f"{DB_NAME}-wal").exists(), "a connection to the store was left open"


async def test_a_metrics_port_in_use_closes_the_socket_store_and_lock_opened_before_it(
    short_tmp: Path, busy_port: int
) -> None:
    cfg = write_config(short_tmp, metrics_port=busy_port)
    with pytest.raises(ExceptionGroup) as raised:
        await run_daemon(cfg, discover="outputs", handle_signals=False, configure_logs=False)
    # One error, the one that stopped the start.
    [error] = raised.value.exceptions
    assert isinstance(error, OSError) and str(busy_port) in str(error)
    # The status socket was listening before the metrics server failed: stopped and removed.
    assert not (short_tmp / "jd.sock").exists()
    assert_state_dir_released(short_tmp / "state")


async def test_a_failure_after_the_store_opened_closes_store_and_lock(short_tmp: Path) -> None:
    # outputs discovery without a root is refused only after the store opened (it reads the known jobs).
    cfg = write_config(short_tmp, outputs=False)
    with pytest.raises(ConfigError, match="outputs discovery needs"):
        await run_daemon(cfg, discover="outputs", handle_signals=False, configure_logs=False)
    assert_state_dir_released(short_tmp / "state")


def test_jobdiagd_run_says_a_metrics_port_in_use_in_one_line(short_tmp: Path, busy_port: int) -> None:
    cfg = write_config(short_tmp, metrics_port=busy_port)
    proc = subprocess.run(
        [sys.executable, "-m", "jobdiagd.cli", "run", "--config", str(cfg), "--discover", "outputs"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    # log_level = "error": the daemon's own log lines are quiet; the refusal is one line.
    [line] = proc.stderr.splitlines()
    assert line.startswith("jobdiagd run: OSError:") and str(busy_port) in line
    assert not (short_tmp / "jd.sock").exists()


async def test_a_stop_requested_before_the_first_step_still_closes_store_and_lock(short_tmp: Path) -> None:
    # The store and lock are open before any step runs: a stop at that moment must close them too.
    cfg = write_config(short_tmp)
    await run_daemon(
        cfg,
        discover="outputs",
        handle_signals=False,
        configure_logs=False,
        on_started=lambda lc, _engine: lc.request_stop("stopped before the first step"),
    )
    assert not (short_tmp / "jd.sock").exists()
    assert_state_dir_released(short_tmp / "state")
