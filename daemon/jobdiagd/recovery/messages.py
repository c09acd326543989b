"""What people read about recovery (rule REC-15): the countdown in the incident's message, each
action with who, why and the exact command, and the continuation line of a restarted job."""

from __future__ import annotations

from collections.abc import Sequence

from jobdiagd.durations import rounded_duration
from jobdiagd.recovery.book import Intent, LogEntry
from jobdiagd.recovery.policy import Decision, Plan


def plan_lines(plan: Plan) -> list[str]:
    lines = [f"rule {plan.rule}: {plan.reason}"]
    if plan.exclude:
        lines.append("exclude: " + ",".join(plan.exclude))
    if plan.nodelist:
        lines.append("same nodes: " + ",".join(plan.nodelist))
    if plan.env:
        lines.append("environment: " + " ".join(f"{k}={v}" for k, v in sorted(plan.env.items())))
    lines.append(f"method: {plan.method} (attempt {plan.attempt} of chain {plan.chain})")
    lines += [f"note: {n}" for n in plan.notes]
    return lines


def countdown_text(intent: Intent, now: float) -> str:
    """The line the incident's message carries while an auto restart counts down (rule REC-14)."""
    plan = intent.plan
    if intent.status == "scheduled" and intent.progress.get("approved_by"):
        head = f"♻ Restart of job {plan.job_id} approved by {intent.progress['approved_by']}: starting now ({plan.action})."
    elif intent.status == "scheduled" and intent.due_at is not None:
        left = rounded_duration(max(intent.due_at - now, 0.0))
        mode = "Dry run" if intent.progress.get("mode") == "dry-run" else "Auto-restart"
        head = (
            f"♻ {mode} of job {plan.job_id} in {left} ({plan.action}). Press “Keep the job” or ack to cancel."
        )
    elif intent.status == "suggested":
        head = (
            f"♻ Suggested: restart job {plan.job_id} ({plan.action}). Press “Restart” (owner or operators)."
        )
    elif intent.status == "cancelled":
        head = f"♻ Restart of job {plan.job_id} cancelled: {intent.result or 'kept'}"
    elif intent.status == "done":
        head = f"♻ Job {plan.job_id} {intent.result or 'restarted'}"
    elif intent.status == "failed":
        head = f"♻ Restart of job {plan.job_id} failed: {intent.result or '?'}"
    elif intent.status == "running":
        head = f"♻ Restarting job {plan.job_id} now ({plan.action}): each command is posted in the thread."
    elif intent.status == "dry-run":
        head = f"♻ Dry run: the commands an auto-restart of job {plan.job_id} would run are in the thread; none ran."
    else:
        head = f"♻ Restart of job {plan.job_id}: {intent.status}"
    return "\n".join([head, *(f"- {ln}" for ln in plan_lines(plan))])


def refusal_text(job_id: str, decision: Decision) -> str:
    return f"♻ No automatic restart of job {job_id}: {decision.reason} (rule {decision.rule})"


def action_text(entry: LogEntry) -> str:
    """`♻ jobdiagd (auto) · cancel · rule REC-4 · scancel 123 → job 123 cancelled`."""
    parts = [f"♻ {entry.actor}", entry.action, f"rule {entry.rule}"]
    if entry.argv:
        parts.append(f"`{entry.command}`")
    return " · ".join(parts) + f" → {entry.outcome}"


def restarted_text(old_id: str, new_id: str, restored_step: int | None) -> str:
    """The continuation line in the old job's incident thread: "restarted as 12346, step 4100 restored"."""
    if old_id == new_id:
        head = f"requeued job {old_id}"
    else:
        head = f"restarted as {new_id}"
    if restored_step is not None:
        return f"{head}, step {restored_step} restored"
    return f"{head}, no checkpoint restored (starts from step 0)"


def outcome_title(intent: Intent, error: str | None = None) -> str:
    """The reply in the incident's thread when an intent was acted on (rule REC-15)."""
    plan = intent.plan
    job = plan.job_id
    if intent.status == "done":
        return f"♻ job {job} restarted as {intent.new_job_id} (rule {plan.rule})"
    if intent.status == "dry-run":
        return f"♻ dry run for job {job}: what auto would run (rule {plan.rule}), nothing ran"
    if intent.status == "cancelled":
        return f"♻ restart of job {job} not done: {intent.result or 'cancelled'}"
    if intent.status == "failed":
        return f"♻ restart of job {job} failed (rule {plan.rule}): {intent.result or error or '?'}"
    if error is not None:
        return f"♻ restart of job {job} waits for Slurm (rule {plan.rule}): {error}"
    return f"♻ restart of job {job}: {intent.status} (rule {plan.rule})"


def outcome_body(entries: Sequence[LogEntry]) -> str:
    """Every action of an outcome, one line each: who or what, the action, the rule, the exact command."""
    return "\n".join(f"- {action_text(e)}" for e in entries)
