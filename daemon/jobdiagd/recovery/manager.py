"""The seams the daemon wires (docs/recovery.md "Wiring"): `consider` an opened incident, `keep`
on "Keep the job" or an ack, `approve` on "Restart", and `run_due` every tick.

`consider` is what the post-judging stage calls for each incident it opens (and for a failed
job's end report): it decides (rules REC-1 to REC-10), and stores the intent — joining the
caller's store transaction when there is one, so the incident change, its notification and the
intent commit together (rule REC-13). In `auto` the intent is due after the countdown (rule
REC-14); in `suggest` it waits for `approve`; in `dry-run` it runs to the point of printing the
exact commands (rule REC-19). `run_due` executes what is due (in a worker thread: the Slurm
commands block); a `running` intent left by a crash resumes there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from jobdiagd.alerts.store import AlertStore
from jobdiagd.config import RecoveryConfig
from jobdiagd.recovery.book import Intent, LogEntry, RecoveryBook, Status, intent_id
from jobdiagd.recovery.executor import ExecutionError, Executor, job_env, sbatch_argv
from jobdiagd.recovery.nodes import NodeEvidence, NodeMemory, NodeNotice, drain
from jobdiagd.recovery.policy import Case, Decision, decide
from jobdiagd.recovery.slurm_ops import ACTIVE_STATES, JobSpec, SlurmOpError, SlurmOps
from jobdiagd.rules.recovery import Family, restarting

AUTO_ACTOR = "jobdiagd (auto)"
PENDING: tuple[Status, ...] = ("scheduled", "suggested")  # what Keep the job / an ack cancels


@dataclass(frozen=True, slots=True)
class Outcome:
    """One intent `run_due` handled: the intent as it ended, and the log lines to post."""

    intent: Intent
    entries: tuple[LogEntry, ...]
    error: str | None = None


class RecoveryManager:
    def __init__(
        self,
        cfg: RecoveryConfig,
        store: AlertStore,
        ops: SlurmOps,
        *,
        work_dir: Path,
        outputs_roots: Sequence[Path] = (),
        now: Callable[[], float],
        hook: Callable[[str, Intent], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.ops = ops
        self.book = RecoveryBook(store)
        self.memory = NodeMemory(store, half_life_days=cfg.node_half_life_days)
        self.now = now
        self.executor = Executor(ops, self.book, cfg, work_dir, outputs_roots, now=now, hook=hook)

    # -- deciding ---------------------------------------------------------

    def consider(self, case: Case, now: float) -> tuple[Decision, Intent | None]:
        """Decide about one incident and store the intent (idempotent: a repeat returns the stored one)."""
        run = self.book.run_of(case.job_id)
        attempt = (run.attempt if run is not None else 0) + 1
        iid = intent_id(case.job_id, attempt)
        decision = decide(
            self.cfg,
            case,
            run,
            actions_last_hour=self.book.started_since(now - 3600.0),
            suspected_nodes=self.memory.suspected(now, self.cfg.node_exclude_score),
            now=now,
        )
        existing = self.book.intent(iid)
        if existing is not None:
            return decision, existing
        if decision.plan is None:
            if decision.mode == "off" or decision.rule == "REC-3":
                return decision, None  # not opted in: nothing to record or say
            said = any(
                e.action == "decline" and e.rule == decision.rule for e in self.book.entries(case.job_id)
            )
            if not said:  # once per job and rule, however often the daemon asks
                self.book.log(
                    LogEntry(now, case.job_id, AUTO_ACTOR, decision.rule, "decline", (), decision.reason)
                )
            return decision, None
        status = {"auto": "scheduled", "dry-run": "scheduled", "suggest": "suggested"}[decision.mode]
        due = now + self.cfg.countdown_seconds if status == "scheduled" else None
        intent = Intent(
            id=iid,
            job_id=case.job_id,
            incident_id=case.incident_id,
            status=status,  # type: ignore[arg-type]
            due_at=due,
            created_at=now,
            updated_at=now,
            plan=decision.plan,
            progress={"mode": decision.mode},
        )
        with self.store.transaction():
            self.book.add_intent(intent)
            self.book.log(
                LogEntry(
                    now,
                    case.job_id,
                    AUTO_ACTOR,
                    decision.plan.rule,
                    f"plan-{decision.mode}",
                    (),
                    decision.plan.reason,
                    iid,
                )
            )
        return decision, intent

    # -- people -----------------------------------------------------------

    def keep(
        self, job_id: str, by: str, now: float, *, rule: str = "REC-14", why: str | None = None
    ) -> list[Intent]:
        """ "Keep the job" (or an ack/mute, rule REC-9): cancel the job's pending intents. `why`
        (default "kept by <by>") is the intent's result and the log line's outcome."""
        out = []
        why = why or f"kept by {by}"
        for intent in self.book.intents_for_job(job_id):
            if intent.status in PENDING:
                done = self.book.update_if(intent, now, PENDING, status="cancelled", result=why)
                if done is None:
                    continue  # the worker thread began it a moment ago: too late to keep
                self.book.log(LogEntry(now, job_id, by, rule, "keep", (), why, intent.id))
                out.append(done)
        return out

    def approve(self, job_id: str, by: str, *, allowed: bool, now: float) -> Intent | None:
        """ "Restart" pressed on a suggestion: due now. `allowed`: the presser is the job's owner or
        an operator (the chat side knows who is who)."""
        for intent in self.book.intents_for_job(job_id):
            if intent.status != "suggested":
                continue
            if not allowed:
                self.book.log(
                    LogEntry(now, job_id, by, "REC-14", "approve", (), "refused: not owner/operator")
                )
                return None
            approved = self.book.update_if(
                intent,
                now,
                ("suggested",),
                status="scheduled",
                due_at=now,
                progress={**intent.progress, "approved_by": by},
            )
            if approved is not None:
                self.book.log(
                    LogEntry(now, job_id, by, intent.plan.rule, "approve", (), "restart approved", intent.id)
                )
            return approved
        return None

    # -- acting -----------------------------------------------------------

    def run_due(self, now: float) -> list[Outcome]:
        out = []
        for intent in self.book.due(now):
            if float(intent.progress.get("retry_at", 0.0)) > now:
                continue  # a Slurm command failed: retried after its delay
            outcome = self._run_one(intent, now)
            if outcome is not None:
                out.append(outcome)
        return out

    def next_due(self) -> float | None:
        """When `run_due` next has something to do (a countdown's end, a retry); None: nothing open."""
        times = []
        for intent in self.book.open_intents():
            if intent.status == "running":
                times.append(float(intent.progress.get("retry_at", 0.0)))
            elif intent.status == "scheduled" and intent.due_at is not None:
                times.append(intent.due_at)
        return min(times) if times else None

    def _run_one(self, intent: Intent, now: float) -> Outcome | None:
        """None: a person kept it (or another part of the daemon began it) meanwhile."""
        since = now
        actor = intent.progress.get("approved_by") or AUTO_ACTOR
        if intent.status == "scheduled":
            blocked = self._blocked(intent, now)
            if blocked is not None:
                rule, why = blocked
                ended = self.book.update_if(intent, now, ("scheduled",), status="cancelled", result=why)
                if ended is None:
                    return None
                self.book.log(LogEntry(now, intent.job_id, actor, rule, "decline", (), why, intent.id))
                return Outcome(ended, tuple(self._entries_since(intent.job_id, since)))
            claimed = self.book.update_if(intent, now, ("scheduled",), status="running")
            if claimed is None:
                return None
            intent = claimed
            if intent.progress.get("mode") != "dry-run":
                self.book.log(
                    LogEntry(
                        now, intent.job_id, actor, intent.plan.rule, "restart", (), intent.plan.reason, intent.id
                    )
                )
        if intent.progress.get("mode") == "dry-run":
            return self._dry_run(intent, now)  # a dry run left running by a crash ends as one too
        try:
            ended = self.executor.execute(intent, actor)
            error = None
        except ExecutionError as exc:
            ended = self.book.intent(intent.id) or intent
            error = str(exc)
        return Outcome(ended, tuple(self._entries_since(intent.job_id, since)), error)

    def _blocked(self, intent: Intent, now: float) -> tuple[str, str] | None:
        """Checks at the end of the countdown: the rate limit (rule REC-10), and a hung job that
        ended during the countdown — someone took it over (rule REC-14)."""
        if self.book.started_since(now - 3600.0) >= self.cfg.max_actions_per_hour:
            return "REC-10", f"site-wide limit of {self.cfg.max_actions_per_hour} restarts per hour reached"
        if intent.plan.family == Family.HANG:
            try:
                job = self.ops.job(intent.job_id)
                if job is not None and (job.state in ACTIVE_STATES or restarting(job.get("Comment"))):
                    return None  # still hung, or a peer daemon is restarting it: go on (rule REC-12)
                if self.ops.marker_jobs(intent.job_id):
                    return None  # a peer restarted it already: the executor joins that restart
            except SlurmOpError:
                return None  # the executor will fail it with the command's error
            if job is not None and not job.state.startswith("CANCELLED"):
                # Ended by itself (a watchdog's nccl-timeout, heartbeat-timeout): still the
                # runbook's restart. Only a cancel is a person taking the job over.
                return None
            return "REC-14", f"job {intent.job_id} ended during the countdown: left to people"
        return None

    def _dry_run(self, intent: Intent, now: float) -> Outcome:
        """Rule REC-19: the exact commands `auto` would run, logged and posted; nothing runs."""
        spec = self.ops.job(intent.job_id)
        lines: list[tuple[str, ...]] = []
        if spec is not None and intent.plan.method == "resubmit":
            lines.append(tuple(self.ops.cancel_argv(intent.job_id)))
            lines.append(tuple(self._preview_sbatch(intent, spec)))
        elif spec is not None:
            lines.append(tuple(self.ops.requeue_argv(intent.job_id)))
            if intent.plan.exclude:
                lines.append(tuple(self.ops.exclude_argv(intent.job_id, intent.plan.exclude)))
        for argv in lines:
            self.book.log(
                LogEntry(
                    now,
                    intent.job_id,
                    "jobdiagd (dry-run)",
                    intent.plan.rule,
                    "would-run",
                    argv,
                    "not run (dry-run)",
                    intent.id,
                )
            )
        ended = self.book.update(intent, now, status="dry-run", result="dry-run: nothing was run")
        return Outcome(ended, tuple(self._entries_since(intent.job_id, now)))

    def _preview_sbatch(self, intent: Intent, spec: JobSpec) -> list[str]:
        script = self.executor.work_dir / f"{intent.id.replace(':', '-')}.sbatch"
        try:
            argv = sbatch_argv(spec, intent.plan, script, running_as=spec.user or "", owner=spec.user)
        except ExecutionError as exc:
            return ["#", str(exc)]
        env = job_env(spec, intent.plan, self.cfg, self.executor.outputs_roots, base={})
        shown = [f"{k}={v}" for k, v in sorted(env.items()) if k not in ("PATH", "HOME", "USER", "LOGNAME")]
        return ["env", *shown, *argv] if shown else argv

    def _entries_since(self, job_id: str, since: float) -> list[LogEntry]:
        return [e for e in self.book.entries(job_id) if e.at >= since]

    # -- node memory ------------------------------------------------------

    def observe_nodes(self, job_id: str, evidence: Sequence[NodeEvidence], now: float) -> list[NodeNotice]:
        """Record what a diagnosis says about nodes (rule REC-20); the notices newly due (rule REC-22)."""
        self.memory.record(job_id, evidence, now)
        return self.memory.notices(now, self.cfg.node_notice_score)

    def drain(self, node: str, *, by: str, is_operator: bool, now: float) -> str:
        """The Drain button (rule REC-23): operators only; raises DrainRefused otherwise."""
        return drain(self.ops, self.book, self.memory, node, by=by, is_operator=is_operator, now=now)

    # -- the daemon's other questions --------------------------------------

    def continuation_of(self, job_id: str) -> str | None:
        return self.book.continuation_of(job_id)

    def pending(self) -> list[Intent]:
        return self.book.open_intents()
