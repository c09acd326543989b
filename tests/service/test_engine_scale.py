"""The engine with many jobs: work per tick linear in the jobs, catch-up of existing logs by priority.

Real files under an outputs root, the real alert store and detectors, a hand-driven clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import Config, loads
from jobdiagd.detectors import build
from jobdiagd.service.discovery import OutputsDiscovery
from jobdiagd.service.engine import Engine
from jobdiagd.sim import lines as L
from jobdiagd.sources.tail import ChangeWatcher

T0 = 1_780_000_000.0


def make_cfg(state: Path) -> Config:
    return loads(
        f"""
[daemon]
state_dir = "{state}"
socket_path = "{state}/s.sock"
tick_seconds = 15
[detectors.hang]
min_stall_seconds = 120
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
"""
    )


def write_job(outputs: Path, job_id: str, *extra: str) -> Path:
    """A job in the outputs layout (`<id>-<name>.log` and a dir with its `log` link)."""
    name = "JAX-llama3.1-8b-scale"
    log = outputs / f"{job_id}-{name}.log"
    job_dir = outputs / f"{job_id}-{name}"
    job_dir.mkdir(parents=True)
    (job_dir / "log").symlink_to(f"../{log.name}")
    header = L.header_lines(
        job_id=job_id,
        name=name,
        nnodes=2,
        nodelist="node[001-002]",
        jax_port=12321,
        ray_port=None,
        passthrough={"steps": 1000},
        model="llama3.1-8b",
    )
    log.write_text("\n".join([*header, *extra]) + "\n")
    return log


class CountingWatcher(ChangeWatcher):
    """The real watcher (never started here), counting how often its directories are set."""

    def __init__(self) -> None:
        super().__init__()
        self.dir_sets = 0

    def set_dirs(self, dirs: Iterable[Path]) -> None:
        self.dir_sets += 1
        super().set_dirs(dirs)


async def test_jobs_found_in_one_poll_set_the_watched_directories_once(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    logs = {str(9000 + i): write_job(outputs, str(9000 + i)) for i in range(40)}
    cfg = make_cfg(tmp_path / "state")
    pipeline = AlertPipeline.open(tmp_path / "state", cfg.incidents, ["jsonl"])
    watcher = CountingWatcher()
    engine = Engine(cfg, pipeline, build(cfg), OutputsDiscovery([outputs]), watcher=watcher)
    try:
        await engine.tick(T0)
        assert sorted(engine.jobs) == sorted(logs)
        # Once for the whole batch (it was once per job added: quadratic in the jobs found).
        assert watcher.dir_sets == 1
        for key, log in logs.items():
            assert engine.jobs_for_paths({str(log)}) == {key}
            assert engine.jobs_for_paths({str(log.parent / log.stem / "log")}) == {key}
        await engine.tick(T0 + 15)
        assert watcher.dir_sets == 1  # nothing changed
    finally:
        await engine.stop_discovery()
        pipeline.close()
