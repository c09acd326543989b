"""`jobdiagd goodput` over a simulated archive of 10,000 jobs: cold, warm (the cache), against `triage --all`.

    .venv/bin/python bench/bench_goodput.py [--jobs 10000] [--json] [--keep DIR]

Builds `jobdiagd_sim.archive` with cheap jobs (`small=True`: 1-2 nodes, tens of steps; chains
that hang, crash, are requeued or resubmitted) until the archive holds `--jobs` job logs, then
runs, each in this process with its output discarded:
- `jobdiagd triage --all` of the archive (the baseline: one triage per job);
- `jobdiagd goodput` cold (an empty cache: every job triaged, every hang replayed through the
  detectors and its log re-read for the mtime-monitor model), warm (the same cache, nothing
  changed), cold with `--no-replay`, and warm with the PNG.
Figures are ratios (warm/cold, goodput cold per job / triage per job); wall and CPU seconds are
printed too. The machine is shared: wall time is noisy, CPU time less so.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobdiagd.cli import main as cli
from jobdiagd_sim.archive import build_archive


def _timed(fn: Callable[[], int]) -> dict[str, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        rc = fn()
    assert rc in (0, 1), rc
    return {"wall_s": round(time.perf_counter() - wall, 2), "cpu_s": round(time.process_time() - cpu, 2)}


def build(outputs: Path, jobs: int) -> tuple[dict[str, Any], list[Path]]:
    """Parts of about 1,000 jobs each (their own roots, job ids never reused) until `jobs` logs."""
    t = time.perf_counter()
    chains = runs = made = 0
    roots: list[Path] = []
    while made < jobs:
        part = outputs / f"part{len(roots)}"
        done = build_archive(
            part, chains=max(1, min(520, (jobs - made) // 2)), seed=len(roots), small=True, days=56,
            first_id=100_000 + made * 2,
        )  # fmt: skip
        roots.append(part)
        made += len(list(part.glob("*.log")))
        chains += len(done)
        runs += sum(len(c.runs) for c in done)
    info = {"jobs": made, "chains": chains, "runs": runs, "build_s": round(time.perf_counter() - t, 1)}
    return info, roots


def run(root: Path, jobs: int) -> dict[str, Any]:
    outputs = root / "outputs"
    outputs.mkdir(parents=True)
    info, roots = build(outputs, jobs)
    out: dict[str, Any] = {"archive": info}
    n = info["jobs"]
    paths = [str(r) for r in roots]
    base = [*paths, "--no-slurm", "--now", "2026-12-01T00:00:00"]
    outs = [x for r in paths for x in ("--outputs", r)]
    out["triage_all"] = _timed(lambda: cli(["triage", "--all", *outs, "--no-slurm"]))
    cache = ["--cache", str(root / "cache")]
    out["goodput_cold"] = _timed(lambda: cli(["goodput", *base, "--no-png", *cache]))
    out["goodput_warm"] = _timed(lambda: cli(["goodput", *base, "--no-png", *cache]))
    png = root / "goodput.png"
    out["goodput_warm_png"] = _timed(lambda: cli(["goodput", *base, "--png", str(png), *cache]))
    out["goodput_cold_no_replay"] = _timed(
        lambda: cli(["goodput", *base, "--no-png", "--no-replay", "--cache", str(root / "cache2")])
    )
    tri, cold, warm = out["triage_all"], out["goodput_cold"], out["goodput_warm"]
    out["ratios"] = {
        "warm_over_cold_cpu": round(warm["cpu_s"] / cold["cpu_s"], 3),
        "cold_over_triage_all_cpu": round(cold["cpu_s"] / tri["cpu_s"], 2),
        "cold_no_replay_over_triage_all_cpu": round(out["goodput_cold_no_replay"]["cpu_s"] / tri["cpu_s"], 2),
        "cold_ms_per_job_cpu": round(cold["cpu_s"] / n * 1000, 2),
        "warm_ms_per_job_cpu": round(warm["cpu_s"] / n * 1000, 3),
        "triage_ms_per_job_cpu": round(tri["cpu_s"] / n * 1000, 2),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--json", action="store_true")
    p.add_argument("--keep", type=Path, default=None, help="build and keep the archive here")
    a = p.parse_args(argv)
    if a.keep is not None:
        res = run(a.keep, a.jobs)
    else:
        with tempfile.TemporaryDirectory(prefix="jd-goodput-") as d:
            res = run(Path(d), a.jobs)
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    arch = res["archive"]
    print(
        f"archive: {arch['jobs']} jobs, {arch['runs']} runs in {arch['chains']} chains (built in {arch['build_s']} s)"
    )
    for k in ("triage_all", "goodput_cold", "goodput_warm", "goodput_warm_png", "goodput_cold_no_replay"):
        print(f"  {k:<24} wall {res[k]['wall_s']:>8.2f} s   cpu {res[k]['cpu_s']:>8.2f} s")
    for k, v in res["ratios"].items():
        print(f"  {k:<36} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
