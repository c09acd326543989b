"""Slurm state lookup for one-off triage, through the same backend the daemon uses."""

from __future__ import annotations

import asyncio
import shutil

from jobdiagd.sources.slurm import CliSlurmBackend, SlurmError


def query_state(job_id: str, *, timeout: float = 5.0) -> str | None:
    """The job's Slurm state (RUNNING, CANCELLED, ...), or None when Slurm can't say."""
    if not job_id.isdigit() or shutil.which("scontrol") is None:
        return None
    try:
        job = asyncio.run(CliSlurmBackend(timeout_s=timeout).job_info(job_id))
    except (SlurmError, ValueError, OSError):
        return None
    return job.state if job is not None else None
