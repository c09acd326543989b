"""Command-line entry point: argument parsing only; each subcommand lives with its subsystem."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

# Each module exposes `register(subparsers) -> None`, adding one subcommand whose
# `func(args) -> int` attribute runs it. Modules that fail to import (an optional
# subsystem not built yet) are skipped so the rest of the CLI still works.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "jobdiagd.triage.cli",
    "jobdiagd.tsdb.cli",
    "jobdiagd.service.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jobdiagd",
        description="Monitor and diagnose multi-node MaxText/JAX training jobs.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        register: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None] = module.register
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
