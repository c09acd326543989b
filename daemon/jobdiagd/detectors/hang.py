"""Hang detector: the step projection on the daemon clock (rules PRJ-4, HANG-6), triage's phase-aware budget.

Stalled when `now - (when the last step line was read) > stall_budget(...)` — the same
`triage.stall.stall_budget` triage uses (startup/barrier, warmup after start or restore,
checkpoint steps with the budget learned from this job's own checkpoint steps, steady
state = max(stall_factor x steady step time, min_stall)). Before the first step the gap
runs from when the pre-training barrier was read, else from when the daemon started
watching the job. Log timestamps and mtime are never used.

While stalled the finding is re-emitted every tick (the incident book reminds); once a
newer step is read it is resolved ("steps resumed at step N"). A stall that triage
explains by a failure signature (the cascade's root cause) is left to the
failure-signature incident — a hang incident opened before the error was logged is
resolved as superseded — so one cascade is one open incident.
"""

from __future__ import annotations

import dataclasses
import zlib

from jobdiagd.config import Config
from jobdiagd.detectors.base import NoData, Outcome, WatchedJob, register
from jobdiagd.durations import exact_duration
from jobdiagd.model.alerts import Finding
from jobdiagd.rules.signatures import BY_CLASS, Tier
from jobdiagd.triage.nextsteps import next_steps
from jobdiagd.triage.progress import steady_step_time
from jobdiagd.triage.report import what_happened
from jobdiagd.triage.stall import Budget, StallPolicy, stall_budget

NAME = "hang"
KIND = "hang"
REFRESH_S = 120.0
MAX_REFRESHES = 10


@dataclasses.dataclass(frozen=True, slots=True)
class BudgetMemo:
    """The last `stall_budget` answer for a job (kept in `view.memo["hang"]`; status reads it)."""

    last_step: int | None
    step_version: int
    adjacency: tuple[bool, bool] | None
    budget: Budget
    step_time: float | None
    at: float


_CASCADE_TIERS = (Tier.ROOT, Tier.SYMPTOM, Tier.CARRIER, Tier.INFRA)


def policy_from_config(cfg: Config) -> StallPolicy:
    h = cfg.detectors.hang
    return StallPolicy(
        stall_factor=h.stall_factor,
        min_stall_s=h.min_stall_seconds,
        startup_s=h.startup_grace_seconds,
        checkpoint_s=h.checkpoint_budget_seconds,
    )


class HangDetector:
    name = NAME

    def __init__(self, policy: StallPolicy) -> None:
        self.policy = policy
        self._tick: float | None = None
        self._spent = 0

    def _spend(self, now: float) -> bool:
        """A steady-state refresh is optional work: at most `MAX_REFRESHES` per tick (the engine
        rotates the job order, so every job gets its turn)."""
        if now != self._tick:
            self._tick, self._spent = now, 0
        if self._spent >= MAX_REFRESHES:
            return False
        self._spent += 1
        return True

    def budget(self, view: WatchedJob, now: float) -> tuple[Budget, float | None]:
        """(budget, steady step time) from `stall_budget`, cached between steps that cannot change it.

        Recomputed when the checkpoint adjacency of the last/next step changes (a save is due or
        just happened), during startup/warmup, and otherwise at most every `REFRESH_S` (the steady
        step time drifts slowly); a full recompute walks every kept step record.
        """
        memo: BudgetMemo | None = view.memo.get(NAME)
        last = view.last_step
        ckpt = view.checkpoint()
        adj = (ckpt.adjacent(last), ckpt.adjacent(last + 1)) if last is not None else None
        if memo is not None and memo.last_step == last and memo.step_version == view.version_steps():
            return memo.budget, memo.step_time
        if (
            memo is not None
            and last is not None
            and memo.adjacency == adj
            and memo.budget.phase == "steady"
            and (now - memo.at < REFRESH_S or not self._spend(now))
        ):
            return memo.budget, memo.step_time
        steps = view.sorted_steps() if last is not None else []
        step_time = steady_step_time(steps, ckpt) if steps else None
        b = stall_budget(steps, step_time, ckpt, self.policy)
        # Stagger the refreshes of many jobs over REFRESH_S instead of all in one tick.
        at = now if memo is not None else now - zlib.crc32(view.key.encode()) % int(REFRESH_S)
        view.memo[NAME] = BudgetMemo(last, view.version_steps(), adj, b, step_time, at)
        return b, step_time

    def check(self, view: WatchedJob, now: float) -> Outcome:
        if view.ended:
            return NoData("job ended")
        if view.slurm is not None and view.slurm.state != "RUNNING":
            return NoData(f"Slurm state {view.slurm.state}")
        if view.main is None:
            return NoData("log not readable yet")
        if view.blind:
            return NoData("log unreadable (a monitoring-blind notice was sent)")
        last = view.last_step
        total = view.total_steps()
        if last is not None and total is not None and last >= total - 1:
            return NoData("training reached its final step (teardown is not a hang)")
        budget, step_time = self.budget(view, now)
        if last is None:
            since = view.marker_at if view.marker_at is not None else view.first_seen
            what = "the pre-training barrier" if view.marker_at is not None else "monitoring began"
        else:
            at = view.last_step_at
            since = at if at is not None else view.first_seen
            what = f"step {last} was read"
        gap = now - since
        if gap <= budget.seconds:
            if last is None:
                return []
            return [
                Finding(
                    NAME, view.key, KIND, "info", f"steps resumed at step {last}", at_step=last, resolved=True
                )
            ]
        res = view.analysis(now, self.policy)
        primary = res.primary
        sig = BY_CLASS.get(primary or "")
        if primary not in (None, "hang") and sig is not None and sig.tier in _CASCADE_TIERS:
            # One cascade, one incident: the failure-signature incident names the root cause; a
            # hang incident opened before the error was logged is closed as its consequence.
            return [
                Finding(
                    NAME,
                    view.key,
                    KIND,
                    "info",
                    f"superseded: the stall is a consequence of {primary} (see the failure incident)",
                    resolved=True,
                )
            ]
        if res.status == "running" and res.cls.primary is None:
            # Triage times stalls with the log's own stamps; a log without them looks "running" to
            # it. The daemon's clock saw the stall: report the triage it would give knowing that.
            cls = dataclasses.replace(res.cls, status="hanging", primary="hang", stage="Training")
            res = dataclasses.replace(res, cls=cls)
            res.next_steps = next_steps(res)
            primary = "hang"
        expected: int | None = None
        if last is not None and step_time:
            expected = last + int(gap // step_time)
        if last is None:
            summary = (
                f"no training step {exact_duration(gap)} after {what} "
                f"(budget {exact_duration(budget.seconds)}, phase {budget.phase})"
            )
        else:
            summary = (
                f"no training step for {exact_duration(gap)} since {what}; expected ≈ step {expected} by now "
                f"(budget {exact_duration(budget.seconds)}, phase {budget.phase})"
            )
        p = res.progress
        details: dict[str, object] = {
            "triage": what_happened(res),
            "status": res.status,
            "primary failure": primary or "none",
            "stage": res.cls.stage or "n/a",
            "phase": budget.phase,
            "last step": last,
            "expected step": expected,
            "steady step time": f"{step_time:.2f} s" if step_time else "unknown",
            "stalled for": exact_duration(gap),
            "budget": exact_duration(budget.seconds),
            "last periodic checkpoint": p.last_checkpoint_step
            if p.last_checkpoint_step is not None
            else "none",
            "progress lost": f"{p.progress_lost_steps} steps"
            if p.progress_lost_steps is not None
            else "unknown",
            "log": str(view.ref.log) if view.ref.log else "?",
        }
        if res.live.head_node:
            details["head node"] = res.live.head_node
        for i, step in enumerate(res.next_steps[:3], 1):
            details[f"next step {i}"] = step
        evidence = tuple(f"{e.source.rsplit('/', 1)[-1]}:{e.line}: {e.text}" for e in res.cls.evidence[:5])
        if not evidence and view.main is not None and view.main.last_text:
            evidence = (f"last line read: {view.main.last_text[:300]}",)
        return [Finding(NAME, view.key, KIND, "critical", summary, details, evidence, at_step=last)]


register(
    NAME,
    True,
    lambda cfg: HangDetector(policy_from_config(cfg)),
    "training steps stopped: last step vs projection, phase-aware budget (triage.stall)",
)
