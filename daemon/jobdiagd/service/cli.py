"""Daemon subcommands: `run`, `status`, `notify-test`, `detectors`, `backtest` (argument parsing only)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from jobdiagd.config import DEFAULT_CONFIG_PATH, ConfigError, load_for_command
from jobdiagd.service import status_cli


def _run(args: argparse.Namespace) -> int:
    import asyncio

    from jobdiagd.alerts.store import StoreError
    from jobdiagd.privatefs import UnsafePathError
    from jobdiagd.service.runner import run_daemon

    try:
        asyncio.run(
            run_daemon(args.config, discover=args.discover, watch=[Path(w) for w in args.watch or []])
        )
    except (ConfigError, UnsafePathError, StoreError) as exc:
        # Start-up refusals: one line each, no traceback (the message says what to fix).
        print(f"jobdiagd run: {exc}", file=sys.stderr)
        return 2
    except ExceptionGroup as eg:
        for e in eg.exceptions:
            print(f"jobdiagd run: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _detectors(args: argparse.Namespace) -> int:
    from jobdiagd.detectors import registered

    cfg = load_for_command(args.config, "detectors")
    if cfg is None:
        return 2
    flags = cfg.detectors.enabled()
    print(f"{'name':<18} {'default':<8} {'enabled':<8} description")
    for d in registered():
        on = flags.get(d.name, d.default)
        print(f"{d.name:<18} {'on' if d.default else 'off':<8} {'yes' if on else 'no':<8} {d.description}")
    return 0


def _notify_test(args: argparse.Namespace) -> int:
    from jobdiagd.service.notifier_check import run_notify_test

    cfg = load_for_command(args.config, "notify-test")
    if cfg is None:
        return 2
    import asyncio

    return asyncio.run(run_notify_test(cfg, sys.stdout))


def _backtest(args: argparse.Namespace) -> int:
    from jobdiagd.service.backtest import main as backtest_main

    return backtest_main(args)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="run the watch daemon",
        description="Discover jobs (squeue, or job dirs under outputs roots), tail their logs, detect hangs, "
        "TGS slides and failure signatures every tick, alert, and answer `jobdiagd status`. "
        "SIGTERM drains and exits; SIGHUP reloads the config.",
    )
    p.add_argument(
        "--config", default=str(DEFAULT_CONFIG_PATH), help=f"config file (default {DEFAULT_CONFIG_PATH})"
    )
    p.add_argument(
        "--discover",
        choices=("auto", "slurm", "outputs"),
        default="auto",
        help="slurm: squeue; outputs: job dirs appearing under --watch / [slurm] outputs_roots; "
        "auto: slurm when squeue is installed and no --watch is given",
    )
    p.add_argument(
        "--watch", action="append", metavar="DIR", help="outputs root to watch without Slurm (repeatable)"
    )
    p.set_defaults(func=_run)

    status_cli.register(sub)

    p = sub.add_parser(
        "notify-test",
        help="send a test message through every configured notifier and say what worked",
        description="Checks each enabled notifier the way the daemon would use it: Telegram's token (getMe) "
        "and a silent test message to every chat in chat_ids; console and jsonl write a test notice. "
        "Each problem is named (bad token, unknown chat, missing permission). Exit 1 if anything failed.",
    )
    p.add_argument(
        "--config", default=str(DEFAULT_CONFIG_PATH), help=f"config file (default {DEFAULT_CONFIG_PATH})"
    )
    p.set_defaults(func=_notify_test)

    p = sub.add_parser("detectors", help="list the registered detectors and whether the config enables them")
    p.add_argument("--config", help="config file (default: built-in defaults)")
    p.set_defaults(func=_detectors)

    p = sub.add_parser(
        "backtest",
        help="replay finished jobs through the detectors on the log's own clock",
        description="Replay job logs through the same detectors the daemon runs, on a virtual clock built from "
        "the log (printed timestamps where present; otherwise one step series -- task 0's, or the first task "
        "printing steps -- moves it by its `seconds:`, other tasks' copies never do), and print the alerts that "
        "would have fired. at_s = seconds since the first `completed step:`.",
    )
    p.add_argument(
        "paths", nargs="+", metavar="PATH", help="job dir, .log file, or an outputs root (every job in it)"
    )
    p.add_argument("--config", help="config file for detector settings (default: built-in defaults)")
    p.add_argument("--tick", type=float, default=None, help="tick seconds (default: [daemon] tick_seconds)")
    p.add_argument(
        "--json",
        action="store_true",
        help='{"jobs": [{"job", "alerts": [{"kind", "at_step", "at_s", "class"}]}]}',
    )
    p.add_argument(
        "--site-prometheus",
        metavar="URL",
        help="a site Prometheus (the map of [site_prometheus] in --config) answers the early page's queries "
        "of jobs without TSDB data of their own, at the virtual time (docs/site-prometheus.md)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        metavar="N",
        help="N > 1: logs over 8 MiB are read by a forked process while the replay runs (default: min(2, CPUs))",
    )
    p.set_defaults(func=_backtest)
