"""The per-job series of `/metrics`: read at scrape time from the watched jobs, bounded labels, gone
with the job, and their count at 1000 jobs (counted, not timed)."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import Config, loads
from jobdiagd.detectors import build
from jobdiagd.detectors.hang import KIND as HANG
from jobdiagd.detectors.hang import HangDetector, policy_from_config
from jobdiagd.service.discovery import OutputsDiscovery
from jobdiagd.service.engine import Engine
from jobdiagd.service.job_metrics import JobMetrics
from jobdiagd.service.metrics import JOB_GAUGES, JOB_LABELS, DaemonMetrics, DaemonState, JobSample
from jobdiagd_sim import lines as L

T0 = 1_780_000_000.0
STEP_S = 2.0
NAME = "JAX-llama3.1-8b-metrics"


def write_job(outputs: Path, job_id: str, steps: int, *, user: str = "alice", total: int = 1000) -> Path:
    """A job whose `steps` step lines are dated (2 s apart, from T0) and whose env dump names its user."""
    log = outputs / f"{job_id}-{NAME}.log"
    d = outputs / f"{job_id}-{NAME}"
    d.mkdir(parents=True)
    (d / "log").symlink_to(f"../{log.name}")
    lines = L.header_lines(
        job_id=job_id,
        name=NAME,
        nnodes=2,
        nodelist="node[001-002]",
        jax_port=12321,
        ray_port=None,
        passthrough={"steps": total},
        model="llama3.1-8b",
    )
    env = {"SLURM_JOB_USER": user, "SLURM_JOB_PARTITION": "mi300x", "SLURM_JOB_ID": job_id}
    lines += ["0: " + x for x in L.env_dump(env)]
    for n in range(steps):
        f = L.StepFields(
            step=n, seconds=STEP_S, tflops=47.0, tokens=3000.0 + n, total_weights=196608, loss=2.5
        )
        lines.append(
            "0: " + L.absl_prefix(T0 + STEP_S * (n + 1), 77, "metric_logger.py:232") + L.step_line(f)
        )
    log.write_text("\n".join(lines) + "\n")
    return d


def make_cfg(state: Path) -> Config:
    return loads(
        f"""
[daemon]
state_dir = "{state}"
socket_path = "{state}/s.sock"
[detectors.hang]
min_stall_seconds = 60
startup_grace_seconds = 600
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
"""
    )


def make_engine(tmp_path: Path, outputs: Path, jobs: int) -> tuple[Engine, AlertPipeline]:
    cfg = make_cfg(tmp_path / "state")
    pipeline = AlertPipeline.open(tmp_path / "state", cfg.incidents, ["jsonl"])
    # Every job's first budget in the first tick (the detector otherwise spreads them over ticks).
    hang = HangDetector(policy_from_config(cfg), first_budgets=jobs)
    detectors = [hang, *(d for d in build(cfg) if not isinstance(d, HangDetector))]
    return Engine(cfg, pipeline, detectors, OutputsDiscovery([outputs])), pipeline


def scrape(jm: JobMetrics, now: float) -> dict[str, list[tuple[dict[str, str], float]]]:
    m = DaemonMetrics()
    m.read_state(lambda: DaemonState(jobs_watched=len(jm.engine.jobs), jobs=jm.samples(now)))
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        if fam.name.startswith("jobdiagd_job_"):
            out[fam.name] = [(dict(s.labels), s.value) for s in fam.samples]
    return out


def by_job(series: dict[str, list[tuple[dict[str, str], float]]], name: str) -> dict[str, float]:
    return {labels["job_id"]: v for labels, v in series[name]}


async def test_a_scrape_reads_each_jobs_numbers_as_jobdiagd_status_does(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    write_job(outputs, "9101", steps=40)
    write_job(outputs, "9102", steps=10, user="bob")
    engine, pipeline = make_engine(tmp_path, outputs, 2)
    try:
        read_at = T0 + 100.0
        await engine.tick(read_at)
        now = read_at + 30.0
        s = scrape(JobMetrics(engine, pipeline), now)
        assert by_job(s, "jobdiagd_job_step") == {"9101": 39, "9102": 9}
        assert by_job(s, "jobdiagd_job_step_time_seconds")["9101"] == pytest.approx(STEP_S)
        assert by_job(s, "jobdiagd_job_tokens_per_second_per_device") == {"9101": 3039.0, "9102": 3009.0}
        # Read at `read_at`, 30 s ago: 15 steps behind, 30 s stalled.
        assert by_job(s, "jobdiagd_job_expected_step")["9101"] == 39 + 15
        assert by_job(s, "jobdiagd_job_stall_seconds") == {"9101": 30.0, "9102": 30.0}
        assert by_job(s, "jobdiagd_job_stall_budget_seconds")["9101"] >= 60.0
        assert by_job(s, "jobdiagd_job_eta_seconds")["9101"] == pytest.approx((999 - 39) * STEP_S)
        # Goodput so far: the run from its first dated step to now, productive = its steps.
        good = by_job(s, "jobdiagd_job_goodput_ratio")
        assert 0.0 < good["9101"] < 1.0 and good["9102"] < good["9101"]
        prod = by_job(s, "jobdiagd_job_productive_gpu_seconds")
        alloc = by_job(s, "jobdiagd_job_allocated_gpu_seconds")
        assert prod["9101"] / alloc["9101"] == pytest.approx(good["9101"])
        # The same numbers `jobdiagd status` shows (its columns come from the same memo).
        rows = {r["job_id"]: r for r in engine.snapshot_jobs(now)}
        assert rows["9101"]["expected_step"] == by_job(s, "jobdiagd_job_expected_step")["9101"]
        assert rows["9101"]["step_time_s"] == pytest.approx(
            by_job(s, "jobdiagd_job_step_time_seconds")["9101"]
        )
        # Labels: the job, its user and partition (the env dump's, without Slurm) and nothing else.
        labels = {tuple(sorted(lab)) for fam in s.values() for lab, _ in fam}
        assert labels <= {tuple(sorted(JOB_LABELS)), tuple(sorted((*JOB_LABELS, "kind")))}
        users = {lab["job_id"]: (lab["user"], lab["partition"]) for lab, _ in s["jobdiagd_job_step"]}
        assert users == {"9101": ("alice", "mi300x"), "9102": ("bob", "mi300x")}
    finally:
        await engine.stop_discovery()
        pipeline.close()


async def test_open_incidents_by_kind_and_a_job_that_leaves_the_watch_is_gone(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    write_job(outputs, "9201", steps=20)
    gone = write_job(outputs, "9202", steps=20)
    engine, pipeline = make_engine(tmp_path, outputs, 2)
    jm = JobMetrics(engine, pipeline)
    try:
        await engine.tick(T0 + 60)
        stalled = T0 + 60 + 600  # no step for 10 min: both hang
        await engine.tick(stalled)
        s = scrape(jm, stalled)
        assert s["jobdiagd_job_open_incidents"] == [
            ({"job_id": j, "user": "alice", "partition": "mi300x", "kind": HANG}, 1.0)
            for j in ("9201", "9202")
        ]
        assert (
            by_job(s, "jobdiagd_job_stall_seconds")["9201"]
            > by_job(s, "jobdiagd_job_stall_budget_seconds")["9201"]
        )
        shutil.rmtree(gone)
        (outputs / f"{gone.name}.log").unlink()
        await engine.tick(stalled + 15)  # the dir is gone: the job leaves the watch
        assert "9202" not in engine.jobs
        s = scrape(jm, stalled + 15)
        for name, samples in s.items():
            assert {lab["job_id"] for lab, _ in samples} <= {"9201"}, name
        assert set(jm._goodput) == {"9201"}  # its memo went with it
    finally:
        await engine.stop_discovery()
        pipeline.close()


async def test_a_scrape_refreshes_a_bounded_number_of_goodputs(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    for i in range(7):
        write_job(outputs, str(9300 + i), steps=5)
    engine, pipeline = make_engine(tmp_path, outputs, 7)
    jm = JobMetrics(engine, pipeline, per_scrape=3, refresh_s=300.0)
    try:
        now = T0 + 30
        await engine.tick(now)
        counts = [len(by_job(scrape(jm, now + k), "jobdiagd_job_goodput_ratio")) for k in range(4)]
        assert counts == [3, 6, 7, 7]  # the jobs never computed first, 3 a scrape
        first = {k: g.at for k, g in jm._goodput.items()}
        assert all(now - 300 < at <= now + 2 for at in first.values())  # back-dated to spread refreshes
        later = now + 400  # every one is due again: still 3 a scrape, the stalest first
        scrape(jm, later)
        refreshed = sorted(k for k, g in jm._goodput.items() if g.at == later)
        assert refreshed == sorted(sorted(first, key=lambda k: (first[k], k))[:3])
    finally:
        await engine.stop_discovery()
        pipeline.close()


def test_the_collector_exports_no_sample_for_what_is_not_known() -> None:
    m = DaemonMetrics()
    m.read_state(lambda: DaemonState(jobs=[JobSample("1", "u", "p", step=3), JobSample("2")]))
    fams = {f.name: f for f in text_string_to_metric_families(m.render().decode())}
    assert [s.value for s in fams["jobdiagd_job_step"].samples] == [3]
    for name, _attr, _doc in JOB_GAUGES[1:]:
        assert fams[name].samples == [], name
    assert fams["jobdiagd_job_open_incidents"].samples == []


async def test_the_series_at_a_thousand_jobs(tmp_path: Path) -> None:
    """Every watched job: one series per gauge, its open incidents one per kind, nothing else."""
    outputs = tmp_path / "outputs"
    n = 1000
    for i in range(n):
        write_job(outputs, str(100000 + i), steps=3 if i % 100 else 0, user=f"u{i % 7}")
    engine, pipeline = make_engine(tmp_path, outputs, n)
    jm = JobMetrics(engine, pipeline, per_scrape=n)
    try:
        await engine.tick(T0 + 30)
        while engine.room.catching_up:
            await engine.tick(T0 + 31)
        assert len(engine.jobs) == n
        now = T0 + 30 + 900  # every job stalled: a hang incident each (the ten without a step too)
        await engine.tick(now)
        s = scrape(jm, now)
        counts = Counter({name: len(samples) for name, samples in s.items()})
        stepped = n - n // 100
        assert counts["jobdiagd_job_step"] == stepped
        assert counts["jobdiagd_job_open_incidents"] == n
        assert {lab["kind"] for lab, _ in s["jobdiagd_job_open_incidents"]} == {HANG}
        # Per job at most one series per gauge plus its open incidents' kinds: bounded by the jobs.
        assert sum(counts.values()) <= n * (len(JOB_GAUGES) + 1)
        assert sum(counts.values()) >= stepped * len(JOB_GAUGES)
        assert len({lab["job_id"] for fam in s.values() for lab, _ in fam}) == n
        assert {lab["user"] for lab, _ in s["jobdiagd_job_step"]} == {f"u{i}" for i in range(7)}
    finally:
        await engine.stop_discovery()
        pipeline.close()
