"""Run facts from real simulated logs: save costs, compile, GPUs, and the runs of a requeued log (rules GP-1, GP-5)."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest

from jobdiagd.goodput.collect import ProgressLine, collect_job, job_refs
from jobdiagd.goodput.facts import gpus_per_node
from jobdiagd.logs.safeopen import ANYWHERE
from jobdiagd.triage.resolve import resolve
from jobdiagd_sim.job import SIM_EPOCH, JobSim, JobSpec, encode_lines

SAVE_S = 7.0


def _sim(job_id: str, start: float, **kw: object) -> JobSim:
    spec = JobSpec(
        job_id=job_id,
        model="llama3.1-8b",
        nnodes=2,
        steps=200,
        checkpointing=True,
        checkpoint_period=10,
        step_time=2.0,
        start=start,
        compile_time=20.0,
        env_extra={"SLURM_JOB_USER": "alice", "SLURM_JOB_PARTITION": "mi300x"},
        **kw,  # type: ignore[arg-type]
    )
    return JobSim(spec, random.Random(job_id))


def _train(sim: JobSim, first: int, last: int, restore: int | None = None) -> None:
    sim.header()
    sim.stages_ok()
    sim.train_begin()
    sim.env_dumps()
    sim.init_training(restore_from=restore)

    def secs(step: int) -> float:
        save = SAVE_S if step - 1 >= first and (step - 1) % 10 == 0 else 0.0
        return sim.default_seconds(step, first) + save

    sim.steps(first, last, secs, noise_per_step=0.1)


def test_a_run_measures_its_saves_compile_and_gpus(tmp_path: Path) -> None:
    sim = _sim("5001", SIM_EPOCH)
    _train(sim, 0, 45)
    sim.train_end_ok()
    sim.summary(0)
    job_dir, _ = sim.write(tmp_path)
    [f] = collect_job(resolve(str(job_dir), []), now=SIM_EPOCH + 86400, access=ANYWHERE)
    assert (f.status, f.first_step, f.last_step, f.runs_in_log) == ("completed", 0, 45, 1)
    assert (f.user, f.partition, f.nnodes, f.gpus_per_node, f.gpus_known) == ("alice", "mi300x", 2, 8, True)
    assert f.saves == 5  # 0, 10, 20, 30, 40
    assert f.save_costs == pytest.approx((SAVE_S,) * 4, abs=0.1)  # the one at step 0 is in the warmup
    assert f.checkpoint_s == pytest.approx(5 * SAVE_S + 1.2, abs=0.5)  # ... but its time is spent
    assert f.compile_s == pytest.approx(2.0 * 8, abs=6)  # the first step is ~9 step times
    assert f.gaps_s == pytest.approx(0, abs=1)
    assert f.last_stamp is not None and f.wall_s is not None
    assert dict(f.tails)[40] == pytest.approx(5 * 2.0 + SAVE_S, abs=0.5)  # steps 41..45


def test_a_requeued_log_gives_one_facts_per_run(tmp_path: Path) -> None:
    first = _sim("5002", SIM_EPOCH)
    _train(first, 0, 33)
    first.advance(3)
    first.cancel_cascade(reason="preemption")
    job_dir, log = first.write(tmp_path)
    second = _sim("5002", first.end_t + 600)
    _train(second, 31, 60, restore=30)
    second.train_end_ok()
    second.summary(0)
    with log.open("ab") as fh:
        fh.write(encode_lines(second.slurm))
    runs = collect_job(resolve(str(job_dir), []), now=SIM_EPOCH + 86400, access=ANYWHERE)
    assert [(r.run_index, r.runs_in_log) for r in runs] == [(0, 2), (1, 2)]
    assert (runs[0].status, runs[0].first_step, runs[0].last_step, runs[0].fresh) == (
        "cancelled",
        0,
        33,
        True,
    )
    assert (runs[1].status, runs[1].restored_from, runs[1].first_step, runs[1].last_step) == (
        "completed",
        30,
        31,
        60,
    )
    assert runs[0].last_stamp is not None and runs[1].first_stamp is not None
    assert runs[0].last_stamp < runs[1].first_stamp
    assert runs[0].key != runs[1].key


def test_gpus_per_node_from_the_environment() -> None:
    assert gpus_per_node({"HIP_VISIBLE_DEVICES": "0,1,2,3"}) == 4
    assert gpus_per_node({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}) == 2
    assert gpus_per_node({"SLURM_GPUS_ON_NODE": "8"}) == 8
    assert gpus_per_node({"CUDA_VISIBLE_DEVICES": "all"}) is None
    assert gpus_per_node({}) is None


def test_job_refs_reads_roots_dirs_and_logs_once(tmp_path: Path) -> None:
    sim = _sim("5003", SIM_EPOCH)
    _train(sim, 0, 5)
    job_dir, log = sim.write(tmp_path)
    refs, errors = job_refs([tmp_path, job_dir, log, tmp_path / "missing"])
    assert [r.job_id for r in refs] == ["5003"] and len(errors) == 1


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_is_drawn_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    tty, pipe = _Tty(), io.StringIO()
    for stream in (tty, pipe):
        line = ProgressLine(120, stream, every=50)
        for i in range(1, 121):
            line.update(i, i // 2)
        line.close()
    assert pipe.getvalue() == ""
    assert tty.getvalue().count("\r") == 4 and "goodput: 120/120 jobs (60 cached)" in tty.getvalue()
