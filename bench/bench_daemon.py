"""Benchmark `jobdiagd run` watching N simulated jobs that each append L lines/s, at several N.

    .venv/bin/python bench/bench_daemon.py [--jobs 200,1000] [--lines-per-s 10] [--seconds 90] [--tick 15]
    .venv/bin/python bench/bench_daemon.py --jobs 1000 --profile /tmp/daemon.pstats   # where it goes

A writer process appends real-format lines (srun -l + absl prefixes; one `completed step:`
every `--step-time` s per job, the rest NCCL/XLA chatter) to N job logs under an outputs
root; the daemon runs in outputs-discovery mode on it. For each N (one daemon run each,
in one invocation): the first tick's duration and when the daemon had caught up with the
logs already written, then, after a warm-up, the daemon's CPU share of one core (process
CPU time, utime+stime of all its threads from /proc, over the window's wall time: a loaded
machine slows the daemon but does not bill it for others' work), its RSS and peak RSS
(VmHWM), and the tick wall-time percentiles (full and file-event ticks, from the status
socket; wall time, and CPU time of the daemon's event-loop thread, which on a shared machine
leaves out the waits for a core). Tick percentiles cover every tick since start, the
catch-up included. Printed as JSON with the cost per job at each N and the ratio largest/smallest
per job (1.0 = linear in the jobs). Targets (issue 12, at 1000 jobs x 10 lines/s): < 10 %
of a core, RSS < 400 MB, full tick p99 < 250 ms, first tick < 5 s.

From the first tick to the window's end, `/metrics` is scraped every `--scrape-every` seconds
as Prometheus would (the per-job series included, rule GP-11; its cost is in the CPU figures):
each scrape's wall time seen by the client (the daemon builds it on its event loop, so a scrape
landing during a tick waits for it), and the series of the last one (all, and the per-job ones
by name: budgets and goodputs fill in over the first minutes, rules GP-11 and GP-12) and its size.

`--profile PATH`: cProfile the daemon's event-loop thread over the measurement window only (the
steady state, after catch-up and warm-up; switched on and off by SIGUSR1/SIGUSR2) and write
`PATH.<jobs>` (pstats) per run, with the top functions by own time on stderr. The profiler slows
the daemon: the figures of a profiled run are not comparable with an unprofiled one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobdiagd.service.status_socket import request

TARGETS = {"cpu_pct": 10.0, "rss_mb": 400.0, "tick_p99_ms": 250.0, "first_tick_ms": 5000.0}

WRITER = r"""
import os, sys, time, random
sys.path.insert(0, {pkg!r})
from jobdiagd_sim import lines as L
root, n, lps, step_time, count_path = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
files, steps = [], [0] * n
for i in range(n):
    name = f"{{800000 + i}}-JAX-llama3.1-8b-bench"
    d = os.path.join(root, name); os.makedirs(d, exist_ok=True)
    path = os.path.join(root, name + ".log")
    if not os.path.islink(os.path.join(d, "log")):
        os.symlink(f"../{{name}}.log", os.path.join(d, "log"))
    fh = open(path, "a", buffering=1)
    for ln in L.header_lines(job_id=str(800000 + i), name="JAX-llama3.1-8b-bench", nnodes=4,
                             nodelist="node[001-004]", jax_port=12321, ray_port=None,
                             passthrough={{"steps": 100000}}, model="llama3.1-8b"):
        fh.write(ln + "\n")
    files.append(fh)
rng = random.Random(1)
written, counted_at = 0, 0.0
period = 0.1
per_tick = lps * period
carry = 0.0
next_step = [time.time() + rng.random() * step_time for _ in range(n)]
t_next = time.time()
while True:
    now = time.time()
    carry += per_tick
    k = int(carry); carry -= k
    for i, fh in enumerate(files):
        out = []
        for j in range(k):
            if now >= next_step[i] and j == 0:
                f = L.StepFields(step=steps[i], seconds=step_time, tflops=140.0, tokens=3000.0 + rng.random() * 20,
                                 total_weights=196608, loss=2.5)
                out.append(f"{{rng.randrange(4)}}: " + L.absl_prefix(now, 1234, "metric_logger.py:232") + L.step_line(f))
                steps[i] += 1; next_step[i] += step_time
            else:
                out.append(f"{{rng.randrange(4)}}: node00{{rng.randrange(1,5)}}:1234:5678 [0] NCCL INFO Channel 0{{j}}/0 : 0[0] -> 1[1] via P2P/IPC/read")
        fh.write("\n".join(out) + "\n")
        written += len(out)
    if now - counted_at >= 1.0:
        counted_at = now
        with open(count_path + ".tmp", "w") as c:
            c.write(str(written))
        os.replace(count_path + ".tmp", count_path)
    t_next += period
    time.sleep(max(0.0, t_next - time.time()))
"""


# Runs the daemon's CLI with a profiler that SIGUSR1 starts and SIGUSR2 stops and dumps. It
# profiles the thread the signal lands in: the main thread, which runs the event loop.
PROFILED = r"""
import cProfile, signal, sys
prof = cProfile.Profile()
out = sys.argv.pop(1)
signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
def _dump(*_):
    prof.disable()
    prof.dump_stats(out)
signal.signal(signal.SIGUSR2, _dump)
from jobdiagd.cli import main
sys.exit(main())
"""


def proc_cpu_seconds(pid: int, path: str | None = None) -> float:
    fields = Path(path or f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def main_thread_cpu_seconds(pid: int) -> float:
    """CPU time of the process's main thread (the daemon's event loop); the rest is the
    threads: watchfiles' watcher, `asyncio.to_thread` reads, SQLite."""
    return proc_cpu_seconds(pid, f"/proc/{pid}/task/{pid}/stat")


def threads_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU time per thread name (threads of one name summed; the main thread is `main`)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = "main" if task.name == str(pid) else (task / "comm").read_text().strip()
            secs = proc_cpu_seconds(pid, str(task / "stat"))
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
        out[name] = out.get(name, 0.0) + secs
    return out


def proc_mem_mb(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def lines_written(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def status(sock: Path, timeout: float = 10.0) -> dict[str, Any] | None:
    try:
        answer: dict[str, Any] = request(sock, "status", timeout=timeout)["result"]
    except Exception:
        return None  # not listening yet, or busy in a long tick
    return answer


def wait_for(sock: Path, done: Callable[[dict[str, Any]], bool], deadline: float) -> dict[str, Any] | None:
    while time.monotonic() < deadline:
        st = status(sock, timeout=max(1.0, min(10.0, deadline - time.monotonic())))
        if st is not None and done(st):
            return st
        time.sleep(0.25)
    return None


def first_tick_done(st: dict[str, Any]) -> bool:
    return bool((st.get("tick_durations") or {}).get("startup", {}).get("n"))


def caught_up(st: dict[str, Any]) -> bool:
    # Daemons without background catch-up have caught up once their first tick is over.
    return first_tick_done(st) and not (st.get("catch_up") or {}).get("pending")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Scraper(threading.Thread):
    """Scrapes /metrics every `every` seconds, as Prometheus would, until stopped; keeps each
    scrape's wall time and the last body."""

    def __init__(self, port: int, every: float) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.every = every
        self.stop = threading.Event()
        self.times: list[float] = []
        self.failed = 0
        self.body = b""

    def run(self) -> None:
        while True:
            t = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=60) as resp:
                    self.body = resp.read()
                self.times.append(time.monotonic() - t)
            except OSError:
                self.failed += 1
            if self.stop.wait(max(0.0, self.every - (time.monotonic() - t))):
                return

    def figures(self) -> dict[str, Any]:
        names: dict[str, int] = {}
        for line in self.body.decode().splitlines():
            if line and not line.startswith("#"):
                name = line.split("{", 1)[0].split(" ", 1)[0]
                names[name] = names.get(name, 0) + 1
        per_job = {k: v for k, v in sorted(names.items()) if k.startswith("jobdiagd_job_")}
        times = sorted(self.times)
        return {
            "every_s": self.every,
            "scrapes": len(times),
            "failed": self.failed,
            "wall_ms_p50": round(times[len(times) // 2] * 1000, 1) if times else None,
            "wall_ms_max": round(times[-1] * 1000, 1) if times else None,
            "last_series": sum(names.values()),
            "last_job_series": sum(per_job.values()),
            "last_job_series_by_name": per_job,
            "last_bytes": len(self.body),
        }


def run_one(jobs: int, a: argparse.Namespace, pkg: str) -> dict[str, Any]:
    """One daemon watching `jobs` simulated jobs: its cost over the window after catch-up."""
    with tempfile.TemporaryDirectory(prefix="jd-bench-", dir="/tmp") as d:
        work = Path(d)
        outputs = work / "outputs"
        outputs.mkdir()
        count = work / "written"
        sock = work / "jd.sock"
        cfg = work / "cfg.toml"
        port = free_port()
        cfg.write_text(
            f'[daemon]\nstate_dir = "{work}/state"\nsocket_path = "{sock}"\n'
            f'tick_seconds = {a.tick}\nlog_level = "warning"\nmetrics_port = {port}\n'
            "[notifiers.console]\nenabled = false\n[notifiers.jsonl]\nenabled = true\n"
        )
        writer = subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER.format(pkg=pkg),
                str(outputs),
                str(jobs),
                str(a.lines_per_s),
                str(a.step_time),
                str(count),
            ]
        )
        time.sleep(a.head_start)  # logs already written when the daemon starts: it catches up
        env = dict(os.environ, PYTHONPATH=pkg)
        started = time.monotonic()
        prof_out = f"{a.profile}.{jobs}" if a.profile else None
        entry = ["-c", PROFILED, prof_out] if prof_out else ["-m", "jobdiagd.cli"]
        daemon = subprocess.Popen(
            [sys.executable, *entry, "run", "--config", str(cfg), "--watch", str(outputs)],
            stdout=subprocess.DEVNULL,
            env=env,
        )
        try:
            deadline = started + a.startup_timeout
            first = wait_for(sock, first_tick_done, deadline)
            first_tick_s = time.monotonic() - started if first is not None else None
            ready = wait_for(sock, caught_up, deadline) if first is not None else None
            caught_up_s = time.monotonic() - started if ready is not None else None
            startup_cpu_s = proc_cpu_seconds(daemon.pid)
            scraper = Scraper(port, a.scrape_every) if a.scrape_every > 0 else None
            if scraper is not None:
                scraper.start()
            time.sleep(a.warmup)
            if prof_out:
                daemon.send_signal(signal.SIGUSR1)
            m0, th0 = main_thread_cpu_seconds(daemon.pid), threads_cpu_seconds(daemon.pid)
            c0, t0, w0 = proc_cpu_seconds(daemon.pid), time.monotonic(), lines_written(count)
            time.sleep(a.seconds)
            c1, t1, w1 = proc_cpu_seconds(daemon.pid), time.monotonic(), lines_written(count)
            m1, th1 = main_thread_cpu_seconds(daemon.pid), threads_cpu_seconds(daemon.pid)
            if prof_out:
                daemon.send_signal(signal.SIGUSR2)
                time.sleep(2.0)  # the dump happens between two of the loop's callbacks
            mem = proc_mem_mb(daemon.pid)
            st = status(sock, timeout=30) or {}
            if scraper is not None:
                scraper.stop.set()
                scraper.join(timeout=90)
            scrape = scraper.figures() if scraper is not None else None
            notes = work / "state" / "notifications.jsonl"
            alerts = sum(1 for _ in notes.open()) if notes.exists() else 0
        finally:
            daemon.send_signal(signal.SIGTERM)
            writer.kill()
            rc = daemon.wait(timeout=60)
            writer.wait(timeout=10)
    if prof_out:
        print_profile(prof_out)
    ticks = st.get("tick_durations") or {}
    watched = st.get("jobs", [])
    cpu_pct = (c1 - c0) / (t1 - t0) * 100
    rss = mem.get("VmRSS", 0.0)
    full_p99 = (ticks.get("full") or {}).get("p99_ms")
    full_cpu_p99 = (ticks.get("full") or {}).get("cpu_p99_ms")
    return {
        "jobs": jobs,
        "jobs_watched": len(watched),
        "steps_seen_min": min((j["last_step"] or 0) for j in watched) if watched else None,
        "lines_per_s_per_job_written": round((w1 - w0) / (t1 - t0) / jobs, 2),
        "first_tick_ms": (ticks.get("startup") or {}).get("max_ms"),
        "first_tick_done_after_start_s": round(first_tick_s, 2) if first_tick_s is not None else None,
        "caught_up_after_start_s": round(caught_up_s, 2) if caught_up_s is not None else None,
        "startup_cpu_s": round(startup_cpu_s, 2),
        "window_s": round(t1 - t0, 1),
        "cpu_pct_of_one_core": round(cpu_pct, 2),
        "cpu_pct_event_loop_thread": round((m1 - m0) / (t1 - t0) * 100, 2),
        "cpu_pct_by_thread_name": {
            k: round((v - th0.get(k, 0.0)) / (t1 - t0) * 100, 2) for k, v in sorted(th1.items())
        },
        "rss_mb": round(rss, 1),
        "rss_peak_mb": round(mem.get("VmHWM", 0.0), 1),
        "full_tick_p99_ms": full_p99,
        "full_tick_cpu_p99_ms": full_cpu_p99,
        "ticks": ticks,
        "per_job": {
            "cpu_pct": round(cpu_pct / jobs, 5),
            "rss_mb": round(rss / jobs, 4),
            "full_tick_p99_ms": round(full_p99 / jobs, 4) if full_p99 is not None else None,
            "full_tick_cpu_p99_ms": round(full_cpu_p99 / jobs, 4) if full_cpu_p99 is not None else None,
        },
        "notifications": alerts,
        "scrape": scrape,
        "daemon_exit": rc,
    }


def print_profile(path: str, top: int = 30) -> None:
    import pstats

    if not Path(path).exists():
        print(f"no profile written to {path}", file=sys.stderr)
        return
    print(f"--- profile {path}: top {top} by own time ---", file=sys.stderr)
    pstats.Stats(path, stream=sys.stderr).sort_stats("tottime").print_stats(top)


def ratio(big: float | None, small: float | None) -> float | None:
    return round(big / small, 2) if big is not None and small else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", default="200,1000", help="comma-separated job counts, each its own daemon run")
    p.add_argument("--lines-per-s", type=float, default=10.0)
    p.add_argument("--step-time", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=90.0, help="measurement window")
    p.add_argument("--warmup", type=float, default=20.0, help="after the daemon has caught up")
    p.add_argument(
        "--head-start", type=float, default=2.0, help="seconds of log written before the daemon starts"
    )
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--tick", type=float, default=15.0)
    p.add_argument("--profile", metavar="PATH", help="cProfile the measurement window to PATH.<jobs>")
    p.add_argument(
        "--scrape-every",
        type=float,
        default=15.0,
        help="scrape /metrics every S seconds from the first tick to the window's end (0: never)",
    )
    p.add_argument(
        "--package-dir",
        default=str(Path(__file__).resolve().parents[1] / "daemon"),
        help="the jobdiagd package to run (e.g. an exported older version, for a before/after)",
    )
    a = p.parse_args(argv)
    counts = [int(x) for x in str(a.jobs).split(",") if x.strip()]
    runs = [run_one(n, a, a.package_dir) for n in counts]
    result: dict[str, Any] = {
        "measured": "daemon process CPU time (utime+stime, all threads) over the window / window wall time",
        "package": a.package_dir,
        "profiled": bool(a.profile),
        "runs": runs,
    }
    if len(runs) >= 2:
        small, big = runs[0], runs[-1]
        result[f"per_job_ratio_{big['jobs']}_over_{small['jobs']}"] = {
            k: ratio(big["per_job"][k], small["per_job"][k]) for k in small["per_job"]
        }
    big = runs[-1]
    result["targets"] = {
        "jobs": big["jobs"],
        "cpu_pct_of_one_core": [big["cpu_pct_of_one_core"], "<", TARGETS["cpu_pct"]],
        "rss_mb": [big["rss_peak_mb"], "<", TARGETS["rss_mb"]],
        "full_tick_p99_ms": [big["full_tick_p99_ms"], "<", TARGETS["tick_p99_ms"]],
        "full_tick_cpu_p99_ms": [big["full_tick_cpu_p99_ms"], "<", TARGETS["tick_p99_ms"]],
        "first_tick_ms": [big["first_tick_ms"], "<", TARGETS["first_tick_ms"]],
    }
    # Each figure over its target (< 1.0: met), the form the README quotes.
    result["ratio_to_target"] = {
        k: ratio(v[0], v[2]) for k, v in result["targets"].items() if isinstance(v, list)
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
