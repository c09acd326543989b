"""Benchmark: CLI start-up of `jobdiagd --help`, `status` and `triage` of a small log, against `python -c pass`.

    .venv/bin/python bench/bench_startup.py [--runs 21] [--top 15]

Not a test. For each command it prints the median wall time of N runs of the whole command in a
fresh interpreter (what a person waits for: interpreter start, imports, the work, exit), the
same for a bare `python -c pass` measured in the same run, and their ratio; then, from one run
under `python -X importtime`, the total import time, the number of modules imported (jobdiagd's
own and the rest) and the imports that cost most (cumulative microseconds, top level only).
Target (issue 10): each command under 150 ms here. `status` asks a real status socket (the
daemon's `StatusServer`, serving a canned healthy snapshot from a thread of this process);
`triage` reads the simulator's `completed-ray0` job (a 100-step, 8-node log) with a fixed `--now`.
"""

from __future__ import annotations

import argparse
import asyncio
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


def wall_ms(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def import_profile(cmd: list[str]) -> tuple[float, list[tuple[int, str]], list[str]]:
    """(total import ms, top-level imports by cumulative us, every module imported) of one run."""
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
    top.sort(reverse=True)
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
    args = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="jobdiagd-startup-") as tmp:
        from jobdiagd.sim import scenarios

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
            check = subprocess.run([py, "-c", ENTRY, *commands["status"]], capture_output=True, text=True)
            if check.returncode != 0:
                print(
                    f"status did not answer healthy (exit {check.returncode}): {check.stderr}",
                    file=sys.stderr,
                )
                return 1
            base = wall_ms([py, "-c", "pass"], args.runs)
            rows = []
            for label, argv in commands.items():
                cmd = [py, "-c", ENTRY, *argv]
                ms = wall_ms(cmd, args.runs)
                imp_ms, top, modules = import_profile(cmd)
                rows.append((label, ms, imp_ms, top, modules))
    print(f"python -c pass: {base:.1f} ms (median of {args.runs})\n")
    print(f"{'command':<22} {'wall ms':>8} {'x pass':>7} {'import ms':>10} {'modules':>8} {'jobdiagd.*':>10}")
    for label, ms, imp_ms, _top, modules in rows:
        own = sum(m.startswith("jobdiagd") for m in modules)
        print(f"{label:<22} {ms:>8.1f} {ms / base:>7.2f} {imp_ms:>10.1f} {len(modules):>8} {own:>10}")
    for label, _ms, _imp, top, modules in rows:
        print(f"\n{label}: top-level imports by cumulative time (-X importtime, one run)")
        for us, name in top[: args.top]:
            print(f"  {us / 1000:8.1f} ms  {name}")
        own = sorted(m for m in modules if m.startswith("jobdiagd"))
        print(f"  jobdiagd modules ({len(own)}): {', '.join(own)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
