"""The Slurm commands of recovery: read a job's settings and script, find marker jobs, cancel,
submit held, release, requeue, exclude, drain (rules REC-11, REC-12, REC-16, REC-23).

Every command is an argv list (never a shell), built only from validated values: job ids match
`JOB_ID_RE`, node names `valid_host`, user names `USER_RE`; a value that does not is refused
before any process starts. Calls are synchronous with a timeout (the daemon runs them in a
worker thread); each returns or raises `SlurmOpError` carrying the argv, for the action log.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jobdiagd.logsetup import get_logger
from jobdiagd.rules.hostlist import parse_hostlist, valid_host
from jobdiagd.rules.recovery import RESTARTING_TAG, parse_restart_marker
from jobdiagd.sources.slurm_parse import JOB_ID_RE, USER_RE, parse_scontrol_pairs

_log = get_logger(component="recovery")
_SIMPLE_JOB_ID = re.compile(r"[0-9]{1,12}\Z", re.ASCII)
# A Slurm reason/comment we write: printable, no quotes or newlines (they end up in scontrol's
# own key=value output, which other tools parse).
_REASON_RE = re.compile(r"[A-Za-z0-9 _.,:;=+()/@#%-]{1,200}\Z")


class SlurmOpError(Exception):
    def __init__(self, argv: Sequence[str], detail: str, stderr: str = "") -> None:
        self.argv = tuple(argv)
        self.detail = detail
        self.stderr = stderr
        super().__init__(f"{shlex.join(self.argv)}: {detail}")


def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _SIMPLE_JOB_ID.match(job_id):
        raise ValueError(f"not a plain Slurm job id: {job_id!r}")
    return job_id


def check_hosts(nodes: Sequence[str]) -> tuple[str, ...]:
    bad = [n for n in nodes if not valid_host(n)]
    if bad:
        raise ValueError(f"not valid node names: {bad!r}")
    return tuple(nodes)


def check_reason(text: str) -> str:
    if not _REASON_RE.match(text):
        raise ValueError(f"not a usable Slurm reason/comment: {text!r}")
    return text


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job's settings as Slurm kept them (`scontrol -o show job`), plus its batch script."""

    job_id: str
    fields: Mapping[str, str]
    command: str  # script path and arguments, space-joined by Slurm

    def get(self, key: str) -> str | None:
        v = self.fields.get(key, "").strip()
        return None if v in ("", "(null)", "N/A", "None") else v

    @property
    def state(self) -> str:
        return (self.get("JobState") or "").split("+")[0]

    @property
    def user(self) -> str | None:
        u = (self.get("UserId") or "").split("(")[0]
        return u if USER_RE.match(u) else None

    @property
    def nodes(self) -> tuple[str, ...]:
        text = self.get("NodeList")
        try:
            return tuple(h for h in parse_hostlist(text) if valid_host(h)) if text else ()
        except ValueError:
            return ()

    @property
    def restarts(self) -> int:
        try:
            return int(self.get("Restarts") or 0)
        except ValueError:
            return 0


ACTIVE_STATES = ("PENDING", "RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING")


class SlurmOps:
    """Slurm client commands with `env` added (SLURM_CONF) and a timeout per command."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> None:
        self.env_extra = dict(env or {})
        self.timeout_s = timeout_s

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env_extra)
        env["LC_ALL"] = "C"
        return env

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, check: bool = True) -> str:
        try:
            proc = subprocess.run(
                list(argv),
                env=dict(env) if env is not None else self.env(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SlurmOpError(argv, f"no answer within {self.timeout_s:g} s") from None
        except OSError as exc:
            raise SlurmOpError(argv, f"cannot run: {exc.strerror or exc}") from None
        _log.debug("slurm_command", argv=shlex.join(argv), rc=proc.returncode)
        if check and proc.returncode != 0:
            err = proc.stderr.strip()
            raise SlurmOpError(argv, f"exit {proc.returncode}: {err or '(no stderr)'}", err)
        return proc.stdout

    # -- reading ----------------------------------------------------------

    def job(self, job_id: str) -> JobSpec | None:
        """The job's record, or None when Slurm no longer knows it."""
        argv = ["scontrol", "-o", "show", "job", check_job_id(job_id)]
        try:
            out = self.run(argv)
        except SlurmOpError as exc:
            if "Invalid job id" in exc.stderr:
                return None
            raise
        line = next((ln for ln in out.splitlines() if ln.startswith(f"JobId={job_id} ")), "")
        if not line:
            return None
        return JobSpec(job_id, parse_scontrol_pairs(line), _command_of(line))

    def batch_script(self, job_id: str) -> str:
        return self.run(["scontrol", "write", "batch_script", check_job_id(job_id), "-"])

    def marker_jobs(self, old_id: str) -> list[tuple[str, str]]:
        """(job id, state) of every job Slurm knows whose comment marks it as a restart of `old_id`
        (rule REC-12): `squeue -t all` (jobs within MinJobAge) and, where accounting keeps
        comments, `sacct`. Sorted by job id, numerically."""
        check_job_id(old_id)
        found: dict[str, str] = {}
        out = self.run(["squeue", "-h", "-t", "all", "-o", "%i|%T|%k"])
        for line in out.splitlines():
            parts = line.split("|", 2)
            if len(parts) == 3 and JOB_ID_RE.match(parts[0]) and parse_restart_marker(parts[2]) == old_id:
                found[parts[0]] = parts[1]
        for jid, state in self._sacct_marker_jobs(old_id):
            found.setdefault(jid, state)
        return sorted(found.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0)

    def _sacct_marker_jobs(self, old_id: str) -> list[tuple[str, str]]:
        argv = ["sacct", "-X", "-n", "-P", "-o", "JobID,State,Comment", "-S", "now-7days"]
        try:
            out = self.run(argv)
        except SlurmOpError:
            return []  # accounting off or unreachable: squeue is the source then
        jobs = []
        for line in out.splitlines():
            parts = line.split("|", 2)
            if (
                len(parts) == 3
                and _SIMPLE_JOB_ID.match(parts[0])
                and parse_restart_marker(parts[2]) == old_id
            ):
                jobs.append((parts[0], parts[1].split()[0] if parts[1] else ""))
        return jobs

    # -- acting -----------------------------------------------------------

    def cancel_argv(self, job_id: str) -> list[str]:
        return ["scancel", check_job_id(job_id)]

    def cancel(self, job_id: str) -> None:
        self.run(self.cancel_argv(job_id))

    def tag_restarting_argv(self, job_id: str, comment: str | None) -> list[str]:
        """Append RESTARTING_TAG to the job's comment (kept: a site's own comment stays)."""
        old = (comment or "").replace("\n", " ").strip()
        if old in ("(null)", "N/A"):
            old = ""
        new = f"{old} {RESTARTING_TAG}".strip()[-250:]
        return ["scontrol", "update", f"JobId={check_job_id(job_id)}", f"Comment={new}"]

    def release(self, job_id: str) -> None:
        argv = ["scontrol", "release", check_job_id(job_id)]
        try:
            self.run(argv)
        except SlurmOpError as exc:
            # Releasing a job that is not held (someone released it already) is the goal reached.
            if "not held" not in exc.stderr.lower() and "already" not in exc.stderr.lower():
                raise

    def submit(self, argv: Sequence[str], env: Mapping[str, str]) -> str:
        out = self.run(argv, env=env).strip()
        job_id = out.split(";", 1)[0]
        if not _SIMPLE_JOB_ID.match(job_id):
            raise SlurmOpError(argv, f"sbatch printed {out[:200]!r}")
        return job_id

    def requeue_argv(self, job_id: str) -> list[str]:
        return ["scontrol", "requeue", check_job_id(job_id)]

    def exclude_argv(self, job_id: str, nodes: Sequence[str]) -> list[str]:
        return [
            "scontrol",
            "update",
            f"JobId={check_job_id(job_id)}",
            f"ExcNodeList={','.join(check_hosts(nodes))}",
        ]

    @staticmethod
    def drain_argv(node: str, reason: str) -> list[str]:
        check_hosts([node])
        return ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={check_reason(reason)}"]


def _command_of(line: str) -> str:
    """Command= of `scontrol -o show job`: up to WorkDir=, which follows it (an argument such as
    `Foo=bar` would otherwise read as a key of its own)."""
    start = line.find(" Command=")
    if start < 0:
        return ""
    end = line.rfind(" WorkDir=")
    return line[start + 9 : end if end > start else len(line)]
