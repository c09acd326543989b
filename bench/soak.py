"""Soak `jobdiagd run`: 200 simulated jobs under churn and injected faults for N minutes.

    .venv/bin/python bench/soak.py [--minutes 30] [--jobs 200] [--sample-s 10]

A writer process keeps `--jobs` jobs alive under one outputs root, in real formats (srun -l +
absl prefixes, NCCL chatter, `completed step:` lines). Each job lives a random share of the run
and ends with its JOB SUMMARY, and a new job takes its place (churn); about one in six goes
silent for `--hang-s` (a hang the daemon must page) and then trains again; about one in
twenty prints an XLA out-of-memory line and fails. Every `--fault-every-s` one fault is
injected into a live job's log, in turn: made unreadable (mode 000; the daemon runs without
CAP_DAC_OVERRIDE), truncated, fed binary garbage, fed a 4 MB line without a newline, deleted
and written again. The writer logs what the daemon owes: a hang page for every hang, an end
report for every job that ended while watched.

The daemon (outputs discovery, JSONL notifier) is sampled every `--sample-s`: RSS and open
file descriptors from /proc, asyncio tasks from `jobdiagd status`. After a warm-up (the first
fifth of the run), "flat" means the mean of the last fifth is within the allowance of the mean
of the second fifth (RSS +25 MB, fds +8, tasks +5). Printed as JSON; exit 1 when not flat,
when an owed page or report is missing, or when the daemon died.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "daemon"), str(REPO / "sim")]

from jobdiagd.service.status_socket import request  # noqa: E402
from jobdiagd_sim import lines as L  # noqa: E402

NO_DAC_BYPASS = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
NAME = "JAX-llama3.1-8b-soak"
FAULTS = ("unreadable", "truncated", "binary", "long-line", "deleted")


class Job:
    def __init__(self, root: Path, job_id: int, now: float, life: float, rng: random.Random, hang_s: float):
        self.id = str(job_id)
        self.dir = root / f"{job_id}-{NAME}"
        self.path = root / f"{job_id}-{NAME}.log"
        self.dir.mkdir()
        (self.dir / "log").symlink_to(f"../{self.path.name}")
        self.fh: TextIO = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed at its end
        self.step = 0
        self.step_time = 2.0
        self.next_step = now + rng.random() * self.step_time
        self.end_at = now + life
        self.hang: tuple[float, float] | None = None
        self.fail_at: float | None = None
        roll = rng.random()
        if roll < 0.16 and life > hang_s + 40:
            start = now + rng.uniform(20, life - hang_s - 15)
            self.hang = (start, start + hang_s)
        elif roll < 0.21:
            self.fail_at = now + rng.uniform(10, max(11.0, life - 5))
        self.write(
            *L.header_lines(
                job_id=self.id,
                name=NAME,
                nnodes=4,
                nodelist="node[001-004]",
                jax_port=12321,
                ray_port=None,
                passthrough={"steps": 1_000_000},
                model="llama3.1-8b",
            )
        )

    def write(self, *lines: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # a deleted log, closed meanwhile (a fault)
            self.fh.write("".join(ln + "\n" for ln in lines))

    def hanging(self, now: float) -> bool:
        return self.hang is not None and self.hang[0] <= now < self.hang[1]


def writer(root: Path, n: int, minutes: float, hang_s: float, fault_every: float, owed: Path) -> None:
    """The jobs and the faults; appends what the daemon owes to `owed` (one JSON object a line)."""
    rng = random.Random(11)
    lives = (minutes * 60 * 0.15, minutes * 60 * 0.45)
    next_id = 810000
    now = time.time()
    jobs: list[Job] = []
    for _ in range(n):
        jobs.append(Job(root, next_id, now, rng.uniform(*lives), rng, hang_s))
        next_id += 1
    log = open(owed, "a", buffering=1)  # noqa: SIM115 - the writer's lifetime
    faults = 0
    next_fault = now + fault_every
    pending: list[tuple[float, Job, str]] = []  # (when, job, fault) to repair
    while True:
        now = time.time()
        for i, job in enumerate(jobs):
            if job.fail_at is not None and now >= job.fail_at:
                job.write(f"0: {L.xla_oom(32 * 2**30)}")
                job.end_at = now
            if now >= job.end_at:
                rc = 1 if job.fail_at is not None else 0
                wall = int(now - job.end_at + 600)
                job.write(
                    *L.job_summary(job_id=job.id, name=NAME, model="llama3.1-8b", nnodes=4, wall=wall, rc=rc)
                )
                job.fh.close()
                log.write(json.dumps({"job": job.id, "owed": "report", "at": now}) + "\n")
                jobs[i] = Job(root, next_id, now, rng.uniform(*lives), rng, hang_s)
                next_id += 1
                continue
            if job.hang is not None and now >= job.hang[1] and job.hang[0] > 0:
                log.write(json.dumps({"job": job.id, "owed": "hang", "at": now}) + "\n")
                job.hang = (0.0, 0.0)  # owed once
                job.next_step = now
            if job.hanging(now):
                continue
            out = []
            if now >= job.next_step:
                f = L.StepFields(
                    step=job.step,
                    seconds=job.step_time,
                    tflops=140.0,
                    tokens=3000.0 + rng.random() * 20,
                    total_weights=196608,
                    loss=2.5,
                )
                out.append(
                    f"{rng.randrange(4)}: "
                    + L.absl_prefix(now, 1234, "metric_logger.py:232")
                    + L.step_line(f)
                )
                job.step += 1
                job.next_step += job.step_time
            out.append(
                f"{rng.randrange(4)}: node00{rng.randrange(1, 5)}:1234:5678 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1]"
            )
            job.write(*out)
        if now >= next_fault:
            broken = {id(p[1]) for p in pending}
            victims = [
                j
                for j in jobs
                if j.hang is None and j.fail_at is None and j.end_at - now > 60 and id(j) not in broken
            ]
            if victims:
                job = rng.choice(victims)
                kind = FAULTS[faults % len(FAULTS)]
                faults += 1
                if kind == "unreadable":
                    job.path.chmod(0o000)
                    pending.append((now + 20, job, kind))
                elif kind == "truncated":
                    os.truncate(job.path, 0)
                elif kind == "binary":
                    job.write(os.urandom(4096).decode("latin-1"))
                elif kind == "long-line":
                    job.write("x" * (4 << 20))  # the reader must not hold it whole
                elif kind == "deleted":
                    job.fh.close()
                    job.path.unlink()
                    pending.append((now + 20, job, kind))
                log.write(json.dumps({"job": job.id, "fault": kind, "at": now}) + "\n")
            next_fault = now + fault_every
        for item in [p for p in pending if p[0] <= now]:
            pending.remove(item)
            _, job, kind = item
            if kind == "unreadable":
                job.path.chmod(0o644)
            elif kind == "deleted":
                job.fh = open(job.path, "a", buffering=1)  # noqa: SIM115
        time.sleep(0.5)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def flat(series: list[float], allowance: float) -> dict[str, Any]:
    k = max(1, len(series) // 5)
    base = statistics.fmean(series[k : 2 * k]) if len(series) >= 2 * k else series[0]
    end = statistics.fmean(series[-k:])
    return {
        "start": round(base, 1),
        "end": round(end, 1),
        "max": round(max(series), 1),
        "growth": round(end - base, 1),
        "allowance": allowance,
        "flat": end - base <= allowance,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--tick", type=float, default=5.0)
    p.add_argument("--hang-s", type=float, default=60.0, help="how long a hanging job stays silent")
    p.add_argument("--min-stall-s", type=float, default=20.0)
    p.add_argument("--fault-every-s", type=float, default=30.0)
    p.add_argument("--keep", type=Path, help="keep the work dir here (logs, state, samples)")
    p.add_argument("--writer", nargs=6, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.writer:
        root, n, minutes, hang_s, every, owed = a.writer
        writer(Path(root), int(n), float(minutes), float(hang_s), float(every), Path(owed))
        return 0
    with tempfile.TemporaryDirectory(prefix="jd-soak-", dir="/tmp") as d:
        work = a.keep or Path(d)
        work.mkdir(parents=True, exist_ok=True)
        return soak(a, work)


def soak(a: argparse.Namespace, work: Path) -> int:
    outputs = work / "outputs"
    outputs.mkdir()
    owed = work / "owed.jsonl"
    cfg = work / "cfg.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{work}/state"\nsocket_path = "{work}/jd.sock"\n'
        f'tick_seconds = {a.tick}\nlog_level = "warning"\n'
        f'[slurm]\noutputs_roots = ["{outputs}"]\n'
        f"[detectors.hang]\nmin_stall_seconds = {a.min_stall_s}\nstartup_grace_seconds = 120\n"
        "[notifiers.console]\nenabled = false\n[notifiers.jsonl]\nenabled = true\n"
    )
    args = [str(outputs), str(a.jobs), str(a.minutes), str(a.hang_s), str(a.fault_every_s), str(owed)]
    wr = subprocess.Popen([sys.executable, __file__, "--writer", *args])
    time.sleep(2.0)
    with open(work / "daemon.out", "ab") as out:
        daemon = subprocess.Popen(
            [*NO_DAC_BYPASS, sys.executable, "-m", "jobdiagd.cli", "run", "--config", str(cfg)]
            + ["--watch", str(outputs)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    started = time.monotonic()
    samples: list[dict[str, Any]] = []
    watched_from: dict[str, float] = {}
    try:
        while time.monotonic() - started < a.minutes * 60 and daemon.poll() is None:
            time.sleep(a.sample_s)
            try:
                st: dict[str, Any] = request(work / "jd.sock", "status", timeout=10)["result"]
            except Exception as exc:  # one missed sample is not a failure; a dead daemon is
                samples.append({"t": round(time.monotonic() - started, 1), "error": str(exc)})
                continue
            now = time.time()
            for j in st.get("jobs", []):
                watched_from.setdefault(str(j["job_id"]), now)
            samples.append(
                {
                    "t": round(time.monotonic() - started, 1),
                    "rss_mb": round(rss_mb(daemon.pid), 1),
                    "fds": fds(daemon.pid),
                    "tasks": st.get("asyncio_tasks"),
                    "jobs": len(st.get("jobs", [])),
                    "tick_p99_ms": (st.get("tick_durations") or {}).get("full", {}).get("p99_ms"),
                }
            )
        alive = daemon.poll() is None
        wr.kill()
        wr.wait(10)
        time.sleep(a.tick * 3 + a.min_stall_s)  # the last owed pages and reports go out
    finally:
        if wr.poll() is None:
            wr.kill()
            wr.wait(10)
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(60)
    (work / "samples.json").write_text(json.dumps(samples, indent=1))
    got = [json.loads(x) for x in (work / "state" / "notifications.jsonl").read_text().splitlines() if x]
    owes = [json.loads(x) for x in owed.read_text().splitlines() if x]
    paged = {(n["job_id"], n["kind"]) for n in got if n["event"] == "open"}
    reported = {n["job_id"] for n in got if n["event"] == "report"}
    # Owed only what the daemon could see: a job it watched before the hang ended / the job ended.
    hangs = [
        o for o in owes if o.get("owed") == "hang" and watched_from.get(o["job"], 1e18) < o["at"] - a.hang_s
    ]
    ends = [o for o in owes if o.get("owed") == "report" and watched_from.get(o["job"], 1e18) < o["at"]]
    missed_hangs = sorted(o["job"] for o in hangs if (o["job"], "hang") not in paged)
    missed_reports = sorted(o["job"] for o in ends if o["job"] not in reported)
    good = [s for s in samples if "error" not in s]
    result = {
        "minutes": a.minutes,
        "jobs_live": a.jobs,
        "jobs_total": len({o["job"] for o in owes if "owed" in o} | set(watched_from)),
        "faults_injected": {k: sum(1 for o in owes if o.get("fault") == k) for k in FAULTS},
        "samples": len(good),
        "sample_errors": len(samples) - len(good),
        "rss_mb": flat([s["rss_mb"] for s in good], 25.0) if good else None,
        "fds": flat([float(s["fds"]) for s in good], 8.0) if good else None,
        "asyncio_tasks": flat([float(s["tasks"] or 0) for s in good], 5.0) if good else None,
        "tick_p99_ms_last": good[-1]["tick_p99_ms"] if good else None,
        "hang_pages": {"owed": len(hangs), "missed": missed_hangs},
        "end_reports": {"owed": len(ends), "missed": missed_reports},
        "blind_notices": sum(
            1 for n in got if n["event"] == "notice" and n["title"].startswith("monitoring blind")
        ),
        "restored_notices": sum(
            1 for n in got if n["event"] == "notice" and n["title"].startswith("monitoring restored")
        ),
        "notifications": len(got),
        "daemon_alive_at_end": alive,
        "daemon_exit": rc,
    }
    ok = (
        alive
        and rc == 0
        and bool(good)
        and all(result[k]["flat"] for k in ("rss_mb", "fds", "asyncio_tasks"))
        and not missed_hangs
        and not missed_reports
    )
    result["ok"] = ok
    print(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
