"""Hang detector: the step projection on the daemon clock (rules PRJ-4, HANG-6), triage's phase-aware budget.

Stalled when `now - (when the last step line was read) > stall_budget(...)` — the same
`triage.stall.stall_budget` triage uses (startup/barrier, warmup after start or restore,
checkpoint steps -- a save at least `checkpoint_budget_seconds`, more when this job's own
saves took longer, an eval learned from this job's evals (rule HANG-4) -- steady
state = max(stall_factor x steady step time, min_stall)). Before the first step the gap
runs from when the pre-training barrier was read, else from when the daemon started
watching the job. Log timestamps and mtime are never used.

While stalled the finding is re-emitted every tick (the incident book reminds); once a
newer step is read it is resolved ("steps resumed at step N"). A stall that triage
explains by a failure signature (the cascade's root cause) is left to the
failure-signature incident — a hang incident opened before the error was logged is
resolved as superseded — so one cascade is one open incident. A GPU-confirmed stall (the
early page below) is never superseded (rule HANG-7): the GPUs show the job stuck now, its
allocation spinning, so an open failure incident of the same job (one task's process
exited, the others wait in the collective) never holds that page back; the two incidents
say different things (what failed, and that the job must be cancelled).

The finding's triage is the job view's analysis given what this detector knows
(`knowledge`: since when no step was read, the budget applied, a GPU-confirmed early page;
rule VIEW-1): triage itself concludes `hanging`, with this budget, and its next steps follow.
The same knowledge reaches every other reader of the job (the view's `stall_source`, the
chat's Full triage), so none of them can contradict the page.

Early page (`[tsdb] early_page`; live jobs with a GPU source: a RAY=1 job's own Prometheus, or the
site Prometheus of `[site_prometheus]` for every job Slurm placed): once the expected step is overdue by
`early_overdue_factor` x steady step time + `early_overdue_slack_s` (`HangDetector.early_due_at`;
armed only in the steady and checkpoint phases, i.e. once this run's steady step time is known,
and only when that comes before the step budget), the service asks the job's Prometheus (else
the site's) and leaves an `EarlyMemo` with the `tsdb.gpu_hang` verdict for the current last step
on the view (`gpu_check`). A confirmed verdict
makes the stall a page now, as a GPU-confirmed hang naming the mechanism and the suspect
host(s); it stays confirmed for that step (no flapping back to "resumed" while no step came)
until a newer step is read. Without a confirmed verdict nothing changes: the step budget pages.
"""

from __future__ import annotations

import dataclasses

from jobdiagd.config import Config
from jobdiagd.detectors.base import (
    DetectorSpec,
    NoData,
    Outcome,
    RefreshRation,
    StatusPart,
    WatchedJob,
    early_memo,
    resolved_finding,
    staggered,
)
from jobdiagd.durations import exact_duration
from jobdiagd.model.alerts import Finding
from jobdiagd.model.kinds import FailureClass, IncidentKind, StallPhase
from jobdiagd.model.triage import StallKnowledge, TriageResult
from jobdiagd.rules.signatures import BY_CLASS, Tier
from jobdiagd.triage.progress import steady_step_time
from jobdiagd.triage.report import what_happened
from jobdiagd.triage.stall import Budget, StallPolicy, stall_budget
from jobdiagd.tsdb.gpu_hang import GpuVerdict

NAME = "hang"
KIND = IncidentKind.HANG
REFRESH_S = 120.0
MAX_REFRESHES = 10
# First budgets computed per tick for jobs that cannot be stalled yet (below). After a start
# with many jobs the first full tick would compute every job's budget at once (a walk over each
# job's kept steps: ~0.2 ms a job, a 200+ ms tick at 1000 jobs); this spreads them.
MAX_FIRST_BUDGETS = 50


@dataclasses.dataclass(frozen=True, slots=True)
class BudgetMemo:
    """The last `stall_budget` answer for a job (the detector keeps one per job; status reads it)."""

    last_step: int | None
    step_version: int
    adjacency: tuple[bool, bool] | None
    budget: Budget
    step_time: float | None
    at: float


_CASCADE_TIERS = (Tier.ROOT, Tier.SYMPTOM, Tier.CARRIER, Tier.INFRA)

EARLY_PHASES = (StallPhase.STEADY, StallPhase.CHECKPOINT)
# The detail line of a GPU-confirmed page, for people; code reads `Finding.gpu_confirmed`.
EARLY_DETAIL = "GPU-confirmed"


@dataclasses.dataclass(frozen=True, slots=True)
class EarlyRule:
    """When a step is overdue enough to ask the GPUs: `factor` x steady step time + `slack_s`."""

    factor: float = 1.5
    slack_s: float = 20.0


def policy_from_config(cfg: Config) -> StallPolicy:
    """The daemon's stall policy, from `[detectors.hang]` (rule VIEW-2): the one mapping of the
    config to a policy. The engine builds it once per config and hands it to the job views (their
    analyses, the job-end triage) and the chat's triage; this detector is built from the same."""
    h = cfg.detectors.hang
    return StallPolicy(
        stall_factor=h.stall_factor,
        min_stall_s=h.min_stall_seconds,
        startup_s=h.startup_grace_seconds,
        checkpoint_s=h.checkpoint_budget_seconds,
    )


def early_rule_from_config(cfg: Config) -> EarlyRule | None:
    t = cfg.tsdb
    return EarlyRule(t.early_overdue_factor, t.early_overdue_slack_s) if t.early_page else None


class HangDetector:
    name = NAME
    on_data = False
    on_gpu_check = True

    def __init__(
        self,
        policy: StallPolicy,
        early: EarlyRule | None = None,
        first_budgets: int = MAX_FIRST_BUDGETS,
        *,
        site: bool = False,
    ) -> None:
        self.policy = policy
        self.early = early
        # A site Prometheus ([site_prometheus]) is a GPU source for every job Slurm placed.
        self.site = site
        # A steady-state refresh is optional work: at most `MAX_REFRESHES` per tick.
        self._ration = RefreshRation(MAX_REFRESHES)
        self._first_ration = RefreshRation(first_budgets)
        self._budgets: dict[str, BudgetMemo] = {}  # job -> the budget applied to its current step
        self._paged: dict[str, tuple[int | None, float | None]] = {}  # job -> step an early page was for

    def forget(self, key: str) -> None:
        self._budgets.pop(key, None)
        self._paged.pop(key, None)

    def budget_state(self, key: str) -> BudgetMemo | None:
        """The budget last applied to the job (None before its first check)."""
        return self._budgets.get(key)

    def status(self, view: WatchedJob, now: float) -> StatusPart | None:
        return _status(view, self._budgets.get(view.key), now)

    def knowledge(self, view: WatchedJob, now: float) -> StallKnowledge | None:
        """What this detector knows of the job's progress on the daemon's clock, for triage (rule
        VIEW-1): since when no step was read, the budget applied to that wait, and whether a
        GPU-confirmed early page holds it hung. None for a job it does not judge (ended, not
        running in Slurm, unreadable, past its final step)."""
        if _not_judged(view) is not None:
            return None
        since, _ = _stall_start(view)
        budget, _ = self.budget(view, now)
        # As `check` pages it: a confirmed verdict of this step, paged (`_gpu_evidence`).
        memo = early_memo(view)
        paged = self._paged.get(view.key) == (view.last_step, view.last_step_at)
        confirmed = paged and memo is not None and memo.verdict.confirmed
        return StallKnowledge(since, budget.seconds, budget.phase, gpu_confirmed=confirmed)

    def early_window(self, view: WatchedJob, rule: EarlyRule) -> tuple[float, float] | None:
        """(when the early check of the current last step is due, when the step budget pages), or
        None when not armed.

        Armed once this job's steady step time is known and the budget phase is steady or
        checkpoint (startup and warmup -- compilation, restore -- never), and only when the early
        point comes before the step budget's. After the step budget there is nothing to ask early.
        """
        memo = self._budgets.get(view.key)
        last, at = view.last_step, view.last_step_at
        # The memo is the budget the detector applies to the current step (it keeps one across
        # steady steps that cannot change it), whatever step it was computed at.
        if memo is None or last is None or at is None:
            return None
        st = memo.step_time
        if not st or memo.budget.phase not in EARLY_PHASES:
            return None
        due = at + st + rule.factor * st + rule.slack_s
        budget_at = at + memo.budget.seconds
        return (due, budget_at) if due < budget_at else None

    def early_due_at(self, view: WatchedJob, rule: EarlyRule) -> float | None:
        """When the early check of the current last step is due (None: not armed; see `early_window`)."""
        w = self.early_window(view, rule)
        return w[0] if w is not None else None

    def early_confirmed(self, view: WatchedJob, rule: EarlyRule, now: float) -> GpuVerdict | None:
        """The confirmed GPU verdict of the current last step, once its early point is reached."""
        memo = early_memo(view)
        if memo is None or not memo.verdict.confirmed:
            return None
        due = self.early_due_at(view, rule)
        return memo.verdict if due is not None and now >= due else None

    def budget(self, view: WatchedJob, now: float) -> tuple[Budget, float | None]:
        """(budget, steady step time) from `stall_budget`, cached between steps that cannot change it.

        Recomputed when the checkpoint adjacency of the last/next step changes (a save is due or
        just happened), during startup/warmup, and otherwise at most every `REFRESH_S` (the steady
        step time drifts slowly); a full recompute walks every kept step record.
        """
        memo = self._budgets.get(view.key)
        last = view.last_step
        ckpt = view.checkpoint()
        adj = (ckpt.adjacent(last), ckpt.adjacent(last + 1)) if last is not None else None
        if memo is not None and memo.last_step == last and memo.step_version == view.version_steps():
            return memo.budget, memo.step_time
        if (
            memo is not None
            and last is not None
            and memo.adjacency == adj
            and memo.budget.phase == StallPhase.STEADY
            and (now - memo.at < REFRESH_S or not self._ration.spend(now))
        ):
            return memo.budget, memo.step_time
        steps = view.sorted_steps() if last is not None else []
        step_time = steady_step_time(steps, ckpt) if steps else None
        b = stall_budget(steps, step_time, ckpt, self.policy)
        # Stagger the refreshes of many jobs over REFRESH_S instead of all in one tick.
        at = now if memo is not None else staggered(now, view.key, REFRESH_S)
        self._budgets[view.key] = BudgetMemo(last, view.version_steps(), adj, b, step_time, at)
        return b, step_time

    def check(self, view: WatchedJob, now: float) -> Outcome:
        idle = _not_judged(view)
        if idle is not None:
            return NoData(idle)
        last = view.last_step
        since, what = _stall_start(view)
        gap = now - since
        if self._defer_first_budget(view, gap, now):
            # Not stalled whatever its budget: the answer the budget would give (decision: until
            # its turn comes, `jobdiagd status` shows no budget for such a job).
            return _not_stalled(view.key, last)
        budget, step_time = self.budget(view, now)
        early = self._gpu_evidence(view, gap, budget, now)
        if gap <= budget.seconds and early is None:
            return _not_stalled(view.key, last)
        # Triage told what the daemon's clock saw (rule VIEW-1) concludes `hanging` by itself.
        known = StallKnowledge(since, budget.seconds, budget.phase, gpu_confirmed=early is not None)
        res = view.analysis(now, known)
        primary = res.primary
        sig = BY_CLASS.get(primary or "")
        if (
            early is None
            and primary not in (None, FailureClass.HANG)
            and sig is not None
            and sig.tier in _CASCADE_TIERS
        ):
            # One cascade, one incident: the failure-signature incident names the root cause; a
            # hang incident opened before the error was logged is closed as its consequence.
            # Not a GPU-confirmed stall: the GPUs show the job stuck now, burning its allocation,
            # whatever error the log showed first (rule HANG-7).
            why = f"superseded: the stall is a consequence of {primary} (see the failure incident)"
            return [resolved_finding(NAME, view.key, KIND, why)]
        expected: int | None = None
        if last is not None and step_time:
            expected = last + int(gap // step_time)
        stall = _Stall(last, gap, what, budget, step_time, expected, early)
        evidence = tuple(f"{e.source.rsplit('/', 1)[-1]}:{e.line}: {e.text}" for e in res.cls.evidence[:5])
        if not evidence and view.main is not None and view.main.last_text:
            evidence = (f"last line read: {view.main.last_text[:300]}",)
        details = _details(view, res, primary, stall)
        return [
            Finding(
                NAME,
                view.key,
                KIND,
                "critical",
                stall.summary(),
                details,
                evidence,
                at_step=last,
                gpu_confirmed=early is not None,
            )
        ]

    def _defer_first_budget(self, view: WatchedJob, gap: float, now: float) -> bool:
        """Leave a job's first budget to a later tick: only past this tick's MAX_FIRST_BUDGETS,
        and only while the job cannot be stalled (its gap is within the shortest budget there is)
        and no early page may ask about it (that needs the budget's steady step time). A job that
        nears a page is never deferred, so the ones closest to a page are computed first."""
        return (
            view.key not in self._budgets
            and gap <= self.policy.shortest_budget
            and not (self.early is not None and self.has_gpu_source(view))
            and not self._first_ration.spend(now)
        )

    def has_gpu_source(self, view: WatchedJob) -> bool:
        """Whether an early page may ask some Prometheus about the job's GPUs: its own (RAY=1), or
        the site's for a job whose nodes Slurm names."""
        if view.is_ray():
            return True
        return self.site and view.slurm is not None and bool(view.slurm.nodes)

    def _gpu_evidence(self, view: WatchedJob, gap: float, budget: Budget, now: float) -> GpuVerdict | None:
        """The confirmed GPU verdict that pages this stall now (before or past the budget), if any.

        Sticky once paged (whatever the budget memo says later): the stall stays open with the
        GPU evidence it was paged with until a newer step is read; past the budget it keeps it too."""
        last = view.last_step
        early = (
            self.early_confirmed(view, self.early, now)
            if self.early is not None and last is not None
            else None
        )
        memo = early_memo(view)
        step_key = (last, view.last_step_at)
        sticky = self._paged.get(view.key) == step_key or (self.early is not None and gap > budget.seconds)
        if early is None and memo is not None and memo.verdict.confirmed and sticky:
            early = memo.verdict
        if early is not None:
            self._paged[view.key] = step_key
        return early


def _not_stalled(key: str, last: int | None) -> list[Finding]:
    """Within budget: nothing before the first step, else the resolution of an open stall."""
    if last is None:
        return []
    return [resolved_finding(NAME, key, KIND, f"steps resumed at step {last}", last)]


def _not_judged(view: WatchedJob) -> str | None:
    """Why there is no hang to judge (the job is not training or cannot be read), or None."""
    if view.ended:
        return "job ended"
    if view.slurm is not None and view.slurm.state != "RUNNING":
        return f"Slurm state {view.slurm.state}"
    if view.main is None:
        return "log not readable yet"
    if view.blind:
        return "log unreadable (a monitoring-blind notice was sent)"
    last = view.last_step
    total = view.total_steps()
    if last is not None and total is not None and last >= total - 1:
        return "training reached its final step (teardown is not a hang)"
    return None


def stall_since(view: WatchedJob) -> float | None:
    """Since when a job this detector judges has made no progress, on the daemon clock (None: not
    judged: ended, not running, unreadable, past its final step). Computes no budget: what the
    per-job metrics read at scrape time."""
    return None if _not_judged(view) is not None else _stall_start(view)[0]


def _stall_start(view: WatchedJob) -> tuple[float, str]:
    """Since when the job has made no progress, on the daemon clock, and what happened then."""
    last = view.last_step
    if last is None:
        since = view.marker_at if view.marker_at is not None else view.first_seen
        return since, "the pre-training barrier" if view.marker_at is not None else "monitoring began"
    at = view.last_step_at
    return (at if at is not None else view.first_seen), f"step {last} was read"


@dataclasses.dataclass(frozen=True, slots=True)
class _Stall:
    """One stall as the finding reports it."""

    last: int | None
    gap: float
    what: str  # what was read last ("step 12 was read", "the pre-training barrier")
    budget: Budget
    step_time: float | None
    expected: int | None
    early: GpuVerdict | None  # the GPU evidence it is paged with, if any

    def summary(self) -> str:
        gap, budget, early = exact_duration(self.gap), self.budget, self.early
        if early is not None:
            suspects = ", ".join(early.suspects) or "none singled out (every host spins)"
            return (
                f"GPU-confirmed hang ({early.state}): no training step for {gap} since {self.what}; "
                f"expected ≈ step {self.expected} by now. {early.summary}. Suspect host: {suspects}"
            )
        if self.last is None:
            return (
                f"no training step {gap} after {self.what} "
                f"(budget {exact_duration(budget.seconds)}, phase {budget.phase})"
            )
        return (
            f"no training step for {gap} since {self.what}; expected ≈ step {self.expected} by now "
            f"(budget {exact_duration(budget.seconds)}, phase {budget.phase})"
        )


def _details(view: WatchedJob, res: TriageResult, primary: str | None, stall: _Stall) -> dict[str, object]:
    p = res.progress
    budget, step_time, early = stall.budget, stall.step_time, stall.early
    details: dict[str, object] = {
        "triage": what_happened(res),
        "status": res.status,
        "primary failure": primary or "none",
        "stage": res.cls.stage or "n/a",
        "phase": budget.phase,
        "last step": stall.last,
        "expected step": stall.expected,
        "steady step time": f"{step_time:.2f} s" if step_time else "unknown",
        "stalled for": exact_duration(stall.gap),
        "budget": exact_duration(budget.seconds),
        "last periodic checkpoint": p.last_checkpoint_step if p.last_checkpoint_step is not None else "none",
        "progress lost": f"{p.progress_lost_steps} steps" if p.progress_lost_steps is not None else "unknown",
        "log": str(view.ref.log) if view.ref.log else "?",
    }
    if res.live.head_node:
        details["head node"] = res.live.head_node
    if early is not None:
        details[EARLY_DETAIL] = f"yes, before the step budget ({exact_duration(budget.seconds)})"
        details["mechanism"] = early.mechanism
        details["suspect host"] = ", ".join(early.suspects) or "none singled out"
        details["GPU verdict"] = early.summary
        if early.per_host:
            details["GPU state per host"] = "; ".join(f"{h}: {s}" for h, s in sorted(early.per_host.items()))
    for i, step in enumerate(res.next_steps[:3], 1):
        details[f"next step {i}"] = step
    return details


def _status(view: WatchedJob, memo: BudgetMemo | None, now: float) -> StatusPart:
    """The job's step time, expected step and budget phase (before the first budget: where the
    job is -- startup, its log unreadable, or waiting for the log)."""
    step_time = memo.step_time if memo else None
    phase = (
        memo.budget.phase
        if memo and view.last_step is not None
        else ("startup" if view.main else ("blind" if view.blind else "waiting"))
    )
    expected = None
    if view.last_step is not None and view.last_step_at is not None and step_time:
        expected = view.last_step + int((now - view.last_step_at) // step_time)
    return {
        "step_time_s": round(step_time, 3) if step_time else None,
        "expected_step": expected,
        "phase": phase,
    }


def idle_status(view: WatchedJob) -> StatusPart:
    """The status columns while the detector is disabled: no budget, only where the job is."""
    return _status(view, None, 0.0)


SPEC = DetectorSpec(
    NAME,
    True,
    lambda cfg: HangDetector(
        policy_from_config(cfg), early_rule_from_config(cfg), site=cfg.site_prometheus.enabled
    ),
    "training steps stopped: last step vs projection, phase-aware budget (triage.stall)",
    idle_status,
)
