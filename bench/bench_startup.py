"""Benchmark: CLI start-up of `jobdiagd --help`, `status` and `triage` of a small log, against `python -c pass`.

    .venv/bin/python bench/bench_startup.py [--runs 21] [--top 15]

Not a test. For each command it prints, as medians of N runs in fresh interpreters:
- `start ms`: interpreter start + the command's imports, without its work: a `python -c` that
  imports exactly the top-level modules the command imported (found by one run under
  `python -X importtime`) -- the figure issue 10 sets a target for: under 150 ms here;
- `wall ms`: the whole command (what a person waits for: start, the work, exit);
- both as a ratio to a bare `python -c pass` measured in the same run;
and, from the `-X importtime` run (which inflates times), the import total, the number of
modules imported (jobdiagd's own and the rest) and the imports that cost most (cumulative,
top level only). `status` asks a real status socket (the
daemon's `StatusServer`, serving a canned healthy snapshot from a thread of this process);
`triage` reads the simulator's `completed-ray0` job (a 100-step, 8-node log) with a fixed `--now`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# The console script's own body (.venv/bin/jobdiagd), so the figure is what `jobdiagd ...` costs.
ENTRY = "import sys\nfrom jobdiagd.cli import main\nsys.exit(main())\n"


ENV = dict(os.environ)


def wall_ms(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=ENV)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def import_profile(cmd: list[str]) -> tuple[float, list[tuple[int, str]], list[str]]:
    """(total import ms, top-level imports by cumulative us in import order, every module
    imported) of one run."""
    p = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], capture_output=True, text=True, check=False)
    top: list[tuple[int, str]] = []
    modules: list[str] = []
    for line in p.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cum, name = line.split("|", 2)
        if not cum.strip().isdigit():
            continue  # the header line
        modules.append(name.strip())
        if name.startswith(" ") and not name.startswith("  "):  # top level: one space, no nesting
            top.append((int(cum), name.strip()))
    return sum(us for us, _ in top) / 1000, top, modules


class CannedStatus:
    """A real status socket in a thread, answering a healthy one-job snapshot."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _snapshot(self) -> dict[str, Any]:
        now = time.time()
        return {
            "version": "bench",
            "pid": 1,
            "started_at": now - 3600,
            "tick_seconds": 15.0,
            "last_tick_at": now - 2,
            "last_tick_ok": True,
            "ticks": 240,
            "sources": {"slurm": {"ok": True}},
            "jobs": [
                {
                    "job_id": "48101",
                    "state": "RUNNING",
                    "name": "JAX-llama2-70b",
                    "last_step": 99,
                    "last_step_at": now - 5,
                    "total_steps": 100,
                    "step_time_s": 6.0,
                    "phase": "steady",
                }
            ],
            "open_incidents": [],
            "mutes": [],
        }

    def _run(self) -> None:
        from jobdiagd.service.status_socket import StatusServer

        asyncio.set_event_loop(self._loop)
        server = StatusServer(self.path, self._snapshot)
        self._loop.run_until_complete(server.start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(server.stop())

    def __enter__(self) -> CannedStatus:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--top", type=int, default=12, help="imports listed per command")
    ap.add_argument(
        "--cached-bytecode",
        action="store_true",
        help="let the commands write and use __pycache__ (as an installed package does); by default "
        "they run in this environment as it is (where PYTHONDONTWRITEBYTECODE=1 makes every start "
        "compile jobdiagd's sources)",
    )
    args = ap.parse_args()
    if args.cached_bytecode:
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(Path(__file__).resolve().parents[1] / "daemon")],
            env=ENV,
            check=True,
        )
    print(f"PYTHONDONTWRITEBYTECODE={ENV.get('PYTHONDONTWRITEBYTECODE', '(unset)')}")
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="jobdiagd-startup-") as tmp:
        from jobdiagd_sim import scenarios

        root = Path(tmp) / "outputs"
        root.mkdir()
        e = scenarios.build("completed-ray0", root)
        sock = Path(tmp) / "status.sock"
        commands = {
            "--help": ["--help"],
            "status": ["status", "--socket", str(sock)],
            "triage (small log)": ["triage", str(e.job_dir), "--now", repr(e.now), "--no-slurm"],
        }
        with CannedStatus(sock):
            check = subprocess.run(
                [py, "-c", ENTRY, *commands["status"]], capture_output=True, text=True, env=ENV
            )
            if check.returncode != 0:
                print(
                    f"status did not answer healthy (exit {check.returncode}): {check.stderr}",
                    file=sys.stderr,
                )
                return 1
            profiles = {}
            for label, argv in commands.items():
                cmd = [py, "-c", ENTRY, *argv]
                imp_ms, top, modules = import_profile(cmd)
                # The same imports, in the same order, without the command's work.
                only_imports = "import " + ", ".join(name for _, name in top) if top else "pass"
                profiles[label] = (cmd, [py, "-c", only_imports], imp_ms, top, modules)
            # Interleaved rounds: a load change on this shared machine hits every figure alike.
            timed: dict[str, list[float]] = {}
            for _ in range(args.runs):
                timed.setdefault("pass", []).append(wall_ms([py, "-c", "pass"], 1))
                for label, (cmd, imports, *_rest) in profiles.items():
                    timed.setdefault(f"start {label}", []).append(wall_ms(imports, 1))
                    timed.setdefault(f"wall {label}", []).append(wall_ms(cmd, 1))
            base = statistics.median(timed["pass"])
            rows = [
                (
                    label,
                    statistics.median(timed[f"start {label}"]),
                    statistics.median(timed[f"wall {label}"]),
                    imp_ms,
                    top,
                    modules,
                )
                for label, (_cmd, _imports, imp_ms, top, modules) in profiles.items()
            ]
    print(f"python -c pass: {base:.1f} ms (median of {args.runs})\n")
    print(
        f"{'command':<22} {'start ms':>9} {'x pass':>7} {'wall ms':>8} {'x pass':>7} "
        f"{'importtime ms':>14} {'modules':>8} {'jobdiagd.*':>10}"
    )
    for label, start, ms, imp_ms, _top, modules in rows:
        own = sum(m.startswith("jobdiagd") for m in modules)
        print(
            f"{label:<22} {start:>9.1f} {start / base:>7.2f} {ms:>8.1f} {ms / base:>7.2f} "
            f"{imp_ms:>14.1f} {len(modules):>8} {own:>10}"
        )
    for label, _start, _ms, _imp, top, modules in rows:
        print(f"\n{label}: top-level imports by cumulative time (-X importtime, one run)")
        for us, name in sorted(top, reverse=True)[: args.top]:
            print(f"  {us / 1000:8.1f} ms  {name}")
        own = sorted(m for m in modules if m.startswith("jobdiagd"))
        print(f"  jobdiagd modules ({len(own)}): {', '.join(own)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
