"""Command-line entry point: argument parsing only; each subcommand lives with its subsystem."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

# Each module exposes `register(subparsers) -> None`, adding one subcommand whose
# `func(args) -> int` attribute runs it. A module that fails to import is a packaging bug:
# the error propagates rather than the subcommand silently vanishing.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "jobdiagd.triage.cli",
    "jobdiagd.tsdb.cli",
    "jobdiagd.service.cli",
    "jobdiagd.service.goodput_cli",
    "jobdiagd.recovery.cli",
)


# A command known to live in one module imports only that module (`jobdiagd status` does not
# load the TSDB client, `triage` not the daemon); without one (`--help`, a typo) every module
# registers its subcommands. Those modules import what a subcommand needs when it runs, so
# registering is cheap (bench/bench_startup.py).
COMMAND_MODULE: dict[str, str] = {
    "triage": "jobdiagd.triage.cli",
    "diagnose": "jobdiagd.tsdb.cli",
    "compare": "jobdiagd.tsdb.cli",
    "status": "jobdiagd.service.status_cli",
    "run": "jobdiagd.service.cli",
    "notify-test": "jobdiagd.service.cli",
    "detectors": "jobdiagd.service.cli",
    "backtest": "jobdiagd.service.cli",
    "goodput": "jobdiagd.service.goodput_cli",
    "calibrate": "jobdiagd.service.goodput_cli",
    "nodes": "jobdiagd.recovery.cli",
    "recovery-log": "jobdiagd.recovery.cli",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jobdiagd",
        description="Monitor and diagnose multi-node MaxText/JAX training jobs.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    only = COMMAND_MODULE.get(command or "")
    for name in (only,) if only else SUBCOMMAND_MODULES:
        module = importlib.import_module(name)
        register: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None] = module.register
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(words)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
