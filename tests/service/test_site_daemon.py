"""The site Prometheus through the daemon: a real Prometheus scraping simulated DCGM and node
exporters on loopback (tests/helpers/site_exporters.py), jobs found through squeue and placed
through `scontrol -d show job` (stand-in scripts printing Slurm's formats: the test cluster has
one node, these jobs need several), and the engine's real tick loop paging them.

Scenarios (issue: the site Prometheus for every job): a non-RAY hang paged early; a checkpoint
pause not paged; a dead node under busy-waiting peers; a shared node judged from the job's own
GPUs only (Slurm's indices), and refused without them; a site Prometheus that is down (one
notice, the step budget pages: through `run_daemon`, with `jobdiagd status` and the metrics);
a one-host RDMA slide named in the TGS page, and a uniform slide with no host named.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import Config, loads
from jobdiagd.detectors import build
from jobdiagd.detectors.hang import KIND as HANG
from jobdiagd.detectors.tgs import KIND as TGS
from jobdiagd.model.kinds import GpuHangState
from jobdiagd.service.discovery import SlurmDiscovery
from jobdiagd.service.engine import Engine
from jobdiagd.service.jobs import JobView
from jobdiagd.service.runner import plot_inputs
from jobdiagd.service.site_source import open_site
from jobdiagd.service.status_socket import request
from jobdiagd.service.tick_loop import TickLoop
from jobdiagd.service.tsdb_enrich import TsdbEnricher
from jobdiagd.sources.slurm import CliSlurmBackend, SlurmWatcher
from jobdiagd.sources.slurm_parse import SQUEUE_SEP
from jobdiagd.tsdb.access import free_loopback_port
from tests.helpers.chat import start_daemon, until
from tests.helpers.engine import outbox
from tests.helpers.joblog import JobLog
from tests.helpers.local_services import running_prometheus, wait_scraped
from tests.helpers.site_exporters import ExporterServer, SimNode, SiteCluster

pytestmark = [pytest.mark.prometheus, pytest.mark.daemon]

BW = ["busywait"] * 8


def build_cluster() -> SiteCluster:
    c = SiteCluster()
    for i in range(1, 5):
        c.add(SimNode(f"h00{i}", "dcgm", phase=BW))  # every GPU spins: a collective hang
        c.add(SimNode(f"p00{i}", "dcgm", phase=["ckpt"] * 8, io_stall=0.3))  # a checkpoint save
        c.add(SimNode(f"x00{i}", "dcgm", phase=["dead"] * 8 if i == 4 else BW))  # x004's process died
    # A shared node: GPUs 0-3 are job 8104's (its process there died), 4-7 job 8105's (spinning).
    c.add(SimNode("s001", "dcgm", phase=BW))
    c.add(SimNode("s002", "dcgm", phase=["dead"] * 4 + ["busywait"] * 4))
    for i in range(1, 6):  # TGS slides: r003's NIC retransmits; u00*: every host slows the same
        c.add(SimNode(f"r00{i}", "dcgm", power_delta=-60.0, rdma_ack_timeout=25.0 if i == 3 else 0.02))
        c.add(SimNode(f"u00{i}", "dcgm", power_delta=-90.0, tcp_retrans=3.0))
    return c


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus scraping every node's exporters each second; yields its URL."""
    tmp = tmp_path_factory.mktemp("site-daemon")
    with ExporterServer(build_cluster()) as server:
        cfg = tmp / "prometheus.yml"
        cfg.write_text(server.prometheus_config("1s"))
        with running_prometheus(tmp / "svc", "site-daemon", cfg, tmp / "data") as port:
            wait_scraped(port, 2 * len(server.cluster.nodes))
            yield f"http://127.0.0.1:{port}"


# --- Slurm's answers --------------------------------------------------------------------------------


@dataclass
class SlurmJobSpec:
    """One job as squeue and scontrol print it; `gres`: node -> GRES of `scontrol -d` (None: the
    job holds its nodes whole, `OverSubscribe=NO`)."""

    job_id: str
    nodelist: str
    nodes: int
    gres: dict[str, str] | None = None
    log: JobLog | None = field(default=None, repr=False)


def fake_slurm(bin_dir: Path, outputs: Path, jobs: list[SlurmJobSpec]) -> None:
    """squeue/scontrol stand-ins printing these jobs (and counting `scontrol -d` calls)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for j in jobs:
        assert j.log is not None
        rows.append(
            SQUEUE_SEP.join(
                [
                    j.job_id,
                    "RUNNING",
                    "alice",
                    "gpu",
                    j.nodelist,
                    str(int(time.time()) - 60),
                    "1:00",
                    "1:00:00",
                    str(outputs),
                    "None",
                    j.log.name,
                ]
            )
        )
        base = (
            f"JobId={j.job_id} JobName={j.log.name} UserId=alice(1000) JobState=RUNNING Partition=gpu "
            f"NodeList={j.nodelist} StdOut={j.log.path}"
        )
        (bin_dir / f"job-{j.job_id}.txt").write_text(base + "\n")
        if j.gres is None:
            detail = base + " OverSubscribe=NO"
        else:
            detail = (
                base
                + " OverSubscribe=OK"
                + "".join(f" Nodes={n} CPU_IDs=0-15 Mem=0 GRES={g}" for n, g in j.gres.items())
            )
        (bin_dir / f"detail-{j.job_id}.txt").write_text(detail + "\n")
    (bin_dir / "squeue.txt").write_text("\n".join(rows) + "\n")
    squeue = bin_dir / "squeue"
    squeue.write_text(f'#!/bin/sh\ncat "{bin_dir}/squeue.txt"\n')
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        "for id; do :; done\n"  # the job id is the last argument
        f'if [ "$1" = "-d" ]; then echo "$id" >> "{bin_dir}/details.log"; cat "{bin_dir}/detail-$id.txt"; '
        f'else cat "{bin_dir}/job-$id.txt"; fi\n'
    )
    for exe in (squeue, scontrol):
        exe.chmod(0o755)


def hung(outputs: Path, job_id: str, nodes: int, steps: int = 20) -> JobLog:
    """A non-RAY job that trained `steps` steps of 0.3 s and went silent."""
    job = JobLog(outputs, job_id, nnodes=nodes)
    for k in range(steps):
        job.step(k, seconds=0.3)
    return job


def slid(outputs: Path, job_id: str, nodes: int) -> JobLog:
    """A non-RAY job whose throughput fell 20 % after step 20 (a TGS slide)."""
    job = JobLog(outputs, job_id, nnodes=nodes)
    for k in range(45):
        job.step(k, seconds=0.3, tokens=3000.0 if k < 20 else 2400.0)
    return job


def config(
    state: Path, outputs: Path, site_url: str, *, min_stall: float = 30.0, metrics_port: int = 0
) -> str:
    return f"""
[daemon]
state_dir = "{state}"
socket_path = "{state}/s.sock"
tick_seconds = 0.5
squeue_interval_seconds = 1
metrics_port = {metrics_port}
[slurm]
backend = "cli"
outputs_roots = ["{outputs}"]
[detectors.hang]
min_stall_seconds = {min_stall}
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
[tsdb]
early_overdue_slack_s = 0.5
early_scrape_interval_s = 1.0
[site_prometheus]
enabled = true
url = "{site_url}"
profile = "dcgm"
scrape_interval_seconds = 2
timeout_seconds = 2
"""


# --- the engine with its real tick loop -------------------------------------------------------------


@dataclass
class Running:
    cfg: Config
    state: Path
    engine: Engine
    bin_dir: Path

    def opened(self, kind: str = HANG) -> list[dict[str, Any]]:
        return [n for n in outbox(self.state) if n["event"] == "open" and n["kind"] == kind]

    def view(self, job_id: str) -> JobView | None:
        w = self.engine.jobs.get(job_id)
        return w.view if w is not None else None

    def details_asked(self) -> list[str]:
        log = self.bin_dir / "details.log"
        return log.read_text().split() if log.exists() else []


@contextlib.asynccontextmanager
async def engine_for(tmp: Path, site_url: str, jobs: list[SlurmJobSpec]) -> AsyncIterator[Running]:
    """The daemon's engine and tick loop over these jobs, with the site source opened as the
    runner opens it, and the pictures' inputs on (the TGS page's strip)."""
    state, outputs, bin_dir = tmp / "state", tmp / "outputs", tmp / "bin"
    fake_slurm(bin_dir, outputs, jobs)
    cfg = loads(config(state, outputs, site_url))
    state.mkdir(parents=True, exist_ok=True)
    pipeline = AlertPipeline.open(state, cfg.incidents, ["jsonl"])
    backend = CliSlurmBackend(squeue=str(bin_dir / "squeue"), scontrol=str(bin_dir / "scontrol"), sacct=None)
    discovery = SlurmDiscovery(SlurmWatcher(backend), [outputs], 1.0)
    enricher = TsdbEnricher(cfg.tsdb, tick_s=cfg.daemon.tick_seconds)
    site = await open_site(
        cfg,
        tunnels=enricher.tunnels,
        detail=backend.job_gres_detail,
        announce=pipeline.announce,
        now=time.time(),
    )
    assert site is not None and site.checked
    enricher.use_site(site)
    engine = Engine(cfg, pipeline, build(cfg), discovery, enricher=enricher, plot_inputs=plot_inputs(cfg))
    stop = asyncio.Event()

    async def sleep(seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
        return stop.is_set()

    loop = asyncio.create_task(TickLoop(engine).run(sleep, cfg.daemon.tick_seconds))
    try:
        yield Running(cfg, state, engine, bin_dir)
    finally:
        stop.set()
        await loop
        await site.close()
        await enricher.close()
        pipeline.close()


def spec(
    outputs: Path, job_id: str, nodelist: str, nodes: int, gres: dict[str, str] | None = None
) -> SlurmJobSpec:
    return SlurmJobSpec(job_id, nodelist, nodes, gres, hung(outputs, job_id, nodes))


# --- the early page ----------------------------------------------------------------------------------


async def test_a_non_ray_hang_is_paged_early_from_the_site(site: str, tmp_path: Path) -> None:
    job = spec(tmp_path / "outputs", "8101", "h[001-004]", 4)
    async with engine_for(tmp_path, site, [job]) as d:
        (page,) = await until(lambda: d.opened(), "the early hang page", within=30)
        assert "GPU-confirmed hang (busy-wait)" in page["body"], page["body"]
        assert "all 4 host(s)" in page["body"]
        view = d.view("8101")
        assert view is not None and view.last_step_at is not None
        # Paged long before the step budget (30 s): at the early point plus a scrape interval or so.
        assert page["created_at"] - view.last_step_at < 15
        assert d.details_asked() == ["8101"]  # scontrol -d once for the job, not per query


async def test_a_checkpoint_pause_is_not_paged(site: str, tmp_path: Path) -> None:
    job = spec(tmp_path / "outputs", "8102", "p[001-004]", 4)
    async with engine_for(tmp_path, site, [job]) as d:

        def verdict() -> GpuHangState | None:
            view = d.view("8102")
            return view.gpu_check.verdict.state if view is not None and view.gpu_check is not None else None

        assert await until(verdict, "the early verdict", within=30) is GpuHangState.NOT_A_HANG
        assert "I/O pressure" in d.view("8102").gpu_check.verdict.summary  # type: ignore[union-attr]
        await asyncio.sleep(1.0)  # a few more ticks and polls: still no page before the step budget
        assert d.opened() == []


async def test_a_dead_node_under_busy_waiting_peers_is_paged_and_named(site: str, tmp_path: Path) -> None:
    job = spec(tmp_path / "outputs", "8103", "x[001-004]", 4)
    async with engine_for(tmp_path, site, [job]) as d:
        (page,) = await until(lambda: d.opened(), "the early dead-node page", within=30)
        assert "GPU-confirmed hang (dead-node)" in page["body"], page["body"]
        assert "Suspect host: x004" in page["body"]


async def test_a_shared_node_is_judged_from_the_jobs_own_gpus_only(site: str, tmp_path: Path) -> None:
    """No job label on the exporter: Slurm's GPU indices decide. 8104 holds GPUs 0-3 of s002 (its
    process there died) while 8105 spins on 4-7: 8104 is a dead node named s002 (all eight GPUs
    would be half dead, half spinning); 8105's Slurm record has no indices, so s002 confirms
    nothing for it."""
    outputs = tmp_path / "outputs"
    mine = spec(outputs, "8104", "s[001-002]", 2, {"s001": "gpu:8(IDX:0-7)", "s002": "gpu:4(IDX:0-3)"})
    neighbour = spec(outputs, "8105", "s002", 1, {"s002": "gpu:4"})
    async with engine_for(tmp_path, site, [mine, neighbour]) as d:
        (page,) = await until(lambda: d.opened(), "the early page of 8104", within=30)
        assert page["job_id"] == "8104" and "GPU-confirmed hang (dead-node)" in page["body"], page["body"]
        assert "Suspect host: s002" in page["body"]

        def refused() -> str | None:
            view = d.view("8105")
            memo = view.gpu_check if view is not None else None
            return memo.verdict.summary if memo is not None else None

        summary = await until(refused, "8105's early verdict", within=30)
        assert "shared node" in summary and "s002" in summary
        assert [p["job_id"] for p in d.opened()] == ["8104"]
        assert sorted(d.details_asked()) == ["8104", "8105"]


# --- the slow host ------------------------------------------------------------------------------------


async def test_a_one_host_rdma_slide_is_named_and_a_uniform_slide_names_none(
    site: str, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    one = SlurmJobSpec("8110", "r[001-005]", 5, None, slid(outputs, "8110", 5))
    uniform = SlurmJobSpec("8111", "u[001-005]", 5, None, slid(outputs, "8111", 5))
    async with engine_for(tmp_path, site, [one, uniform]) as d:
        pages = await until(
            lambda: len(d.opened(TGS)) == 2 and d.opened(TGS),
            "two TGS pages",
            within=30,
        )
        by_job = {p["job_id"]: p for p in pages}
        body = by_job["8110"]["body"]
        assert "r003 (RDMA retransmits" in body, body
        assert "suspect host" in body and "r003" in body
        strip = by_job["8110"]["plot"]["strip"]
        assert strip["type"] == "host_strip/1" and strip["spec"]["named"] == ["r003"]
        assert [p["label"] for p in strip["spec"]["panels"]] == ["GPU power", "RDMA retransmits"]
        other = by_job["8111"]["body"]
        assert "no host stands out among 5" in other and "the slide is the job's" in other, other
        assert "suspect host" not in other
        assert by_job["8111"]["plot"]["strip"]["spec"]["named"] == []


# --- the site Prometheus down, through `jobdiagd run` ------------------------------------------------------


async def test_a_site_prometheus_down_is_one_notice_and_the_step_budget_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, outputs, bin_dir = tmp_path / "state", tmp_path / "outputs", tmp_path / "bin"
    jobs = [spec(outputs, "8120", "h[001-002]", 2), spec(outputs, "8121", "h[003-004]", 2)]
    fake_slurm(bin_dir, outputs, jobs)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    metrics_port = free_loopback_port()
    down = f"http://127.0.0.1:{free_loopback_port()}"  # nothing listens there
    cfg = tmp_path / "jobdiagd.toml"
    cfg.write_text(config(state, outputs, down, min_stall=4.0, metrics_port=metrics_port))
    daemon = await start_daemon(cfg, outputs, discover="slurm")
    try:
        pages = await until(
            lambda: len(_opened(state)) == 2 and _opened(state), "two step-budget pages", within=40
        )
        assert all("GPU-confirmed" not in p["body"] for p in pages)
        await asyncio.sleep(1.0)  # more polls of two overdue jobs: still one notice
        notices = [n for n in outbox(state) if n["event"] == "notice"]
        assert [n["title"] for n in notices] == ["site Prometheus degraded"], notices
        reply = await asyncio.to_thread(request, state / "s.sock", "status")
        status = reply["result"]
        assert status["sources"]["site_prometheus"]["failing"]
        assert status["site_prometheus"]["checked"] is False
        text = await asyncio.to_thread(_get, f"http://127.0.0.1:{metrics_port}/metrics")
        assert 'jobdiagd_source_up{source="site_prometheus"} 0.0' in text
        for job in ("8120", "8121"):
            memo = daemon.engine.jobs[job].view.gpu_check
            assert memo is not None and memo.verdict.state is GpuHangState.NO_DATA
    finally:
        await daemon.stop()


def _opened(state: Path) -> list[dict[str, Any]]:
    return [n for n in outbox(state) if n["event"] == "open" and n["kind"] == HANG]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())
