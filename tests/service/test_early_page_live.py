"""The early page on the live daemon path: a real Prometheus scraping a hung job's exporter, reached
through a real sshd on 127.0.0.1 with key auth, the engine paging before the step budget."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.alerts.store import DB_NAME
from jobdiagd.config import Config
from jobdiagd.detectors import build
from jobdiagd.service.discovery import OutputsDiscovery
from jobdiagd.service.engine import Engine
from jobdiagd.service.tsdb_enrich import TsdbEnricher
from jobdiagd.sources.tail import OffsetStore
from jobdiagd.tsdb.client import PromClient
from jobdiagd_sim import lines as L
from jobdiagd_sim.metrics import JobSim, LiveExporter, scenario
from tests.helpers.engine import make_cfg as engine_cfg
from tests.helpers.local_services import running_prometheus, running_sshd, scrape_config

pytestmark = [pytest.mark.sshd, pytest.mark.prometheus]

JOB = "4242-JAX-llama2-70b-rccl-hang"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[dict[str, Any]]:
    svc = tmp_path / "svc"
    # Sim clock: 20 one-second steps, then every GPU of the 4 hosts busy-waits (hung 45 s ago).
    sim = JobSim(
        scenario("rccl-hang", init_s=0.0, step_time=1.0, hang_after_steps=20, checkpoint_period=1000)
    )
    offset = time.time() - (sim.sc.start + 65.0)
    exporter = LiveExporter(sim, clock=time.time, offset=offset)
    eport = exporter.start()
    outputs = tmp_path / "outputs"
    job_dir = outputs / JOB
    (job_dir / "prometheus").mkdir(parents=True)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(scrape_config("node_hw", [eport]))
    try:
        # The job's own Prometheus writes into <job_dir>/prometheus, as the job scripts do.
        with running_sshd(svc) as ssh, running_prometheus(svc, "early-live", cfg, job_dir / "prometheus") as pport:
            ssh_config = tmp_path / "ssh_config"
            ssh_config.write_text(ssh.stanza("node001"))
            yield {"sim": sim, "pport": pport, "ssh_config": ssh_config, "outputs": outputs, "job_dir": job_dir}
    finally:
        exporter.stop()


def write_log(outputs: Path, sim: JobSim, pport: int) -> None:
    lines = [
        *L.header_lines(
            job_id="4242",
            name="JAX-llama2-70b-rccl-hang",
            nnodes=len(sim.sc.nodes),
            nodelist="node[001-004]",
            jax_port=12321,
            ray_port=6379,
            passthrough={"steps": 300},
            model="llama2-70b",
        ),
        "[Ray] Starting HEAD on node001:6379 (bind=10.0.0.1)",
        f"[Prometheus] Started on port {pport} (ray: 'node001:55080', node_hw: 'node001:9400')",
    ]
    for s in sim.steps:
        f = L.StepFields(
            step=s.step, seconds=s.seconds, tflops=1.0, tokens=s.tgs, total_weights=1, loss=s.loss
        )
        lines.append("0: " + L.absl_prefix(s.t, 4242, "metric_logger.py:232") + L.step_line(f))
    (outputs / f"{JOB}.log").write_text("\n".join(lines) + "\n")
    (outputs / JOB / "log").symlink_to(f"../{JOB}.log")


def make_cfg(state: Path, ssh_config: Path) -> Config:
    """The engine helper's daemon config, with the job's own Prometheus reached over ssh."""
    return engine_cfg(
        state,
        f"""
[tsdb]
work_dir = "{state}"
early_overdue_slack_s = 0.0
early_scrape_interval_s = 1.0
[tsdb.ssh]
config_paths = ["{ssh_config}"]
""",
    )


async def _wait_for_data(url: str) -> None:
    async with PromClient(url) as c:
        for _ in range(200):
            res = await c.query_vector("count_over_time(hw_gpu_power_watts[1m])", None)
            if res and min(s.v for s in res) >= 3:
                return
            await asyncio.sleep(0.1)
    raise AssertionError("live Prometheus never scraped the exporter")


def outbox(state: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(state / "alerts.sqlite3") as c:
        return [json.loads(r[0]) for r in c.execute("SELECT data FROM outbox ORDER BY rowid")]


async def test_live_hang_is_gpu_confirmed_through_ssh_before_the_step_budget(
    live: dict[str, Any], tmp_path: Path
) -> None:
    sim: JobSim = live["sim"]
    state = tmp_path / "state"
    write_log(live["outputs"], sim, live["pport"])
    cfg = make_cfg(state, live["ssh_config"])
    pipeline = AlertPipeline.open(state, cfg.incidents, ["jsonl"])
    offsets = OffsetStore(state / DB_NAME)
    enricher = TsdbEnricher(cfg.tsdb, tick_s=15)
    engine = Engine(
        cfg,
        pipeline,
        build(cfg),
        OutputsDiscovery([live["outputs"]], set()),
        offsets=offsets,
        enricher=enricher,
    )
    early = enricher.early
    assert early is not None
    lock = live["job_dir"] / "prometheus" / "lock"
    try:
        await engine.tick(time.time())  # reads the 20 steps: the hang clock starts now
        (view,) = [w.view for w in engine.jobs.values()]
        assert view.last_step == 19
        early.poll({view.key: view}, time.time(), engine.detectors)
        due = early.next_poll_at()
        assert due is not None  # 1 s steps: overdue 2.5 s after the read, the budget is 120 s
        local = await enricher.tunnels.forward("node001", live["pport"])
        await _wait_for_data(f"http://127.0.0.1:{local}")
        lock_before = lock.stat() if lock.exists() else None
        await asyncio.sleep(max(0.0, due - time.time()))
        for _ in range(100):  # what Engine.run does: poll when due, tick at once on a confirmation
            early.poll({view.key: view}, time.time(), engine.detectors)
            if early.wake.is_set():
                break
            await asyncio.sleep(0.1)
        assert early.wake.is_set(), view.gpu_check
        await engine.tick(time.time(), early.take_confirmed(), early=True)
        (opened,) = [n for n in outbox(state) if n["event"] == "open"]
        assert opened["kind"] == "hang" and "GPU-confirmed hang (busy-wait)" in opened["body"]
        assert "all 4 host(s)" in opened["body"]
        assert enricher.tunnels.connects == 1  # one ssh connection for the check and the early queries
        if lock_before is not None:  # the live job's lock, held by its own Prometheus, untouched
            after = lock.stat()
            assert (after.st_ino, after.st_mtime_ns) == (lock_before.st_ino, lock_before.st_mtime_ns)
    finally:
        await enricher.close()
        offsets.close()
        pipeline.close()
