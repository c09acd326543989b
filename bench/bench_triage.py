"""Benchmark: `jobdiagd triage` on generated realistic logs (1 GiB and 150 MB) vs `grep -c 'completed step:'`.

Not a test. For each log size, in the same run and on the same file (page cache warm), it times
grep and triage alternately, `--repeat` times, and prints min and median wall times and their
ratio (target: triage within 3x of grep), for the default (a big body pre-filtered by two forked
workers) and for `--workers 1`, with the load average around each size. Memory (target: no more
than before; < 200 MB whatever the log size): the peak over the runs of the summed PSS of
triage's whole process tree (sampled every 10 ms; PSS splits the pages forked workers share with
the parent) and, for comparison with older figures, the summed RSS. For context it also times grep
doing triage's own pre-filter job (`grep -c -F -f` with the trigger literals) on the big log.

CPU seconds (user + system of the whole process tree) are printed beside: on a shared machine
they move less than wall times. The profile of those CPU seconds comes from the same run: the
start-up (triage of the log's first 256 KB: interpreter, imports, hyperscan database load,
report) and the C passes a serial read makes over the body (read, the hyperscan pre-filter
with its match callbacks, the newline count that numbers the lines): the floor below which no
change to the per-line Python work can go, each as a multiple of grep's CPU seconds on the same
log. What a serial triage spends beyond start-up + C passes is that per-line Python work (step
columns, candidate lines, the fold into the state).

Triage runs as installed: with bytecode caches (pip compiles them at install). A development
shell with PYTHONDONTWRITEBYTECODE=1 recompiles every module on every run (about 70 ms here), so
the bench points PYTHONPYCACHEPREFIX at bench/out/pycache and warms it first.

Usage: .venv/bin/python bench/bench_triage.py [--sizes-mb 1024,150] [--repeat 5] [--keep]
(`PYTHONPATH=<other checkout>/daemon` benchmarks another version of the code on the same logs.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _reap(proc: subprocess.Popen[bytes], cmd: list[str], flags: int = 0) -> float | None:
    """CPU seconds (user + system, with the children it reaped) of a finished `proc`; None while
    it runs (with os.WNOHANG)."""
    pid, status, usage = os.wait4(proc.pid, flags)
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str, float]:
    """Wall time, stdout and CPU seconds of a command."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    with proc.stdout:
        out = proc.stdout.read()
    cpu = _reap(proc, cmd)
    assert cpu is not None
    return time.perf_counter() - t0, out.decode(), cpu


def _tree_memory_kb(pid: int) -> tuple[int, int]:
    """(summed PSS, summed RSS) of a process and its descendants, in KB."""
    pss = rss = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
                elif line.startswith("Rss:"):
                    rss += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return pss, rss


def timed_tree(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int, int]:
    """Wall time, CPU seconds and peak summed PSS and RSS (KB) of the command's process tree."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    peak_pss = peak_rss = 0
    while (cpu := _reap(proc, cmd, os.WNOHANG)) is None:
        pss, rss = _tree_memory_kb(proc.pid)
        peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
        time.sleep(0.01)
    return time.perf_counter() - t0, cpu, peak_pss, peak_rss


# The C passes over a log's body, timed in-process (CPU seconds): what a serial read cannot go
# below whatever its Python-level work costs. Run as a child so PYTHONPATH picks the code.
_FLOOR = """
import json, os, sys, time
from jobdiagd.logs import reader
fd = os.open(sys.argv[1], os.O_RDONLY)
head_end, tail_start = reader._regions(fd, os.fstat(fd).st_size)
prefixes = reader.task0_prefixes(os.pread(fd, 2 << 20, 0))
scan = reader.scanner()
scan.scan_lines(b"\\n", prefixes)
spans = getattr(scan, "scan_spans", None)
rb = reader._ReadBuffer()
best = {}
for _ in range(int(sys.argv[2])):
    got = {}
    t0 = time.process_time()
    for n, _off in rb.chunks(fd, head_end, tail_start):
        pass
    got["read"] = time.process_time() - t0
    t0 = time.process_time()
    for n, _off in rb.chunks(fd, head_end, tail_start):
        spans(rb.buf, prefixes, 1 + n) if spans else scan.scan_lines(rb.buf, prefixes, 0, 1 + n)
    got["scan"] = time.process_time() - t0 - got["read"]
    t0 = time.process_time()
    for n, _off in rb.chunks(fd, head_end, tail_start):
        rb.buf.count(b"\\n", 1, 1 + n)
    got["count"] = time.process_time() - t0 - got["read"]
    best = {k: min(v, best.get(k, v)) for k, v in got.items()}
print(json.dumps(best))
"""


def floor_cpu(log: Path, repeat: int, env: dict[str, str]) -> dict[str, float]:
    """CPU seconds of the C passes over the body of `log` (read, pre-filter scan, newline count),
    each the minimum over `repeat` passes."""
    out = subprocess.run(
        [sys.executable, "-c", _FLOOR, str(log), str(repeat)], env=env, check=True, capture_output=True
    ).stdout
    got: dict[str, float] = json.loads(out)
    return got


def startup_cpu(log: Path, repeat: int, env: dict[str, str]) -> float:
    """Median CPU seconds of triage on the first 256 KB of `log` (cut at a line end): what any
    triage pays before and after its body."""
    small_dir = log.parent / "startup-256k"
    small_dir.mkdir(exist_ok=True)
    with open(log, "rb") as fh:
        head = fh.read(256 << 10)
    (small_dir / "log").write_bytes(head[: head.rfind(b"\n") + 1])
    triage = [sys.executable, "-m", "jobdiagd.cli", "triage", str(small_dir), "--no-slurm"]
    timed(triage, env)
    return statistics.median(timed(triage, env)[2] for _ in range(repeat))


def make_log(out_dir: Path, size_mb: int, nodes: int, env: dict[str, str]) -> tuple[Path, Path]:
    """The job directory and its log of about `size_mb` MiB (made once, kept with --keep)."""
    name = f"99{size_mb:04d}-JAX-llama2-70b-bench"
    log = out_dir / f"{name}.log"
    job_dir = out_dir / name
    job_dir.mkdir(exist_ok=True)
    link = job_dir / "log"
    if not link.is_symlink():
        link.symlink_to(f"../{name}.log")
    want = size_mb << 20
    if not log.exists() or log.stat().st_size < want:
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "jobdiagd_sim.biglog", str(log), "--size-mb", str(size_mb)]
        subprocess.run([*cmd, "--nodes", str(nodes)], check=True, env=env, stdout=subprocess.DEVNULL)
        print(f"generated {log.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t0:.1f}s")
    return job_dir, log


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def bench_size(job_dir: Path, log: Path, repeat: int, env: dict[str, str]) -> dict[str, Any]:
    subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    triage = [sys.executable, "-m", "jobdiagd.cli", "triage", str(job_dir), "--no-slurm"]
    timed(triage, env)  # warm the bytecode cache
    load_before = _load()
    grep_t: list[float] = []
    par_t: list[float] = []
    ser_t: list[float] = []
    cpu: dict[str, list[float]] = {"grep": [], "triage": [], "serial": []}
    pss_kb = rss_kb = 0
    grep_count = ""
    for _ in range(repeat):
        t, grep_count, c = timed(["grep", "-c", "completed step:", str(log)], env)
        grep_t.append(t)
        cpu["grep"].append(c)
        t, c, pss, rss = timed_tree(triage, env)
        par_t.append(t)
        cpu["triage"].append(c)
        pss_kb, rss_kb = max(pss_kb, pss), max(rss_kb, rss)
        t, _, c = timed([*triage, "--workers", "1"], env)
        ser_t.append(t)
        cpu["serial"].append(c)
    doc = json.loads(timed([*triage, "--json"], env)[1])
    floor = floor_cpu(log, min(repeat, 3), env)
    return {
        "floor": floor,
        "startup": startup_cpu(log, repeat, env),
        "size": log.stat().st_size,
        "step_lines": int(grep_count),
        "grep": grep_t,
        "triage": par_t,
        "serial": ser_t,
        "cpu": cpu,
        "pss_kb": pss_kb,
        "rss_kb": rss_kb,
        "load": (load_before, _load()),
        "status": doc["status"],
        "last_step": doc["progress"]["last_step"],
    }


def _fmt(ts: list[float]) -> str:
    return f"min {min(ts):.3f}s, median {statistics.median(ts):.3f}s"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", default="1024,150", help="log sizes in MiB, comma-separated")
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--keep", action="store_true", help="keep the generated logs for the next run")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    out_dir = HERE / "out" / "outputs"
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", str(HERE / "out" / "pycache"))
    env.setdefault("PYTHONHASHSEED", "0")
    sizes = [int(s) for s in args.sizes_mb.split(",") if s.strip()]
    logs = [make_log(out_dir, size, args.nodes, env) for size in sizes]
    print(f"{os.cpu_count()} CPUs; {args.repeat} runs per size, grep and triage alternating")
    for (job_dir, log), size in zip(logs, sizes, strict=True):
        r = bench_size(job_dir, log, args.repeat, env)
        g, tp, ts, cpu = r["grep"], r["triage"], r["serial"], r["cpu"]
        med = statistics.median
        print(
            f"\n{size} MiB log: {r['size'] / 2**20:.0f} MiB, {r['step_lines']} step lines; "
            f"status={r['status']} last_step={r['last_step']}; load average {r['load'][0]} -> {r['load'][1]}"
        )
        print(f"  grep -c:             {_fmt(g)}")
        print(f"  jobdiagd triage:     {_fmt(tp)} (default workers)")
        print(f"    --workers 1:       {_fmt(ts)}")
        print(
            f"  ratio triage/grep:   min {min(tp) / min(g):.2f}x, median {med(tp) / med(g):.2f}x "
            f"(target <= 3x); --workers 1: min {min(ts) / min(g):.2f}x, median {med(ts) / med(g):.2f}x"
        )
        print(
            f"  CPU seconds (median): grep {med(cpu['grep']):.3f}, triage {med(cpu['triage']):.3f} "
            f"({med(cpu['triage']) / med(cpu['grep']):.1f}x, all processes), --workers 1 {med(cpu['serial']):.3f}"
        )
        grep_cpu, fl, up = med(cpu["grep"]), r["floor"], r["startup"]
        c_passes = fl["read"] + fl["scan"] + fl["count"]
        print(
            f"  profile (CPU seconds, x grep's): start-up {up:.3f} ({up / grep_cpu:.1f}x); C passes over "
            f"the body {c_passes:.3f} ({c_passes / grep_cpu:.1f}x: read {fl['read']:.3f}, hyperscan "
            f"{fl['scan']:.3f}, newline count {fl['count']:.3f}); start-up + C passes "
            f"{(up + c_passes) / grep_cpu:.1f}x; the rest (per-line Python) "
            f"{max(0.0, med(cpu['serial']) - up - c_passes):.3f}"
        )
        print(f"  peak memory, triage tree: PSS {r['pss_kb'] / 1024:.0f} MB, RSS {r['rss_kb'] / 1024:.0f} MB")
    from jobdiagd.logs.scan import TRIGGERS

    literals = out_dir / "triggers.txt"
    literals.write_text("\n".join(TRIGGERS) + "\n")
    grep_f, _, _ = timed(["grep", "-c", "-F", "-f", str(literals), str(logs[0][1])], env)
    print(
        f"\ncontext: grep -c -F -f <{len(TRIGGERS)} trigger literals> (triage's pre-filter done by grep) "
        f"on the {sizes[0]} MiB log: {grep_f:.2f}s"
    )
    if not args.keep:
        for _, log in logs:
            log.unlink()
        shutil.rmtree(out_dir / "startup-256k", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
