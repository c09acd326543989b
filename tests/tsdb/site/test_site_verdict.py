"""The site series through the one early-hang judge (tsdb/site/verdict.py)."""

from __future__ import annotations

from dataclasses import replace

from jobdiagd.tsdb.settings import TsdbSettings
from jobdiagd.tsdb.site.placement import SiteSeries
from jobdiagd.tsdb.site.verdict import (
    GIB,
    PROCS,
    GpuVerdict,
    catalog_series,
    gpu_model,
    site_early_verdict,
    unknown_verdict,
)

AT = 1000.0
NODES = ("node001", "node002", "node003", "node004")
H100 = "NVIDIA H100 80GB HBM3"


def host(
    node: str, power: float, util: float, vram_gib: float | None, *, io: float | None = None
) -> list[SiteSeries]:
    def pts(v: float) -> tuple[tuple[float, float], ...]:
        return ((AT - 30, v), (AT - 15, v), (AT - 1, v))

    out = []
    for g in range(8):
        out.append(SiteSeries("power", node, str(g), pts(power), model=H100))
        out.append(SiteSeries("util", node, str(g), pts(util), model=H100))
        if vram_gib is not None:
            out.append(SiteSeries("vram_used", node, str(g), pts(vram_gib * GIB)))
    if io is not None:
        out.append(SiteSeries("io_pressure", node, "", pts(io)))
    return out


def verdict(series: list[SiteSeries], refused: dict[str, str] | None = None) -> GpuVerdict:
    return site_early_verdict(
        series,
        at=AT,
        nodes=NODES,
        refused=refused or {},
        settings=TsdbSettings(),
        scrape_interval_s=15.0,
        idle_vram_bytes=2 * GIB,
    )


def test_h100_busy_wait_on_every_host_is_confirmed_with_the_h100_bands() -> None:
    # 250 W is H100 busy-wait (150-300 W), far above what an MI300X would call busy-wait idle.
    v = verdict([s for n in NODES for s in host(n, 250.0, 100.0, 60.0, io=0.5)])
    assert v.state == "busy-wait" and v.confirmed
    assert "H100" in v.summary


def test_a_dead_process_shows_as_freed_gpu_memory_under_busy_waiting_peers() -> None:
    series = [s for n in NODES[:3] for s in host(n, 250.0, 100.0, 60.0)] + host("node004", 60.0, 0.0, 0.4)
    v = verdict(series)
    assert v.state == "dead-node" and v.suspects == ("node004",)


def test_an_idle_host_holding_its_memory_is_alive_not_dead() -> None:
    series = [s for n in NODES[:3] for s in host(n, 250.0, 100.0, 60.0)] + host("node004", 60.0, 0.0, 60.0)
    v = verdict(series)
    # Others spin on a host idling with its process alive (rule HANG-GPU): neither confirms nor denies.
    assert v.state == "mixed" and not v.confirmed


def test_without_a_memory_metric_an_idle_host_cannot_be_called_dead() -> None:
    series = [s for n in NODES[:3] for s in host(n, 250.0, 100.0, None)] + host("node004", 60.0, 0.0, None)
    v = verdict(series)
    assert v.state == "no-data" and not v.confirmed
    assert PROCS in v.summary or PROCS in v.per_host["node004"]


def test_checkpoint_io_vetoes_and_refused_nodes_and_no_answer_never_confirm() -> None:
    io = [s for n in NODES for s in host(n, 250.0, 100.0, 60.0, io=35.0 if n == "node002" else 0.0)]
    assert verdict(io).state == "not-a-hang"
    all_busy = [s for n in NODES for s in host(n, 250.0, 100.0, 60.0)]
    v = verdict(all_busy, {"node002": "node002 may be shared with another job"})
    assert v.state == "no-data" and "shared" in v.summary and "node002" in v.summary
    u = unknown_verdict("timed out after 5s", AT)
    assert u.state == "no-data" and not u.confirmed and "timed out" in u.summary


def test_catalog_names_and_model() -> None:
    series = host("node001", 250.0, 100.0, 0.5, io=3.0)
    cat = catalog_series(series, 2 * GIB)
    names = {s.labels["__name__"] for s in cat}
    assert names == {"hw_gpu_power_watts", "ray_node_gpus_utilization", PROCS, "hw_io_pressure_full_pct"}
    procs = [s for s in cat if s.labels["__name__"] == PROCS]
    assert all(v == 0.0 for s in procs for _, v in s.points)
    assert gpu_model(series, TsdbSettings()) == ("H100", None)
    assert gpu_model(series, TsdbSettings(gpu_model="B200")) == ("B200", None)
    # A real process count wins over the memory stand-in.
    counted = [*series, SiteSeries("processes", "node001", "0", ((AT - 1, 1.0),))]
    assert len([s for s in catalog_series(counted, 2 * GIB) if s.labels["__name__"] == PROCS]) == 1


def test_a_gpu_model_without_power_bands_confirms_nothing() -> None:
    """An A100 trains at ~350 W, inside MI300X's busy-wait band: judging it with the default bands
    would page a healthy job."""
    a100 = [replace(s, model="NVIDIA A100-SXM4-80GB") for n in NODES for s in host(n, 350.0, 100.0, 70.0)]
    v = verdict(a100)
    assert v.state == "no-data" and "A100-SXM4-80GB" in v.summary and "gpu_model" in v.summary
    pinned = site_early_verdict(
        a100,
        at=AT,
        nodes=NODES,
        refused={},
        settings=TsdbSettings(gpu_model="H100"),
        scrape_interval_s=15.0,
        idle_vram_bytes=2 * GIB,
    )
    assert pinned.state != "no-data"  # the configured model's bands are used
