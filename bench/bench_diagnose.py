"""Benchmark: `diagnose` on a finished 16-node x 8-GPU, 6-hour job TSDB (Prometheus start included).

Usage: .venv/bin/python bench/bench_diagnose.py [--nodes 16] [--gpus 8] [--hours 6] [--cache DIR]
The fixture (OpenMetrics -> promtool blocks) is built once and cached; every run diagnoses a fresh copy.
Reports wall time per playbook, number of HTTP queries, peak RSS of this process and of Prometheus.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

from jobdiagd.tsdb import access
from jobdiagd.tsdb.context import DiagnosisContext, LogStep
from jobdiagd.tsdb.engine import diagnose
from jobdiagd.tsdb.playbooks.registry import PLAYBOOKS
from jobdiagd.tsdb.settings import TsdbSettings
from jobdiagd_sim.metrics import JobSim, scenario, write_job

_prom_hwm_kb: list[int] = []
_orig_terminate = access.LocalPrometheus._terminate


async def _terminate_and_measure(self: access.LocalPrometheus) -> None:
    # Read Prometheus' high-water RSS just before it is stopped.
    if self.proc is not None and self.proc.returncode is None:
        try:
            with open(f"/proc/{self.proc.pid}/status") as fh:  # noqa: ASYNC230 - tiny procfs read
                status = fh.read()
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    _prom_hwm_kb.append(int(line.split()[1]))
        except OSError:
            pass
    await _orig_terminate(self)


access.LocalPrometheus._terminate = _terminate_and_measure  # type: ignore[method-assign]


def build(cache: Path, nodes: int, gpus: int, hours: float) -> tuple[JobSim, Path, Path, float]:
    step_time = 10.0
    init_s = 600.0
    hang_s = 1800.0
    steps_run = int((hours * 3600 - init_s - hang_s - 60) / step_time)
    sc = scenario(
        "rccl-hang",
        nodes=tuple(f"node{i:03d}" for i in range(1, nodes + 1)),
        gpus=gpus,
        steps=steps_run + 500,
        hang_after_steps=steps_run,
        hang_s=hang_s,
        init_s=init_s,
        step_time=step_time,
        checkpoint_period=500,
    )
    sim = JobSim(sc)
    key = cache / f"n{nodes}-g{gpus}-h{hours:g}"
    done = key / "done.json"
    if not done.exists():
        shutil.rmtree(key, ignore_errors=True)
        key.mkdir(parents=True)
        t0 = time.perf_counter()
        files = write_job(sim, key)
        done.write_text(
            json.dumps(
                {"log": str(files.log), "job_dir": str(files.job_dir), "build_s": time.perf_counter() - t0}
            )
        )
    meta = json.loads(done.read_text())
    return sim, Path(meta["log"]), Path(meta["job_dir"]), float(meta["build_s"])


async def run_one(sim: JobSim, job_dir: Path, playbook: str | None, tmp: Path) -> dict[str, object]:
    work = tmp / f"run-{playbook or 'default'}"
    shutil.copytree(job_dir, work / job_dir.name, symlinks=True)
    ctx = DiagnosisContext(
        job_dir=work / job_dir.name,
        nodes=sim.sc.nodes,
        nnodes=len(sim.sc.nodes),
        job_id=sim.sc.job_id,
        status="cancelled",
        primary_class="hang",
        checkpoint_period=sim.sc.checkpoint_period,
        config={"dcn_data_parallelism": "2"},
        steps=tuple(LogStep(s.step, s.seconds, s.loss, s.tgs, s.t) for s in sim.steps),
    )
    t0 = time.perf_counter()
    d = await diagnose(ctx, TsdbSettings(work_dir=str(tmp)), now=time.time(), playbook=playbook)
    el = time.perf_counter() - t0
    shutil.rmtree(work, ignore_errors=True)
    return {
        "playbook": d.playbook,
        "verdict": d.result.verdict if d.result else None,
        "seconds": round(el, 2),
        "queries": d.queries,
        "anomaly_families": d.anomaly.families_checked if d.anomaly else 0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "jobdiagd-bench")
    ap.add_argument("--all-playbooks", action="store_true", help="also time every playbook separately")
    a = ap.parse_args()
    sim, _log, job_dir, build_s = build(a.cache, a.nodes, a.gpus, a.hours)
    size = sum(f.stat().st_size for f in (job_dir / "prometheus").rglob("*") if f.is_file())
    print(
        f"fixture: {a.nodes} nodes x {a.gpus} GPUs, {a.hours:g} h, {len(sim.steps)} steps, TSDB {size / 1e6:.0f} MB (built in {build_s:.0f} s, cached)"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="jobdiagd-bench-") as tmp:
        names: list[str | None] = [None]
        if a.all_playbooks:
            names += sorted(PLAYBOOKS)
        for name in names:
            rows.append(asyncio.run(run_one(sim, job_dir, name, Path(tmp))))
    for r in rows:
        print(
            f"  {r['playbook']:<20} verdict={r['verdict']:<22} {r['seconds']:>6.2f} s  queries={r['queries']}"
        )
    print(
        f"peak RSS: jobdiagd {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB, prometheus {max(_prom_hwm_kb, default=0) / 1024:.0f} MB"
    )
    first = rows[0]
    print(
        json.dumps(
            {
                "diagnose_s": first["seconds"],
                "queries": first["queries"],
                "target_s": 15,
                "ok": float(str(first["seconds"])) < 15,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
