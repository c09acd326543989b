"""The shared-node rule (tsdb/site/placement.py) and the site queries read back (tsdb/site/query.py)."""

from __future__ import annotations

import re

from jobdiagd.sources.slurm_gres import JobGpus, NodeGpus
from jobdiagd.tsdb.client import Series
from jobdiagd.tsdb.site.hosts import HostRewrite
from jobdiagd.tsdb.site.placement import JobPlacement, SiteSeries, select
from jobdiagd.tsdb.site.profiles import builtin, resolve
from jobdiagd.tsdb.site.query import check_expr, decode, early_expr, slide_expr

PTS = ((1.0, 300.0), (2.0, 300.0))


def gpus(node: str, n: int, *, job: str = "", first: int = 0, role: str = "power") -> list[SiteSeries]:
    return [SiteSeries(role, node, str(g), PTS, job) for g in range(first, first + n)]


def test_the_exporters_job_label_keeps_only_the_jobs_gpus() -> None:
    series = gpus("n1", 4, job="11") + gpus("n1", 4, job="22", first=4) + gpus("n2", 8, job="11")
    mine, refused = select(series, JobPlacement("11", ("n1", "n2")), job_label=True)
    assert refused == {}
    assert sorted((s.node, s.gpu) for s in mine if s.node == "n1") == [("n1", str(g)) for g in range(4)]
    assert len([s for s in mine if s.node == "n2"]) == 8


def test_a_gpu_mapped_to_two_jobs_or_no_gpu_mapped_to_this_one_refuses_the_node() -> None:
    series = gpus("n1", 2, job="11") + gpus("n1", 1, job="22")  # GPU 0 carries both jobs
    _, refused = select(series, JobPlacement("11", ("n1",)), job_label=True)
    assert "shared GPUs" in refused["n1"]
    _, refused = select(gpus("n1", 8, job="22"), JobPlacement("11", ("n1",)), job_label=True)
    assert "none to job 11" in refused["n1"]


def test_without_job_labels_slurm_indices_pick_the_gpus() -> None:
    place = JobPlacement("11", ("n1",), {"n1": NodeGpus(4, frozenset({4, 5, 6, 7}))})
    mine, refused = select(gpus("n1", 8), place, job_label=True)  # labels configured, none carried
    assert refused == {}
    assert sorted(int(s.gpu) for s in mine) == [4, 5, 6, 7]


def test_shards_or_an_unknown_share_refuse_and_whole_nodes_keep_everything() -> None:
    shard = JobPlacement("11", ("n1",), {"n1": NodeGpus(1, frozenset({0}), shared=True)})
    assert "shards" in select(gpus("n1", 8), shard, job_label=False)[1]["n1"]
    unknown = JobPlacement("11", ("n1",))
    assert "may be shared" in select(gpus("n1", 8), unknown, job_label=False)[1]["n1"]
    counted = JobPlacement("11", ("n1",), {"n1": NodeGpus(8, None)})
    assert len(select(gpus("n1", 8), counted, job_label=False)[0]) == 8
    half = JobPlacement("11", ("n1",), {"n1": NodeGpus(4, None)})
    assert "n1" in select(gpus("n1", 8), half, job_label=False)[1]
    whole = JobPlacement("11", ("n1",), exclusive=True)
    mine, refused = select([*gpus("n1", 8), SiteSeries("io_pressure", "n1", "", PTS)], whole, job_label=False)
    assert refused == {} and len(mine) == 9


def test_placement_from_squeue_and_scontrol() -> None:
    p = JobPlacement.from_slurm(
        "5", "node[001-002],bad$name", JobGpus({"node001": NodeGpus(8)}, exclusive=True)
    )
    assert p.nodes == ("node001", "node002") and p.exclusive and p.gpus["node001"].count == 8
    assert JobPlacement.from_slurm("5", "node001", None, exclusive_nodes=True).exclusive


def test_early_expr_asks_every_mapped_role_for_these_nodes_only() -> None:
    expr = early_expr(builtin("dcgm"), HostRewrite("short"), ["node001", "node002"], 15.0)
    for name in ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"):
        assert f'__name__="{name}"' in expr
    assert "timestamp({" in expr  # gauges carry their samples' own times
    assert 'rate({__name__="node_pressure_io_stalled_seconds_total",instance=~' in expr
    assert "[45s]" in expr  # three scrape intervals
    assert "(?:node001|node002)" in expr
    assert "DCGM_FI_DEV_MEM_COPY_UTIL" not in expr  # not read by the early judge
    assert "Hostname=~" in expr and "hostname=~" in expr  # both spellings until the check settles one
    assert expr.count('"__ts"') == 2 * 3


def test_slide_and_check_queries() -> None:
    m = builtin("amd")
    expr = slide_expr(m, HostRewrite("exact"), ["n1"], 15.0, 30)
    assert 'avg_over_time({__name__="gpu_gfx_activity"' in expr
    # One arm per RDMA counter (rate() drops the name; two names in one selector would collide).
    assert (
        'sum by (instance) (rate({__name__="node_infiniband_local_ack_timeout_errors_total",instance=~'
        in expr
    )
    assert '"__part", "2"' in expr
    assert "node_netstat_Tcp_RetransSegs" in expr and "memory_waiting" in expr
    spec = m.get("power")
    assert spec is not None
    assert (
        check_expr(spec)
        == 'max by (__name__, hostname, gpu_id, job_id, card_series) ({__name__="gpu_power_usage"})'
    )


def _arm(role: str, labels: dict[str, str], pts: list[tuple[float, float]], ts: bool = False) -> Series:
    extra = {"__ts": "1"} if ts else {"__name__": "DCGM_FI_DEV_POWER_USAGE"}
    return Series({"__role": role, **labels, **extra}, tuple(pts))


def test_decode_reads_back_raw_samples_and_drops_other_hosts() -> None:
    m = builtin("dcgm")
    labels = {
        "Hostname": "node001.cluster",
        "gpu": "3",
        "UUID": "GPU-x",
        "modelName": "NVIDIA H100 80GB HBM3",
    }
    # Steps every 7.5 s; the sample of t=100 is seen by two steps, the one of t=115 by one.
    values = [(100.5, 310.0), (108.0, 310.0), (115.5, 320.0)]
    stamps = [(100.5, 100.0), (108.0, 100.0), (115.5, 115.0)]
    other = {**labels, "Hostname": "node999"}
    answer = [
        _arm("power", labels, values),
        _arm("power", labels, stamps, ts=True),
        _arm("power", other, values),
        _arm("power", other, stamps, ts=True),
        Series({"__role": "io_pressure", "instance": "node001:9100"}, ((115.5, 12.5),)),
    ]
    d = decode(answer, m, HostRewrite("short"), ["node001"])
    assert d.foreign == 1
    power = [s for s in d.series if s.role == "power"]
    assert len(power) == 1
    assert power[0].points == ((100.0, 310.0), (115.0, 320.0))
    assert (power[0].node, power[0].gpu, power[0].model) == ("node001", "3", "NVIDIA H100 80GB HBM3")
    io = [s for s in d.series if s.role == "io_pressure"]
    assert io[0].node == "node001" and io[0].gpu == "" and io[0].points == ((115.5, 12.5),)


def test_decode_sums_the_parts_of_a_multi_name_counter() -> None:
    m = builtin("dcgm")
    base = {"__role": "rdma_retrans", "instance": "node001:9100"}
    answer = [
        Series({**base, "__part": "0"}, ((10.0, 1.5), (12.0, 2.0))),
        Series({**base, "__part": "1"}, ((10.0, 0.5), (14.0, 4.0))),
    ]
    d = decode(answer, m, HostRewrite("short"), ["node001"])
    assert [s.points for s in d.series] == [((10.0, 2.0), (12.0, 2.0), (14.0, 4.0))]


def test_a_job_label_override_reaches_the_queries() -> None:
    m = resolve("amd", {"power": {"job_label": "slurm_job"}})
    spec = m.get("power")
    assert spec is not None
    assert "slurm_job" in check_expr(spec)
    assert re.search(r"max by \(__name__, hostname, gpu_id, slurm_job", check_expr(spec))
