"""Synchronous Slurm state lookup for one-off triage (the daemon uses sources.slurm)."""

from __future__ import annotations

import re
import shutil
import subprocess

_ID = re.compile(r"^\d{1,12}$")
_STATE = re.compile(r"\bJobState=(\S+)")


def query_state(job_id: str, *, timeout: float = 5.0) -> str | None:
    """`scontrol -o show job ID` -> JobState, or None when Slurm is unavailable/unknown."""
    if not _ID.match(job_id) or shutil.which("scontrol") is None:
        return None
    try:
        out = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    m = _STATE.search(out.stdout)
    return m.group(1).upper() if m else None
