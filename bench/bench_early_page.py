"""GPU-confirmed early hang page on promtool-built RAY=1 jobs, replayed by `jobdiagd backtest`.

    .venv/bin/python bench/bench_early_page.py [--step-times 6,20] [--tick 15] [--json] [--keep DIR]

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
from jobdiagd_sim.metrics import JobSim, scenario, write_job

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
    a = p.parse_args(argv)
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # the table owns stdout
    if shutil.which("promtool") is None and not Path("/usr/bin/promtool").exists():
        print("bench_early_page: promtool is needed to build the TSDBs", file=sys.stderr)
        return 2
    root = a.keep or Path(tempfile.mkdtemp(prefix="bench-early-"))
    rows: list[dict[str, Any]] = []
    try:
        for step_time in (float(x) for x in a.step_times.split(",")):
            for label, name, expect in SCENARIOS:
                rows.append(measure(label, name, expect, step_time, root, a.tick))
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    if a.json:
        print(json.dumps({"tick_s": a.tick, "rows": rows}, indent=1))
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
