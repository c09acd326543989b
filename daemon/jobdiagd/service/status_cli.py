"""`jobdiagd status`: ask the running daemon over its socket, judge its health, print it for people.

Snapshot keys the daemon's "status" command provides (all optional except tick_seconds; Health.base()
gives the first line): version, pid, started_at, tick_seconds, last_tick_at, last_tick_ok, ticks, sources,
  jobs: [{job_id, state?, name?, last_step?, last_step_at?, total_steps?, step_time_s?, expected_step?,
         phase?, tgs?: {degraded, pattern, change_pct}, open_incidents?, blind?}], open_incidents: [Incident as dict],
  mutes: [Mute as dict], notifiers: Dispatcher.snapshot(),
  deliveries: Outbox.counts(), recovery: {mode, acts, pending: [{job_id, status, due_at, action, rule}]}.

Exit codes, worst last: 0 healthy; 1 degraded (ticking, but a source such as squeue or a notifier
fails, or a job is blind: pages may be late or missing); 2 usage or bad config (argparse's own
code); 3 not monitoring (no daemon, no answer, or its ticks are stale or failing). The header
says OK, DEGRADED or UNHEALTHY and names what fails; `--json` adds `state` and `degraded`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobdiagd import jsonsafe
from jobdiagd.config import DEFAULT_CONFIG_PATH, DaemonConfig, load_for_command
from jobdiagd.durations import rounded_duration
from jobdiagd.service.health import assess
from jobdiagd.service.status_socket import StatusUnavailable, request

EXIT_OK = 0
EXIT_DEGRADED = 1
EXIT_USAGE = 2
EXIT_DOWN = 3
EXIT_NOT_RUNNING = EXIT_DOWN
EXIT_UNHEALTHY = EXIT_DOWN


def _ago(now: float, t: Any) -> str:
    return "never" if t is None else f"{rounded_duration(now - float(t))} ago"


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


# `/status` in a chat: a monospace block no wider than this. A phone shows about 40 columns of
# a code block in a chat bubble at the default font size (a 360-point-wide screen, ~8.5-point
# characters); wider lines wrap mid-column there, and the table stops reading as one.
PHONE_COLUMNS = 40


def format_status(status: Mapping[str, Any], now: float, *, width: int | None = None) -> str:
    """The human view of one status snapshot (pure; `now` is the daemon's clock from the reply).

    `width`: at most this many columns a line (a chat on a phone, PHONE_COLUMNS, rule CHAT-5):
    a job's columns go on lines of their own under its id, and long texts wrap, indented.
    """
    lines = _head_lines(status, now)
    if width is not None:  # the verdict on lines of its own, a problem a line
        last_tick, _, verdict = lines[1].partition("  ")
        state, _, problems = verdict.partition(": ")
        lines[1:] = [last_tick, f"{state}:" if problems else state]
        lines += [f"  {p}" for p in problems.split("; ") if p]
    jobs: Sequence[Mapping[str, Any]] = status.get("jobs") or []
    lines.append(f"jobs watched: {len(jobs)}")
    for j in jobs:
        parts = _job_parts(j, now)
        lines += [_job_line(j, now)] if width is None else _packed(parts[:3], parts[3:], width)
    lines += _incident_lines(status, now)
    lines += _recovery_lines(status, now)
    mutes: Sequence[Mapping[str, Any]] = status.get("mutes") or []
    for m in mutes:
        lines.append(
            f"muted: job {m.get('job_id')} kind {m.get('kind')} until {_clock(float(m.get('until', 0)))}"
        )
    lines += _source_lines(status, now)
    lines += _notifier_lines(status, now)
    if width is not None:
        lines = [w for line in lines for w in _wrapped(line, width)]
    return "\n".join(lines) + "\n"


def _packed(first: Sequence[str], rest: Sequence[str], width: int) -> list[str]:
    """A job for a phone: its id, state and name on one line, its columns packed under it."""
    out = ["  " + " ".join(p.strip() for p in first if p.strip())]
    line = ""
    for part in filter(None, rest):
        if line and len(line) + 3 + len(part) > width:
            out.append(line)
            line = ""
        line = f"{line} · {part}" if line else f"    {part}"
    if line:
        out.append(line)
    return out


def _wrapped(line: str, width: int) -> list[str]:
    """`line` in lines of at most `width` columns, continuations indented: broken between its
    columns (two spaces) or after a "," or ";" where it can, inside a text only when it must."""
    if len(line) <= width:
        return [line]
    lead = line[: len(line) - len(line.lstrip())]
    indent = lead + "  "
    out: list[str] = []
    cur = ""
    for piece in _BREAKS.split(line.strip()):
        room = width - len(indent if out or cur else lead)
        if cur and len(cur) + 1 + len(piece) <= room:
            cur += " " + piece
            continue
        if cur:
            out.append(cur)
        cur = piece
        if len(cur) > width - len(indent):
            *full, cur = textwrap.wrap(cur, width - len(indent), break_on_hyphens=False) or [cur]
            out += full
    out.append(cur)
    return [(lead if i == 0 else indent) + text for i, text in enumerate(out)]


_BREAKS = re.compile(r"(?<=[;,]) |  +")


def _head_lines(status: Mapping[str, Any], now: float) -> list[str]:
    """Version, pid, uptime; the last tick and the health verdict."""
    health = assess(status, now)
    head = f"jobdiagd {status.get('version', '?')}"
    if status.get("pid") is not None:
        head += f" (pid {status['pid']})"
    if status.get("started_at") is not None:
        head += f", up {rounded_duration(now - float(status['started_at']))}"
    if not health.ok:
        verdict = "UNHEALTHY: " + "; ".join(health.problems + health.degraded)
    elif health.degraded:
        verdict = "DEGRADED: " + "; ".join(health.degraded)
    else:
        verdict = "OK"
    return [
        head,
        f"last tick: {_ago(now, status.get('last_tick_at'))} (every {rounded_duration(float(status.get('tick_seconds') or 0))})"
        f"  {verdict}",
    ]


def _job_line(j: Mapping[str, Any], now: float) -> str:
    """One watched job: its step, then the detectors' columns, open incidents and blind files."""
    return "  ".join(p for p in _job_parts(j, now) if p).rstrip()


def _job_parts(j: Mapping[str, Any], now: float) -> list[str]:
    """A job's columns: id, state and name (padded for a terminal), then its facts."""
    parts = [
        f"  {j.get('job_id', '?'):<10}",
        f"{j.get('state', '') or '-':<10}",
        str(j.get("name") or ""),
    ]
    if j.get("last_step") is not None:
        total = f"/{j['total_steps']}" if j.get("total_steps") else ""
        parts.append(
            f"step {j['last_step']}{total}"
            + (f" ({_ago(now, j['last_step_at'])})" if j.get("last_step_at") else "")
        )
    parts += _hang_parts(j) + _tgs_parts(j)
    gpu = j.get("gpu_check")
    if isinstance(gpu, Mapping) and gpu.get("state"):
        parts.append(f"GPUs: {gpu['state']}")
    if j.get("open_incidents"):
        parts.append("open: " + ", ".join(map(str, j["open_incidents"])))
    if j.get("blind"):
        parts.append("BLIND: " + ", ".join(map(str, j["blind"])))
    return parts


def _hang_parts(j: Mapping[str, Any]) -> list[str]:
    """The hang detector's columns: steady step time, expected step, budget phase."""
    parts: list[str] = []
    if j.get("step_time_s"):
        parts.append(f"{float(j['step_time_s']):.1f} s/step")
    if j.get("expected_step") is not None and j.get("expected_step") != j.get("last_step"):
        parts.append(f"expected ≈{j['expected_step']}")
    if j.get("phase"):
        parts.append(f"[{j['phase']}]")
    return parts


def _tgs_parts(j: Mapping[str, Any]) -> list[str]:
    """The TGS detector's column: the change vs baseline, and the episode's pattern."""
    tgs = j.get("tgs")
    if not isinstance(tgs, Mapping) or tgs.get("change_pct") is None:
        return []
    flag = f" DEGRADED ({tgs.get('pattern')})" if tgs.get("degraded") else ""
    return [f"TGS {float(tgs['change_pct']):+.0f}%{flag}"]


def _incident_lines(status: Mapping[str, Any], now: float) -> list[str]:
    incidents: Sequence[Mapping[str, Any]] = status.get("open_incidents") or []
    lines = [f"open incidents: {len(incidents)}"]
    for i in incidents:
        line = f"  job {i.get('job_id')}  {i.get('kind')} [{i.get('severity')}]  open {_ago(now, i.get('opened_at')).removesuffix(' ago')}"
        if i.get("acked_at") is not None:
            line += f"  acked{' by ' + str(i['acked_by']) if i.get('acked_by') else ''}"
        if i.get("announced_at") is None:
            line += "  (muted, not announced)"
        lines.append(line)
        if i.get("summary"):
            lines.append(f"      {i['summary']}")
    return lines


def _recovery_lines(status: Mapping[str, Any], now: float) -> list[str]:
    """Restarts not finished (docs/recovery.md): the countdowns, the suggestions, those running."""
    rec = status.get("recovery")
    if not isinstance(rec, Mapping) or not (rec.get("acts") or rec.get("pending")):
        return []
    pending: Sequence[Mapping[str, Any]] = rec.get("pending") or []
    lines = [f"recovery ({rec.get('mode')}): {len(pending)} pending"]
    for p in pending:
        when = ""
        if p.get("status") == "scheduled" and isinstance(p.get("due_at"), int | float):
            left = float(p["due_at"]) - now
            when = f" in {rounded_duration(left)}" if left > 0 else " now"
        lines.append(f"  job {p.get('job_id')}  {p.get('status')}{when}  {p.get('action')} (rule {p.get('rule')})")
    return lines


def _source_lines(status: Mapping[str, Any], now: float) -> list[str]:
    sources: Mapping[str, Mapping[str, Any]] = status.get("sources") or {}
    if not sources:
        return []
    lines = ["sources:"]
    for name, s in sorted(sources.items()):
        if s.get("failing"):
            lines.append(
                f"  {name}: FAILING since {_ago(now, s.get('failing_since'))}"
                f" ({s.get('failures')} failures): {s.get('last_error')}"
            )
        else:
            lines.append(f"  {name}: ok")
    site: Mapping[str, Any] = status.get("site_prometheus") or {}
    if site:
        line = f"  site_prometheus: {site.get('server')}, {site.get('queries')} queries ({site.get('answers')} answers)"
        if site.get("disabled"):
            line += f"; not used: {site['disabled']}"
        elif not site.get("checked"):
            line += "; metric map not checked yet"
        lines.append(line)
    return lines


def _notifier_lines(status: Mapping[str, Any], now: float) -> list[str]:
    notifiers: Mapping[str, Mapping[str, Any]] = status.get("notifiers") or {}
    deliveries: Mapping[str, Mapping[str, int]] = status.get("deliveries") or {}
    if not notifiers and not deliveries:
        return []
    lines = ["notifiers:"]
    for name in sorted(set(notifiers) | set(deliveries)):
        n = notifiers.get(name, {})
        d = deliveries.get(name, {})
        line = f"  {name}: {d.get('sent', n.get('sent', 0))} sent, {d.get('pending', 0)} pending"
        if d.get("dead"):
            line += f", {d['dead']} abandoned"
        if n.get("failing"):
            line += f"; FAILING since {_ago(now, n.get('failing_since'))}: {n.get('last_error')}"
        lines.append(line)
    return lines


def socket_path_from(args: argparse.Namespace) -> Path | None:
    """--socket, else the config's (the default file when it exists, else the built-in default);
    None when the config does not load (reported on stderr)."""
    if args.socket:
        return Path(args.socket)
    cfg_path = Path(args.config) if args.config else DEFAULT_CONFIG_PATH
    if not args.config and not cfg_path.exists():
        return DaemonConfig().socket_path
    cfg = load_for_command(cfg_path, "status")
    return cfg.daemon.socket_path if cfg is not None else None


def run_status(args: argparse.Namespace) -> int:
    path = socket_path_from(args)
    if path is None:
        return EXIT_USAGE
    try:
        reply = request(path, "status", timeout=args.timeout)
    except StatusUnavailable as exc:
        if args.json:
            print(json.dumps({"running": False, "healthy": False, "state": "down", "error": str(exc)}))
        else:
            print(f"jobdiagd status: {exc}", file=sys.stderr)
        return EXIT_NOT_RUNNING
    if not reply.get("ok"):
        print(f"jobdiagd status: daemon error: {reply.get('error')}", file=sys.stderr)
        return EXIT_DOWN
    status = reply.get("result") or {}
    now = float(reply.get("now") or 0)
    health = assess(status, now)
    if args.json:
        out = {
            "running": True,
            "healthy": health.state == "ok",
            "state": health.state,
            "problems": health.problems,
            "degraded": health.degraded,
            "now": now,
            "status": status,
        }
        print(jsonsafe.dumps(out, indent=2, sort_keys=True, default=str))
    else:
        sys.stdout.write(format_status(status, now))
    return {"ok": EXIT_OK, "degraded": EXIT_DEGRADED}.get(health.state, EXIT_DOWN)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "status",
        help="show the running daemon's state",
        description="Ask the running daemon for its state. Exit 0 healthy; 1 degraded (a source "
        "such as squeue or a notifier failing, or a job's log blind); 2 bad config; 3 not "
        "monitoring (not running, not answering, or last tick older than 3 x tick_seconds / failed).",
    )
    p.add_argument("--config", help=f"config file naming the socket (default {DEFAULT_CONFIG_PATH})")
    p.add_argument("--socket", help="status socket path (overrides --config)")
    p.add_argument("--json", action="store_true", help="print the raw status as JSON")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for an answer")
    p.set_defaults(func=run_status)
