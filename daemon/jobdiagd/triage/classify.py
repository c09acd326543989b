"""Status and failure classification (runbook steps 3–4, hang/heartbeat/cascade rules), pure.

Primary-failure rules, in order (rules CL-1 to CL-9 of docs/rules.md; decisions are marked *):
1. No log at all -> `prolog-kill-no-log`.
2. JOB SUMMARY FAILED with exit 1/143 but `completed step: T-1` -> status completed,
   primary `soft-success`, only when the ranks' exits match a variant: (a) one rank exits 1,
   (b)/(c) every rank exits 143 (c: at the time limit). Other exit patterns, exit 130, or a
   root-cause failure logged by several ranks (e.g. the final checkpoint) -> a failure.
3. Infrastructure / stage-timeout signatures (the job never trained) -> the earliest one.
   `ray-start-fail` is advisory only (Ray falls back to non-Ray mode).
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
*Slurm's `CANCELLED AT ... DUE TO TIME LIMIT` is a train-timeout (rule CL-TRAIN-TIMEOUT, signature
family TT-slurm); after a stall it is a hang killed by the time limit (rule 6).
*The primary's description follows the wording family of its earliest evidence
(`signatures.describe`): an NCCL error is described as an error, not a collective timeout.
*Every primary has its evidence in `evidence` (and so in the JSON failures list): the
cancel line (or the JOB SUMMARY Status line) for `cancelled`, srun's Killed / preemption
lines for `unknown-death`, XLA's rendezvous watchdog lines for `hang`.
"""

from __future__ import annotations

import re
from dataclasses import replace

from jobdiagd.logs.job import JobLogs
from jobdiagd.logs.prefixes import Stamp, parse_full_stamp
from jobdiagd.logs.state import LogState
from jobdiagd.model.records import Evidence, StepRecord
from jobdiagd.model.triage import (
    CheckpointConfig,
    Classification,
    HeartbeatInfo,
    Progress,
    Stall,
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
        return Stall(gap > limit, gap, limit, budget.phase, "timestamps")
    if progress.unaccounted_s is not None and steps:
        over = progress.unaccounted_s - max(SETUP_BUDGET_S, setup_s or 0.0)
        return Stall(over > limit, over, limit, budget.phase, "wall-time")
    return Stall(False, None, limit, budget.phase, "none")


def _heartbeat_timeout_s(passthrough: dict[str, str], config: dict[str, str]) -> float:
    for src in (config, passthrough):
        raw = src.get("jax_distributed_heartbeat_timeout_seconds")
        if raw:
            try:
                return float(raw.strip().strip("\"'"))
            except ValueError:
                continue
    return DEFAULT_HEARTBEAT_TIMEOUT_S


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
) -> Classification:
    policy = policy or StallPolicy()
    if logs.ref.problem == "prolog-kill-no-log" or logs.main is None:
        ev: list[Evidence] = []
        why = [*logs.errors, *([logs.ref.note] if logs.ref.note else [])]
        return Classification(
            "failed", "prolog-kill-no-log", "Slurm prolog", ev, ["prolog-kill-no-log"], notes=why
        )
    main = logs.main
    states = {s.source: s for s in logs.states}
    summary = main.summary
    passthrough = main.passthrough()
    config = {**main.config}
    for st in logs.states:
        for k, v in st.config.items():
            config.setdefault(k, v)

    # ---- gather hits ------------------------------------------------------------------
    hits: dict[str, list[Evidence]] = {}
    for st in logs.states:
        for cls, h in st.hits.items():
            hits.setdefault(cls, []).extend(h.all())
    # Evidence-only rows (XLA's rendezvous watchdog) describe a derived class; never a class.
    derived_ev: dict[str, list[Evidence]] = {c: hits.pop(c) for c in EVIDENCE_CLASSES if c in hits}
    cancelled = (summary is not None and summary.exit_code in CANCEL_EXITS) or (
        summary is None and main.cancel is not None
    )
    if "node-fail" in hits:
        kept = [e for e in hits["node-fail"] if not _exit_is(e.text, CANCEL_EXITS)]
        if kept:
            hits["node-fail"] = kept
        else:
            del hits["node-fail"]  # harmless: clean SIGTERM on every node
    if cancelled:
        for cls in ("stage-fail", "subprocess-fail", "signal-kill"):
            if cls in hits:
                kept = [
                    e
                    for e in hits[cls]
                    if not _exit_is(e.text, CANCEL_EXITS | {15}) and "SIGTERM" not in e.text
                ]
                if kept:
                    hits[cls] = kept
                else:
                    del hits[cls]
    cancel_notes: list[str] = []
    if cancelled and main.cancel is not None:
        dropped = _drop_after_cancel(hits, main)
        if dropped:
            cancel_notes.append(
                f"{dropped} error line(s) printed after the cancel (tasks dying from the SIGTERM) "
                "are consequences of the cancel, not its cause."
            )
    if "xla-compile-fail" in hits and "signal-kill" in hits:
        # The abort after a compiler fatal is its consequence (LLVM / ptxas / CHECK abort).
        kept = [e for e in hits["signal-kill"] if not _is_abort(e.text)]
        if kept:
            hits["signal-kill"] = kept
        else:
            del hits["signal-kill"]
    for evs in (*hits.values(), *derived_ev.values()):
        evs.sort(key=lambda e: (e.source != main.source, e.line))

    classes = sorted(hits, key=lambda c: _ORDER.get(c, 99))
    notes: list[str] = [*logs.errors, *cancel_notes]
    end_time = _end_time(logs)
    last_step_time = progress.last_step_time

    infra = [hits[c][0] for c in classes if BY_CLASS.get(c) is not None and BY_CLASS[c].tier is Tier.INFRA]
    # A failed pre-training stage (Preflight, Docker pull, ECC check) means the job never trained:
    # it outranks the NODE_EXIT that carried it.
    infra += [e for e in hits.get("stage-fail", []) if "== Training " not in e.text][:1]
    advisory = [
        hits[c][0] for c in classes if BY_CLASS.get(c) is not None and BY_CLASS[c].tier is Tier.ADVISORY
    ]

    setup_s = _measured_setup_s(logs, steps)

    # ---- status ---------------------------------------------------------------------------
    state_up = (slurm_state or "").upper().split()[0] if slurm_state else ""
    alive = state_up in ALIVE_STATES
    status: str
    soft: str | None = None
    if summary is not None and summary.exit_code is not None:
        if summary.exit_code == 0 and summary.status != "FAILED":
            status = "completed"
        elif progress.reached_end and (variant := _soft_variant(main, summary.exit_code, hits)) is not None:
            status = "completed"
            soft = variant
        elif summary.exit_code in CANCEL_EXITS:
            status = "cancelled"
        else:
            status = "failed"
    elif summary is not None and summary.status == "SUCCESS":
        status = "completed"
    elif progress.reached_end and not alive:
        # RAY=1 truncation can hide the summary's context; the worker log says training finished.
        status = "completed"
        notes.append("No JOB SUMMARY, but the authoritative step record reached the final step.")
    else:
        recent = _stall(
            steps,
            progress,
            ckpt,
            policy,
            now,
            barrier_time=_barrier_time(main),
            setup_s=setup_s,
        )
        advancing = recent.basis == "timestamps" and not recent.stalled
        if infra and not steps and not alive:
            status = "failed"  # an infrastructure failure before training; the summary may be missing
        elif alive:
            status = "hanging" if recent.stalled else "running"
        elif advancing and not slurm_state:
            status = "running"
        else:
            status = "unknown-death"

    if soft == "c" and "train-timeout" in hits:
        # Soft-success (c) *is* the walltime cancel after the last step: its evidence, not a
        # failure of its own.
        derived_ev["soft-success"] = [
            replace(e, cls="soft-success") for e in hits["train-timeout"] if e.rule == "TT-slurm"
        ]
        hits["train-timeout"] = [e for e in hits["train-timeout"] if e.rule != "TT-slurm"]
        if not hits["train-timeout"]:
            del hits["train-timeout"]
            classes = [c for c in classes if c != "train-timeout"]
    killed = [e for e in hits.get("node-fail", []) if e.rule == "NODE-srun-killed"]
    if killed and (status == "unknown-death" or "oom-host" in hits):
        # srun's `task N: Killed`: with an OOM report it is the OOM kill itself (runbook oom-host:
        # "Killed (from OOM killer)"); without a JOB SUMMARY, the unknown-death checklist's
        # evidence of an external kill.
        if "oom-host" in hits:
            hits["oom-host"] = sorted(
                [*hits["oom-host"], *(replace(e, cls="oom-host") for e in killed)],
                key=lambda e: (e.source != main.source, e.line),
            )
        else:
            derived_ev.setdefault("unknown-death", []).extend(replace(e, cls="unknown-death") for e in killed)
        rest = [e for e in hits["node-fail"] if e.rule != "NODE-srun-killed"]
        if rest:
            hits["node-fail"] = rest
        else:
            del hits["node-fail"]
            classes = [c for c in classes if c != "node-fail"]
    if status == "unknown-death" and main.cancel_evidence is not None:  # checklist item 3: preemption
        derived_ev.setdefault("unknown-death", []).append(replace(main.cancel_evidence, cls="unknown-death"))
    cancel_ev = _cancel_evidence(main) if status == "cancelled" else None
    if cancel_ev is not None:
        derived_ev["cancelled"] = [cancel_ev]

    # ---- stall before the end --------------------------------------------------------------
    at: float | None
    if status in ("running", "hanging"):
        at = now
    elif main.cancel is not None and (t := _cancel_instant(main)) is not None:
        at = t
    else:
        at = end_time
    stall = _stall(
        steps,
        progress,
        ckpt,
        policy,
        at,
        barrier_time=_barrier_time(main),
        setup_s=setup_s,
    )
    if status == "hanging":
        stall.stalled = True

    # ---- candidates ----------------------------------------------------------------------------
    def live_hits(tiers: tuple[Tier, ...]) -> list[Evidence]:
        out = []
        for cls in classes:
            sig = BY_CLASS.get(cls)
            if sig is None or sig.tier not in tiers:
                continue
            for e in hits[cls]:
                if not _survived(e, states, last_step_time):
                    out.append(e)
                    break
        return out

    primary: str | None = None
    hb_info: HeartbeatInfo | None = None

    if soft is not None:
        primary = "soft-success"
    elif infra and not steps:
        primary = min(infra, key=_pos).cls
    else:
        roots = [e for e in live_hits((Tier.ROOT,)) if e.cls not in ("heartbeat-timeout", "train-timeout")]
        symptoms = live_hits((Tier.SYMPTOM,))
        carriers = live_hits((Tier.CARRIER,))
        hb = _merged_heartbeat(logs) if "heartbeat-timeout" in hits else None
        if hb is not None:
            hb_info = _heartbeat_checklist(
                hb,
                roots + symptoms + carriers,
                steps,
                progress,
                ckpt,
                policy,
                passthrough,
                config,
                nodes,
                main,
            )
        if hb_info is not None and hb_info.verdict == "true-positive" and hb_info.earlier_error is not None:
            primary = _pick(roots, symptoms, carriers) or hb_info.earlier_error.cls
        elif hb_info is not None and hb_info.verdict == "hang":
            primary = "hang"
        elif roots:
            primary = _pick(roots, [], [])
        elif hb_info is not None:
            primary = "heartbeat-timeout"
        elif "train-timeout" in hits:
            primary = "hang" if stall.stalled else "train-timeout"
        elif symptoms:
            primary = _pick([], symptoms, [])
        elif status in ("hanging",) or (status == "cancelled" and stall.stalled):
            primary = "hang"
        elif carriers and status not in ("completed",):
            primary = _pick([], [], carriers)
        elif status == "cancelled":
            primary = "cancelled"
        elif status == "unknown-death":
            primary = "unknown-death"
        elif infra and status == "failed":
            primary = min(infra, key=_pos).cls
        elif status == "running" and tgs.degraded:
            primary = "tgs-degradation"
        if status == "completed" and soft is None:
            primary = None
        if primary is None and advisory:
            primary = advisory[0].cls  # e.g. ray-start-fail: the only thing that went wrong
        if status == "failed" and primary is None:
            primary = "stage-fail" if any(s.kind == "FAILED" for s in main.stages) else None

    if status == "hanging" and primary not in (None, "hang") and BY_CLASS.get(primary or "") is not None:
        notes.append("Training stopped after the error above; the remaining tasks are hung waiting for it.")

    # ---- unknown-death extras ---------------------------------------------------------------------
    if status == "unknown-death":
        if not main.ends_with_newline:
            notes.append(
                "The log ends mid-line: the process was killed abruptly (SIGKILL / OOM-kill) without cleanup."
            )
        if state_up in ("PREEMPTED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"):
            notes.append(f"Slurm reports the job {state_up}.")
    evidence = _evidence_order(primary, hits, classes, derived_ev)
    primary_rule = next((e.rule for e in evidence if e.cls == primary), None)
    stage = _stage(primary, main, steps)
    all_classes = list(classes)
    for derived in (primary,):
        if derived and derived not in all_classes:
            all_classes.insert(0, derived)
    if tgs.degraded and "tgs-degradation" not in all_classes:
        all_classes.append("tgs-degradation")
    if status == "cancelled" and "cancelled" not in all_classes:
        all_classes.append("cancelled")
    return Classification(
        status,
        primary,
        stage,
        evidence,
        all_classes,
        notes,
        hb_info,
        stall,
        soft,
        at,
        primary_rule,
        _cancel_reason(main) if status == "cancelled" else None,
    )


def _is_abort(text: str) -> bool:
    return "SIGABRT" in text or "Aborted" in text or "signal 6)" in text


def _cancel_reason(main: LogState) -> str | None:
    """`TIME LIMIT`, `PREEMPTION`, `JOB REQUEUE`, `NODE FAILURE, ...` from Slurm's cancel line."""
    if main.cancel is None:
        return None
    m = re.search(r"DUE TO (.+?)(?: on \S+)?\s*$", main.cancel[2], re.IGNORECASE)
    return m.group(1).strip().upper() if m else None


def _cancel_evidence(main: LogState) -> Evidence | None:
    """The line that says the job was cancelled: Slurm's cancel line, else the summary's Status."""
    if main.cancel_evidence is not None:
        return replace(main.cancel_evidence)
    summ = main.summary
    if summ is None or summ.status_text is None:
        return None
    text = f"Status: {summ.status_text}"
    return Evidence("cancelled", summ.status_line or summ.line, 0, main.source, None, None, text, None, text)


def _measured_setup_s(logs: JobLogs, steps: list[StepRecord]) -> float | None:
    """Seconds from the earliest dated line of the job to its first dated step, if both exist."""
    first_step = steps[0].time if steps else None
    starts = [s.first_stamp for s in logs.states if s.first_stamp is not None]
    if first_step is None or not starts or min(starts) >= first_step:
        return None
    return first_step - min(starts)


def _barrier_time(main: LogState) -> float | None:
    for mark in (main.barrier_passed, main.barrier_sync):
        if mark is not None and mark[1] is not None:
            return mark[1]
    return None


def _exit_is(text: str, codes: frozenset[int] | set[int]) -> bool:
    m = _EXIT_RE.search(text)
    return m is not None and int(m.group(1)) in codes


def _pos(e: Evidence) -> tuple[float, int, int]:
    return (e.time if e.time is not None else float("inf"), _ORDER.get(e.cls, 99), e.line)


def _pick(roots: list[Evidence], symptoms: list[Evidence], carriers: list[Evidence]) -> str | None:
    for group in (roots, symptoms, carriers):
        if group:
            # Earliest wins: by timestamp when every hit has one, else by line within the main log.
            if all(e.time is not None for e in group):
                return min(group, key=lambda e: (e.time or 0.0, _ORDER.get(e.cls, 99))).cls
            same = {e.source for e in group}
            if len(same) == 1:
                return min(group, key=lambda e: (e.line, _ORDER.get(e.cls, 99))).cls
            return min(group, key=lambda e: _ORDER.get(e.cls, 99)).cls
    return None


def _merged_heartbeat(logs: JobLogs) -> LogState | None:
    best: LogState | None = None
    for st in logs.states:
        if st.heartbeat is not None and (best is None or best.heartbeat is None or st is logs.main):
            best = st
    return best


def _heartbeat_checklist(
    hb_state: LogState,
    errors: list[Evidence],
    steps: list[StepRecord],
    progress: Progress,
    ckpt: CheckpointConfig,
    policy: StallPolicy,
    passthrough: dict[str, str],
    config: dict[str, str],
    nodes: list[str],
    main: LogState,
) -> HeartbeatInfo:
    hb = hb_state.heartbeat
    assert hb is not None
    accused = set(hb.accused_tasks)
    for st in [main]:
        if st.heartbeat is not None:
            accused |= st.heartbeat.accused_tasks
    timeout = _heartbeat_timeout_s(passthrough, config)
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
        if not before or e.cls in ("heartbeat-timeout",) or e.carries == "heartbeat-timeout":
            continue
        if e.task is None or e.task in accused or not accused:
            earlier = e
            break
        if earlier is None:
            earlier = e
    if earlier is None:
        earlier = _killed_before(main, first, accused, nodes)
    # Item 3: stall before the error.
    stall = _stall(steps, progress, ckpt, policy, first.time, extra_s=timeout)
    phase = "init" if not steps else "mid-training"
    verdict = "false-positive"
    if earlier is not None:
        verdict = "true-positive"
    elif stall.stalled and steps:
        verdict = "hang"
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
    for host, text, code, _line in main.srun_errors:
        if code is not None and host not in out and "task" in text:
            out[host] = code
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
    for host, text, code, line in main.srun_errors:
        if line >= first.line:
            break
        if not ("Killed" in text or "signal" in text.lower() or code in (9, 134, 137, 139)):
            continue
        m = _SRUN_TASKS.search(": " + text)
        tasks = set(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1)) if m else set()
        if (tasks & accused) or host in hosts or not accused:
            task = min(tasks & accused) if tasks & accused else None
            return Evidence(
                "node-fail", line, 0, main.source, task, host, f"srun: error: {host}: {text}", None
            )
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
        if sig is None or sig.tier is not Tier.ROOT or cls in ("heartbeat-timeout", "train-timeout"):
            continue
        if len({e.task if e.task is not None else e.source for e in evs}) > 1:
            return None
    if cascade:
        reason = " ".join(
            filter(None, [main.cancel[2] if main.cancel else "", main.summary.reason if main.summary else ""])
        )
        if "TIME LIMIT" in reason.upper() or "TIMEOUT" in reason.upper():
            return "c"
        return "b"
    return "a"


def _drop_after_cancel(hits: dict[str, list[Evidence]], main: LogState) -> int:
    """Remove the hits logged after the Slurm cancel line (or dated after it in other files):
    ranks dying from the SIGTERM print tracebacks, NCCL resets and actor deaths. Returns how
    many were dropped. Runbook: "check for *preceding* errors"."""
    assert main.cancel is not None
    line = main.cancel[3]
    at = _cancel_time(main.cancel[1], main)
    dropped = 0
    for cls in list(hits):
        kept = [
            e
            for e in hits[cls]
            if not (
                (e.source == main.source and e.line > line)
                or (e.source != main.source and at is not None and e.time is not None and e.time >= at - 1)
            )
        ]
        dropped += len(hits[cls]) - len(kept)
        if kept:
            hits[cls] = kept
        else:
            del hits[cls]
    return dropped


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
    at = _cancel_time(main.cancel[1], main)
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
        take(derived.get(primary, []) if primary in derived else hits.get(primary, []), 6)
    for cls in classes:
        if cls != primary:
            take(hits[cls], 3)
    if primary != "cancelled" and "cancelled" in derived:
        take(derived["cancelled"], 1)
    return out


def _stage(primary: str | None, main: LogState, steps: list[StepRecord]) -> str | None:
    if primary is None or primary == "soft-success":
        return None
    sig = BY_CLASS.get(primary)
    if primary == "stage-fail":
        failed = [s for s in main.stages if s.kind == "FAILED"]
        return failed[-1].stage if failed else None
    if sig is not None and sig.stage:
        if sig.stage == "Training" and not steps:
            return "Training (before the first step: startup/compilation)"
        return sig.stage
    if primary == "hang":
        if not steps:
            return (
                "Training (init: first collective after the barrier)"
                if main.barrier_passed or main.barrier_sync
                else "Training (startup)"
            )
        return "Training"
    if primary in ("unknown-death", "cancelled", "tgs-degradation"):
        return "Training" if steps else None
    # A carrier without a stage of its own (node-fail, ...): the stage the job script says failed.
    failed = [s for s in main.stages if s.kind in ("FAILED", "TIMEOUT")]
    if failed:
        return failed[-1].stage
    return "Training" if steps else None
