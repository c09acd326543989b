"""Time from a hung job's last step to its restart's first step, on the local Slurm cluster.

    .venv/bin/python bench/bench_recovery.py [--countdown 10] [--step-time 0.3] [--min-stall 6]

A simulated job (slurm_job.sh under real `srun -l`) trains and hangs; a real `jobdiagd run` with
`[recovery] mode = "auto"` watches it (squeue discovery, tick 0.5 s, `[detectors.hang]
min_stall_seconds` = --min-stall), pages the hang, counts down `countdown_seconds` = --countdown,
cancels the job and resubmits it: the daemon's own wiring (service/recovery_wiring.py), nothing
played by this script. Printed as JSON, from the log's own timestamps, the daemon's outbox and
recovery log, and Slurm's:

  detection   last step line -> the hang page (created_at of the open notification)
  countdown   page -> the restart begins (the recovery log's `restart`: the countdown, plus the
              wake-up of the daemon's recovery task)
  cancel      restart begins -> scancel done (capture of settings and script included)
  queue       scancel -> the new job RUNNING (Slurm's StartTime; submit + election + release)
  start       RUNNING -> the new job's first `completed step:` line
  total       last step -> first step of the new job
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.slurm_cluster import release_cluster, start_cluster  # noqa: E402

from jobdiagd_sim import live  # noqa: E402

STEP = re.compile(rb"^(?:\d+: )?I(\d{4} \d\d:\d\d:\d\d\.\d+) .*completed step: (\d+)", re.M)


def step_times(log: Path) -> list[tuple[float, int]]:
    year = datetime.now(UTC).year
    out = []
    for m in STEP.finditer(log.read_bytes() if log.exists() else b""):
        stamp = datetime.strptime(f"{year}{m.group(1).decode()}", "%Y%m%d %H:%M:%S.%f").replace(tzinfo=UTC)
        out.append((stamp.timestamp(), int(m.group(2))))
    return out


def wait(cond, what: str, timeout: float = 180):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise SystemExit(f"timed out: {what}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--countdown", type=float, default=10.0)
    ap.add_argument("--step-time", type=float, default=0.3)
    ap.add_argument("--min-stall", type=float, default=6.0)
    args = ap.parse_args()
    cluster = start_cluster()
    me = pwd.getpwuid(os.geteuid()).pw_name
    jobs: list[str] = []
    with tempfile.TemporaryDirectory(prefix="jdd-", dir="/tmp") as d:
        work = Path(d)
        outputs = work / "outputs"
        outputs.mkdir()
        cfg = work / "cfg.toml"
        cfg.write_text(
            f'[daemon]\nstate_dir = "{work}/state"\nsocket_path = "{work}/jd.sock"\ntick_seconds = 0.5\n'
            f'squeue_interval_seconds = 1\n[slurm]\nbackend = "cli"\nslurm_conf = "{cluster.conf}"\n'
            f'outputs_roots = ["{outputs}"]\n[detectors.hang]\nmin_stall_seconds = {args.min_stall}\n'
            "startup_grace_seconds = 120\n[notifiers.jsonl]\nenabled = true\n"
            f'[recovery]\nmode = "auto"\nusers = ["{me}"]\ncountdown_seconds = {args.countdown}\n'
            f'resubmit_env = ["SIM_PYTHON={sys.executable}"]\n'
        )
        daemon = subprocess.Popen(
            [sys.executable, "-m", "jobdiagd.cli", "run", "--config", str(cfg), "--discover", "slurm"],
            stdout=open(work / "daemon.out", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            env=cluster.env,
        )
        try:
            old = cluster.sbatch(
                f"--export=ALL,SIM_PYTHON={sys.executable}", "--job-name=JAX-llama3.1-8b-bench",
                f"--output={outputs}/%j-%x.log", "--ntasks=2", "--overcommit",
                str(Path(live.__file__).with_name("slurm_job.sh")), str(outputs),
                "--steps", "300", "--step-time", str(args.step_time), "--hang-after", "12",
                "--noise-every", "0.5", "--compile-time", "0.2",
            )
            jobs.append(old)
            notes = work / "state" / "notifications.jsonl"

            def page() -> dict[str, object] | None:
                if not notes.exists():
                    return None
                for line in notes.read_text().splitlines():
                    n = json.loads(line)
                    if n.get("job_id") == old and n.get("event") == "open" and n.get("kind") == "hang":
                        return n  # type: ignore[no-any-return]
                return None

            opened = wait(page, "the hang page")
            old_log = next(outputs.glob(f"{old}-*.log"))
            last_at, last_step = step_times(old_log)[-1]
            db = work / "state" / "alerts.sqlite3"

            def log_at(action: str) -> float | None:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
                    row = c.execute(
                        "SELECT at FROM recovery_log WHERE job_id = ? AND action = ? ORDER BY at LIMIT 1",
                        (old, action),
                    ).fetchone()
                return float(row[0]) if row else None

            def new_job() -> str | None:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
                    row = c.execute(
                        "SELECT new_job_id FROM recovery_intents WHERE job_id = ? AND status = 'done'", (old,)
                    ).fetchone()
                return str(row[0]) if row else None

            new = wait(new_job, "the restart", timeout=args.countdown + 120)
            jobs.append(new)
            began, cancelled = log_at("restart"), log_at("cancel")
            assert began is not None and cancelled is not None
            new_log = outputs / old_log.name.replace(f"{old}-", f"{new}-", 1)
            try:
                first_at, _ = wait(lambda: step_times(new_log)[:1], "the new job's first step")[0]
            except SystemExit:  # say where it stands (a busy shared cluster keeps it pending)
                print(subprocess.run(["squeue", "-t", "all"], env=cluster.env, capture_output=True, text=True).stdout)
                raise
            env = dict(cluster.env, SLURM_TIME_FORMAT="%s")
            show = subprocess.run(["scontrol", "-o", "show", "job", new], env=env, capture_output=True, text=True).stdout
            start = float(re.search(r"StartTime=(\d+)", show).group(1))  # type: ignore[union-attr]
            created = float(opened["created_at"])  # type: ignore[arg-type]
            print(json.dumps({
                "settings": {"countdown_s": args.countdown, "step_time_s": args.step_time,
                             "min_stall_s": args.min_stall, "tick_s": 0.5, "squeue_interval_s": 1},
                "old_job": old, "new_job": new, "last_step": last_step,
                "detection_s": round(created - last_at, 2),
                "countdown_s": round(began - created, 2),
                "cancel_s": round(cancelled - began, 2),
                "queue_s": round(start - cancelled, 2),
                "start_s": round(first_at - start, 2),
                "total_s": round(first_at - last_at, 2),
                "note": "StartTime has 1 s resolution: queue and start are +-1 s",
            }, indent=2))
        finally:
            cluster.scancel(*jobs)
            daemon.terminate()
            daemon.wait(30)
            release_cluster(cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
