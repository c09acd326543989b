"""Backtest the daemon's detectors over the simulated corpus: hang-detection latency and false alerts.

    .venv/bin/python bench/backtest_corpus.py [--json] [--tick 15]

Builds `jobdiagd_sim.scenarios.build_all` into a temp dir, replays every job with
`jobdiagd.service.backtest.replay`, and compares the alerts with each scenario's ground truth.
Latency = alert time - (last step read + steady step time) for hangs after the first step
(target: max(3 x step time, 120 s) + one tick; for a hang paged in the checkpoint phase --
the job hung right after a save, rule HANG-4 -- the configured checkpoint budget + one tick);
for hangs before the first step, alert time - when the pre-training barrier was read (target:
startup grace + one tick).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from jobdiagd import clock
from jobdiagd.config import default_config
from jobdiagd.service.backtest import replay
from jobdiagd.triage.resolve import resolve
from jobdiagd_sim.scenarios import build_all


def evaluate(root: Path, tick: float) -> dict[str, Any]:
    cfg = default_config()
    exps = build_all(root)
    now = clock.wall()
    rows: list[dict[str, Any]] = []
    for e in exps:
        if not e.is_job or e.status is None or not e.log.exists():
            continue
        r = replay(resolve(str(e.job_dir), []), cfg, tick=tick, ref_time=now)
        truth_classes = set(e.expected_classes) | ({e.primary_failure} if e.primary_failure else set())
        false: list[str] = []
        superseded: list[str] = []  # a real stall paged before the root-cause error was logged
        hang_latency: float | None = None
        hang_target: float | None = None
        hang_phase: str | None = None
        for a in r.alerts:
            if a.event != "open":
                continue
            if a.kind == "hang":
                later_failure = any(b.kind == "failure" and b.at_s >= a.at_s for b in r.alerts)
                if e.primary_failure != "hang" and later_failure:
                    superseded.append(f"hang@{a.at_s:.0f}s")
                elif e.primary_failure != "hang":
                    false.append(f"hang@{a.at_s:.0f}s")
                elif r.last_step_at_s is not None and r.step_time_s:
                    hang_latency = a.at_s - (r.last_step_at_s + r.step_time_s)
                    hang_target = max(3 * r.step_time_s, 120.0) + tick
                    if a.phase == "checkpoint":  # hung during a save: it may have been one (HANG-4)
                        hang_target = cfg.detectors.hang.checkpoint_budget_seconds + tick
                    hang_phase = a.phase
                else:
                    start = r.barrier_at_s if r.barrier_at_s is not None else 0.0
                    hang_latency = a.at_s - start
                    hang_target = cfg.detectors.hang.startup_grace_seconds + tick
            elif a.kind == "failure" and a.cls not in truth_classes:
                false.append(f"failure:{a.cls}")
            elif a.kind == "tgs-degradation" and not e.tgs_degraded:
                false.append("tgs")
        missed = e.primary_failure == "hang" and not any(a.kind == "hang" for a in r.alerts)
        rows.append(
            {
                "scenario": e.scenario,
                "truth": e.primary_failure,
                "alerts": [f"{a.kind}:{a.cls}@{a.at_s:.0f}s" for a in r.alerts if a.event == "open"],
                "hang_latency_s": None if hang_latency is None else round(hang_latency, 1),
                "hang_target_s": hang_target,
                "hang_phase": hang_phase,
                "false_alerts": false,
                "hang_then_root_cause": superseded,
                "missed_hang": missed,
            }
        )
    hangs = [r for r in rows if r["hang_latency_s"] is not None]
    return {
        "tick_s": tick,
        "jobs": len(rows),
        "hang_jobs": sum(1 for r in rows if r["truth"] == "hang"),
        "hangs_detected": len(hangs),
        "hangs_within_target": sum(1 for r in hangs if r["hang_latency_s"] <= r["hang_target_s"]),
        "false_alerts": sum(len(r["false_alerts"]) for r in rows),
        "hang_pages_superseded_by_root_cause": sum(len(r["hang_then_root_cause"]) for r in rows),
        "missed_hangs": sum(1 for r in rows if r["missed_hang"]),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tick", type=float, default=15.0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="jd-corpus-") as d:
        res = evaluate(Path(d), a.tick)
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    for r in res["rows"]:
        if r["alerts"] or r["truth"] == "hang":
            lat = (
                ""
                if r["hang_latency_s"] is None
                else f"  hang latency {r['hang_latency_s']}s (target {r['hang_target_s']}s"
                + (f", phase {r['hang_phase']})" if r["hang_phase"] else ")")
            )
            bad = f"  FALSE: {r['false_alerts']}" if r["false_alerts"] else ""
            if r["hang_then_root_cause"]:
                bad += f"  (stall paged before the root cause: {r['hang_then_root_cause']})"
            print(f"{r['scenario']:<26} truth={r['truth']!s:<20} {', '.join(r['alerts'])}{lat}{bad}")
    print(
        f"\n{res['jobs']} jobs; hangs: {res['hangs_detected']}/{res['hang_jobs']} detected, "
        f"{res['hangs_within_target']} within target; missed {res['missed_hangs']}; false alerts {res['false_alerts']}; "
        f"stalls paged before a later root-cause error {res['hang_pages_superseded_by_root_cause']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
