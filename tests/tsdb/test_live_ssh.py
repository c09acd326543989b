"""A live Prometheus scraping the simulated exporter, reached through a real sshd on 127.0.0.1 with key auth."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from jobdiagd.model.kinds import GpuHangState
from jobdiagd.tsdb.access import SshTunnelPool
from jobdiagd.tsdb.client import PromClient
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.engine import diagnose
from jobdiagd.tsdb.hang_verdict import hang_power_verdict, should_page
from jobdiagd.tsdb.settings import SshSettings, TsdbSettings
from jobdiagd_sim.metrics import JobSim, LiveExporter, scenario
from tests.helpers.local_services import (
    run_service,
    running_prometheus,
    running_sshd,
    scrape_config,
    service_env,
)

# A real sshd and a job's own Prometheus (tests/conftest.py: service markers).
pytestmark = [pytest.mark.sshd, pytest.mark.prometheus]



@pytest.fixture
def live(tmp_path: Path) -> Iterator[dict[str, object]]:
    svc = tmp_path / "svc"
    # Sim clock: the job started 65 s ago and has been hung (busy-wait) since ~50 s in; the first
    # staleness fill (150 s after the last step) is not due yet, so the real last step is exposed.
    sim = JobSim(
        scenario("rccl-hang", init_s=0.0, step_time=1.0, hang_after_steps=20, checkpoint_period=1000)
    )
    offset = time.time() - (sim.sc.start + 65.0)
    exporter = LiveExporter(sim, clock=time.time, offset=offset)
    eport = exporter.start()
    job_dir = tmp_path / "4242-JAX-live"
    (job_dir / "prometheus").mkdir(parents=True)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(scrape_config("node_hw", [eport]))
    try:
        # The job's own Prometheus writes into <job_dir>/prometheus, as the job scripts do.
        with running_sshd(svc) as ssh, running_prometheus(svc, "live-test", cfg, job_dir / "prometheus") as pport:
            ssh_config = tmp_path / "ssh_config"
            ssh_config.write_text(ssh.stanza("node001"))
            yield {"sim": sim, "pport": pport, "ssh_config": ssh_config, "job_dir": job_dir}
    finally:
        exporter.stop()


async def _wait_for_data(url: str) -> None:
    async with PromClient(url) as c:
        for _ in range(200):
            res = await c.query_vector("count_over_time(hw_gpu_power_watts[1m])", None)
            if res and min(s.v for s in res) >= 3:
                return
            await asyncio.sleep(0.1)
    raise AssertionError("live Prometheus never scraped the exporter")


async def test_live_job_through_ssh(live: dict[str, object], tmp_path: Path) -> None:
    sim = live["sim"]
    assert isinstance(sim, JobSim)
    settings = TsdbSettings(work_dir=str(tmp_path), ssh=SshSettings(config_paths=(str(live["ssh_config"]),)))
    ctx = DiagnosisContext(
        job_dir=live["job_dir"],  # type: ignore[arg-type]
        nodes=sim.sc.nodes,
        nnodes=len(sim.sc.nodes),
        job_id="4242",
        status="hanging",
        primary_class="hang",
        head_node="node001",
        port=int(live["pport"]),  # type: ignore[call-overload]
    )
    pool = SshTunnelPool(settings.ssh)
    try:
        local = await pool.forward("node001", ctx.port or 0)
        await _wait_for_data(f"http://127.0.0.1:{local}")
        assert await pool.forward("node001", ctx.port or 0) == local  # one persistent connection + forward
        assert pool.connects == 1

        verdict = await hang_power_verdict(ctx, time.time(), settings=settings, tunnels=pool)
        assert verdict.state is GpuHangState.BUSY_WAIT and verdict.confirmed
        assert verdict.mean_power_w is not None and 250 <= verdict.mean_power_w <= 350
        assert set(verdict.per_host) == set(sim.sc.nodes)
        assert should_page(verdict, replace(settings, confirm_hang_with_power=True))

        lock = live["job_dir"] / "prometheus" / "lock"  # type: ignore[operator]
        lock_before = lock.stat()
        d = await diagnose(ctx, settings, now=time.time(), tunnels=pool, with_anomaly=False)
        assert d.access_mode == "live-ssh" and "node001" in d.server
        assert d.result is not None and d.result.verdict == "rccl-busy-wait-hang"
        assert d.discovery is not None and d.discovery.hosts == sim.sc.nodes
        assert d.discovery.timeline.last_step == 19  # tb_step with explicit timestamps came through
        assert pool.connects == 1
        # The live job's lock (held by its own Prometheus) was neither removed nor rewritten.
        after = lock.stat()
        assert (after.st_ino, after.st_mtime_ns) == (lock_before.st_ino, lock_before.st_mtime_ns)
    finally:
        await pool.close()


async def test_reconnects_after_connection_loss(live: dict[str, object], tmp_path: Path) -> None:
    settings = SshSettings(config_paths=(str(live["ssh_config"]),), backoff_initial_s=0.05)
    pool = SshTunnelPool(settings)
    try:
        port = int(live["pport"])  # type: ignore[call-overload]
        first = await pool.forward("node001", port)
        pool._conns["node001"].conn.close()  # simulate a dropped connection
        await asyncio.sleep(0.1)
        second = await pool.forward("node001", port)
        assert pool.connects == 2 and second != 0
        async with PromClient(f"http://127.0.0.1:{second}") as c:
            assert await c.ready()
        _ = first
    finally:
        await pool.close()


async def test_finished_job_with_wal_only(live: dict[str, object], tmp_path: Path) -> None:
    """After the job ends, its TSDB is mostly WAL (no 2 h block yet) plus the stale lock of its Prometheus."""
    sim = live["sim"]
    assert isinstance(sim, JobSim)
    job_dir = live["job_dir"]
    assert isinstance(job_dir, Path)
    async with PromClient(f"http://127.0.0.1:{live['pport']}") as c:
        await _wait_for_data(c.base_url)
    run_service(service_env(tmp_path / "svc"), "prometheus.sh", "stop", "live-test")
    # A clean shutdown removes the lock; a job killed with SIGKILL leaves it behind (stale, unheld).
    (job_dir / "prometheus" / "lock").write_text("")
    assert (job_dir / "prometheus" / "wal").is_dir()
    ctx = DiagnosisContext(
        job_dir=job_dir, nodes=sim.sc.nodes, job_id="4242", status="cancelled", primary_class="hang"
    )
    # Opened in place: well past the WAL-freshness guard, as for any finished job.
    d = await diagnose(ctx, TsdbSettings(work_dir=str(tmp_path)), now=time.time() + 600, with_anomaly=False)
    assert d.access_mode == "local-readonly"
    assert d.discovery is not None and "head stats" in d.discovery.range_source
    assert d.discovery.hosts == sim.sc.nodes
    assert d.result is not None and d.result.verdict == "rccl-busy-wait-hang"
