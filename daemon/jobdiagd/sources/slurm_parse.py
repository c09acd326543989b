"""Pure parsers for Slurm command output (squeue, scontrol, sacct, --json) into SlurmJob records."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

from jobdiagd.rules.hostlist import parse_hostlist
from jobdiagd.rules.slurm import (
    FINISHED_STATES,
    NO_VALUE,
    RUNNING_STATES,
    normalize_state,
    parse_slurm_duration,
    parse_slurm_time,
)

# --- validation of values that reach a subprocess -------------------------------------------------

# Plain ids, array tasks (123_4) and hetjob components (123+1). Never a leading '-'.
JOB_ID_RE = re.compile(r"^[0-9]{1,10}(?:_[0-9]{1,10}|\+[0-9]{1,4})?$")
# POSIX-ish user names (useradd's default rule plus upper case and dots, as sites use them).
USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
PARTITION_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def validate_job_id(job_id: str) -> str:
    """Return `job_id` if it is a Slurm job id (123, 123_4, 123+1); raise ValueError otherwise."""
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    return job_id


def validate_user(user: str) -> str:
    if not isinstance(user, str) or not USER_RE.fullmatch(user):
        raise ValueError(f"not a valid user name: {user!r}")
    return user


def validate_partition(partition: str) -> str:
    if not isinstance(partition, str) or not PARTITION_RE.fullmatch(partition):
        raise ValueError(f"not a valid partition name: {partition!r}")
    return partition


# --- the record -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """What one Slurm job looks like to jobdiagd, whichever command or backend reported it."""

    job_id: str
    name: str
    user: str
    state: str  # normalized, e.g. RUNNING, PENDING, COMPLETED, CANCELLED, OUT_OF_MEMORY
    partition: str
    nodes: str = ""  # compact host list, "" before allocation
    node_list: tuple[str, ...] = ()
    start_time: float | None = None  # epoch; None while pending
    run_time_s: int | None = None
    time_limit_s: int | None = None  # None: unlimited or unknown
    stdout: str | None = None  # expanded path; None when unknown (squeue alone cannot expand it)
    work_dir: str | None = None
    exit_code: int | None = None  # return code of the batch script
    reason: str | None = None  # pending/finish reason; None for Slurm's "None"
    exit_signal: int | None = None  # signal that ended the batch script, when any
    end_time: float | None = None  # epoch; only for finished jobs

    @property
    def is_finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def is_running(self) -> bool:
        return self.state in RUNNING_STATES


def _node_list(nodes: str) -> tuple[str, ...]:
    try:
        return tuple(parse_hostlist(nodes))
    except ValueError:
        return (nodes,) if nodes else ()


def _duration(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_slurm_duration(text)
    except ValueError:
        return None


def _time(text: str | None, tz: tzinfo | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_slurm_time(text, tz)
    except ValueError:
        return None


def _opt(text: str | None) -> str | None:
    if text is None:
        return None
    s = text.strip()
    return None if s.upper() in NO_VALUE else s


def _user(text: str) -> str:
    # scontrol and sacct -c print "name(uid)".
    return re.sub(r"\(\d+\)$", "", text.strip())


def _exit_pair(text: str | None) -> tuple[int | None, int | None]:
    """`3:0` -> (3, None); `0:15` -> (0, 15)."""
    if not text:
        return None, None
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text)
    if not m:
        return None, None
    sig = int(m.group(2))
    return int(m.group(1)), (sig or None)


def _make(
    *,
    job_id: str,
    name: str,
    user: str,
    state: str,
    partition: str,
    nodes: str,
    start: float | None,
    run_time_s: int | None,
    time_limit_s: int | None,
    stdout: str | None,
    work_dir: str | None,
    exit_code: int | None,
    exit_signal: int | None,
    reason: str | None,
    end: float | None,
) -> SlurmJob:
    if state == "PENDING":
        # Slurm reports an *expected* start for pending jobs; that is not a start.
        start = None
        end = None
    elif state not in FINISHED_STATES:
        end = None
    if stdout is not None and "%" in stdout:
        # An unexpanded filename pattern (squeue --json in 22.05) is not a path.
        stdout = None
    return SlurmJob(
        job_id=job_id,
        name=name,
        user=user,
        state=state,
        partition=partition,
        nodes=nodes,
        node_list=_node_list(nodes),
        start_time=start,
        run_time_s=run_time_s,
        time_limit_s=time_limit_s,
        stdout=stdout,
        work_dir=work_dir,
        exit_code=exit_code,
        reason=reason,
        exit_signal=exit_signal,
        end_time=end,
    )


# --- squeue -o -----------------------------------------------------------------------------------

# ASCII unit separator: cannot be typed into a job name or path by accident, and squeue passes
# it through untouched. The job name goes last so that even a name containing it stays intact.
SQUEUE_SEP = "\x1f"
SQUEUE_FIELDS = ("%A", "%T", "%u", "%P", "%N", "%S", "%M", "%l", "%Z", "%r", "%j")
SQUEUE_FORMAT = SQUEUE_SEP.join(SQUEUE_FIELDS)


def _show_line(line: str, limit: int = 80) -> str:
    return repr(line[:limit] + ("…" if len(line) > limit else ""))


def parse_squeue_format(
    text: str, tz: tzinfo | None = None, sep: str = SQUEUE_SEP, *, strict: bool = False
) -> list[SlurmJob]:
    """Parse `squeue -h -o SQUEUE_FORMAT` output (fields as in SQUEUE_FIELDS, job name last).

    Lines with too few fields or a non-numeric job id are skipped (a header, or a job name with
    a newline in it). With `strict`, only the rest of such a job name is tolerated (a line
    without a separator right after a job's line): any other such line raises ValueError, so
    garbage printed with exit 0 is a broken answer rather than a smaller cluster.
    """
    jobs: list[SlurmJob] = []
    n = len(SQUEUE_FIELDS)
    bad: list[str] = []
    after_job = False
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(sep, n - 1)
        job_id = parts[0].strip()
        if len(parts) != n or not JOB_ID_RE.fullmatch(job_id):
            if not (after_job and sep not in line):
                bad.append(line)
                after_job = False
            continue
        after_job = True
        _, state, user, partition, nodes, start, used, limit, work_dir, reason, name = parts
        jobs.append(
            _make(
                job_id=job_id,
                name=name,
                user=user.strip(),
                state=normalize_state(state),
                partition=partition.strip(),
                nodes=nodes.strip(),
                start=_time(start, tz),
                run_time_s=_duration(used),
                time_limit_s=_duration(limit),
                stdout=None,
                work_dir=_opt(work_dir),
                exit_code=None,
                exit_signal=None,
                reason=_opt(reason),
                end=None,
            )
        )
    if strict and bad:
        raise ValueError(f"{len(bad)} line(s) are not jobs, first {_show_line(bad[0])}")
    return jobs


# --- scontrol -o show job ------------------------------------------------------------------------

# A key starts a word and begins with an upper-case letter; Slurm's compound keys look like
# `AllocNode:Sid`, `ReqB:S:C:T`, `CPUs/Task`. Values may contain spaces (job names, paths) and
# '=' after other characters (`TRES=cpu=2,node=1`), neither of which starts a key.
_KEY_RE = re.compile(r"(?:^|(?<=\s))([A-Z][A-Za-z0-9_]*(?:[:/][A-Za-z0-9_*]+)*)=")


def parse_scontrol_pairs(line: str) -> dict[str, str]:
    """`Key=Value Key2=Value with spaces` -> dict. First occurrence of a key wins."""
    matches = list(_KEY_RE.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out.setdefault(m.group(1), line[m.end() : end].rstrip())
    return out


def _from_scontrol_pairs(kv: Mapping[str, str], tz: tzinfo | None) -> SlurmJob | None:
    job_id = kv.get("JobId", "").strip()
    if not JOB_ID_RE.fullmatch(job_id):
        return None
    exit_code, exit_signal = _exit_pair(kv.get("ExitCode"))
    nodes = _opt(kv.get("NodeList")) or ""
    return _make(
        job_id=job_id,
        name=kv.get("JobName", kv.get("Name", "")),
        user=_user(kv.get("UserId", "")),
        state=normalize_state(kv.get("JobState", "")),
        partition=kv.get("Partition", "").strip(),
        nodes=nodes,
        start=_time(kv.get("StartTime"), tz),
        run_time_s=_duration(kv.get("RunTime")),
        time_limit_s=_duration(kv.get("TimeLimit")),
        stdout=_opt(kv.get("StdOut")),
        work_dir=_opt(kv.get("WorkDir")),
        exit_code=exit_code,
        exit_signal=exit_signal,
        reason=_opt(kv.get("Reason")),
        end=_time(kv.get("EndTime"), tz),
    )


def parse_scontrol_oneline(line: str, tz: tzinfo | None = None) -> SlurmJob | None:
    """One line of `scontrol -o show job` -> SlurmJob (None if it has no valid JobId)."""
    return _from_scontrol_pairs(parse_scontrol_pairs(line.strip()), tz)


def parse_scontrol_output(text: str, tz: tzinfo | None = None) -> list[SlurmJob]:
    """All jobs in `scontrol -o show job [ID]` output (arrays and hetjobs print several lines)."""
    jobs = []
    for line in text.splitlines():
        if line.strip():
            job = parse_scontrol_oneline(line, tz)
            if job is not None:
                jobs.append(job)
    return jobs


# --- sacct -P -------------------------------------------------------------------------------------

SACCT_SEP = "\x1f"
SACCT_FIELDS = (
    "JobIDRaw",
    "User",
    "State",
    "Partition",
    "NodeList",
    "Start",
    "End",
    "Elapsed",
    "Timelimit",
    "WorkDir",
    "ExitCode",
    "Reason",
    "JobName",
)


def parse_sacct_parsable(text: str, tz: tzinfo | None = None, sep: str = SACCT_SEP) -> list[SlurmJob]:
    """Parse `sacct -n -P --delimiter=SEP -o <SACCT_FIELDS>` (also `sacct -c`, the jobcomp file).

    sacct has no StdOut in 22.05; `stdout` stays None. Job steps (`123.batch`) are skipped.
    """
    jobs: list[SlurmJob] = []
    n = len(SACCT_FIELDS)
    for line in text.splitlines():
        parts = line.split(sep, n - 1)
        if len(parts) != n:
            continue
        job_id, user, state, partition, nodes, start, end, elapsed, limit, work_dir, ec, reason, name = parts
        job_id = job_id.strip()
        if not JOB_ID_RE.fullmatch(job_id):
            continue
        exit_code, exit_signal = _exit_pair(ec)
        jobs.append(
            _make(
                job_id=job_id,
                name=name,
                user=_user(user),
                state=normalize_state(state),
                partition=partition.strip(),
                nodes=_opt(nodes) or "",
                start=_time(start, tz),
                run_time_s=_duration(elapsed),
                # sacct prints a bare number of minutes here ("10"), which is what "M" means.
                time_limit_s=_duration(limit),
                stdout=None,
                work_dir=_opt(work_dir),
                exit_code=exit_code,
                exit_signal=exit_signal,
                reason=_opt(reason),
                end=_time(end, tz),
            )
        )
    return jobs


# --- squeue --json (22.05 openapi v0.0.38, and the >= 23.11 data_parser v0.0.40+ shapes) ---------

_NO_VAL32 = 0xFFFFFFFE  # NO_VAL; INFINITE is 0xFFFFFFFF
_NO_VAL64 = 0xFFFFFFFFFFFFFFFE


def _json_number(value: object) -> int | None:
    """A JSON number in any Slurm shape: plain int (22.05; NO_VAL/INFINITE sentinels mean None)
    or `{"set": bool, "infinite": bool, "number": N}` (>= 23.02)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        if value < 0 or value >= _NO_VAL64 or _NO_VAL32 <= value <= 0xFFFFFFFF:
            return None
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, Mapping):
        if value.get("infinite") is True or value.get("set") is False:
            return None
        return _json_number(value.get("number"))
    return None


def _json_time(value: object) -> float | None:
    n = _json_number(value)
    return float(n) if n else None


def _json_str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _json_exit(value: object) -> tuple[int | None, int | None]:
    """22.05: a raw wait status (`768` = exit 3, `15` = signal 15). >= 23.02: an object with
    `return_code` and `signal.id` (older: `signal.signal_id`)."""
    if isinstance(value, bool) or value is None:
        return None, None
    if isinstance(value, int):
        if value < 0 or value >= _NO_VAL32:
            return None, None
        sig = value & 0x7F
        return (value >> 8) & 0xFF, (sig or None)
    if isinstance(value, Mapping):
        code = _json_number(value.get("return_code"))
        sig_obj = value.get("signal")
        signal: int | None = None
        if isinstance(sig_obj, Mapping):
            signal = _json_number(sig_obj.get("id", sig_obj.get("signal_id")))
        return code, (signal or None)
    return None, None


def job_from_json(obj: Mapping[str, Any], now: float | None = None) -> SlurmJob | None:
    """One element of `jobs` in squeue/scontrol --json (any version) -> SlurmJob.

    Run time is computed from start/end (22.05 has no run-time field) and needs `now` while the
    job is running; without it run_time_s stays None for running jobs.
    """
    raw_id = obj.get("job_id")
    job_id_num = _json_number(raw_id)
    if job_id_num is None:
        return None
    job_id = str(job_id_num)
    state = normalize_state(obj.get("job_state"))
    start = _json_time(obj.get("start_time"))
    end = _json_time(obj.get("end_time"))
    limit_min = _json_number(obj.get("time_limit"))
    run_time: int | None
    if state == "PENDING":
        run_time = 0
    elif start is None:
        run_time = None
    elif state in FINISHED_STATES and end is not None:
        run_time = max(0, int(end - start))
    elif now is not None:
        run_time = max(0, int(now - start))
    else:
        run_time = None
    exit_code, exit_signal = _json_exit(obj.get("exit_code"))
    reason = obj.get("state_reason")
    return _make(
        job_id=job_id,
        name=_json_str(obj.get("name")),
        user=_json_str(obj.get("user_name")),
        state=state,
        partition=_json_str(obj.get("partition")),
        nodes=_json_str(obj.get("nodes")),
        start=start,
        run_time_s=run_time,
        time_limit_s=limit_min * 60 if limit_min is not None else None,
        stdout=_json_str(obj.get("standard_output")) or None,
        work_dir=_json_str(obj.get("current_working_directory")) or None,
        exit_code=exit_code,
        exit_signal=exit_signal,
        reason=_opt(reason) if isinstance(reason, str) else None,
        end=end,
    )


def parse_squeue_json(text: str | Mapping[str, Any], now: float | None = None) -> list[SlurmJob]:
    """`squeue --json` (or `scontrol --json show job`) -> SlurmJob list.

    Handles 22.05 (v0.0.38: `job_state` a string, plain integer times, raw wait status as
    exit_code, unexpanded `standard_output`, which is dropped) and >= 23.11 (`job_state` a list,
    numbers as `{"set", "infinite", "number"}`, exit_code an object). Raises ValueError when the
    document is not JSON or has no `jobs` list.
    """
    doc: object = json.loads(text) if isinstance(text, str) else text
    if not isinstance(doc, Mapping) or not isinstance(doc.get("jobs"), list):
        raise ValueError("squeue --json output has no 'jobs' list")
    jobs: list[SlurmJob] = []
    for obj in doc["jobs"]:
        if isinstance(obj, Mapping):
            job = job_from_json(obj, now)
            if job is not None:
                jobs.append(job)
    return jobs


def filter_jobs(jobs: Iterable[SlurmJob], users: Iterable[str], partitions: Iterable[str]) -> list[SlurmJob]:
    """Client-side filter (squeue --json in 22.05 ignores its filter options)."""
    u, p = set(users), set(partitions)
    return [
        j for j in jobs if (not u or j.user in u) and (not p or any(x in p for x in j.partition.split(",")))
    ]
