"""Benchmark one idle `FileTail.poll` (nothing new to read) with and without the log checks.

    .venv/bin/python bench/bench_tail_poll.py [--polls 20000] [--rounds 5]

The daemon polls every watched log every tick; an idle poll is its commonest operation. Three
ways over the same job log (a `log` link in a job dir, a few directories deep), each the best
of `--rounds` rounds, printed as JSON with ratios against the baseline measured in the same run:
- `plain`: stat + open + pread of the resolved file, what a bare tail costs (the baseline);
- `regular_only`: `FileTail` with `LogAccess()` (regular files only, anywhere);
- `job_access`: `FileTail` with the daemon's `job_access` (inside the roots, no-follow walk,
  owner check) — what the daemon runs.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from jobdiagd.logs.safeopen import LogAccess
from jobdiagd.sources.tail import FileTail
from jobdiagd.triage.resolve import job_access, resolve
from jobdiagd_sim import lines as L


def make_job(root: Path) -> Path:
    outputs = root / "shared" / "team" / "outputs"
    name = "9001-JAX-llama3.1-8b-bench"
    job_dir = outputs / name
    job_dir.mkdir(parents=True)
    log = outputs / f"{name}.log"
    (job_dir / "log").symlink_to(f"../{log.name}")
    with open(log, "w") as fh:
        for k in range(50):
            f = L.StepFields(step=k, seconds=2.0, tflops=140.0, tokens=3000.0, total_weights=1, loss=2.0)
            fh.write(L.srun_prefix(0, 2) + L.step_line(f) + "\n")
    return job_dir


def best_us(fn: Callable[[], object], polls: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(polls):
            fn()
        best = min(best, (time.perf_counter() - t) / polls * 1e6)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--polls", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tail-") as tmp:
        job_dir = make_job(Path(tmp))
        link = job_dir / "log"
        real = os.path.realpath(link)

        def plain() -> None:
            os.stat(real)
            fd = os.open(real, os.O_RDONLY)
            try:
                os.pread(fd, 64, 0)
            finally:
                os.close(fd)

        tails = {
            "regular_only": FileTail(link, ref_time=0.0, access=LogAccess()),
            "job_access": FileTail(link, ref_time=0.0, access=job_access(resolve(str(job_dir), []))),
        }
        for ft in tails.values():
            ft.poll()  # the catch-up read; what follows is idle
        out: dict[str, object] = {"polls": args.polls, "rounds": args.rounds}
        base = best_us(plain, args.polls, args.rounds)
        out["plain_us"] = round(base, 1)
        for name, ft in tails.items():
            us = best_us(ft.poll, args.polls, args.rounds)
            out[f"{name}_us"] = round(us, 1)
            out[f"{name}_vs_plain"] = round(us / base, 2)
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
