"""Suspect-node memory across jobs (rules REC-20 to REC-23).

Every diagnosis that names nodes is recorded per (node, job, kind of evidence) with its failure
class and weight (`suspects_from`, pure). A node's score is the sum of its weights, each halved
every `node_half_life_days`; past `node_notice_score` operators get one notice per node (an edge:
re-armed only once the score fell below half the threshold), with the exact `scontrol update
NodeName=… State=DRAIN Reason=…` line; a Drain button (operators only) runs that line through
`drain`, logged like every recovery action. Past `node_exclude_score` the recovery policy
excludes the node from the first retry too (rule REC-24).
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobdiagd.alerts.store import AlertStore
from jobdiagd.durations import rounded_duration
from jobdiagd.model.alerts import Finding
from jobdiagd.model.kinds import FailureClass, IncidentKind
from jobdiagd.model.triage import TriageResult
from jobdiagd.recovery.book import LogEntry, RecoveryBook
from jobdiagd.recovery.slurm_ops import SlurmOps
from jobdiagd.rules.hostlist import valid_host
from jobdiagd.rules.recovery import (
    EVIDENCE_WEIGHTS,
    HARDWARE_CLASSES,
    NOT_FAILURES,
    PLAYBOOK_EVIDENCE,
    USER_ERRORS,
    Evidence,
)
from jobdiagd.tsdb.gpu_hang import GpuVerdict
from jobdiagd.tsdb.playbooks.base import Finding as PbFinding
from jobdiagd.tsdb.playbooks.base import PlaybookResult, Verdict

HORIZON_HALF_LIVES = 10  # older evidence weighs under 0.1 %: not read, and pruned
_MAX_EVIDENCE_TEXT = 300
# Exit codes of tasks srun stopped because another task failed (--kill-on-bad-exit: SIGTERM,
# 143) or a person interrupted (130): consequences of the failure, not evidence against the node.
_CONSEQUENCE_EXITS = frozenset({0, 130, 143})


@dataclass(frozen=True, slots=True)
class NodeEvidence:
    node: str
    kind: str  # rules.recovery.Evidence
    failure_class: str
    weight: float
    evidence: str


def _ev(node: str, kind: Evidence, cls: str, text: str) -> NodeEvidence:
    return NodeEvidence(node, str(kind), cls, EVIDENCE_WEIGHTS[kind], text[:_MAX_EVIDENCE_TEXT])


def _from_verdict(verdict: GpuVerdict) -> list[NodeEvidence]:
    if not verdict.confirmed:
        return []
    return [_ev(h, Evidence.HANG_SUSPECT, FailureClass.HANG, verdict.summary) for h in verdict.suspects]


def _from_finding(finding: Finding) -> list[NodeEvidence]:
    """The page's `suspect host` fact: a hang's GPU suspects, or a TGS slide's slow host (the
    comparison of the job's hosts on the site Prometheus or a RAY=1 job's own, rules SLOW-5 and
    SLOW-6)."""
    text = str(finding.details.get("suspect host", ""))
    hosts = [h.strip() for h in text.split(",")]
    slow = finding.kind == IncidentKind.TGS_DEGRADATION
    kind = Evidence.SLOW_HOST if slow else Evidence.HANG_SUSPECT
    cls = finding.kind if slow else (finding.failure_class or finding.kind)
    return [_ev(h, kind, cls, f"{finding.summary}") for h in hosts if h and valid_host(h)]


def _from_triage(res: TriageResult) -> list[NodeEvidence]:
    cls = res.cls.primary
    if cls is None or cls not in HARDWARE_CLASSES:
        return []
    kind = {
        FailureClass.NODE_FAIL: Evidence.NODE_FAIL,
        FailureClass.ECC_TIMEOUT: Evidence.ECC,
    }.get(cls, Evidence.NODE_EXIT)
    return [
        _ev(e.host, kind, cls, f"NODE_EXIT host={e.host} exit={e.exit_code} (log line {e.line})")
        for e in res.node_exits
        if e.exit_code not in _CONSEQUENCE_EXITS
    ]


def _from_playbook(pr: PlaybookResult) -> list[NodeEvidence]:
    kind = PLAYBOOK_EVIDENCE.get(pr.playbook)
    if kind is None or not pr.applicable or pr.verdict == Verdict.HEALTHY:
        return []
    hosts = set(pr.anomalous_hosts)
    for f in pr.findings:
        if f.severity in ("warning", "critical"):
            hosts |= set(f.hosts)
    text = pr.root_cause or f"{pr.playbook} playbook: {pr.verdict}"
    cls = FailureClass.HANG if kind is Evidence.HANG_SUSPECT else f"{pr.playbook}-playbook"
    return [_ev(h, kind, cls, text) for h in sorted(hosts)]


def suspects_from_diagnosis(doc: Mapping[str, Any] | None) -> list[NodeEvidence]:
    """The nodes a TSDB diagnosis names, as `jobdiagd diagnose --json` writes it (a failed RAY=1
    job's end-of-job playbook, rule END-4): its playbook's anomalous hosts and the hosts of its
    warning and critical findings (rule REC-20). [] for an error, a log-only diagnosis, or a
    document that does not read."""
    if not doc or not doc.get("playbook") or not doc.get("verdict"):
        return []
    try:
        result = PlaybookResult(
            playbook=str(doc["playbook"]),
            analysis_type=str(doc.get("analysis_type", "")),
            verdict=doc["verdict"],
            window=(0.0, 0.0),
            findings=[
                PbFinding(
                    str(f.get("title", "")),
                    "",
                    str(f.get("severity", "info")),
                    tuple(str(h) for h in f.get("hosts") or ()),
                )
                for f in doc.get("findings") or ()
                if isinstance(f, Mapping)
            ],
            anomalous_hosts=[str(h) for h in doc.get("anomalous_hosts") or ()],
            root_cause=str(doc.get("root_cause") or ""),
        )
    except (ValueError, TypeError):
        return []
    return suspects_from(playbooks=[result])


def suspects_from(
    *,
    triage: TriageResult | None = None,
    finding: Finding | None = None,
    verdict: GpuVerdict | None = None,
    playbooks: Iterable[PlaybookResult] = (),
) -> list[NodeEvidence]:
    """The nodes a diagnosis names, with kind, class and weight (rule REC-20). User errors and
    non-failures name no node: a job that failed on its own code says nothing about the node."""
    classes = {triage.cls.primary if triage is not None else None, finding.failure_class if finding else None}
    if classes & (USER_ERRORS | NOT_FAILURES):
        return []  # (a TGS slide's slow host is named by its finding's kind, not a failure class)
    found: list[NodeEvidence] = []
    if verdict is not None:
        found += _from_verdict(verdict)
    if finding is not None:
        found += _from_finding(finding)
    if triage is not None:
        found += _from_triage(triage)
    for pr in playbooks:
        found += _from_playbook(pr)
    best: dict[tuple[str, str], NodeEvidence] = {}
    for e in found:
        if valid_host(e.node) and (key := (e.node, e.kind)) not in best:
            best[key] = e
    return sorted(best.values(), key=lambda e: (e.node, e.kind))


@dataclass(frozen=True, slots=True)
class NodeRecord:
    job_id: str
    kind: str
    failure_class: str
    weight: float
    evidence: str
    at: float


@dataclass(frozen=True, slots=True)
class NodeSuspect:
    node: str
    score: float
    records: tuple[NodeRecord, ...] = field(default_factory=tuple)

    @property
    def jobs(self) -> list[str]:
        return sorted({r.job_id for r in self.records}, key=lambda j: (len(j), j))


@dataclass(frozen=True, slots=True)
class NodeNotice:
    node: str
    score: float
    text: str
    drain_command: str


def drain_reason(s: NodeSuspect, now: float) -> str:
    return f"jobdiagd: {summary(s, now)}"[:200]


def summary(s: NodeSuspect, now: float) -> str:
    """ "in 3 hangs of 3 jobs in 48 h": what a node's record says, for people."""
    by_class = Counter(r.failure_class for r in s.records)
    parts = [
        f"{n} {cls}s" if cls == FailureClass.HANG and n > 1 else f"{n} {cls}"
        for cls, n in by_class.most_common()
    ]
    first = min((r.at for r in s.records), default=now)
    span = rounded_duration(max(now - first, 60.0))
    return f"in {', '.join(parts)} of {len(s.jobs)} job(s) in {span}"


class NodeMemory:
    def __init__(self, store: AlertStore, *, half_life_days: float) -> None:
        self.store = store
        self.half_life_s = half_life_days * 86400.0

    def record(self, job_id: str, evidence: Iterable[NodeEvidence], at: float) -> int:
        rows = [
            (e.node, job_id, e.kind, e.failure_class, e.weight, e.evidence, at)
            for e in evidence
            if valid_host(e.node)
        ]
        if rows:
            with self.store.transaction() as conn:
                # One row per (node, job, kind): a finding seen again on the next tick is not new.
                conn.executemany(
                    "INSERT OR IGNORE INTO node_evidence (node, job_id, kind, failure_class, weight, evidence, at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
        return len(rows)

    def _decay(self, at: float, now: float) -> float:
        return float(0.5 ** (max(now - at, 0.0) / self.half_life_s))

    def suspects(self, now: float, min_score: float = 0.0) -> list[NodeSuspect]:
        """Nodes by score (rule REC-21), highest first, each with the records behind it."""
        since = now - HORIZON_HALF_LIVES * self.half_life_s
        rows = self.store.conn.execute(
            "SELECT node, job_id, kind, failure_class, weight, evidence, at FROM node_evidence"
            " WHERE at >= ? ORDER BY at",
            (since,),
        ).fetchall()
        by_node: dict[str, list[NodeRecord]] = {}
        for r in rows:
            by_node.setdefault(str(r["node"]), []).append(
                NodeRecord(
                    str(r["job_id"]),
                    str(r["kind"]),
                    str(r["failure_class"]),
                    float(r["weight"]),
                    str(r["evidence"]),
                    float(r["at"]),
                )
            )
        out = []
        for node, recs in by_node.items():
            score = sum(r.weight * self._decay(r.at, now) for r in recs)
            if score >= min_score:
                out.append(NodeSuspect(node, round(score, 3), tuple(recs)))
        return sorted(out, key=lambda s: (-s.score, s.node))

    def suspected(self, now: float, threshold: float) -> set[str]:
        return {s.node for s in self.suspects(now, threshold)}

    def notices(self, now: float, threshold: float) -> list[NodeNotice]:
        """Nodes newly past `threshold` (rule REC-22): one notice each until the score falls below
        half of it (then the node may be noticed again)."""
        scores = {s.node: s for s in self.suspects(now)}
        active = {
            str(r["node"])
            for r in self.store.conn.execute("SELECT node FROM node_notices WHERE cleared_at IS NULL")
        }
        out: list[NodeNotice] = []
        with self.store.transaction() as conn:
            for node in sorted(active):
                s = scores.get(node)
                if s is None or s.score < threshold / 2:
                    conn.execute("UPDATE node_notices SET cleared_at = ? WHERE node = ?", (now, node))
            for node, s in scores.items():
                if s.score < threshold or node in active:
                    continue
                conn.execute(
                    "INSERT INTO node_notices (node, noticed_at, score, cleared_at) VALUES (?, ?, ?, NULL)"
                    " ON CONFLICT (node) DO UPDATE SET noticed_at = excluded.noticed_at,"
                    " score = excluded.score, cleared_at = NULL",
                    (node, now, s.score),
                )
                argv = SlurmOps.drain_argv(node, drain_reason(s, now))
                out.append(NodeNotice(node, s.score, f"{node} {summary(s, now)}", shlex.join(argv)))
        return out

    def prune(self, now: float) -> int:
        with self.store.transaction() as conn:
            cur = conn.execute(
                "DELETE FROM node_evidence WHERE at < ?", (now - HORIZON_HALF_LIVES * self.half_life_s,)
            )
        return cur.rowcount


class DrainRefused(Exception):
    pass


def drain(
    ops: SlurmOps,
    book: RecoveryBook,
    memory: NodeMemory,
    node: str,
    *,
    by: str,
    is_operator: bool,
    now: float,
) -> str:
    """Drain `node` (rule REC-23): operators only, the reason from the node's record, logged."""
    if not is_operator:
        book.log(LogEntry(now, f"node:{node}", by, "REC-23", "drain", (), "refused: not an operator"))
        raise DrainRefused(f"{by} is not an operator: only operators may drain a node")
    if not valid_host(node):
        raise DrainRefused(f"not a node name: {node!r}")
    record = next((s for s in memory.suspects(now) if s.node == node), None)
    reason = drain_reason(record, now) if record is not None else f"jobdiagd: drained by {by}"
    argv = SlurmOps.drain_argv(node, reason[:200])
    ops.run(argv)
    book.log(LogEntry(now, f"node:{node}", by, "REC-23", "drain", tuple(argv), f"{node} drained"))
    return f"{shlex.join(argv)}: requested by {by}"


def render_suspects(suspects: Sequence[NodeSuspect], now: float, *, limit_records: int = 5) -> str:
    """`jobdiagd nodes` / `/nodes`: one block per node, its jobs and evidence."""
    if not suspects:
        return "no suspect nodes"
    lines: list[str] = []
    for s in suspects:
        lines.append(f"{s.node}  score {s.score:.2f}  {summary(s, now)}")
        for r in list(s.records)[-limit_records:]:
            ago = rounded_duration(max(now - r.at, 0.0))
            lines.append(
                f"  job {r.job_id}  {r.failure_class}  {r.kind} (w {r.weight:g}, {ago} ago): {r.evidence}"
            )
    return "\n".join(lines)
