"""Job discovery for the daemon: which jobs to watch, from squeue or from job dirs under the outputs roots.

A `Discovery` answers `poll(now, watched)` with what changed since the last poll (new jobs,
current Slurm records, ended jobs); the engine runs it as its own task so a hung squeue never
holds a tick. `SlurmDiscovery` maps queued jobs to their files through `SlurmWatcher`; without
Slurm, `OutputsDiscovery` watches job dirs (with a `log` link) appearing under the roots.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from jobdiagd.model.jobref import JobRef
from jobdiagd.sources.slurm import SlurmError, SlurmJob, SlurmWatcher, resolve_job_paths
from jobdiagd.triage.resolve import ResolveError, parse_dirname, resolve

# Outputs-root discovery: a job dir already there at start is watched only if its log was
# written this recently (older ones are finished or dead; a dir created later is always watched).
STATIC_RECENT_S = 3600.0


@dataclass(frozen=True)
class NewJob:
    key: str
    ref: JobRef
    slurm: SlurmJob | None = None
    restart_known: bool = False  # the offsets table knew it: report its end even if already over


@dataclass
class Discovered:
    new: list[NewJob] = field(default_factory=list)
    slurm: dict[str, SlurmJob] = field(default_factory=dict)  # current records of queued jobs
    ended: dict[str, tuple[str, SlurmJob | None]] = field(default_factory=dict)  # key -> (state, final)
    problem: str | None = None  # the answer was used but cannot be fully trusted: source degraded


class Discovery(Protocol):
    name: str

    async def poll(self, now: float, watched: set[str]) -> Discovered | None:
        """News since the last poll, or None when it is not time to ask again."""
        ...

    def dirs(self) -> list[Path]: ...


class SlurmDiscovery:
    """squeue through `SlurmWatcher`, at most every `interval` seconds; jobs mapped to files."""

    name = "squeue"

    def __init__(
        self,
        watcher: SlurmWatcher,
        outputs_roots: Sequence[Path],
        interval: float,
        known: set[str] | None = None,
    ) -> None:
        self.watcher = watcher
        self.roots = list(outputs_roots)
        self.interval = interval
        self.next_at = float("-inf")
        self._known_before_restart = set(known or ())

    async def poll(self, now: float, watched: set[str]) -> Discovered | None:
        if now < self.next_at:
            return None
        self.next_at = now + self.interval
        p = await self.watcher.poll()
        out = Discovered()
        for job in p.jobs:
            if job.is_finished:
                continue
            out.slurm[job.job_id] = job
            if job.job_id not in watched:
                out.new.append(NewJob(job.job_id, self.ref_for(job), job))
        for job in p.finished:
            out.ended[job.job_id] = (job.state, job)
        for job_id in p.lost:
            out.ended[job_id] = ("UNKNOWN", None)
        if p.problems:
            out.problem = "; ".join(p.problems)
        # Jobs watched before a restart that ended meanwhile: their report is still owed.
        current = {j.job_id for j in p.jobs}
        for job_id in sorted(self._known_before_restart - current - watched):
            try:
                final = await self.watcher.backend.job_info(job_id)
            except (SlurmError, ValueError):
                continue  # asked again next poll
            self._known_before_restart.discard(job_id)
            if final is None:
                continue
            if final.is_finished:
                out.new.append(NewJob(job_id, self.ref_for(final), final, restart_known=True))
                out.ended[job_id] = (final.state, final)
            else:
                # Still running, but this squeue answer did not list it: watch it again anyway.
                self.watcher.known[job_id] = final
                out.slurm[job_id] = final
                out.new.append(NewJob(job_id, self.ref_for(final), final, restart_known=True))
        self._known_before_restart -= current | watched
        return out

    def ref_for(self, job: SlurmJob) -> JobRef:
        try:
            log, job_dir = resolve_job_paths(job, self.roots)
        except ValueError:
            log, job_dir = None, None
        if job_dir is not None and (job_dir / "log").is_symlink():
            log = job_dir / "log"
        return JobRef(job.job_id, job.name or None, job_dir, log, "slurm")

    def dirs(self) -> list[Path]:
        return []


class OutputsDiscovery:
    """No Slurm: job directories (with a `log` link) appearing under the outputs roots."""

    name = "outputs"

    def __init__(
        self, roots: Sequence[Path], known: set[str] | None = None, recent_s: float = STATIC_RECENT_S
    ):
        self.roots = list(roots)
        self.known = set(known or ())
        self.recent_s = recent_s
        self.seen: set[str] = set()
        self.first_scan = True

    async def poll(self, now: float, watched: set[str]) -> Discovered:
        out = Discovered()
        for root in self.roots:
            # Names, not Paths: a root holds a dir and a log per job, and sorting 2000 Paths and
            # asking each non-dir whether it is one cost a 1000-job full tick ~0.4 s. The entry's
            # type comes from the directory listing (a stat only for a symlink).
            try:
                with os.scandir(root) as it:
                    entries = sorted(
                        e.name
                        for e in it
                        if e.name not in self.seen and not e.name.startswith(".") and _is_dir(e)
                    )
            except OSError:
                continue
            for entry in entries:
                d = root / entry
                link = d / "log"
                if not link.is_symlink():
                    continue  # shared checkpoint dir, or the job has not linked its log yet
                self.seen.add(d.name)
                job_id, name, _platform = parse_dirname(d.name)
                key = job_id or d.name
                if key in watched:
                    continue
                known = key in self.known
                if self.first_scan and not known and not _recent(link, now, self.recent_s):
                    continue
                try:
                    ref = resolve(str(d), [])
                except ResolveError:
                    # A `log` link to something that is no log (a directory, a loop): still a
                    # job; watching it makes the file check report it (monitoring blind).
                    ref = JobRef(job_id, name, d, link, _platform)
                except OSError:
                    continue
                ref = replace(ref, log=link)  # follow the link: a rename repoints it
                out.new.append(NewJob(key, ref, None, restart_known=known))
        self.first_scan = False
        return out

    def dirs(self) -> list[Path]:
        return list(self.roots)

    def forget(self, dirname: str) -> None:
        """A job dir that disappeared: one made again under its name is discovered anew."""
        self.seen.discard(dirname)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows a symlink, as Path.is_dir does
    except OSError:
        return False


def _recent(path: Path, now: float, window: float) -> bool:
    # Discovery only (which old dirs to skip); never used to judge a hang.
    try:
        return now - os.stat(path).st_mtime < window
    except OSError:
        return False
