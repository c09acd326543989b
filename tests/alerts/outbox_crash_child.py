"""Child process for the crash tests: queue (and maybe send) one notification, report, then hang until killed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import IncidentsConfig
from jobdiagd.model.alerts import Finding, Notification
from jobdiagd.notifiers.dispatcher import Dispatcher
from jobdiagd.notifiers.jsonl import JsonlNotifier

T0 = 1_800_000_000.0


class SendThenHang:
    """Delivers through the real JSONL notifier, then stops before the outbox can mark it sent."""

    name = "jsonl"

    def __init__(self, path: Path) -> None:
        self.inner = JsonlNotifier(path)

    def render(self, notification: Notification) -> str:
        return self.inner.render(notification)

    async def send(self, notification: Notification) -> None:
        await self.inner.send(notification)
        print("SENT", flush=True)
        await asyncio.sleep(3600)


async def main(mode: str, state_dir: Path) -> None:
    pipeline = AlertPipeline.open(state_dir, IncidentsConfig(), ["jsonl", "recorder"])
    finding = Finding("hang", "4242", "hang", "critical", "no step since step 316", at_step=316)
    added = pipeline.observe([finding], T0)
    print("ENQUEUED", ",".join(n.id for n in added), flush=True)
    if mode == "send":
        dispatcher = Dispatcher(pipeline.outbox, [SendThenHang(state_dir / "out.jsonl")], now=lambda: T0)
        await dispatcher.drain(T0)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
