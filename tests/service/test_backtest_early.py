"""`jobdiagd backtest` replays the early page against the job's own promtool-built TSDB (read-only copy)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobdiagd.config import Config, default_config
from jobdiagd.model.kinds import GpuHangState
from jobdiagd.service.backtest import JobReplay, replay
from jobdiagd.triage.resolve import resolve
from jobdiagd_sim.metrics import JobFiles, JobSim, scenario, write_job

pytestmark = pytest.mark.prometheus

TICK = 15.0
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[JobSim, JobFiles]]:
    root = tmp_path_factory.mktemp("early")
    out: dict[str, tuple[JobSim, JobFiles]] = {}
    for name in ("rccl-hang", "dead-process", "dead-node", "healthy-evals"):
        sim = JobSim(scenario(name))
        out[name] = (sim, write_job(sim, root / name, hang_chatter_s=45.0))
    return out


def cfg(tmp_path: Path, **tsdb: object) -> Config:
    base = default_config()
    return dataclasses.replace(base, tsdb=dataclasses.replace(base.tsdb, work_dir=str(tmp_path), **tsdb))


def run(files: JobFiles, c: Config) -> JobReplay:
    return replay(resolve(str(files.job_dir), []), c, tick=TICK, ref_time=time.time())


def snapshot(d: Path) -> dict[str, tuple[int, int, int]]:
    return {
        str(p.relative_to(d)): (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(d.rglob("*"))
    }


def hang_pages(r: JobReplay) -> list:  # type: ignore[type-arg]
    return [a for a in r.alerts if a.kind == "hang" and a.event == "open"]


def test_collective_hang_pages_at_the_early_point(
    jobs: dict[str, tuple[JobSim, JobFiles]], tmp_path: Path
) -> None:
    sim, files = jobs["rccl-hang"]
    (lock := files.prometheus / "lock").write_text("")  # a stale lock of the job's Prometheus
    before = snapshot(files.prometheus)
    r = run(files, cfg(tmp_path))
    (page,) = hang_pages(r)
    assert page.gpu_confirmed and "GPU-confirmed hang (busy-wait)" in page.summary
    assert r.step_time_s is not None and r.last_step_at_s is not None
    due = r.last_step_at_s + r.step_time_s
    threshold = 1.5 * r.step_time_s + 20.0
    # Paged at the first poll past the threshold (polls are one scrape interval apart).
    assert threshold <= page.at_s - due <= threshold + 10.0
    assert r.early_states == {"busy-wait": 1}
    # The job's TSDB was only read: same files, same inodes, same mtimes, the lock untouched.
    assert snapshot(files.prometheus) == before and lock.exists()


def test_dead_node_names_the_host_early(jobs: dict[str, tuple[JobSim, JobFiles]], tmp_path: Path) -> None:
    sim, files = jobs["dead-process"]
    (page,) = hang_pages(run(files, cfg(tmp_path)))
    assert page.gpu_confirmed and "(dead-node)" in page.summary
    assert f"Suspect host: {sim.sc.bad_host}" in page.summary


def test_a_silent_host_is_left_to_the_step_budget(
    jobs: dict[str, tuple[JobSim, JobFiles]], tmp_path: Path
) -> None:
    """The dead host stopped reporting altogether: missing metrics never confirm."""
    _, files = jobs["dead-node"]
    r = run(files, cfg(tmp_path))
    (page,) = hang_pages(r)
    assert not page.gpu_confirmed and page.budget_s == 120.0
    assert r.early_queries > 0 and set(r.early_states) == {"no-data"}
    plain = run(files, cfg(tmp_path, early_page=False))
    assert [(a.at_s, a.summary) for a in hang_pages(plain)] == [(page.at_s, page.summary)]


def test_checkpoints_evals_and_a_recompile_do_not_page(
    jobs: dict[str, tuple[JobSim, JobFiles]], tmp_path: Path
) -> None:
    _, files = jobs["healthy-evals"]
    r = run(files, cfg(tmp_path))
    assert hang_pages(r) == []
    # The pauses were overdue enough to be asked about, and the GPUs said no each time (a pause, or
    # training again just before the step line).
    assert r.early_queries >= 3 and GpuHangState.NOT_A_HANG in r.early_states
    assert all(GpuHangState(s).denies for s in r.early_states), r.early_states


def test_without_prometheus_the_replay_goes_on_with_the_step_budget(
    jobs: dict[str, tuple[JobSim, JobFiles]], tmp_path: Path
) -> None:
    _, files = jobs["rccl-hang"]
    r = run(files, cfg(tmp_path, prometheus_binary=str(tmp_path / "no-such-prometheus")))
    (page,) = hang_pages(r)
    assert not page.gpu_confirmed and r.early_note is not None and "not replayed" in r.early_note


def test_the_cli_prints_the_early_page(jobs: dict[str, tuple[JobSim, JobFiles]], tmp_path: Path) -> None:
    _, files = jobs["dead-process"]
    conf = tmp_path / "c.toml"
    conf.write_text(f'[tsdb]\nwork_dir = "{tmp_path}"\n')
    env = {**os.environ, "PYTHONPATH": str(REPO / "daemon")}
    out = subprocess.run(
        [sys.executable, "-m", "jobdiagd.cli", "backtest", "--config", str(conf), str(files.job_dir)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert "GPU-confirmed hang (dead-node)" in out and "early page: 1 TSDB queries (1 dead-node)" in out


def test_a_failure_logged_later_without_a_date_does_not_hold_back_the_early_page(tmp_path: Path) -> None:
    """Every GPU busy-waits; the heartbeat kills the job 45 min later. Ray no longer forwarded the
    training output, so the job log's last dated line is the last step, and the job script's
    undated "Training subprocess exited" lines and summary follow it. Their time is unknown: the
    replay takes them in at the job's end (the worker log's heartbeat error), not at the last
    step's time, where they made an open failure incident hold the GPU-confirmed page back."""
    sc = scenario("hang-then-heartbeat", step_time=20.0, hang_s=2700.0)
    sim = JobSim(dataclasses.replace(sc, extra={**sc.extra, "unforwarded_end": True}))
    files = write_job(sim, tmp_path / "job", hang_chatter_s=None)
    log = files.log.read_text()
    assert "Training subprocess exited with code 1" in log and "stopped sending heartbeats" not in log
    r = run(files, cfg(tmp_path))
    (page,) = hang_pages(r)
    assert page.gpu_confirmed and "GPU-confirmed hang (busy-wait)" in page.summary
    assert r.step_time_s is not None and r.last_step_at_s is not None
    due = r.last_step_at_s + r.step_time_s
    threshold = 1.5 * r.step_time_s + 20.0
    assert threshold <= page.at_s - due <= threshold + 10.0
    assert [a.kind for a in r.alerts if a.event == "open"] == ["hang"]
    assert r.undated_lines >= len(sim.sc.nodes) and r.end_at_s is not None
    assert r.end_at_s - r.last_step_at_s >= 2700.0  # the job ends with the heartbeat kill
    assert r.final_primary == "hang"


def test_an_open_failure_incident_does_not_hold_back_the_early_page(
    jobs: dict[str, tuple[JobSim, JobFiles]], tmp_path: Path
) -> None:
    """The dead host's training process exits right after the last step: its wrapper's line is
    followed by the raylet's dated chatter, so it is read then and a failure incident opens at
    once; the others spin, and the GPU-confirmed page still comes at the early point."""
    sim, files = jobs["dead-process"]
    job = tmp_path / "job"
    shutil.copytree(files.job_dir.parent, job, symlinks=True)
    log = job / files.log.name
    lines = log.read_text().splitlines()
    last = max(i for i, ln in enumerate(lines) if "completed step:" in ln)
    bad = sim.sc.nodes.index(sim.sc.bad_host)
    lines.insert(last + 1, f"{bad}: [Node {bad} @ {sim.sc.bad_host}] Training subprocess exited with code 1")
    log.write_text("\n".join(lines) + "\n")
    r = run(JobFiles(log, job / files.job_dir.name, job / files.job_dir.name / "prometheus"), cfg(tmp_path))
    opened = [a for a in r.alerts if a.event == "open"]
    assert [(a.kind, a.cls) for a in opened] == [("failure", "subprocess-fail"), ("hang", "hang")]
    page = opened[1]
    assert page.gpu_confirmed and "(dead-node)" in page.summary
    assert r.step_time_s is not None and r.last_step_at_s is not None
    due = r.last_step_at_s + r.step_time_s
    threshold = 1.5 * r.step_time_s + 20.0
    assert threshold <= page.at_s - due <= threshold + 10.0
    assert opened[0].at_s < page.at_s
