"""A RAY=1 job's own Prometheus as a slide source (tsdb/site/own.py, rule SLOW-6), without a server:
the settings it is asked with (head node and port validated first), its placement, and the
`generic` map against the metric names the job's exporters really have (the simulator's)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from jobdiagd.tsdb.access import AccessError, SshTunnelPool
from jobdiagd.tsdb.client import Series
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.settings import TsdbSettings
from jobdiagd.tsdb.site import HostRewrite, builtin
from jobdiagd.tsdb.site.own import OWN_NAME, own_config, own_placement, own_slow_hosts
from jobdiagd.tsdb.site.query import ROLE, SLIDE_ROLES, decode, slide_expr
from jobdiagd.tsdb.site.slide import host_series
from jobdiagd.tsdb.slow_host import judge_slow_hosts
from jobdiagd_sim.metrics import JobSim, scenario

NODES = ("node001", "node002", "node003", "node004")
CTX = DiagnosisContext(
    job_dir=None, nodes=NODES, job_id="4242", status="running", head_node="node001", port=9090
)


def test_the_job_s_own_prometheus_is_asked_on_its_head_node_through_ssh() -> None:
    cfg = own_config(CTX, TsdbSettings(early_scrape_interval_s=5.0), timeout_s=3.0)
    assert cfg.ssh_host == "node001" and cfg.url == "http://127.0.0.1:9090"
    assert cfg.metrics.profile == "generic" and cfg.name == OWN_NAME
    assert cfg.scrape_interval_s == 5.0 and cfg.timeout_s == 3.0 and cfg.max_in_flight == 1
    # The log may write the head short while the node list is qualified: the list's spelling is used.
    fqdn = replace(CTX, nodes=("node001.cluster", "node002.cluster"), head_node="node001")
    assert own_config(fqdn, TsdbSettings(), timeout_s=1.0).ssh_host == "node001.cluster"
    # A domain the node list does not have is never used: the list's own spelling is.
    evil = replace(CTX, head_node="node001.evil.example")
    assert own_config(evil, TsdbSettings(), timeout_s=1.0).ssh_host == "node001"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"status": "completed"}, "not a live job"),
        ({"head_node": None}, "no head node"),
        ({"port": None}, "no head node or Prometheus port"),
        ({"head_node": "node001;reboot"}, "invalid host name"),
        ({"head_node": "node009"}, "not in the job's node list"),
        ({"port": 70000}, "invalid port"),
    ],
)
def test_nothing_is_forwarded_without_a_valid_head_node_and_port(change: dict[str, object], why: str) -> None:
    with pytest.raises(AccessError, match=why):
        own_config(replace(CTX, **change), TsdbSettings(), timeout_s=1.0)  # type: ignore[arg-type]


async def test_a_job_that_cannot_be_asked_is_not_compared_and_says_why() -> None:
    settings = TsdbSettings()
    pool = SshTunnelPool(settings.ssh)
    bad = replace(CTX, head_node="$(reboot)")
    result = await own_slow_hosts(bad, settings, pool, start=0.0, end=60.0, timeout_s=1.0)
    assert result.slide is None and result.verdict.hosts == ()
    assert result.verdict.summary.startswith("no host compared: the job's own Prometheus: invalid host name")
    assert pool.connects == 0  # validated before any connection
    await pool.close()


def test_its_placement_holds_the_valid_nodes_whole() -> None:
    p = own_placement(replace(CTX, nodes=("node001", "a;b", "node002", "node001")))
    assert p.nodes == ("node001", "node002") and p.exclusive and p.job_id == "4242"


def _sim_catalog() -> dict[str, set[str]]:
    """Metric name -> label names, as the job's node_hw and Ray exporters serve them."""
    sim = JobSim(scenario("healthy", steps=5))
    out: dict[str, set[str]] = {}
    for name, lab, _host, _fn in [*sim.hw_series(), *sim.ray_series()]:
        out.setdefault(name, set()).update(kv.split("=", 1)[0] for kv in lab.split(","))
    return out


def test_the_generic_map_names_what_the_job_s_exporters_serve() -> None:
    """Every slide role the map names exists in the job's catalog with the host (and GPU) label
    the map reads; the roles the job has no metric for are the ones the map leaves out."""
    catalog = _sim_catalog()
    metrics = builtin("generic")
    compared = []
    for role in SLIDE_ROLES:
        spec = metrics.get(role)
        if spec is None:
            continue
        compared.append(role)
        for name in spec.names:
            assert name in catalog, (role, name)
            assert spec.host_label in catalog[name], (role, name)
            if spec.gpu_label:
                assert spec.gpu_label in catalog[name], (role, name)
    assert compared == ["power", "util", "tcp_retrans", "rdma_retrans"]
    assert not any("pressure_memory" in n or "mem_copy" in n for n in catalog)  # nothing to map there


def test_the_slide_query_reads_the_job_s_names_and_its_answer_names_the_slow_host() -> None:
    metrics = builtin("generic")
    expr = slide_expr(metrics, HostRewrite("short"), NODES, 10.0, 10)
    assert 'host=~"(?:node001|node002|node003|node004)' in expr
    assert 'rate({__name__="hw_rdma_tx_retx_pkts_total"' in expr
    assert 'rate({__name__="hw_tcp_retransmits_total"' in expr
    assert 'avg_over_time({__name__="ray_node_gpus_utilization"' in expr
    # An answer as Prometheus gives it: per-GPU power and utilization, per-host rates; node003's
    # NIC retransmits (summed over its devices by the query) stand out.
    times = [float(t) for t in range(0, 300, 10)]
    answer = []
    for h in NODES:
        for g in range(2):
            for role, name, gl, v in (
                ("power", "hw_gpu_power_watts", "gpu", 600.0),
                ("util", "", "GpuIndex", 99.0),
            ):
                labels = {ROLE: role, "host": h, gl: str(g)} | ({"__name__": name} if name else {})
                answer.append(Series(labels, tuple((t, v + g) for t in times)))
        rdma = 40.0 if h == "node003" else 0.05
        answer.append(Series({ROLE: "rdma_retrans", "host": h}, tuple((t, rdma) for t in times)))
        answer.append(Series({ROLE: "tcp_retrans", "host": h}, tuple((t, math.nan) for t in times)))
    d = decode(answer, metrics, HostRewrite("short"), NODES)
    assert d.foreign == 0
    series = host_series(d.series, NODES)
    assert [hs.host for hs in series["power"]] == list(NODES) and series["power"][0].gpus == 2
    assert "tcp_retrans" not in series or all(not hs.times for hs in series["tcp_retrans"])
    v = judge_slow_hosts(series, start=times[0], end=times[-1])
    assert v.hosts == ("node003",) and "RDMA retransmits" in v.evidence["node003"][0]
