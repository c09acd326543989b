"""Benchmark: `jobdiagd triage` on a generated >= 1 GB realistic log vs `grep -c 'completed step:'`.

Not a test. Prints wall time of both on the same file in the same run, their ratio
(target: triage within 3x of grep) and triage's peak RSS (target: < 200 MB whatever
the log size). Usage: .venv/bin/python bench/bench_triage.py [--size-gb 1] [--keep]
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
    grep_t, triage_t = [], []
    grep_count = ""
    for _ in range(args.repeat):
        t, grep_count = timed(["grep", "-c", "completed step:", str(log)])
        grep_t.append(t)
        t, out = timed([sys.executable, "-m", "jobdiagd.cli", "triage", str(job_dir), "--no-slurm"])
        triage_t.append(t)
    doc = json.loads(
        subprocess.run(
            [sys.executable, "-m", "jobdiagd.cli", "triage", str(job_dir), "--json", "--no-slurm"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    rss_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    g, tr = min(grep_t), min(triage_t)
    progress = doc["progress"]
    assert isinstance(progress, dict)
    print(f"log size:            {size / 2**30:.2f} GiB ({int(grep_count)} step lines)")
    print(f"grep -c:             {g:.2f}s (best of {args.repeat})")
    print(
        f"jobdiagd triage:     {tr:.2f}s (best of {args.repeat}); status={doc['status']} last_step={progress['last_step']}"
    )
    print(f"ratio triage/grep:   {tr / g:.2f}x   (target <= 3x)")
    print(f"peak RSS (children): {rss_kb / 1024:.0f} MB (max of grep, cat and triage; target < 200 MB)")
    if not args.keep:
        log.unlink()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
