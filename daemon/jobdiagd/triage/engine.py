"""The triage engine: resolve a job, read its logs, and apply the triage rules (docs/rules.md) to them.

`analyze()` is pure (plain `JobLogs` + `now` in, `TriageResult` out) and is what the
daemon and backtest call on their incrementally-built states; `triage()` adds the I/O
edge (resolution and reading files).

What the daemon knows and a log cannot say comes in as inputs, never as a patch on the result:
its stall policy (`policy`, from `[detectors.hang]`), its Slurm state, and its own clock on a
live job's progress (`stall`, a `StallKnowledge`: since when no step was read, with which
budget; rule VIEW-1). Given those, the triage of a watched job concludes what the daemon pages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from jobdiagd.logs.job import JobLogs, load_job
from jobdiagd.logs.safeopen import LogAccess
from jobdiagd.logs.state import LogState
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.kinds import JobStatus
from jobdiagd.model.records import Restart, RestoreLine, StepRecord
from jobdiagd.model.stepguard import implausible_top
from jobdiagd.model.triage import Live, StallKnowledge, TriageResult
from jobdiagd.rules.hostlist import expand_hostlist, valid_host
from jobdiagd.triage.classify import classify
from jobdiagd.triage.nextsteps import next_steps
from jobdiagd.triage.progress import checkpoint_config, compute_progress, configured_total
from jobdiagd.triage.resolve import job_access, resolve
from jobdiagd.triage.stall import StallPolicy
from jobdiagd.triage.tgs import analyze_tgs

PROMETHEUS_PORTS = range(9190, 9200)


def _live(logs: JobLogs, nodes: list[str]) -> Live:
    m = logs.main
    if m is None or not logs.ray:
        return Live(None, None, None)
    head = m.tunnel_host or m.ray_head or logs.head_host or (nodes[0] if nodes else None)
    if head is not None and (not valid_host(head) or (nodes and head not in nodes)):
        head = nodes[0] if nodes else None
    port = m.prom_port
    if port is None:
        port = next((p for p in m.tunnel_ports if p in PROMETHEUS_PORTS), None)
    return Live(head, port, m.tunnel)


def _training_start(logs: JobLogs) -> float | None:
    """When training started, from a dated BARRIER PASSED line (any of the job's logs)."""
    for st in logs.states:
        if st.barrier_passed is not None and st.barrier_passed.time is not None:
            return st.barrier_passed.time
    return None


@dataclass(frozen=True, slots=True)
class _MergedStates:
    """What every log of the job adds up to: config and env (first file wins), checkpoint saves,
    profiled steps, and the restore line (a real restore wins over "fresh")."""

    config: dict[str, str]
    env: dict[str, str]
    saves: set[int]
    profiled: set[int]
    async_seen: bool
    restore: RestoreLine | None


def _merge_states(logs: JobLogs) -> _MergedStates:
    config: dict[str, str] = {}
    env: dict[str, str] = {}
    saves: set[int] = set()
    profiled: set[int] = set()
    async_seen = False
    restore: RestoreLine | None = None
    for st in logs.states:
        for k, v in st.config.items():
            config.setdefault(k, v)
        for k, v in st.env.items():
            env.setdefault(k, v)
        saves |= set(st.saves) | st.async_saves
        profiled |= st.profiler_steps
        async_seen = async_seen or bool(st.async_saves)
        if st.restore is not None and (restore is None or st.restore.kind == "restored"):
            restore = st.restore
    return _MergedStates(config, env, saves, profiled, async_seen, restore)


def _run_steps(
    main: LogState | None, auth: LogState | None, ignore_steps: Mapping[int, str] | None
) -> tuple[list[StepRecord], dict[int, str], Restart | None]:
    """This run's step records (rule PRJ-10), the implausible steps left out (rule PRJ-11), and
    the restart inside the log that began this run, if any."""
    steps = auth.sorted_steps() if auth is not None else []
    ignored = implausible_top(
        [s.step for s in steps],
        configured_total(main.passthrough() if main else {}, auth.config if auth else {}),
    )
    ignored.update(ignore_steps or {})
    if ignored:
        steps = [s for s in steps if s.step not in ignored]
    restart = auth.restarts[-1] if auth is not None and auth.restarts else None
    if restart is not None:
        # Training restarted inside this log: "this run" is the last one (runbook: steps
        # completed this run); the summed time below still covers every run.
        # Records of the earlier run beyond where this one got to were logged before the restart.
        steps = [s for s in steps if s.step >= restart.step and s.line >= restart.line] or steps
    return steps, ignored, restart


def _job_nodes(main: LogState | None) -> list[str]:
    """The job's hosts, in allocation order (task N runs on nodes[N])."""
    if main is None:
        return []
    raw = main.header.get("JOB_NODELIST") or main.env.get("NODELIST_EXPANDED") or main.env.get("JOB_NODELIST")
    return expand_hostlist(raw.replace(" ", ",")) if raw else []


def _progress_instant(logs: JobLogs, now: float) -> float | None:
    """Where progress's "expected step" is measured (rule PRJ-4): now for a live job, the last
    dated line of an ended or cancelled one; classify() refines the end time."""
    main = logs.main
    if main is not None and (main.summary is not None or main.cancel is not None):
        stamps = [s.last_stamp for s in logs.states if s.last_stamp is not None]
        return max(stamps) if stamps else None
    return now


def _run_notes(main: LogState | None, restart: Restart | None, ignored: Mapping[int, str]) -> list[str]:
    """Notes on what "this run" leaves out: earlier runs in the log, a restart inside it, and
    implausible step lines."""
    notes: list[str] = []
    if main is not None and main.earlier_runs:
        notes.append(
            f"This log also holds {main.earlier_runs} earlier run(s) of the job (requeued, appended to the "
            f"same log); this report covers the last run, from line {main.run_start_line}."
        )
    if restart is not None:
        notes.append(
            f"Training restarted within this log (line {restart.line}: restored from step {restart.step - 1}); "
            f"this run starts at step {restart.step}. The summed training time includes the re-run steps."
        )
    if ignored:
        shown = ", ".join(f"{step} ({why})" for step, why in sorted(ignored.items())[:3])
        more = f" and {len(ignored) - 3} more" if len(ignored) > 3 else ""
        notes.append(f"Implausible step line(s) ignored for progress: {shown}{more}.")
    return notes


def analyze(
    logs: JobLogs,
    *,
    now: float,
    slurm_state: str | None = None,
    policy: StallPolicy | None = None,
    slurm_wall_s: float | None = None,
    ignore_steps: Mapping[int, str] | None = None,
    stall: StallKnowledge | None = None,
) -> TriageResult:
    """`slurm_wall_s` (start to end, or to `now`, per Slurm) stands in for the JOB SUMMARY's
    Wall when the log has no summary: a live or truncated job still gets rule PRJ-7's
    "total training time vs wall time" check. Implausible step lines (`model.stepguard`: past
    the configured total, or far ahead of the step before) are left out of progress and named
    in the notes; `ignore_steps` adds those the daemon judged on its own clock. `stall` is the
    daemon's knowledge of a live job's progress: it decides running or hanging (rule VIEW-1)."""
    main = logs.main
    auth = logs.authoritative()
    steps, ignored, restart = _run_steps(main, auth, ignore_steps)
    passthrough = main.passthrough() if main else {}
    merged = _merge_states(logs)
    nodes = _job_nodes(main)
    summary = main.summary if main else None
    ckpt = checkpoint_config(
        passthrough,
        merged.config,
        sorted(merged.saves),
        async_seen=merged.async_seen,
        profiler_steps=sorted(merged.profiled),
    )
    completed = summary is not None and summary.exit_code == 0
    at_time = _progress_instant(logs, now)
    progress = compute_progress(
        steps,
        passthrough=passthrough,
        config=merged.config,
        restore=merged.restore,
        saves=sorted(merged.saves),
        wall_s=summary.wall_s if summary is not None and summary.wall_s is not None else slurm_wall_s,
        at_time=at_time,
        completed=completed,
        summed_seconds=auth.steps.sum_seconds + auth.superseded_seconds if auth is not None else None,
        # Exact seconds of this run's steps: the whole sum unless training restarted in the log.
        run_seconds=auth.steps.sum_seconds if auth is not None and restart is None else None,
        time_base=_training_start(logs) if steps and all(s.time is None for s in steps[-3:]) else None,
        # A bounded (tailed) state knows the exact seconds since a checkpoint; not across a restart.
        seconds_after=auth.steps.seconds_after if auth is not None and restart is None else None,
    )
    tgs = analyze_tgs(steps, ckpt)
    cls = classify(
        logs,
        steps,
        progress,
        ckpt,
        tgs,
        now=now,
        slurm_state=slurm_state,
        nodes=nodes,
        policy=policy,
        known=stall,
    )
    cls.notes.extend(_run_notes(main, restart, ignored))
    if cls.status == JobStatus.COMPLETED and progress.progress_lost_steps not in (0, None):
        # A soft-success has no exit 0, so progress saw "not completed"; nothing was lost.
        progress = replace(progress, progress_lost_steps=0, progress_lost_s=0.0)
    live = _live(logs, nodes)
    result = TriageResult(
        ref=logs.ref,
        now=now,
        slurm_state=slurm_state,
        nodes=nodes,
        steps=steps,
        ckpt=ckpt,
        progress=progress,
        tgs=tgs,
        cls=cls,
        live=live,
        next_steps=[],
        config={**passthrough},
        env=merged.env,
        step_source=auth.source if auth else None,
        ray=logs.ray,
        header=main.header if main is not None else None,
        summary=summary,
        node_exits=main.node_exits if main is not None else [],
    )
    result.next_steps = next_steps(result)
    return result


def triage(
    path: str | Path,
    *,
    now: float,
    slurm_state: str | None = None,
    outputs_root: Path | list[Path] | None = None,
    policy: StallPolicy | None = None,
    stall: StallKnowledge | None = None,
) -> TriageResult:
    """Resolve `path` (job dir, .log, Slurm/k8s id) and triage it. Raises ResolveError."""
    roots = [outputs_root] if isinstance(outputs_root, Path) else list(outputs_root or [])
    ref = resolve(str(path), roots)
    return triage_ref(
        ref, now=now, slurm_state=slurm_state, policy=policy, access=job_access(ref, roots), stall=stall
    )


def triage_ref(
    ref: JobRef,
    *,
    now: float,
    slurm_state: str | None = None,
    policy: StallPolicy | None = None,
    slurm_wall_s: float | None = None,
    access: LogAccess | None = None,
    stall: StallKnowledge | None = None,
) -> TriageResult:
    """Triage one resolved job. `access` (default: `job_access(ref)`) says which of its files
    may be read; a refused main log raises RefusedFile."""
    logs = load_job(ref, ref_time=now, access=access if access is not None else job_access(ref))
    return analyze(
        logs, now=now, slurm_state=slurm_state, policy=policy, slurm_wall_s=slurm_wall_s, stall=stall
    )
