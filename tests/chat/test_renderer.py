"""Rendering off the event loop: a spawned worker process (or a thread), timeouts and failures as RenderError."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jobdiagd.chat.plots import IncidentMarks, StepChart, StepPoint, render
from jobdiagd.chat.renderer import PlotRenderer, RenderError

CHART = StepChart(
    "Hang · job 1",
    tuple(StepPoint(k, 6.0, 8600.0) for k in range(100)),
    IncidentMarks("hang", 99, projected_step=130, stalled_s=186.0),
)


@pytest.mark.parametrize("mode", ["process", "thread"])
async def test_renders_the_same_png_as_in_process(mode: str) -> None:
    r = PlotRenderer(mode=mode, timeout_s=60.0)  # type: ignore[arg-type]
    try:
        png = await r.render(CHART)
        assert png == render(CHART)
        assert await r.render(CHART) == png
        assert (r.rendered, r.failed) == (2, 0)
    finally:
        await r.close()
    await r.close()  # closing twice is harmless


async def test_a_render_past_the_timeout_is_killed_and_the_next_one_works() -> None:
    r = PlotRenderer(timeout_s=0.05)  # a spawned worker cannot even import matplotlib that fast
    try:
        with pytest.raises(RenderError, match=r"rendering StepChart 'Hang · job 1' timed out after 0.05s"):
            await r.render(CHART)
        assert r.failed == 1 and r._pool is None  # the stuck worker was terminated
        r.timeout_s = 60.0
        assert (await r.render(CHART)).startswith(b"\x89PNG")
    finally:
        await r.close()


async def test_an_error_in_the_plotting_code_is_a_render_error_and_the_worker_survives() -> None:
    broken = StepChart("broken", (StepPoint(1, 6.0, 1.0), StepPoint("two", 6.0, 1.0)))  # type: ignore[arg-type]
    r = PlotRenderer(timeout_s=60.0)
    try:
        with pytest.raises(RenderError, match=r"rendering StepChart 'broken' failed: TypeError"):
            await r.render(broken)
        assert (await r.render(CHART)).startswith(b"\x89PNG")
        assert (r.rendered, r.failed) == (1, 1)
    finally:
        await r.close()


async def test_only_pictures_are_accepted_and_settings_are_checked() -> None:
    r = PlotRenderer(mode="thread")
    with pytest.raises(TypeError, match="cannot render dict"):
        await r.render({})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="render mode"):
        PlotRenderer(mode="fork")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s"):
        PlotRenderer(timeout_s=0)


def test_the_daemon_process_never_imports_matplotlib() -> None:
    code = """
import asyncio, sys
from jobdiagd.chat.renderer import PlotRenderer
from jobdiagd.chat.plot_inputs import hang_chart
from jobdiagd.triage.progress import checkpoint_config

async def main():
    r = PlotRenderer()
    await r.warm()
    chart = hang_chart([(k, 6.0, 8600.0) for k in range(50)], checkpoint_config({}, {}, []), title="t",
                       last_step=49, projected=60, stalled_s=66.0, step_time_s=6.0)
    png = await r.render(chart)
    await r.close()
    print(len(png) > 1000, "matplotlib" in sys.modules)

asyncio.run(main())
"""
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["True", "False"]
