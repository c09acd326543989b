"""Benchmark: `jobdiagd triage` on a generated >= 1 GB realistic log vs `grep -c 'completed step:'`.

Not a test. Prints wall time of both on the same file in the same run, their ratio
(target: triage within 3x of grep), for the default (body pre-filtered by two forked
workers) and for `--workers 1`, and the peak memory (target: < 200 MB whatever the log
size): the largest single process's RSS, and the summed PSS of triage's whole process tree
(sampled every 20 ms; PSS splits the pages the forked workers share with the parent).
For context it also times grep doing triage's own pre-filter job (`grep -c -F -f` with
the trigger literals). Usage: .venv/bin/python bench/bench_triage.py [--size-gb 1] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return time.perf_counter() - t0, out


def _tree_pss_kb(pid: int) -> int:
    """Summed PSS of a process and its descendants (pages shared after fork are split
    between the processes sharing them, so the sum is the tree's real footprint)."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += next(
                (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0
            )
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return total


def timed_tree(cmd: list[str]) -> tuple[float, int]:
    """Wall time and peak summed PSS (KB) of the command's process tree, sampled every 20 ms."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_pss_kb(proc.pid))
        time.sleep(0.02)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return time.perf_counter() - t0, peak


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    out_dir = HERE / "out" / "outputs"
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "990001-JAX-llama2-70b-bench"
    log = out_dir / f"{name}.log"
    job_dir = out_dir / name
    job_dir.mkdir(exist_ok=True)
    link = job_dir / "log"
    if not link.is_symlink():
        link.symlink_to(f"../{name}.log")
    want = int(args.size_gb * (1 << 30))
    if not log.exists() or log.stat().st_size < want:
        t0 = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "jobdiagd.sim.biglog",
                str(log),
                "--size-gb",
                str(args.size_gb),
                "--nodes",
                str(args.nodes),
            ],
            check=True,
        )
        print(f"generated {log.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f}s")
    size = log.stat().st_size
    # Warm the page cache so both tools read from memory.
    subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)
    triage = [sys.executable, "-m", "jobdiagd.cli", "triage", str(job_dir), "--no-slurm"]
    grep_t, par_t, ser_t, tree_kb = [], [], [], 0
    grep_count = ""
    for _ in range(args.repeat):
        t, grep_count = timed(["grep", "-c", "completed step:", str(log)])
        grep_t.append(t)
        t, kb = timed_tree(triage)
        par_t.append(t)
        tree_kb = max(tree_kb, kb)
        t, _ = timed([*triage, "--workers", "1"])
        ser_t.append(t)
    doc = json.loads(subprocess.run([*triage, "--json"], capture_output=True, text=True, check=True).stdout)
    rss_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    from jobdiagd.logs.scan import TRIGGERS

    literals = out_dir / "triggers.txt"
    literals.write_text("\n".join(TRIGGERS) + "\n")
    grep_f, _ = timed(["grep", "-c", "-F", "-f", str(literals), str(log)])
    g, tp, ts = min(grep_t), min(par_t), min(ser_t)
    progress = doc["progress"]
    assert isinstance(progress, dict)
    print(f"log size:              {size / 2**30:.2f} GiB ({int(grep_count)} step lines)")
    print(f"grep -c:               {g:.2f}s (best of {args.repeat})")
    print(
        f"jobdiagd triage:       {tp:.2f}s (best of {args.repeat}, {os.cpu_count()} CPUs, default workers); "
        f"status={doc['status']} last_step={progress['last_step']}"
    )
    print(f"  --workers 1:         {ts:.2f}s (best of {args.repeat})")
    print(f"ratio triage/grep:     {tp / g:.2f}x   (target <= 3x); --workers 1: {ts / g:.2f}x")
    print(f"peak RSS, one process: {rss_kb / 1024:.0f} MB (max over grep, cat, triage and its workers)")
    print(f"peak PSS, triage tree: {tree_kb / 1024:.0f} MB (parent + workers, sampled; target < 200 MB)")
    print(
        f"context: grep -c -F -f <{len(TRIGGERS)} trigger literals> (triage's pre-filter done by grep): {grep_f:.2f}s"
    )
    if not args.keep:
        log.unlink()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
