"""The next steps of a triage: its primary class's templates (`triage.classes`), filled in and filtered for the job."""

from __future__ import annotations

from jobdiagd.model.kinds import FailureClass, JobStatus
from jobdiagd.model.triage import TriageResult
from jobdiagd.rules.slurm import CANCEL_EXITS
from jobdiagd.triage.classes import CLASSES


def _applies(template: str, r: TriageResult) -> bool:
    """Drop advice that cannot apply to this job: killing a job that already ended, querying
    a TSDB that a RAY=0 job never had."""
    live = r.status in (JobStatus.RUNNING, JobStatus.HANGING)
    if (template.startswith("Kill the job") or "job is still live" in template) and not live:
        return False
    if template.startswith("If RAY=1") and not r.ray:
        return False
    return not ("jobdiagd diagnose" in template and not r.ray)


def _fit(template: str, r: TriageResult) -> str:
    """The hang template speaks of init-phase hangs; a hang after step N is not one (rule NS-4)."""
    phrase = "init-phase hangs (before step 0) are often transient RCCL race conditions"
    if r.steps and phrase in template:
        return template.replace(
            phrase,
            f"RCCL hangs are often transient race conditions (this one came after step {r.steps[-1].step})",
        )
    return template


def _templates(r: TriageResult, primary: FailureClass) -> tuple[str, ...]:
    """The templates of the primary class, or of the wording family that decided it (its variant)."""
    row = CLASSES.get(primary)
    if row is None:
        return ()
    rule = r.cls.primary_rule
    variant = None
    if primary == FailureClass.CANCELLED and "TIME LIMIT" in (r.cls.cancel_reason or ""):
        variant = "time-limit"
    elif primary == FailureClass.NODE_FAIL and rule == "NODE-slurm-node-failure":
        variant = "slurm"
    elif primary == FailureClass.NODE_FAIL and rule in ("NODE-jax-init", "NODE-jax-init-deadline"):
        variant = "init"
    return row.next_steps if variant is None else row.variants.get(variant, ())


def next_steps(r: TriageResult) -> list[str]:
    primary = r.cls.primary
    steps: list[str] = []
    fill = {
        "job_id": r.job_id or "<id>",
        "target": str(r.ref.job_dir or r.ref.log or "<job>"),
        "job_dir": str(r.ref.job_dir or "<job_dir>"),
        "outputs_root": str(r.ref.job_dir.parent) if r.ref.job_dir else "<outputs_root>",
        "mem_fraction": f" (this job: {r.env['XLA_PYTHON_CLIENT_MEM_FRACTION']})"
        if "XLA_PYTHON_CLIENT_MEM_FRACTION" in r.env
        else "",
        "failed_nodes": ", ".join(
            f"{n.host} (exit {n.exit_code})"
            for n in r.node_exits
            if n.exit_code != 0 and n.exit_code not in CANCEL_EXITS
        )
        or "see NODE_EXIT lines",
    }
    if primary is not None:
        steps.extend(_fit(t, r).format(**fill) for t in _templates(r, primary) if _applies(t, r))
    hb = r.cls.heartbeat
    if hb is not None and primary != FailureClass.HEARTBEAT_TIMEOUT:
        steps.append(
            "The heartbeat timeout was the kill mechanism, not the root cause: raising "
            "jax_distributed_heartbeat_timeout_seconds only delays the kill; fix the root cause above."
        )
    if r.tgs.degraded and primary != FailureClass.TGS_DEGRADATION:
        steps.extend(t.format(**fill) for t in CLASSES[FailureClass.TGS_DEGRADATION].next_steps)
    if r.status in (JobStatus.RUNNING, JobStatus.HANGING) and r.ray and r.live.head_node:
        steps.append(
            f"Job is live: its Prometheus is on {r.live.head_node}:{r.live.prometheus_port or 9190} (127.0.0.1 only) — "
            f"`jobdiagd diagnose {fill['target']}` reaches it over ssh."
        )
    return steps
