"""Reading the archive for the goodput ledger: each job's runs as `RunFacts` (the I/O edge of `goodput`).

Each job is triaged exactly as `jobdiagd triage` does (`load_job` + `analyze`, the same
access rules, Slurm's state when accounting knows the job). A requeued job's log holds its
earlier runs too (the parser keeps only the last, `LogState.earlier_runs`): such a log is
read once more with a state that keeps each finished run (`RunKeepingState`), and every
earlier run is triaged on its own (main log only: Ray worker logs are the last run's).
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TextIO

from jobdiagd.goodput.facts import RunFacts, run_facts
from jobdiagd.logs.job import JobLogs, load_job
from jobdiagd.logs.reader import read_file
from jobdiagd.logs.safeopen import LogAccess
from jobdiagd.logs.state import LogState
from jobdiagd.model.jobref import JobRef
from jobdiagd.triage.engine import analyze
from jobdiagd.triage.resolve import ResolveError, list_jobs, resolve


class RunKeepingState(LogState):
    """A `LogState` that keeps every finished run of a requeued job's log in `finished`.

    The parser starts a new run when a header follows a JOB SUMMARY, by re-initialising the
    state; a shallow copy taken just before keeps the finished run's facts (the
    re-initialisation binds fresh objects, it does not clear the old ones)."""

    finished: list[LogState]

    def _new_run(self, lineno: int) -> None:
        done = copy.copy(self)
        kept = [*getattr(self, "finished", []), done]
        super()._new_run(lineno)
        self.finished = kept


def earlier_runs(log: Path, access: LogAccess, ref_time: float) -> list[LogState]:
    """The finished runs before the last one in a requeued job's log, oldest first."""
    st = read_file(log, RunKeepingState(str(log), ref_time=ref_time), access=access)
    return list(getattr(st, "finished", []))


def _stamps(states: Iterable[LogState]) -> tuple[float | None, float | None]:
    firsts = [s.first_stamp for s in states if s.first_stamp is not None]
    lasts = [s.last_stamp for s in states if s.last_stamp is not None]
    return (min(firsts) if firsts else None, max(lasts) if lasts else None)


def _barrier(states: Iterable[LogState]) -> float | None:
    for s in states:
        if s.barrier_sync is not None and s.barrier_sync.time is not None:
            return s.barrier_sync.time
    return None


def run_key(ref: JobRef, index: int) -> str:
    return f"{ref.log or ref.job_dir}#{index}"


def collect_job(
    ref: JobRef,
    *,
    now: float,
    access: LogAccess,
    slurm_state: str | None = None,
    slurm_wall_s: float | None = None,
) -> list[RunFacts]:
    """Every run of one job, oldest first (the last one is what `jobdiagd triage` reports)."""
    logs = load_job(ref, ref_time=now, access=access)
    result = analyze(logs, now=now, slurm_state=slurm_state, slurm_wall_s=slurm_wall_s)
    main = logs.main
    n_earlier = main.earlier_runs if main is not None else 0
    out: list[RunFacts] = []
    if n_earlier and ref.log is not None:
        for i, st in enumerate(earlier_runs(ref.log, access, now)[:n_earlier]):
            earlier = analyze(JobLogs(ref=ref, main=st), now=now)
            first, last = _stamps([st])
            out.append(
                run_facts(
                    earlier,
                    key=run_key(ref, i),
                    run_index=i,
                    runs_in_log=n_earlier + 1,
                    first_stamp=first,
                    last_stamp=last,
                    inlog_redone_s=st.superseded_seconds,
                    barrier_at=_barrier([st]),
                )
            )
    first, last = _stamps(logs.states)
    auth = logs.authoritative()
    mtime: float | None = None
    if ref.log is not None:
        try:
            mtime = os.stat(ref.log).st_mtime
        except OSError:
            mtime = None
    out.append(
        run_facts(
            result,
            key=run_key(ref, n_earlier),
            run_index=n_earlier,
            runs_in_log=n_earlier + 1,
            first_stamp=first,
            last_stamp=last,
            inlog_redone_s=auth.superseded_seconds if auth is not None else 0.0,
            barrier_at=_barrier(logs.states),
            file_end=mtime,
        )
    )
    return out


def job_refs(paths: Sequence[str | Path]) -> tuple[list[JobRef], list[str]]:
    """Jobs named by outputs roots, job directories or logs; (refs, one error line per bad path).
    Jobs without a log (prolog kills) are left out: they hold no time to account."""
    refs: list[JobRef] = []
    errors: list[str] = []
    for p in paths:
        path = Path(p)
        try:
            if path.is_dir() and not (path / "log").is_symlink() and not (path / "log").exists():
                refs += [r for r in list_jobs(path) if r.log is not None]
            else:
                ref = resolve(str(p), [])
                if ref.log is not None:
                    refs.append(ref)
        except ResolveError as exc:
            errors.append(str(exc))
    seen: set[str] = set()
    unique = []
    for r in refs:
        k = str(r.log)
        if k not in seen:
            seen.add(k)
            unique.append(r)
    return unique, errors


class ProgressLine:
    """`goodput: 1234/10000 jobs (900 cached)` rewritten in place, only when `stream` is a terminal."""

    def __init__(self, total: int, stream: TextIO | None = None, every: int = 50) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.every = total, every
        self.on = self.stream.isatty() and total > 1 and os.environ.get("TERM") != "dumb"

    def update(self, done: int, cached: int) -> None:
        if self.on and (done % self.every == 0 or done == self.total):
            self.stream.write(f"\rgoodput: {done}/{self.total} jobs ({cached} cached)")
            self.stream.flush()

    def close(self) -> None:
        if self.on:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
