"""Slurm state lookup for one job (one-off triage, the daemon's wall time), through the daemon's backend."""

from __future__ import annotations

import asyncio
import shutil

from jobdiagd.sources.slurm import CliSlurmBackend, SlurmError
from jobdiagd.sources.slurm_parse import SlurmJob


def query_job(job_id: str, *, timeout: float = 5.0) -> SlurmJob | None:
    """What scontrol says about the job, or None when Slurm can't say."""
    if not job_id.isdigit() or shutil.which("scontrol") is None:
        return None
    try:
        return asyncio.run(CliSlurmBackend(timeout_s=timeout).job_info(job_id))
    except (SlurmError, ValueError, OSError):
        return None


def slurm_wall_s(job: SlurmJob | None, now: float) -> float | None:
    """The job's wall time per Slurm: start to end, or start to `now` while it runs.

    Triage uses it in place of the JOB SUMMARY's Wall when there is no summary, so a live
    job whose step lines carry no timestamps (print-era MaxText) can still be measured:
    elapsed time minus summed step time beyond the setup budget is a stall."""
    if job is None or job.start_time is None or job.start_time <= 0:
        return None
    end = job.end_time if job.end_time is not None and job.end_time >= job.start_time else now
    return max(0.0, end - job.start_time)
