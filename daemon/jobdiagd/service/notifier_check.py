"""`jobdiagd notify-test`: one test message through each configured notifier, and a line per check saying what worked."""

from __future__ import annotations

import socket
from typing import TextIO

from jobdiagd import clock
from jobdiagd.alerts.incidents import make_notice
from jobdiagd.config import Config
from jobdiagd.notifiers.base import ChatTransport, CheckResult, NotifierError
from jobdiagd.notifiers.registry import build_notifiers


async def run_notify_test(cfg: Config, out: TextIO) -> int:
    """0 when every enabled notifier delivered its test message, else 1 (each failure named)."""
    now = clock.wall()
    text = f"jobdiagd notify-test from {socket.gethostname()}: this notifier works."
    notifiers, skipped = build_notifiers(cfg)
    results: list[tuple[str, CheckResult]] = []
    for line in skipped:
        name, _, why = line.partition(": ")
        results.append((name, CheckResult("setup", False, why)))
    for n in notifiers:
        if isinstance(n, ChatTransport):
            results += [(n.name, r) for r in await n.check(text)]
            continue
        note = make_notice(f"notify-test:{int(now * 1000)}", "notify-test", text, now)
        try:
            await n.send(note)
            results.append((n.name, CheckResult("send", True, "test notice written")))
        except NotifierError as exc:
            results.append((n.name, CheckResult("send", False, str(exc))))
    for name, r in results:
        print(f"{name:<10} {r.what:<22} {'ok  ' if r.ok else 'FAIL'}  {r.detail}", file=out)
    failed = [r for _, r in results if not r.ok]
    print(f"notify-test: {len(results) - len(failed)} ok, {len(failed)} failed", file=out)
    return 1 if failed else 0
