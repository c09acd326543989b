"""The status socket: a Unix stream socket speaking one JSON line in, one JSON line out."""

from __future__ import annotations

import contextlib
import grp
import inspect
import json
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobdiagd import clock, jsonsafe
from jobdiagd.logsetup import get_logger

if TYPE_CHECKING:
    import asyncio

# asyncio is imported by the server's methods: `jobdiagd status` (the blocking `request` client)
# does not need it (bench/bench_startup.py: asyncio was one of its costliest imports).

MAX_REQUEST = 64 * 1024
REQUEST_TIMEOUT = 5.0

Snapshot = Callable[[], Mapping[str, Any]]
Command = Callable[[Mapping[str, Any]], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]


class StatusUnavailable(Exception):
    """The daemon's socket is missing, refuses connections, or answered nonsense."""


class StatusServer:
    """Serves `snapshot()` for {"cmd": "status"}; more commands can be passed in `commands`.

    Reply: {"ok": true, "now": <wall seconds>, "result": {...}} or {"ok": false, "error": "..."}.
    The snapshot for "status" should carry `tick_seconds`, `started_at` and `last_tick_at`
    (wall seconds or null): the status client judges health from them.
    """

    def __init__(
        self,
        path: str | Path,
        snapshot: Snapshot,
        *,
        group: str = "",
        commands: Mapping[str, Command] | None = None,
        now: Callable[[], float] = clock.wall,
    ) -> None:
        self.path = Path(path)
        self.group = group
        self._now = now
        self.commands: dict[str, Command] = {
            "status": lambda _req: snapshot(),
            "ping": lambda _req: {"pong": True},
        }
        self.commands.update(commands or {})
        self._server: asyncio.AbstractServer | None = None
        self._log = get_logger(component="status_socket")

    async def start(self) -> None:
        import asyncio

        self._clear_stale()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Linux creates the socket file with the socket inode's mode less the umask: owner-only
            # from the first instant, whatever the umask; the group is let in only after chown.
            os.fchmod(sock.fileno(), 0o600)
            sock.bind(str(self.path))
        except BaseException:
            sock.close()
            raise
        server = await asyncio.start_unix_server(self._serve, sock=sock, limit=MAX_REQUEST)
        try:
            if self.group:
                os.chown(self.path, -1, grp.getgrnam(self.group).gr_gid)
                os.chmod(self.path, 0o660)
            else:
                os.chmod(self.path, 0o600)
        except BaseException:
            server.close()
            await server.wait_closed()
            raise
        self._server = server

    async def stop(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _clear_stale(self) -> None:
        try:
            st = self.path.lstat()
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise RuntimeError(f"{self.path} exists and is not a socket; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(str(self.path))
        except OSError:
            self.path.unlink()  # left behind by a daemon that died
            return
        finally:
            probe.close()
        raise RuntimeError(f"{self.path}: another daemon is listening on this socket")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            reply = await self._answer(reader)
            writer.write(jsonsafe.dumps(reply, default=str, separators=(",", ":")).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, TimeoutError) as exc:
            self._log.debug("status_client_dropped", error=str(exc))
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> dict[str, Any]:
        import asyncio

        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                line = await reader.readline()
        except ValueError:  # line longer than the stream limit
            return {"ok": False, "error": "request too large"}
        try:
            req = json.loads(line or b"{}")
        except ValueError:
            return {"ok": False, "error": "request is not JSON"}
        if not isinstance(req, dict):
            return {"ok": False, "error": "request must be a JSON object"}
        cmd = req.get("cmd", "status")
        handler = self.commands.get(cmd) if isinstance(cmd, str) else None
        if handler is None:
            return {"ok": False, "error": f"unknown command {cmd!r}", "commands": sorted(self.commands)}
        try:
            result = handler(req)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # a broken snapshot must not take the socket down
            self._log.exception("status_command_failed", cmd=cmd)
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, "now": self._now(), "result": dict(result)}


def request(path: str | Path, cmd: str = "status", timeout: float = 3.0, **args: Any) -> dict[str, Any]:
    """Blocking client for CLI use: send one command, return the decoded reply."""
    payload = json.dumps({"cmd": cmd, **args}).encode() + b"\n"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise StatusUnavailable(f"jobdiagd is not running (no listener on {path})") from exc
        except PermissionError as exc:
            raise StatusUnavailable(f"no permission to open {path} (socket group?)") from exc
        sock.sendall(payload)
        chunks: list[bytes] = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except TimeoutError as exc:
        raise StatusUnavailable(f"jobdiagd did not answer on {path} within {timeout:g} s") from exc
    except OSError as exc:
        raise StatusUnavailable(f"{path}: {exc}") from exc
    finally:
        sock.close()
    try:
        reply = json.loads(b"".join(chunks))
    except ValueError as exc:
        raise StatusUnavailable(f"{path}: reply is not JSON") from exc
    if not isinstance(reply, dict):
        raise StatusUnavailable(f"{path}: reply is not a JSON object")
    return reply
