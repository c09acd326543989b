"""The live demo (`scripts/demo.sh`, `python -m jobdiagd_sim.demo`): a simulated MaxText job trains then
hangs; the daemon pages with triage, then reports the end.

No Slurm needed: the daemon runs in outputs-root discovery mode on a fresh work dir, with
the console notifier on stdout. Once the hang incident is open the demo "scancels" the job
(the simulator writes the cancellation cascade and JOB SUMMARY), the daemon sends the
job-end report, and the demo stops the daemon.

The demo is the simulator's front end, so it lives with the simulator, outside what the
`jobdiagd` package imports (it was the `jobdiagd demo` subcommand).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from jobdiagd import clock
from jobdiagd.service.engine import Engine
from jobdiagd.service.lifecycle import Lifecycle
from jobdiagd.service.runner import run_daemon
from jobdiagd_sim.live import LiveConfig
from jobdiagd_sim.live import run as run_sim

JOB_ID = "4242"
JOB_NAME = "JAX-llama3.1-8b-demo"


def demo_config(work: Path, step_time: float) -> str:
    # Short budgets so the demo fits in a minute; production defaults are 120 s / 30 min.
    return f"""# written by the jobdiagd demo (scripts/demo.sh)
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jobdiagd.sock"
tick_seconds = 3
log_level = "error"

[detectors.hang]
min_stall_seconds = {max(15.0, 10 * step_time):g}
startup_grace_seconds = 60

[notifiers.console]
stream = "stdout"
"""


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


async def _orchestrate(lc: Lifecycle, engine: Engine, stop_sim: threading.Event, give_up_s: float) -> None:
    started = clock.monotonic()
    phase = "training"
    while not lc.stopping:
        if clock.monotonic() - started > give_up_s:
            say(f"demo: gave up after {give_up_s:g} s")
            lc.request_stop("demo timeout")
            return
        book = engine.pipeline.book
        hang = book.get(JOB_ID, "hang")
        if phase == "training" and hang is not None:
            phase = "hung"
            say(
                f"demo: the hang alert fired {clock.monotonic() - started:.0f} s after start; "
                "cancelling the job as an operator would (scancel)"
            )
            await lc.sleep(2.0)
            stop_sim.set()
        elif phase == "hung" and JOB_ID not in engine.jobs:
            phase = "ended"
            await lc.sleep(1.0)  # let the dispatcher print the report
            say("demo: job-end report sent; stopping the daemon")
            lc.request_stop("demo done")
            return
        if await lc.sleep(0.5):
            return


def main(args: argparse.Namespace) -> int:
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="jobdiagd-demo-")
        work = Path(tmp.name)
    else:
        work = Path(args.dir)
        work.mkdir(parents=True, exist_ok=True)
    outputs = work / "outputs"
    outputs.mkdir(exist_ok=True)
    cfg_path = work / "demo.toml"
    cfg_path.write_text(demo_config(work, args.step_time))
    stop_sim = threading.Event()
    sim = LiveConfig(
        steps=500,
        step_time=args.step_time,
        hang_after=args.hang_after,
        nnodes=4,
        noise_every=2.0,
        outputs=outputs,
        job_id=JOB_ID,
        name=JOB_NAME,
    )
    say(
        f"demo: simulated job {JOB_ID}-{JOB_NAME} under {outputs}: {args.step_time:g} s steps, "
        f"hangs after step {args.hang_after}; daemon config {cfg_path}"
    )
    sim_thread = threading.Thread(target=run_sim, args=(sim,), kwargs={"stop": stop_sim}, daemon=True)
    tasks: list[asyncio.Task[None]] = []

    def started(lc: Lifecycle, engine: Engine) -> None:
        sim_thread.start()
        tasks.append(asyncio.get_running_loop().create_task(_orchestrate(lc, engine, stop_sim, args.timeout)))

    rc = 0
    try:
        asyncio.run(run_daemon(cfg_path, discover="outputs", watch=[outputs], on_started=started))
    except KeyboardInterrupt:
        rc = 130
    except Exception as exc:
        print(f"demo: {type(exc).__name__}: {exc}", file=sys.stderr)
        rc = 1
    finally:
        stop_sim.set()
        if sim_thread.is_alive():
            sim_thread.join(timeout=10)
        if tmp is not None:
            tmp.cleanup()
    return rc


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m jobdiagd_sim.demo",
        description="live demo: a simulated job trains, hangs; the daemon pages with triage, then reports the job end",
    )
    p.add_argument("--dir", type=Path, default=None, help="work dir (default: a fresh temp dir)")
    p.add_argument("--step-time", type=float, default=1.0)
    p.add_argument("--hang-after", type=int, default=25, metavar="N")
    p.add_argument("--timeout", type=float, default=240.0, help="give up after this many seconds")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(parse_args()))
