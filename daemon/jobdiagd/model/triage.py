"""What a triage concludes about one job, as plain typed data: `TriageResult` and its parts.

`triage.engine.analyze` makes it; the report, next steps, detectors, the daemon and the TSDB
diagnosis read it. The parts are the results of each runbook step: `CheckpointConfig` and
`Progress` (progress projection), `TgsAnalysis` (TGS trend), `Classification` with its
`HeartbeatInfo` and `Stall` (status and failure class), `Live` (where a live job's Prometheus is).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from jobdiagd.model.jobref import JobRef
from jobdiagd.model.kinds import (
    FailureClass,
    HeartbeatPhase,
    HeartbeatVerdict,
    JobStatus,
    StallBasis,
    StallPhase,
    TgsPattern,
)
from jobdiagd.model.records import Evidence, NodeExit, StepRecord, Summary


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """When training steps are expected to be slow for a known reason: checkpoint saves (the
    configured period, or the saves the log showed), evals every `eval_interval` steps and the
    profiler window. Those steps are left out of steady-state figures, and the stall budget
    allows for them."""

    enabled: bool | None
    period: int | None
    asynchronous: bool
    saves: frozenset[int] = frozenset()  # checkpoint steps the log showed (0: the initial save)
    eval_period: int | None = None  # eval_interval: an eval runs after step k*E
    profile: tuple[int, int] | None = None  # profiler window, first and last slowed step

    def adjacent(self, step: int) -> bool:
        """Is this step slowed by a save, an eval or the profiler (the step itself and the one
        after it, two for asynchronous saves)?"""
        return self.periodic(step) or self.profiled(step)

    def profiled(self, step: int) -> bool:
        """Is this step in the profiler window (a one-off slowdown, never a periodic pattern)?"""
        return self.profile is not None and self.profile[0] <= step <= self.profile[1]

    def periodic(self, step: int) -> bool:
        """Is this step slowed by a checkpoint save or an eval (recurring, every N steps)?"""
        return self.saving(step) or self.evaluating(step)

    def saving(self, step: int) -> bool:
        """Is this step slowed by a checkpoint save: k·P and k·P+1 (k·P+2 with asynchronous
        saves), or a save the log showed (step-0 included) and the step after it?"""
        if step <= 0:
            return False
        if self.period:
            r = step % self.period
            if r == 0 or r == 1 or (self.asynchronous and r == 2):
                return True
        return bool(self.saves) and (step in self.saves or step - 1 in self.saves)

    def evaluating(self, step: int) -> bool:
        """Is this step slowed by an eval (`eval_interval` E: k·E and k·E+1)?"""
        if step <= 0 or not self.eval_period:
            return False
        r = step % self.eval_period
        return r == 0 or r == 1

    def marks(self, first: int, last: int) -> tuple[str, ...]:
        """What slows some step in [first, last]: "checkpoint", "eval", "profiler" (plot marks)."""
        out: list[str] = []
        ckpt = self.saves and any(first <= s + d <= last for s in self.saves for d in (0, 1))
        if ckpt or (self.period and _grid_hit(first, last, self.period, 3 if self.asynchronous else 2)):
            out.append("checkpoint")
        if self.eval_period and _grid_hit(first, last, self.eval_period, 2):
            out.append("eval")
        if self.profile is not None and first <= self.profile[1] and self.profile[0] <= last:
            out.append("profiler")
        return tuple(out)


def _grid_hit(first: int, last: int, period: int, width: int) -> bool:
    """Is some step k*period + d (k*period > 0, 0 <= d < width) in [first, last]?"""
    for d in range(width):
        k = max(1, -(-(first - d) // period))
        if k * period + d <= last:
            return True
    return False


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    start: str | None
    restored_from_step: int | None
    first_step: int | None
    last_step: int | None
    total_steps: int | None
    step_time_s: float | None
    expected_step_now: int | None
    checkpoint_period: int | None
    last_checkpoint_step: int | None
    progress_lost_steps: int | None
    progress_lost_s: float | None
    eta_s: float | None
    train_time_s: float | None
    wall_time_s: float | None
    unaccounted_s: float | None
    last_step_time: float | None
    checkpointing: bool | None
    # last_step_time is training start + summed step seconds, not a stamp on the step line
    last_step_time_estimated: bool = False
    progress_lost_s_estimated: bool = False  # from the kept records' mean (a sampled long run)

    @property
    def steps_this_run(self) -> int | None:
        if self.first_step is None or self.last_step is None:
            return None
        return self.last_step - self.first_step + 1

    @property
    def reached_end(self) -> bool:
        return (
            self.total_steps is not None
            and self.last_step is not None
            and self.last_step >= self.total_steps - 1
        )

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d.pop("progress_lost_s")
        d.pop("checkpointing")
        d.pop("last_step_time_estimated")
        d.pop("progress_lost_s_estimated")
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class TgsAnalysis:
    baseline: float | None
    recent: float | None
    change_pct: float | None
    degraded: bool
    pattern: TgsPattern
    range: str | None
    range_steps: tuple[int, int] | None
    magnitude: str | None
    metric: str
    periodic_steps: tuple[int, ...]
    note: str | None = None

    @classmethod
    def no_trend(cls, metric: str, note: str | None = None) -> TgsAnalysis:
        """No baseline, no trend: too few steps (or none) to judge throughput."""
        return cls(
            baseline=None,
            recent=None,
            change_pct=None,
            degraded=False,
            pattern=TgsPattern.NONE,
            range=None,
            range_steps=None,
            magnitude=None,
            metric=metric,
            periodic_steps=(),
            note=note,
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "baseline": self.baseline,
            "recent": self.recent,
            "change_pct": self.change_pct,
            "degraded": self.degraded,
            "pattern": self.pattern,
            "range": self.range,
            "magnitude": self.magnitude,
            "metric": self.metric,
        }


@dataclass(kw_only=True)
class HeartbeatInfo:
    time: float | None
    timeout_s: float
    accused_tasks: list[int]
    accused_hosts: list[str]
    self_reported: list[int]
    earlier_error: Evidence | None
    stalled: bool
    stall_s: float | None
    phase: HeartbeatPhase
    verdict: HeartbeatVerdict


@dataclass
class Stall:
    stalled: bool
    gap_s: float | None
    budget_s: float
    phase: StallPhase
    basis: StallBasis


@dataclass(frozen=True, slots=True)
class StallKnowledge:
    """What the daemon knows of a live job's progress, on its own clock (rule VIEW-1): when it
    read the job's last step (before the first: the pre-training barrier, else when it began
    watching), the budget its hang detector applies to that wait, and whether a GPU-confirmed
    early page holds the job as hung before that budget runs out.

    Given to `triage.engine.analyze`, it decides a live job's `running`/`hanging` instead of the
    log's own stamps: the daemon, the page and the triage then say the same thing."""

    since: float
    budget_s: float
    phase: StallPhase
    gpu_confirmed: bool = False

    def gap(self, now: float) -> float:
        return now - self.since

    def stalled(self, now: float) -> bool:
        return self.gpu_confirmed or self.gap(now) > self.budget_s


@dataclass(kw_only=True)
class Classification:
    status: JobStatus
    primary: FailureClass | None
    stage: str | None
    evidence: list[Evidence]
    classes: list[FailureClass]
    notes: list[str] = field(default_factory=list)
    heartbeat: HeartbeatInfo | None = None
    stall: Stall | None = None
    soft_success_variant: str | None = None
    end_time: float | None = None
    primary_rule: str | None = None  # the wording family of the primary's earliest evidence
    cancel_reason: str | None = None  # Slurm's "DUE TO ..." text when a cancel line says why


@dataclass
class Live:
    head_node: str | None
    prometheus_port: int | None
    tunnel: str | None

    def to_dict(self) -> dict[str, object]:
        return {"head_node": self.head_node, "prometheus_port": self.prometheus_port, "tunnel": self.tunnel}


@dataclass(kw_only=True)
class TriageResult:
    ref: JobRef
    now: float
    slurm_state: str | None
    nodes: list[str]
    steps: list[StepRecord]
    ckpt: CheckpointConfig
    progress: Progress
    tgs: TgsAnalysis
    cls: Classification
    live: Live
    next_steps: list[str]
    config: dict[str, str]
    env: dict[str, str]
    step_source: str | None
    # What the report reads from the job's main log, copied out of the parser's state when the
    # result is made: RAY=1, its header lines (None: no main log was read), its JOB SUMMARY and
    # its NODE_EXIT lines.
    ray: bool
    header: dict[str, str] | None
    summary: Summary | None
    node_exits: list[NodeExit]

    @property
    def status(self) -> JobStatus:
        return self.cls.status

    @property
    def primary(self) -> FailureClass | None:
        return self.cls.primary

    @property
    def job_id(self) -> str | None:
        if self.header is not None and self.header.get("JOB_ID"):
            return self.header["JOB_ID"]
        return self.ref.job_id

    @property
    def job_name(self) -> str | None:
        if self.header is not None and self.header.get("JOB_NAME"):
            return self.header["JOB_NAME"]
        return self.ref.name

    def to_dict(self) -> dict[str, object]:
        failures = [e.to_dict() for e in self.cls.evidence]
        if self.tgs.degraded:
            failures.append(
                {
                    "class": FailureClass.TGS_DEGRADATION,
                    "line": None,
                    "source": self.step_source,
                    "task": None,
                    "host": None,
                    "text": f"TGS {self.tgs.magnitude} over steps {self.tgs.range} ({self.tgs.pattern})",
                    "time": None,
                }
            )
        hb = self.cls.heartbeat
        return {
            "job": {
                "id": self.job_id,
                "name": self.job_name,
                "log": str(self.ref.log) if self.ref.log else None,
                "job_dir": str(self.ref.job_dir) if self.ref.job_dir else None,
                "ray": self.ray,
                "platform": self.ref.platform,
                "nodes": self.nodes,
                "nnodes": len(self.nodes) or _int(self.header.get("NNODES"))
                if self.header is not None
                else None,
            },
            "status": self.cls.status,
            "primary_failure": self.cls.primary,
            "stage": self.cls.stage,
            "classes": self.cls.classes,
            "failures": failures,
            "progress": self.progress.to_dict(),
            "tgs": self.tgs.to_dict(),
            "live": self.live.to_dict(),
            "config": self.config,
            "env": {
                k: v
                for k, v in self.env.items()
                if k.startswith(("XLA_", "NCCL_", "RCCL_", "JAX_", "RAY", "HIP_", "CUDA_"))
            },
            "heartbeat": None
            if hb is None
            else {
                "time": hb.time,
                "timeout_s": hb.timeout_s,
                "accused_tasks": hb.accused_tasks,
                "accused_hosts": hb.accused_hosts,
                "self_reported": hb.self_reported,
                "verdict": hb.verdict,
                "phase": hb.phase,
                "stall_s": hb.stall_s,
                "earlier_error": hb.earlier_error.to_dict() if hb.earlier_error else None,
            },
            "soft_success_variant": self.cls.soft_success_variant,
            "notes": self.cls.notes,
            "steps": [
                {"step": s.step, "seconds": s.seconds, "tgs": s.tgs, "loss": s.loss, "time": s.time}
                for s in self.steps
            ],
            "next_steps": self.next_steps,
        }


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None
