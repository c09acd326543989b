"""The live per-job numbers (the metrics seam) and the fleet figures behind the job-end advice."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from jobdiagd.goodput.fleet import FLEET_NAME, Fleet, advice_section, job_advice, read_fleet, write_fleet
from jobdiagd.goodput.live import live_numbers
from jobdiagd.model.triage import TriageResult
from jobdiagd.triage.engine import triage
from jobdiagd_sim.job import SIM_EPOCH, JobSim, JobSpec

SAVE_S = 30.0


def _job(tmp_path: Path, *, last: int, end: bool) -> tuple[TriageResult, JobSim]:
    spec = JobSpec(
        job_id="8801",
        model="llama3.1-70b",
        nnodes=4,
        steps=1000,
        checkpointing=True,
        checkpoint_period=20,
        step_time=6.0,
        start=SIM_EPOCH,
    )
    sim = JobSim(spec, random.Random(1))
    sim.header()
    sim.stages_ok()
    sim.train_begin()
    sim.env_dumps()
    sim.init_training()
    sim.steps(
        0, last, lambda s: sim.default_seconds(s, 0) + (SAVE_S if s - 1 >= 0 and (s - 1) % 20 == 0 else 0.0)
    )
    if end:
        sim.train_end_ok()
        sim.summary(0)
    job_dir, _ = sim.write(tmp_path)
    now = sim.t + 10
    return triage(job_dir, now=now, slurm_state="COMPLETED" if end else "RUNNING"), sim


def test_live_numbers_of_a_running_job(tmp_path: Path) -> None:
    r, sim = _job(tmp_path, last=120, end=False)
    now = sim.t + 10
    n = live_numbers(r, now=now, start=SIM_EPOCH, stall_budget_s=180.0)
    assert n.step == 120 and n.step_time_s == pytest.approx(6.0, abs=0.1)
    assert n.stall_s == pytest.approx(10, abs=1) and n.stall_budget_s == 180.0
    assert n.eta_s == pytest.approx((999 - 120) * n.step_time_s, rel=0.01)
    assert n.goodput is not None and 0.5 < n.goodput < 1
    assert n.allocated_gpu_s == pytest.approx((now - SIM_EPOCH) * 32)
    assert live_numbers(r, now=now, start=None).goodput is not None  # from the first dated step


def fleet() -> Fleet:
    return Fleet(hours={4: 100.0}, events={4: 20}, detection_s=150.0, restart_s=900.0, made_at=SIM_EPOCH)


def test_the_job_end_advice_uses_the_jobs_own_saves_and_the_fleets_rates(tmp_path: Path) -> None:
    r, _ = _job(tmp_path, last=150, end=True)
    a = job_advice(r, fleet())
    assert a is not None and a.config == "llama3.1-70b x4"
    assert a.save_s == pytest.approx(SAVE_S, abs=0.5) and a.mtbf_s == pytest.approx(100 * 3600 / 20)
    assert a.period_steps == 20 and a.best_steps > 20  # saves every 2 min at a 5 h MTBF: too often
    text = advice_section(a, fleet())
    assert text.startswith("### Checkpoint interval\nCheckpoint every 20 steps") and "2410.18124" in text
    assert job_advice(r, Fleet(hours={4: 1.0}, events={}, detection_s=0, restart_s=0, made_at=0)) is None


def test_the_fleet_file_round_trips_privately_and_a_bad_one_is_no_advice(tmp_path: Path) -> None:
    path = write_fleet(tmp_path, fleet())
    assert path == tmp_path / FLEET_NAME and os.stat(path).st_mode & 0o777 == 0o600
    assert read_fleet(path) == fleet()
    path.write_text("{not json")
    assert read_fleet(path) is None
    assert read_fleet(tmp_path / "missing.json") is None
