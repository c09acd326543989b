"""What one run of a job contributes to the goodput ledger, read from its triage: `RunFacts`, plain
and JSON-ready (the cache of `jobdiagd goodput` stores them), pure.

A run is one allocation of a job: a Slurm job, or one run of a requeued job that appended to
the same log (`LogState.earlier_runs`). The facts come from the logs alone; what Slurm's
accounting adds (submit, start, end, user, partition, comment) is joined later
(`goodput.ledger.RunTimes`), so the cached facts of a finished log never need Slurm again.

Decisions (docs/rules.md rules GP-1, GP-5, GP-6):
- GPUs per node: the count in HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES
  of the job's environment dump, else SLURM_GPUS_ON_NODE, else 8 (the nodes these jobs run
  on: 8 GPUs each), and `gpus_known` says which.
- Save cost: for each checkpoint save k the run shows (a save line; else the period's grid),
  the time its steps k, k+1 (k+2 for asynchronous saves) took beyond the steady step time
  (a step's time: its `seconds:`, or the time since the step before when both lines are dated
  and that is longer). The compile step is start-up, never a save.
- Hang: the run ended stalled — status hanging, primary hang, or an unknown death that the
  stall rule (HANG-5) calls stalled. `stalled` also holds for a failure or cancel after a
  stall (an NCCL timeout, a hung checkpoint write): its stall is accounted like a hang's.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, fields
from typing import Any

from jobdiagd.model.kinds import FailureClass, JobStatus
from jobdiagd.model.records import StepRecord
from jobdiagd.model.triage import CheckpointConfig, Progress, TriageResult
from jobdiagd.triage.progress import WARMUP_STEPS
from jobdiagd.triage.stall import step_cost

# Bump when what the facts mean changes: cached facts of another version are recomputed.
FACTS_VERSION = 1
DEFAULT_GPUS_PER_NODE = 8
_GPU_LISTS = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
MAX_TAILS = 64  # the last saves whose "seconds after" are kept (what a restart restores from)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFacts:
    key: str  # "<log>#<run index>": unique per run
    job_id: str | None
    run_index: int = 0  # which run of its log (a requeued job appends its runs to one log)
    runs_in_log: int = 1
    log: str | None = None
    job_name: str | None = None
    model: str | None = None
    nnodes: int = 1
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    gpus_known: bool = False
    nodes: tuple[str, ...] = ()
    user: str | None = None  # from the environment dump; Slurm's accounting wins
    partition: str | None = None
    status: str = JobStatus.UNKNOWN_DEATH
    primary: str | None = None
    hang: bool = False
    # Ended stalled: a hang, or a failure/cancel the stall rule (HANG-5) says had stalled before
    # it ended (an NCCL timeout, a hung checkpoint write): its last step -> end is a stall.
    stalled: bool = False
    # Times on the log's clock (epoch seconds), None when the log does not date them.
    first_stamp: float | None = None
    last_stamp: float | None = None  # the run's last dated line (a cancel: Slurm's cancel instant)
    file_end: float | None = None  # the main log's mtime: places a log without any dated line
    wall_s: float | None = None  # JOB SUMMARY's Wall
    first_step: int | None = None
    last_step: int | None = None
    first_step_at: float | None = None  # when the first step's line was written
    first_step_s: float | None = None  # its `seconds:` (compilation included)
    last_step_at: float | None = None
    step_time_s: float | None = None  # steady-state step time
    train_s: float = 0.0  # summed `seconds:` of every step line of the run
    inlog_redone_s: float = 0.0  # steps re-run after a restart inside this run's log
    checkpoint_s: float = 0.0  # what saves cost beyond the steady step time, summed (estimated on samples)
    gaps_s: float = 0.0  # dated time between step lines outside any step's `seconds:` (evals, logging)
    save_costs: tuple[float, ...] = ()  # per save measured past the warmup (the last MAX_TAILS)
    saves: int = 0
    checkpoint_period: int | None = None
    restored_from: int | None = None  # the checkpoint step this run restored (None: fresh or unknown)
    fresh: bool = False  # started from step 0 without restoring
    tails: tuple[tuple[int, float], ...] = ()  # (save step s, seconds of this run's steps after s)
    stall_origin: float | None = None  # a hang before the first step: when it stopped progressing
    blamed_hosts: tuple[str, ...] = ()
    # Filled by the collector for hang runs (they need the log re-read, not the triage).
    monitor_at: float | None = None  # when the 30-min log-mtime monitor would have fired
    replay_detected_at: float | None = None  # jobdiagd's page in a replay (backtest)
    replay_policy: str | None = None  # the stall policy that replay ran with

    @property
    def compile_s(self) -> float:
        """The first step's time beyond the steady step time: compilation, start-up."""
        if self.first_step_s is None or self.step_time_s is None:
            return 0.0
        return max(0.0, self.first_step_s - self.step_time_s)

    @property
    def gpus(self) -> int:
        return max(1, self.nnodes) * max(1, self.gpus_per_node)

    @property
    def config_key(self) -> str:
        """The job configuration checkpoint advice groups by: the model (MODEL_NAME, else the job
        name) and the node count; experiments (EXP_TAG) of one model on as many nodes share it."""
        return f"{self.model or self.job_name or '?'} x{self.nnodes}"

    def seconds_after(self, step: int) -> float:
        """This run's step seconds after `step` (a checkpoint restored by the next run): exact at
        a save the run shows, else its steps after it times the steady step time."""
        if self.last_step is None or self.first_step is None or step >= self.last_step:
            return 0.0
        if step < self.first_step:
            return self.train_s
        for s, secs in self.tails:
            if s == step:
                return secs
        return (self.last_step - step) * (self.step_time_s or 0.0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunFacts:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in raw.items() if k in known}
        for name in ("nodes", "save_costs", "blamed_hosts"):
            kw[name] = tuple(kw.get(name) or ())
        kw["tails"] = tuple((int(a), float(b)) for a, b in kw.get("tails") or ())
        return cls(**kw)


# Rule GP-8: the run ended for a reason that is not the job's own doing (code, configuration,
# a planned time limit, an operator's cancel, success).
INTERRUPTIONS = frozenset(
    {
        FailureClass.HANG,
        FailureClass.HEARTBEAT_TIMEOUT,
        FailureClass.NCCL_TIMEOUT,
        FailureClass.NCCL_NIC_FAIL,
        FailureClass.NODE_FAIL,
        FailureClass.UNKNOWN_DEATH,
        FailureClass.SIGNAL_KILL,
        FailureClass.ACTOR_FAIL,
        FailureClass.SUBPROCESS_FAIL,
        FailureClass.CHECKPOINT_FS_ERROR,
        FailureClass.ECC_TIMEOUT,
        FailureClass.NO_GPU,
    }
)


def is_interruption(f: RunFacts) -> bool:
    """Rule GP-8: the run was interrupted (a hang, or a failure that is not the job's own)."""
    return f.hang or (f.primary is not None and f.primary in INTERRUPTIONS)


def gpus_per_node(env: dict[str, str]) -> int | None:
    """GPUs per node from a job's environment dump (None: it does not say)."""
    for key in _GPU_LISTS:
        value = env.get(key, "").strip().strip("\"'")
        if value:
            items = [x for x in value.split(",") if x.strip()]
            if items and all(x.strip().isdigit() or x.strip().startswith(("GPU-", "MIG-")) for x in items):
                return len(items)
    n = env.get("SLURM_GPUS_ON_NODE", "").strip()
    return int(n) if n.isdigit() and 0 < int(n) <= 1024 else None


def _nnodes(r: TriageResult) -> int:
    if r.nodes:
        return len(r.nodes)
    for raw in ((r.header or {}).get("NNODES"), r.env.get("NNODES")):
        if raw and raw.strip().isdigit() and 0 < int(raw) < 100_000:
            return int(raw)
    if r.summary is not None and r.summary.nodes:
        return r.summary.nodes
    return 1


def is_hang(r: TriageResult) -> bool:
    """Rule GP-6: the run ended (or sits) stalled."""
    c = r.cls
    if c.status is JobStatus.HANGING or c.primary is FailureClass.HANG:
        return True
    return c.status is JobStatus.UNKNOWN_DEATH and c.stall is not None and c.stall.stalled


def ended_stalled(r: TriageResult) -> bool:
    """A failed, cancelled or dead run that the stall rule (HANG-5) says had stalled before it
    ended (a completed or soft-success run finished its training: what follows is teardown)."""
    c = r.cls
    ended = c.status in (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.UNKNOWN_DEATH)
    return ended and c.stall is not None and c.stall.stalled


def save_steps(ckpt: CheckpointConfig, first: int, last: int) -> list[int]:
    """The saves of a run over steps first..last: those the log showed, else the period's grid
    (the initial save at step 0 of a fresh run included)."""
    shown = sorted(s for s in ckpt.saves if first <= s <= last)
    if shown or not ckpt.enabled or not ckpt.period:
        return shown
    grid = range(((first + ckpt.period - 1) // ckpt.period) * ckpt.period, last + 1, ckpt.period)
    return [*([0] if first == 0 and 0 not in grid else []), *grid]


def save_costs(
    steps: list[StepRecord], ckpt: CheckpointConfig, step_time: float | None
) -> tuple[list[tuple[int, float]], int]:
    """((save step, its cost) for each save the kept records measure, number of saves in the
    run); rule GP-5."""
    if not steps or step_time is None:
        return [], 0
    first, last = steps[0].step, steps[-1].step
    saves = save_steps(ckpt, first, last)
    index = {s.step: i for i, s in enumerate(steps)}
    width = 3 if ckpt.asynchronous else 2
    costs: list[tuple[int, float]] = []
    for k in saves:
        extra, seen = 0.0, False
        for d in range(width):
            i = index.get(k + d)
            if i is None or k + d == first:
                continue
            cost = step_cost(steps, i)
            if cost is not None and math.isfinite(cost):
                extra += max(0.0, cost - step_time)
                seen = True
        if seen:
            costs.append((k, extra))
    return costs, len(saves)


def past_warmup(costs: list[tuple[int, float]], first: int) -> list[float]:
    """The costs of the saves after the run's warmup: what a save costs, for advice (a save in
    the warmup, the initial one at step 0, also carries the warmup's slow steps)."""
    return [c for k, c in costs if k - first >= WARMUP_STEPS]


def step_gaps(steps: list[StepRecord], saves: list[int], width: int, step_count: int) -> float:
    """Dated time between consecutive step lines beyond the later step's `seconds:` (an eval, a
    data stall, logging), over the steps no save slowed (a save's own gap is its cost); summed
    over the kept records, scaled to the run's step count when the records are a sample."""
    slowed = {k + d for k in saves for d in range(width)}
    total, pairs = 0.0, 0
    for prev, s in zip(steps, steps[1:], strict=False):
        if s.time is None or prev.time is None or prev.step != s.step - 1 or s.seconds is None:
            continue
        pairs += 1
        if s.step not in slowed:
            total += max(0.0, s.time - prev.time - s.seconds)
    if pairs == 0:
        return 0.0
    return total * (step_count - 1) / pairs if step_count - 1 > pairs else total


def _tails(
    steps: list[StepRecord], saves: list[int], last: int, step_time: float | None
) -> tuple[tuple[int, float], ...]:
    """(s, seconds of the steps after s) for the run's last MAX_TAILS saves: summed from the kept
    records when they cover every step after s, else estimated from their mean."""
    out: list[tuple[int, float]] = []
    for s in saves[-MAX_TAILS:]:
        if s >= last:
            continue
        kept = [r.seconds for r in steps if r.step > s and r.seconds is not None]
        if len(kept) >= last - s:
            out.append((s, round(sum(kept), 3)))
        elif kept:
            out.append((s, round(sum(kept) / len(kept) * (last - s), 3)))
        elif step_time:
            out.append((s, round(step_time * (last - s), 3)))
    return tuple(out)


def _blamed(r: TriageResult) -> tuple[str, ...]:
    """Hosts the evidence of the primary failure names (and a heartbeat's accused hosts)."""
    hosts: list[str] = []
    if r.primary is not None:
        hosts += [e.host for e in r.cls.evidence if e.cls == r.primary and e.host]
    if r.cls.heartbeat is not None:
        hosts += r.cls.heartbeat.accused_hosts
    return tuple(dict.fromkeys(h for h in hosts if h in r.nodes or not r.nodes))


def _step_count(p: Progress) -> int:
    return p.last_step - p.first_step + 1 if p.first_step is not None and p.last_step is not None else 0


def _first_step_at(steps: list[StepRecord]) -> float | None:
    return steps[0].time if steps else None


def run_facts(
    r: TriageResult,
    *,
    key: str,
    run_index: int = 0,
    runs_in_log: int = 1,
    first_stamp: float | None = None,
    last_stamp: float | None = None,
    inlog_redone_s: float = 0.0,
    barrier_at: float | None = None,
    file_end: float | None = None,
) -> RunFacts:
    """The facts of one run from its triage. `first_stamp`/`last_stamp`: the run's first and
    last dated lines (every file of the job); a cancelled run ends at Slurm's cancel instant
    when the log names it (the classification's end time). `barrier_at`: when the run reached
    the pre-training barrier (its sync line), where a hang before the first step begins."""
    p = r.progress
    steps = r.steps
    step_time = p.step_time_s
    costs, nsaves = save_costs(steps, r.ckpt, step_time)
    values = [c for _, c in costs]
    if values and nsaves > len(values):
        checkpoint = statistics.fmean(values) * nsaves  # a sampled long run: the mean per save
    else:
        checkpoint = sum(values)
    end_stamp = last_stamp
    if r.status is JobStatus.CANCELLED and r.cls.end_time is not None:
        end_stamp = max(end_stamp or r.cls.end_time, r.cls.end_time)
    gpn = gpus_per_node(r.env)
    header = r.header or {}
    saves_in_run = (
        save_steps(r.ckpt, p.first_step, p.last_step)
        if p.first_step is not None and p.last_step is not None
        else []
    )
    return RunFacts(
        key=key,
        job_id=r.job_id,
        run_index=run_index,
        runs_in_log=runs_in_log,
        log=str(r.ref.log) if r.ref.log is not None else None,
        job_name=r.job_name,
        model=header.get("MODEL_NAME") or (r.summary.model if r.summary is not None else None),
        nnodes=_nnodes(r),
        gpus_per_node=gpn or DEFAULT_GPUS_PER_NODE,
        gpus_known=gpn is not None,
        nodes=tuple(r.nodes),
        user=r.env.get("SLURM_JOB_USER") or None,
        partition=r.env.get("SLURM_JOB_PARTITION") or None,
        status=str(r.status),
        primary=str(r.primary) if r.primary is not None else None,
        hang=is_hang(r),
        stalled=is_hang(r) or ended_stalled(r),
        first_stamp=first_stamp,
        last_stamp=end_stamp,
        file_end=file_end,
        wall_s=r.summary.wall_s if r.summary is not None else None,
        first_step=p.first_step,
        last_step=p.last_step,
        first_step_at=_first_step_at(steps),
        first_step_s=steps[0].seconds if steps else None,
        last_step_at=p.last_step_time,
        step_time_s=step_time,
        train_s=p.train_time_s or 0.0,
        inlog_redone_s=inlog_redone_s,
        checkpoint_s=round(checkpoint, 3),
        gaps_s=round(step_gaps(steps, saves_in_run, 3 if r.ckpt.asynchronous else 2, _step_count(p)), 3),
        save_costs=tuple(round(c, 3) for c in past_warmup(costs, steps[0].step if steps else 0)[-MAX_TAILS:]),
        saves=nsaves,
        checkpoint_period=p.checkpoint_period,
        restored_from=p.restored_from_step if p.start == "restored" else None,
        fresh=p.start == "fresh",
        tails=_tails(steps, saves_in_run, p.last_step, step_time) if p.last_step is not None else (),
        stall_origin=barrier_at if not steps and is_hang(r) else None,
        blamed_hosts=_blamed(r),
    )
