"""Failure-signature detector: a runbook failure class in a live log pages at once, one incident per cascade.

Decided by triage itself: `analyze()` on the job's current states; when its primary failure
is a signature class (infra, root cause, symptom or carrier — not advisory ones like
ray-start-fail, never the harmless table, which the parser already drops) the job gets one
`failure` incident naming that root cause, with the evidence lines; the other classes seen
are listed as the cascade. Hits the job survived (training went on for more than two steps,
triage's rule) stop being primary, and the incident resolves ("training continued past it").
`analyze()` only reruns when a new signature hit was read (or, while an incident is open,
when a new step arrived), not on every line.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobdiagd.config import Config
from jobdiagd.detectors.base import (
    DetectorSpec,
    NoData,
    Outcome,
    StatusPart,
    WatchedJob,
    resolved_finding,
)
from jobdiagd.model.alerts import Finding, Severity
from jobdiagd.model.kinds import IncidentKind, JobStatus
from jobdiagd.model.triage import TriageResult
from jobdiagd.rules.signatures import BY_CLASS, Tier, describe

NAME = "failure_signature"
KIND = IncidentKind.FAILURE
_PAGING = (Tier.INFRA, Tier.ROOT, Tier.SYMPTOM, Tier.CARRIER)
MAX_EVIDENCE = 6


@dataclass
class _Memo:
    key: tuple[int, int | None]
    findings: list[Finding]


def hit_count(view: WatchedJob) -> int:
    return sum(h.count for st in view.states for h in st.hits.values())


class FailureSignatureDetector:
    name = NAME
    on_data = True
    on_gpu_check = False

    def __init__(self) -> None:
        self._memo: dict[str, _Memo] = {}  # job -> the last judgement and what it was made on

    def forget(self, key: str) -> None:
        self._memo.pop(key, None)

    def status(self, view: WatchedJob, now: float) -> StatusPart | None:
        return None

    def check(self, view: WatchedJob, now: float) -> Outcome:
        hits = hit_count(view)
        if hits == 0:
            return NoData("no failure signature in the logs")
        memo = self._memo.get(view.key)
        active = memo is not None and any(not f.resolved for f in memo.findings)
        key = (hits, view.last_step if active else None)
        if memo is not None and memo.key == key:
            return memo.findings
        res = view.analysis(now)
        findings = self._judge(view, res, active)
        self._memo[view.key] = _Memo(key, findings)
        return findings

    def _judge(self, view: WatchedJob, res: TriageResult, active: bool) -> list[Finding]:
        primary = res.primary
        sig = BY_CLASS.get(primary or "")
        last = view.last_step
        if primary is None or sig is None or sig.tier not in _PAGING:
            if not active:
                return []
            return [resolved_finding(NAME, view.key, KIND, f"training continued past it (step {last})", last)]
        ev = [e for e in res.cls.evidence if e.cls == primary] or res.cls.evidence
        first = ev[0] if ev else None
        others = [c for c in res.cls.classes if c != primary and c in BY_CLASS]
        summary = f"{primary}: {first.text[:200]}" if first is not None else primary
        details: dict[str, object] = {
            "root cause": primary,
            "what it means": describe(primary, res.cls.primary_rule),
            "stage": res.cls.stage or "n/a",
            "status": res.status,
            "last step": last,
        }
        if others:
            details["cascade (also seen)"] = ", ".join(others)
        if res.cls.heartbeat is not None:
            details["heartbeat verdict"] = res.cls.heartbeat.verdict
        for i, step in enumerate(res.next_steps[:3], 1):
            details[f"next step {i}"] = step
        evidence = tuple(
            f"[{e.cls}] {e.source.rsplit('/', 1)[-1]}:{e.line}: {e.text}"
            for e in res.cls.evidence[:MAX_EVIDENCE]
        )
        severity: Severity = (
            "critical" if sig.tier is not Tier.SYMPTOM or res.status != JobStatus.RUNNING else "warning"
        )
        return [
            Finding(
                NAME, view.key, KIND, severity, summary, details, evidence, at_step=last, failure_class=primary
            )
        ]


def _factory(cfg: Config) -> FailureSignatureDetector:
    return FailureSignatureDetector()


SPEC = DetectorSpec(
    NAME,
    True,
    _factory,
    "a runbook failure class in a live log: pages at once with the evidence; a cascade is one incident",
)
