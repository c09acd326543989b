"""A failed job's end-of-job playbook, as the daemon asks it: the TSDB playbook matching the job's
triage class (rule PB-MAP-1), run for the job-end report of a failed RAY=1 job (rule END-4)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from jobdiagd.tsdb.access import AccessError
from jobdiagd.tsdb.client import PromError
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.discovery import WrongDatabase
from jobdiagd.tsdb.playbooks import playbook_name_for_class
from jobdiagd.tsdb.settings import TsdbSettings


async def playbook_for_class(class_name: str | None) -> str:
    """Playbook name that matches a triage class (for the job-end report of a failed RAY=1 job)."""
    return playbook_name_for_class(class_name)


async def job_end_diagnosis(
    triage: DiagnosisContext | Mapping[str, Any],
    now: float,
    *,
    settings: TsdbSettings | None = None,
    timeout_s: float = 120.0,
) -> dict[str, Any] | None:
    """For the job-end report of a failed RAY=1 job: run the playbook matching its class, return the JSON report.

    None for RAY=0 jobs or jobs without a failure class; errors are returned as {"error": ...} so the
    job-end report still goes out. `triage`: the job's context (the daemon builds it from its triage
    result), or a triage document as `TriageResult.to_dict()` writes it.
    """
    from jobdiagd.tsdb.context import context_from_triage
    from jobdiagd.tsdb.engine import diagnose
    from jobdiagd.tsdb.report import to_json

    ctx = triage if isinstance(triage, DiagnosisContext) else context_from_triage(triage)
    if ctx.ray is False or not ctx.primary_class:
        return None
    name = await playbook_for_class(ctx.primary_class)
    try:
        async with asyncio.timeout(timeout_s):
            # playbook=None: diagnose picks the same class playbook, and may refine it (a cancel without a stall).
            d = await diagnose(ctx, settings or TsdbSettings(), now=now, playbook=None)
    except (AccessError, PromError, WrongDatabase, TimeoutError) as exc:
        return {"playbook": name, "error": str(exc) or type(exc).__name__}
    return to_json(d)
