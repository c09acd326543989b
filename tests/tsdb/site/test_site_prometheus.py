"""The site source against a real Prometheus scraping simulated DCGM, AMD and node exporters.

One Prometheus (scripts/services/prometheus.sh) scrapes, every second, the exporters of every
scenario's nodes at once (tests/helpers/site_exporters.py); each test asks about its own nodes.
The source is told the scrape interval is 2 s (stale after 4 s), so a loaded machine's late
scrape does not turn a verdict into no-data.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import ClientSession, web

from jobdiagd.sources.slurm_gres import NodeGpus
from jobdiagd.tsdb.access import SshTunnelPool, free_loopback_port
from jobdiagd.tsdb.settings import SshSettings, TsdbSettings
from jobdiagd.tsdb.site import HostRewrite, JobPlacement, SiteConfig, SitePrometheus, resolve
from tests.helpers.local_services import running_prometheus, running_sshd, wait_scraped
from tests.helpers.site_exporters import ExporterServer, SimNode, SiteCluster

pytestmark = pytest.mark.prometheus

INTERVAL = 2.0
BW, CK, DEAD = ["busywait"] * 8, ["ckpt"] * 8, ["dead"] * 8


def build_cluster() -> SiteCluster:
    c = SiteCluster()
    # A collective hang on every GPU (one exporter with the renamed `hostname` label).
    for i in range(1, 5):
        c.add(
            SimNode(
                f"a00{i}",
                "dcgm",
                phase=BW,
                jobs=["101"] * 8,
                hostname_label="hostname" if i == 4 else "Hostname",
            )
        )
    # A checkpoint save: GPUs waiting, the hosts' I/O fully stalled 30 % of the time.
    for i in range(1, 5):
        c.add(SimNode(f"b00{i}", "dcgm", phase=CK, io_stall=0.3))
    # c004's process died (framebuffer freed); the others spin on it.
    for i in range(1, 4):
        c.add(SimNode(f"c00{i}", "dcgm", phase=BW))
    c.add(SimNode("c004", "dcgm", phase=DEAD))
    # d002 is shared: GPUs 0-3 job 201 (its process there died), 4-7 job 202 (hung, spinning).
    c.add(SimNode("d001", "dcgm", phase=BW, jobs=["201"] * 8))
    c.add(SimNode("d002", "dcgm", phase=["dead"] * 4 + ["busywait"] * 4, jobs=["201"] * 4 + ["202"] * 4))
    c.add(SimNode("d003", "dcgm", phase=BW, jobs=["202"] * 8))
    # AMD: a hang on MI300X with the Slurm integration's job_id; and a compiling (idle, alive) job.
    for i in range(1, 4):
        c.add(SimNode(f"m00{i}", "amd", phase=BW, jobs=["301"] * 8))
        c.add(SimNode(f"k00{i}", "amd", phase=["compile"] * 8, jobs=["302"] * 8))
    # TGS slides: r003's NIC retransmits; u00*: every host slows the same.
    for i in range(1, 6):
        c.add(SimNode(f"r00{i}", "dcgm", power_delta=-60.0, rdma_ack_timeout=25.0 if i == 3 else 0.02))
        c.add(SimNode(f"u00{i}", "dcgm", power_delta=-90.0, tcp_retrans=3.0))
    return c


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    tmp = tmp_path_factory.mktemp("site-prom")
    cluster = build_cluster()
    with ExporterServer(cluster) as server:
        cfg = tmp / "prometheus.yml"
        cfg.write_text(server.prometheus_config("1s"))
        with running_prometheus(tmp / "svc", "site", cfg, tmp / "data") as port:
            wait_scraped(port, 2 * len(cluster.nodes))
            yield {"url": f"http://127.0.0.1:{port}", "cluster": cluster, "port": port}


def source(
    url: str,
    profile: str = "dcgm",
    *,
    max_in_flight: int = 4,
    timeout_s: float = 2.0,
    **overrides: dict[str, object],
) -> SitePrometheus:
    cfg = SiteConfig(
        url=url,
        metrics=resolve(profile, overrides),
        rewrite=HostRewrite("short"),
        scrape_interval_s=INTERVAL,
        max_in_flight=max_in_flight,
        timeout_s=timeout_s,
    )
    return SitePrometheus(cfg, TsdbSettings())


def whole(job: str, *nodes: str) -> JobPlacement:
    return JobPlacement(job, nodes, exclusive=True)


@pytest.fixture
async def dcgm(site: dict[str, object]) -> AsyncIterator[SitePrometheus]:
    src = source(str(site["url"]))
    check = await src.check_map()
    assert check.ok, check.errors
    yield src
    await src.close()


async def test_the_map_check_reports_a_wrong_name_by_name(site: dict[str, object]) -> None:
    url = str(site["url"])
    bad = source(url, power={"name": "DCGM_FI_DEV_POWER_USGE"})
    check = await bad.check_map()
    await bad.close()
    assert len(check.errors) == 1
    assert "power" in check.errors[0] and "'DCGM_FI_DEV_POWER_USGE'" in check.errors[0]
    assert "did you mean 'DCGM_FI_DEV_POWER_USAGE'?" in check.errors[0]
    assert bad.queries == len(bad.cfg.metrics.roles()) + 1  # one per metric, one for the hint

    good = source(url)
    check = await good.check_map()
    await good.close()
    assert check.ok, check.errors
    power = check.metrics.get("power")
    assert power is not None and power.host_labels == ("Hostname", "hostname")  # both spellings in use
    assert any("node_infiniband_roce_adp_retransmits_total" in w for w in check.warnings)
    rdma = check.metrics.get("rdma_retrans")
    assert rdma is not None and "node_infiniband_roce_adp_retransmits_total" not in rdma.names

    generic = source(url, "generic")
    check = await generic.check_map()
    await generic.close()
    assert any("'hw_gpu_power_watts'" in e for e in check.errors)
    assert any("'ray_node_gpus_utilization'" in e for e in check.errors)


async def test_a_non_ray_hang_is_confirmed_from_the_site_exporters(dcgm: SitePrometheus) -> None:
    v = await dcgm.early_verdict(whole("101", "a001", "a002", "a003", "a004"))
    assert v.state == "busy-wait" and v.confirmed, v.summary
    assert "H100" in v.summary  # the bands of the exporter's modelName


async def test_a_checkpoint_pause_is_not_confirmed(dcgm: SitePrometheus) -> None:
    v = await dcgm.early_verdict(whole("102", "b001", "b002", "b003", "b004"))
    assert v.state == "not-a-hang" and not v.confirmed
    assert "I/O pressure" in v.summary


async def test_a_dead_node_under_busy_waiting_peers_is_named(dcgm: SitePrometheus) -> None:
    v = await dcgm.early_verdict(whole("103", "c001", "c002", "c003", "c004"))
    assert v.state == "dead-node", v.summary
    assert v.suspects == ("c004",)


async def test_a_shared_node_confirms_only_from_the_jobs_own_gpus(
    site: dict[str, object], dcgm: SitePrometheus
) -> None:
    # The exporter's hpc_job tells the jobs apart: 201 lost its rank on d002, 202 spins.
    j201 = JobPlacement("201", ("d001", "d002"))
    j202 = JobPlacement("202", ("d002", "d003"))
    v201 = await dcgm.early_verdict(j201)
    assert v201.state == "dead-node" and v201.suspects == ("d002",), v201.summary
    assert (await dcgm.early_verdict(j202)).state == "busy-wait"
    # Without the job label (exporter run without HPC job mapping): Slurm's indices, else refuse.
    nolabel = source(str(site["url"]), power={"job_label": ""})
    by_index = JobPlacement(
        "201", ("d001", "d002"), {"d002": NodeGpus(4, frozenset(range(4))), "d001": NodeGpus(8, None)}
    )
    assert (await nolabel.early_verdict(by_index)).state == "dead-node"
    refused = await nolabel.early_verdict(j201)  # d002 has 8 GPUs, nothing says which are 201's
    assert refused.state == "no-data" and not refused.confirmed
    assert "d002" in refused.summary and "shared" in refused.summary
    neighbour = await nolabel.early_verdict(JobPlacement("202", ("d002", "d003")))
    assert not neighbour.confirmed  # d002's spinning GPUs 4-7 alone never confirm for anyone
    await nolabel.close()


async def test_amd_exporter_hang_and_a_compiling_job(site: dict[str, object]) -> None:
    src = source(str(site["url"]), "amd")
    check = await src.check_map()
    assert check.ok, check.errors
    hang = await src.early_verdict(JobPlacement("301", ("m001", "m002", "m003")))  # job_id labels
    assert hang.state == "busy-wait" and "MI300X" in hang.summary, hang.summary
    compiling = await src.early_verdict(JobPlacement("302", ("k001", "k002", "k003")))
    assert compiling.state == "not-a-hang" and not compiling.confirmed
    await src.close()


async def test_jobs_on_the_same_nodes_share_one_query_per_interval(dcgm: SitePrometheus) -> None:
    before = dcgm.queries
    nodes = ("c001", "c002", "c003", "c004")  # no job labels there: whole nodes of each job
    now = time.time()
    verdicts = await asyncio.gather(*(dcgm.early_verdict(whole(str(j), *nodes), now) for j in range(5)))
    assert all(v.state == "dead-node" for v in verdicts), [v.summary for v in verdicts]
    assert dcgm.queries == before + 1
    await dcgm.early_verdict(whole("9", *nodes), now + INTERVAL)  # the next interval asks again
    assert dcgm.queries == before + 2


async def test_at_most_k_queries_in_flight(site: dict[str, object]) -> None:
    """A counting proxy in front of the real Prometheus holds each query 0.3 s."""
    state = {"now": 0, "peak": 0}
    upstream = str(site["url"])

    async def handle(request: web.Request) -> web.Response:
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        try:
            await asyncio.sleep(0.3)
            async with ClientSession() as s, s.get(upstream + request.path_qs) as r:
                return web.Response(body=await r.read(), status=r.status, content_type="application/json")
        finally:
            state["now"] -= 1

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_loopback_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        src = source(f"http://127.0.0.1:{port}", max_in_flight=2)
        jobs = [whole("101" if n < "b" else "7", n) for n in ["a001", "a002", "a003", "a004", "b001", "b002"]]
        verdicts = await asyncio.gather(*(src.early_verdict(j) for j in jobs))
        await src.close()
    finally:
        await runner.cleanup()
    assert state["peak"] == 2
    assert src.queries == 6
    assert [v.state for v in verdicts[:4]] == ["busy-wait"] * 4


async def test_a_down_site_prometheus_is_one_notice_and_unknown_verdicts(site: dict[str, object]) -> None:
    src = source(f"http://127.0.0.1:{free_loopback_port()}")  # nothing listens there
    now = time.time() - 2 * INTERVAL  # two intervals down, then back now
    same = [whole(str(j), "a001", "a002") for j in range(3)]
    other = [whole("7", "b001"), whole("8", "c001")]
    verdicts = await asyncio.gather(*(src.early_verdict(p, now) for p in [*same, *other]))
    assert all(v.state == "no-data" and not v.confirmed for v in verdicts)
    assert all("site Prometheus" in v.summary and "step budget" in v.summary for v in verdicts)
    assert src.queries == 3  # one per node set, not one per job
    notices = src.take_notices()
    assert [n.kind for n in notices] == ["degraded"]
    await src.early_verdict(same[0], now + INTERVAL)  # still down, next interval
    assert src.take_notices() == [] and src.degraded
    src.cfg = replace(src.cfg, url=str(site["url"]))  # it comes back
    back = await src.early_verdict(whole("101", "a001", "a002", "a003", "a004"))
    assert [n.kind for n in src.take_notices()] == ["recovered"] and not src.degraded
    assert back.state == "busy-wait"
    await src.close()


async def test_a_site_prometheus_that_never_answers_times_out_as_unknown() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        src = source(f"http://127.0.0.1:{port}", timeout_s=0.5)
        v = await src.early_verdict(whole("1", "a001"))
        await src.close()
    finally:
        for w in accepted:
            w.close()
        server.close()
        await server.wait_closed()
    assert v.state == "no-data" and "timed out after 0.5s" in v.summary
    assert [n.kind for n in src.take_notices()] == ["degraded"]


async def test_one_hosts_rdma_slide_is_named_and_a_uniform_slide_names_none(dcgm: SitePrometheus) -> None:
    end = time.time()
    nodes = tuple(f"r00{i}" for i in range(1, 6))
    slide = await dcgm.slide(whole("401", *nodes), end - 12, end)
    assert slide.ok, slide.error
    assert {hs.host for hs in slide.series["power"]} == set(nodes)  # the strip picture's rows
    assert all(hs.gpus == 8 for hs in slide.series["power"])
    v = dcgm.slow_hosts(slide)
    assert v.hosts == ("r003",), v.summary
    assert "RDMA retransmits" in v.evidence["r003"][0]

    uniform = await dcgm.slide(whole("402", *(f"u00{i}" for i in range(1, 6))), end - 12, end)
    u = dcgm.slow_hosts(uniform)
    assert uniform.ok and u.hosts == (), u.summary
    assert "not one host" in u.summary and "GPU power" in u.summary


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Path]:
    """A real sshd on 127.0.0.1 and an ssh_config naming it `login1` (the site's gateway)."""
    with running_sshd(tmp_path / "svc") as ssh:
        config = tmp_path / "ssh_config"
        config.write_text(ssh.stanza("login1"))
        yield config


@pytest.mark.sshd
async def test_through_an_ssh_gateway_with_one_connection(site: dict[str, object], sshd: Path) -> None:
    """The URL names the Prometheus as the gateway sees it (`localhost`, not the forward's default)."""
    tunnels = SshTunnelPool(SshSettings(config_paths=(str(sshd),)))
    cfg = SiteConfig(
        url=f"http://localhost:{site['port']}",
        metrics=resolve("dcgm", {}),
        scrape_interval_s=INTERVAL,
        ssh_host="login1",
    )
    src = SitePrometheus(cfg, TsdbSettings(), tunnels=tunnels)
    try:
        assert (await src.check_map()).ok
        v = await src.early_verdict(whole("101", "a001", "a002", "a003", "a004"))
        assert v.state == "busy-wait", v.summary
        assert tunnels.connects == 1
        assert src.label.endswith("via ssh login1")
    finally:
        await src.close()
        await tunnels.close()
