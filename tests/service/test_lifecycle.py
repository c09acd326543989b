"""Lifecycle: ordered setup, reverse cleanup with every step attempted, errors gathered, signals."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.service.lifecycle import Lifecycle
from jobdiagd.service.sdnotify import SdNotifier

CHILD = Path(__file__).with_name("lifecycle_child.py")


def make(
    log: list[str],
    name: str,
    fail_setup: bool = False,
    fail_cleanup: bool = False,
    hang_cleanup: bool = False,
) -> tuple[Callable[[], Coroutine[Any, Any, None]], Callable[[], Coroutine[Any, Any, None]]]:
    async def setup() -> None:
        log.append(f"setup {name}")
        if fail_setup:
            raise RuntimeError(f"setup {name} broke")

    async def cleanup() -> None:
        log.append(f"cleanup {name}")
        if hang_cleanup:
            await asyncio.Event().wait()
        if fail_cleanup:
            raise OSError(f"cleanup {name} broke")

    return setup, cleanup


async def test_clean_run_sets_up_in_order_and_cleans_up_in_reverse() -> None:
    log: list[str] = []
    lc = Lifecycle()
    for n in "abc":
        lc.add_step(n, *make(log, n))

    async def work() -> None:
        log.append("task ran")
        lc.request_stop("done")

    lc.add_task("work", work)
    await lc.run()
    assert log == ["setup a", "setup b", "setup c", "task ran", "cleanup c", "cleanup b", "cleanup a"]
    assert lc.stop_reason == "done"


async def test_failed_setup_cleans_up_only_what_was_set_up() -> None:
    log: list[str] = []
    lc = Lifecycle()
    lc.add_step("a", *make(log, "a"))
    lc.add_step("b", *make(log, "b", fail_setup=True))
    lc.add_step("c", *make(log, "c"))
    lc.add_task("never", lambda: asyncio.sleep(0))
    with pytest.raises(ExceptionGroup) as info:
        await lc.run()
    assert log == ["setup a", "setup b", "cleanup a"]
    assert [str(e) for e in info.value.exceptions] == ["setup b broke"]


async def test_adopted_resources_close_after_every_step_in_reverse_even_when_a_setup_fails() -> None:
    log: list[str] = []
    lc = Lifecycle()
    async with lc.opening():
        lc.adopt("lock", lambda: log.append("close lock"))
        lc.adopt("store", lambda: log.append("close store"))
    lc.add_step("a", *make(log, "a"))
    lc.add_step("b", *make(log, "b", fail_setup=True))
    with pytest.raises(ExceptionGroup):
        await lc.run()
    assert log == ["setup a", "setup b", "cleanup a", "close store", "close lock"]


async def test_a_failure_while_opening_closes_what_was_adopted_before_it() -> None:
    log: list[str] = []
    lc = Lifecycle()

    def broken_close() -> None:
        log.append("close lock")
        raise OSError("close lock broke")

    with pytest.raises(ValueError, match="third resource"):
        async with lc.opening():
            lc.adopt("lock", broken_close)
            lc.adopt("store", lambda: log.append("close store"))
            raise ValueError("third resource failed to open")
    # Every close attempted, in reverse; the error that stopped the start is the one raised.
    assert log == ["close store", "close lock"]
    await lc.close_opened()  # nothing left to close twice
    assert log == ["close store", "close lock"]


async def test_a_stop_before_run_still_closes_the_adopted_resources() -> None:
    log: list[str] = []
    lc = Lifecycle()
    lc.adopt("store", lambda: log.append("close store"))
    lc.add_step("a", *make(log, "a"))
    lc.request_stop("early")
    await lc.run()
    assert log == ["close store"]


async def test_every_cleanup_is_attempted_and_errors_are_gathered() -> None:
    log: list[str] = []
    lc = Lifecycle(stop_seconds=0.3)
    lc.add_step("a", *make(log, "a", fail_cleanup=True))
    lc.add_step("b", *make(log, "b", hang_cleanup=True))
    lc.add_step("c", *make(log, "c", fail_cleanup=True))

    async def boom() -> None:
        raise ValueError("task exploded")

    lc.add_task("boom", boom)
    with pytest.raises(ExceptionGroup) as info:
        await lc.run()
    assert log == ["setup a", "setup b", "setup c", "cleanup c", "cleanup b", "cleanup a"]
    kinds = [type(e).__name__ for e in info.value.exceptions]
    assert kinds == ["ValueError", "OSError", "TimeoutError", "OSError"]
    assert lc.stop_reason == "task boom failed"


async def test_a_best_effort_cleanup_cut_at_the_deadline_is_a_warning_not_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The final delivery behind a chat's rate limit: cut at the stop deadline, its leftovers wait
    # in the outbox; the run still ends cleanly, and the steps cleaned up after it still run.
    log: list[str] = []
    lc = Lifecycle(stop_seconds=0.3)
    lc.add_step("a", *make(log, "a"))
    setup, cleanup = make(log, "slow", hang_cleanup=True)
    lc.add_step("slow", setup, cleanup, cut_means="left in the outbox")

    async def stopper() -> None:
        lc.request_stop("test")

    lc.add_task("stopper", stopper)
    await lc.run()
    assert log == ["setup a", "setup slow", "cleanup slow", "cleanup a"]
    out = capsys.readouterr()
    assert "cleanup_cut" in out.out + out.err and "left in the outbox" in out.out + out.err
    assert "cleanup_failed" not in out.out + out.err


async def test_stop_cancels_a_task_that_ignores_it() -> None:
    lc = Lifecycle(drain_seconds=0.05)
    cancelled = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def stopper() -> None:
        await asyncio.sleep(0)
        lc.request_stop("test")

    lc.add_task("stubborn", stubborn)
    lc.add_task("stopper", stopper)
    await lc.run()
    assert cancelled.is_set()


async def test_reload_callback_errors_are_not_fatal() -> None:
    calls: list[str] = []

    def bad() -> None:
        calls.append("bad")
        raise ValueError("config.toml: [daemon] tick_seconds: must be > 0, got 0")

    lc = Lifecycle(on_reload=bad)
    assert await lc.reload() is False
    assert calls == ["bad"]

    async def good() -> None:
        calls.append("good")

    lc.on_reload = good
    assert await lc.reload() is True
    assert lc.reloads == 1


async def test_watchdog_pings_only_while_healthy(tmp_path: Path) -> None:
    path = tmp_path / "n.sock"
    recv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    recv.bind(str(path))
    recv.setblocking(False)
    healthy = {"ok": False}
    lc = Lifecycle(sd=SdNotifier(str(path), watchdog_usec=20_000), watchdog_check=lambda: healthy["ok"])

    async def driver() -> None:
        await asyncio.sleep(0.1)  # several watchdog intervals while unhealthy
        healthy["ok"] = True
        while True:
            await asyncio.sleep(0.01)
            try:
                if b"WATCHDOG=1" in recv.recv(4096):
                    lc.request_stop("got ping")
                    return
            except BlockingIOError:
                continue

    lc.add_task("driver", driver)
    try:
        await asyncio.wait_for(lc.run(), timeout=20)
    finally:
        recv.close()
    assert lc.stop_reason == "got ping"


def _recv_until(sock: socket.socket, needle: bytes, timeout: float = 30) -> list[bytes]:
    sock.settimeout(timeout)
    got = []
    while True:
        msg = sock.recv(4096)
        got.append(msg)
        if needle in msg:
            return got


def test_sigterm_drains_and_exits_with_sd_notify(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    recv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    recv.bind(str(path))
    env = {**os.environ, "NOTIFY_SOCKET": str(path), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(CHILD)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        _recv_until(recv, b"READY=1")
        proc.send_signal(signal.SIGHUP)
        reload_msgs = _recv_until(recv, b"READY=1")
        assert any(b"RELOADING=1" in m for m in reload_msgs)
        proc.send_signal(signal.SIGTERM)
        stopping = _recv_until(recv, b"STOPPING=1")
        assert b"SIGTERM" in stopping[-1]
        out, err = proc.communicate(timeout=30)
    finally:
        recv.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert '"event": "stopped"' in err and '"reason": "SIGTERM"' in err  # one summary line at shutdown
    assert out.splitlines() == [
        "setup a",
        "setup b",
        "RELOADED",
        "ticker drained",
        "cleanup b",
        "cleanup a",
        "exit reason=SIGTERM",
    ]
