"""Benchmark `jobdiagd run` watching N simulated jobs that each append L lines/s.

    .venv/bin/python bench/bench_daemon.py [--jobs 200] [--lines-per-s 10] [--seconds 90] [--tick 15]

A writer process appends real-format lines (srun -l + absl prefixes; one `completed step:`
every `--step-time` s per job, the rest NCCL/XLA chatter) to N job logs under an outputs
root; the daemon runs in outputs-discovery mode on it. After a warm-up, the daemon's CPU
share of one core (utime+stime from /proc over the window), its peak RSS (VmHWM) and the
tick wall-time percentiles (full and file-event ticks, from the status socket) are printed
as JSON. Targets (issue 3): < 5% of a core, RSS < 250 MB, tick p99 < 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jobdiagd.service.status_socket import request

WRITER = r"""
import os, sys, time, random
sys.path.insert(0, {pkg!r})
from jobdiagd.sim import lines as L
root, n, lps, step_time = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
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
    t_next += period
    time.sleep(max(0.0, t_next - time.time()))
"""


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def proc_mem_mb(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--lines-per-s", type=float, default=10.0)
    p.add_argument("--step-time", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=90.0, help="measurement window")
    p.add_argument("--warmup", type=float, default=20.0)
    p.add_argument("--tick", type=float, default=15.0)
    a = p.parse_args(argv)
    pkg = str(Path(__file__).resolve().parents[1] / "daemon")
    with tempfile.TemporaryDirectory(prefix="jd-bench-", dir="/tmp") as d:
        work = Path(d)
        outputs = work / "outputs"
        outputs.mkdir()
        cfg = work / "cfg.toml"
        cfg.write_text(
            f'[daemon]\nstate_dir = "{work}/state"\nsocket_path = "{work}/jd.sock"\n'
            f'tick_seconds = {a.tick}\nlog_level = "warning"\n'
            "[notifiers.console]\nenabled = false\n[notifiers.jsonl]\nenabled = true\n"
        )
        writer = subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER.format(pkg=pkg),
                str(outputs),
                str(a.jobs),
                str(a.lines_per_s),
                str(a.step_time),
            ]
        )
        time.sleep(2.0)
        daemon = subprocess.Popen(
            [sys.executable, "-m", "jobdiagd.cli", "run", "--config", str(cfg), "--watch", str(outputs)],
            stdout=subprocess.DEVNULL,
        )
        try:
            time.sleep(a.warmup)
            c0, t0 = proc_cpu_seconds(daemon.pid), time.monotonic()
            time.sleep(a.seconds)
            c1, t1 = proc_cpu_seconds(daemon.pid), time.monotonic()
            mem = proc_mem_mb(daemon.pid)
            st: dict[str, Any] = request(work / "jd.sock", "status", timeout=10)["result"]
            alerts = (
                sum(1 for _ in (work / "state" / "notifications.jsonl").open())
                if (work / "state" / "notifications.jsonl").exists()
                else 0
            )
        finally:
            daemon.send_signal(signal.SIGTERM)
            writer.kill()
            rc = daemon.wait(timeout=30)
            writer.wait(timeout=10)
    jobs = st.get("jobs", [])
    result = {
        "jobs_simulated": a.jobs,
        "lines_per_s_per_job": a.lines_per_s,
        "jobs_watched": len(jobs),
        "steps_seen_min": min((j["last_step"] or 0) for j in jobs) if jobs else None,
        "tick_seconds": a.tick,
        "window_s": round(t1 - t0, 1),
        "cpu_share_of_one_core_pct": round((c1 - c0) / (t1 - t0) * 100, 2),
        "rss_mb": round(mem.get("VmRSS", 0.0), 1),
        "rss_peak_mb": round(mem.get("VmHWM", 0.0), 1),
        "ticks": st.get("tick_durations"),
        "notifications": alerts,
        "daemon_exit": rc,
        "targets": {"cpu_pct": 5, "rss_mb": 250, "tick_p99_ms": 100},
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
