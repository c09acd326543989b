"""The site metric map (tsdb/site/profiles.py) and the node <-> host label rewrite (tsdb/site/hosts.py)."""

from __future__ import annotations

import re

import pytest

from jobdiagd.tsdb.site.hosts import HostRewrite, promql_string
from jobdiagd.tsdb.site.profiles import builtin, check_override, resolve


def test_builtin_profiles_name_the_exporters_metrics_and_labels() -> None:
    dcgm = builtin("dcgm")
    power = dcgm.get("power")
    assert power is not None
    assert power.names == ("DCGM_FI_DEV_POWER_USAGE",)
    assert power.host_labels == ("Hostname", "hostname")  # renamed in dcgm-exporter #655
    assert (power.gpu_label, power.job_label, power.model_label) == ("gpu", "hpc_job", "modelName")
    vram = dcgm.get("vram_used")
    assert vram is not None and vram.scale == 2**20  # MiB -> bytes
    assert dcgm.get("processes") is None  # DCGM has no process count
    amd = builtin("amd")
    assert [amd.get(r).names[0] for r in ("power", "util", "mem_activity")] == [
        "gpu_power_usage",
        "gpu_gfx_activity",
        "gpu_umc_activity",
    ]
    assert amd.get("power").gpu_label == "gpu_id"
    io = amd.get("io_pressure")
    assert io is not None and io.counter and io.scale == 100 and io.host_labels == ("instance",)
    generic = builtin("generic")
    assert generic.get("processes").names == ("hw_gpu_user_processes",)
    with pytest.raises(ValueError, match="unknown profile"):
        builtin("nvidia")


def test_overrides_change_one_field_and_can_unmap_an_optional_role() -> None:
    m = resolve(
        "dcgm",
        {
            "util": {"name": "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "scale": 100},
            "power": {"host_label": "hostname"},
            "mem_activity": {"name": ""},
            "rdma_retrans": {"name": ["a_total", "b_total"]},
        },
    )
    util = m.get("util")
    assert util is not None and util.names == ("DCGM_FI_PROF_GR_ENGINE_ACTIVE",) and util.scale == 100
    assert util.gpu_label == "gpu"  # the rest of the profile's spec is kept
    assert m.get("power").host_labels == ("hostname",)
    assert m.get("mem_activity") is None
    assert m.get("rdma_retrans").names == ("a_total", "b_total")
    assert "mem_activity" not in m.roles()


@pytest.mark.parametrize(
    ("role", "table", "message"),
    [
        ("power", {"nmae": "x"}, r"\[site_prometheus.metrics.power\] nmae: unknown key"),
        ("powr", {"name": "x"}, r"\[site_prometheus.metrics.powr\]: unknown role"),
        ("util", {"name": "bad name"}, "not Prometheus metric names"),
        ("util", {"gpu_label": "gpu-id"}, "gpu_label: must be a Prometheus label name"),
        ("util", {"scale": 0}, "scale: must be a positive number"),
        ("util", {"counter": "yes"}, "counter: must be true or false"),
        ("util", {"host_label": ""}, "host_label: must not be empty"),
    ],
)
def test_a_bad_override_is_an_error_naming_table_and_key(
    role: str, table: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_override(role, table)


def test_the_early_judge_needs_power_and_util() -> None:
    with pytest.raises(ValueError, match="power: must map a metric"):
        resolve("amd", {"power": {"name": ""}})
    with pytest.raises(ValueError, match="gpu_label: a per-GPU metric needs its GPU label"):
        resolve("generic", {"util": {"gpu_label": ""}})


def _matches(rx: str, value: str) -> bool:
    """Prometheus anchors `=~` regexes; RE2 and Python agree on this subset."""
    return re.fullmatch(rx, value) is not None


def test_short_rewrite_matches_fqdn_and_port_but_not_other_hosts() -> None:
    rw = HostRewrite("short")
    rx = rw.selector_regex(["node001", "node002.cluster.example"])
    assert _matches(rx, "node001")
    assert _matches(rx, "node001.cluster.example")
    assert _matches(rx, "node002:9100")
    assert _matches(rx, "node002.cluster.example:9100")
    assert not _matches(rx, "node0011")
    assert not _matches(rx, "xnode001")
    assert not _matches(rx, "node003")
    nodes = ["node001", "node002.cluster.example"]
    assert rw.node_of("node001.cluster.example:9100", nodes) == "node001"
    assert rw.node_of("node002", nodes) == "node002.cluster.example"
    assert rw.node_of("node0011", nodes) is None


def test_names_are_matched_literally_and_invalid_ones_never_reach_a_query() -> None:
    rw = HostRewrite("exact")
    rx = rw.selector_regex(["gpu-a.01", 'evil"|.*', "ok_1"])
    assert _matches(rx, "gpu-a.01") and not _matches(rx, "gpu-ax01")
    assert "evil" not in rx
    assert not _matches(rx, "anything")
    with pytest.raises(ValueError, match="no valid node name"):
        rw.selector_regex(["$(rm -rf)", ""])
    # The PromQL string form escapes what RE2 needs escaped.
    assert promql_string(rx).count("\\\\.") == 1


def test_regex_rewrite_maps_slurm_names_to_label_values_and_back() -> None:
    rw = HostRewrite("regex", r"(node\d+)", r"\1.ib.example")
    assert rw.label_value("node007") == "node007.ib.example"
    assert rw.label_value("login1") is None  # the pattern does not apply: never asked about
    rx = rw.selector_regex(["node007", "login1"])
    assert _matches(rx, "node007.ib.example") and not _matches(rx, "node007")
    assert rw.node_of("node007.ib.example:9400", ["node007"]) == "node007"
    with pytest.raises(ValueError, match="not a regular expression"):
        HostRewrite("regex", "(", "x")
