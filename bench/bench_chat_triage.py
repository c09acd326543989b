"""Benchmark: `/triage` of a 1 GiB log over Telegram, through a running daemon and the real PTB client.

Not a test. The daemon runs in-process against the local Telegram Bot API emulator
(tests/helpers/emulators); a user's `/triage PATH` and `/triage ID` are injected as updates.
Printed: the "working…" latency (command injected -> placeholder received by the emulator;
target < 2 s), the result latency (-> the report edited in; target < 60 s), both against
`jobdiagd triage` run directly on the same file in the same run (the baseline), and the
event loop's worst lateness while the command ran (ticks and alerts must not wait on it).
Usage: .venv/bin/python bench/bench_chat_triage.py [--size-gb 1] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.helpers.emulators.telegram import TelegramEmulator  # noqa: E402

from jobdiagd.service.engine import Engine  # noqa: E402
from jobdiagd.service.lifecycle import Lifecycle  # noqa: E402
from jobdiagd.service.runner import run_daemon  # noqa: E402

CHAT, USER = -1001, 501
NAME = "990001-JAX-llama2-70b-bench"


def make_log(out_dir: Path, size_gb: float, nodes: int) -> Path:
    log = out_dir / f"{NAME}.log"
    job_dir = out_dir / NAME
    job_dir.mkdir(parents=True, exist_ok=True)
    if not (job_dir / "log").is_symlink():
        (job_dir / "log").symlink_to(f"../{NAME}.log")
    want = int(size_gb * (1 << 30))
    if not log.exists() or log.stat().st_size < want:
        cmd = [
            sys.executable,
            "-m",
            "jobdiagd_sim.biglog",
            str(log),
            "--size-gb",
            str(size_gb),
            "--nodes",
            str(nodes),
        ]
        subprocess.run(cmd, check=True)
    subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    return job_dir


async def lag_probe(stop: asyncio.Event, out: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(0.02)
        out.append(loop.time() - t - 0.02)


async def one(em: TelegramEmulator, text: str) -> tuple[float, float, str, float]:
    """(working… latency, result latency, result text, worst loop lateness) of one command."""
    lags: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.create_task(lag_probe(stop, lags))
    t0 = time.time()
    mid = await em.send_command(CHAT, USER, text)
    placeholder = await em.wait_for(
        lambda: next((m for m in em.bot_messages(CHAT) if m.reply_to == mid), None), "working…", 30
    )
    working = next(
        c.at
        for c in em.calls_of("sendMessage")
        if c.params.get("reply_parameters", {}).get("message_id") == mid
    )
    await em.wait_for(lambda: placeholder.edits, "the result", 300)
    done = next(
        c.at
        for c in em.calls
        if c.method == "editMessageText" and str(c.params.get("message_id")) == str(placeholder.message_id)
    )
    stop.set()
    await probe
    return working - t0, done - t0, placeholder.text or "", max(lags, default=0.0)


async def run(job_dir: Path, repeat: int) -> None:
    em = TelegramEmulator()
    await em.start()
    em.add_chat(CHAT)
    with tempfile.TemporaryDirectory(prefix="jdd-bench-", dir="/tmp") as tmp:
        work = Path(tmp)
        (work / "watch").mkdir()
        (work / "tok").write_text(em.token)
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
[notifiers.telegram]
enabled = true
token_file = "{work}/tok"
chat_ids = [{CHAT}]
allowed_users = [{USER}]
api_base_url = "{em.base_url}"
poll_timeout_seconds = 1
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
        await em.wait_for(lambda: em.calls_of("getUpdates"), "polling", 30)
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
        print(
            f"log: {job_dir.parent / (NAME + '.log')} ({(job_dir.parent / (NAME + '.log')).stat().st_size / 2**30:.2f} GiB)"
        )
        print(f"baseline `jobdiagd triage DIR --no-slurm`: {base:.2f} s (best of {repeat})")
        for text in (f"/triage {job_dir}", "/triage 990001"):
            rows = [await one(em, text) for _ in range(repeat)]
            w = max(r[0] for r in rows)
            res = max(r[1] for r in rows)
            lag = max(r[3] for r in rows)
            ok = "Status:" in rows[-1][2] or "Full report attached" in rows[-1][2]
            print(
                f"{text.split()[0]} {'PATH' if '/' in text.split()[1] else 'ID'}: working… {w:.2f} s (target < 2 s), "
                f"result {res:.2f} s (target < 60 s) = {res / base:.2f}x the CLI; worst event-loop lateness "
                f"{lag * 1000:.0f} ms; report {'ok' if ok else 'MISSING'} (worst of {repeat})"
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
