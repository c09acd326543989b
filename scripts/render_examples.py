#!/usr/bin/env python3
"""Regenerate the example pictures in docs/img/ from the simulator (hang, TGS slide, RAY=1 power strip, goodput).

    .venv/bin/python scripts/render_examples.py [--out docs/img] [--only goodput]

The hang and the power strip come from one simulated RAY=1 job (8 nodes x 8 MI300X) whose
collective hangs at step 737 while node005 dies, seen 10 minutes later; the strip is read
from a real Prometheus serving the job's promtool-built TSDB. The TGS slide is the
simulator's I/O-contention job (steps 20 % slower in the last 40 % of the run). The goodput
picture is `jobdiagd goodput` of the simulated archive (`jobdiagd_sim.archive`, 30 chains,
seed 0) without Slurm, on a fixed clock.
Needs prometheus and promtool (scripts/setup.sh installs them). Prints time and size per picture.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "daemon"), str(ROOT / "sim")]

from jobdiagd.chat.plot_inputs import (  # noqa: E402
    chart_title,
    hang_chart,
    power_bands,
    power_strip,
    projected_step,
    tgs_chart,
)
from jobdiagd.chat.plots import PowerStrip, StepChart, render  # noqa: E402
from jobdiagd.model.records import StepRecord  # noqa: E402
from jobdiagd.model.triage import CheckpointConfig  # noqa: E402
from jobdiagd.triage.progress import checkpoint_config, steady_step_time  # noqa: E402
from jobdiagd.triage.tgs import analyze_tgs  # noqa: E402
from jobdiagd.tsdb.access import LocalPrometheus  # noqa: E402
from jobdiagd.tsdb.client import PromClient  # noqa: E402
from jobdiagd.tsdb.gpu_strip import WINDOW_S, fetch_gpu_strip  # noqa: E402
from jobdiagd.tsdb.settings import TsdbSettings  # noqa: E402
from jobdiagd_sim.metrics import JobSim, scenario, write_job  # noqa: E402

NODES = tuple(f"node{i:03d}" for i in range(1, 9))
SEEN_AFTER_S = 600.0  # the picture as /plot would draw it 10 minutes into the stall


def records(sim: JobSim) -> list[StepRecord]:
    return [StepRecord(s.step, s.seconds, s.tgs, None, s.loss, s.t, 0, 0, "sim") for s in sim.steps]


def ckpt_of(sim: JobSim) -> CheckpointConfig:
    sc = sim.sc
    saves = [s.step for s in sim.steps if s.step > 0 and s.step % sc.checkpoint_period == 0]
    return checkpoint_config(
        {
            "steps": str(sc.steps),
            "enable_checkpointing": "true",
            "checkpoint_period": str(sc.checkpoint_period),
        },
        {},
        saves,
    )


def timed(name: str, out: Path, spec: StepChart | PowerStrip) -> None:
    t0 = time.perf_counter()
    png = render(spec)
    dt = time.perf_counter() - t0
    out.write_bytes(png)
    print(f"{name:<22} {dt * 1000:6.0f} ms  {len(png) / 1024:6.1f} KiB  -> {out}")


async def strip_png(sim: JobSim, out: Path, now: float, work: Path) -> None:
    files = write_job(sim, work)
    settings = TsdbSettings(work_dir=str(work))
    async with LocalPrometheus(files.prometheus, settings) as prom, PromClient(prom.base_url) as client:
        strip = await fetch_gpu_strip(client, start=now - WINDOW_S, end=now, nodes=sim.sc.nodes)
    last = sim.steps[-1]
    spec = power_strip(
        strip.power,
        strip.util,
        power_bands(settings.profile(sim.sc.model), settings.thresholds),
        title=chart_title(sim.sc.job_id, "JAX-llama2-70b", "GPU power · hang"),
        start=strip.start,
        end=strip.end,
        last_step=last.step,
        last_step_at=last.t,
        notes=strip.notes,
    )
    timed("ray-power-strip.png", out, spec)


def goodput_png(out: Path) -> None:
    from jobdiagd.cli import main as cli
    from jobdiagd_sim.archive import build_archive

    with tempfile.TemporaryDirectory(prefix="jobdiagd-examples-") as tmp:
        root = Path(tmp) / "outputs"
        build_archive(root, chains=30, seed=0)
        t0 = time.perf_counter()
        argv = [
            "goodput",
            str(root),
            "--no-slurm",
            "--no-cache",
            "--now",
            "2026-09-01T00:00:00",
            "--png",
            str(out),
        ]
        with contextlib.redirect_stdout(io.StringIO()):
            rc = cli(argv)
        assert rc == 0, rc
    dt = time.perf_counter() - t0
    print(
        f"{out.name:<22} {dt * 1000:6.0f} ms  {out.stat().st_size / 1024:6.1f} KiB  -> {out} (whole command)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    p.add_argument(
        "--only", choices=("goodput",), default=None, help="render only this picture (no Prometheus)"
    )
    a = p.parse_args(argv)
    out: Path = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    goodput_png(out / "goodput.png")
    if a.only == "goodput":
        return 0

    hang = JobSim(
        scenario(
            "dead-node",
            nodes=NODES,
            steps=3000,
            hang_after_steps=737,
            bad_host="node005",
            hang_s=1800.0,
            job_id="4242",
        )
    )
    steps = records(hang)
    ckpt = ckpt_of(hang)
    last = hang.steps[-1]
    now = last.t + SEEN_AFTER_S
    step_time = steady_step_time(steps, ckpt)
    chart = hang_chart(
        steps,
        ckpt,
        title=chart_title(hang.sc.job_id, "JAX-llama2-70b", "Hang"),
        last_step=last.step,
        projected=projected_step(last.step, last.t, now, step_time),
        stalled_s=now - last.t,
        step_time_s=step_time,
        incident_id=f"{hang.sc.job_id}:hang:1",
    )
    timed("hang-alert.png", out / "hang-alert.png", chart)

    slide = JobSim(scenario("io-contention", steps=400, job_id="4243"))
    steps = records(slide)
    ckpt = ckpt_of(slide)
    analysis = analyze_tgs(steps, ckpt)
    chart = tgs_chart(
        steps,
        ckpt,
        analysis,
        title=chart_title(slide.sc.job_id, "JAX-llama2-70b", "TGS slide"),
        incident_id=f"{slide.sc.job_id}:tgs-degradation:1",
    )
    timed("tgs-slide.png", out / "tgs-slide.png", chart)

    with tempfile.TemporaryDirectory(prefix="jobdiagd-examples-") as tmp:
        asyncio.run(strip_png(hang, out / "ray-power-strip.png", now, Path(tmp)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
