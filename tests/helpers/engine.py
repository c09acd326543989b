"""The daemon's engine in-process over a state dir (a restart = a new `Daemon`), and what it sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.alerts.store import DB_NAME
from jobdiagd.config import Config, loads
from jobdiagd.detectors import build
from jobdiagd.service.discovery import OutputsDiscovery
from jobdiagd.service.engine import Engine
from jobdiagd.service.recovery_wiring import RecoveryWiring
from jobdiagd.sources.tail import ChangeWatcher, OffsetStore

T0 = 1_780_000_000.0


def make_cfg(state: Path, extra: str = "") -> Config:
    return loads(
        f"""
[daemon]
state_dir = "{state}"
socket_path = "{state}/s.sock"
tick_seconds = 15
[detectors.hang]
min_stall_seconds = 120
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
{extra}"""
    )


class Daemon:
    """One daemon incarnation: pipeline + offsets + engine over a state dir (a restart = a new one)."""

    def __init__(
        self,
        state: Path,
        outputs: Path,
        watcher: ChangeWatcher | None = None,
        *,
        extra: str = "",
        recovery: bool = False,
    ) -> None:
        """`extra`: TOML appended to the config; `recovery`: the recovery stage on the tick's
        clock (`self.now`, the last tick's time)."""
        state.mkdir(parents=True, exist_ok=True)
        self.cfg = make_cfg(state, extra)
        self.pipeline = AlertPipeline.open(state, self.cfg.incidents, ["jsonl"])
        self.offsets = OffsetStore(state / DB_NAME)
        self.now = T0
        self.recovery = RecoveryWiring(self.cfg, self.pipeline, now=lambda: self.now) if recovery else None
        self.engine = Engine(
            self.cfg,
            self.pipeline,
            build(self.cfg),
            OutputsDiscovery([outputs], self.offsets.known_jobs()),
            offsets=self.offsets,
            watcher=watcher,
            recovery=self.recovery,
        )

    async def tick(self, now: float) -> None:
        self.now = now
        stats = await self.engine.tick(now)
        assert stats.ok

    def close(self) -> None:
        self.offsets.close()
        self.pipeline.close()


def outbox(state: Path) -> list[dict[str, Any]]:
    import sqlite3

    with sqlite3.connect(state / "alerts.sqlite3") as c:
        return [json.loads(r[0]) for r in c.execute("SELECT data FROM outbox ORDER BY rowid")]


def events(state: Path) -> list[tuple[str, str]]:
    return [(n["event"], n["kind"]) for n in outbox(state)]
