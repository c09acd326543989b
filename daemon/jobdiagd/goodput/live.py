"""The per-job numbers a live job exports (the seam for the daemon's per-job `/metrics`), pure.

The daemon's metrics Collector reads one `LiveNumbers` per watched job at scrape time and turns
it into labelled series (job id, user, partition; removed when the job leaves the watch). The
engine makes it on its tick from what it already holds — the job's triage and its stall budget
— so a scrape costs no parsing. Goodput so far is the ledger of the run up to now (rule GP-4):
productive over allocated, the stall counted from the last step; it needs the run's start
(Slurm's, else the log's first dated line) and costs one pass over the triage's kept step
records.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobdiagd.goodput.facts import run_facts
from jobdiagd.goodput.ledger import Run, run_ledger
from jobdiagd.model.triage import TriageResult


@dataclass(frozen=True, slots=True)
class LiveNumbers:
    step: int | None
    step_time_s: float | None
    tokens_per_s_device: float | None  # the latest step's TGS
    expected_step: int | None  # where the projection says the job should be by now
    stall_s: float | None  # since the last step's line (None: no dated step)
    stall_budget_s: float | None  # the hang detector's budget for the current phase
    eta_s: float | None
    goodput: float | None  # productive / allocated GPU-seconds of this run so far
    productive_gpu_s: float
    allocated_gpu_s: float


def live_numbers(
    r: TriageResult,
    *,
    now: float,
    start: float | None,
    stall_budget_s: float | None = None,
    key: str = "live",
) -> LiveNumbers:
    """The numbers of one live job at `now`; `start`: when its allocation began (Slurm's start)."""
    p = r.progress
    last = r.steps[-1] if r.steps else None
    facts = run_facts(r, key=key)
    begin = start if start is not None else (r.steps[0].time if r.steps and r.steps[0].time else None)
    led = (
        run_ledger(Run(facts=facts, submit=None, start=begin, end=now))
        if begin is not None and now >= begin
        else None
    )
    return LiveNumbers(
        step=p.last_step,
        step_time_s=p.step_time_s,
        tokens_per_s_device=last.tgs if last is not None else None,
        expected_step=p.expected_step_now,
        stall_s=max(0.0, now - p.last_step_time) if p.last_step_time is not None else None,
        stall_budget_s=stall_budget_s,
        eta_s=p.eta_s,
        goodput=led.goodput if led is not None else None,
        productive_gpu_s=led.gpu_seconds["productive"] if led is not None else 0.0,
        allocated_gpu_s=led.allocated_gpu_s if led is not None else 0.0,
    )
