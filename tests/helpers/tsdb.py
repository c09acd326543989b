"""Simulated jobs with promtool-built TSDBs for the TSDB tests: building, private copies, contexts, series."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobdiagd.tsdb.access import open_tsdb
from jobdiagd.tsdb.context import DiagnosisContext, HeartbeatInfo, LogStep
from jobdiagd.tsdb.discovery import discover
from jobdiagd.tsdb.playbooks.base import PlaybookEnv, PlaybookResult
from jobdiagd.tsdb.playbooks.registry import PLAYBOOKS
from jobdiagd.tsdb.settings import TsdbSettings
from jobdiagd_sim.metrics import JobFiles, JobSim, scenario, write_job
from tests.helpers.parallel import built_once

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
    """The scenarios' jobs, each built on first use, once per run: `root` may be shared by the
    xdist workers (tests/helpers/parallel.py), the first to need a job builds it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[str, Built] = {}

    def get(self, name: str) -> Built:
        if name not in self._built:
            self._built[name] = built_once(self.root / name, lambda where: _build_scenario(name, where))
        return self._built[name]

    def copy(self, name: str, dest: Path) -> Built:
        """A private copy: Prometheus writes wal/ and chunks_head/ into whatever it opens."""
        b = self.get(name)
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copytree(b.files.job_dir, dest / b.files.job_dir.name, symlinks=True)
        shutil.copy2(b.files.log, dest / b.files.log.name)
        jd = dest / b.files.job_dir.name
        return Built(b.sim, JobFiles(dest / b.files.log.name, jd, jd / "prometheus"))


def _build_scenario(name: str, where: Path) -> Built:
    sim = JobSim(scenario(name))
    return Built(sim, write_job(sim, where))


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


NOW = 1_800_000_000.0


Series = Iterator[tuple[str, str, str, Any]]


def build(sim: JobSim, root: Path) -> Built:
    return Built(sim, write_job(sim, root))


def empty_dir(path: Path) -> None:
    for child in path.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()


def unrelated_blocks(prom: Path, om: Path, t0: float) -> None:
    """TSDB blocks that hold no job metric at all (what an unrelated or mis-pointed database serves)."""
    om.write_text("".join(f"unrelated_gauge 1 {t0 + 10 * i:.3f}\n" for i in range(30)) + "# EOF\n")
    subprocess.run(
        ["/usr/bin/promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(prom)],
        check=True,
        capture_output=True,
    )


def private_copy(b: Built, dest: Path) -> Built:
    """Prometheus writes into what it opens: each test reads its own copy of a module-scoped build."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(b.files.job_dir), str(dest)], check=True)
    jd = dest / b.files.job_dir.name
    return Built(b.sim, JobFiles(b.files.log, jd, jd / "prometheus"))


def relabel(series: Series, fn: Callable[[str, str, str, Any], Any]) -> Series:
    for name, lab, host, val in series:
        yield name, lab, host, fn(name, lab, host, val)


async def run_playbooks(
    b: Built, tmp_path: Path, settings: TsdbSettings, names: list[str], ctx: DiagnosisContext | None = None
) -> dict[str, tuple[PlaybookResult, PlaybookEnv]]:
    """Run several playbooks against one Prometheus over a private copy of the build."""
    b = private_copy(b, tmp_path)
    ctx = ctx or make_ctx(b)
    out = {}
    async with open_tsdb(ctx, settings, now=NOW) as handle:
        disc = await discover(handle, ctx, settings)
        env = PlaybookEnv(handle.client, ctx, disc, settings, NOW)
        for n in names:
            out[n] = (await PLAYBOOKS[n].run(env), env)
    return out


def rows(result: Any, title_part: str) -> dict[str, tuple[str, ...]]:
    for f in result.findings:
        for t in f.evidence:
            if title_part in t.title:
                return {r[0]: r for r in t.rows}
    raise AssertionError(f"no evidence table containing {title_part!r}")


def hang_hb_job(root: Path) -> Built:
    """Steps stop at T, every GPU busy-waits, the heartbeat kills the job at T + 40 min. No tb_* metrics in
    the TSDB (the training plugin did not run), so the last step's time comes from triage or the power."""
    extra = {"heartbeat_kill": True, "heartbeat_timeout_s": 100.0, "accused_task": 2, "no_tb": True}
    return build(JobSim(scenario("hang-then-heartbeat", extra=extra)), root / "hang-hb")


def hb_ctx(b: Built, **kw: Any) -> DiagnosisContext:
    crash = b.sim.train_end + b.sim.sc.hang_s
    base: dict[str, Any] = {
        "primary_class": "heartbeat-timeout",
        "heartbeat": HeartbeatInfo(crash, 100.0, (2,), ("node003",)),
        "incident_time": crash,
    }
    return make_ctx(b, **(base | kw))


def counter(
    start: float, end: float, step: float, rate: float, *, burst_from: float | None = None, burst: float = 0.0
) -> list[tuple[float, float]]:
    """A counter rising at `rate`/s, plus `burst`/s from burst_from on."""
    pts, v, t = [], 0.0, start
    while t <= end:
        pts.append((t, v))
        v += rate * step + (burst * step if burst_from is not None and t >= burst_from else 0.0)
        t += step
    return pts


def sparse(
    start: float, end: float, step: float, every: int, size: float, phase: int = 0
) -> list[tuple[float, float]]:
    """Single-digit increments every `every` samples (background counts)."""
    pts, v = [], 0.0
    for i in range(int((end - start) / step) + 1):
        if i and (i + phase) % every == 0:
            v += size
        pts.append((start + i * step, v))
    return pts
