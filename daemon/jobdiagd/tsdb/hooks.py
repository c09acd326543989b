"""What the daemon calls: the GPU-hang judge's verdict on a job now (`gpu_hang.judge` over the newest
samples; the early page and the hang page alike), whether a hang page goes out, and the playbook
for a triage class (the job-end report)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from jobdiagd import clock
from jobdiagd.model.kinds import GpuHangState
from jobdiagd.tsdb.access import AccessError, NoTsdb, SshTunnelPool, TsdbHandle, open_tsdb
from jobdiagd.tsdb.client import PromError
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.discovery import WrongDatabase, time_range
from jobdiagd.tsdb.gpu_hang import GpuVerdict, gpu_query, judge, profile_for
from jobdiagd.tsdb.gpu_strip import fetch_gpu_strip
from jobdiagd.tsdb.playbooks import playbook_name_for_class
from jobdiagd.tsdb.settings import TsdbSettings


def should_page(verdict: GpuVerdict, settings: TsdbSettings) -> bool:
    """Whether a step-budget hang page goes out (rule HANG-9): always, unless `confirm_hang_with_power`
    is on and the GPUs deny the hang (working, or in a known pause: `GpuHangState.denies`).

    A verdict that confirms pages; one that cannot tell (`mixed`, `no-process`, `no-data`: no
    Prometheus, ssh down, stale metrics) never holds a page -- lack of evidence is not health."""
    if not settings.confirm_hang_with_power:
        return True
    return not verdict.denies


async def _judge_now(handle: TsdbHandle, ctx: DiagnosisContext, settings: TsdbSettings) -> GpuVerdict:
    """`gpu_hang.judge` over the newest samples: the server's "now" for a live job, the end of the data of
    a finished one (a copied TSDB)."""
    finished_at: float | None = None if handle.mode == "live-ssh" else (await time_range(handle))[1]
    series = await handle.client.query_matrix(gpu_query(settings.early_scrape_interval_s), finished_at)
    at = finished_at if finished_at is not None else clock.wall()
    return judge(
        series,
        at=at,
        nodes=ctx.nodes,
        profile=profile_for(series, settings),
        thresholds=settings.thresholds,
        scrape_interval_s=settings.early_scrape_interval_s,
    )


async def hang_power_verdict(
    ctx: DiagnosisContext,
    now: float,
    *,
    settings: TsdbSettings | None = None,
    tunnels: SshTunnelPool | None = None,
    timeout_s: float = 20.0,
    strip_s: float | None = None,
) -> GpuVerdict:
    """The GPU-hang judge's verdict on a job now (rule HANG-GPU), within one daemon tick: the early
    page's question and the step-budget page's verdict alike.

    Live jobs are queried through the (persistent, caller-owned) ssh tunnel pool, never by a block
    copy (it would be slow and miss the newest samples, which are the point); a live job whose
    Prometheus is unreachable is `no-data`. `strip_s`: also fetch the per-host power/utilization of
    that many seconds before the verdict's time (the alert's picture), in the same session; a
    failed strip leaves the verdict intact.
    """
    settings = settings or TsdbSettings()
    try:
        async with asyncio.timeout(timeout_s):
            async with open_tsdb(ctx, settings, now=now, tunnels=tunnels, allow_copy=not ctx.live) as handle:
                verdict = await _judge_now(handle, ctx, settings)
                if strip_s:
                    end = verdict.at if verdict.at is not None else now
                    try:
                        strip = await fetch_gpu_strip(
                            handle.client, start=end - strip_s, end=end, nodes=ctx.nodes
                        )
                    except (PromError, ValueError):
                        strip = None
                    verdict = dataclasses.replace(verdict, strip=strip)
                return verdict
    except NoTsdb as exc:
        return GpuVerdict(GpuHangState.NO_DATA, str(exc), now)
    except (AccessError, PromError) as exc:
        return GpuVerdict(GpuHangState.NO_DATA, f"TSDB query failed: {exc}", now)
    except TimeoutError:
        return GpuVerdict(GpuHangState.NO_DATA, f"TSDB query timed out after {timeout_s:g}s", now)


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
