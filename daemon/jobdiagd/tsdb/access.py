"""Reaching a job's TSDB: live Prometheus through an ssh port forward, read-only local Prometheus, or a block copy."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from jobdiagd.tsdb.client import PromClient
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.settings import SshSettings, TsdbSettings

log = structlog.get_logger(__name__)

_HOST_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*\Z")
_ULID_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
COPY_EXCLUDES = frozenset({"wal", "chunks_head", "lock", "queries.active"})
# A finished job's whole TSDB, WAL included (its newest samples: often the hang), never its lock.
FULL_COPY_EXCLUDES = frozenset({"lock", "queries.active"})


class AccessError(Exception):
    """The TSDB cannot be reached in the requested way."""


class NoTsdb(AccessError):
    """The job has no TSDB (RAY=0) or its prometheus/ directory holds no data."""


def validate_host(name: str, nodes: Sequence[str]) -> str:
    """A host name taken from a log may only be used if it is well-formed and one of the job's
    nodes; what is returned (and reaches ssh) is the node list's own spelling. The log may write
    a node short (`node001`) where Slurm lists it qualified, or the other way round, but a
    domain the node list does not have (`node001.evil.example` for `node001`) is never used."""
    if not _HOST_RE.match(name) or len(name) > 253:
        raise AccessError(f"invalid host name from log: {name!r}")
    if name in nodes:
        return name
    short = name.split(".")[0]
    for node in nodes:
        if node.split(".")[0] == short and (node == short or name == short):
            return node
    raise AccessError(f"host {name!r} is not in the job's node list ({len(nodes)} nodes)")


def absolute(path: Path | str) -> Path:
    """Prometheus runs with its own working directory: every path handed to it must be absolute."""
    return Path(os.path.abspath(path))


def validate_port(port: int) -> int:
    if not 1 <= int(port) <= 65535:
        raise AccessError(f"invalid port {port!r}")
    return int(port)


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tsdb_has_data(path: Path) -> bool:
    if not path.is_dir():
        return False
    for child in path.iterdir():
        if child.is_dir() and _ULID_RE.match(child.name) and (child / "meta.json").exists():
            return True
        if (
            child.name == "wal"
            and child.is_dir()
            and any(f.stat().st_size > 0 for f in child.iterdir() if f.is_file())
        ):
            return True
    return False


@dataclass(frozen=True)
class BlockMeta:
    ulid: str
    min_time: float  # seconds
    max_time: float
    num_samples: int


def read_blocks(path: Path) -> list[BlockMeta]:
    out: list[BlockMeta] = []
    if not path.is_dir():
        return out
    for child in sorted(path.iterdir()):
        meta = child / "meta.json"
        if not (child.is_dir() and _ULID_RE.match(child.name) and meta.exists()):
            continue
        try:
            doc = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        stats = doc.get("stats") or {}
        out.append(
            BlockMeta(
                child.name, doc["minTime"] / 1000.0, doc["maxTime"] / 1000.0, int(stats.get("numSamples", 0))
            )
        )
    return out


def copy_tsdb(src: Path, dst: Path, excludes: frozenset[str] = COPY_EXCLUDES) -> None:
    """Copy the immutable blocks only (what `rsync --exclude wal --exclude chunks_head --exclude lock` does).

    `excludes=FULL_COPY_EXCLUDES`: everything but the lock (a read-only replay of a finished job)."""
    dst.mkdir(parents=True, exist_ok=True)
    for child in src.iterdir():
        if child.name in excludes:
            continue
        target = dst / child.name
        if child.is_dir():
            shutil.copytree(child, target, dirs_exist_ok=True)
        else:
            shutil.copy2(child, target)


def wal_recently_written(path: Path, now: float, within_s: float = 120.0) -> bool:
    wal = path / "wal"
    if not wal.is_dir():
        return False
    try:
        return any(now - f.stat().st_mtime < within_s for f in wal.iterdir())
    except OSError:
        return False


# --- never two Prometheus instances on one directory -------------------------------------------

_open_dirs: set[str] = set()


def _lock_dir() -> Path:
    base = Path(os.environ.get("JOBDIAGD_LOCK_DIR", tempfile.gettempdir())) / "jobdiagd-tsdb-locks"
    base.mkdir(parents=True, exist_ok=True)
    return base


@contextlib.contextmanager
def exclusive_dir(path: Path) -> Any:
    """Process-wide and cross-process guard (flock on a file *outside* the TSDB, so a job's lock is never touched)."""
    key = str(path.resolve())
    if key in _open_dirs:
        raise AccessError(f"a Prometheus from this process already has {key} open")
    lock_path = _lock_dir() / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise AccessError(f"another jobdiagd process already serves {key}") from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {key}\n".encode())
        _open_dirs.add(key)
        try:
            yield
        finally:
            _open_dirs.discard(key)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


PROM_CONFIG = "global:\n  scrape_interval: 1h\nscrape_configs: []\n"


class LocalPrometheus:
    """A read-only-style Prometheus on a persisted TSDB: loopback port, long retention, no scrape targets."""

    def __init__(self, tsdb_dir: Path, settings: TsdbSettings, *, label: str | None = None) -> None:
        # Absolute: Prometheus runs with cwd=<its temp dir>, where a relative path names a new, empty TSDB.
        self.tsdb_dir = absolute(tsdb_dir)
        self.settings = settings
        self.label = label or str(tsdb_dir)
        self.port = 0
        self.proc: asyncio.subprocess.Process | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._stack = contextlib.ExitStack()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> LocalPrometheus:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        binary = self.settings.prometheus_binary
        if not os.access(binary, os.X_OK):
            raise AccessError(f"prometheus binary not found: {binary} (set tsdb.prometheus_binary)")
        self._stack.enter_context(exclusive_dir(self.tsdb_dir))
        try:
            await self._spawn(binary)
        except BaseException:
            await self.stop()
            raise

    async def _spawn(self, binary: str) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="jobdiagd-prom-", dir=self.settings.work_dir)
        tmp = absolute(self._tmp.name)
        cfg = tmp / "prometheus.yml"
        cfg.write_text(PROM_CONFIG)
        logf = tmp / "prometheus.log"
        last_err = ""
        for _attempt in range(3):
            self.port = free_loopback_port()
            args = [
                f"--config.file={cfg}",
                f"--storage.tsdb.path={self.tsdb_dir}",
                # Retention counts from the newest block: a long value keeps every old block.
                "--storage.tsdb.retention.time=100y",
                # The lock makes a second Prometheus on this directory fail; a stale lock without a
                # holder is simply re-acquired by Prometheus (flock), as view mode relies on (rule TS-4).
                "--storage.tsdb.use-lockfile",
                f"--query.lookback-delta={self.settings.lookback_delta}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ]
            with logf.open("ab") as out:
                self.proc = await asyncio.create_subprocess_exec(
                    binary, *args, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, cwd=tmp
                )
            if await self._wait_ready():
                log.info("tsdb.local_started", dir=str(self.tsdb_dir), port=self.port, pid=self.proc.pid)
                return
            last_err = logf.read_text(errors="replace")[-800:]
            await self._terminate()
            if "address already in use" not in last_err:
                break
        raise AccessError(f"local Prometheus on {self.tsdb_dir} did not become ready: {last_err.strip()}")

    async def _wait_ready(self) -> bool:
        assert self.proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.ready_timeout_s
        async with PromClient(self.base_url, label=f"local:{self.tsdb_dir}", timeout_s=2.0) as probe:
            while loop.time() < deadline:
                if self.proc.returncode is not None:
                    return False
                if await probe.ready():
                    return True
                await asyncio.sleep(0.05)
        return False

    async def _terminate(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def stop(self) -> None:
        try:
            await self._terminate()
        finally:
            self._stack.close()
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None


# --- ssh port forwarding ---------------------------------------------------------------------------

Sleeper = Callable[[float], Awaitable[None]]


def _home(path: str) -> str:
    return os.path.expanduser(path)


@dataclass
class _Forward:
    conn: Any
    listeners: dict[tuple[str, int], Any] = field(default_factory=dict)


class SshTunnelPool:
    """One persistent asyncssh connection per head node, with local forwards to its loopback-bound Prometheus."""

    def __init__(self, settings: SshSettings, *, sleep: Sleeper = asyncio.sleep) -> None:
        self.settings = settings
        self._sleep = sleep
        self._conns: dict[str, _Forward] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.connects = 0

    async def _connect(self, host: str) -> Any:
        import asyncssh

        kwargs: dict[str, Any] = {"connect_timeout": self.settings.connect_timeout_s}
        if self.settings.config_paths:
            kwargs["config"] = [_home(c) for c in self.settings.config_paths]
        if self.settings.username:
            kwargs["username"] = self.settings.username
        if self.settings.port:
            kwargs["port"] = self.settings.port
        if self.settings.client_keys:
            kwargs["client_keys"] = [_home(k) for k in self.settings.client_keys]
        if self.settings.known_hosts:
            kwargs["known_hosts"] = _home(self.settings.known_hosts)
        self.connects += 1
        return await asyncssh.connect(host, **kwargs)

    @staticmethod
    def _alive(fwd: _Forward | None) -> bool:
        return fwd is not None and not fwd.conn.is_closed()

    async def forward(self, host: str, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        """Local port that reaches remote_host:remote_port as seen from `host` (its loopback by
        default; the site Prometheus may be another machine behind it); reconnects with backoff."""
        lock = self._locks.setdefault(host, asyncio.Lock())
        async with lock:
            fwd = self._conns.get(host)
            if not self._alive(fwd):
                if fwd is not None:
                    self._close(fwd)
                fwd = _Forward(await self._connect_with_backoff(host))
                self._conns[host] = fwd
            assert fwd is not None
            key = (remote_host, remote_port)
            if key not in fwd.listeners:
                listener = await fwd.conn.forward_local_port("127.0.0.1", 0, remote_host, remote_port)
                fwd.listeners[key] = listener
            return int(fwd.listeners[key].get_port())

    async def _connect_with_backoff(self, host: str) -> Any:
        delay = self.settings.backoff_initial_s
        last: BaseException | None = None
        for attempt in range(1, self.settings.max_attempts + 1):
            try:
                return await self._connect(host)
            except (OSError, TimeoutError) as exc:
                last = exc
            except Exception as exc:  # asyncssh.Error subclasses (auth, host key, disconnect)
                last = exc
                if type(exc).__name__ in ("PermissionDenied", "HostKeyNotVerifiable"):
                    break
            log.warning("tsdb.ssh_connect_failed", host=host, attempt=attempt, error=str(last))
            if attempt < self.settings.max_attempts:
                await self._sleep(delay)
                delay = min(delay * 2, self.settings.backoff_max_s)
        raise AccessError(f"ssh to {host} failed after {self.settings.max_attempts} attempts: {last}")

    @staticmethod
    def _close(fwd: _Forward) -> None:
        for listener in fwd.listeners.values():
            listener.close()
        fwd.conn.close()

    async def close(self) -> None:
        for host in list(self._conns):
            fwd = self._conns.pop(host)
            self._close(fwd)
            with contextlib.suppress(Exception):
                await fwd.conn.wait_closed()


# --- choosing the access mode ------------------------------------------------------------------------


@dataclass
class TsdbHandle:
    client: PromClient
    mode: str  # "live-ssh" | "local-readonly" | "copy-readonly"
    label: str
    tsdb_dir: Path | None  # directory whose block meta.json can be read (None for live)
    notes: list[str] = field(default_factory=list)
    live: bool = False


@contextlib.asynccontextmanager
async def open_tsdb(
    ctx: DiagnosisContext,
    settings: TsdbSettings,
    *,
    now: float,
    tunnels: SshTunnelPool | None = None,
    allow_copy: bool = True,
) -> AsyncIterator[TsdbHandle]:
    """Pick the access case for this job (rules TS-1 to TS-4) and yield a ready client; cleans up on exit.

    `allow_copy=False` makes an unreachable live Prometheus an error instead of a block copy.
    """
    if ctx.ray is False:
        raise NoTsdb("no TSDB: job ran with RAY=0 (re-run with RAY=1 for metrics)")
    pdir = absolute(ctx.prometheus_dir) if ctx.prometheus_dir is not None else None
    if pdir is None or not tsdb_has_data(pdir):
        raise NoTsdb(f"no TSDB data in {pdir}" if pdir else "no TSDB: job directory unknown")
    if ctx.live:
        async with _open_live(ctx, settings, pdir, tunnels=tunnels, allow_copy=allow_copy) as handle:
            yield handle
        return
    if wal_recently_written(pdir, now):
        # Triage says finished but the WAL still moves: treat as live data and never open it in place.
        async with _open_copy(
            ctx, settings, pdir, note="WAL was written in the last 2 minutes; read a copy of the blocks"
        ) as h:
            yield h
        return
    prom = LocalPrometheus(pdir, settings, label=ctx.label)
    try:
        await prom.start()
    except AccessError as exc:
        if "binary not found" in str(exc):
            raise
        # Someone else holds the directory (another Prometheus, another jobdiagd) or it is not
        # writable: never a second instance on it -- read a copy of the blocks instead.
        async with _open_copy(ctx, settings, pdir, note=f"could not open {pdir} in place ({exc})") as h:
            yield h
        return
    try:
        async with PromClient(
            prom.base_url,
            label=f"local read-only Prometheus for {ctx.label} ({pdir})",
            timeout_s=settings.query_timeout_s,
        ) as client:
            yield TsdbHandle(client, "local-readonly", ctx.label, pdir)
    finally:
        await prom.stop()


@contextlib.asynccontextmanager
async def _open_copy(
    ctx: DiagnosisContext, settings: TsdbSettings, pdir: Path, *, note: str
) -> AsyncIterator[TsdbHandle]:
    with tempfile.TemporaryDirectory(prefix=f"prom_{ctx.label}_readonly_", dir=settings.work_dir) as tmp:
        copy_tsdb(pdir, Path(tmp))
        if not read_blocks(Path(tmp)):
            raise NoTsdb(
                f"no compacted blocks in {pdir} yet (only WAL); the live Prometheus is the only source"
            )
        async with (
            LocalPrometheus(Path(tmp), settings, label=ctx.label) as prom,
            PromClient(
                prom.base_url, label=f"read-only copy of {pdir}", timeout_s=settings.query_timeout_s
            ) as client,
        ):
            notes = [
                note,
                "Copied blocks only (no wal/, chunks_head/, lock): the last <= 2 h of data are missing.",
            ]
            yield TsdbHandle(client, "copy-readonly", ctx.label, Path(tmp), notes=notes, live=True)


@contextlib.asynccontextmanager
async def _open_live(
    ctx: DiagnosisContext,
    settings: TsdbSettings,
    pdir: Path,
    *,
    tunnels: SshTunnelPool | None,
    allow_copy: bool = True,
) -> AsyncIterator[TsdbHandle]:
    if not ctx.head_node or not ctx.port:
        if not allow_copy:
            raise AccessError("live job but no head node/port in the log")
        async with _open_copy(ctx, settings, pdir, note="live job but no head node/port in the log") as h:
            yield h
        return
    host = validate_host(ctx.head_node, ctx.nodes)
    port = validate_port(ctx.port)
    pool = tunnels or SshTunnelPool(settings.ssh)
    try:
        client, reason = await _try_live(pool, host, port, settings)
        if client is not None:
            try:
                yield TsdbHandle(client, "live-ssh", ctx.label, None, live=True)
            finally:
                await client.close()
            return
        log.warning("tsdb.live_unreachable", host=host, port=port, reason=reason)
        if not allow_copy:
            raise AccessError(f"live Prometheus unreachable: {reason}")
        async with _open_copy(ctx, settings, pdir, note=f"live Prometheus unreachable ({reason})") as h:
            yield h
    finally:
        if tunnels is None:
            await pool.close()


async def _try_live(
    pool: SshTunnelPool, host: str, port: int, settings: TsdbSettings
) -> tuple[PromClient | None, str]:
    try:
        local = await pool.forward(host, port)
    except AccessError as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"ssh forward to {host}:{port} failed: {exc}"
    client = PromClient(
        f"http://127.0.0.1:{local}",
        label=f"{host}:{port} (live, via ssh)",
        timeout_s=settings.query_timeout_s,
    )
    if await client.ready():
        return client, ""
    await client.close()
    return None, f"Prometheus at {host}:{port} did not answer /-/ready through ssh"
