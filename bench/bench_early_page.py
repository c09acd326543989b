"""GPU-confirmed early hang page on promtool-built RAY=1 jobs, replayed by `jobdiagd backtest`.

    .venv/bin/python bench/bench_early_page.py [--step-times 6,20] [--tick 15] [--json] [--keep DIR]
        [--no-site] [--load-jobs 1000] [--overdue-pct 5] [--load-seconds 60]

Builds each scenario with `jobdiagd_sim.metrics` (job log with dated chatter during the hang,
head worker log, TSDB blocks written by promtool), then replays it twice through
`service.backtest.replay`: with the early page (the job's TSDB answers the early query at each
virtual poll, through a read-only Prometheus over a copy) and without it (the step budget
alone). Per scenario and steady step time it prints:

- early: the hang page's latency after the step was due (last step read + steady step time),
  as a ratio of the early threshold 1.5 x step + 20 s (1.00 = paged at the threshold; the
  target is the threshold plus one scrape interval), and whether it was GPU-confirmed;
- budget: the same latency of the page without the early page (the step budget,
  max(3 x step, 120 s) from the last step, plus a tick), as the same ratio;
- false pages: hang pages of a job that did not hang, pages before the hang began, and early
  pages naming the wrong mechanism or host (target 0);
- queries: how many early queries the replay answered from the TSDB (the cost).

The same for non-RAY jobs through the site Prometheus (`[site_prometheus]`,
docs/site-prometheus.md): each scenario's job log without Ray and its hosts as a site sees them
(AMD Device Metrics Exporter and node_exporter series, `jobdiagd_sim.site_metrics`, promtool),
served by a local Prometheus and replayed with `--site-prometheus`; the ratio is the page's
latency after the due step over 1.5 x step + 20 s + one scrape interval (10 s, the simulator's),
the target <= 1.00.

And the load on the site Prometheus: `--load-jobs` watched non-RAY jobs, `--overdue-pct` of them
overdue (their steps stopped, before the step budget), the daemon's early page
(`service.early_page.EarlyConfirmer` over `service.site_source.SiteJobs`) polled every 0.5 s for
`--load-seconds` against a real Prometheus scraping simulated DCGM and node exporters
(tests/helpers/site_exporters.py) of every overdue job's nodes; the queries it answered
(Prometheus' own `prometheus_http_requests_total` for `/api/v1/query_range`) per second.
Node-sharing assumption: every overdue job on its own 4 nodes (no two share a node set), the
worst case for the per-node-set cache; jobs on the same nodes would share one query.

Scenarios: collective hang (RCCL busy-wait on every host), dead node whose training process
died (its GPUs idle, no GPU process, the rest busy-wait), dead node whose host went silent
(missing metrics never confirm: the step budget pages), hang then heartbeat kill, the same
killed 45 min later with Ray's forwarding lost after the last step (the heartbeat error in the
worker log only; the job log ends with the job script's undated "Training subprocess exited"
lines and summary, which the replay takes in at the job's end), healthy with long checkpoint
saves, evals and a recompilation, heartbeat false positive, host OOM.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jobdiagd.config import Config, default_config
from jobdiagd.service.backtest import Alert, JobReplay, replay
from jobdiagd.triage.resolve import resolve
from jobdiagd.tsdb.access import LocalPrometheus
from jobdiagd_sim.metrics import JobSim, scenario, write_job
from jobdiagd_sim.site_metrics import build_site_tsdb

# (label, sim scenario, expected early mechanism: busy-wait | dead-node | None = no early page)
SCENARIOS: tuple[tuple[str, str, str | None], ...] = (
    ("collective hang", "rccl-hang", "busy-wait"),
    ("dead node (process gone)", "dead-process", "dead-node"),
    ("dead node (host silent)", "dead-node", None),
    ("hang then heartbeat", "hang-then-heartbeat", "busy-wait"),
    ("hang, heartbeat 45m, unfwd", "hang-then-heartbeat", "busy-wait"),
    ("healthy: ckpt+eval+compile", "healthy-evals", None),
    ("heartbeat false positive", "heartbeat-false-positive", None),
    ("host OOM", "host-oom-ramp", None),
)


# Departures from a scenario's defaults, by label: scenario fields, `extra` additions, and the
# raylet's dated chatter during the hang (None: none, the job log says nothing dated after the last step).
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any], float | None]] = {
    "hang, heartbeat 45m, unfwd": ({"hang_s": 2700.0}, {"unforwarded_end": True}, None),
}


def _hang_pages(r: JobReplay) -> list[Alert]:
    return [a for a in r.alerts if a.kind == "hang" and a.event == "open"]


def _config(work: Path, early: bool) -> Config:
    base = default_config()
    return dataclasses.replace(
        base, tsdb=dataclasses.replace(base.tsdb, work_dir=str(work), early_page=early)
    )


# The non-RAY scenarios through the site Prometheus (no heartbeat rows: those are Ray's).
SITE_SCENARIOS: tuple[tuple[str, str, str | None], ...] = (
    ("collective hang", "rccl-hang", "busy-wait"),
    ("dead node (process gone)", "dead-process", "dead-node"),
    ("dead node (host silent)", "dead-node", None),
    ("healthy: ckpt+eval+compile", "healthy-evals", None),
    ("host OOM", "host-oom-ramp", None),
)
SITE_INTERVAL_S = 10.0  # the simulator's exporters are scraped every 10 s (Scenario.hw_interval)


def _site_config(work: Path) -> Config:
    base = _config(work, True)
    site = dataclasses.replace(
        base.site_prometheus, profile="amd", scrape_interval_seconds=SITE_INTERVAL_S, timeout_seconds=5.0
    )
    return dataclasses.replace(base, site_prometheus=site)


def measure_site(
    label: str, name: str, expect: str | None, step_time: float, root: Path, tick: float
) -> dict[str, Any]:
    """One non-RAY scenario replayed against its hosts' site TSDB (served by a local Prometheus)."""
    sc = scenario(name, step_time=step_time)
    sim = JobSim(sc)
    where = root / f"site-{name}-{step_time:g}"
    files = write_job(sim, where / "outputs", ray=False, with_tsdb=False, hang_chatter_s=45.0)
    build_site_tsdb(sim, where / "site", vendor="amd", work=where)
    cfg = _site_config(root)

    async def run() -> JobReplay:
        async with LocalPrometheus(where / "site", cfg.tsdb) as prom:
            ref = resolve(str(files.job_dir), [])
            return await asyncio.to_thread(
                replay, ref, cfg, tick=tick, ref_time=time.time(), site_url=prom.base_url
            )

    t = time.perf_counter()
    early = asyncio.run(run())
    wall = time.perf_counter() - t
    st = early.step_time_s or step_time
    threshold = 1.5 * st + 20.0 + SITE_INTERVAL_S
    due = (early.last_step_at_s or 0.0) + st
    pages = _hang_pages(early)
    row: dict[str, Any] = {
        "scenario": label,
        "sim": name,
        "step_s": round(st, 2),
        "threshold_s": round(threshold, 1),
        "hung": sim.hang,
        "early_queries": early.early_queries,
        "early_states": early.early_states,
        "replay_wall_s": round(wall, 2),
    }
    false_pages: list[str] = []
    if not sim.hang:
        false_pages += [f"hang page of a job that did not hang: {a.summary[:90]}" for a in pages]
    for a in pages:
        if a.gpu_confirmed and (expect is None or f"({expect})" not in a.summary):
            false_pages.append(f"early page with the wrong mechanism: {a.summary[:120]}")
        if expect == "dead-node" and a.gpu_confirmed and f"Suspect host: {sim.sc.bad_host}" not in a.summary:
            false_pages.append(f"early page naming the wrong host: {a.summary[:120]}")
    row["false_pages"] = len(false_pages)
    row["false_page_why"] = false_pages
    if sim.hang and pages:
        lat = pages[0].at_s - due
        row["early_latency_s"] = round(lat, 1)
        row["early_ratio"] = round(lat / threshold, 2)
        row["gpu_confirmed"] = pages[0].gpu_confirmed
    return row


def print_site(rows: list[dict[str, Any]], tick: float) -> None:
    print(
        f"\nnon-RAY jobs through the site Prometheus (backtest, tick {tick:g} s); "
        f"ratio = latency after the due step / (1.5 x step + 20 s + {SITE_INTERVAL_S:g} s scrape)"
    )
    head = f"{'scenario':<28} {'step':>5} {'thresh':>6} {'page':>14} {'GPU':>4} {'false':>5} {'queries':>7}"
    print(head)
    print("-" * len(head))
    for r in rows:
        page = f"{r['early_ratio']:.2f} ({r['early_latency_s']:.0f}s)" if "early_ratio" in r else "-"
        gpu = ("yes" if r.get("gpu_confirmed") else "no") if "gpu_confirmed" in r else "-"
        print(
            f"{r['scenario']:<28} {r['step_s']:>5g} {r['threshold_s']:>6g} {page:>14} {gpu:>4} "
            f"{r['false_pages']:>5} {r['early_queries']:>7}"
        )
        for why in r["false_page_why"]:
            print(f"    FALSE: {why}")
    confirmed = [r for r in rows if r.get("gpu_confirmed")]
    if confirmed:
        worst = max(r["early_ratio"] for r in confirmed)
        print(f"GPU-confirmed non-RAY pages: {len(confirmed)}, worst ratio {worst:.2f} (target <= 1.00)")


def measure_load(jobs: int, overdue_pct: float, seconds: float, root: Path) -> dict[str, Any]:
    """Queries per second on a real Prometheus from the early page of `jobs` watched non-RAY jobs."""
    from bench_site_load import run_load

    return run_load(jobs, overdue_pct, seconds, root)


def print_load(r: dict[str, Any]) -> None:
    print(
        f"\nsite Prometheus load: {r['jobs']} watched jobs, {r['overdue']} overdue ({r['overdue_pct']:g} %), "
        f"each on its own {r['nodes_per_job']} nodes (no node set shared), scrape interval {r['interval_s']:g} s, "
        f"polled for {r['seconds']:.0f} s"
    )
    print(
        f"  {r['qps']:.2f} queries/s = {r['qps'] / r['bound_qps']:.2f} x the bound {r['bound_qps']:.2f}/s "
        f"(overdue jobs / interval): one round of {r['overdue']} every {r['round_period_s']:.1f} s "
        f"over {r['rounds']} rounds; {r['prometheus_queries']} query_range requests in all (Prometheus' "
        f"count; the source's: {r['source_queries']}); {r['answered_jobs']} jobs answered, states {r['states']}"
    )


def measure(
    label: str, name: str, expect: str | None, step_time: float, root: Path, tick: float
) -> dict[str, Any]:
    fields, extra, chatter = VARIANTS.get(label, ({}, {}, 45.0))
    sc = scenario(name, step_time=step_time, **fields)
    sim = JobSim(dataclasses.replace(sc, extra={**sc.extra, **extra}))
    files = write_job(sim, root / f"{name}-{step_time:g}-{len(extra)}", hang_chatter_s=chatter)
    ref = resolve(str(files.job_dir), [])
    t = time.perf_counter()
    early = replay(ref, _config(root, True), tick=tick, ref_time=time.time())
    early_wall = time.perf_counter() - t
    plain = replay(ref, _config(root, False), tick=tick, ref_time=time.time())
    st = early.step_time_s or step_time
    threshold = 1.5 * st + 20.0
    due = (early.last_step_at_s or 0.0) + st
    row: dict[str, Any] = {
        "scenario": label,
        "sim": name,
        "step_s": round(st, 2),
        "threshold_s": round(threshold, 1),
        "hung": sim.hang,
        "early_queries": early.early_queries,
        "early_states": early.early_states,
        "replay_wall_s": round(early_wall, 2),
    }
    false_pages: list[str] = []
    pages = _hang_pages(early)
    if not sim.hang:
        false_pages += [f"hang page of a job that did not hang: {a.summary[:90]}" for a in pages]
    for a in pages:
        if sim.hang and early.last_step_at_s is not None and a.at_s < early.last_step_at_s:
            false_pages.append(f"page before the hang began ({a.at_s:.0f} s)")
        if a.gpu_confirmed:
            wrong = expect is None or f"({expect})" not in a.summary
            if expect == "dead-node" and f"Suspect host: {sim.sc.bad_host}" not in a.summary:
                wrong = True
            if wrong:
                false_pages.append(f"early page with the wrong mechanism/host: {a.summary[:120]}")
    row["false_pages"] = len(false_pages)
    row["false_page_why"] = false_pages
    if sim.hang and pages:
        lat = pages[0].at_s - due
        row["early_latency_s"] = round(lat, 1)
        row["early_ratio"] = round(lat / threshold, 2)
        row["gpu_confirmed"] = pages[0].gpu_confirmed
    plain_pages = _hang_pages(plain)
    if sim.hang and plain_pages:
        lat = plain_pages[0].at_s - due
        row["budget_latency_s"] = round(lat, 1)
        row["budget_ratio"] = round(lat / threshold, 2)
    if not sim.hang:
        row["budget_false_pages"] = len(plain_pages)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--step-times", default="6,20", help="steady step times (s) to simulate, comma-separated")
    p.add_argument("--tick", type=float, default=15.0, help="the daemon's tick (s) on the virtual clock")
    p.add_argument("--json", action="store_true")
    p.add_argument("--keep", type=Path, help="build the jobs here and keep them")
    p.add_argument("--no-site", action="store_true", help="skip the site Prometheus rows and the load")
    p.add_argument(
        "--load-jobs", type=int, default=1000, help="watched jobs of the load measurement (0: skip it)"
    )
    p.add_argument("--overdue-pct", type=float, default=5.0, help="percent of them overdue")
    p.add_argument("--load-seconds", type=float, default=60.0, help="how long the load is measured")
    a = p.parse_args(argv)
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # the table owns stdout
    if shutil.which("promtool") is None and not Path("/usr/bin/promtool").exists():
        print("bench_early_page: promtool is needed to build the TSDBs", file=sys.stderr)
        return 2
    root = a.keep or Path(tempfile.mkdtemp(prefix="bench-early-"))
    rows: list[dict[str, Any]] = []
    site_rows: list[dict[str, Any]] = []
    load: dict[str, Any] | None = None
    step_times = [float(x) for x in a.step_times.split(",")]
    try:
        for step_time in step_times:
            for label, name, expect in SCENARIOS:
                rows.append(measure(label, name, expect, step_time, root, a.tick))
        if not a.no_site:
            for step_time in step_times:
                for label, name, expect in SITE_SCENARIOS:
                    site_rows.append(measure_site(label, name, expect, step_time, root, a.tick))
            if a.load_jobs > 0:
                load = measure_load(a.load_jobs, a.overdue_pct, a.load_seconds, root)
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    if a.json:
        print(json.dumps({"tick_s": a.tick, "rows": rows, "site_rows": site_rows, "load": load}, indent=1))
        return 0
    print(
        f"early page vs step budget (backtest, tick {a.tick:g} s); ratio = latency after the due step / (1.5 x step + 20 s)"
    )
    head = f"{'scenario':<28} {'step':>5} {'thresh':>6} {'early':>14} {'GPU':>4} {'budget':>14} {'false':>5} {'queries':>7}"
    print(head)
    print("-" * len(head))
    for r in rows:
        early = f"{r['early_ratio']:.2f} ({r['early_latency_s']:.0f}s)" if "early_ratio" in r else "-"
        budget = f"{r['budget_ratio']:.2f} ({r['budget_latency_s']:.0f}s)" if "budget_ratio" in r else "-"
        gpu = ("yes" if r.get("gpu_confirmed") else "no") if "gpu_confirmed" in r else "-"
        print(
            f"{r['scenario']:<28} {r['step_s']:>5g} {r['threshold_s']:>6g} {early:>14} {gpu:>4} {budget:>14} "
            f"{r['false_pages']:>5} {r['early_queries']:>7}"
        )
        for why in r["false_page_why"]:
            print(f"    FALSE: {why}")
    total = sum(r["false_pages"] for r in rows)
    confirmed = [r for r in rows if r.get("gpu_confirmed")]
    if confirmed:
        worst = max(r["early_ratio"] for r in confirmed)
        gain = [r["budget_latency_s"] / r["early_latency_s"] for r in confirmed if r.get("early_latency_s")]
        print(
            f"\nGPU-confirmed pages: {len(confirmed)}, worst ratio {worst:.2f}; "
            f"step-budget page {min(gain):.1f}-{max(gain):.1f}x later"
        )
    print(f"false pages: {total} (target 0)")
    if site_rows:
        print_site(site_rows, a.tick)
    if load is not None:
        print_load(load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
