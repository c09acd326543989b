"""Benchmark: alert picture render time and PNG size, and what rendering does to the event loop.

Usage: .venv/bin/python bench/bench_plots.py [--repeat 5]
Per picture (hang, TGS slide, power strip of 8 and of 64 hosts, a 1M-step hang history):
median render time in this process, as a ratio to encoding an empty 1280x960 figure (the
Agg + PNG floor, measured in the same run), and the PNG size. Then the event loop's worst
and p99 lateness of a 10 ms ticker while 6 pictures render through PlotRenderer in a thread
and in the worker process, against the same ticker with nothing rendering.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable

from matplotlib.figure import Figure

from jobdiagd.chat.plot_inputs import chart_title, hang_chart, power_bands, projected_step, tgs_chart
from jobdiagd.chat.plots import (
    HEIGHT_PX,
    WIDTH_PX,
    HostSeries,
    PowerStrip,
    StepChart,
    StepPoint,
    _png,
    render,
)
from jobdiagd.chat.renderer import PlotRenderer
from jobdiagd.model.records import StepRecord
from jobdiagd.triage.progress import checkpoint_config, steady_step_time
from jobdiagd.triage.tgs import analyze_tgs
from jobdiagd.tsdb.settings import DEFAULT_PROFILES
from jobdiagd_sim.metrics import JobSim, scenario

Spec = StepChart | PowerStrip


def records(sim: JobSim) -> list[StepRecord]:
    return [StepRecord(s.step, s.seconds, s.tgs, None, s.loss, s.t, 0, 0, "sim") for s in sim.steps]


def strip_of(sim: JobSim, end: float) -> PowerStrip:
    times = tuple(end - 3600 + 20 * i for i in range(181))
    power, util = [], []
    for h in sim.sc.nodes:
        alive = [t for t in times if sim.alive(h, t)]
        pw = [[sim.gpu_power(h, g, t) for g in range(sim.sc.gpus)] for t in alive]
        ut = [[sim.gpu_util(h, g, t) for g in range(sim.sc.gpus)] for t in alive]
        power.append(
            HostSeries(
                h,
                tuple(alive),
                tuple(statistics.fmean(p) for p in pw),
                tuple(min(p) for p in pw),
                tuple(max(p) for p in pw),
                sim.sc.gpus,
            )
        )
        util.append(
            HostSeries(
                h,
                tuple(alive),
                tuple(statistics.fmean(u) for u in ut),
                tuple(min(u) for u in ut),
                tuple(max(u) for u in ut),
                sim.sc.gpus,
            )
        )
    last = sim.steps[-1]
    return PowerStrip(
        chart_title(sim.sc.job_id, None, "GPU power"),
        tuple(power),
        tuple(util),
        power_bands(DEFAULT_PROFILES["MI300X"]),
        end - 3600,
        end,
        since=last.t,
        since_label=f"last step {last.step} read",
    )


def pictures() -> dict[str, Spec]:
    out: dict[str, Spec] = {}
    hang = JobSim(
        scenario(
            "dead-node",
            steps=3000,
            hang_after_steps=737,
            hang_s=1800.0,
            nodes=tuple(f"node{i:03d}" for i in range(1, 9)),
        )
    )
    steps = records(hang)
    ckpt = checkpoint_config({"enable_checkpointing": "true", "checkpoint_period": "100"}, {}, [])
    last = hang.steps[-1]
    now = last.t + 600
    st = steady_step_time(steps, ckpt)
    out["hang (737 steps)"] = hang_chart(
        steps,
        ckpt,
        title="Hang",
        last_step=last.step,
        projected=projected_step(last.step, last.t, now, st),
        stalled_s=600.0,
        step_time_s=st,
    )
    slide = JobSim(scenario("io-contention", steps=400))
    s2 = records(slide)
    out["TGS slide (400 steps)"] = tgs_chart(s2, ckpt, analyze_tgs(s2, ckpt), title="TGS slide")
    out["power strip, 8 hosts"] = strip_of(hang, now)
    big = JobSim(
        scenario(
            "dead-node",
            steps=3000,
            hang_after_steps=737,
            hang_s=1800.0,
            gpus=8,
            nodes=tuple(f"node{i:03d}" for i in range(1, 65)),
            bad_host="node017",
        )
    )
    out["power strip, 64 hosts"] = strip_of(big, now)
    huge = tuple(StepPoint(k, 6.0 + (k % 7) * 0.01, 8600.0 - (k % 7)) for k in range(1_000_000))
    out["hang (1M-step history)"] = StepChart(
        "Hang",
        huge,
        hang_chart(
            [], ckpt, title="", last_step=999_999, projected=1_000_100, stalled_s=600.0, step_time_s=6.0
        ).marks,
    )
    return out


def timed(fn: Callable[[], object], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


async def lateness(work: Callable[[], object] | None, seconds: float = 0.0) -> tuple[float, float]:
    """(max, p99) lateness in ms of a 10 ms ticker while `work()` (a coroutine factory) runs."""
    late: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            t0 = loop.time()
            await asyncio.sleep(0.010)
            late.append((loop.time() - t0 - 0.010) * 1000)

    task = asyncio.create_task(ticker())
    if work is None:
        await asyncio.sleep(seconds)
    else:
        await work()  # type: ignore[misc]
    stop.set()
    await task
    late.sort()
    return late[-1], late[int(0.99 * (len(late) - 1))]


async def loop_bench(specs: list[Spec]) -> None:
    results = {}
    for mode in ("thread", "process"):
        r = PlotRenderer(mode=mode, timeout_s=120)  # type: ignore[arg-type]
        await r.warm()
        await r.render(specs[0])  # first render of a fresh worker loads fonts

        async def work(r: PlotRenderer = r) -> None:
            for s in specs:
                await r.render(s)

        t0 = time.perf_counter()
        results[mode] = (*await lateness(work), time.perf_counter() - t0)
        await r.close()
    idle = await lateness(None, results["process"][2])
    t0 = time.perf_counter()
    r = PlotRenderer()
    await r.warm()
    warm = time.perf_counter() - t0
    await r.close()
    print(f"\nevent loop, 10 ms ticker, {len(specs)} renders:")
    print(f"  {'nothing rendering':<22} max {idle[0]:6.1f} ms  p99 {idle[1]:6.1f} ms")
    for mode, (mx, p99, wall) in results.items():
        print(
            f"  {mode + ' renderer':<22} max {mx:6.1f} ms  p99 {p99:6.1f} ms  "
            f"({mx / max(idle[0], 0.1):.0f}x idle max; {wall:.2f} s for all)"
        )
    print(f"  worker start-up (spawn + import matplotlib): {warm:.2f} s, paid once by warm()")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    specs = pictures()
    empty = timed(lambda: _png(Figure(figsize=(WIDTH_PX / 100, HEIGHT_PX / 100), dpi=100)), a.repeat)
    print(f"baseline: empty {WIDTH_PX}x{HEIGHT_PX} figure to PNG {empty * 1000:.0f} ms")
    for name, spec in specs.items():
        dt = timed(lambda spec=spec: render(spec), a.repeat)  # type: ignore[misc]
        size = len(render(spec))
        print(f"  {name:<24} {dt * 1000:6.0f} ms  ({dt / empty:4.1f}x baseline)  {size / 1024:6.1f} KiB")
    asyncio.run(loop_bench([s for n, s in specs.items() if "1M" not in n] * 2))


if __name__ == "__main__":
    main()
