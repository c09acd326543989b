"""The site source without a Prometheus: unknown verdicts, one notice, the check's reading of answers."""

from __future__ import annotations

import asyncio

import pytest

from jobdiagd.tsdb.access import free_loopback_port
from jobdiagd.tsdb.client import Sample
from jobdiagd.tsdb.settings import TsdbSettings
from jobdiagd.tsdb.site import HostRewrite, JobPlacement, SiteConfig, SitePrometheus, builtin, resolve
from jobdiagd.tsdb.site.source import _check_role


def closed_port_source(**kw: object) -> SitePrometheus:
    cfg = SiteConfig(
        url=f"http://127.0.0.1:{free_loopback_port()}",  # nothing listens: connection refused
        metrics=builtin("dcgm"),
        rewrite=HostRewrite("short"),
        scrape_interval_s=15.0,
        timeout_s=2.0,
    )
    return SitePrometheus(cfg, TsdbSettings(), **kw)  # type: ignore[arg-type]


async def test_an_unreachable_site_is_unknown_for_every_job_and_one_notice() -> None:
    src = closed_port_source(wall=lambda: 1500.0)
    jobs = [JobPlacement(str(j), ("node001", "node002"), exclusive=True) for j in range(20)]
    verdicts = await asyncio.gather(*(src.early_verdict(p) for p in jobs))
    assert {v.state for v in verdicts} == {"no-data"} and not any(v.confirmed for v in verdicts)
    assert src.queries == 1 and src.answers == 20  # one attempt for the node set this interval
    notices = src.take_notices()
    assert len(notices) == 1 and notices[0].kind == "degraded"
    assert "step budget" in notices[0].text and src.label in notices[0].text
    assert src.status()["failing"] is True
    await src.close()


async def test_invalid_node_names_are_never_asked_about() -> None:
    src = closed_port_source()
    v = await src.early_verdict(JobPlacement("1", ("$(reboot)",), exclusive=True))
    assert v.state == "no-data" and "no valid node name" in v.summary
    assert src.queries == 0
    slide = await src.slide(JobPlacement("1", ("a;b",)), 0.0, 60.0)
    assert not slide.ok and src.queries == 0
    assert src.slow_hosts(slide).hosts == ()
    await src.close()


def test_ssh_host_needs_a_tunnel_pool() -> None:
    cfg = SiteConfig(url="http://prom:9090", metrics=builtin("amd"), ssh_host="login1")
    with pytest.raises(ValueError, match="tunnel pool"):
        SitePrometheus(cfg, TsdbSettings())


def s(labels: dict[str, str], v: float = 1.0) -> Sample:
    return Sample(labels, 0.0, v)


def test_the_check_names_a_missing_metric_and_its_closest_existing_name() -> None:
    spec = resolve("dcgm", {"power": {"name": "DCGM_FI_DEV_POWER_USGE"}}).get("power")
    assert spec is not None
    _, errors, _ = _check_role("power", spec, [], ["DCGM_FI_DEV_POWER_USAGE", "up"], "http://p:9090")
    assert errors == [
        "[site_prometheus] power: no series named 'DCGM_FI_DEV_POWER_USGE' on http://p:9090 "
        "(did you mean 'DCGM_FI_DEV_POWER_USAGE'?)"
    ]
    # An optional role without series is dropped with a warning, not an error.
    mem = builtin("dcgm").get("mem_activity")
    assert mem is not None
    spec2, errors, warnings = _check_role("mem_activity", mem, [], [], "p")
    assert errors == [] and not spec2.mapped and "not used" in warnings[0]


def test_the_check_requires_the_host_and_gpu_labels_and_flags_a_ratio() -> None:
    util = builtin("dcgm").get("util")
    assert util is not None
    named = {"__name__": "DCGM_FI_DEV_GPU_UTIL"}
    _, errors, _ = _check_role("util", util, [s({**named, "gpu": "0"})], [], "p")
    assert errors and "no host label Hostname or hostname" in errors[0]
    _, errors, _ = _check_role("util", util, [s({**named, "hostname": "n1"})], [], "p")
    assert errors and "no GPU label 'gpu'" in errors[0]
    spec, errors, warnings = _check_role(
        "util", util, [s({**named, "hostname": "n1", "gpu": "0"}, 0.97)], [], "p"
    )
    assert errors == [] and spec.host_labels == ("hostname",)
    assert any("0-1 ratio" in w for w in warnings)
    power = builtin("dcgm").get("power")
    assert power is not None
    _, _, warnings = _check_role(
        "power",
        power,
        [s({"__name__": "DCGM_FI_DEV_POWER_USAGE", "Hostname": "n1", "gpu": "0"}, 300)],
        [],
        "p",
    )
    assert any("job label 'hpc_job'" in w for w in warnings)
