"""Slurm accounting for the goodput ledger: when each job was submitted, started and ended, where it
ran, and its comment (the restart marker, rule REC-11).

`sacct` answers from slurmdbd when the site runs one; with `AccountingStorageType=none` it
refuses, and `sacct -c` reads the job completion file (`JobCompType=jobcomp/filetxt`) on the
slurmctld host instead. What each gives (measured on Slurm 22.05, docs/rules.md rule GP-2):

- slurmdbd: every field below, the comment included.
- `sacct -c`: user, partition, state, node list, node count, eligible, start, end, exit code;
  no comment (the completion file has none), and `Submit` printed equal to `Start` (the
  file's SubmitTime is lost).

The queue wait counts from `Eligible` (when the job could have started: submitted, and any
dependency, hold or begin time past), else `Submit`: a restart submitted with a dependency on
the run it follows does not wait twice in its chain's wall time, and it is the one time
`sacct -c` gets right.

`scontrol -o show job` still knows a job for `MinJobAge` after its end (and while it runs): its
`Comment=` is the marker's other source. Every job id is validated before it reaches a command;
commands run without a shell, with a timeout.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import tzinfo

from jobdiagd.rules.hostlist import parse_hostlist
from jobdiagd.rules.slurm import NO_VALUE, normalize_state, parse_slurm_time
from jobdiagd.sources.slurm_parse import JOB_ID_RE

SEP = "\x1f"
# Comment last: it is free text, so a stray separator in it cannot shift the other fields.
FIELDS = (
    "JobIDRaw",
    "JobName",
    "User",
    "State",
    "Partition",
    "NodeList",
    "NNodes",
    "Submit",
    "Eligible",
    "Start",
    "End",
    "ExitCode",
    "Comment",
)
IDS_PER_CALL = 500  # job ids per `sacct -j` call: argv stays small whatever the archive
_ACCOUNTING_OFF = re.compile(r"accounting storage is disabled", re.IGNORECASE)
_SCONTROL_ID = re.compile(r"\bJobId=(\S+)")
_SCONTROL_COMMENT = re.compile(r"\bComment=(\S*)")


@dataclass(frozen=True, slots=True)
class AccountingRecord:
    job_id: str
    name: str
    user: str
    state: str  # normalized (COMPLETED, CANCELLED, RUNNING, ...)
    partition: str
    nodes: tuple[str, ...]
    nnodes: int | None
    submit: float | None  # when it became eligible to run (Eligible, else Submit)
    start: float | None
    end: float | None
    exit_code: int | None
    comment: str | None


@dataclass
class AccountingAnswer:
    """What Slurm said: records by job id, where from ("slurmdbd", "jobcomp", None: nothing),
    and why nothing or only part came back."""

    records: dict[str, AccountingRecord] = field(default_factory=dict)
    source: str | None = None
    notes: list[str] = field(default_factory=list)


def _opt(text: str) -> str | None:
    s = text.strip()
    return None if s.upper() in NO_VALUE else s


def _time(text: str, tz: tzinfo | None) -> float | None:
    try:
        return parse_slurm_time(text, tz)
    except ValueError:
        return None


def _int(text: str) -> int | None:
    s = text.strip()
    return int(s) if s.isdigit() and len(s) <= 9 else None


def _hosts(text: str) -> tuple[str, ...]:
    nodes = _opt(text)
    if nodes is None:
        return ()
    try:
        return tuple(parse_hostlist(nodes))
    except ValueError:
        return ()


def parse_accounting(text: str, tz: tzinfo | None = None) -> list[AccountingRecord]:
    """Records of `sacct -X -n -P --delimiter=SEP -o FIELDS` (or `sacct -c ...`); malformed lines
    and job steps are skipped."""
    out: list[AccountingRecord] = []
    n = len(FIELDS)
    for line in text.splitlines():
        parts = line.split(SEP, n - 1)
        if len(parts) != n:
            continue
        job_id, name, user, state, part, nodes, nnodes, submit, eligible, start, end, ec, comment = parts
        job_id = job_id.strip()
        if not JOB_ID_RE.fullmatch(job_id):
            continue
        start_t = _time(start, tz)
        code = ec.strip().partition(":")[0]
        out.append(
            AccountingRecord(
                job_id=job_id,
                name=name.strip(),
                user=re.sub(r"\(\d+\)$", "", user.strip()),
                state=normalize_state(state),
                partition=part.strip(),
                nodes=_hosts(nodes),
                nnodes=_int(nnodes),
                submit=_time(eligible, tz) or _time(submit, tz),
                start=start_t,
                end=_time(end, tz),
                exit_code=_int(code),
                comment=_opt(comment.rstrip("\n")),
            )
        )
    return out


def accounting_argv(job_ids: Sequence[str], *, jobcomp: bool, sacct: str = "sacct") -> list[str]:
    """The sacct command for these job ids (validated: ValueError names a bad one)."""
    for j in job_ids:
        if not JOB_ID_RE.fullmatch(j):
            raise ValueError(f"not a Slurm job id: {j!r}")
    argv = [sacct, *(["-c"] if jobcomp else []), "-X", "-n", "-P", f"--delimiter={SEP}", "-a"]
    return [*argv, "-o", ",".join(FIELDS), "-j", ",".join(job_ids)]


def _run(
    argv: Sequence[str], timeout: float, env: Mapping[str, str] | None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - argv of validated values, no shell
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=dict(env) if env is not None else None,
        stdin=subprocess.DEVNULL,
    )


def _chunks(ids: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for i in range(0, len(ids), size):
        yield ids[i : i + size]


def query_accounting(
    job_ids: Iterable[str],
    *,
    timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
    sacct: str = "sacct",
    tz: tzinfo | None = None,
) -> AccountingAnswer:
    """Accounting records of the given jobs (ids that are not Slurm ids are left out): slurmdbd
    first, the completion file (`sacct -c`) when accounting storage is off."""
    ids = sorted({j for j in job_ids if JOB_ID_RE.fullmatch(j)})
    answer = AccountingAnswer()
    if not ids:
        return answer
    path = env.get("PATH") if env is not None else None
    exe = shutil.which(sacct, path=path)  # run by its path: the PATH given, not this process's
    if exe is None:
        answer.notes.append("sacct not found: queue wait and Slurm's times unknown (the logs' own are used)")
        return answer
    sacct = exe
    jobcomp = False
    for chunk in _chunks(ids, IDS_PER_CALL):
        try:
            proc = _run(accounting_argv(chunk, jobcomp=jobcomp, sacct=sacct), timeout, env)
            if proc.returncode != 0 and not jobcomp and _ACCOUNTING_OFF.search(proc.stderr):
                jobcomp = True
                proc = _run(accounting_argv(chunk, jobcomp=True, sacct=sacct), timeout, env)
        except (OSError, subprocess.SubprocessError) as exc:
            answer.notes.append(f"sacct failed: {type(exc).__name__}: {exc}")
            return answer
        if proc.returncode != 0:
            answer.notes.append(f"sacct exited {proc.returncode}: {proc.stderr.strip()[:200]}")
            return answer
        for rec in parse_accounting(proc.stdout, tz):
            answer.records[rec.job_id] = rec
    answer.source = "jobcomp" if jobcomp else "slurmdbd"
    if jobcomp:
        answer.notes.append(
            "accounting from the job completion file (sacct -c): no comments, so restart markers "
            "come only from scontrol while Slurm remembers the job"
        )
    return answer


def parse_scontrol_comments(text: str) -> dict[str, str]:
    """Job id -> comment from `scontrol -o show job` (one job a line); jobs without one left out."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _SCONTROL_ID.search(line)
        c = _SCONTROL_COMMENT.search(line)
        if m and c and JOB_ID_RE.fullmatch(m.group(1)) and _opt(c.group(1)):
            out[m.group(1)] = c.group(1)
    return out


def scontrol_comments(
    *, timeout: float = 30.0, env: Mapping[str, str] | None = None, scontrol: str = "scontrol"
) -> dict[str, str]:
    """The comments of every job Slurm's controller still remembers ({} when it cannot say)."""
    path = env.get("PATH") if env is not None else None
    exe = shutil.which(scontrol, path=path)
    if exe is None:
        return {}
    try:
        proc = _run([exe, "-o", "show", "job"], timeout, env)
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_scontrol_comments(proc.stdout) if proc.returncode == 0 else {}
