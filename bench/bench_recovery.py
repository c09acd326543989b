"""Time from a hung job's last step to its restart's first step, on the local Slurm cluster.

    .venv/bin/python bench/bench_recovery.py [--countdown 10] [--step-time 0.3] [--min-stall 6]

A simulated job (slurm_job.sh under real `srun -l`) trains and hangs; a real `jobdiagd run`
watches it (squeue discovery, tick 0.5 s, `[detectors.hang] min_stall_seconds` = --min-stall)
and pages the hang through the jsonl notifier. On the page, this script plays the post-judging
stage the daemon will have (docs/recovery.md "Wiring"): `RecoveryManager.consider` with
`countdown_seconds` = --countdown, then `run_due` once the countdown is over, which cancels the
job and resubmits it. Printed as JSON, from the log's own timestamps and Slurm's:

  detection   last step line -> the hang page (created_at of the open notification)
  countdown   page -> the restart begins (the configured countdown, plus the poll)
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
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.slurm_cluster import release_cluster, start_cluster  # noqa: E402

from jobdiagd.alerts.store import AlertStore  # noqa: E402
from jobdiagd.config import RecoveryConfig  # noqa: E402
from jobdiagd.recovery.manager import RecoveryManager  # noqa: E402
from jobdiagd.recovery.policy import Case  # noqa: E402
from jobdiagd.recovery.slurm_ops import SlurmOps  # noqa: E402
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
            mgr = RecoveryManager(
                RecoveryConfig(mode="auto", users=(me,), countdown_seconds=args.countdown,
                               resubmit_env=(f"SIM_PYTHON={sys.executable}",)),
                AlertStore.in_state_dir(work / "recovery-state"),
                SlurmOps(cluster.backend_env),
                work_dir=work / "recovery-state" / "recovery",
                outputs_roots=[outputs],
                now=time.time,
            )
            old_log = next(outputs.glob(f"{old}-*.log"))
            last_at, last_step = step_times(old_log)[-1]
            _, intent = mgr.consider(
                Case(old, me, "debug", "hang", nodes=("node001",), last_step=last_step,
                     incident_id=str(opened["incident_id"])),
                time.time(),
            )
            assert intent is not None and intent.due_at is not None
            while time.time() < intent.due_at:
                time.sleep(0.05)
            began = time.time()
            (outcome,) = mgr.run_due(time.time())
            if outcome.error:
                raise SystemExit(outcome.error)
            new = str(outcome.intent.new_job_id)
            jobs.append(new)
            cancelled = next(e.at for e in outcome.entries if e.action == "cancel")
            new_log = outputs / old_log.name.replace(f"{old}-", f"{new}-", 1)
            first_at, _ = wait(lambda: step_times(new_log)[:1], "the new job's first step")[0]
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
            mgr.store.close()
        finally:
            cluster.scancel(*jobs)
            daemon.terminate()
            daemon.wait(30)
            release_cluster(cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
