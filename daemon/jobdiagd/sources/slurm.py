"""Slurm as a source: list the watched users' jobs, fetch one job's final state, find its log."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import os
import re
import shlex
import shutil
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from jobdiagd import clock
from jobdiagd.rules.hostlist import parse_hostlist
from jobdiagd.rules.slurm import FINISHED_STATES, normalize_state
from jobdiagd.sources.slurm_parse import (
    SACCT_FIELDS,
    SACCT_SEP,
    SQUEUE_FORMAT,
    SlurmJob,
    filter_jobs,
    job_from_json,
    parse_sacct_parsable,
    parse_scontrol_oneline,
    parse_scontrol_output,
    parse_squeue_format,
    parse_squeue_json,
    validate_job_id,
    validate_partition,
    validate_user,
)

__all__ = [
    "CliSlurmBackend",
    "PyslurmBackend",
    "SlurmBackend",
    "SlurmCommandError",
    "SlurmError",
    "SlurmJob",
    "SlurmPoll",
    "SlurmWatcher",
    "job_from_json",
    "make_backend",
    "parse_sacct_parsable",
    "parse_scontrol_oneline",
    "parse_scontrol_output",
    "parse_squeue_format",
    "parse_squeue_json",
    "resolve_job_paths",
]


class SlurmError(Exception):
    """Slurm could not be asked (backend unavailable, command failed)."""


class SlurmCommandError(SlurmError):
    """A Slurm command failed. `kind` says how: missing binary, timeout, non-zero exit, or
    output that cannot be trusted (unparseable, or too large)."""

    def __init__(
        self,
        argv: Sequence[str],
        kind: Literal["missing", "timeout", "exit", "output"],
        detail: str,
        returncode: int | None = None,
        stderr: str = "",
    ) -> None:
        self.argv = tuple(argv)
        self.kind = kind
        self.returncode = returncode
        self.stderr = stderr
        self.detail = detail
        super().__init__(f"{self.argv[0] if self.argv else '?'}: {detail} (command: {shlex.join(self.argv)})")


@runtime_checkable
class SlurmBackend(Protocol):
    """How the daemon asks Slurm about jobs; CLI and pyslurm implement it."""

    async def list_jobs(
        self, users: Sequence[str] = (), partitions: Sequence[str] = (), *, include_finished: bool = False
    ) -> list[SlurmJob]:
        """Jobs of `users` in `partitions` (empty = no filter). Active jobs only unless
        `include_finished` (then also jobs that ended within MinJobAge)."""
        ...

    async def job_info(self, job_id: str) -> SlurmJob | None:
        """One job including its final state after it left squeue; None if Slurm forgot it."""
        ...


def _check_filters(users: Iterable[str], partitions: Iterable[str]) -> tuple[list[str], list[str]]:
    return [validate_user(u) for u in users], [validate_partition(p) for p in partitions]


# A command that outlives its timeout gets SIGTERM, then SIGKILL this much later.
KILL_GRACE_S = 1.0
# More than this on one pipe is not a squeue answer (100k jobs print ~20 MB).
MAX_OUTPUT_BYTES = 64 << 20

_INVALID_JOB_RE = re.compile(r"Invalid job id", re.IGNORECASE)
_SQUEUE_ERROR_RE = re.compile(r"\berror:", re.IGNORECASE)
_ACCOUNTING_OFF_RE = re.compile(r"accounting storage is disabled", re.IGNORECASE)


class CliSlurmBackend:
    """Slurm through squeue / scontrol / sacct subprocesses (the default, tested backend)."""

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 20.0,
        squeue: str = "squeue",
        scontrol: str = "scontrol",
        sacct: str | None = "sacct",
        listing: Literal["format", "json"] = "format",
        max_parallel: int = 4,
    ) -> None:
        """`env` is added to this process's environment for every command (e.g. SLURM_CONF).
        `sacct=None` disables the accounting fallback of job_info. `listing="json"` lists with
        `squeue --json` (filtered here, since 22.05 ignores squeue's filters with --json)."""
        self._env_extra = dict(env or {})
        self._timeout_s = timeout_s
        self._squeue = squeue
        self._scontrol = scontrol
        self._sacct = sacct
        self._listing = listing
        self._max_parallel = max_parallel
        # StdOut never changes after submission, and only scontrol expands it: ask once per job.
        self._stdout_cache: dict[str, str | None] = {}
        # squeue has no exit code: finished jobs get scontrol's record, once (it no longer changes).
        self._final_cache: dict[str, SlurmJob] = {}

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self._env_extra)
        # Epoch seconds instead of local-time strings: no time-zone guessing while parsing.
        env["SLURM_TIME_FORMAT"] = "%s"
        env["LC_ALL"] = "C"
        return env

    async def _run(self, argv: Sequence[str]) -> str:
        return (await self._run2(argv))[0]

    async def _run2(self, argv: Sequence[str]) -> tuple[str, str]:
        """(stdout, stderr) of a successful command; SlurmCommandError otherwise.

        The command runs in its own session (process group): on timeout, on cancellation and
        after it exits, the whole group is stopped (SIGTERM, SIGKILL after KILL_GRACE_S), so a
        wrapper script's children cannot hold the call (or our pipes) past the timeout. The
        call returns within `timeout_s + KILL_GRACE_S`.
        """
        env = self._env()
        exe = shutil.which(argv[0], path=env.get("PATH"))
        if exe is None:
            raise SlurmCommandError(argv, "missing", "command not found on PATH")
        loop = asyncio.get_running_loop()
        start = asyncio.ensure_future(
            loop.subprocess_exec(
                lambda: _Collector(loop, MAX_OUTPUT_BYTES),
                exe,
                *argv[1:],
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        )
        try:
            transport, proto = await asyncio.shield(start)
        except asyncio.CancelledError:
            await _stop_once_started(start)
            raise
        except OSError as e:
            raise SlurmCommandError(argv, "missing", f"cannot execute: {e}") from e
        pgid = transport.get_pid()
        try:
            try:
                async with asyncio.timeout(self._timeout_s):
                    await asyncio.wait({proto.done, proto.overflow}, return_when=asyncio.FIRST_COMPLETED)
            except TimeoutError:
                raise SlurmCommandError(argv, "timeout", f"no answer within {self._timeout_s:g} s") from None
            if proto.overflow.done():
                raise SlurmCommandError(argv, "output", f"printed more than {MAX_OUTPUT_BYTES >> 20} MiB")
        finally:
            try:
                await _end_group(pgid)
            finally:
                transport.close()
        returncode = transport.get_returncode()
        stderr = proto.text(2).strip()
        if returncode != 0:
            raise SlurmCommandError(
                argv,
                "exit",
                f"exit {returncode}: {stderr or '(no stderr)'}",
                returncode=returncode,
                stderr=stderr,
            )
        return proto.text(1), stderr

    async def list_jobs(
        self, users: Sequence[str] = (), partitions: Sequence[str] = (), *, include_finished: bool = False
    ) -> list[SlurmJob]:
        u, p = _check_filters(users, partitions)
        if self._listing == "json":
            argv = [self._squeue, "--json"]
            text = await self._run(argv)
            try:
                parsed = parse_squeue_json(text, now=clock.wall())
            except ValueError as e:
                raise _bad_output(argv, text, str(e)) from None
            jobs = filter_jobs(parsed, u, p)
            if not include_finished:
                jobs = [j for j in jobs if j.state not in FINISHED_STATES]
        else:
            argv = [self._squeue, "-h", "-r", "-o", SQUEUE_FORMAT]
            if u:
                argv.append("--user=" + ",".join(u))
            if p:
                argv.append("--partition=" + ",".join(p))
            if include_finished:
                argv.append("--states=all")
            out, err = await self._run2(argv)
            if _SQUEUE_ERROR_RE.search(err):
                # 22.05 exits 0 after "squeue: error: Invalid user: x" and lists nothing:
                # a typo in the watched users must not look like "no jobs".
                raise SlurmCommandError(argv, "exit", f"exit 0 with error: {err}", returncode=0, stderr=err)
            try:
                # Strict: a line that is not a job is a broken answer, never "fewer jobs".
                jobs = parse_squeue_format(out, strict=True)
            except ValueError as e:
                raise _bad_output(argv, out, str(e)) from None
        return await self._with_stdout(jobs)

    async def _with_stdout(self, jobs: list[SlurmJob]) -> list[SlurmJob]:
        """Fill in what only scontrol knows: the expanded StdOut, and for finished jobs the
        exit code and end time."""
        todo = [
            j
            for j in jobs
            if (j.is_finished and j.job_id not in self._final_cache)
            or (not j.is_finished and j.stdout is None and j.job_id not in self._stdout_cache)
        ]
        # Made per call: a semaphore belongs to the event loop it was first used in.
        sem = asyncio.Semaphore(self._max_parallel)

        async def fetch(job: SlurmJob) -> None:
            async with sem:
                try:
                    info = await self._scontrol_job(job.job_id)
                except SlurmError:
                    return  # vanished between the two calls, or a hiccup: try next poll
            if info is None:
                return
            self._stdout_cache[job.job_id] = info.stdout
            if info.is_finished:
                self._final_cache[job.job_id] = info

        await asyncio.gather(*(fetch(j) for j in todo))
        seen = {j.job_id for j in jobs}
        for cache in (self._stdout_cache, self._final_cache):
            for stale in [k for k in cache if k not in seen]:
                del cache[stale]
        out = []
        for j in jobs:
            final = self._final_cache.get(j.job_id) if j.is_finished else None
            if final is not None:
                j = final
            else:
                cached = self._stdout_cache.get(j.job_id)
                if j.stdout is None and cached is not None:
                    j = _replace(j, stdout=cached)
            out.append(j)
        return out

    async def _scontrol_job(self, job_id: str) -> SlurmJob | None:
        try:
            text = await self._run([self._scontrol, "-o", "show", "job", job_id])
        except SlurmCommandError as e:
            if e.kind == "exit" and _INVALID_JOB_RE.search(e.stderr):
                return None
            raise
        jobs = parse_scontrol_output(text)
        for j in jobs:
            if j.job_id == job_id:
                return j
        return jobs[0] if jobs else None

    async def job_gres_detail(self, job_id: str) -> str | None:
        """`scontrol -d -o show job <id>`: the job's line with its per-node GRES detail
        (`sources.slurm_gres.parse_job_gpus` reads it); None when Slurm no longer knows the job."""
        validate_job_id(job_id)
        try:
            return await self._run([self._scontrol, "-d", "-o", "show", "job", job_id])
        except SlurmCommandError as e:
            if e.kind == "exit" and _INVALID_JOB_RE.search(e.stderr):
                return None
            raise

    async def job_info(self, job_id: str) -> SlurmJob | None:
        validate_job_id(job_id)
        job = await self._scontrol_job(job_id)
        if job is not None or self._sacct is None:
            return job
        return await self.job_info_from_accounting(job_id)

    async def job_info_from_accounting(self, job_id: str) -> SlurmJob | None:
        """The job as sacct remembers it: slurmdbd when there is one, else the jobcomp file
        (`sacct -c`, only readable on the slurmctld host). None when neither knows the job."""
        validate_job_id(job_id)
        if self._sacct is None:
            return None
        fields = ["-X", "-n", "-P", f"--delimiter={SACCT_SEP}", "-o", ",".join(SACCT_FIELDS), "-j", job_id]
        try:
            text = await self._run([self._sacct, *fields])
        except SlurmCommandError as e:
            if e.kind != "exit" or not _ACCOUNTING_OFF_RE.search(e.stderr + e.detail):
                raise
            try:
                text = await self._run([self._sacct, "-c", *fields])
            except SlurmCommandError as e2:
                if e2.kind == "exit":
                    return None
                raise
        for j in parse_sacct_parsable(text):
            if j.job_id == job_id:
                return j
        return None


def _bad_output(argv: Sequence[str], text: str, why: str) -> SlurmCommandError:
    return SlurmCommandError(argv, "output", f"exit 0 but unparseable output ({len(text)} bytes): {why}")


class _Collector(asyncio.SubprocessProtocol):
    """A command's stdout (fd 1) and stderr (fd 2), each up to `limit` bytes; `done` once it
    exited and closed both pipes, `overflow` once it printed more than `limit`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self.limit = limit
        self.buffers: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self.done: asyncio.Future[None] = loop.create_future()
        self.overflow: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        buf = self.buffers.get(fd)
        if buf is None or self.overflow.done():
            return
        if len(buf) + len(data) > self.limit:
            self.overflow.set_result(None)
            return
        buf += data.encode() if isinstance(data, str) else data

    def connection_lost(self, exc: Exception | None) -> None:
        # asyncio calls this once the process exited *and* every pipe closed.
        if not self.done.done():
            self.done.set_result(None)

    def text(self, fd: int) -> str:
        return self.buffers[fd].decode(errors="replace")


def _group_members_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` is still running (zombies waiting for a reaper that
    is not us do not count: they hold nothing)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces or ')'): state, ppid, pgrp, ...
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] != b"Z":
            return True
    return False


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _stop_once_started(start: asyncio.Future[tuple[asyncio.SubprocessTransport, Any]]) -> None:
    """Cancelled while the command was starting: let the start finish, then stop its group.

    asyncio, cancelled while it connects a new process's pipes, kills the process alone and
    waits for the pipes to close: a wrapper script's children hold them, so the cancelled call
    hung as long as they ran (seen on a busy loop). Here the start is shielded; once it is
    done, the whole group goes as on a timeout. Further cancellations meanwhile are absorbed:
    the caller re-raises the first."""
    while not start.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(start)
    if start.cancelled() or start.exception() is not None:
        return
    transport, _ = start.result()
    try:
        await _end_group(transport.get_pid())
    finally:
        transport.close()


async def _end_group(pgid: int) -> None:
    """Stop what is left of a command's process group: SIGTERM, then SIGKILL after the grace.

    The group is the command's own session (start_new_session), so this never reaches the
    daemon. The final SIGKILL is sent even if this coroutine is cancelled while waiting.
    """
    if not _group_members_alive(pgid):
        return
    try:
        _signal_group(pgid, signal.SIGTERM)
        deadline = clock.monotonic() + KILL_GRACE_S
        while clock.monotonic() < deadline:
            await asyncio.sleep(0.02)
            if not _group_members_alive(pgid):
                return
    finally:
        _signal_group(pgid, signal.SIGKILL)


def _replace(job: SlurmJob, **changes: Any) -> SlurmJob:
    return dataclasses.replace(job, **changes)


# --- pyslurm -----------------------------------------------------------------------------------------


def job_from_pyslurm(obj: Any, now: float | None = None) -> SlurmJob | None:
    """A `pyslurm.Job` (pyslurm >= 23.2 API) -> SlurmJob; attributes are read defensively so a
    missing one gives None rather than an exception."""

    def attr(name: str) -> Any:
        try:
            return getattr(obj, name, None)
        except Exception:  # properties of a half-loaded job can raise
            return None

    raw_id = attr("id")
    if not isinstance(raw_id, int):
        return None
    nodes = attr("allocated_nodes") or ""
    start = attr("start_time")
    state = normalize_state(attr("state"))
    limit = attr("time_limit")
    run_time = attr("run_time")
    stdout = attr("standard_output")
    exit_code = attr("exit_code")
    exit_signal = attr("exit_code_signal")
    end = attr("end_time")
    reason = attr("state_reason")
    try:
        node_list = tuple(parse_hostlist(nodes)) if isinstance(nodes, str) else ()
    except ValueError:
        node_list = (nodes,)
    started = isinstance(start, int | float) and start > 0 and state != "PENDING"
    return SlurmJob(
        job_id=str(raw_id),
        name=attr("name") or "",
        user=attr("user_name") or "",
        state=state,
        partition=attr("partition") or "",
        nodes=nodes if isinstance(nodes, str) else "",
        node_list=node_list,
        start_time=float(start) if started else None,
        run_time_s=int(run_time) if isinstance(run_time, int | float) else None,
        time_limit_s=int(limit) * 60 if isinstance(limit, int) else None,
        stdout=stdout if isinstance(stdout, str) and stdout and "%" not in stdout else None,
        work_dir=attr("working_directory") or None,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        reason=None if reason in (None, "", "None") else str(reason),
        exit_signal=(exit_signal or None) if isinstance(exit_signal, int) else None,
        end_time=float(end) if state in FINISHED_STATES and isinstance(end, int | float) and end else None,
    )


class PyslurmBackend:
    """Slurm through pyslurm's C bindings (needs a pyslurm built for this Slurm version).

    pyslurm's calls block, so they run in a worker thread."""

    def __init__(self, module: Any | None = None) -> None:
        self._pyslurm = module if module is not None else importlib.import_module("pyslurm")

    async def list_jobs(
        self, users: Sequence[str] = (), partitions: Sequence[str] = (), *, include_finished: bool = False
    ) -> list[SlurmJob]:
        u, p = _check_filters(users, partitions)

        def load() -> list[SlurmJob]:
            jobs = self._pyslurm.Jobs.load()
            out = [job_from_pyslurm(j) for j in jobs.values()]
            return [j for j in out if j is not None]

        jobs = filter_jobs(await asyncio.to_thread(load), u, p)
        if not include_finished:
            jobs = [j for j in jobs if j.state not in FINISHED_STATES]
        return jobs

    async def job_info(self, job_id: str) -> SlurmJob | None:
        validate_job_id(job_id)
        if not job_id.isdigit():
            return None  # pyslurm.Job.load takes the unique numeric id only

        def load() -> SlurmJob | None:
            rpc_error = getattr(self._pyslurm, "RPCError", None)
            try:
                return job_from_pyslurm(self._pyslurm.Job.load(int(job_id)))
            except Exception as e:
                if rpc_error is not None and isinstance(e, rpc_error) and _INVALID_JOB_RE.search(str(e)):
                    return None
                raise SlurmError(f"pyslurm Job.load({job_id}) failed: {e}") from e

        return await asyncio.to_thread(load)


def make_backend(
    kind: Literal["auto", "cli", "pyslurm"] = "auto",
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 20.0,
) -> SlurmBackend:
    """`cli`: squeue/scontrol; `pyslurm`: the bindings (SlurmError if they do not import);
    `auto`: pyslurm when it imports, else the CLI. `env`/`timeout_s` apply to the CLI backend."""
    if kind not in ("auto", "cli", "pyslurm"):
        raise ValueError(f"unknown Slurm backend {kind!r}")
    if kind in ("auto", "pyslurm"):
        try:
            return PyslurmBackend()
        except ImportError as e:
            if kind == "pyslurm":
                raise SlurmError(f"pyslurm backend requested but 'import pyslurm' failed: {e}") from e
    return CliSlurmBackend(env=env, timeout_s=timeout_s)


# --- from a job to its files --------------------------------------------------------------------------


def _dir_has_log_link(d: Path) -> bool:
    return (d / "log").is_symlink() or (d / "log").exists()


def resolve_job_paths(
    job: SlurmJob, outputs_roots: Sequence[str | os.PathLike[str]] = ()
) -> tuple[Path | None, Path | None]:
    """(log file, job directory) of a Slurm job, either possibly None.

    Log: Slurm's expanded StdOut when it exists; else the job dir's `log` link (a tagger may
    have renamed the log); else StdOut even if not created yet (pending jobs); else
    `<root>/<id>-*.log`. Job dir: the StdOut's sibling without `.log`, else `<root>/<id>-*/`
    (preferring one with a `log` link, as shared checkpoint dirs have none). Raises ValueError
    when the job id is not numeric (only those are looked up under the outputs roots).
    """
    base_id = job.job_id.split("_", 1)[0].split("+", 1)[0]
    if not base_id.isdigit():
        raise ValueError(f"job id is not numeric: {job.job_id!r}")
    # The unique id of an array task is the one `%j` expands to; `job_id` may be `123_4`.
    ids = [job.job_id] if job.job_id.isdigit() else [base_id]
    stdout = Path(job.stdout) if job.stdout and job.stdout != "/dev/null" else None
    if stdout is not None and not stdout.is_absolute() and job.work_dir:
        stdout = Path(job.work_dir) / stdout
    roots = [Path(r) for r in outputs_roots]

    job_dir: Path | None = None
    if stdout is not None and stdout.suffix == ".log":
        sibling = stdout.with_suffix("")
        if sibling.is_dir():
            job_dir = sibling
    if job_dir is None:
        for root in roots:
            cands = sorted(
                (d for i in ids for d in root.glob(f"{i}-*") if d.is_dir()),
                key=lambda d: (not _dir_has_log_link(d), d.name),
            )
            if cands:
                job_dir = cands[0]
                break

    log: Path | None = None
    if stdout is not None and stdout.is_file():
        log = stdout
    elif job_dir is not None and (job_dir / "log").is_file():
        log = (job_dir / "log").resolve()
    elif stdout is not None:
        log = stdout
    else:
        for root in roots:
            cands = sorted(f for i in ids for f in root.glob(f"{i}-*.log") if f.is_file())
            if cands:
                log = cands[0]
                break
    return log, job_dir


# --- polling: what changed since last time -------------------------------------------------------------

# A job that left squeue and that neither scontrol nor accounting knows is "lost" only after
# this many consecutive answers without it (scontrol keeps finished jobs for MinJobAge, 300 s
# by default, so a real end is nearly always confirmed by scontrol long before that).
LOST_AFTER_POLLS = 3
# Concurrent scontrol/sacct look-ups when several watched jobs are missing from one answer.
CONFIRM_PARALLEL = 4


@dataclass(frozen=True)
class SlurmPoll:
    """One poll's news. `finished` jobs left squeue and scontrol/sacct confirmed a final state;
    `lost` left it LOST_AFTER_POLLS answers in a row and nobody remembers them. `problems` say
    why this answer cannot be fully trusted (squeue omitted a job Slurm still runs, or a job's
    end could not be confirmed): the jobs concerned stay watched."""

    jobs: tuple[SlurmJob, ...]
    appeared: tuple[SlurmJob, ...] = ()
    changed: tuple[SlurmJob, ...] = ()
    finished: tuple[SlurmJob, ...] = ()
    lost: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()


@dataclass
class SlurmWatcher:
    """Keeps the last view of the watched jobs; `poll()` reports what changed (the caller
    decides when to poll: the daemon's default is every 30 s).

    Confirmation rule: a job missing from one squeue answer is *not* over. It is finished only
    when scontrol (or, once scontrol forgot it, sacct / the jobcomp file) reports a final state;
    a live state there means squeue's answer was wrong (a problem; the job stays watched with
    scontrol's record); nobody knowing it makes it lost after LOST_AFTER_POLLS answers in a row.
    An empty answer is handled the same way, job by job.
    """

    backend: SlurmBackend
    users: Sequence[str] = ()
    partitions: Sequence[str] = ()
    known: dict[str, SlurmJob] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)  # job id -> answers in a row without it
    lost_after: int = LOST_AFTER_POLLS

    async def poll(self) -> SlurmPoll:
        current = await self.backend.list_jobs(self.users, self.partitions)
        by_id = {j.job_id: j for j in current}
        appeared = tuple(j for j in current if j.job_id not in self.known)
        changed = tuple(
            j for j in current if j.job_id in self.known and self.known[j.job_id].state != j.state
        )
        absent = [(job_id, old) for job_id, old in self.known.items() if job_id not in by_id]
        sem = asyncio.Semaphore(CONFIRM_PARALLEL)

        async def confirm(job_id: str) -> SlurmJob | None | Exception:
            async with sem:
                try:
                    return await self.backend.job_info(job_id)
                except (SlurmError, ValueError) as e:
                    return e

        answers = await asyncio.gather(*(confirm(job_id) for job_id, _ in absent))
        finished: list[SlurmJob] = []
        lost: list[str] = []
        problems: list[str] = []
        still: dict[str, SlurmJob] = {}  # absent from the answer but not over
        alive: list[SlurmJob] = []  # ... of which Slurm says they run
        for (job_id, old), info in zip(absent, answers, strict=True):
            if isinstance(info, Exception):
                problems.append(
                    f"job {job_id} is missing from squeue and its end cannot be confirmed: {info}"
                )
                still[job_id] = old
            elif info is None:
                count = self.missing.get(job_id, 0) + 1
                if count >= self.lost_after:
                    lost.append(job_id)
                else:
                    self.missing[job_id] = count
                    still[job_id] = old
            elif not info.is_finished:
                if filter_jobs([info], self.users, self.partitions):
                    problems.append(
                        f"squeue's answer omits job {job_id}, which scontrol reports {info.state}"
                    )
                # else: moved out of the watched partitions, so rightly not listed; still watched
                if info.stdout is None and old.stdout is not None:
                    info = _replace(info, stdout=old.stdout)
                still[job_id] = info
                alive.append(info)
            else:
                if info.stdout is None and old.stdout is not None:
                    info = _replace(info, stdout=old.stdout)
                finished.append(info)
        self.known = {j.job_id: j for j in current if j.state not in FINISHED_STATES}
        self.known.update(still)
        self.missing = {k: v for k, v in self.missing.items() if k in still}
        return SlurmPoll(
            jobs=(*current, *alive),
            appeared=appeared,
            changed=changed,
            finished=tuple(finished),
            lost=tuple(lost),
            problems=tuple(problems),
        )
