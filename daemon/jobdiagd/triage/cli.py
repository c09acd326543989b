"""`jobdiagd triage`: one-off triage of job directories, logs or ids (runbook job-log-triage).

The daemon's view (rules VIEW-1, VIEW-3): `jobdiagd run` answers a chat's Full triage / `/triage`
with this command in a worker process, and passes what it knows that the log cannot say: its
stall policy (`--stall-factor`, `--min-stall-seconds`, `--startup-grace-seconds`,
`--checkpoint-budget-seconds`, the keys of `[detectors.hang]`), its instant (`--now`), Slurm's
state when squeue gave one, and for a live job it watches its own clock on the job's progress
(`--daemon-since`, `--daemon-budget`, `--daemon-phase`, `--daemon-gpu-confirmed`). Without them
the command judges from the log with the built-in policy, as before. *Decision: flags, not
`--config`: this command sits below the config schema (docs/architecture.md floors), and the
flags say exactly which values the answer used (the daemon formats them with `policy_argv` and
`stall_argv` below, beside the parser that reads them back).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from jobdiagd import clock, jsonsafe
from jobdiagd.model.kinds import StallPhase

if TYPE_CHECKING:
    from jobdiagd.model.jobref import JobRef
    from jobdiagd.model.triage import StallKnowledge, TriageResult
    from jobdiagd.triage.stall import StallPolicy

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


def _finite(text: str, what: str, low: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < low:
        raise argparse.ArgumentTypeError(f"{what}: expected a finite number >= {low:g}, got {text!r}")
    return value


def _seconds(text: str) -> float:
    return _finite(text, "seconds", 0.0)


def _factor(text: str) -> float:
    return _finite(text, "factor", 1.0)


def _instant(text: str) -> float:
    t = parse_now(text)
    if not math.isfinite(t):
        raise argparse.ArgumentTypeError(f"expected a finite time, got {text!r}")
    return t


# `jobdiagd triage` flag -> StallPolicy field; the flags are the `[detectors.hang]` keys.
POLICY_FLAGS: dict[str, str] = {
    "--stall-factor": "stall_factor",
    "--min-stall-seconds": "min_stall_s",
    "--startup-grace-seconds": "startup_s",
    "--checkpoint-budget-seconds": "checkpoint_s",
}


def policy_argv(policy: StallPolicy) -> list[str]:
    """The flags that give `jobdiagd triage` this stall policy (exact: `repr` of each float)."""
    out: list[str] = []
    for flag, name in POLICY_FLAGS.items():
        out += [flag, repr(float(getattr(policy, name)))]
    return out


def stall_argv(known: StallKnowledge) -> list[str]:
    """The flags that give `jobdiagd triage` the daemon's knowledge of a live job's progress."""
    out = [
        "--daemon-since",
        repr(float(known.since)),
        "--daemon-budget",
        repr(float(known.budget_s)),
        "--daemon-phase",
        StallPhase(known.phase).value,
    ]
    return [*out, "--daemon-gpu-confirmed"] if known.gpu_confirmed else out


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
    _register_daemon_view(p)
    p.set_defaults(func=run)


def _register_daemon_view(p: argparse.ArgumentParser) -> None:
    pol = p.add_argument_group(
        "stall policy", "the daemon's [detectors.hang] values (unset: the built-in policy's)"
    )
    pol.add_argument(
        "--stall-factor", type=_factor, metavar="F", help="steady budget: F x the steady step time"
    )
    pol.add_argument("--min-stall-seconds", type=_seconds, metavar="S", help="the least budget once steps come")
    pol.add_argument(
        "--startup-grace-seconds", type=_seconds, metavar="S", help="budget before the first step"
    )
    pol.add_argument(
        "--checkpoint-budget-seconds", type=_seconds, metavar="S", help="budget of a checkpoint-adjacent step"
    )
    known = p.add_argument_group(
        "the daemon's clock",
        "a live job the daemon watches (one PATH): its status is judged on these, not on the log's stamps",
    )
    known.add_argument(
        "--daemon-since",
        type=_instant,
        metavar="TIME",
        help="when the daemon read the last step (or the barrier)",
    )
    known.add_argument(
        "--daemon-budget", type=_seconds, metavar="S", help="the budget its hang detector applies"
    )
    known.add_argument("--daemon-phase", choices=[ph.value for ph in StallPhase], help="that budget's phase")
    known.add_argument(
        "--daemon-gpu-confirmed", action="store_true", help="a GPU-confirmed early page holds the job hung"
    )


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


def _policy(args: argparse.Namespace) -> StallPolicy | None:
    """The stall policy the flags give (unset ones keep the built-in value); None: no flag."""
    from jobdiagd.triage.stall import StallPolicy

    given = {name: getattr(args, flag[2:].replace("-", "_")) for flag, name in POLICY_FLAGS.items()}
    given = {k: v for k, v in given.items() if v is not None}
    return StallPolicy(**given) if given else None


def _knowledge(args: argparse.Namespace) -> StallKnowledge | str | None:
    """The daemon's knowledge the flags give, None without them, or what is wrong with them."""
    from jobdiagd.model.triage import StallKnowledge

    parts = (args.daemon_since, args.daemon_budget, args.daemon_phase)
    if all(v is None for v in parts):
        if args.daemon_gpu_confirmed:
            return "--daemon-gpu-confirmed needs --daemon-since, --daemon-budget and --daemon-phase"
        return None
    if any(v is None for v in parts):
        return "--daemon-since, --daemon-budget and --daemon-phase go together"
    if args.all or len(args.paths) != 1:
        return "the daemon's clock (--daemon-*) describes one job: give exactly one PATH"
    return StallKnowledge(
        args.daemon_since, args.daemon_budget, StallPhase(args.daemon_phase), args.daemon_gpu_confirmed
    )


def _one(
    ref: JobRef,
    args: argparse.Namespace,
    now: float,
    policy: StallPolicy | None = None,
    known: StallKnowledge | None = None,
) -> TriageResult:
    from jobdiagd.triage.engine import triage_ref
    from jobdiagd.triage.resolve import job_access

    state, wall, user = _slurm(ref, args, now)
    # Only files inside the job's outputs root (or a root named by --outputs/$JOBDIAGD_OUTPUTS)
    # and owned by the job's user are read.
    access = job_access(ref, _roots(args, implicit=False), user)
    return triage_ref(
        ref, now=now, slurm_state=state, slurm_wall_s=wall, access=access, policy=policy, stall=known
    )


def run(args: argparse.Namespace) -> int:
    from jobdiagd.logs import reader
    from jobdiagd.logs.safeopen import RefusedFile
    from jobdiagd.triage.report import SUMMARY_HEADER, render_json, render_markdown, render_row
    from jobdiagd.triage.resolve import ResolveError, list_jobs, resolve

    now = args.now if args.now is not None else clock.wall()
    if args.workers is not None and args.workers < 1:
        print("jobdiagd triage: --workers must be at least 1", file=sys.stderr)
        return 2
    policy, known = _policy(args), _knowledge(args)
    if isinstance(known, str):
        print(f"jobdiagd triage: {known}", file=sys.stderr)
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
            results.append(_one(ref, args, now, policy, known))
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
