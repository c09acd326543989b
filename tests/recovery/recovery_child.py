"""A recovery daemon in a child process, for the HA and crash tests on the real cluster.

    python -m tests.recovery.recovery_child STATE_DIR SLURM_CONF OUTPUTS CASE_JSON [--barrier DIR N]
        [--kill-at STEP]

Decides about the case (`consider`, countdown 0) and runs what is due, then prints one JSON line
{"status", "new_job_id", "error"}. --barrier makes it wait, after the cancel and before the
submit, until N children reached that point (so both submit: the worst race); --kill-at STEP
SIGKILLs itself right after that step was stored (`captured`, `cancelled`, `submitted`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from jobdiagd.alerts.store import AlertStore
from jobdiagd.config import RecoveryConfig
from jobdiagd.recovery.book import Intent
from jobdiagd.recovery.manager import RecoveryManager
from jobdiagd.recovery.policy import Case
from jobdiagd.recovery.slurm_ops import SlurmOps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("state")
    ap.add_argument("conf")
    ap.add_argument("outputs")
    ap.add_argument("case")
    ap.add_argument("--barrier", nargs=2)
    ap.add_argument("--kill-at")
    args = ap.parse_args()
    raw = json.loads(args.case)
    case = Case(**{**raw, "nodes": tuple(raw.get("nodes", ())), "suspects": tuple(raw.get("suspects", ()))})

    def hook(step: str, intent: Intent) -> None:
        if args.barrier and step == "cancelled":
            d, n = Path(args.barrier[0]), int(args.barrier[1])
            (d / str(os.getpid())).write_text("")
            deadline = time.monotonic() + 60
            while len(list(d.iterdir())) < n and time.monotonic() < deadline:
                time.sleep(0.02)
        if step == args.kill_at:
            print(f"KILLING at {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    cfg = RecoveryConfig(
        mode="auto", users=(case.owner or "",), countdown_seconds=0, resubmit_env=(f"SIM_PYTHON={sys.executable}",)
    )
    store = AlertStore.in_state_dir(args.state)
    mgr = RecoveryManager(
        cfg,
        store,
        SlurmOps({"SLURM_CONF": args.conf}),
        work_dir=Path(args.state) / "recovery",
        outputs_roots=[Path(args.outputs)],
        now=time.time,
        hook=hook,
    )
    mgr.consider(case, time.time())
    outcomes = mgr.run_due(time.time())
    intent = mgr.book.intents_for_job(case.job_id)[-1]
    print(
        json.dumps(
            {
                "status": intent.status,
                "new_job_id": intent.new_job_id,
                "error": next((o.error for o in outcomes if o.error), None),
                "actions": [e.action for e in mgr.book.entries(case.job_id)],
            }
        ),
        flush=True,
    )
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
