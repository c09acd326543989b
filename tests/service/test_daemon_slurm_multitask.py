"""The live daemon against a real Slurm job whose 8 tasks each print their own undated step lines.

What the backtest's clock once got wrong, checked on the daemon's own path: with every task
printing every step under `srun -l`, the step arrives when its first copy is read, the steady
step time is one task's `seconds:` (not N times it), step 0 and the steps after checkpoint
saves raise no hang alert, and the real hang is paged within its budget. Notifications are
filtered by this job's id: the cluster is shared with other sessions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jobdiagd.logs.state import parse_wall
from tests.helpers.daemon import MakeRig, notes, status, stop, wait_for
from tests.helpers.slurm_cluster import SlurmCluster

NAME = "JAX-llama3.1-8b-multitask"
TASKS = 8
STEP_TIME = 1.0
MIN_STALL = 8.0
HANG_AFTER = 22


def _detail(body: str, key: str) -> str:
    m = re.search(rf"\*\*{re.escape(key)}\*\*: ([^\n]+)", body)
    assert m, f"no {key!r} in the alert:\n{body}"
    return m.group(1).strip()


def test_live_daemon_clocks_a_multi_task_job_with_undated_steps(
    slurm_cluster: SlurmCluster, short_tmp: Path, daemon_rig: MakeRig
) -> None:
    rig = daemon_rig(short_tmp, cluster=slurm_cluster, min_stall=MIN_STALL)
    work, outputs, cfg = rig.work, rig.outputs, rig.cfg
    daemon = rig.start()
    job_id = ""

    def ours(event: str) -> list[dict[str, Any]]:
        return [n for n in notes(work) if n["job_id"] == job_id and n["event"] == event]

    def our_status() -> dict[str, Any] | None:
        st = status(cfg).get("status")  # absent until the daemon answers on its socket
        jobs = st["jobs"] if st is not None else []
        return next((j for j in jobs if j["job_id"] == job_id), None)

    try:
        # Step 0 takes 4 s (compilation), every save blocks the next step 2.5 s: slow steps that
        # a clock running N times too slow turned into hang alerts.
        job_id = rig.sbatch_sim(
            NAME,
            *("--steps", "300", "--step-time", str(STEP_TIME), "--first-step-time", "4"),
            *("--checkpoint-period", "5", "--save-time", "2.5", "--undated-steps"),
            *("--hang-after", str(HANG_AFTER), "--noise-every", "1", "--compile-time", "0.2"),
            ntasks=TASKS,
        )

        def running_with_steps() -> bool:
            j = our_status()
            return j is not None and (j["last_step"] or 0) >= 12 and j["step_time_s"] is not None

        wait_for(running_with_steps, "our job past step 12", timeout=240)
        j = our_status()
        assert j is not None
        # One task's pace, read from task 0's copies (N copies per step must not add up).
        assert 0.7 * STEP_TIME <= j["step_time_s"] <= 1.6 * STEP_TIME, j

        wait_for(lambda: bool(ours("open")), "the hang alert of our job", timeout=240)
        log = (outputs / f"{job_id}-{NAME}.log").read_text(errors="replace")
        assert len(re.findall(r"^\s*\d+: completed step: 5,", log, re.M)) == TASKS  # every task prints
        (opened,) = ours("open")
        body = opened["body"]
        assert opened["kind"] == "hang", body
        # No alert at step 0 nor after a save: the only page is the real hang, at its last step.
        assert _detail(body, "last step") == str(HANG_AFTER), body
        assert _detail(body, "phase") == "steady", body
        step_time = float(_detail(body, "steady step time").split()[0])
        assert 0.7 * STEP_TIME <= step_time <= 1.6 * STEP_TIME, body
        budget = parse_wall(_detail(body, "budget"))
        stalled = parse_wall(_detail(body, "stalled for"))
        assert budget is not None and stalled is not None
        assert abs(budget - max(3 * step_time, MIN_STALL)) <= 1.0, body  # shown to the second
        # Paged at the first tick past the budget (ticks every 0.5 s, both shown to the second;
        # slack for a loaded box). A clock N times too slow would page minutes late, if at all.
        assert budget - 1.0 <= stalled <= budget + 10.0, body

        slurm_cluster.scancel(job_id)
        wait_for(lambda: bool(ours("report")), "our job-end report", timeout=180)
        (report,) = ours("report")
        # (The end report's triage times the stall by the log's own clock: undated step lines
        # only give estimated times, which get 5 minutes of slack, so this 10-second hang reads
        # as a plain cancel there; on real time scales it is named -- see test_backtest.py.)
        assert "cancelled" in report["title"] and job_id in report["title"], report["title"]
        assert [n["kind"] for n in ours("open")] == ["hang"]  # still the one page
    finally:
        assert stop(daemon) == 0, rig.log()
