"""sd_notify messages arrive on a real datagram socket (path and abstract namespace)."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

from jobdiagd.service.sdnotify import SdNotifier


def receiver(address: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(address)
    s.settimeout(10)
    return s


def test_messages_arrive_on_a_path_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    recv = receiver(path)
    sd = SdNotifier.from_env({"NOTIFY_SOCKET": path})
    try:
        assert sd.enabled
        assert sd.ready("watching 3 jobs")
        assert recv.recv(4096) == b"READY=1\nSTATUS=watching 3 jobs"
        assert sd.status("tick 42")
        assert recv.recv(4096) == b"STATUS=tick 42"
        assert sd.watchdog()
        assert recv.recv(4096) == b"WATCHDOG=1"
        assert sd.stopping()
        assert recv.recv(4096) == b"STOPPING=1"
    finally:
        sd.close()
        recv.close()


def test_abstract_namespace_address() -> None:
    name = f"jobdiagd-test-{uuid.uuid4().hex}"
    recv = receiver("\0" + name)
    sd = SdNotifier.from_env({"NOTIFY_SOCKET": "@" + name})
    try:
        assert sd.ready()
        assert recv.recv(4096) == b"READY=1"
    finally:
        sd.close()
        recv.close()


def test_no_notify_socket_is_a_no_op() -> None:
    sd = SdNotifier.from_env({})
    assert not sd.enabled
    assert sd.ready() is False
    assert sd.watchdog_interval is None


def test_unreachable_socket_does_not_raise(tmp_path: Path) -> None:
    sd = SdNotifier(str(tmp_path / "nobody-listens"))
    assert sd.ready() is False


def test_watchdog_interval_is_half_and_respects_pid() -> None:
    mine = SdNotifier.from_env(
        {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "90000000", "WATCHDOG_PID": str(os.getpid())}
    )
    assert mine.watchdog_interval == 45.0
    other = SdNotifier.from_env({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "90000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval is None
