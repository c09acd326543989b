"""Render every report jobdiagd produces, from fixed inputs, into one directory (a refactor's check).

    .venv/bin/python scripts/snapshot_reports.py OUT_DIR [--work DIR] [--no-tsdb]
    diff -r /tmp/before OUT_DIR          # empty: no report changed by a byte

A refactor that must not change behaviour runs this on the starting commit and again after
each step; `diff -r` of the two directories is the proof. What it renders:

- `jobdiagd triage` markdown and `--json` (fixed `--now`, `--no-slurm`, the expected
  `--slurm-state`) for the bundled examples, the simulator's scenario corpus (which holds the
  golden inputs: `golden/` renders those exactly as tests/triage/test_report.py compares them),
  and the real-world excerpt corpus (tests/triage/realworld); plus `triage --all` of each root;
- `jobdiagd diagnose` markdown and `--json` on promtool-built TSDBs of every scenario of
  `jobdiagd_sim.metrics` (each run on a fresh copy: Prometheus writes into what it opens);
- `jobdiagd compare` markdown and `--json` on one pair (restore-fresh vs restore-leak);
- `jobdiagd backtest` text and `--json` on the scenario corpus and the multi-task undated corpus
  (`jobdiagd_sim.multitask`).

Determinism: PYTHONHASHSEED=0 and TZ=UTC (the script re-executes itself to set them), the real
clock replaced by a constant for the commands that take no `--now`, inputs built with fixed seeds
under a work directory whose path is written as `$WORK` in the outputs. Each command's exit code
and its stderr are kept beside its stdout (`.rc`), so an error message that changes shows too.
Triage runs in-process (hundreds of calls); the commands that start Prometheus or configure
logging run as subprocesses.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "daemon"), str(REPO / "sim"), str(REPO)]

# The fixed clock of the commands without `--now` (diagnose, compare, backtest): 2026-06-15.
FIXED_NOW = 1781481600.0
_WRAP = (
    "import sys\n"
    "import jobdiagd.clock as c\n"
    f"c.wall = lambda: {FIXED_NOW!r}\n"
    "from jobdiagd.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
TSDB_COMPARE_PAIR = ("restore-fresh", "restore-leak")


class Snapshot:
    def __init__(self, out: Path, work: Path) -> None:
        self.out = out
        self.work = work
        self.count = 0

    def _norm(self, text: str) -> str:
        return text.replace(str(self.work), "$WORK")

    def write(self, rel: str, stdout: str, rc: int, stderr: str) -> None:
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self._norm(stdout))
        if rc != 0 or stderr:
            path.with_name(path.name + ".rc").write_text(f"exit {rc}\n{self._norm(stderr)}")
        self.count += 1

    def cli(self, rel: str, argv: Sequence[str]) -> None:
        """`jobdiagd ARGV` in this process."""
        from jobdiagd.cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(argv))
            except SystemExit as exc:  # argparse errors
                rc = exc.code if isinstance(exc.code, int) else 1
        self.write(rel, out.getvalue(), rc, err.getvalue())

    def subprocess(self, rel: str, argv: Sequence[str], *, keep_stderr: bool = False) -> None:
        """`jobdiagd ARGV` in a fresh interpreter with the clock fixed. Log lines on stderr carry
        timestamps, so stderr is shown on failure but kept only when asked."""
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "daemon"), str(REPO)]))
        p = subprocess.run(
            [sys.executable, "-c", _WRAP, *argv], capture_output=True, text=True, env=env, cwd=self.work
        )
        if p.returncode != 0:
            print(f"  {rel}: exit {p.returncode}\n{p.stderr[-2000:]}", file=sys.stderr)
        self.write(rel, p.stdout, p.returncode, p.stderr if keep_stderr else "")


def triage_both(snap: Snapshot, rel: str, target: Path, root: Path, now: float, state: object) -> None:
    argv = ["triage", str(target), "--outputs", str(root), "--now", repr(now), "--no-slurm"]
    if state:
        argv += ["--slurm-state", str(state)]
    snap.cli(f"{rel}.md", argv)
    snap.cli(f"{rel}.json", [*argv, "--json"])


def triage_all(snap: Snapshot, rel: str, root: Path, now: float) -> None:
    argv = ["triage", "--all", "--outputs", str(root), "--now", repr(now), "--no-slurm"]
    snap.cli(f"{rel}/_all.md", argv)
    snap.cli(f"{rel}/_all.json", [*argv, "--json"])


def examples(snap: Snapshot) -> None:
    root = snap.work / "examples" / "outputs"
    shutil.copytree(REPO / "daemon" / "jobdiagd" / "examples" / "outputs", root, symlinks=True)
    jobs = json.loads((root / "manifest.json").read_text())["jobs"]
    for j in jobs:
        triage_both(snap, f"examples/{j['scenario']}", root / j["job_dir"], root, j["now"], j["slurm_state"])
    triage_all(snap, "examples", root, max(j["now"] for j in jobs))


def scenario_corpus(snap: Snapshot) -> Path:
    from jobdiagd_sim import scenarios

    root = snap.work / "scenarios" / "outputs"
    root.mkdir(parents=True)
    exps = scenarios.build_all(root, seed=0)
    for e in exps:
        target = e.job_dir if e.job_dir.exists() else e.log
        triage_both(snap, f"scenarios/{e.scenario}", target, root, e.now, e.slurm_state)
    triage_all(snap, "scenarios", root, max(e.now for e in exps))
    # The golden inputs, rendered as tests/triage/test_report.py renders them (root -> "outputs").
    by_name = {e.scenario: e for e in exps}
    for name in sorted(g.stem for g in REPO.glob("tests/**/golden/*.md")):
        e = by_name[name]
        argv = ["triage", str(e.job_dir), "--outputs", str(root), "--now", repr(e.now), "--no-slurm"]
        if e.slurm_state:
            argv += ["--slurm-state", e.slurm_state]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            from jobdiagd.cli import main

            main(argv)
        golden = out.getvalue().replace(str(root), "outputs")
        snap.write(f"golden/{name}.md", golden, 0, "")
    return root


def realworld(snap: Snapshot) -> None:
    from tests.triage.realworld.builder import build_all

    for case in build_all(snap.work / "realworld"):
        triage_both(
            snap,
            f"realworld/{case.excerpt.id}",
            case.job_dir,
            case.outputs_root,
            case.now,
            case.slurm_state,
        )


def backtests(snap: Snapshot, scenario_root: Path) -> None:
    from jobdiagd_sim import multitask

    mt_root = snap.work / "multitask" / "outputs"
    mt_root.mkdir(parents=True)
    multitask.build_all(mt_root, seed=0)
    for name, root in (("scenarios", scenario_root), ("multitask", mt_root)):
        snap.subprocess(f"backtest/{name}.txt", ["backtest", str(root)], keep_stderr=True)
        snap.subprocess(f"backtest/{name}.json", ["backtest", str(root), "--json"], keep_stderr=True)


def tsdb(snap: Snapshot) -> None:
    from jobdiagd_sim.metrics import SCENARIOS, JobSim, scenario, write_job

    built = snap.work / "tsdb-built"
    files = {}
    for name in SCENARIOS:
        files[name] = write_job(JobSim(scenario(name)), built / name)
    runs = 0

    def fresh(name: str) -> Path:
        """A private copy of one job's outputs root (Prometheus writes wal/ into what it opens)."""
        nonlocal runs
        runs += 1
        dest = snap.work / "tsdb-runs" / f"{runs:03d}-{name}"
        shutil.copytree(built / name, dest, symlinks=True)
        return dest

    for name in SCENARIOS:
        for suffix, extra in (("md", []), ("json", ["--json"])):
            root = fresh(name)
            job_dir = root / files[name].job_dir.name
            argv = ["diagnose", str(job_dir), "--outputs", str(root), *extra]
            snap.subprocess(f"diagnose/{name}.{suffix}", argv)
    a, b = TSDB_COMPARE_PAIR
    for suffix, extra in (("md", []), ("json", ["--json"])):
        ra, rb = fresh(a), fresh(b)
        argv = ["compare", str(ra / files[a].job_dir.name), str(rb / files[b].job_dir.name), *extra]
        snap.subprocess(f"compare/{a}--{b}.{suffix}", argv)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="directory to write the reports into (must not exist)")
    p.add_argument("--work", type=Path, help="where to build the inputs (default: a temp dir, removed)")
    p.add_argument("--no-tsdb", action="store_true", help="skip diagnose/compare (no promtool/prometheus)")
    args = p.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != "0" or os.environ.get("TZ") != "UTC":
        env = dict(os.environ, PYTHONHASHSEED="0", TZ="UTC")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    time.tzset()
    out = args.out.resolve()
    if out.exists():
        p.error(f"{out} exists; give a new directory")
    out.mkdir(parents=True)
    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="jobdiagd-snapshot-")
        work = Path(tmp.name)
    else:
        work = args.work.resolve()
        work.mkdir(parents=True, exist_ok=False)
    snap = Snapshot(out, work)
    t0 = time.monotonic()
    try:
        for label, step in (
            ("examples", lambda: examples(snap)),
            ("scenario corpus + golden", lambda: backtests(snap, scenario_corpus(snap))),
            ("real-world corpus", lambda: realworld(snap)),
            ("tsdb diagnose + compare", (lambda: None) if args.no_tsdb else (lambda: tsdb(snap))),
        ):
            t = time.monotonic()
            step()
            print(f"{label}: done in {time.monotonic() - t:.0f}s", file=sys.stderr)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(f"{snap.count} reports in {out} ({time.monotonic() - t0:.0f}s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
