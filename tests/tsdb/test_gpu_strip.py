"""The power strip's data from a real Prometheus serving promtool-built TSDBs: per host, one query, label variants."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from jobdiagd.model.plotdata import HostSeries
from jobdiagd.tsdb.access import AccessError, LocalPrometheus
from jobdiagd.tsdb.client import PromClient
from jobdiagd.tsdb.gpu_strip import MIN_STEP_S, check_host, fetch_gpu_strip, strip_step
from jobdiagd.tsdb.settings import TsdbSettings
from tests.helpers.tsdb import Fixtures


def finite(vals: tuple[float, ...]) -> list[float]:
    return [v for v in vals if not math.isnan(v)]


def by_host(series: tuple[HostSeries, ...]) -> dict[str, HostSeries]:
    return {s.host: s for s in series}


def last_finite_time(s: HostSeries) -> float:
    return max(t for t, v in zip(s.times, s.mean, strict=True) if not math.isnan(v))


def test_step_keeps_points_bounded_and_never_below_the_scrape_interval() -> None:
    assert strip_step(0, 3600) == MIN_STEP_S
    assert strip_step(0, 86_400) == math.ceil(86_400 / 239)
    assert (86_400 // strip_step(0, 86_400)) + 1 <= 240
    with pytest.raises(ValueError, match="empty window"):
        strip_step(10, 10)


@pytest.mark.parametrize("bad", ["node001;rm -rf /", "node 1", "-oProxyCommand=x", "", "a" * 300, "node003"])
def test_host_labels_are_checked_against_the_node_list(bad: str) -> None:
    with pytest.raises(AccessError):
        check_host(bad, ("node001", "node002"))


def test_host_labels_kept_short_and_ips_kept_as_ips() -> None:
    assert check_host("node001.cluster.local", ("node001",)) == "node001"
    assert check_host("10.0.0.7", ("node001",)) == "10.0.0.7"
    assert check_host("gpu-7", ()) == "gpu-7"
    with pytest.raises(AccessError):
        check_host("bad host", ())


async def test_dead_node_hang_per_host_in_one_query(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("dead-node", tmp_path)
    sim = b.sim
    end = sim.train_end + 600.0
    start = end - 3600.0
    async with (
        LocalPrometheus(b.files.prometheus, TsdbSettings(work_dir=str(tmp_path))) as prom,
        PromClient(prom.base_url) as client,
    ):
        strip = await fetch_gpu_strip(client, start=start, end=end, nodes=sim.sc.nodes)
        assert client.query_count == 1
    power, util = by_host(strip.power), by_host(strip.util)
    assert set(power) == set(util) == set(sim.sc.nodes)
    assert strip.notes == ()
    for s in (*strip.power, *strip.util):
        assert len(s.times) == len(s.mean) == len(s.low) == len(s.high) <= 240
        assert s.gpus == sim.sc.gpus
    # Before the hang every host trains at ~680 W and 100 %; after it the live hosts busy-wait at
    # ~300 W and 100 %, and the dead node's series ends within one step of its last sample.
    before = [i for i, t in enumerate(strip.power[0].times) if t < sim.train_end - 300]
    after = [i for i, t in enumerate(strip.power[0].times) if t > sim.train_end + 60]
    dead = sim.sc.bad_host
    for host, s in power.items():
        # (each point averages the step before it: only points whose whole step was training)
        training = [i for i in before if {sim.phase(host, s.times[i] - d) for d in (0, 10, 20)} == {"train"}]
        assert len(training) > 30
        assert all(600 < s.mean[i] < 760 for i in training)
        if host == dead:
            assert all(math.isnan(s.mean[i]) for i in after)
            assert sim.dead_t is not None
            assert abs(last_finite_time(s) - sim.dead_t) <= strip.step_s + 1
        else:
            assert all(280 < s.mean[i] < 320 for i in after)
            assert all(s.low[i] <= s.mean[i] <= s.high[i] for i in after)
            assert all(util[host].mean[i] == 100.0 for i in after)


async def test_node_list_filters_hosts_and_names_silent_ones(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("rccl-hang", tmp_path)
    sim = b.sim
    end = sim.train_end + 300.0
    nodes = ("node001", "node002", "node003", "node009")  # node004 reports but is not listed
    async with (
        LocalPrometheus(b.files.prometheus, TsdbSettings(work_dir=str(tmp_path))) as prom,
        PromClient(prom.base_url) as client,
    ):
        strip = await fetch_gpu_strip(client, start=end - 1800.0, end=end, nodes=nodes)
    assert [s.host for s in strip.power] == list(nodes)
    assert finite(by_host(strip.power)["node009"].mean) == []  # listed, silent: shown as such
    assert "node004" not in by_host(strip.util)
    assert any("not in the job's node list: node004" in n for n in strip.notes)


def _build(tmp_path: Path, text: str) -> Path:
    om = tmp_path / "m.om"
    om.write_text(text + "# EOF\n")
    out = tmp_path / "prom"
    subprocess.run(
        ["/usr/bin/promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(out)],
        check=True,
        capture_output=True,
    )
    return out


@pytest.mark.prometheus
async def test_ray_label_variants_and_hostile_labels(tmp_path: Path) -> None:
    t0 = 1_780_272_000
    lines = []
    for k in range(0, 1200, 10):
        t = t0 + k
        for g in range(2):
            lines.append(f'hw_gpu_power_watts{{host="node001",gpu="{g}"}} {300 + g} {t}')
            lines.append(f'hw_gpu_power_watts{{host="node002",gpu="{g}"}} {95 + g} {t}')
            lines.append(f'hw_gpu_power_watts{{host="x;rm -rf /",gpu="{g}"}} 1 {t}')
            # Old Ray: utilization labelled by IP only, host recoverable from the scrape target.
            lines.append(
                f'ray_node_gpus_utilization{{ip="10.0.0.1",GpuIndex="{g}",instance="node001:55080"}} 100 {t}'
            )
            lines.append(
                f'ray_node_gpus_utilization{{ip="10.0.0.2",GpuIndex="{g}",instance="node002:55080"}} 0 {t}'
            )
    tsdb = _build(tmp_path, "\n".join(lines) + "\n")
    async with (
        LocalPrometheus(tsdb, TsdbSettings(work_dir=str(tmp_path))) as prom,
        PromClient(prom.base_url) as client,
    ):
        end = float(t0 + 1190)
        strip = await fetch_gpu_strip(client, start=end - 900.0, end=end, nodes=("node001", "node002"))
        ips = await fetch_gpu_strip(client, start=end - 900.0, end=end)
    power, util = by_host(strip.power), by_host(strip.util)
    assert set(power) == {"node001", "node002"}  # the hostile label is dropped, not queried or shown
    assert any("not in the job's node list" in n for n in strip.notes)
    assert set(util) == {"node001", "node002"}  # mapped through `instance`
    assert set(finite(util["node001"].mean)) == {100.0} and set(finite(util["node002"].mean)) == {0.0}
    assert set(finite(power["node001"].low)) == {300.0} and set(finite(power["node001"].high)) == {301.0}
    assert power["node001"].gpus == 2
    # Without a node list, a malformed host label is still refused.
    assert "x;rm -rf /" not in by_host(ips.power)


@pytest.mark.prometheus
async def test_ip_only_utilization_is_shown_per_ip_with_a_note(tmp_path: Path) -> None:
    t0 = 1_780_272_000
    lines = []
    for k in range(0, 600, 10):
        lines.append(f'hw_gpu_power_watts{{host="node001",gpu="0"}} 300 {t0 + k}')
        lines.append(f'ray_node_gpus_utilization{{ip="10.0.0.1",GpuIndex="0"}} 100 {t0 + k}')
    tsdb = _build(tmp_path, "\n".join(lines) + "\n")
    async with (
        LocalPrometheus(tsdb, TsdbSettings(work_dir=str(tmp_path))) as prom,
        PromClient(prom.base_url) as client,
    ):
        strip = await fetch_gpu_strip(client, start=float(t0), end=float(t0 + 590), nodes=("node001",))
    assert [s.host for s in strip.util] == ["10.0.0.1"]
    assert any("labelled by IP only" in n for n in strip.notes)


async def test_an_empty_window_says_what_is_missing(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("healthy", tmp_path)
    async with (
        LocalPrometheus(b.files.prometheus, TsdbSettings(work_dir=str(tmp_path))) as prom,
        PromClient(prom.base_url) as client,
    ):
        start = b.sim.sc.start - 86_400 * 30
        strip = await fetch_gpu_strip(client, start=start, end=start + 3600, nodes=b.sim.sc.nodes)
    assert all(finite(s.mean) == [] for s in strip.power)
    assert strip.util == ()
    assert "no hw_gpu_power_watts samples in this window" in strip.notes
