"""Benchmark the daemon's per-job memory: one job's state after 1 M training steps.

    .venv/bin/python bench/bench_memory.py [--steps 1000000] [--baseline-steps 10000]
                                           [--tasks 4] [--steps-per-tick 1000] [--tracemalloc]

One simulated job (`jobdiagd_sim.longrun`) writes real-format step lines (`srun -l` + absl
prefixes, every task printing its copy of each step, NCCL chatter between steps, a
checkpoint save every `--checkpoint-period` steps) into a log file; the daemon's own path
reads it: a `FileTail`
(the pre-filtered tail reader), `JobView.note_read`, and every default detector plus the
per-tick `JobView.analysis()` every `--steps-per-tick` steps, on a simulated clock.

Printed as JSON: the job's retained state (a walk of every object reachable from the
`FileTail` and the `JobView`, shared modules and classes excluded) and the process RSS, at
the baseline (after `--baseline-steps` steps), after a quarter of the steps and after all
of them, as ratios (end vs baseline, end vs quarter: 1.0 when bounded) and the bytes per
step between baseline and end. With `--tracemalloc`, the traced heap too (slower).
The log file is appended to in chunks and deleted at the end (~200 bytes per task per step).
Run it on another tree (`PYTHONPATH=<tree>/daemon`) to compare the same figure before a change.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import tracemalloc
import types
from pathlib import Path
from typing import Any

from jobdiagd.config import default_config
from jobdiagd.detectors import build
from jobdiagd.detectors.base import NoData
from jobdiagd.model.jobref import JobRef
from jobdiagd.service.jobs import JobView
from jobdiagd.sources.tail import FileTail
from jobdiagd_sim.job import SIM_EPOCH
from jobdiagd_sim.longrun import LongRun

STEP_S = 2.0


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def deep_size(*roots: object) -> tuple[int, int]:
    """(bytes, objects) reachable from `roots`; modules, classes and functions are shared
    code, not the job's state, and are not followed."""
    seen: set[int] = set()
    stack = list(roots)
    total = count = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(
            obj, type | types.ModuleType | types.FunctionType | types.BuiltinFunctionType | types.MethodType
        ):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        count += 1
        stack.extend(gc.get_referents(obj))
    return total, count


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--baseline-steps", type=int, default=10_000)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--checkpoint-period", type=int, default=1000)
    p.add_argument("--steps-per-tick", type=int, default=1000, help="steps written between two ticks")
    p.add_argument("--tracemalloc", action="store_true", help="also measure the traced heap (slower)")
    a = p.parse_args(argv)
    if a.tracemalloc:
        tracemalloc.start()
    cfg = default_config()
    detectors = build(cfg)
    points: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jd-mem-", dir="/tmp") as d:
        log = Path(d) / "900001-JAX-llama3.1-8b-long.log"
        writer = LongRun(log, tasks=a.tasks, checkpoint_period=a.checkpoint_period, step_s=STEP_S)
        ref = JobRef("900001", writer.name, None, log, "slurm")
        view = JobView(key="900001", ref=ref, first_seen=SIM_EPOCH)
        tail = FileTail(log, ref_time=SIM_EPOCH)
        findings = 0

        def tick() -> None:
            nonlocal findings
            now = writer.t  # the daemon reads each line as it is written
            tail.poll()
            view.main = tail.state
            view.note_read(now)
            for det in detectors:
                out = det.check(view, now)
                if not isinstance(out, NoData):
                    findings += sum(1 for f in out if not getattr(f, "resolved", True))
            view.analysis(now)

        def measure(name: str) -> None:
            gc.collect()
            size, objects = deep_size(tail, view)
            points[name] = {
                "steps": writer.step,
                "state_bytes": size,
                "state_objects": objects,
                "rss_bytes": rss_bytes(),
            }
            if a.tracemalloc:
                points[name]["traced_bytes"] = tracemalloc.get_traced_memory()[0]

        tick()
        gc.collect()
        points["start"] = {"steps": 0, "rss_bytes": rss_bytes()}
        quarter = a.steps // 4
        while writer.step < a.steps:
            n = min(a.steps_per_tick, a.steps - writer.step)
            for mark in (a.baseline_steps, quarter):
                if writer.step < mark:
                    n = min(n, mark - writer.step)
            writer.steps(n)
            tick()
            if writer.step == a.baseline_steps:
                measure("baseline")
            if writer.step == quarter:
                measure("quarter")
        measure("end")
        log_bytes = os.path.getsize(log)
    base, mid, end = points["baseline"], points["quarter"], points["end"]
    steps_between = end["steps"] - base["steps"]
    result: dict[str, Any] = {
        "steps": a.steps,
        "tasks": a.tasks,
        "log_mb": round(log_bytes / 1e6, 1),
        "last_step_seen": view.last_step,
        "open_findings_seen": findings,
        "wall_s": round(time.monotonic() - started, 1),
        "points": points,
        "state_ratio_end_vs_baseline": round(end["state_bytes"] / base["state_bytes"], 3),
        "state_bytes_per_step": round((end["state_bytes"] - base["state_bytes"]) / steps_between, 2),
        "rss_ratio_end_vs_baseline": round(end["rss_bytes"] / base["rss_bytes"], 3),
        "rss_bytes_per_step": round((end["rss_bytes"] - base["rss_bytes"]) / steps_between, 2),
        # Bounded: the last 3/4 of the run add nothing (the caps fill up well before).
        "state_ratio_end_vs_quarter": round(end["state_bytes"] / mid["state_bytes"], 3),
        "rss_ratio_end_vs_quarter": round(end["rss_bytes"] / mid["rss_bytes"], 3),
        "rss_ratio_end_vs_start": round(end["rss_bytes"] / points["start"]["rss_bytes"], 3),
        "state_mb_end": round(end["state_bytes"] / 1e6, 2),
        "rss_mb_end": round(end["rss_bytes"] / 1e6, 1),
    }
    if a.tracemalloc:
        result["traced_bytes_per_step"] = round(
            (end["traced_bytes"] - base["traced_bytes"]) / steps_between, 2
        )
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
