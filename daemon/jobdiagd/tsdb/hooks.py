"""What the daemon calls: the GPU utilization/power verdict for a hang alert, and the playbook for a triage class."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jobdiagd.tsdb.access import AccessError, NoTsdb, SshTunnelPool, TsdbHandle, open_tsdb
from jobdiagd.tsdb.client import PromError, multi_arm, split_arms
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.discovery import WrongDatabase, time_range
from jobdiagd.tsdb.gpu_strip import GpuStrip, fetch_gpu_strip
from jobdiagd.tsdb.playbooks import playbook_name_for_class
from jobdiagd.tsdb.playbooks.base import by_gpu, gpu_state, host_of, short_host
from jobdiagd.tsdb.settings import TsdbSettings, model_from_vram


@dataclass(frozen=True)
class Verdict:
    """GPU evidence for a hang alert. `state`: busy-wait | training | idle | dead-node | mixed | unknown."""

    state: str
    confirmed_hang: bool
    summary: str
    per_host: dict[str, str] = field(default_factory=dict)
    mean_util_pct: float | None = None
    mean_power_w: float | None = None
    at: float | None = None
    gpu_model: str | None = None
    # Per-host GPU power/utilization over the last hour (the alert's power strip), when asked for.
    strip: GpuStrip | None = None


def should_page(verdict: Verdict, settings: TsdbSettings) -> bool:
    """With `confirm_hang_with_power`, a hang pages only once the power signature confirms it."""
    if not settings.confirm_hang_with_power:
        return True
    return verdict.confirmed_hang


async def _power_verdict(
    handle: TsdbHandle, ctx: DiagnosisContext, settings: TsdbSettings, now: float, window_s: float
) -> Verdict:
    at: float | None = None if handle.mode == "live-ssh" else (await time_range(handle))[1]
    w = f"{int(window_s)}s"
    arms = {
        "util": f"avg_over_time(ray_node_gpus_utilization[{w}])",
        "power": f"avg_over_time(hw_gpu_power_watts[{w}])",
        "vram": f"max(max_over_time(hw_gpu_vram_total_bytes[{w}]))",
        "seen": "max by (host) (timestamp(hw_procs_running))",
    }
    res = split_arms(await handle.client.query_vector(multi_arm(arms), at))
    util, power = by_gpu(res.get("util", [])), by_gpu(res.get("power", []))
    model = settings.gpu_model or (model_from_vram(res["vram"][0].v) if res.get("vram") else None)
    prof, th = settings.profile(model), settings.thresholds
    states = {k: gpu_state(util.get(k), power.get(k), prof, th) for k in set(util) | set(power)}
    t_eval = at if at is not None else now
    seen = {host_of(s.labels): s.v for s in res.get("seen", [])}
    stale = sorted(h for h, t in seen.items() if t_eval - t > 60)
    missing = sorted({short_host(n) for n in ctx.nodes} - set(seen)) if ctx.nodes and seen else []
    per_host: dict[str, str] = {}
    for h in sorted({h for h, _ in states} | set(seen)):
        c = Counter(s for (hh, _), s in states.items() if hh == h)
        per_host[h] = (
            "stale metrics"
            if h in stale
            else (", ".join(f"{n} {s}" for s, n in c.most_common()) or "no GPU data")
        )
    counts = Counter(states.values())
    total = max(1, len(states))
    mu = sum(util.values()) / len(util) if util else None
    mp = sum(power.values()) / len(power) if power else None
    dead = stale + missing
    if dead:
        state, confirmed = "dead-node", True
        summary = f"{', '.join(dead)} stopped reporting; the others: {counts.get('busy-wait', 0)}/{total} GPUs in busy-wait"
    elif counts.get("busy-wait", 0) / total >= 0.5:
        state, confirmed = "busy-wait", True
        summary = f"{counts['busy-wait']}/{total} GPUs at high utilization and busy-wait power ({mp or 0:.0f} W avg, {prof.name}): RCCL busy-wait hang confirmed"
    elif counts.get("training", 0) / total >= 0.5:
        state, confirmed = "training", False
        summary = f"{counts['training']}/{total} GPUs at training power ({mp or 0:.0f} W avg): GPUs are working -- not a hang (log output may lag)"
    elif counts.get("idle", 0) == total and total > 0:
        state, confirmed = "idle", True
        summary = f"all {total} GPUs idle ({mp or 0:.0f} W avg): the training processes are not running"
    elif states:
        state, confirmed = "mixed", False
        summary = "mixed GPU states: " + ", ".join(f"{n} {s}" for s, n in counts.most_common())
    else:
        state, confirmed = "unknown", False
        summary = "no GPU utilization/power samples in the last window"
    return Verdict(state, confirmed, summary, per_host, mu, mp, t_eval, prof.name)


async def hang_power_verdict(
    ctx: DiagnosisContext,
    now: float,
    *,
    settings: TsdbSettings | None = None,
    tunnels: SshTunnelPool | None = None,
    window_s: float = 300.0,
    timeout_s: float = 20.0,
    strip_s: float | None = None,
) -> Verdict:
    """GPU utilization/power verdict for a hang alert, within one daemon tick.

    Live jobs are queried through the (persistent, caller-owned) ssh tunnel pool; a live job whose
    Prometheus is unreachable yields `unknown` rather than a slow block copy. `strip_s`: also
    fetch the per-host power/utilization of that many seconds before the verdict's time (the
    alert's picture), in the same session; a failed strip leaves the verdict intact.
    """
    settings = settings or TsdbSettings()
    try:
        async with asyncio.timeout(timeout_s):
            # A block copy would be slow and miss the last 2 h -- exactly the hang window -- so live only.
            async with open_tsdb(ctx, settings, now=now, tunnels=tunnels, allow_copy=not ctx.live) as handle:
                verdict = await _power_verdict(handle, ctx, settings, now, window_s)
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
        return Verdict("unknown", False, str(exc))
    except (AccessError, PromError) as exc:
        return Verdict("unknown", False, f"TSDB query failed: {exc}")
    except TimeoutError:
        return Verdict("unknown", False, f"TSDB verdict timed out after {timeout_s:g}s")


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
