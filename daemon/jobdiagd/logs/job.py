"""Load every log of one job (Slurm log, Ray worker logs, k8s rank logs) into `LogState`s.

For RAY=1 jobs the head node's `ray_logs/<host>/worker-*.out` is the authoritative step
record (the Slurm log may be truncated); all worker `.out`/`.err` files are also scanned
for failure signatures. For k8s, `rank-N.log` files are scanned with task = N.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from jobdiagd.logs.reader import read_file
from jobdiagd.logs.safeopen import ANYWHERE, LogAccess, RefusedFile
from jobdiagd.logs.state import LogState
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.kinds import FailureClass
from jobdiagd.rules.hostlist import expand_hostlist

_RANK = re.compile(r"^rank-(\d+)\.log$")
MAX_WORKER_FILES = 512


@dataclass
class JobLogs:
    ref: JobRef
    main: LogState | None
    workers: dict[str, list[LogState]] = field(default_factory=dict)  # host -> states
    ranks: dict[int, LogState] = field(default_factory=dict)
    head_host: str | None = None
    errors: list[str] = field(default_factory=list)  # unreadable files, reported not fatal

    @property
    def states(self) -> list[LogState]:
        out: list[LogState] = [self.main] if self.main is not None else []
        for states in self.workers.values():
            out.extend(states)
        out.extend(self.ranks.values())
        return out

    @property
    def ray(self) -> bool:
        m = self.main
        if self.workers:
            return True
        if m is None or m.ray_fallback or FailureClass.RAY_START_FAIL in m.hits:
            return False
        return (
            m.header.get("RAY", m.env.get("RAY", "0")).strip() == "1"
            or "RAY_PORT" in m.header
            or m.ray_head is not None
        )

    def authoritative(self) -> LogState | None:
        """The state whose steps count: the head's worker log with the most progress, else the main log."""
        best = self.main
        best_key = (best.steps.max_step if best and best.steps else -1, 0)
        hosts = [self.head_host] if self.head_host in self.workers else list(self.workers)
        for host in hosts:
            for st in self.workers.get(host or "", []):
                if not st.steps:
                    continue
                key = (st.steps.max_step, 1)
                if key >= best_key:
                    best, best_key = st, key
        return best


def _safe_read(path: Path, state: LogState, errors: list[str], access: LogAccess) -> LogState | None:
    try:
        return read_file(path, state, access=access)
    except OSError as exc:
        errors.append(f"{path}: {exc.strerror or exc}")
        return None


def load_job(ref: JobRef, *, ref_time: float, access: LogAccess = ANYWHERE) -> JobLogs:
    """Every log of the job, each opened through `access`. A refused main log raises
    RefusedFile (nothing can be triaged without it); an unreadable or refused worker or rank
    log is skipped and named in `errors` (the report's notes)."""
    errors: list[str] = []
    main: LogState | None = None
    if ref.log is not None:
        try:
            main = read_file(ref.log, LogState(str(ref.log), ref_time=ref_time), access=access)
        except RefusedFile:
            raise
        except OSError as exc:
            errors.append(f"{ref.log}: {exc.strerror or exc}")
    logs = JobLogs(ref=ref, main=main, errors=errors)
    d = ref.job_dir
    if d is None or not d.is_dir():
        return logs
    if (d / "ray_logs").is_dir():
        _load_ray_workers(logs, d / "ray_logs", ref_time, access)
    _load_ranks(logs, d, ref_time, access)
    return logs


def _load_ray_workers(logs: JobLogs, ray_dir: Path, ref_time: float, access: LogAccess) -> None:
    """RAY=1: every host's `worker-*.out`/`.err` (at most MAX_WORKER_FILES in all), and which
    host is the head (its worker log is the authoritative step record, rule ST-7)."""
    count = 0
    for host_dir in sorted(p for p in ray_dir.iterdir() if p.is_dir()):
        files = sorted(host_dir.glob("worker-*.out")) + sorted(host_dir.glob("worker-*.err"))
        for f in files:
            if count >= MAX_WORKER_FILES:
                break
            count += 1
            st = _safe_read(f, LogState(str(f), ref_time=ref_time), logs.errors, access)
            if st is not None:
                logs.workers.setdefault(host_dir.name, []).append(st)
    head = _ray_head(logs.main)
    logs.head_host = head if head in logs.workers else None


def _ray_head(main: LogState | None) -> str | None:
    """The Ray head's host: the launch line, the tunnel's target, else the first allocated node."""
    if main is None:
        return None
    head = main.ray_head or main.tunnel_host
    if head is None and (nodes := main.header.get("JOB_NODELIST")):
        expanded = expand_hostlist(nodes)
        head = expanded[0] if expanded else None
    return head


def _load_ranks(logs: JobLogs, job_dir: Path, ref_time: float, access: LogAccess) -> None:
    """k8s: `rank-N.log`, read with task = N."""
    for f in sorted(job_dir.glob("rank-*.log")):
        m = _RANK.match(f.name)
        if not m:
            continue
        st = _safe_read(f, LogState(str(f), ref_time=ref_time), logs.errors, access)
        if st is not None:
            rank = int(m.group(1))
            # Rank logs carry no srun prefix: stamp their evidence with the rank as task.
            for hits in st.hits.values():
                for ev in hits.all():
                    if ev.task is None:
                        ev.task = rank
            logs.ranks[rank] = st
