"""Status and failure classification (runbook steps 3–4, hang/heartbeat/cascade rules), pure.

Primary-failure rules, in order (rules CL-1 to CL-9 of docs/rules.md; decisions are marked *):
1. No log at all -> `prolog-kill-no-log`.
2. JOB SUMMARY FAILED with exit 1/143 but `completed step: T-1` -> status completed,
   primary `soft-success`, only when the ranks' exits match a variant: (a) one rank exits 1,
   (b)/(c) every rank exits 143 (c: at the time limit). Other exit patterns, exit 130, or a
   root-cause failure logged by several ranks (e.g. the final checkpoint) -> a failure.
3. Infrastructure / stage-timeout signatures (the job never trained) -> the earliest one.
   `ray-start-fail` is advisory only (Ray falls back to non-Ray mode).
3b. Slurm reports a node failure -> `node-fail`, before rules 5-9 (*rule NF-3, below).
4. Candidates are signature hits *not followed by training progress* (*: more than 2
   distinct steps completed after a hit in the same file means the job survived it — it is
   reported, never primary; this drops e.g. autotuner OOM probes and transient NCCL warns).
5. heartbeat-timeout runs the full checklist (rules HB-1 to HB-5): an earlier real error (root-cause
   or carrier class) -> that error is primary; training stalled before the error (gap
   between the last step and the heartbeat error beyond heartbeat timeout + stall budget,
   or, without timestamps, wall − summed step time beyond the 30-min setup budget) ->
   `hang`; otherwise `heartbeat-timeout` (a false positive, init-phase or mid-training).
6. train-timeout after a stall -> `hang` (the timeout was only the kill mechanism).
7. Root-cause classes: the earliest hit wins (cascades: OOM -> NCCL timeout -> heartbeat);
   ties by table order. nccl-timeout is a symptom: primary only without a root cause.
8. Carriers (traceback, signal, exit code, actor, NODE_EXIT, stage FAILED) by table order.
9. No signature: hanging -> `hang`; cancelled after a stall -> `hang`; cancelled ->
   `cancelled`; unknown-death -> `unknown-death`; a running job with a TGS slide ->
   `tgs-degradation`; completed -> none.
A cancelled job's NODE_EXIT/srun 143 cascade is the known-harmless scancel pattern, and
*every hit logged after the Slurm cancel line (dated after it in other files) is a
consequence of the cancel (ranks dying from SIGTERM print tracebacks, NCCL resets, actor
deaths): only *preceding* errors count (rule CAS-5).
Heartbeat item 2 also counts srun's `task N: Killed` (or a 134/137/139 exit) of an accused
task before the message, as node-fail evidence (runbook: "SIGKILL on the accused tasks").
*The wall-time stall basis allows the measured start-up (first dated line to the first
dated step) when it is longer than the 20-min setup budget: a slow restore is not a hang.
*A compiler fatal (xla-compile-fail) is followed by an abort (SIGABRT, "Aborted (core
dumped)", "Fatal Python error: Aborted"): those signal-kill lines are its consequence and are
dropped, not reported (issue 9: "the abort that follows is a consequence").
*No JOB SUMMARY and srun's `task N: Killed` (rule UD-2): the unknown-death checklist ("Killed")
reads those lines as evidence of an external kill, not a node failure of its own; they are
quoted as the unknown-death evidence (with a preemption cancel line, checklist item 3). With
an OOM report (cgroup / kernel / Ray) they are the OOM kill itself, quoted as oom-host
evidence. Otherwise, with a JOB SUMMARY, they are node-fail evidence (exit 137 = SIGKILL).
*Slurm's `CANCELLED AT ... DUE TO TIME LIMIT` (--time) is the scheduler cancelling the job: the
`cancelled` class with stage "Slurm time limit (--time)", never train-timeout, which is the job
script's own `== Training TIMEOUT` stage (rule CL-SLURM-TIME-LIMIT); after a stall it is a hang
(rule 9), after the final step soft-success (c).
*Slurm's own node-failure report (`Node failure on <host>`, `CANCELLED ... DUE TO NODE FAILURE`)
is primary node-fail before the heartbeat checklist, the stall and the cancel: the survivors
stalled waiting for the dead node until Slurm noticed, then the step was cancelled (rule NF-3).
Only a root cause logged before it outranks it.
*A JAX distributed-initialization deadline at start-up (registration deadline, connect barrier,
any coordination barrier / DEADLINE_EXCEEDED before training) is no heartbeat timeout: it names
tasks that never joined, node-fail evidence (rule CL-INIT). A traceback whose exception line is
such a carrier is that carrier's, not a python-exception of its own (rule PY-CARRIER); then the
job-level rows decide in table order, node-fail before stage-fail (rule NF-4).
*The primary's description follows the wording family of its earliest evidence
(`signatures.describe`): an NCCL error is described as an error, not a collective timeout.
*Every primary has its evidence in `evidence` (and so in the JSON failures list): the
cancel line (or the JOB SUMMARY Status line) for `cancelled`, srun's Killed / preemption
lines for `unknown-death`, XLA's rendezvous watchdog lines for `hang`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from jobdiagd.logs.job import JobLogs
from jobdiagd.logs.prefixes import Stamp, parse_full_stamp
from jobdiagd.logs.state import LogState
from jobdiagd.model.kinds import FailureClass, HeartbeatPhase, HeartbeatVerdict, JobStatus, StallBasis
from jobdiagd.model.records import Evidence, StepRecord, Summary
from jobdiagd.model.triage import (
    CheckpointConfig,
    Classification,
    HeartbeatInfo,
    Progress,
    Stall,
    StallKnowledge,
    TgsAnalysis,
)
from jobdiagd.rules.signatures import BY_CLASS, EVIDENCE_CLASSES, SIGNATURES, Tier
from jobdiagd.rules.slurm import ALIVE_STATES, CANCEL_EXITS
from jobdiagd.triage.stall import StallPolicy, stall_budget

# Runbook: "setup/compilation overhead of ~15-30 min"; unaccounted time beyond this (plus the
# stall budget) is read as a stall when no dated line measures it directly. 20 min is the
# middle of that range (rule PRJ-7).
SETUP_BUDGET_S = 1200.0
PROGRESS_SLACK = 2
# node-fail families that say which node failed and why (rules NF-3, CL-INIT): quoted first.
NODE_FAIL_CAUSE_RULES = frozenset({"NODE-slurm-node-failure", "NODE-jax-init", "NODE-jax-init-deadline"})
DEFAULT_HEARTBEAT_TIMEOUT_S = 100.0
_EXIT_RE = re.compile(r"exit(?:=| code |ed with exit code )(\d+)")
_ORDER = {s.cls: i for i, s in enumerate(SIGNATURES)}


def _steps_after(state: LogState, line: int) -> int:
    return sum(1 for s in state.steps.values() if s.line > line)


def _survived(ev: Evidence, states: dict[str, LogState], last_step_time: float | None) -> bool:
    st = states.get(ev.source)
    if st is not None and st.steps:
        return _steps_after(st, ev.line) > PROGRESS_SLACK
    if ev.time is not None and last_step_time is not None:
        return ev.time < last_step_time - 60
    return False


def _end_time(logs: JobLogs) -> float | None:
    m = logs.main
    if m is None:
        return None
    times = [s.last_stamp for s in logs.states if s.last_stamp is not None]
    return max(times) if times else None


def _gap(at: float | None, progress: Progress) -> float | None:
    if at is None or progress.last_step_time is None:
        return None
    return at - progress.last_step_time


def _stall(
    steps: list[StepRecord],
    progress: Progress,
    ckpt: CheckpointConfig,
    policy: StallPolicy,
    at: float | None,
    *,
    extra_s: float = 0.0,
    barrier_time: float | None = None,
    setup_s: float | None = None,
) -> Stall:
    """`setup_s`: the measured time before the first step (first dated line to the first dated
    step), which replaces the typical setup budget (rule PRJ-7) when it is longer: a slow
    compile or restore is not a stall."""
    budget = stall_budget(steps, progress.step_time_s, ckpt, policy)
    limit = budget.seconds + extra_s
    if progress.last_step_time_estimated:
        # *Dated only by training start + summed step seconds: allow for time the step seconds
        # do not cover (5% of it, at least 5 min) before calling a stall.
        limit += max(300.0, 0.05 * (progress.train_time_s or 0.0))
    gap = _gap(at, progress)
    if gap is None and not steps and barrier_time is not None and at is not None:
        gap = at - barrier_time
    # A dated line after the last step measures the stall directly. When the last dated line
    # *is* the last step (nothing stamped came after it), only the JOB SUMMARY wall time can tell.
    undated_end = gap is not None and gap <= 1.0 and progress.unaccounted_s is not None
    if gap is not None and not undated_end:
        return Stall(gap > limit, gap, limit, budget.phase, StallBasis.TIMESTAMPS)
    if progress.unaccounted_s is not None and steps:
        over = progress.unaccounted_s - max(SETUP_BUDGET_S, setup_s or 0.0)
        return Stall(over > limit, over, limit, budget.phase, StallBasis.WALL_TIME)
    return Stall(False, None, limit, budget.phase, StallBasis.NONE)


def _merged_config(logs: JobLogs) -> dict[str, str]:
    """The main log's config dump, completed by the other files' (rule HB-6)."""
    assert logs.main is not None
    config = {**logs.main.config}
    for st in logs.states:
        for k, v in st.config.items():
            config.setdefault(k, v)
    return config


def _heartbeat_timeout_s(passthrough: dict[str, str], config: dict[str, str]) -> float:
    for src in (config, passthrough):
        raw = src.get("jax_distributed_heartbeat_timeout_seconds")
        if raw:
            try:
                return float(raw.strip().strip("\"'"))
            except ValueError:
                continue
    return DEFAULT_HEARTBEAT_TIMEOUT_S


Hits = dict[str, list[Evidence]]


@dataclass(frozen=True, slots=True)
class _Job:
    """What several rules read about the job: its logs and the figures triage computed."""

    logs: JobLogs
    main: LogState
    steps: list[StepRecord]
    progress: Progress
    ckpt: CheckpointConfig
    tgs: TgsAnalysis
    policy: StallPolicy
    now: float
    slurm_state: str | None
    nodes: list[str]
    known: StallKnowledge | None = None  # the daemon's clock on a job it watches (rule VIEW-1)

    @property
    def slurm_word(self) -> str:
        """Slurm's state word (`RUNNING`, `PREEMPTED`, ...), or "" without an answer."""
        return (self.slurm_state or "").upper().split()[0] if self.slurm_state else ""

    @property
    def alive(self) -> bool:
        """Alive in Slurm; without a Slurm answer, watched live by the daemon (rule VIEW-1)."""
        if not self.slurm_word:
            return self.known is not None
        return self.slurm_word in ALIVE_STATES

    def stall_now(self, setup_s: float | None) -> Stall:
        """The stall of the job as it is now: on the daemon's clock when the daemon says what it
        knows of a live job (rule VIEW-1), else from the log (rules HANG-1, HANG-2, HANG-5)."""
        k = self.known
        if k is not None and self.alive:
            return Stall(k.stalled(self.now), k.gap(self.now), k.budget_s, k.phase, StallBasis.DAEMON)
        return self.stall_at(self.now, setup_s)

    def stall_at(self, at: float | None, setup_s: float | None) -> Stall:
        """The stall measured to `at` (rules HANG-1, HANG-2, HANG-5)."""
        return _stall(
            self.steps,
            self.progress,
            self.ckpt,
            self.policy,
            at,
            barrier_time=_barrier_time(self.main),
            setup_s=setup_s,
        )


@dataclass(frozen=True, slots=True)
class _Candidates:
    """Signature hits the job did not survive (rule CL-4), by tier."""

    roots: list[Evidence]
    symptoms: list[Evidence]
    carriers: list[Evidence]


def classify(
    logs: JobLogs,
    steps: list[StepRecord],
    progress: Progress,
    ckpt: CheckpointConfig,
    tgs: TgsAnalysis,
    *,
    now: float,
    slurm_state: str | None,
    nodes: list[str],
    policy: StallPolicy | None = None,
    known: StallKnowledge | None = None,
) -> Classification:
    """Status, primary failure, evidence and notes of one job: the rules of docs/rules.md
    §§ 2-8, in order (status, harmless drops and cascades, stall, candidates, primary, evidence).
    `known`: what the daemon knows of the job's progress, which times a live job's stall (rule VIEW-1)."""
    if logs.ref.problem == FailureClass.PROLOG_KILL_NO_LOG or logs.main is None:
        return _no_log(logs)
    main = logs.main
    job = _Job(
        logs, main, steps, progress, ckpt, tgs, policy or StallPolicy(), now, slurm_state, nodes, known
    )
    notes: list[str] = list(logs.errors)

    # Harmless lines and cascades (rules HL-3, CAS-5, CAS-6).
    hits, derived = _split_evidence_only(_gather_hits(logs.states))
    hits = _drop_clean_cancel_node_exits(hits)
    if _cancel_exit_or_line(main):
        hits = _drop_cancel_carriers(hits)
        if main.cancel is not None:
            hits, dropped = _drop_after_cancel(hits, main)
            notes += _after_cancel_note(dropped)
    hits = _drop_abort_after_compile_fail(hits)
    hits, derived = _main_log_first(hits, main), _main_log_first(derived, main)
    classes = sorted(hits, key=lambda c: _ORDER.get(c, 99))
    infra = _infra_hits(hits, classes)
    advisory = _tier_hits(hits, classes, Tier.ADVISORY)
    setup_s = _measured_setup_s(logs, steps)

    # Status (rules ST-1 to ST-8, SOFT-1) and what it makes of the hits (SOFT-2, UD-2, UD-3).
    status, soft = _status(job, hits, infra, setup_s)
    notes += _finished_without_summary_note(job, status)
    if soft == "c":
        derived = _time_limit_as_soft_success(main, derived)
    hits, derived, classes = _route_srun_killed(hits, derived, classes, status, main)
    derived = _status_evidence(derived, status, main)

    # Stall before the end (rules CAS-4, CAS-8, HANG-5).
    at = _stall_instant(job, status)
    live = status in (JobStatus.RUNNING, JobStatus.HANGING)
    stall = job.stall_now(setup_s) if live else job.stall_at(at, setup_s)
    if status is JobStatus.HANGING:
        stall = replace(stall, stalled=True)

    # Primary failure (rules CL-2 to CL-9) and its notes (CAS-7, UD-3).
    primary, hb_info = _primary(job, status, soft, hits, classes, infra, advisory, stall)
    notes += _hung_waiting_note(status, primary)
    notes += _node_failure_stall_note(primary, hits, stall)
    if status is JobStatus.UNKNOWN_DEATH:
        notes += _unknown_death_notes(job)

    # Evidence (rules CL-10, CL-11).
    evidence = _evidence_order(primary, hits, classes, derived)
    primary_rule = next((e.rule for e in evidence if e.cls == primary), None)
    return Classification(
        status=status,
        primary=primary,
        stage=_stage(primary, main, steps, primary_rule),
        evidence=evidence,
        classes=_reported_classes(primary, classes, tgs, status),
        notes=notes,
        heartbeat=hb_info,
        stall=stall,
        soft_success_variant=soft,
        end_time=at,
        primary_rule=primary_rule,
        cancel_reason=_cancel_reason(main) if status is JobStatus.CANCELLED else None,
    )


def _no_log(logs: JobLogs) -> Classification:
    """Rule CL-1: no log at all is `prolog-kill-no-log`, status failed."""
    why = [*logs.errors, *([logs.ref.note] if logs.ref.note else [])]
    return Classification(
        status=JobStatus.FAILED,
        primary=FailureClass.PROLOG_KILL_NO_LOG,
        stage="Slurm prolog",
        evidence=[],
        classes=[FailureClass.PROLOG_KILL_NO_LOG],
        notes=why,
    )


def _gather_hits(states: list[LogState]) -> Hits:
    """Every file's signature hits, by class (rule MATCH)."""
    hits: Hits = {}
    for st in states:
        for cls, h in st.hits.items():
            hits.setdefault(cls, []).extend(h.all())
    return hits


def _split_evidence_only(hits: Hits) -> tuple[Hits, Hits]:
    """Evidence-only rows (XLA's rendezvous watchdog) describe a derived class, never a class
    of their own (rule CL-10): (the hits, the derived classes' evidence)."""
    derived = {c: hits[c] for c in EVIDENCE_CLASSES if c in hits}
    return {c: evs for c, evs in hits.items() if c not in derived}, derived


def _keep(hits: Hits, cls: str, keep: Callable[[Evidence], bool]) -> Hits:
    """`hits` with only the lines of `cls` that `keep` accepts; the class goes when none is left."""
    if cls not in hits:
        return hits
    out = dict(hits)
    kept = [e for e in hits[cls] if keep(e)]
    if kept:
        out[cls] = kept
    else:
        del out[cls]
    return out


def _cancel_exit_or_line(main: LogState) -> bool:
    """Rule ST-3: a cancel exit in the JOB SUMMARY, or Slurm's cancel line without a summary."""
    summary = main.summary
    return (summary is not None and summary.exit_code in CANCEL_EXITS) or (
        summary is None and main.cancel is not None
    )


def _drop_clean_cancel_node_exits(hits: Hits) -> Hits:
    """Rule HL-3: NODE_EXIT / srun exit 143 (130) is the clean scancel pattern, never node-fail."""
    return _keep(hits, FailureClass.NODE_FAIL, lambda e: not _exit_is(e.text, CANCEL_EXITS))


def _drop_cancel_carriers(hits: Hits) -> Hits:
    """Rule CAS-5: a cancelled job's exit-143 / SIGTERM carrier lines are the cancel itself."""
    for cls in (FailureClass.STAGE_FAIL, FailureClass.SUBPROCESS_FAIL, FailureClass.SIGNAL_KILL):
        hits = _keep(
            hits, cls, lambda e: not _exit_is(e.text, CANCEL_EXITS | {15}) and "SIGTERM" not in e.text
        )
    return hits


def _after_cancel_note(dropped: int) -> list[str]:
    if not dropped:
        return []
    return [
        f"{dropped} error line(s) printed after the cancel (tasks dying from the SIGTERM) "
        "are consequences of the cancel, not its cause."
    ]


def _drop_abort_after_compile_fail(hits: Hits) -> Hits:
    """Rule CAS-6: the abort after a compiler fatal (LLVM / ptxas / CHECK abort) is its
    consequence, dropped."""
    if FailureClass.XLA_COMPILE_FAIL not in hits:
        return hits
    return _keep(hits, FailureClass.SIGNAL_KILL, lambda e: not _is_abort(e.text))


def _main_log_first(hits: Hits, main: LogState) -> Hits:
    """Each class's lines in the main log's line order, then the other files' (rule CAS-1)."""
    return {c: sorted(evs, key=lambda e: (e.source != main.source, e.line)) for c, evs in hits.items()}


def _tier_hits(hits: Hits, classes: list[str], tier: Tier) -> list[Evidence]:
    """The first line of each class of `tier`, in table order."""
    return [hits[c][0] for c in classes if BY_CLASS.get(c) is not None and BY_CLASS[c].tier is tier]


def _infra_hits(hits: Hits, classes: list[str]) -> list[Evidence]:
    """Rule CL-3: infrastructure and stage-timeout signatures, and a failed pre-training stage
    (Preflight, Docker pull, ECC check: the job never trained), which outranks the NODE_EXIT
    that carried it."""
    infra = _tier_hits(hits, classes, Tier.INFRA)
    return infra + [e for e in hits.get(FailureClass.STAGE_FAIL, []) if "== Training " not in e.text][:1]


def _status(
    job: _Job, hits: Hits, infra: list[Evidence], setup_s: float | None
) -> tuple[JobStatus, str | None]:
    """The job's status and its soft-success variant (rules ST-1 to ST-8, SOFT-1)."""
    summary = job.main.summary
    if summary is not None and summary.exit_code is not None:
        return _summary_status(job, summary, summary.exit_code, hits)
    if summary is not None and summary.status == "SUCCESS":
        return JobStatus.COMPLETED, None
    if _finished_without_summary(job):
        return JobStatus.COMPLETED, None
    return _status_without_summary(job, infra, setup_s), None


def _summary_status(job: _Job, summary: Summary, exit_code: int, hits: Hits) -> tuple[JobStatus, str | None]:
    """Rules ST-1, ST-2, ST-3, SOFT-1: the JOB SUMMARY's exit code decides."""
    if exit_code == 0 and summary.status != "FAILED":
        return JobStatus.COMPLETED, None
    if job.progress.reached_end and (variant := _soft_variant(job.main, exit_code, hits)) is not None:
        return JobStatus.COMPLETED, variant
    if exit_code in CANCEL_EXITS:
        return JobStatus.CANCELLED, None
    return JobStatus.FAILED, None


def _finished_without_summary(job: _Job) -> bool:
    """Rule ST-7: RAY=1 truncation can hide the summary; the authoritative step record says
    training finished, and the job is no longer alive."""
    summary = job.main.summary
    return (summary is None or (summary.exit_code is None and summary.status != "SUCCESS")) and (
        job.progress.reached_end and not job.alive
    )


def _finished_without_summary_note(job: _Job, status: JobStatus) -> list[str]:
    if status is JobStatus.COMPLETED and _finished_without_summary(job):
        return ["No JOB SUMMARY, but the authoritative step record reached the final step."]
    return []


def _status_without_summary(job: _Job, infra: list[Evidence], setup_s: float | None) -> JobStatus:
    """Rules ST-4, ST-5, ST-8: no JOB SUMMARY; Slurm's state and the step progress decide."""
    recent = job.stall_now(setup_s)
    advancing = recent.basis is StallBasis.TIMESTAMPS and not recent.stalled
    if infra and not job.steps and not job.alive:
        return JobStatus.FAILED  # an infrastructure failure before training; the summary may be missing
    if job.alive:
        return JobStatus.HANGING if recent.stalled else JobStatus.RUNNING
    if advancing and not job.slurm_state:
        return JobStatus.RUNNING
    return JobStatus.UNKNOWN_DEATH


def _time_limit_as_soft_success(main: LogState, derived: Hits) -> Hits:
    """Rule SOFT-2: soft-success (c) *is* the walltime cancel after the last step: Slurm's
    time-limit line is its evidence."""
    if main.cancel_evidence is None:
        return derived
    return {
        **derived,
        FailureClass.SOFT_SUCCESS: [replace(main.cancel_evidence, cls=FailureClass.SOFT_SUCCESS)],
    }


def _route_srun_killed(
    hits: Hits, derived: Hits, classes: list[str], status: JobStatus, main: LogState
) -> tuple[Hits, Hits, list[str]]:
    """Rule UD-2: srun's `task N: Killed` is the OOM kill itself when an OOM report exists
    (oom-host evidence), the unknown-death checklist's evidence of an external kill without a
    JOB SUMMARY, and node-fail evidence otherwise (left as it is)."""
    killed = [e for e in hits.get(FailureClass.NODE_FAIL, []) if e.rule == "NODE-srun-killed"]
    if not killed or not (status is JobStatus.UNKNOWN_DEATH or FailureClass.OOM_HOST in hits):
        return hits, derived, classes
    if FailureClass.OOM_HOST in hits:
        oom = [*hits[FailureClass.OOM_HOST], *(replace(e, cls=FailureClass.OOM_HOST) for e in killed)]
        hits = {**hits, FailureClass.OOM_HOST: sorted(oom, key=lambda e: (e.source != main.source, e.line))}
    else:
        ud = [
            *derived.get(FailureClass.UNKNOWN_DEATH, []),
            *(replace(e, cls=FailureClass.UNKNOWN_DEATH) for e in killed),
        ]
        derived = {**derived, FailureClass.UNKNOWN_DEATH: ud}
    hits = _keep(hits, FailureClass.NODE_FAIL, lambda e: e.rule != "NODE-srun-killed")
    return hits, derived, [c for c in classes if c in hits]


def _status_evidence(derived: Hits, status: JobStatus, main: LogState) -> Hits:
    """Rules UD-3, CL-10: the preemption cancel line quoted for an unknown death (checklist
    item 3); the cancel line (or the summary's Status) for a cancelled job."""
    if status is JobStatus.UNKNOWN_DEATH and main.cancel_evidence is not None:
        ud = [
            *derived.get(FailureClass.UNKNOWN_DEATH, []),
            replace(main.cancel_evidence, cls=FailureClass.UNKNOWN_DEATH),
        ]
        derived = {**derived, FailureClass.UNKNOWN_DEATH: ud}
    cancel_ev = _cancel_evidence(main) if status is JobStatus.CANCELLED else None
    if cancel_ev is not None:
        derived = {**derived, FailureClass.CANCELLED: [cancel_ev]}
    return derived


def _stall_instant(job: _Job, status: JobStatus) -> float | None:
    """Where the stall is measured to (rules CAS-8, PRJ-4): now for a live job, the cancel
    instant of a cancelled one, else the last dated line of the job's logs."""
    if status in (JobStatus.RUNNING, JobStatus.HANGING):
        return job.now
    if job.main.cancel is not None and (t := _cancel_instant(job.main)) is not None:
        return t
    return _end_time(job.logs)


def _primary(
    job: _Job,
    status: JobStatus,
    soft: str | None,
    hits: Hits,
    classes: list[str],
    infra: list[Evidence],
    advisory: list[Evidence],
    stall: Stall,
) -> tuple[FailureClass | None, HeartbeatInfo | None]:
    """The primary failure class and the heartbeat checklist's result (rules CL-2 to CL-9);
    the first rule that applies decides."""
    if soft is not None:
        return FailureClass.SOFT_SUCCESS, None  # rule CL-2
    if infra and not job.steps:
        return FailureClass(min(infra, key=_pos).cls), None  # rule CL-3
    cands = _candidates(job, hits, classes)
    hb_info = _heartbeat_info(job, hits, cands)
    primary = (
        _slurm_node_failure_primary(cands)
        or _heartbeat_verdict_primary(hb_info, cands)
        or _root_cause_primary(cands)
        or _heartbeat_false_positive_primary(hb_info)
        or _train_timeout_primary(hits, stall)
        or _symptom_primary(cands)
        or _stalled_primary(status, stall)
        or _carrier_primary(cands, status)
        or _job_state_primary(status)
        or _late_infra_primary(infra, status)
        or _tgs_primary(status, job.tgs)
    )
    if status is JobStatus.COMPLETED:
        primary = None  # rule CL-9: a completed job (no soft success) has no failure
    return primary or _advisory_primary(advisory) or _failed_stage_primary(status, job.main), hb_info


def _candidates(job: _Job, hits: Hits, classes: list[str]) -> _Candidates:
    """Rule CL-4: per class, the first hit the job did not train past, by tier.
    heartbeat-timeout and train-timeout are roots with rules of their own (CL-5, CL-7)."""
    states = {s.source: s for s in job.logs.states}
    last_step_time = job.progress.last_step_time

    def live_hits(tier: Tier) -> list[Evidence]:
        out = []
        for cls in classes:
            sig = BY_CLASS.get(cls)
            if sig is None or sig.tier is not tier:
                continue
            for e in hits[cls]:
                if _carried_by_other_carrier(e, hits):
                    continue
                if not _survived(e, states, last_step_time):
                    out.append(e)
                    break
        return out

    roots = [
        e
        for e in live_hits(Tier.ROOT)
        if e.cls not in (FailureClass.HEARTBEAT_TIMEOUT, FailureClass.TRAIN_TIMEOUT)
    ]
    carriers = live_hits(Tier.CARRIER)
    # Rule NF-3 looks for Slurm's node-failure line among node-fail's hits, not only the first.
    nf = next(
        (e for e in hits.get(FailureClass.NODE_FAIL, []) if e.rule == "NODE-slurm-node-failure"),
        None,
    )
    if nf is not None and nf not in carriers and not _survived(nf, states, last_step_time):
        carriers.append(nf)
    return _Candidates(roots, live_hits(Tier.SYMPTOM), carriers)


def _carried_by_other_carrier(e: Evidence, hits: Hits) -> bool:
    """Rule PY-CARRIER: a traceback whose exception line is another carrier's signature (a JAX
    start-up deadline raised as XlaRuntimeError, node-fail) is that signature's carrier, not a
    python-exception candidate of its own."""
    if e.cls != FailureClass.PYTHON_EXCEPTION or not e.carries or e.carries not in hits:
        return False
    sig = BY_CLASS.get(e.carries)
    return sig is not None and sig.tier is Tier.CARRIER


def _heartbeat_info(job: _Job, hits: Hits, cands: _Candidates) -> HeartbeatInfo | None:
    """Rule CL-5: a heartbeat-timeout runs the full checklist (rules HB-1 to HB-6)."""
    hb = _merged_heartbeat(job.logs) if FailureClass.HEARTBEAT_TIMEOUT in hits else None
    if hb is None:
        return None
    return _heartbeat_checklist(hb, cands.roots + cands.symptoms + cands.carriers, job)


def _slurm_node_failure_primary(cands: _Candidates) -> FailureClass | None:
    """Rule NF-3: Slurm's own report that a node of the job failed (`Node failure on <host>`,
    `CANCELLED ... DUE TO NODE FAILURE`) is the cause of what followed it — the survivors' stall in
    the next collective until Slurm noticed (SlurmdTimeout), the heartbeat timeout that accused the
    dead task, the step's cancel. It is primary over a stall, a cancel and later symptoms; only a
    root cause logged before it (e.g. an OOM report on that node) outranks it."""
    nf = next((e for e in cands.carriers if e.rule == "NODE-slurm-node-failure"), None)
    if nf is None:
        return None
    earlier = [e for e in cands.roots if _before(e, nf)]
    return _pick(earlier, [], []) if earlier else FailureClass.NODE_FAIL


def _before(a: Evidence, b: Evidence) -> bool:
    """`a` was logged before `b`: by timestamp when both have one, else by line in one file."""
    if a.time is not None and b.time is not None:
        return a.time < b.time
    return a.source == b.source and a.line < b.line


def _heartbeat_verdict_primary(hb_info: HeartbeatInfo | None, cands: _Candidates) -> FailureClass | None:
    """Rules HB-2, HB-4: a true positive makes the earlier error primary; a stall before the
    heartbeat error makes it a hang (rule CAS-2)."""
    if hb_info is None:
        return None
    if hb_info.verdict is HeartbeatVerdict.TRUE_POSITIVE and hb_info.earlier_error is not None:
        return _pick(cands.roots, cands.symptoms, cands.carriers) or FailureClass(hb_info.earlier_error.cls)
    if hb_info.verdict is HeartbeatVerdict.HANG:
        return FailureClass.HANG
    return None


def _root_cause_primary(cands: _Candidates) -> FailureClass | None:
    """Rule CL-6: the earliest root-cause hit (rule CAS-1)."""
    return _pick(cands.roots, [], []) if cands.roots else None


def _heartbeat_false_positive_primary(hb_info: HeartbeatInfo | None) -> FailureClass | None:
    """Rule HB-5: a heartbeat timeout with no earlier error and no stall."""
    return FailureClass.HEARTBEAT_TIMEOUT if hb_info is not None else None


def _train_timeout_primary(hits: Hits, stall: Stall) -> FailureClass | None:
    """Rules CL-7, CAS-3: a train-timeout after a stall is a hang the timeout killed."""
    if FailureClass.TRAIN_TIMEOUT not in hits:
        return None
    return FailureClass.HANG if stall.stalled else FailureClass.TRAIN_TIMEOUT


def _symptom_primary(cands: _Candidates) -> FailureClass | None:
    """Rule CL-6: nccl-timeout and the other symptoms, only without a root cause."""
    return _pick([], cands.symptoms, []) if cands.symptoms else None


def _stalled_primary(status: JobStatus, stall: Stall) -> FailureClass | None:
    """Rules CL-9, CAS-4: a hanging job, or a cancelled one that had stalled, is a hang."""
    stalled = status is JobStatus.HANGING or (status is JobStatus.CANCELLED and stall.stalled)
    return FailureClass.HANG if stalled else None


def _carrier_primary(cands: _Candidates, status: JobStatus) -> FailureClass | None:
    """Rule CL-8: carriers, by table order, never on a completed job. Rule NF-4: of the job-level
    rows, node-fail comes before stage-fail whatever their line order (the Training stage's FAILED
    marker only says the stage failed; the NODE_EXIT lines say which nodes)."""
    if not cands.carriers or status is JobStatus.COMPLETED:
        return None
    carriers = cands.carriers
    if any(e.cls == FailureClass.NODE_FAIL for e in carriers):
        carriers = [e for e in carriers if e.cls != FailureClass.STAGE_FAIL]
    return _pick([], [], carriers)


def _job_state_primary(status: JobStatus) -> FailureClass | None:
    """Rule CL-9: no signature: a cancelled job is `cancelled`, a dead one `unknown-death`."""
    if status in (JobStatus.CANCELLED, JobStatus.UNKNOWN_DEATH):
        return FailureClass(status)
    return None


def _late_infra_primary(infra: list[Evidence], status: JobStatus) -> FailureClass | None:
    """Rule CL-3: a failed job's earliest infrastructure hit, when nothing else was found."""
    return FailureClass(min(infra, key=_pos).cls) if infra and status is JobStatus.FAILED else None


def _tgs_primary(status: JobStatus, tgs: TgsAnalysis) -> FailureClass | None:
    """Rule CL-9: a running job whose throughput slid (rule TGS)."""
    return FailureClass.TGS_DEGRADATION if status is JobStatus.RUNNING and tgs.degraded else None


def _advisory_primary(advisory: list[Evidence]) -> FailureClass | None:
    """Rule CL-3: an advisory hit (e.g. ray-start-fail) when it is the only thing that went wrong."""
    return FailureClass(advisory[0].cls) if advisory else None


def _failed_stage_primary(status: JobStatus, main: LogState) -> FailureClass | None:
    """Rule CL-9 (decision): a failed job with no signature but a FAILED stage line."""
    if status is JobStatus.FAILED and any(s.kind == "FAILED" for s in main.stages):
        return FailureClass.STAGE_FAIL
    return None


def _hung_waiting_note(status: JobStatus, primary: FailureClass | None) -> list[str]:
    """Rule CAS-7: the remaining tasks of a hanging job wait for the failed one."""
    if (
        status is JobStatus.HANGING
        and primary not in (None, FailureClass.HANG)
        and BY_CLASS.get(primary or "") is not None
    ):
        return ["Training stopped after the error above; the remaining tasks are hung waiting for it."]
    return []


def _node_failure_stall_note(primary: FailureClass | None, hits: Hits, stall: Stall) -> list[str]:
    """Rule NF-3: a stall before Slurm's node-failure report is the survivors waiting for the dead node."""
    if primary is not FailureClass.NODE_FAIL or not stall.stalled or stall.gap_s is None:
        return []
    if not any(e.rule == "NODE-slurm-node-failure" for e in hits.get(FailureClass.NODE_FAIL, [])):
        return []
    return [
        f"Training had stopped advancing {stall.gap_s:.0f}s before the job ended: the remaining tasks were "
        "waiting for the failed node in a collective until Slurm noticed it — a consequence of the node "
        "failure, not a hang of its own."
    ]


def _unknown_death_notes(job: _Job) -> list[str]:
    """Rule UD-3: a log ending mid-line, and Slurm's word for the end."""
    notes = []
    if not job.main.ends_with_newline:
        notes.append(
            "The log ends mid-line: the process was killed abruptly (SIGKILL / OOM-kill) without cleanup."
        )
    word = job.slurm_word
    if word in ("PREEMPTED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"):
        notes.append(f"Slurm reports the job {word}.")
    return notes


def _reported_classes(
    primary: FailureClass | None, classes: list[str], tgs: TgsAnalysis, status: JobStatus
) -> list[FailureClass]:
    """Every class found: a derived primary first, then the hits', TGS degradation and cancel."""
    out = [FailureClass(c) for c in classes]
    if primary and primary not in out:
        out.insert(0, primary)
    if tgs.degraded and FailureClass.TGS_DEGRADATION not in out:
        out.append(FailureClass.TGS_DEGRADATION)
    if status is JobStatus.CANCELLED and FailureClass.CANCELLED not in out:
        out.append(FailureClass.CANCELLED)
    return out


def _is_abort(text: str) -> bool:
    return "SIGABRT" in text or "Aborted" in text or "signal 6)" in text


def _cancel_reason(main: LogState) -> str | None:
    """`TIME LIMIT`, `PREEMPTION`, `JOB REQUEUE`, `NODE FAILURE, ...` from Slurm's cancel line."""
    if main.cancel is None:
        return None
    m = re.search(r"DUE TO (.+?)(?: on \S+)?\s*$", main.cancel.reason, re.IGNORECASE)
    return m.group(1).strip().upper() if m else None


def _cancel_evidence(main: LogState) -> Evidence | None:
    """The line that says the job was cancelled: Slurm's cancel line, else the summary's Status."""
    if main.cancel_evidence is not None:
        return replace(main.cancel_evidence)
    summ = main.summary
    if summ is None or summ.status_text is None:
        return None
    text = f"Status: {summ.status_text}"
    return Evidence(
        FailureClass.CANCELLED, summ.status_line or summ.line, 0, main.source, None, None, text, None, text
    )


def _measured_setup_s(logs: JobLogs, steps: list[StepRecord]) -> float | None:
    """Seconds from the earliest dated line of the job to its first dated step, if both exist."""
    first_step = steps[0].time if steps else None
    starts = [s.first_stamp for s in logs.states if s.first_stamp is not None]
    if first_step is None or not starts or min(starts) >= first_step:
        return None
    return first_step - min(starts)


def _barrier_time(main: LogState) -> float | None:
    for mark in (main.barrier_passed, main.barrier_sync):
        if mark is not None and mark.time is not None:
            return mark.time
    return None


def _exit_is(text: str, codes: frozenset[int] | set[int]) -> bool:
    m = _EXIT_RE.search(text)
    return m is not None and int(m.group(1)) in codes


def _pos(e: Evidence) -> tuple[float, int, int]:
    return (e.time if e.time is not None else float("inf"), _ORDER.get(e.cls, 99), e.line)


def _pick(roots: list[Evidence], symptoms: list[Evidence], carriers: list[Evidence]) -> FailureClass | None:
    for group in (roots, symptoms, carriers):
        if group:
            # Earliest wins: by timestamp when every hit has one, else by line within the main log.
            if all(e.time is not None for e in group):
                return FailureClass(min(group, key=lambda e: (e.time or 0.0, _ORDER.get(e.cls, 99))).cls)
            same = {e.source for e in group}
            if len(same) == 1:
                return FailureClass(min(group, key=lambda e: (e.line, _ORDER.get(e.cls, 99))).cls)
            return FailureClass(min(group, key=lambda e: _ORDER.get(e.cls, 99)).cls)
    return None


def _merged_heartbeat(logs: JobLogs) -> LogState | None:
    best: LogState | None = None
    for st in logs.states:
        if st.heartbeat is not None and (best is None or best.heartbeat is None or st is logs.main):
            best = st
    return best


def _heartbeat_checklist(hb_state: LogState, errors: list[Evidence], job: _Job) -> HeartbeatInfo:
    """Rules HB-1 to HB-6: who was accused, an earlier error (a true positive), a stall before
    the message (a hang), else a false positive of the init or mid-training kind."""
    main, steps, nodes = job.main, job.steps, job.nodes
    hb = hb_state.heartbeat
    assert hb is not None
    accused = set(hb.accused_tasks)
    for st in [main]:
        if st.heartbeat is not None:
            accused |= st.heartbeat.accused_tasks
    timeout = _heartbeat_timeout_s(main.passthrough(), _merged_config(job.logs))
    first = hb.first
    # Item 2: a real error before the heartbeat message (on the accused tasks, or anywhere
    # in the job when the accused tasks printed nothing) makes it a true positive.
    earlier: Evidence | None = None
    for e in sorted(errors, key=lambda e: e.line):
        before = (
            (e.time is not None and first.time is not None and e.time < first.time - 1)
            or (e.source == first.source and e.line < first.line)
            # *An undated error in an accused rank's own file (k8s rank-N.log) that it never
            # trained past is what silenced it: it comes before the others noticed.
            or (e.source != first.source and e.task in accused and (e.time is None or first.time is None))
        )
        if (
            not before
            or e.cls in (FailureClass.HEARTBEAT_TIMEOUT,)
            or e.carries == FailureClass.HEARTBEAT_TIMEOUT
        ):
            continue
        if e.task is None or e.task in accused or not accused:
            earlier = e
            break
        if earlier is None:
            earlier = e
    if earlier is None:
        earlier = _killed_before(main, first, accused, nodes)
    # Item 3: stall before the error.
    stall = _stall(steps, job.progress, job.ckpt, job.policy, first.time, extra_s=timeout)
    phase = HeartbeatPhase.MID_TRAINING if steps else HeartbeatPhase.INIT
    verdict = HeartbeatVerdict.FALSE_POSITIVE
    if earlier is not None:
        verdict = HeartbeatVerdict.TRUE_POSITIVE
    elif stall.stalled and steps:
        verdict = HeartbeatVerdict.HANG
    hosts = [nodes[t] for t in sorted(accused) if 0 <= t < len(nodes)]
    return HeartbeatInfo(
        time=first.time,
        timeout_s=timeout,
        accused_tasks=sorted(accused),
        accused_hosts=hosts,
        self_reported=sorted(hb.self_reported & accused) if accused else sorted(hb.self_reported),
        earlier_error=earlier,
        stalled=stall.stalled,
        stall_s=stall.gap_s,
        phase=phase,
        verdict=verdict,
    )


def _rank_exits(main: LogState) -> dict[str, int]:
    """Non-zero exit code per rank (host or task) from NODE_EXIT and srun's per-task errors."""
    out: dict[str, int] = {}
    for n in main.node_exits:
        out[n.host] = n.exit_code
    for err in main.srun_errors:
        if err.exit_code is not None and err.host not in out and "task" in err.text:
            out[err.host] = err.exit_code
    return out


_SRUN_TASKS = re.compile(r": tasks? (\d+)(?:-(\d+))?: ")


def _killed_before(main: LogState, first: Evidence, accused: set[int], nodes: list[str]) -> Evidence | None:
    """srun's report of an accused task killed by a signal before the heartbeat message
    (runbook: "SIGKILL on the accused tasks before the heartbeat message" is a real crash).
    Returned as node-fail evidence (rule HB-3): the class for a node whose task died (exit 137:
    likely OOM; 134/139: core dump)."""
    if first.source != main.source:
        return None
    hosts = {nodes[t] for t in accused if 0 <= t < len(nodes)}
    for err in main.srun_errors:
        if err.line >= first.line:
            break
        if not ("Killed" in err.text or "signal" in err.text.lower() or err.exit_code in (9, 134, 137, 139)):
            continue
        m = _SRUN_TASKS.search(": " + err.text)
        tasks = set(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1)) if m else set()
        if (tasks & accused) or err.host in hosts or not accused:
            task = min(tasks & accused) if tasks & accused else None
            text = f"srun: error: {err.host}: {err.text}"
            return Evidence(FailureClass.NODE_FAIL, err.line, 0, main.source, task, err.host, text, None)
    return None


def _soft_variant(main: LogState, exit_code: int, hits: dict[str, list[Evidence]]) -> str | None:
    """The soft-success variant that matches (rules SOFT-1, SOFT-2), or None (then it is a failure).

    (a) a single rank exits 1, the others 0; (b) every rank exits 143
    (a late post-training failure on one rank cascading); (c) every rank exits 143 at the
    walltime. Exit 130 is a plain cancel. *Decision: a root-cause failure (checkpoint
    error, OOM, ...) logged by more than one rank after training means real work was lost
    (e.g. the final checkpoint), whatever the exit codes; no soft-success then."""
    if exit_code not in (1, 143):
        return None
    # The summary's code is the stage's (a failed stage always reports exit 1); the ranks'
    # own exit codes tell the variants apart.
    codes = list(_rank_exits(main).values())
    if codes:
        if len(codes) == 1 and codes[0] == 1:
            cascade = False
        elif all(c == 143 for c in codes):
            cascade = True
        else:
            return None
    else:
        cascade = exit_code == 143
    for cls, evs in hits.items():
        sig = BY_CLASS.get(cls)
        if (
            sig is None
            or sig.tier is not Tier.ROOT
            or cls in (FailureClass.HEARTBEAT_TIMEOUT, FailureClass.TRAIN_TIMEOUT)
        ):
            continue
        if len({e.task if e.task is not None else e.source for e in evs}) > 1:
            return None
    if cascade:
        reason = " ".join(
            filter(
                None, [main.cancel.reason if main.cancel else "", main.summary.reason if main.summary else ""]
            )
        )
        if "TIME LIMIT" in reason.upper() or "TIMEOUT" in reason.upper():
            return "c"
        return "b"
    return "a"


def _drop_after_cancel(hits: Hits, main: LogState) -> tuple[Hits, int]:
    """Rule CAS-5: without the hits logged after the Slurm cancel line (or dated after it in
    other files) -- ranks dying from the SIGTERM print tracebacks, NCCL resets and actor
    deaths -- and how many were dropped."""
    assert main.cancel is not None
    line = main.cancel.line
    at = _cancel_time(main.cancel.at, main)

    def before_cancel(e: Evidence) -> bool:
        if e.source == main.source:
            return e.line <= line
        return at is None or e.time is None or e.time < at - 1

    kept = hits
    for cls in hits:
        kept = _keep(kept, cls, before_cancel)
    return kept, sum(map(len, hits.values())) - sum(map(len, kept.values()))


def _cancel_time(at: str, main: LogState) -> float | None:
    """The slurmstepd CANCELLED AT time, on the same calendar as the log's absl stamps (which
    have no year; comparing them with a dated line must not jump a year)."""
    stamp = parse_full_stamp(at[:19])
    if stamp is None:
        return None
    return main.clock.epoch(Stamp(stamp.month, stamp.day, stamp.seconds))


def _cancel_instant(main: LogState) -> float | None:
    """When the cancel happened, for the stall at cancel time (rule CAS-8). Slurm's stamp has
    whole seconds, so the cancel lies in [stamp, stamp + 1 s); the first dated line after the
    cancel line (the cascade: "Received SIGTERM", NCCL aborts) bounds it above. Truncating to
    the stamp would shorten the stall by up to a second and could call a cancel that came after
    a paged hang a plain cancel."""
    assert main.cancel is not None
    at = _cancel_time(main.cancel.at, main)
    after = main.after_cancel_stamp
    if at is not None and after is not None and at <= after < at + 1.0:
        return after
    return at


def _evidence_order(
    primary: str | None,
    hits: dict[str, list[Evidence]],
    classes: list[str],
    derived: dict[str, list[Evidence]],
) -> list[Evidence]:
    """The primary's evidence first (up to 6 distinct lines), then up to 3 per other class and
    the cancel line of a cancelled job. Lines every task printed alike are quoted once."""
    out: list[Evidence] = []

    def take(evs: list[Evidence], n: int) -> None:
        seen = {(e.cls, e.text) for e in out}
        for e in evs:
            if n <= 0:
                return
            if (e.cls, e.text) not in seen:
                seen.add((e.cls, e.text))
                out.append(e)
                n -= 1

    if primary is not None:
        own = derived.get(primary, []) if primary in derived else hits.get(primary, [])
        if primary == FailureClass.NODE_FAIL:
            # Rules NF-3, CL-INIT: the line that says which node failed (Slurm's, the JAX
            # coordinator's) first; the NODE_EXIT carriers after it.
            own = sorted(own, key=lambda e: e.rule not in NODE_FAIL_CAUSE_RULES)
        take(own, 6)
    for cls in classes:
        if cls != primary:
            take(hits[cls], 3)
    if primary != FailureClass.CANCELLED and FailureClass.CANCELLED in derived:
        # Not twice: Slurm's cancel line may already be the primary's evidence (rule NF-3).
        quoted = {(e.source, e.line) for e in out}
        take([e for e in derived[FailureClass.CANCELLED] if (e.source, e.line) not in quoted], 1)
    return out


def _stage(
    primary: str | None, main: LogState, steps: list[StepRecord], rule: str | None = None
) -> str | None:
    if primary is None or primary == FailureClass.SOFT_SUCCESS:
        return None
    if primary == FailureClass.NODE_FAIL and rule in ("NODE-jax-init", "NODE-jax-init-deadline"):
        return "Job start (JAX distributed initialization)"  # rule CL-INIT
    sig = BY_CLASS.get(primary)
    if primary == FailureClass.STAGE_FAIL:
        failed = [s for s in main.stages if s.kind == "FAILED"]
        return failed[-1].stage if failed else None
    if sig is not None and sig.stage:
        if sig.stage == "Training" and not steps:
            return "Training (before the first step: startup/compilation)"
        return sig.stage
    if primary == FailureClass.HANG:
        if not steps:
            return (
                "Training (init: first collective after the barrier)"
                if main.barrier_passed or main.barrier_sync
                else "Training (startup)"
            )
        return "Training"
    if (
        primary == FailureClass.CANCELLED
        and main.cancel is not None
        and "TIME LIMIT" in main.cancel.reason.upper()
    ):
        return "Slurm time limit (--time)"  # rule CL-SLURM-TIME-LIMIT
    if primary in (FailureClass.UNKNOWN_DEATH, FailureClass.CANCELLED, FailureClass.TGS_DEGRADATION):
        return "Training" if steps else None
    # A carrier without a stage of its own (node-fail, ...): the stage the job script says failed.
    failed = [s for s in main.stages if s.kind in ("FAILED", "TIMEOUT")]
    if failed:
        return failed[-1].stage
    return "Training" if steps else None
