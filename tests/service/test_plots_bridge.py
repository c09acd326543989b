"""Picture inputs travel through the outbox as bounded JSON and come back as the same chart."""

from __future__ import annotations

import dataclasses
import json

from jobdiagd.chat.plot_inputs import hang_chart
from jobdiagd.goodput.report import GoodputChart
from jobdiagd.model.plotdata import StepPoint
from jobdiagd.model.triage import CheckpointConfig
from jobdiagd.service import plots_bridge


def chart(n: int) -> object:
    history = [StepPoint(k, 2.0 + (k % 7) * 0.01, 3000.0 - k % 5) for k in range(n)]
    ckpt = CheckpointConfig(enabled=True, period=100, asynchronous=False, saves=frozenset({0, 100}))
    return hang_chart(
        history,
        ckpt,
        title="Hang · job 1",
        last_step=n - 1,
        projected=n + 30,
        stalled_s=600.0,
        step_time_s=2.0,
    )


def test_the_payload_round_trips_through_json() -> None:
    c = chart(300)
    payload = json.loads(json.dumps({"type": plots_bridge.PAYLOAD, "spec": dataclasses.asdict(c)}))
    assert plots_bridge.chart_from_payload(payload) == c


def test_a_long_history_is_thinned_but_keeps_its_newest_steps() -> None:
    c = chart(100_000)
    spec = dataclasses.asdict(c)
    thinned = plots_bridge._thin(spec["points"])
    assert len(thinned) <= plots_bridge.MAX_POINTS
    assert [p["step"] for p in thinned[-plots_bridge.KEEP_RECENT :]] == list(
        range(100_000 - plots_bridge.KEEP_RECENT, 100_000)
    )
    assert thinned[0]["step"] == 0  # the start of training stays in view
    assert len(json.dumps(thinned)) < 200_000  # a small outbox row, whatever the job's length


GOODPUT = GoodputChart(
    title="Goodput, week to 2026-09-01: 71.0 % of 1,200 GPU-hours",
    subtitle="GPU-hours per user by bucket; lost GPU-hours by class",
    by="user",
    groups=("alice", "bob"),
    buckets=("productive", "startup", "stall_to_detection"),
    hours=((600.0, 40.0, 60.0), (250.0, 20.0, 230.0)),
    lost_by_class=(("hang", 290.0), ("completed", 60.0)),
)


def test_the_digest_picture_round_trips_through_json() -> None:
    payload = json.loads(json.dumps(plots_bridge.goodput_payload(GOODPUT)))
    assert payload["type"] == plots_bridge.GOODPUT
    assert plots_bridge.goodput_from_payload(payload) == GOODPUT


async def test_the_bridge_renders_the_digest_picture_in_its_worker() -> None:
    from jobdiagd.chat.goodput_plot import render_goodput

    bridge = plots_bridge.PlotBridge(timeout_s=120.0)
    try:
        (png,) = await bridge.render(json.loads(json.dumps(plots_bridge.goodput_payload(GOODPUT))))
        assert png == render_goodput(GOODPUT)  # the same bytes as in process
        assert (
            await bridge.render({"type": plots_bridge.GOODPUT, "spec": {"title": "x"}}) == []
        )  # bad: no picture
    finally:
        await bridge.close()


def test_the_host_strip_round_trips_through_strict_json() -> None:
    import math
    from pathlib import Path

    from jobdiagd.model.jobref import JobRef
    from jobdiagd.model.plotdata import HostSeries
    from jobdiagd.service.jobs import JobView
    from jobdiagd.tsdb.site import SlideAnswer
    from jobdiagd.tsdb.slow_host import judge_slow_hosts

    times = tuple(1000.0 + 15 * i for i in range(9))
    rdma = tuple(
        HostSeries(f"r00{i}", times, tuple(25.0 if i == 3 else 0.05 for _ in times)) for i in range(1, 6)
    )
    power = tuple(
        HostSeries(h.host, times, (float("nan"), *(560.0 for _ in times[1:])), gpus=8) for h in rdma
    )
    series = {"power": power, "rdma_retrans": rdma}
    slide = SlideAnswer(True, times[0], times[-1], series)
    verdict = judge_slow_hosts(series, start=times[0], end=times[-1])
    view = JobView(key="8110", ref=JobRef("8110", "x", None, Path("/o/8110-x.log"), "slurm"), first_seen=0.0)
    payload = json.loads(json.dumps(plots_bridge.host_strip_payload(slide, verdict, view), allow_nan=False))
    strip = plots_bridge.picture_from_payload(payload)
    assert isinstance(strip, plots_bridge.HostStrip)
    assert strip.named == ("r003",) and [p.label for p in strip.panels] == ["GPU power", "RDMA retransmits"]
    assert math.isnan(strip.panels[0].series[0].mean[0])  # a silent sample stays one
    assert strip.panels[1].series[2].mean == rdma[2].mean
    assert strip.title == "Hosts during the slide · job 8110" and "r003" in (strip.subtitle or "")
