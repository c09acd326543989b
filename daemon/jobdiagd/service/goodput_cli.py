"""`jobdiagd goodput` and `jobdiagd calibrate`: argument parsing only (the work: `goodput_cmd`, `calibrate_cmd`)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_span(text: str) -> float:
    """`7d`, `36h`, `90m`, `2w`, `600s` -> seconds."""
    m = _SPAN.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"expected a duration like 7d, 36h, 90m, 2w, got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers separated by commas, got {text!r}")
    return values


def _goodput(args: argparse.Namespace) -> int:
    from jobdiagd.service.goodput_cmd import main

    return main(args)


def _calibrate(args: argparse.Namespace) -> int:
    from jobdiagd.service.calibrate_cmd import main

    return main(args)


def _common(p: argparse.ArgumentParser) -> None:
    from jobdiagd.triage.cli import parse_now

    p.add_argument(
        "paths",
        nargs="*",
        metavar="OUTPUTS",
        help="outputs roots, job dirs or logs (default $JOBDIAGD_OUTPUTS or ./outputs)",
    )
    p.add_argument("--config", help="config file: state dir (incident store, cache), hang detector settings")
    p.add_argument("--json", action="store_true", help="print the JSON document instead of the table")
    p.add_argument(
        "--no-slurm", action="store_true", help="do not ask sacct/scontrol (times from the logs alone)"
    )
    p.add_argument("--now", type=parse_now, default=None, help="clock (epoch or ISO-8601; default: now)")
    p.add_argument(
        "--cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="cache dir (default: the state dir's goodput-cache, or ~/.cache/jobdiagd)",
    )
    p.add_argument("--no-cache", action="store_true", help="read every log again, keep nothing")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "goodput",
        help="where the GPU-hours went: the goodput ledger of every job chain, a table and a PNG",
        description="Account every second of every job chain (restarts linked) to queue, start-up, productive "
        "steps, checkpoint saves, stalls (last step -> page -> kill), progress redone and the rest, in GPU-hours; "
        "estimate what faster hang detection saved against a 30-minute log-mtime monitor; advise checkpoint "
        "intervals from the measured save cost, interruption rate and detection latency.",
    )
    _common(p)
    p.add_argument(
        "--since",
        type=parse_span,
        default=None,
        metavar="SPAN",
        help="only runs that ended (or run) within SPAN: 7d, 36h, 2w",
    )
    p.add_argument(
        "--by",
        choices=("week", "user", "partition", "class", "node"),
        default="week",
        help="rows of the table (default week)",
    )
    p.add_argument(
        "--png",
        type=Path,
        default=Path("goodput.png"),
        metavar="FILE",
        help="the picture (default ./goodput.png)",
    )
    p.add_argument("--no-png", action="store_true", help="do not render the picture")
    p.add_argument(
        "--digest",
        action="store_true",
        help="print the weekly digest the daemon sends ([goodput.digest]) for the 7 days before --now, "
        "its picture to --png",
    )
    p.add_argument(
        "--no-replay",
        action="store_true",
        help="hang pages only from the incident store, never from a replay",
    )
    p.add_argument(
        "--link-window",
        type=parse_span,
        default=24 * 3600.0,
        metavar="SPAN",
        help="a manual resubmit continues a run that ended at most SPAN before (default 24h)",
    )
    p.set_defaults(func=_goodput)

    p = sub.add_parser(
        "calibrate",
        help="replay the archive through the hang detector with a grid of budgets and propose the tightest safe one",
        description="Replays every job (the backtest) once per policy of a grid of stall factor x minimum stall x "
        "checkpoint budget, counts missed hangs, false pages and detection latency, prints the trade-off, and "
        "proposes per job configuration the tightest budget that caught every past hang with no false page, "
        "as a [detectors.hang] snippet.",
    )
    _common(p)
    p.add_argument(
        "--truth",
        type=Path,
        default=None,
        metavar="FILE",
        help='which jobs hung: JSON {"jobs": [{"job_id", "primary_failure"}]} (the simulator\'s manifest.json); default: each job\'s final triage',
    )
    p.add_argument(
        "--factors", type=_floats, default=None, metavar="F,F", help="stall factors to try (default 2,3,4,6)"
    )
    p.add_argument(
        "--min-stalls",
        type=_floats,
        default=None,
        metavar="S,S",
        help="minimum stalls in seconds (default 60,120,300)",
    )
    p.add_argument(
        "--checkpoint-budgets",
        type=_floats,
        default=None,
        metavar="S,S",
        help="checkpoint budgets in seconds (default 300,900,1800)",
    )
    p.add_argument("--tick", type=float, default=None, help="tick seconds (default: [daemon] tick_seconds)")
    p.add_argument(
        "--write", type=Path, default=None, metavar="FILE", help="write the [detectors.hang] snippet here"
    )
    p.set_defaults(func=_calibrate)
