"""Shared fixtures: simulated jobs (log + promtool-built TSDB), built once per session, copied per test."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.sim.metrics import JobFiles, JobSim, scenario, write_job
from jobdiagd.tsdb.context import DiagnosisContext, HeartbeatInfo, LogStep
from jobdiagd.tsdb.settings import TsdbSettings

PRIMARY = {
    "rccl-hang": "hang",
    "init-hang": "hang",
    "dead-node": "hang",
    "host-oom-ramp": "oom-host",
    "hardware-fault": "node-fail",
    "rdma-degraded": None,
    "healthy": None,
    "restore-fresh": None,
    "restore-leak": None,
    "io-contention": None,
    "thermal-throttle": None,
    "network-partition": "hang",
}


@dataclass
class Built:
    sim: JobSim
    files: JobFiles


class Fixtures:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[str, Built] = {}

    def get(self, name: str) -> Built:
        if name not in self._built:
            sim = JobSim(scenario(name))
            self._built[name] = Built(sim, write_job(sim, self.root / name))
        return self._built[name]

    def copy(self, name: str, dest: Path) -> Built:
        """A private copy: Prometheus writes wal/ and chunks_head/ into whatever it opens."""
        b = self.get(name)
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copytree(b.files.job_dir, dest / b.files.job_dir.name, symlinks=True)
        shutil.copy2(b.files.log, dest / b.files.log.name)
        jd = dest / b.files.job_dir.name
        return Built(b.sim, JobFiles(dest / b.files.log.name, jd, jd / "prometheus"))


@pytest.fixture(scope="session")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Fixtures:
    return Fixtures(tmp_path_factory.mktemp("tsdb-fixtures"))


def make_ctx(b: Built, **kw: Any) -> DiagnosisContext:
    sim = b.sim
    sc = sim.sc
    base: dict[str, Any] = {
        "job_dir": b.files.job_dir,
        "log_path": b.files.log,
        "nodes": sc.nodes,
        "nnodes": len(sc.nodes),
        "job_id": sc.job_id,
        "status": "failed" if (sim.hang or sim.crash) else "completed",
        "primary_class": PRIMARY.get(sc.name),
        "checkpoint_period": sc.checkpoint_period,
        "restored_from_step": sc.restored_from,
        "config": {
            "steps": str(sc.steps),
            "checkpoint_period": str(sc.checkpoint_period),
            "dcn_data_parallelism": str(sc.dcn_data_parallelism),
        },
        "steps": tuple(LogStep(s.step, s.seconds, s.loss, s.tgs, s.t) for s in sim.steps),
        "incident_time": sim.train_end if sim.crash else None,
        "head_node": sc.nodes[0],
        "port": 9190,
    }
    base.update(kw)
    return DiagnosisContext(**base)


def triage_doc(b: Built, **kw: Any) -> dict[str, Any]:
    """A document shaped like jobdiagd.triage.engine's TriageResult.to_dict()."""
    ctx = make_ctx(b)
    sim = b.sim
    doc: dict[str, Any] = {
        "job": {
            "id": ctx.job_id,
            "name": f"JAX-llama2-70b-{sim.sc.name}",
            "log": str(b.files.log),
            "job_dir": str(b.files.job_dir),
            "ray": True,
            "platform": None,
            "nodes": list(ctx.nodes),
            "nnodes": ctx.nnodes,
        },
        "status": ctx.status,
        "primary_failure": ctx.primary_class,
        "failures": [
            {
                "class": ctx.primary_class,
                "line": 1,
                "source": "log",
                "task": None,
                "host": None,
                "text": "",
                "time": ctx.incident_time,
            }
        ]
        if ctx.primary_class
        else [],
        "progress": {
            "first_step": sim.steps[0].step if sim.steps else None,
            "last_step": sim.steps[-1].step if sim.steps else None,
            "checkpoint_period": ctx.checkpoint_period,
            "restored_from_step": ctx.restored_from_step,
            "last_step_time": sim.train_end,
            "step_time_s": sim.sc.step_time,
        },
        "tgs": {},
        "live": {"head_node": ctx.head_node, "prometheus_port": ctx.port, "tunnel": None},
        "config": dict(ctx.config),
        "env": {},
        "heartbeat": None,
        "steps": [
            {"step": s.step, "seconds": s.seconds, "tgs": s.tgs, "loss": s.loss, "time": s.time}
            for s in ctx.steps
        ],
        "next_steps": ["Query Prometheus TSDB"],
    }
    doc.update(kw)
    return doc


@pytest.fixture
def settings(tmp_path: Path) -> TsdbSettings:
    return TsdbSettings(work_dir=str(tmp_path))


__all__ = ["Built", "Fixtures", "HeartbeatInfo", "make_ctx", "triage_doc"]
