"""`jobdiagd diagnose` and `jobdiagd compare`: triage the job(s), reach the TSDB, run the playbook, print the report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobdiagd import clock, jsonsafe
from jobdiagd.tsdb.playbooks import PLAYBOOK_NAMES

if TYPE_CHECKING:
    from jobdiagd.tsdb.context import DiagnosisContext
    from jobdiagd.tsdb.settings import TsdbSettings

# What a subcommand needs (aiohttp, asyncssh, the playbooks) is imported when it runs: `jobdiagd
# --help` and the other subcommands load this module only to register diagnose and compare.

EXIT_OK, EXIT_USAGE, EXIT_WRONG_DB, EXIT_ACCESS = 0, 2, 3, 4


def _triage_doc(path: str, args: argparse.Namespace, now: float) -> dict[str, Any]:
    if args.triage_json:
        doc = json.loads(Path(args.triage_json).read_text())
        return dict(doc)
    try:
        from jobdiagd.triage.engine import triage  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        raise SystemExit(f"jobdiagd diagnose: triage engine unavailable ({exc}); pass --triage-json") from exc
    outputs_root = Path(args.outputs_root) if args.outputs_root else None
    result = triage(Path(path), now=now, slurm_state=args.slurm_state, outputs_root=outputs_root)
    return dict(result.to_dict())


def _settings(args: argparse.Namespace) -> TsdbSettings:
    from jobdiagd.tsdb.settings import load_settings

    s = load_settings(Path(args.config) if args.config else None)
    if args.prometheus:
        from dataclasses import replace

        s = replace(s, prometheus_binary=args.prometheus)
    return s


def _logs_to_stderr() -> None:
    """Reports go to stdout (and may be JSON); log lines must not mix into them."""
    import structlog

    if not structlog.is_configured():
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    p.add_argument(
        "--config", help="TOML file with a [tsdb] table (prometheus_binary, thresholds, gpu_profiles, ssh)"
    )
    p.add_argument("--prometheus", help="prometheus binary (overrides tsdb.prometheus_binary)")
    p.add_argument(
        "--outputs", "--outputs-root", dest="outputs_root", help="outputs/ root for resolving job ids"
    )
    p.add_argument("--slurm-state", help="Slurm state if known (RUNNING, COMPLETED, ...)")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = subparsers.add_parser("diagnose", help="TSDB diagnosis of one job (runbook 'TSDB Diagnosis')")
    d.add_argument("path", help="job log, job directory or Slurm job id")
    d.add_argument("--playbook", choices=PLAYBOOK_NAMES, help="default: chosen from the triage class")
    d.add_argument("--triage-json", help="use this triage JSON document instead of running triage")
    d.add_argument("--no-anomaly", action="store_true", help="skip the earliest-anomaly sweep")
    _common(d)
    d.set_defaults(func=run_diagnose)
    c = subparsers.add_parser(
        "compare", help="compare two jobs by training step (runbook 'Multi-Job Comparison')"
    )
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument(
        "--triage-json", nargs=2, metavar=("A_JSON", "B_JSON"), help="triage JSON documents for A and B"
    )
    _common(c)
    c.set_defaults(func=run_compare)


def _errors(fn: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        from jobdiagd.tsdb.access import AccessError
        from jobdiagd.tsdb.client import PromError
        from jobdiagd.tsdb.discovery import WrongDatabase

        try:
            return int(fn(args))
        except WrongDatabase as exc:
            print(f"jobdiagd: wrong database, refusing to diagnose: {exc}", file=sys.stderr)
            return EXIT_WRONG_DB
        except (AccessError, PromError) as exc:
            print(f"jobdiagd: {exc}", file=sys.stderr)
            return EXIT_ACCESS
        except ValueError as exc:
            print(f"jobdiagd: {exc}", file=sys.stderr)
            return EXIT_USAGE

    return wrapped


@_errors
def run_diagnose(args: argparse.Namespace) -> int:
    import asyncio

    from jobdiagd.tsdb.context import context_from_triage
    from jobdiagd.tsdb.engine import diagnose
    from jobdiagd.tsdb.report import to_json, to_markdown

    _logs_to_stderr()
    now = clock.wall()
    ctx = context_from_triage(_triage_doc(args.path, args, now))
    settings = _settings(args)
    result = asyncio.run(
        diagnose(ctx, settings, now=now, playbook=args.playbook, with_anomaly=not args.no_anomaly)
    )
    if args.json:
        print(jsonsafe.dumps(to_json(result), indent=2, default=str))
    else:
        print(to_markdown(result), end="")
    return EXIT_OK


@_errors
def run_compare(args: argparse.Namespace) -> int:
    import asyncio

    from jobdiagd.tsdb.compare import compare, to_json, to_markdown
    from jobdiagd.tsdb.context import context_from_triage

    _logs_to_stderr()
    now = clock.wall()
    ctxs: list[DiagnosisContext] = []
    for i, path in enumerate((args.a, args.b)):
        ns = argparse.Namespace(**vars(args))
        ns.triage_json = args.triage_json[i] if args.triage_json else None
        ctxs.append(context_from_triage(_triage_doc(path, ns, now)))
    result = asyncio.run(compare(ctxs[0], ctxs[1], _settings(args), now=now))
    if args.json:
        print(jsonsafe.dumps(to_json(result), indent=2, default=str))
    else:
        print(to_markdown(result), end="")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """`python -m jobdiagd.tsdb.cli diagnose|compare ...`: the same subcommands without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="jobdiagd")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
