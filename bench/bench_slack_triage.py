"""Benchmark: `/jobdiagd triage` of a 1 GiB log over Slack, through a running daemon and the real slack-sdk.

Not a test. The daemon runs in-process against the local Slack emulator (tests/helpers/emulators);
a user's slash command `/jobdiagd triage PATH` and `/jobdiagd triage ID` are injected as Socket
Mode envelopes. Printed, worst of `--repeat`: the ack latency (envelope sent -> ack received;
Slack's limit is 3 s), the "working…" latency (-> chat.postMessage received; target < 2 s),
the result latency (-> chat.update with the report; target < 60 s), both against `jobdiagd
triage` run directly on the same file in the same run (the baseline), and the event loop's
worst lateness while the command ran (ticks and alerts must not wait on it). The log is the
one bench_chat_triage.py builds (jobdiagd_sim.biglog).
Usage: .venv/bin/python bench/bench_slack_triage.py [--size-gb 1] [--repeat 2] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from tests.helpers.emulators.slack import SlackEmulator  # noqa: E402

from bench_chat_triage import NAME, lag_probe, make_log  # noqa: E402
from jobdiagd.service.engine import Engine  # noqa: E402
from jobdiagd.service.lifecycle import Lifecycle  # noqa: E402
from jobdiagd.service.runner import run_daemon  # noqa: E402

CHANNEL, USER = "C0BENCH01", "U0BENCH01"


async def one(em: SlackEmulator, text: str) -> tuple[float, float, float, str, float]:
    """(ack latency, working… latency, result latency, result text, worst loop lateness) of one command."""
    lags: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.create_task(lag_probe(stop, lags))
    seen = {m.ts for m in em.bot_messages(CHANNEL)}
    t0 = time.time()
    env_id = await em.slash(CHANNEL, USER, text)
    placeholder = await em.wait_for(
        lambda: next((m for m in em.bot_messages(CHANNEL) if m.ts not in seen), None), "working…", 30
    )
    acked = em.envelopes[env_id].acked_at
    working = next(c.at for c in em.calls_of("chat.postMessage") if c.at >= t0)
    await em.wait_for(lambda: placeholder.edits, "the result", 300)
    done = next(c.at for c in em.calls_of("chat.update") if c.params.get("ts") == placeholder.ts)
    stop.set()
    await probe
    assert acked is not None
    return acked - t0, working - t0, done - t0, placeholder.visible, max(lags, default=0.0)


async def run(job_dir: Path, repeat: int) -> None:
    em = SlackEmulator()
    await em.start()
    em.add_channel(CHANNEL, "bench")
    em.add_user(USER, "bencher")
    with tempfile.TemporaryDirectory(prefix="jdd-bench-", dir="/tmp") as tmp:
        work = Path(tmp)
        (work / "watch").mkdir()
        (work / "bot").write_text(em.bot_token)
        (work / "app").write_text(em.app_token)
        cfg = work / "cfg.toml"
        cfg.write_text(
            f"""
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jd.sock"
tick_seconds = 1
log_level = "error"
[slurm]
outputs_roots = ["{job_dir.parent}"]
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
[notifiers.slack]
enabled = true
token_file = "{work}/bot"
app_token_file = "{work}/app"
channel_ids = ["{CHANNEL}"]
allowed_users = ["{USER}"]
api_base_url = "{em.base_url}"
"""
        )
        got: dict[str, object] = {}
        ready = asyncio.Event()

        def started(lc: Lifecycle, engine: Engine) -> None:
            got["lc"] = lc
            ready.set()

        daemon = asyncio.create_task(
            run_daemon(
                cfg,
                discover="outputs",
                watch=[work / "watch"],
                handle_signals=False,
                on_started=started,
                configure_logs=False,
            )
        )
        await ready.wait()
        await em.wait_connected()
        baseline = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "jobdiagd.cli",
                "triage",
                str(job_dir),
                "--no-slurm",
                stdout=asyncio.subprocess.DEVNULL,
            )
            assert await proc.wait() == 0
            baseline.append(time.perf_counter() - t0)
        base = min(baseline)
        log = job_dir.parent / (NAME + ".log")
        print(f"log: {log} ({log.stat().st_size / 2**30:.2f} GiB)")
        print(f"baseline `jobdiagd triage DIR --no-slurm`: {base:.2f} s (best of {repeat})")
        for text in (f"triage {job_dir}", "triage 990001"):
            rows = [await one(em, text) for _ in range(repeat)]
            ack = max(r[0] for r in rows)
            w = max(r[1] for r in rows)
            res = max(r[2] for r in rows)
            lag = max(r[4] for r in rows)
            ok = "Status:" in rows[-1][3] or "Full report attached" in rows[-1][3]
            what = "PATH" if "/" in text.split()[1] else "ID"
            print(
                f"/jobdiagd triage {what}: ack {ack * 1000:.0f} ms (Slack's limit 3 s), working… {w:.2f} s "
                f"(target < 2 s), result {res:.2f} s (target < 60 s) = {res / base:.2f}x the CLI; worst "
                f"event-loop lateness {lag * 1000:.0f} ms; report {'ok' if ok else 'MISSING'} (worst of {repeat})"
            )
        lc = got["lc"]
        assert isinstance(lc, Lifecycle)
        lc.request_stop("bench done")
        await daemon
    await em.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    out_dir = HERE / "out" / "outputs"
    job_dir = make_log(out_dir, args.size_gb, args.nodes)
    try:
        asyncio.run(run(job_dir, args.repeat))
    finally:
        if not args.keep:
            (out_dir / f"{NAME}.log").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
