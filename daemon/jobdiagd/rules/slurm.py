"""Slurm's vocabulary as data: job states (finished, alive, running), exit codes, durations and timestamps."""

from __future__ import annotations

import re
import time
from datetime import datetime, tzinfo

# --- states ----------------------------------------------------------------------------------------

BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
# Flag states in the order Slurm's job_state_string() prefers them over the base state, so the
# JSON list form normalizes to what `squeue -o %T` prints for the same job.
FLAG_STATE_PRIORITY = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)
FINISHED_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
# The job still exists and its log may still grow: triage reads a job in one of these states as
# live (running or hanging), never as ended (runbook status table).
ALIVE_STATES = frozenset(
    {"RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STAGE_OUT"}
)
# The job's processes run on its nodes (`SlurmJob.is_running`): a subset of ALIVE_STATES without
# the waiting states, plus SIGNALING (being signalled by scancel, still running).
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING"})
_COMPACT_STATES = {
    "BF": "BOOT_FAIL",
    "CA": "CANCELLED",
    "CD": "COMPLETED",
    "CF": "CONFIGURING",
    "CG": "COMPLETING",
    "DL": "DEADLINE",
    "F": "FAILED",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
    "PD": "PENDING",
    "PR": "PREEMPTED",
    "R": "RUNNING",
    "RD": "RESV_DEL_HOLD",
    "RF": "REQUEUE_FED",
    "RH": "REQUEUE_HOLD",
    "RQ": "REQUEUED",
    "RS": "RESIZING",
    "RV": "REVOKED",
    "S": "SUSPENDED",
    "SE": "SPECIAL_EXIT",
    "SI": "SIGNALING",
    "SO": "STAGE_OUT",
    "ST": "STOPPED",
    "TO": "TIMEOUT",
}


def normalize_state(raw: object) -> str:
    """One upper-case state name from any form Slurm prints.

    Accepts `RUNNING`, `running`, compact codes (`R`, `CA`, `OOM`), sacct's `CANCELLED by 1000`,
    `CANCELLED+`, and the >= 23.11 JSON list form (`["RUNNING", "COMPLETING"]`). Unknown or
    empty input gives `UNKNOWN`.
    """
    if isinstance(raw, list | tuple):
        names = [normalize_state(x) for x in raw]
        names = [n for n in names if n != "UNKNOWN"]
        if not names:
            return "UNKNOWN"
        for flag in FLAG_STATE_PRIORITY:
            if flag in names:
                return flag
        for name in names:
            if name in BASE_STATES:
                return name
        return names[0]
    if not isinstance(raw, str):
        return "UNKNOWN"
    text = raw.strip().upper()
    if not text:
        return "UNKNOWN"
    text = text.split()[0].rstrip("+")
    return _COMPACT_STATES.get(text, text) if re.fullmatch(r"[A-Z_]+", text) else "UNKNOWN"


# --- durations and times ------------------------------------------------------------------------

NO_VALUE = frozenset({"", "N/A", "NONE", "UNKNOWN", "(NULL)", "INVALID", "NOT_SET", "UNLIMITED", "INFINITE"})
_DURATION_RE = re.compile(r"^(?:(?P<d>\d+)-)?(?P<rest>\d+(?::\d+){0,2})$")


def parse_slurm_duration(text: str) -> int | None:
    """Seconds in a Slurm duration; None for UNLIMITED / N/A / INVALID and the like.

    Forms (as squeue/scontrol/sacct print them and sbatch accepts them): `M`, `M:S`, `H:M:S`,
    `D-H`, `D-H:M`, `D-H:M:S`; sacct may add fractional seconds (`00:00:01.234`), which are
    dropped. Raises ValueError for anything else.
    """
    s = text.strip()
    if s.upper() in NO_VALUE:
        return None
    s = re.sub(r"\.\d+$", "", s)
    m = _DURATION_RE.fullmatch(s)
    if not m:
        raise ValueError(f"not a Slurm duration: {text!r}")
    parts = [int(p) for p in m.group("rest").split(":")]
    if m.group("d") is not None:
        days = int(m.group("d"))
        hms = parts + [0] * (3 - len(parts))
        h, mi, sec = hms
    elif len(parts) == 1:
        days, h, mi, sec = 0, 0, parts[0], 0
    elif len(parts) == 2:
        days, h, (mi, sec) = 0, 0, parts
    else:
        days, (h, mi, sec) = 0, parts
    return ((days * 24 + h) * 60 + mi) * 60 + sec


def parse_slurm_time(text: str, tz: tzinfo | None = None) -> float | None:
    """Epoch seconds from a Slurm timestamp, or None for N/A / Unknown / None / 0.

    Accepts epoch digits (what SLURM_TIME_FORMAT=%s prints, which the CLI backend always asks
    for) and the standard `YYYY-MM-DDTHH:MM:SS`, which Slurm prints in the client's local time:
    give `tz` to say which zone that was (default: this process's local zone).
    """
    s = text.strip()
    if s.upper() in NO_VALUE or s == "0":
        return None
    if s.isdigit():
        return float(s)
    fmt = "%Y-%m-%dT%H:%M:%S"
    if tz is not None:
        return datetime.strptime(s, fmt).replace(tzinfo=tz).timestamp()
    return time.mktime(time.strptime(s, fmt))


# --- exit codes --------------------------------------------------------------------------------------

# A job or task ended by a signal Slurm sends to cancel it (scancel, the time limit): 128 + SIGINT,
# 128 + SIGTERM. Such an exit is a cancel, not a failure of the job's own.
CANCEL_EXITS = frozenset({130, 143})


def end_state(exit_code: int | None) -> str:
    """The end state a job's own exit code implies, in Slurm's words, when Slurm is not asked (the
    JOB SUMMARY's exit): 0 COMPLETED, a cancel exit CANCELLED, any other FAILED; UNKNOWN without one."""
    if exit_code is None:
        return "UNKNOWN"
    if exit_code == 0:
        return "COMPLETED"
    if exit_code in CANCEL_EXITS:
        return "CANCELLED"
    return "FAILED"
