"""sd_notify(3) without libsystemd: READY/STATUS/WATCHDOG/STOPPING datagrams to $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class SdNotifier:
    """No-op when the daemon is not run by systemd (no NOTIFY_SOCKET)."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address = address or None
        self.watchdog_usec = watchdog_usec
        self._sock: socket.socket | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SdNotifier:
        env = os.environ if env is None else env
        usec: int | None = None
        raw = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        # WATCHDOG_PID names the process systemd expects pings from; a child must not inherit it.
        if raw.isdigit() and int(raw) > 0 and (not pid or pid == str(os.getpid())):
            usec = int(raw)
        return cls(env.get("NOTIFY_SOCKET"), usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between pings (half the configured WatchdogSec), or None when no watchdog."""
        return None if self.watchdog_usec is None else self.watchdog_usec / 2_000_000

    def notify(self, **fields: str | int) -> bool:
        """Send KEY=value lines (`notify(READY=1, STATUS="...")`); False when disabled or it failed."""
        if self.address is None:
            return False
        payload = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        # "@name" is the abstract namespace: the leading byte on the wire is NUL.
        addr = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(payload, addr)
        except OSError:
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.notify(READY=1, **({"STATUS": status} if status else {}))

    def status(self, text: str) -> bool:
        return self.notify(STATUS=text)

    def watchdog(self) -> bool:
        return self.notify(WATCHDOG=1)

    def stopping(self, status: str | None = None) -> bool:
        return self.notify(STOPPING=1, **({"STATUS": status} if status else {}))

    def reloading(self) -> bool:
        return self.notify(RELOADING=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
