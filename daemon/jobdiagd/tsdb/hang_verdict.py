"""The hang page's GPU verdict, as the daemon asks it: the GPU-hang judge's verdict on a job now
(`gpu_hang.judge` over the newest samples of its TSDB; the early page and the hang page alike), and
whether a hang page goes out (rule HANG-9). A failed job's end-of-job playbook is `tsdb.job_end`."""

from __future__ import annotations

import asyncio
import dataclasses

from jobdiagd import clock
from jobdiagd.model.kinds import GpuHangState
from jobdiagd.tsdb.access import AccessError, NoTsdb, SshTunnelPool, TsdbHandle, open_tsdb
from jobdiagd.tsdb.client import PromError
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.discovery import time_range
from jobdiagd.tsdb.gpu_hang import GpuVerdict, gpu_query, judge, profile_for
from jobdiagd.tsdb.gpu_strip import fetch_gpu_strip
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
