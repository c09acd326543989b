"""The goodput ledger, pure: every second of a job chain's wall time in exactly one bucket.

A chain is the runs of one training, restarts linked (`goodput.chains`). Its wall time is the
sum over its runs of (end - submit); each run's seconds go to one of `BUCKETS` (rule GP-4):

- `queue`: from when the job could start (Slurm's Eligible, else Submit) to its start (0 when
  no Slurm accounting says; an earlier run of a requeued log: its queue wait is unknown);
- `startup`: start to the first step's beginning (container, stages, restore, compilation up
  to the first step), plus the first step's time beyond the steady step time (the compile);
  all of a run that never completed a step and did not hang;
- `checkpoint`: what the saves cost beyond the steady step time (`RunFacts.checkpoint_s`);
- `redone`: this run's steps after the checkpoint a later run of the chain restored from (a
  fresh restart redoes them all), and the steps re-run after a restart inside the log;
- `stall_to_detection`: a hung run (or one that failed or was cancelled after stalling: an
  NCCL timeout, a hung checkpoint write), from its last step (or, before any step, from the
  pre-training barrier) to jobdiagd's page — the incident store when the daemon watched the
  job, else a replay; when neither says, to the run's end (the notes say which);
- `detection_to_kill`: from the page to the run's end;
- `productive`: the rest of the span from the first step's beginning to the last step's line;
- `rest`: what none of these can claim — dated time between step lines outside any step's
  `seconds:` (evals, logging), the time after the last step of a run that did not hang (the
  final save, teardown, a crash's cascade), a live run's step in progress, and in an undated
  log everything outside the summed step time.

The parts are cut from the run's timeline in order and clamped to it, so they are never
negative and always add up to the wall time (a test checks it). GPU-hours are hours × nodes ×
GPUs per node (`RunFacts.gpus`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobdiagd.goodput.facts import RunFacts
from jobdiagd.rules.recovery import parse_restart_marker

BUCKETS: tuple[str, ...] = (
    "productive",
    "queue",
    "startup",
    "checkpoint",
    "stall_to_detection",
    "detection_to_kill",
    "redone",
    "rest",
)
LOST: tuple[str, ...] = tuple(b for b in BUCKETS if b not in ("productive", "queue"))


@dataclass(frozen=True, slots=True)
class SlurmFacts:
    """What Slurm's accounting (or scontrol) says about a job; every field optional."""

    submit: float | None = None
    start: float | None = None
    end: float | None = None
    state: str | None = None
    user: str | None = None
    partition: str | None = None
    nodes: tuple[str, ...] = ()
    nnodes: int | None = None
    comment: str | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """A run placed in time: its facts, when it was submitted, started and ended, and who ran it."""

    facts: RunFacts
    submit: float | None
    start: float
    end: float
    live: bool = False
    user: str = "?"
    partition: str = "?"
    nodes: tuple[str, ...] = ()
    times_from: str = "log"  # "slurm" | "log"
    restart_of: str | None = None  # the restart marker's job id (rule GP-3 b)
    detected_at: float | None = None  # jobdiagd's hang page
    detected_by: str | None = None  # "incident" | "replay" | None

    @property
    def key(self) -> str:
        return self.facts.key

    @property
    def gpus(self) -> int:
        return self.facts.gpus


@dataclass
class Ledger:
    """Seconds per bucket of one run (or the sum of several), and the GPUs they count for."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    gpu_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    notes: list[str] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def allocated_gpu_s(self) -> float:
        """GPU-seconds the allocation held: everything but the queue."""
        return sum(v for k, v in self.gpu_seconds.items() if k != "queue")

    @property
    def goodput(self) -> float | None:
        alloc = self.allocated_gpu_s
        return self.gpu_seconds["productive"] / alloc if alloc > 0 else None

    def gpu_hours(self, bucket: str) -> float:
        return self.gpu_seconds[bucket] / 3600.0

    def add(self, other: Ledger) -> None:
        for b in BUCKETS:
            self.seconds[b] += other.seconds[b]
            self.gpu_seconds[b] += other.gpu_seconds[b]

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 3),
            "seconds": {b: round(v, 3) for b, v in self.seconds.items()},
            "gpu_hours": {b: round(v / 3600.0, 4) for b, v in self.gpu_seconds.items()},
            "goodput": None if self.goodput is None else round(self.goodput, 4),
            "notes": list(self.notes),
        }


def total(ledgers: Iterable[Ledger]) -> Ledger:
    out = Ledger()
    for led in ledgers:
        out.add(led)
    return out


class _Cutter:
    """Hands out consecutive pieces of [lo, hi]: each piece is clamped to what is left."""

    def __init__(self, lo: float, hi: float) -> None:
        self.left = max(0.0, hi - lo)

    def take(self, want: float) -> float:
        got = min(self.left, max(0.0, want))
        self.left -= got
        return got


def _clamp(t: float | None, lo: float, hi: float) -> float | None:
    return None if t is None else min(hi, max(lo, t))


def _span(f: RunFacts, start: float, end: float) -> tuple[float | None, float | None]:
    """(first step's beginning, last step's line) on the run's clock, clamped into it; None when
    the log does not date them."""
    b = _clamp(f.last_step_at, start, end)
    a: float | None = None
    if f.first_step_at is not None and f.first_step_s is not None:
        a = f.first_step_at - f.first_step_s
    elif f.first_step_at is not None:
        a = f.first_step_at - (f.step_time_s or 0.0)
    elif b is not None:
        a = b - f.train_s
    a = _clamp(a, start, end)
    if a is not None and b is not None and b < a:
        b = a
    return a, b


def run_ledger(run: Run, redo_s: float = 0.0) -> Ledger:
    """The buckets of one run; `redo_s`: seconds of its steps a later run redid (rule GP-4)."""
    f = run.facts
    sec = dict.fromkeys(BUCKETS, 0.0)
    notes: list[str] = []
    if run.submit is not None and run.submit < run.start:
        sec["queue"] = run.start - run.submit
    start, end = run.start, max(run.start, run.end)
    redo = redo_s + f.inlog_redone_s
    if f.first_step is None:
        _no_steps(run, sec, start, end, notes)
    else:
        a, b = _span(f, start, end)
        if a is None or b is None:
            _undated(f, sec, start, end, redo, notes)
        else:
            sec["startup"] = a - start
            cut = _Cutter(a, b)
            sec["startup"] += cut.take(f.compile_s)
            sec["checkpoint"] = cut.take(f.checkpoint_s)
            sec["rest"] = cut.take(f.gaps_s)
            sec["redone"] = cut.take(redo)
            sec["productive"] = cut.take(cut.left)
            _after_last_step(run, sec, b, end, notes)
    led = Ledger(seconds=sec, notes=notes)
    led.gpu_seconds = {k: v * run.gpus for k, v in sec.items()}
    return led


def _no_steps(run: Run, sec: dict[str, float], start: float, end: float, notes: list[str]) -> None:
    f = run.facts
    if not (f.hang or f.stalled):
        sec["startup"] = end - start
        return
    origin = _clamp(f.stall_origin, start, end)
    if origin is None:
        origin = start
        notes.append("hang before the first step with no dated barrier: stalled from the run's start")
    sec["startup"] = origin - start
    _stalled(run, sec, origin, end, notes)


def _stalled(run: Run, sec: dict[str, float], origin: float, end: float, notes: list[str]) -> None:
    det = _clamp(run.detected_at, origin, end)
    if det is None:
        if run.facts.replay_policy is not None:
            notes.append("no hang page before the run ended (replay): stalled to the run's end")
        else:
            notes.append("hang detection time unknown: stalled to the run's end")
        det = end
    sec["stall_to_detection"] = det - origin
    sec["detection_to_kill"] = end - det


def _after_last_step(run: Run, sec: dict[str, float], b: float, end: float, notes: list[str]) -> None:
    if run.facts.hang or run.facts.stalled:
        _stalled(run, sec, b, end, notes)
    else:
        sec["rest"] += end - b


def _undated(
    f: RunFacts, sec: dict[str, float], start: float, end: float, redo: float, notes: list[str]
) -> None:
    """Steps but no dated step line: the summed step seconds are all the log places."""
    notes.append("undated step lines: time outside the summed step seconds is in rest")
    cut = _Cutter(start, end)
    train = cut.take(f.train_s)  # undated: the saves can only be inside the steps' seconds
    inner = _Cutter(0.0, train)
    sec["startup"] = inner.take(f.compile_s)
    sec["checkpoint"] = inner.take(f.checkpoint_s)
    sec["redone"] = inner.take(redo)
    sec["productive"] = inner.take(inner.left)
    sec["rest"] = cut.left


# --- chains ---------------------------------------------------------------------------------------


@dataclass
class Chain:
    """The runs of one training in order (restarts linked), each with its ledger."""

    runs: list[Run]
    links: list[str]  # why run i+1 follows run i: "requeue" | "marker" | "restore" | "retry"
    ledgers: list[Ledger] = field(default_factory=list)

    @property
    def key(self) -> str:
        first = self.runs[0].facts
        return f"{first.job_id or first.key}"

    @property
    def ledger(self) -> Ledger:
        return total(self.ledgers)


def redo_seconds(run: Run, later: Sequence[Run]) -> float:
    """Seconds of `run`'s steps that the chain's later runs redid: after the checkpoint the next
    run that trained restored from; 0 when none trained. A fresh restart (or one restoring from
    before this run's first step) redid all of them: `math.inf`, so the ledger hands the whole
    trained span to `redone` and the millisecond jitter between dated lines and the summed step
    seconds is not left in `productive`."""
    f = run.facts
    if f.first_step is None:
        return 0.0
    for nxt in later:
        g = nxt.facts
        if g.restored_from is not None and g.restored_from >= f.first_step:
            done = f.seconds_after(g.restored_from)
            break
        if g.restored_from is not None or g.fresh or g.first_step == 0:
            return math.inf
    else:
        return 0.0
    # The compile and the saves are already their own buckets.
    return max(0.0, min(done, f.train_s - f.compile_s - f.checkpoint_s))


def ledger_chain(chain: Chain) -> Chain:
    chain.ledgers = [run_ledger(r, redo_seconds(r, chain.runs[i + 1 :])) for i, r in enumerate(chain.runs)]
    return chain


def chain_dict(chain: Chain) -> dict[str, Any]:
    return {
        "chain": chain.key,
        "links": chain.links,
        "ledger": chain.ledger.to_dict(),
        "runs": [run_dict(r, led) for r, led in zip(chain.runs, chain.ledgers, strict=True)],
    }


def run_dict(run: Run, led: Ledger) -> dict[str, Any]:
    f = run.facts
    return {
        "run": f.key,
        "job_id": f.job_id,
        "job_name": f.job_name,
        "log": f.log,
        "user": run.user,
        "partition": run.partition,
        "nodes": list(run.nodes),
        "nnodes": f.nnodes,
        "gpus_per_node": f.gpus_per_node,
        "gpus_per_node_known": f.gpus_known,
        "status": f.status,
        "primary": f.primary,
        "hang": f.hang,
        "live": run.live,
        "submit": run.submit,
        "start": run.start,
        "end": run.end,
        "times_from": run.times_from,
        "detected_at": run.detected_at,
        "detected_by": run.detected_by,
        "monitor_at": f.monitor_at,
        "ledger": led.to_dict(),
    }


def resolve_run(
    f: RunFacts,
    slurm: SlurmFacts | None,
    *,
    now: float,
    detection: Mapping[str, tuple[float, str]] | None = None,
) -> Run | None:
    """Place a run in time (rule GP-2): Slurm's start and end when it has them (the last run of a
    requeued log only: Slurm keeps one record per job id), else the log's (end: its last dated
    line; start: end minus the JOB SUMMARY's Wall, else its first dated line; a log with a Wall
    but no dated line at all ends at its file's mtime); a live run ends now. None when nothing
    dates the run."""
    use_slurm = slurm is not None and f.run_index == f.runs_in_log - 1
    s = slurm if use_slurm else None
    live = s is not None and s.end is None and s.start is not None and (s.state or "") in _ALIVE
    end = s.end if s is not None and s.end is not None else (now if live else f.last_stamp)
    if end is None and f.wall_s is not None and f.first_stamp is None:
        end = f.file_end  # nothing dated in the log: its last write (placement only, never a signal)
    start = s.start if s is not None and s.start is not None else None
    if start is None:
        if end is not None and f.wall_s is not None:
            start = end - f.wall_s
        else:
            start = f.first_stamp
    if end is None and start is not None and f.wall_s is not None:
        end = start + f.wall_s
    if start is None or end is None:
        return None
    det = (detection or {}).get(f.key)
    if det is None and f.replay_detected_at is not None:
        det = (f.replay_detected_at, "replay")
    return Run(
        facts=f,
        submit=s.submit if s is not None else None,
        start=start,
        end=max(start, end),
        live=live,
        user=(s.user if s is not None and s.user else None) or f.user or "?",
        partition=(s.partition if s is not None and s.partition else None) or f.partition or "?",
        nodes=(s.nodes if s is not None and s.nodes else ()) or f.nodes,
        times_from="slurm" if s is not None and s.start is not None else "log",
        restart_of=parse_restart_marker(slurm.comment) if slurm is not None else None,
        detected_at=det[0] if det is not None and (f.hang or f.stalled) else None,
        detected_by=det[1] if det is not None and (f.hang or f.stalled) else None,
    )


_ALIVE = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STAGE_OUT", "SIGNALING"})
