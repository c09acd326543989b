"""`jobdiagd triage`: one-off triage of job directories, logs or ids (runbook job-log-triage)."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from jobdiagd import clock, jsonsafe

if TYPE_CHECKING:
    from jobdiagd.model.jobref import JobRef
    from jobdiagd.model.triage import TriageResult

# The parser, engine and report are imported when `triage` runs (`run`), not when it is
# registered: `jobdiagd --help` and the other subcommands load this module for its arguments.


def parse_now(text: str) -> float:
    """`--now` as epoch seconds or ISO-8601 (naive = local time)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--now: expected epoch seconds or ISO-8601, got {text!r}") from exc
    if dt.tzinfo is None:
        dt = dt.astimezone()
    return dt.timestamp()


MAX_AUTO_WORKERS = 2


def auto_workers(cpus: int, others_running: int | None) -> int:
    """Workers for a big log's body when `--workers` is not given: one per CPU that no other
    process is running on, at most MAX_AUTO_WORKERS, at least 1; MAX_AUTO_WORKERS (bounded by
    the CPUs) when the load is unknown.

    On a busy machine (a login node, a shared box) forked workers only queue behind the others:
    the fork and the hand-over of their results are then pure loss. Measured with
    bench/bench_triage.py under a load average of 4-8 on 2 CPUs: two workers took 1.08 s for the
    150 MB log where one process took 0.50 s (4.2 s against 4.0 s on the 1 GiB log). The
    report is the same either way (tests/logs/test_batched_read.py reads serially and forked)."""
    idle = cpus if others_running is None else cpus - others_running
    return max(1, min(MAX_AUTO_WORKERS, cpus, idle))


def _others_running() -> int | None:
    """Processes runnable right now besides this one (the 4th field of /proc/loadavg counts this
    one); None where there is no such file. A snapshot: the 1-minute load average lags, and a
    run of triages (the benchmark) would read its own past load as a busy machine."""
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return max(0, int(fh.read().split()[3].partition("/")[0]) - 1)
    except (OSError, ValueError, IndexError):
        return None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "triage",
        help="triage job logs (status, failure class, progress, TGS)",
        description="Triage MaxText job logs per the job-log-triage runbook.",
    )
    p.add_argument(
        "paths", nargs="*", metavar="PATH", help="job directory, .log file, Slurm id or k8s/local id"
    )
    p.add_argument("--all", action="store_true", help="every job under the outputs root(s)")
    p.add_argument(
        "--outputs",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="outputs root for ids and --all (repeatable; default $JOBDIAGD_OUTPUTS or ./outputs)",
    )
    p.add_argument("--json", action="store_true", help="print the stable JSON document")
    p.add_argument("--now", type=parse_now, default=None, help="clock for projections (epoch or ISO-8601)")
    p.add_argument(
        "--slurm-state", default=None, help="override the Slurm job state (e.g. RUNNING, COMPLETED)"
    )
    p.add_argument("--no-slurm", action="store_true", help="do not ask squeue/scontrol for the job state")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="processes that pre-filter the body of a log over 128 MiB (default: up to 2, one per "
        "CPU no other process is running on; 1 on a busy machine)",
    )
    p.set_defaults(func=run)


def _roots(args: argparse.Namespace, *, implicit: bool = True) -> list[Path]:
    """--outputs, else $JOBDIAGD_OUTPUTS, else (`implicit`) ./outputs."""
    if args.outputs:
        return list(args.outputs)
    env = os.environ.get("JOBDIAGD_OUTPUTS")
    if env:
        return [Path(p) for p in env.split(os.pathsep) if p]
    return [Path("outputs")] if implicit else []


def _slurm(ref: JobRef, args: argparse.Namespace, now: float) -> tuple[str | None, float | None, str | None]:
    """(state, wall time so far, user) from scontrol; --slurm-state replaces the query
    (reproducible runs)."""
    if args.slurm_state:
        return str(args.slurm_state).upper(), None, None
    if args.no_slurm or ref.platform != "slurm" or not ref.job_id:
        return None, None, None
    from jobdiagd.sources.slurmstate import query_job, slurm_wall_s

    job = query_job(ref.job_id)
    if job is None:
        return None, None, None
    return job.state, slurm_wall_s(job, now), job.user


def _one(ref: JobRef, args: argparse.Namespace, now: float) -> TriageResult:
    from jobdiagd.triage.engine import triage_ref
    from jobdiagd.triage.resolve import job_access

    state, wall, user = _slurm(ref, args, now)
    # Only files inside the job's outputs root (or a root named by --outputs/$JOBDIAGD_OUTPUTS)
    # and owned by the job's user are read.
    access = job_access(ref, _roots(args, implicit=False), user)
    return triage_ref(ref, now=now, slurm_state=state, slurm_wall_s=wall, access=access)


def run(args: argparse.Namespace) -> int:
    from jobdiagd.logs import reader
    from jobdiagd.logs.safeopen import RefusedFile
    from jobdiagd.triage.report import SUMMARY_HEADER, render_json, render_markdown, render_row
    from jobdiagd.triage.resolve import ResolveError, list_jobs, resolve

    now = args.now if args.now is not None else clock.wall()
    if args.workers is not None and args.workers < 1:
        print("jobdiagd triage: --workers must be at least 1", file=sys.stderr)
        return 2
    workers = args.workers
    if workers is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = auto_workers(cpus, _others_running())
    reader.set_default_workers(workers)
    roots = _roots(args)
    refs: list[JobRef] = []
    # One unusable path gets its one-line error; the others are still reported (exit 2 then).
    bad = 0
    targets: list[tuple[str, bool]] = [(str(r), True) for r in roots] if args.all else []
    targets += [(t, False) for t in args.paths]
    for target, is_root in targets:
        try:
            refs.extend(list_jobs(Path(target)) if is_root else [resolve(target, roots)])
        except ResolveError as exc:
            print(f"jobdiagd triage: {exc}", file=sys.stderr)
            bad += 1
    if not refs:
        if not bad:
            print("jobdiagd triage: nothing to triage (give PATH... or --all)", file=sys.stderr)
        return 2
    results: list[TriageResult] = []
    for ref in refs:
        try:
            results.append(_one(ref, args, now))
        except RefusedFile as exc:
            print(f"jobdiagd triage: {ref.job_dir or ref.log}: log refused: {exc.strerror}", file=sys.stderr)
            bad += 1
        except OSError as exc:
            print(f"jobdiagd triage: {ref.log or ref.job_dir}: {exc.strerror or exc}", file=sys.stderr)
            bad += 1
    if not results:
        return 2
    if len(results) == 1 and len(targets) == 1 and not args.all:
        r = results[0]
        print(render_json(r) if args.json else render_markdown(r), end="" if not args.json else "\n")
        return 0
    if args.json:
        print(jsonsafe.dumps({"jobs": [r.to_dict() for r in results]}, indent=2, default=str))
    else:
        print(SUMMARY_HEADER)
        for r in results:
            print(render_row(r))
    return 2 if bad else 0
