"""Who may be acted on, and what the action is: pure judgement over plain data (rules REC-1 to REC-10, REC-24).

`decide` takes the job's facts (`Case`), what the store knows of its run (`RunInfo`: was it itself
a restart, of which chain, with how much progress), how many actions the site took in the last
hour, and the nodes node memory already suspects; it returns a `Decision`: the effective mode and
either a `Plan` or the reason nothing is done, each with its rule id. No clock, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from jobdiagd.config import RecoveryConfig
from jobdiagd.rules.hostlist import valid_host
from jobdiagd.rules.recovery import NOT_FAILURES, USER_ERRORS, Family, family_of

# Longest --exclude list a plan carries (a site with hundreds of suspects has a bigger problem).
MAX_EXCLUDE = 64


class Action(StrEnum):
    RETRY_SAME_NODES = "retry-same-nodes"  # rule REC-4
    RETRY_EXCLUDING_SUSPECTS = "retry-excluding-suspects"  # rule REC-5
    RESUBMIT_EXCLUDING_FAILED = "resubmit-excluding-failed-node"  # rule REC-6
    RESUBMIT_RESTORE_CHECKPOINT = "resubmit-restoring-checkpoint"  # rule REC-7


@dataclass(frozen=True, slots=True)
class Case:
    """The job an incident is about, as the daemon sees it when the incident opens (or the job ends)."""

    job_id: str
    owner: str | None
    partition: str | None
    failure_class: str | None  # "hang" for a hang incident; the primary failure class otherwise
    nodes: tuple[str, ...] = ()  # the job's nodes
    last_step: int | None = None
    incident_id: str | None = None
    acked: bool = False
    muted: bool = False
    suspects: tuple[str, ...] = ()  # nodes this diagnosis names (GPU suspects, node-fail hosts ...)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run that a restart started (`recovery_runs`): attempt k of `chain`, replacing `parent`."""

    job_id: str
    attempt: int
    chain: str
    parent: str
    parent_last_step: int | None
    no_progress: int  # restarts of the chain in a row that gained no step, before this run
    family: str
    excluded: tuple[str, ...]
    started_at: float


@dataclass(frozen=True, slots=True)
class Plan:
    """What an action will do; stored as JSON in the intent (plain values only)."""

    job_id: str
    chain: str
    attempt: int  # the attempt number of the run the action starts (1 = first restart)
    family: str
    action: str
    rule: str
    reason: str
    method: str  # "resubmit" | "requeue"
    owner: str | None
    partition: str | None
    exclude: tuple[str, ...] = ()
    nodelist: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    last_step: int | None = None  # the replaced run's last step (progress is counted from it)
    no_progress: int = 0  # the new run's count if it gains nothing: see RunInfo.no_progress
    notes: tuple[str, ...] = ()

    def to_json(self) -> str:
        d = asdict(self)
        d["env"] = dict(self.env)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        raw: dict[str, Any] = json.loads(text)
        for key in ("exclude", "nodelist", "notes"):
            raw[key] = tuple(raw.get(key) or ())
        raw["env"] = {str(k): str(v) for k, v in (raw.get("env") or {}).items()}
        return cls(**raw)


@dataclass(frozen=True, slots=True)
class Decision:
    mode: str  # effective mode: off | suggest | auto | dry-run
    plan: Plan | None
    rule: str
    reason: str

    @property
    def acts(self) -> bool:
        return self.plan is not None and self.mode != "off"


def opted_in(cfg: RecoveryConfig, owner: str | None) -> bool:
    """Rule REC-3: the owner is listed in [recovery] users ("*": everyone) or in a matching override."""
    if not owner:
        return False
    return owner in cfg.users or "*" in cfg.users or any(owner in o.users for o in cfg.overrides)


def effective_mode(cfg: RecoveryConfig, owner: str | None, partition: str | None) -> tuple[str, str]:
    """(mode, rule): rules REC-1 and REC-3. The first override matching owner and partition wins;
    else the site's mode on its partitions. `dry_run` turns `auto` into `dry-run` (rule REC-19)."""
    if not opted_in(cfg, owner):
        return "off", "REC-3"
    mode = None
    for o in cfg.overrides:
        if (not o.users or owner in o.users) and (not o.partitions or partition in o.partitions):
            mode = o.mode
            break
    if mode is None:
        mode = cfg.mode if (not cfg.partitions or partition in cfg.partitions) else "off"
    if mode == "auto" and cfg.dry_run:
        mode = "dry-run"
    return mode, "REC-1"


def _hosts(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted({n for n in names if valid_host(n)}))[:MAX_EXCLUDE]


def _refuse(mode: str, rule: str, reason: str) -> Decision:
    return Decision(mode, None, rule, reason)


def _guard(cfg: RecoveryConfig, case: Case, mode: str) -> Decision | None:
    """Rules REC-2 and REC-9: classes never acted on, incidents people took over."""
    cls = case.failure_class
    if cls in USER_ERRORS:
        return _refuse(mode, "REC-2", f"{cls} is a user error: a restart would fail the same way")
    if cls in NOT_FAILURES or family_of(cls) is None:
        return _refuse(mode, "REC-2", f"{cls or 'no failure class'} is not a class the runbook restarts")
    if case.acked:
        return _refuse(mode, "REC-9", "a person acked the incident")
    if case.muted:
        return _refuse(mode, "REC-9", "the incident is muted")
    return None


def _no_progress(cfg: RecoveryConfig, case: Case, run: RunInfo | None) -> int:
    """Rule REC-8: restarts of the chain that gained fewer than min_progress_steps, in a row."""
    if run is None:
        return 0
    before = run.parent_last_step if run.parent_last_step is not None else -1
    now = case.last_step if case.last_step is not None else -1
    gained = now - before
    return run.no_progress + 1 if gained < cfg.min_progress_steps else 0


def decide(
    cfg: RecoveryConfig,
    case: Case,
    run: RunInfo | None,
    *,
    actions_last_hour: int,
    suspected_nodes: Iterable[str],
    now: float,
) -> Decision:
    """The decision for one incident (see the module docstring)."""
    mode, rule = effective_mode(cfg, case.owner, case.partition)
    if mode == "off":
        why = "recovery is off for this job" if rule == "REC-1" else "the job's owner has not opted in"
        return _refuse(mode, rule, why)
    refused = _guard(cfg, case, mode)
    if refused is not None:
        return refused
    no_progress = _no_progress(cfg, case, run)
    if no_progress >= cfg.max_no_progress_restarts:
        return _refuse(
            mode,
            "REC-8",
            f"the chain made no progress in its last {no_progress} restart(s) "
            f"(limit {cfg.max_no_progress_restarts}): left to people",
        )
    if actions_last_hour >= cfg.max_actions_per_hour:
        return _refuse(
            mode, "REC-10", f"site-wide limit of {cfg.max_actions_per_hour} restarts per hour reached"
        )
    return Decision(mode, _plan(cfg, case, run, no_progress, suspected_nodes, now), "", "")


def _plan(
    cfg: RecoveryConfig,
    case: Case,
    run: RunInfo | None,
    no_progress: int,
    suspected_nodes: Iterable[str],
    now: float,
) -> Plan:
    family = family_of(case.failure_class)
    assert family is not None  # _guard refused the others
    known = set(_hosts(suspected_nodes))  # rule REC-24: already under suspicion
    env: dict[str, str] = {}
    notes: list[str] = []
    nodelist: tuple[str, ...] = ()
    recurrence = (
        family is Family.HANG
        and run is not None
        and run.family == Family.HANG
        and now - run.started_at <= cfg.recurrence_window_seconds
    )
    if family is Family.HANG and not recurrence:
        action, rule = Action.RETRY_SAME_NODES, "REC-4"
        exclude = _hosts(known)
        reason = "hang: kill, retry on the same nodes (hangs are often transient RCCL races)"
        if cfg.retry_same_nodes:
            nodelist = _hosts(n for n in case.nodes if n not in known)
    elif family is Family.HANG:
        action, rule = Action.RETRY_EXCLUDING_SUSPECTS, "REC-5"
        assert run is not None
        exclude = _hosts({*case.suspects, *run.excluded, *known})
        env["NCCL_DEBUG"] = "INFO"
        reason = "hang recurred within the recurrence window: exclude the suspect nodes, NCCL_DEBUG=INFO"
        if not case.suspects:
            notes.append("no suspect node named by this hang's diagnosis")
    elif family is Family.NODE:
        action, rule = Action.RESUBMIT_EXCLUDING_FAILED, "REC-6"
        exclude = _hosts({*case.suspects, *known})
        reason = f"{case.failure_class}: resubmit excluding the failed node"
        if not case.suspects:
            notes.append("the diagnosis names no failed node: nothing to exclude but known suspects")
    else:
        action, rule = Action.RESUBMIT_RESTORE_CHECKPOINT, "REC-7"
        exclude = _hosts(known)
        reason = "checkpoint-fs-error: resubmit; the rerun restores the newest intact checkpoint"
    if cfg.method == "requeue" and env:
        notes.append("requeue keeps the job's environment: NCCL_DEBUG=INFO is not applied")
        env = {}
    if known & set(case.nodes):
        notes.append("excluded as already under suspicion: " + ", ".join(sorted(known & set(case.nodes))))
    chain = run.chain if run is not None else case.job_id
    return Plan(
        job_id=case.job_id,
        chain=chain,
        attempt=(run.attempt if run is not None else 0) + 1,
        family=str(family),
        action=str(action),
        rule=rule,
        reason=reason,
        method=cfg.method,
        owner=case.owner,
        partition=case.partition,
        exclude=exclude,
        nodelist=nodelist,
        env=env,
        last_step=case.last_step,
        no_progress=no_progress,
        notes=tuple(notes),
    )
