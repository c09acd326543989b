"""The engine's TSDB edge: hang alerts of RAY=1 jobs carry the GPU power verdict (held one tick
at most), the confirm-with-power switch, and failed RAY=1 job-end reports with their playbook.

The verdict/playbook functions are stand-ins here: they are exercised against a real Prometheus
(through a real sshd) in tests/tsdb; this checks what the daemon does with their answers."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.detectors import build
from jobdiagd.model.kinds import GpuHangState
from jobdiagd.model.plotdata import HostSeries
from jobdiagd.service.discovery import OutputsDiscovery
from jobdiagd.service.engine import Engine
from jobdiagd.service.plots_bridge import chart_from_payload, strip_from_payload
from jobdiagd.service.runner import plot_inputs
from jobdiagd.service.tsdb_enrich import TsdbEnricher
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.gpu_hang import GpuVerdict
from jobdiagd.tsdb.gpu_strip import GpuStrip
from jobdiagd.tsdb.settings import TsdbSettings
from tests.helpers.engine import T0, Daemon, events, outbox
from tests.helpers.joblog import JobLog


def ray_job(outputs: Path, job_id: str) -> JobLog:
    job = JobLog(outputs, job_id)
    job.write(
        "[Ray] Starting HEAD on node001:6379 (bind=10.0.0.1)",
        "[Prometheus] Started on port 9191 (ray: 'node001:55080', node_hw: 'node001:9400')",
    )
    return job


def with_enricher(
    d: Daemon,
    outputs: Path,
    verdict: GpuVerdict,
    *,
    confirm: bool = False,
    seen: list[DiagnosisContext] | None = None,
    plots: bool = False,
    later: tuple[int, GpuVerdict] | None = None,
) -> None:
    """`later`: (n, v) -- the answer is `verdict` to the first n questions, then `v`."""
    asked = 0

    async def verdict_fn(ctx: DiagnosisContext, now: float) -> GpuVerdict:
        nonlocal asked
        asked += 1
        if seen is not None:
            seen.append(ctx)
        await asyncio.sleep(0)
        return later[1] if later is not None and asked > later[0] else verdict

    async def diagnosis_fn(doc: dict[str, Any], now: float) -> dict[str, Any] | None:
        return {
            "analysis_type": "hang",
            "verdict": "rccl-busy-wait-hang",
            "root_cause": "RCCL deadlock",
            "anomalous_hosts": ["node002"],
            "findings": [{"summary": "192/192 GPUs busy-wait at 300 W"}],
        }

    settings = dataclasses.replace(TsdbSettings(), confirm_hang_with_power=confirm)
    enricher = TsdbEnricher(settings, tick_s=15, verdict_fn=verdict_fn, diagnosis_fn=diagnosis_fn)
    d.engine = Engine(
        d.cfg,
        d.pipeline,
        build(d.cfg),
        OutputsDiscovery([outputs], set()),
        offsets=d.offsets,
        enricher=enricher,
        plot_inputs=plot_inputs(d.cfg) if plots else None,
    )


async def tick(d: Daemon, t: float) -> None:
    await d.tick(t)
    await asyncio.sleep(0.01)  # the daemon sleeps between ticks: background queries run then


async def stall(job: JobLog, d: Daemon, ticks: int) -> float:
    t = T0
    for k in range(30):
        job.step(k, seconds=10.0)
        t += 10.0
        await tick(d, t)
    for _ in range(ticks):
        job.task(0, "node001:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read")
        t += 15.0
        await tick(d, t)
    return t


BUSY = GpuVerdict(
    GpuHangState.BUSY_WAIT,
    "16/16 GPUs at high utilization and busy-wait power (300 W avg)",
    per_host={"node001": "8 busy-wait", "node002": "8 busy-wait"},
)


async def test_hang_alert_of_a_ray_job_waits_one_tick_for_its_verdict(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = ray_job(outputs, "7100")
    d = Daemon(state, outputs)
    seen: list[DiagnosisContext] = []
    with_enricher(d, outputs, BUSY, seen=seen)
    t = await stall(job, d, 9)  # the 9th stalled tick is the first past the 120 s budget
    assert len(seen) == 1 and events(state) == []  # asked, held
    await tick(d, t + 15)
    assert events(state) == [("open", "hang")]  # the next tick pages, verdict attached
    d.close()


async def test_hang_alert_of_a_ray_job_carries_the_power_verdict(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = ray_job(outputs, "7101")
    d = Daemon(state, outputs)
    seen: list[DiagnosisContext] = []
    with_enricher(d, outputs, BUSY, seen=seen)
    t = await stall(job, d, 11)  # the stall budget (120 s) is exceeded at the 9th tick
    assert seen, "the verdict was asked for when the hang was detected"
    assert seen[0].head_node == "node001" and seen[0].port == 9191
    opened = [n for n in outbox(state) if n["event"] == "open"]
    assert len(opened) == 1
    assert "busy-wait power" in opened[0]["body"] and "node002: 8 busy-wait" in opened[0]["body"]
    job.task(0, "still nothing")
    await tick(d, t + 15)
    assert events(state) == [("open", "hang")]  # one incident, the verdict asked once per stall
    assert len(seen) == 1
    d.close()


async def test_confirm_with_power_holds_a_hang_the_gpus_deny(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = ray_job(outputs, "7102")
    d = Daemon(state, outputs)
    working = GpuVerdict(GpuHangState.TRAINING, "16/16 GPUs at training power (700 W avg): not a hang")
    with_enricher(d, outputs, working, confirm=True)
    await stall(job, d, 12)
    assert events(state) == []
    d.close()


async def test_a_denied_hang_is_asked_again_and_pages_once_the_gpus_spin(short_tmp: Path) -> None:
    """A denial is two scrapes of evidence: the next tick asks again, and the page goes out as soon
    as the GPUs stop working (here: the third answer, busy-wait)."""
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = ray_job(outputs, "7105")
    d = Daemon(state, outputs)
    seen: list[DiagnosisContext] = []
    working = GpuVerdict(GpuHangState.TRAINING, "16/16 GPUs at training power (700 W avg): not a hang")
    with_enricher(d, outputs, working, confirm=True, seen=seen, later=(2, BUSY))
    t = await stall(job, d, 11)  # asked at the 9th, 10th and 11th stalled tick; two denials read
    assert len(seen) == 3 and events(state) == []
    await tick(d, t + 15)
    assert events(state) == [("open", "hang")] and len(seen) == 3
    assert "busy-wait power" in outbox(state)[0]["body"]
    d.close()


async def test_unknown_verdict_never_suppresses_a_page(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = ray_job(outputs, "7103")
    d = Daemon(state, outputs)
    with_enricher(
        d, outputs, GpuVerdict(GpuHangState.NO_DATA, "TSDB query failed: ssh node001: refused"), confirm=True
    )
    await stall(job, d, 12)
    assert events(state) == [("open", "hang")]
    assert "ssh node001: refused" in outbox(state)[0]["body"]
    d.close()


@pytest.mark.parametrize(
    "verdict",
    [
        GpuVerdict(GpuHangState.MIXED, "no one signature on every host (node001: 8 busy-wait; ...)"),
        GpuVerdict(GpuHangState.NO_PROCESS, "every GPU of all 2 host(s) idle with no GPU process"),
    ],
)
async def test_a_verdict_that_cannot_tell_never_suppresses_a_page(
    short_tmp: Path, verdict: GpuVerdict
) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = ray_job(outputs, "7106")
    d = Daemon(state, outputs)
    with_enricher(d, outputs, verdict, confirm=True)
    await stall(job, d, 12)
    assert events(state) == [("open", "hang")]
    assert verdict.summary in outbox(state)[0]["body"]
    d.close()


async def test_failed_ray_job_end_report_includes_its_playbook(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = ray_job(outputs, "7104")
    d = Daemon(state, outputs)
    with_enricher(d, outputs, BUSY)
    t = T0
    for k in range(10):
        job.step(k, seconds=10.0)
        t += 10.0
        await tick(d, t)
    job.task(1, "Traceback (most recent call last):")
    job.task(1, "ValueError: boom")
    job.write(
        "NODE_EXIT host=node002 exit=1",
        "== Training FAILED (exit=1, 120s) ==",
        "========================== JOB SUMMARY ==========================",
        "  Job:    7104 (JAX-llama3.1-8b-test)",
        "  Wall:   5m 0s",
        "  Status: FAILED (exit 1) — Training FAILED (exit=1)",
        "=================================================================",
    )
    for _ in range(3):
        t += 15.0
        await tick(d, t)
    reports = [n for n in outbox(state) if n["event"] == "report"]
    assert len(reports) == 1
    assert "### TSDB diagnosis (hang)" in reports[0]["body"] and "rccl-busy-wait-hang" in reports[0]["body"]
    assert "## Job triage:" in reports[0]["body"]
    d.close()


async def test_a_ray_hang_page_carries_its_step_chart_and_power_strip(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = ray_job(outputs, "7104")
    d = Daemon(state, outputs)
    nan = float("nan")
    times = tuple(T0 + 60.0 * k for k in range(5))
    strip = GpuStrip(
        power=(HostSeries("node001", times, (700.0, 710.0, 300.0, 300.0, nan)),),
        util=(HostSeries("node001", times, (95.0, 96.0, 100.0, 100.0, nan)),),
        start=times[0],
        end=times[-1],
        step_s=60.0,
    )
    with_enricher(d, outputs, dataclasses.replace(BUSY, strip=strip, gpu_model="MI300X"), plots=True)
    await stall(job, d, 11)
    (opened,) = [n for n in outbox(state) if n["event"] == "open"]
    plot = opened["plot"]
    chart = chart_from_payload(plot)
    assert chart.marks is not None and chart.marks.kind == "hang" and chart.points[-1].step == 29
    back = strip_from_payload(plot["strip"])
    assert (
        back.power[0].mean[:4] == (700.0, 710.0, 300.0, 300.0)
        and back.power[0].mean[4] != back.power[0].mean[4]
    )
    assert back.bands.gpu_model == "MI300X" and back.since is not None  # the last step's read time marked
    assert "null" in json.dumps(plot["strip"]) and "NaN" not in json.dumps(plot["strip"])  # strict JSON
    d.close()
