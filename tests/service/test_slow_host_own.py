"""The slow host of a RAY=1 job's TGS slide, compared on the job's own Prometheus (no
`[site_prometheus]`; rule SLOW-6): a real Prometheus scraping simulated node_hw/Ray exporters of
the jobs' nodes, reached through a real sshd on 127.0.0.1 with key auth (as the RAY=1 early page
reaches it, tests/service/test_early_page_live.py), and the engine's stages holding each TGS page
one tick for its comparison.

Four jobs slide at once: one whose node003 NIC retransmits (named, with its strip picture and
the suspect-host fact the node memory reads), one whose hosts all slide alike (no host named),
one whose Prometheus does not answer and one whose head node refuses ssh (not compared: their
pages still go out the next tick).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import Config
from jobdiagd.detectors import build
from jobdiagd.detectors.tgs import KIND as TGS
from jobdiagd.model.alerts import Finding
from jobdiagd.recovery.nodes import suspects_from
from jobdiagd.rules.recovery import Evidence
from jobdiagd.service.discovery import OutputsDiscovery
from jobdiagd.service.engine import Engine
from jobdiagd.service.runner import plot_inputs
from jobdiagd.service.stages import Batch, StageContext
from jobdiagd.service.tsdb_enrich import TsdbEnricher
from jobdiagd.tsdb.access import free_loopback_port
from jobdiagd.tsdb.client import PromClient
from jobdiagd_sim import lines as L
from jobdiagd_sim.metrics import JobSim, LiveExporter, scenario
from tests.helpers.engine import make_cfg as engine_cfg
from tests.helpers.engine import outbox
from tests.helpers.local_services import running_prometheus, running_sshd, scrape_config

pytestmark = [pytest.mark.sshd, pytest.mark.prometheus]

# job id -> (node prefix, simulated scenario or None: its Prometheus port answers nothing); 6104's
# head node refuses ssh (its tunnel cannot be opened).
JOBS = {"6101": ("node", "rdma-degraded"), "6102": ("u", "healthy"), "6103": ("d", None), "6104": ("e", None)}
NO_SSH = "e"


def _sim(prefix: str, name: str) -> JobSim:
    nodes = tuple(L.hostnames(4, prefix=prefix))
    # rdma-degraded: node003's first NIC retransmits 50 packets/s; every other series is alike.
    return JobSim(scenario(name, nodes=nodes, bad_host=nodes[2], init_s=0.0, step_time=1.0, steps=600))


@pytest.fixture
def live(tmp_path: Path) -> Iterator[dict[str, Any]]:
    svc = tmp_path / "svc"
    exporters: list[LiveExporter] = []
    ports = []
    for prefix, name in JOBS.values():
        if name is None:
            continue
        sim = _sim(prefix, name)
        # Sim time: a minute into training (600 one-second steps: it trains all test long).
        exporter = LiveExporter(sim, clock=time.time, offset=time.time() - (sim.sc.start + 60.0))
        ports.append(exporter.start())
        exporters.append(exporter)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(scrape_config("node_hw", ports))
    closed = free_loopback_port()  # nothing listens: ssh to it is refused
    try:
        # One Prometheus plays both answering jobs' own (each query names only its job's hosts).
        with running_sshd(svc) as ssh, running_prometheus(svc, "slow-own", cfg, tmp_path / "tsdb") as pport:
            ssh_config = tmp_path / "ssh_config"
            ssh_config.write_text(
                "".join(
                    ssh.stanza(f"{prefix}001", closed if prefix == NO_SSH else None) for prefix, _ in JOBS.values()
                )
            )
            yield {"pport": pport, "ssh_config": ssh_config}
    finally:
        for e in exporters:
            e.stop()


def write_slid_log(outputs: Path, job_id: str, prefix: str, pport: int) -> None:
    """A live RAY=1 job (head <prefix>001, its Prometheus on `pport`) whose throughput fell 20 %
    after step 20: the TGS detector opens a degradation on the first tick that reads it."""
    name = f"JAX-llama2-70b-{job_id}"
    stem = f"{job_id}-{name}"
    lines = [
        *L.header_lines(
            job_id=job_id,
            name=name,
            nnodes=4,
            nodelist=f"{prefix}[001-004]",
            jax_port=12321,
            ray_port=6379,
            passthrough={"steps": 300},
            model="llama2-70b",
        ),
        f"[Ray] Starting HEAD on {prefix}001:6379 (bind=10.0.0.1)",
        f"[Prometheus] Started on port {pport} (ray: '{prefix}001:55080', node_hw: '{prefix}001:9400')",
    ]
    t0 = time.time() - 45 * 0.3
    for k in range(45):
        f = L.StepFields(
            step=k, seconds=0.3, tflops=1.0, tokens=3000.0 if k < 20 else 2400.0, total_weights=1, loss=2.5
        )
        lines.append(
            "0: " + L.absl_prefix(t0 + 0.3 * k, int(job_id), "metric_logger.py:232") + L.step_line(f)
        )
    (outputs / f"{stem}.log").write_text("\n".join(lines) + "\n")
    (outputs / stem).mkdir()
    (outputs / stem / "log").symlink_to(f"../{stem}.log")


def make_cfg(state: Path, ssh_config: Path) -> Config:
    """The engine helper's daemon config, with the job's own Prometheus reached over ssh."""
    return engine_cfg(
        state,
        f"""
[tsdb]
work_dir = "{state}"
early_scrape_interval_s = 2.0
[tsdb.ssh]
config_paths = ["{ssh_config}"]
max_attempts = 1
""",
    )


class Recorder:
    """The recovery stage's place in the path: it sees each finding as the slow-host stage left
    it (what the real recovery stage reads for the suspect-node memory)."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []

    def plan(self, batch: Batch, ctx: StageContext) -> Batch:
        self.findings += [f for f in batch.findings if f.kind == TGS and not f.resolved]
        return batch


async def _wait_for_data(url: str) -> None:
    """Until the job exporters have been scraped for the slide's window (4 intervals of 2 s)."""
    async with PromClient(url) as c:
        for _ in range(300):
            res = await c.query_vector("count_over_time(hw_rdma_tx_retx_pkts_total[1m])", None)
            if res and min(s.v for s in res) >= 12:
                return
            await asyncio.sleep(0.1)
    raise AssertionError("Prometheus never scraped the job exporters")


async def test_a_ray_job_s_slide_is_compared_on_its_own_prometheus(
    live: dict[str, Any], tmp_path: Path
) -> None:
    state, outputs = tmp_path / "state", tmp_path / "outputs"
    outputs.mkdir()
    down = free_loopback_port()  # 6103's (and 6104's) Prometheus: nothing listens on that port
    for job_id, (prefix, name) in JOBS.items():
        write_slid_log(outputs, job_id, prefix, live["pport"] if name is not None else down)
    cfg = make_cfg(state, live["ssh_config"])
    pipeline = AlertPipeline.open(state, cfg.incidents, ["jsonl"])
    enricher = TsdbEnricher(cfg.tsdb, tick_s=15, recent_steps=cfg.detectors.tgs.recent_steps)
    assert enricher.site is None  # no [site_prometheus]: the job's own is the only source
    recorder = Recorder()
    engine = Engine(
        cfg,
        pipeline,
        build(cfg),
        OutputsDiscovery([outputs], set()),
        enricher=enricher,
        plot_inputs=plot_inputs(cfg),
        recovery=recorder,
    )
    hold = enricher.slow
    try:
        local = await enricher.tunnels.forward("node001", live["pport"])
        await _wait_for_data(f"http://127.0.0.1:{local}")
        await engine.tick(time.time())  # reads the slides: each TGS page is held for its comparison
        assert set(engine.jobs) == set(JOBS)
        assert [n for n in outbox(state) if n["event"] == "open"] == []
        assert hold.status() == {"held_tgs": 4, "comparisons": 4}
        await hold.settled()  # the comparisons are done well within the tick (15 s)
        await engine.tick(time.time())  # the next tick: every page goes out, carrying its comparison
        pages = {n["job_id"]: n for n in outbox(state) if n["event"] == "open" and n["kind"] == TGS}
        assert set(pages) == set(JOBS) and hold.status()["held_tgs"] == 0
        findings = {f.job_id: f for f in recorder.findings}

        # 6101: node003's NIC retransmits stand out among its peers.
        one = findings["6101"]
        assert one.details["slow host"].startswith("node003 (RDMA retransmits"), one.details
        assert one.details["slow host"].endswith("(compared on the job's own Prometheus)")
        assert one.details["suspect host"] == "node003"
        assert "node003 (RDMA retransmits" in pages["6101"]["body"]
        strip = pages["6101"]["plot"]["strip"]
        assert strip["type"] == "host_strip/1" and strip["spec"]["named"] == ["node003"]
        assert [p["label"] for p in strip["spec"]["panels"]] == ["GPU power", "RDMA retransmits"]
        (evidence,) = suspects_from(finding=one)
        assert evidence.node == "node003" and evidence.kind == Evidence.SLOW_HOST

        # 6102: every host slid alike: nobody is named.
        uniform = findings["6102"]
        assert "no host stands out among 4" in uniform.details["slow host"], uniform.details
        assert "the slide is the job's" in uniform.details["slow host"]
        assert "suspect host" not in uniform.details and suspects_from(finding=uniform) == []
        assert pages["6102"]["plot"]["strip"]["spec"]["named"] == []

        # 6103: its Prometheus does not answer: not compared, and the page was not delayed.
        down_fact = findings["6103"].details["slow host"]
        assert down_fact.startswith(
            "no host compared: the job's own Prometheus: http://127.0.0.1:"
        ), down_fact
        assert "via ssh d001" in down_fact and "query" not in down_fact and len(down_fact) < 200
        assert "suspect host" not in findings["6103"].details
        assert "strip" not in (pages["6103"].get("plot") or {})
        # 6104: its head node's ssh is down: not compared either, and on time too.
        no_ssh = findings["6104"].details["slow host"]
        assert no_ssh.startswith("no host compared: the job's own Prometheus: ssh to e001 failed"), no_ssh
        assert "suspect host" not in findings["6104"].details
        assert enricher.tunnels.connects == 4  # one ssh connection (or attempt) per head node
    finally:
        await enricher.close()
        pipeline.close()
