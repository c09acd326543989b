"""JobRef: one job's identity and files as resolution found them (triage.resolve fills it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class JobRef:
    job_id: str | None
    name: str | None
    job_dir: Path | None
    log: Path | None
    platform: str  # slurm | k8s | local
    problem: str | None = None  # "prolog-kill-no-log" when nothing was ever written
    note: str | None = None  # why, when resolution can tell (e.g. a log name too long to exist)
