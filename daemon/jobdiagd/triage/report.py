"""Render a TriageResult as the Markdown triage report (rule RPT-1), JSON, or a one-line summary row."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from jobdiagd import jsonsafe
from jobdiagd.durations import exact_duration
from jobdiagd.model.kinds import FailureClass, HeartbeatPhase, HeartbeatVerdict, JobStatus, StallBasis
from jobdiagd.rules.signatures import describe
from jobdiagd.triage.classify import SETUP_BUDGET_S

if TYPE_CHECKING:
    from jobdiagd.model.triage import TriageResult


def _when(t: float | None) -> str:
    if t is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


_SOFT_SUCCESS_WHY = {
    "a": "a single rank exited 1 during teardown (ray.kill racing Ray cluster shutdown)",
    "b": "all ranks exited 143 cascading from one rank's late post-training failure (pending_event_logger stall or a hardware fault at job end)",
    "c": "all ranks exited 143 at the --time= walltime, Slurm cancelling during teardown",
}


def what_happened(r: TriageResult) -> str:
    """The report's "What happened" paragraph: one sentence or three about the primary failure."""
    p = r.progress
    c = r.cls
    primary = c.primary
    at = f" at step {p.last_step}" if p.last_step is not None else " before the first training step"
    if primary is None:
        return _no_failure_text(r)
    if primary == FailureClass.SOFT_SUCCESS:
        v = c.soft_success_variant
        why = _SOFT_SUCCESS_WHY.get(v or "", "a post-training artifact")
        return (
            f"Training reached the final step {p.last_step} of steps={p.total_steps}; the non-zero exit is a post-training "
            f"artifact (soft-success {v}: {why}). Training data is intact."
        )
    if primary == FailureClass.HANG:
        return _hang_text(r, at)
    if primary == FailureClass.HEARTBEAT_TIMEOUT:
        return _heartbeat_text(r, at)
    if primary == FailureClass.CANCELLED:
        return f"The job was cancelled by {_cancelled_by(c.cancel_reason)}{at}; training was progressing normally until then."
    if primary == FailureClass.UNKNOWN_DEATH:
        return (
            f"The job stopped{at} without writing a JOB SUMMARY: the process was killed externally "
            "(SIGKILL / OOM-kill / preemption). Most common cause: host OOM-kill or Slurm preemption."
        )
    if primary == FailureClass.PROLOG_KILL_NO_LOG:
        return "slurmd killed the job before the batch script could run: no log was ever written."
    if primary == FailureClass.TGS_DEGRADATION:
        return f"Training runs but underperforms: TGS {r.tgs.magnitude} over steps {r.tgs.range} ({r.tgs.pattern})."
    return _signature_text(r, primary, at)


def _no_failure_text(r: TriageResult) -> str:
    p = r.progress
    if r.status == JobStatus.COMPLETED:
        s = f"The job completed all {p.total_steps or '?'} steps" if p.reached_end else "The job completed"
        s += f" (last step {p.last_step})." if p.last_step is not None else "."
        if r.tgs.degraded:
            s += f" It ran slower than it should have: TGS {r.tgs.magnitude} ({r.tgs.pattern})."
        return s
    if r.status == JobStatus.RUNNING:
        expected = f", expected {p.expected_step_now}" if p.expected_step_now is not None else ""
        return f"Training is progressing (last step {p.last_step}{expected})."
    return f"Status {r.status}; no failure signature found."


def _hang_text(r: TriageResult, at: str) -> str:
    c = r.cls
    gap = c.stall.gap_s if c.stall else None
    if c.heartbeat is not None and c.heartbeat.verdict == HeartbeatVerdict.HANG:
        return (
            f"Training stalled{at} ({exact_duration(c.heartbeat.stall_s)} without a step before the heartbeat error): "
            "an RCCL/NCCL collective hang. The heartbeat timeout that ended the job was the kill mechanism "
            "(gRPC channel deadlock after a prolonged hang), not the root cause."
        )
    daemon = _daemon_clock(r)
    if not r.steps:
        return (
            f"No training step completed after the pre-training barrier{daemon}: the first RCCL collective "
            "deadlocked (init-phase hang, often a transient race)."
        )
    tail = f" for {exact_duration(gap)}{daemon}" if gap is not None else ""
    if r.status == JobStatus.CANCELLED:
        return f"Training stopped advancing{at}{tail} and the job was then cancelled: the cancellation killed a hung job (RCCL/NCCL collective deadlock)."
    if FailureClass.TRAIN_TIMEOUT in c.classes:
        return (
            f"Training stopped advancing{at}{tail} until the training timeout killed it: a collective hang."
        )
    return f"Training stopped advancing{at}{tail} while the job is still running: an RCCL/NCCL collective hang (all nodes waiting on each other)."


def _daemon_clock(r: TriageResult) -> str:
    """How the daemon timed a live job's stall (rule VIEW-1), worded as its hang page words it."""
    stall = r.cls.stall
    if stall is None or stall.basis != StallBasis.DAEMON:
        return ""
    early = (
        "; GPU-confirmed before it ran out"
        if stall.gap_s is not None and stall.gap_s <= stall.budget_s
        else ""
    )
    return f" (the daemon's clock: budget {exact_duration(stall.budget_s)}, phase {stall.phase}{early})"


def _daemon_stall_row(r: TriageResult) -> tuple[str, str] | None:
    """A live job the daemon watches: the time since it read the last step, against its budget."""
    stall = r.cls.stall
    if stall is None or stall.basis != StallBasis.DAEMON or stall.gap_s is None:
        return None
    last = r.progress.last_step
    since = f"step {last} was read" if last is not None else "the barrier was read (or watching began)"
    verdict = "stalled" if stall.stalled else "within budget"
    return (
        "No step for (daemon's clock)",
        f"{exact_duration(stall.gap_s)} since {since} — budget {exact_duration(stall.budget_s)}, "
        f"phase {stall.phase}: {verdict}",
    )


def _heartbeat_text(r: TriageResult, at: str) -> str:
    hb = r.cls.heartbeat
    tasks = ", ".join(str(t) for t in hb.accused_tasks) if hb and hb.accused_tasks else "?"
    if hb is not None and hb.phase == HeartbeatPhase.INIT:
        return (
            f"The JAX coordination service declared task(s) {tasks} dead before any training step: the heartbeat "
            f"timeout ({hb.timeout_s:.0f}s) is shorter than compilation + initial checkpoint time. A false positive."
        )
    return (
        f"The JAX coordination service declared task(s) {tasks} dead (stopped sending heartbeats) while training "
        f"was progressing{at}: a heartbeat false positive (gRPC channel deadlock, Bug 3 of the postmortem)."
    )


def _signature_text(r: TriageResult, primary: str, at: str) -> str:
    c = r.cls
    s = f"{describe(primary, c.primary_rule)}{at}."
    if primary in (FailureClass.OOM_HOST, FailureClass.OOM_GPU) and FailureClass.NCCL_TIMEOUT in c.classes:
        s += " The NCCL timeouts on the other nodes are a consequence (they waited for the dead node)."
    if primary == FailureClass.CHECKPOINT_FS_ERROR:
        s += " The checkpoint may still be intact — check the other workers."
    if c.heartbeat is not None and c.heartbeat.verdict == HeartbeatVerdict.TRUE_POSITIVE:
        s += " The later heartbeat timeout was a consequence of this error."
    return s


def _cancelled_by(reason: str | None) -> str:
    """Who ended a cancelled job, from Slurm's `CANCELLED AT ... DUE TO <reason>` line."""
    if reason is None or reason.startswith("SIGNAL"):  # Slurm >= 25.05: "DUE to SIGNAL Terminated"
        return "scancel / SIGTERM"
    if "TIME LIMIT" in reason:
        return "Slurm at the job's time limit (--time)"
    if "PREEMPT" in reason or "REQUEUE" in reason:
        return f"the scheduler ({reason.lower()})"
    return f"Slurm ({reason.lower()})"


def _silence_row(r: TriageResult) -> tuple[str, str] | None:
    """How long training had been silent when a job was cancelled or died without a summary
    (runbook: "check training progress projection — if the last step is far behind the
    expected step, the real issue is a hang killed by scancel"): shown when it is more than a
    few step times. (A failed job's gap is the time its failure took; the heartbeat checklist
    shows its own.)"""
    c, p = r.cls, r.progress
    stall = c.stall
    if r.status not in (JobStatus.CANCELLED, JobStatus.UNKNOWN_DEATH) or stall is None or stall.gap_s is None:
        return None
    if stall.gap_s < max(120.0, 3 * (p.step_time_s or 0.0)) and not stall.stalled:
        return None
    end = "the cancel" if r.status == JobStatus.CANCELLED else "the end of the job"
    how = (
        "measured from timestamps"
        if stall.basis == StallBasis.TIMESTAMPS
        else "wall time − summed steps − setup"
    )
    after = f"after step {p.last_step}" if p.last_step is not None else "before the first step"
    flag = (
        f" — beyond the {exact_duration(stall.budget_s)} stall budget: training had stopped"
        if stall.stalled
        else ""
    )
    return (f"Silence before {end}", f"{exact_duration(stall.gap_s)} {after} ({how}){flag}")


def _progress_rows(r: TriageResult) -> list[tuple[str, str]]:
    """The rows of the report's progress projection table (rules PRJ-1 to PRJ-8)."""
    silence = _silence_row(r) or _daemon_stall_row(r)
    return [
        *_step_rows(r),
        _expected_step_row(r),
        *([silence] if silence is not None else []),
        _checkpoint_row(r),
        *_lost_rows(r),
        _remaining_row(r),
        *_time_rows(r),
    ]


def _step_rows(r: TriageResult) -> list[tuple[str, str]]:
    p = r.progress
    rows: list[tuple[str, str]] = []
    if p.start == "restored":
        rows.append(("Start", f"restored from ckpt {p.restored_from_step}"))
    else:
        rows.append(("Start", p.start or "unknown"))
    if p.first_step is not None and p.last_step is not None:
        rows.append(
            (
                "Steps completed (this run)",
                f"{p.steps_this_run} steps (step {p.first_step} through {p.last_step})",
            )
        )
        if p.total_steps:
            pct = (p.last_step + 1) / p.total_steps * 100
            rows.append(("Overall progress", f"{p.last_step + 1} / {p.total_steps} ({pct:.1f}%)"))
        else:
            rows.append(("Overall progress", f"{p.last_step + 1} / unknown"))
    else:
        rows.append(("Steps completed (this run)", "0 (no completed step: line)"))
        total = f"0 / {p.total_steps} (0.0%)" if p.total_steps else "0 / unknown"
        rows.append(("Overall progress", total))
    rows.append(("Steady-state step time", f"{p.step_time_s}s" if p.step_time_s else "unknown"))
    return rows


def _expected_step_row(r: TriageResult) -> tuple[str, str]:
    p = r.progress
    if r.status == JobStatus.COMPLETED:
        return ("Expected step by now", "n/a (job completed)")
    if p.expected_step_now is not None:
        label = (
            "Expected step by now"
            if r.status in (JobStatus.RUNNING, JobStatus.HANGING)
            else "Expected step at job end"
        )
        return (label, f"{p.expected_step_now} (last step {p.last_step} at {_when(p.last_step_time)})")
    return ("Expected step by now", "n/a (no timestamps on step lines)" if r.steps else "n/a")


def _checkpoint_row(r: TriageResult) -> tuple[str, str]:
    p = r.progress
    if p.checkpointing is False:
        return ("Last periodic ckpt this run", "none — checkpointing disabled")
    if p.last_checkpoint_step is not None:
        return (
            "Last periodic ckpt this run",
            f"step {p.last_checkpoint_step} (period {p.checkpoint_period})",
        )
    return (
        "Last periodic ckpt this run",
        f"none — didn't reach checkpoint_period ({p.checkpoint_period})" if p.checkpoint_period else "none",
    )


def _lost_rows(r: TriageResult) -> list[tuple[str, str]]:
    p = r.progress
    if p.progress_lost_steps is None:
        return [] if r.steps else [("Progress lost", "0 steps (training never completed a step)")]
    lost_time = ("≈ " if p.progress_lost_s_estimated else "") + exact_duration(p.progress_lost_s)
    if r.status == JobStatus.COMPLETED:
        return [("Progress lost", "0 steps (job completed)")]
    if p.last_checkpoint_step is None and p.start != "restored":
        return [("Progress lost", f"all — no periodic ckpt ({p.progress_lost_steps} steps, {lost_time})")]
    return [("Progress lost", f"{p.progress_lost_steps} steps ({lost_time}) since last periodic ckpt")]


def _remaining_row(r: TriageResult) -> tuple[str, str]:
    p = r.progress
    if r.status == JobStatus.COMPLETED:
        return ("Estimated time remaining", "0 (job completed)")
    if p.eta_s is not None:
        return (
            "Estimated time remaining",
            f"{exact_duration(p.eta_s)} (from last step, if job were healthy)",
        )
    return ("Estimated time remaining", "unknown (no steady-state step time yet)")


def _time_rows(r: TriageResult) -> list[tuple[str, str]]:
    p = r.progress
    rows: list[tuple[str, str]] = []
    if p.train_time_s is not None:
        rows.append(("Total training time (summed)", exact_duration(p.train_time_s)))
    if p.wall_time_s is not None:
        origin = (
            "JOB SUMMARY"
            if r.summary is not None and r.summary.wall_s is not None
            else "Slurm start to end/now"
        )
        rows.append((f"Wall time ({origin})", exact_duration(p.wall_time_s)))
    if p.unaccounted_s is not None:
        flag = (
            f" — exceeds the ~{SETUP_BUDGET_S / 60:.0f} min setup/compilation overhead: investigate"
            if p.unaccounted_s > SETUP_BUDGET_S
            else ""
        )
        rows.append(("Unaccounted time", f"{exact_duration(p.unaccounted_s)}{flag}"))
    return rows


def render_markdown(r: TriageResult) -> str:
    """The Markdown triage report (rule RPT-1)."""
    c = r.cls
    title = str(r.ref.log or r.ref.job_dir or "?")
    out: list[str] = [
        f"## Job triage: {title}",
        "",
        f"**Status:** {r.status}",
        f"**Primary failure:** {c.primary or 'none'}",
        f"**Stage:** {c.stage or 'n/a'}",
        "",
        "### What happened",
        what_happened(r),
        "",
        "### Evidence",
        *_evidence_lines(r),
        *_heartbeat_lines(r),
        "",
        "### Training progress projection",
        "| Metric | Value |",
        "|--------|-------|",
        *(f"| {k} | {v} |" for k, v in _progress_rows(r)),
        "",
        "### TGS analysis",
        *_tgs_lines(r),
        "",
        "### Additional findings",
        *(_finding_lines(r) or ["None."]),
        *_live_lines(r),
        "",
        "### Recommended next steps",
    ]
    if r.next_steps:
        out.extend(f"{i}. {s}" for i, s in enumerate(r.next_steps, 1))
    else:
        out.append("None — the job is healthy.")
    return "\n".join(out) + "\n"


def _evidence_lines(r: TriageResult) -> list[str]:
    """The evidence lines verbatim (rule RPT-1), else the last step line."""
    c = r.cls
    if c.evidence:
        out = ["```"]
        for e in c.evidence[:12]:
            src = e.source.rsplit("/", 2)
            short = "/".join(src[-2:]) if len(src) > 1 else e.source
            out.append(f"{short}:{e.line}: {e.raw or e.text}")  # verbatim (rule RPT-1)
        out.append("```")
        return out
    p = r.progress
    if p.last_step is not None:
        last = next((s for s in reversed(r.steps)), None)
        return [
            f"Last `completed step:` line: step {p.last_step}"
            + (f" ({r.step_source}:{last.line})" if last else "")
        ]
    return ["No failure signature and no completed step line in the log."]


def _heartbeat_lines(r: TriageResult) -> list[str]:
    """The heartbeat checklist's four items (rules HB-1 to HB-5)."""
    hb = r.cls.heartbeat
    if hb is None:
        return []
    stall = "stalled" if hb.stalled else "progressing"
    return [
        "",
        "Heartbeat checklist:",
        f"1. Accused tasks {hb.accused_tasks or '?'} ({', '.join(hb.accused_hosts) or 'hosts unknown'}); "
        f"self-reported (alive): {hb.self_reported or 'none'}.",
        "2. Earlier errors on accused tasks: "
        + (f"`{hb.earlier_error.cls}` at line {hb.earlier_error.line}" if hb.earlier_error else "none"),
        f"3. Training before the error: {stall}"
        + (
            f" (gap {exact_duration(hb.stall_s)} incl. {hb.timeout_s:.0f}s timeout)"
            if hb.stall_s is not None
            else ""
        )
        + f"; phase: {hb.phase}.",
        f"4. Verdict: {hb.verdict}."
        + (" Confirm with TSDB GPU power/utilization before the error." if r.ray else ""),
    ]


def _tgs_lines(r: TriageResult) -> list[str]:
    t = r.tgs
    if t.baseline is None:
        return [f"Not enough steps for a TGS baseline{f' ({t.note})' if t.note else ''}."]
    out = [
        f"- Steady-state ({t.metric}, steps 5–15 after the first): {t.baseline:.6g}",
        f"- Recent (last 10 steps): {t.recent:.6g} ({t.change_pct:+.1f}%)",
        f"- Pattern: {t.pattern}" + (f", steps {t.range}, {t.magnitude}" if t.range else ""),
    ]
    if t.periodic_steps:
        out.append(
            f"- Periodic spikes at checkpoint steps {', '.join(map(str, t.periodic_steps[:8]))}{' …' if len(t.periodic_steps) > 8 else ''} — expected, not a degradation."
        )
    out.append("- Degraded: " + ("**yes** (tgs-degradation)" if t.degraded else "no"))
    return out


def _finding_lines(r: TriageResult) -> list[str]:
    """Every class but the primary, then the notes."""
    c, t = r.cls, r.tgs
    lines: list[str] = []
    for cls in (cls for cls in c.classes if cls != c.primary):
        if cls == FailureClass.TGS_DEGRADATION:
            lines.append(f"- tgs-degradation: TGS {t.magnitude} over steps {t.range} ({t.pattern}).")
        elif cls == FailureClass.CANCELLED:
            lines.append(
                f"- cancelled: {_cancelled_by(c.cancel_reason)} ended the job (the mechanism, not the root cause)."
            )
        else:
            ev = next((e for e in c.evidence if e.cls == cls), None)
            lines.append(f"- {cls}" + (f": line {ev.line}: `{ev.text[:200]}`" if ev else ""))
    lines.extend(f"- {n}" for n in c.notes)
    return lines


def _live_lines(r: TriageResult) -> list[str]:
    """RAY=1 jobs: where the live dashboards are, or that they are gone."""
    if not r.ray:
        return []
    lv = r.live
    out = ["", "### Live dashboards (RAY=1 jobs only)"]
    if lv.tunnel:
        out.append(f"Tunnel: `{lv.tunnel}`")
    out.append(f"Head node: {lv.head_node or 'unknown'}; Prometheus port: {lv.prometheus_port or 'unknown'}")
    if r.status in (JobStatus.RUNNING, JobStatus.HANGING):
        out.append(
            "The job is live: want port forwarding set up to reach the Ray Dashboard (8265), TensorBoard (6006) and Prometheus?"
        )
    else:
        out.append(
            "The job has ended: live dashboards are gone; the persisted TSDB is in the job's prometheus/ directory (`jobdiagd diagnose`)."
        )
    return out


def render_json(r: TriageResult) -> str:
    return jsonsafe.dumps(r.to_dict(), indent=2, sort_keys=False, default=str)


SUMMARY_HEADER = f"{'JOB':<28} {'STATUS':<14} {'PRIMARY':<20} {'STEP':>13} {'STEP_S':>7} {'TGS':>8}"


def render_row(r: TriageResult) -> str:
    p = r.progress
    job = f"{r.job_id or '?'}-{r.job_name or ''}"[:28]
    step = f"{p.last_step if p.last_step is not None else '-'}/{p.total_steps or '?'}"
    tgs = f"{r.tgs.change_pct:+.0f}%" if r.tgs.change_pct is not None else "-"
    st = f"{p.step_time_s:.1f}" if p.step_time_s else "-"
    return f"{job:<28} {r.status:<14} {(r.primary or '-'):<20} {step:>13} {st:>7} {tgs:>8}"
