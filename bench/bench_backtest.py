"""`jobdiagd backtest` on multi-task logs with undated step lines: replay speed and alert figures.

    .venv/bin/python bench/bench_backtest.py [--size-mb 150] [--nodes 24] [--tick 15] [--json]
                                             [--only speed|corpus] [--keep DIR]

speed: writes a completed RAY=0 job log with `jobdiagd_sim.biglog` (every task prints its own
undated step line, XLA/NCCL chatter dated), then times `jobdiagd backtest` of it (default
workers, and --workers 1) against two baselines measured in the same run on the same file:
`jobdiagd triage` of the job (the one-shot reader) and `grep -c 'completed step'` (reading the
bytes). Figures are ratios; the absolute seconds are printed too (the target is < 30 s for
150 MB / 24 tasks on the shared 2-core box).

corpus: builds `jobdiagd_sim.multitask` (healthy 8-24 task jobs with checkpoints and evals,
hangs mid-training, right after a checkpoint, in warmup and before step 0, some RAY=1) and
replays each job. Healthy jobs: every opened alert is false (target 0). Hung jobs: page latency
relative to the due step -- alert time minus (last step + steady step time), or minus the
barrier for a hang before step 0 -- on the replay's own clock and against the simulator's true
times; the target is the daemon's stall budget for that phase (triage.stall on the job's own
steps: steady max(3 x step time, 120 s), a save at least the 900 s checkpoint budget (rule
HANG-4), an eval and warmup learned, startup 1800 s) plus a tick.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jobdiagd.config import default_config
from jobdiagd.detectors.hang import policy_from_config
from jobdiagd.logs.job import load_job
from jobdiagd.logs.prefixes import strip
from jobdiagd.logs.state import StampClock
from jobdiagd.service import backtest
from jobdiagd.service.jobs import JobView
from jobdiagd.triage.resolve import resolve
from jobdiagd.triage.stall import stall_budget
from jobdiagd_sim.biglog import write_biglog
from jobdiagd_sim.multitask import Case, build_all


def _timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def speed(root: Path, size_mb: float, nodes: int, tick: float) -> dict[str, Any]:
    outputs = root / "outputs"
    name = "99001-JAX-llama3.1-405b-bench"
    log = outputs / f"{name}.log"
    res = write_biglog(log, int(size_mb * (1 << 20)), nodes=nodes, undated_steps=True)
    (outputs / name).mkdir(parents=True, exist_ok=True)
    (outputs / name / "log").symlink_to(f"../{log.name}")
    job = outputs / name
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cli = [sys.executable, "-m", "jobdiagd.cli"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, check=True, env=env)

    grep_s, _ = _timed(
        lambda: subprocess.run(["grep", "-c", "completed step", str(log)], capture_output=True, check=False)
    )
    triage_s, _ = _timed(lambda: run("triage", str(job)))
    backtest_s, out = _timed(lambda: run("backtest", str(job), "--json", "--tick", str(tick)))
    serial_s, _ = _timed(lambda: run("backtest", str(job), "--json", "--tick", str(tick), "--workers", "1"))
    (r,) = json.loads(out.stdout)["jobs"]
    opened = [a for a in r["alerts"] if a["event"] == "open"]
    return {
        "size_mb": round(res.size / (1 << 20), 1),
        "tasks": nodes,
        "steps": res.total_steps,
        "lines": res.lines,
        "backtest_s": round(backtest_s, 2),
        "backtest_workers_1_s": round(serial_s, 2),
        "triage_s": round(triage_s, 2),
        "grep_s": round(grep_s, 2),
        "backtest_vs_triage": round(backtest_s / triage_s, 2),
        "backtest_vs_grep": round(backtest_s / max(grep_s, 1e-3), 1),
        "virtual_hours": round((r["end_at_s"] or 0.0) / 3600, 2),
        "summed_hours": round(summed_hours(log), 2),
        "last_step": r["last_step"],
        "expected_last_step": res.last_step,
        "false_alerts": [f"{a['kind']}@step {a['at_step']}" for a in opened],
        "load_avg": round(os.getloadavg()[0], 1),
    }


_TASK0_SECONDS = re.compile(rb"^\s*0: .*?completed step: \d+, seconds: ([\d.]+)")
_SECONDS = re.compile(rb"completed step: \d+, seconds: ([\d.]+)")


def summed_hours(log: Path) -> float:
    """Sum of task 0's `seconds:` fields after its first step (what the replay's duration must be)."""
    with open(log, "rb") as fh:
        secs = [float(m.group(1)) for raw in fh if (m := _TASK0_SECONDS.match(raw))]
    return sum(secs[1:]) / 3600


def _truth_budget(case: Case) -> tuple[float, str, float | None]:
    """(stall budget, phase, steady step time) the daemon's policy gives after the job's last
    step, computed from the job's own files (not from the replay)."""
    cfg = default_config()
    logs = load_job(resolve(str(case.job_dir), []), ref_time=time.time())
    view = JobView(key=case.job_id, ref=logs.ref, first_seen=0.0, policy=policy_from_config(cfg))
    view.main, view.workers, view.head_host = logs.main, logs.workers, logs.head_host
    steps = [s for s in view.sorted_steps() if case.last_step is not None and s.step <= case.last_step]
    st = view.step_time()
    b = stall_budget(steps, st, view.checkpoint(), policy_from_config(cfg))
    return b.seconds, b.phase, st


def corpus(root: Path, tick: float) -> dict[str, Any]:
    cfg = default_config()
    cases = build_all(root / "multitask")
    rows: list[dict[str, Any]] = []
    for c in cases:
        ref = resolve(str(c.job_dir), [])
        r = backtest.replay(ref, cfg, tick=tick, ref_time=time.time())
        opened = [a for a in r.alerts if a.event == "open"]
        row: dict[str, Any] = {
            "job": c.plan.name,
            "tasks": c.plan.ntasks,
            "ray": c.plan.ray,
            "healthy": c.healthy,
            "alerts": [f"{a.kind}@{a.at_s:.0f}s(step {a.at_step})" for a in opened],
            # The replay's duration vs the job's: 1.0 when the clock runs at the job's pace.
            "pace": None,
        }
        if r.last_step_at_s and c.total_seconds and r.first_step_at is not None:
            first_secs = _first_seconds(c)
            row["pace"] = round(r.last_step_at_s / max(c.total_seconds - first_secs, 1e-9), 2)
        if c.healthy:
            row["false_alerts"] = len(opened)
        else:
            # The page for this hang: the hang alert opened at the job's last step (any other
            # alert, e.g. a hang opened at an earlier step that resumed, is false).
            hang = next((a for a in opened if a.kind == "hang" and a.at_step == c.last_step), None)
            budget, phase, st = _truth_budget(c)
            due_true = c.barrier_t if c.last_step is None else (c.last_step_t or 0.0) + (st or 0.0)
            target = budget + tick
            row.update(
                hang_kind=c.plan.hang_kind,
                phase=phase,
                target_s=round(target, 1),
                false_alerts=len([a for a in opened if a is not hang]),
            )
            if hang is None:
                row.update(latency_s=None, latency_true_s=None, missed=True)
            else:
                page = getattr(hang, "at", None)
                if page is None and r.first_step_at is not None:  # before `Alert.at` existed
                    page = r.first_step_at + hang.at_s
                if c.last_step is None:
                    lat = hang.at_s - (r.barrier_at_s or 0.0)
                elif r.last_step_at_s is not None and r.step_time_s:
                    lat = hang.at_s - (r.last_step_at_s + r.step_time_s)
                else:
                    lat = None
                silence = _silence(c)
                true_lat = None if page is None or due_true is None else page - due_true
                row.update(
                    latency_s=None if lat is None else round(lat, 1),
                    latency_true_s=None if true_lat is None else round(true_lat, 1),
                    # The log says nothing datable between the stall and its next timestamp: no
                    # clock built from it can page earlier than that line allows.
                    silence_s=None if silence is None else round(silence, 1),
                    latency_true_net_s=None
                    if true_lat is None or silence is None
                    else round(true_lat - silence, 1),
                    missed=False,
                )
        rows.append(row)
    healthy = [r for r in rows if r["healthy"]]
    hangs = [r for r in rows if not r["healthy"]]
    paged = [r for r in hangs if not r["missed"]]
    return {
        "jobs": len(rows),
        "healthy_jobs": len(healthy),
        "false_alerts_healthy": sum(r["false_alerts"] for r in healthy),
        "healthy_with_false_alert": sum(1 for r in healthy if r["false_alerts"]),
        "hang_jobs": len(hangs),
        "false_alerts_hang_jobs": sum(r["false_alerts"] for r in hangs),
        "hangs_paged": len(paged),
        "hangs_in_budget_replay_clock": sum(
            1 for r in paged if r["latency_s"] is not None and 0 <= r["latency_s"] <= r["target_s"]
        ),
        "hangs_in_budget_true_clock": sum(
            1 for r in paged if r["latency_true_s"] is not None and r["latency_true_s"] <= r["target_s"]
        ),
        "hangs_in_budget_true_clock_net": sum(
            1
            for r in paged
            if r["latency_true_net_s"] is not None and r["latency_true_net_s"] <= r["target_s"]
        ),
        "latency_true_range_s": [
            min((r["latency_true_s"] for r in paged if r["latency_true_s"] is not None), default=None),
            max((r["latency_true_s"] for r in paged if r["latency_true_s"] is not None), default=None),
        ],
        "rows": rows,
    }


def _silence(c: Case) -> float | None:
    """Seconds from the true stall start (last step, or the barrier) to the first timestamp any
    replayed file of the job prints after it."""
    since = c.last_step_t if c.last_step_t is not None else c.barrier_t
    if since is None:
        return None
    now = time.time()
    files = [c.log, *(sorted(c.job_dir.glob("ray_logs/node001/worker-*.out")) if c.plan.ray else [])]
    best: float | None = None
    for f in files:
        for line in f.read_bytes().split(b"\n"):
            stamp = strip(line.decode("utf-8", errors="replace")).stamp
            when = StampClock(now).epoch(stamp) if stamp is not None else None
            if when is not None and when > since and (best is None or when < best):
                best = when
    return None if best is None else best - since


def _first_seconds(c: Case) -> float:
    """`seconds:` of the job's first step (the replay's clock starts at that step's line)."""
    with open(backtest_auth_log(c), "rb") as fh:
        for raw in fh:
            m = _SECONDS.search(raw)
            if m is not None:
                return float(m.group(1))
    return 0.0


def backtest_auth_log(c: Case) -> Path:
    if c.plan.ray:
        worker = sorted(c.job_dir.glob("ray_logs/node001/worker-*-01000000-*.out"))
        if worker:
            return worker[0]
    return c.log


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mb", type=float, default=150.0)
    p.add_argument("--nodes", type=int, default=24)
    p.add_argument("--tick", type=float, default=15.0)
    p.add_argument("--only", choices=("speed", "corpus"))
    p.add_argument("--keep", type=Path, help="build into this directory and keep it")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    root = a.keep or Path(tempfile.mkdtemp(prefix="jd-bt-"))
    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    try:
        if a.only in (None, "corpus"):
            out["corpus"] = corpus(root, a.tick)
        if a.only in (None, "speed"):
            out["speed"] = speed(root, a.size_mb, a.nodes, a.tick)
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    if "corpus" in out:
        c = out["corpus"]
        for r in c["rows"]:
            extra = ""
            if not r["healthy"]:
                extra = (
                    f"  {r['hang_kind']:<16} phase {r['phase']:<10} latency {r['latency_s']}s "
                    f"(true clock {r['latency_true_s']}s, silence {r.get('silence_s')}s) "
                    f"target {r['target_s']}s"
                )
            print(
                f"{r['job']:<24} tasks {r['tasks']:>2} ray {int(r['ray'])} pace {r['pace']}"
                f"  alerts {r['alerts'] or '-'}{extra}"
            )
        print(
            f"\nmulti-task undated corpus: {c['jobs']} jobs; healthy {c['healthy_jobs']}: "
            f"{c['false_alerts_healthy']} false alerts on {c['healthy_with_false_alert']} jobs; "
            f"hangs {c['hang_jobs']}: {c['hangs_paged']} paged ({c['false_alerts_hang_jobs']} other alerts), {c['hangs_in_budget_replay_clock']} in budget "
            f"on the replay clock; on the simulator's true clock {c['hangs_in_budget_true_clock']} "
            f"in budget, {c['hangs_in_budget_true_clock_net']} once the log's silence before its next "
            f"timestamp is allowed for (true latency range {c['latency_true_range_s']} s)"
        )
    if "speed" in out:
        s = out["speed"]
        print(
            f"\n`jobdiagd backtest` of a {s['size_mb']} MB, {s['tasks']}-task undated log ({s['steps']} steps, "
            f"{s['lines']} lines): {s['backtest_s']} s ({s['backtest_workers_1_s']} s with --workers 1; "
            f"load {s['load_avg']}); `jobdiagd triage` {s['triage_s']} s, `grep -c` {s['grep_s']} s in the "
            f"same run -> backtest/triage = {s['backtest_vs_triage']}, backtest/grep = {s['backtest_vs_grep']}; "
            f"virtual duration {s['virtual_hours']} h (summed seconds {s['summed_hours']} h), "
            f"last step {s['last_step']}/{s['expected_last_step']}, false alerts {s['false_alerts'] or 0}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
