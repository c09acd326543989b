"""`jobdiagd nodes`: the suspect nodes in the daemon's state store, with the jobs and evidence
behind each (rule REC-21), and `jobdiagd recovery-log`: the recovery actions taken (rule REC-15).

Both read the state dir's store (SQLite in WAL mode: safe beside the running daemon) and must run
as the daemon's user, who owns the state dir.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from jobdiagd import clock
from jobdiagd.config import DEFAULT_CONFIG_PATH, load_for_command


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "nodes",
        help="list suspect nodes: the failures each was named in, across jobs",
        description="Every diagnosis that names nodes (a hang's suspect hosts, node-fail hosts, ECC, GPU-health "
        "and network outliers) is recorded per node; the score decays with [recovery] node_half_life_days. "
        "Exit 0 with or without suspects, 2 when the config or state store cannot be read.",
    )
    p.add_argument(
        "--config", default=None, help=f"config file (default: built-in defaults; {DEFAULT_CONFIG_PATH})"
    )
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.add_argument("--min-score", type=float, default=0.1, help="hide nodes scoring less (default 0.1)")
    p.set_defaults(func=_nodes)

    p = sub.add_parser(
        "recovery-log",
        help="list recovery actions: who or what, why (rule id), the exact command",
        description="The recovery actions and declines recorded in the state store, oldest first.",
    )
    p.add_argument("--config", default=None, help="config file (default: built-in defaults)")
    p.add_argument("--job", default=None, help="only this job id")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(func=_log)


def _open(args: argparse.Namespace, command: str) -> tuple[Any, Any]:
    from jobdiagd.alerts.store import AlertStore, StoreError
    from jobdiagd.privatefs import UnsafePathError

    cfg = load_for_command(args.config, command)
    if cfg is None:
        return None, None
    try:
        return cfg, AlertStore.in_state_dir(cfg.daemon.state_dir)
    except (StoreError, UnsafePathError, OSError) as exc:
        print(f"jobdiagd {command}: {exc}", file=sys.stderr)
        return None, None


def _nodes(args: argparse.Namespace) -> int:
    from jobdiagd.recovery.nodes import NodeMemory, render_suspects, summary

    cfg, store = _open(args, "nodes")
    if cfg is None or store is None:
        return 2
    now = clock.wall()
    try:
        memory = NodeMemory(store, half_life_days=cfg.recovery.node_half_life_days)
        suspects = memory.suspects(now, args.min_score)
    finally:
        store.close()
    if args.json:
        doc = {
            "now": now,
            "half_life_days": cfg.recovery.node_half_life_days,
            "notice_score": cfg.recovery.node_notice_score,
            "nodes": [
                {
                    "node": s.node,
                    "score": s.score,
                    "summary": summary(s, now),
                    "jobs": s.jobs,
                    "records": [asdict(r) for r in s.records],
                }
                for s in suspects
            ],
        }
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render_suspects(suspects, now))
    return 0


def _log(args: argparse.Namespace) -> int:
    from jobdiagd.recovery.book import RecoveryBook
    from jobdiagd.recovery.messages import action_text

    cfg, store = _open(args, "recovery-log")
    if cfg is None or store is None:
        return 2
    try:
        entries = RecoveryBook(store).entries(args.job, limit=10_000)
    finally:
        store.close()
    if args.json:
        print(json.dumps([asdict(e) | {"command": e.command} for e in entries], indent=2, sort_keys=True))
    else:
        for e in entries:
            stamp = datetime.fromtimestamp(e.at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            print(f"{stamp}  job {e.job_id}  {action_text(e)}")
    return 0
