"""The job-end report ends with the checkpoint-interval advice once `jobdiagd goodput` wrote the fleet's figures."""

from __future__ import annotations

import random
from pathlib import Path

from jobdiagd.detectors import NoData
from jobdiagd.detectors.jobend import JobEndDetector
from jobdiagd.goodput.fleet import FLEET_NAME, Fleet, write_fleet
from jobdiagd.service.jobs import JobView
from jobdiagd.triage.engine import triage
from jobdiagd.triage.resolve import resolve
from jobdiagd.triage.stall import StallPolicy
from jobdiagd_sim.job import SIM_EPOCH, JobSim, JobSpec


def _ended_view(tmp_path: Path) -> JobView:
    spec = JobSpec(
        job_id="8802",
        model="llama3.1-70b",
        nnodes=4,
        steps=200,
        checkpointing=True,
        checkpoint_period=20,
        step_time=6.0,
        start=SIM_EPOCH,
    )
    sim = JobSim(spec, random.Random(2))
    sim.header()
    sim.stages_ok()
    sim.train_begin()
    sim.env_dumps()
    sim.init_training()
    sim.steps(0, 90, lambda s: sim.default_seconds(s, 0) + (30.0 if (s - 1) % 20 == 0 else 0.0))
    sim.train_end_ok()
    sim.summary(0)
    job_dir, _ = sim.write(tmp_path / "outputs")
    view = JobView(key="8802", ref=resolve(str(job_dir), []), first_seen=SIM_EPOCH, policy=StallPolicy())
    view.final = triage(job_dir, now=sim.t + 5, slurm_state="COMPLETED")
    view.ended = True
    return view


def test_the_advice_follows_the_triage_when_the_fleet_file_is_there(tmp_path: Path) -> None:
    view = _ended_view(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    det = JobEndDetector(state / FLEET_NAME)
    (plain,) = det.check(view, SIM_EPOCH + 9999)  # type: ignore[misc]
    assert "## Job triage" in plain.body and "Checkpoint interval" not in plain.body
    write_fleet(
        state, Fleet(hours={4: 100.0}, events={4: 20}, detection_s=150.0, restart_s=900.0, made_at=SIM_EPOCH)
    )
    out = det.check(view, SIM_EPOCH + 9999)
    assert not isinstance(out, NoData)
    (rep,) = out
    assert rep.body.startswith(plain.body)  # type: ignore[union-attr]
    assert "### Checkpoint interval\nCheckpoint every 20 steps" in rep.body  # type: ignore[union-attr]
