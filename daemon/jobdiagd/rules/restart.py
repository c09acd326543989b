"""The restart marker: a Slurm comment naming the job a resubmitted job restarts (rule GP-3).

jobdiagd's recovery puts `jobdiagd:restart-of=<old job id>` in the comment of the job it
resubmits (`sbatch --comment=...`); the goodput ledger reads it back from `sacct` (slurmdbd
keeps comments) or `scontrol show job` (while Slurm still remembers the job) and links the two
runs into one chain. One definition here, under both features, so writer and reader agree.

The comment may hold other words: the marker is one whitespace-, comma- or semicolon-separated
token of it. The old id must be a Slurm job id (digits, an array task `123_4`); anything else is
no marker, so nothing unchecked from a comment ever names a job.
"""

from __future__ import annotations

import re

RESTART_COMMENT_KEY = "jobdiagd:restart-of"
RESTART_COMMENT_PREFIX = RESTART_COMMENT_KEY + "="
_ID = r"[0-9]{1,10}(?:_[0-9]{1,10})?"
_MARKER = re.compile(rf"(?:^|[\s,;]){re.escape(RESTART_COMMENT_PREFIX)}({_ID})(?=$|[\s,;])")
_ID_RE = re.compile(_ID)


def restart_comment(job_id: str) -> str:
    """The comment (or the token to add to one) that marks a job as a restart of `job_id`."""
    if not _ID_RE.fullmatch(job_id):
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    return RESTART_COMMENT_PREFIX + job_id


def restart_of(comment: str | None) -> str | None:
    """The job id a comment says this job restarts, or None (no marker, or not a job id)."""
    if not comment:
        return None
    m = _MARKER.search(comment)
    return m.group(1) if m else None
