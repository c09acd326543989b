"""All infrastructure pieces composed the way the daemon's `run` will: a reference for the engine wiring."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from jobdiagd import clock
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import loads
from jobdiagd.model.alerts import Finding
from jobdiagd.notifiers.dispatcher import Dispatcher, RetryPolicy
from jobdiagd.notifiers.registry import build_notifiers
from jobdiagd.service.health import Health
from jobdiagd.service.lifecycle import Lifecycle
from jobdiagd.service.metrics import DaemonMetrics, DaemonState, MetricsServer
from jobdiagd.service.status_socket import StatusServer, request


async def test_daemon_infrastructure_end_to_end(short_tmp: Path) -> None:
    cfg = loads(
        f"""
[daemon]
state_dir = "{short_tmp}/state"
socket_path = "{short_tmp}/jd.sock"
tick_seconds = 0.05
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
""",
        source="test.toml",
    )
    # --- construct (what `jobdiagd run` does before the loop) ---
    metrics = DaemonMetrics()
    notifiers, skipped = build_notifiers(cfg)
    assert skipped == []
    pipeline = AlertPipeline.open(cfg.daemon.state_dir, cfg.incidents, [n.name for n in notifiers])
    dispatcher = Dispatcher(
        pipeline.outbox, notifiers, policy=RetryPolicy.from_config(cfg.delivery), observer=metrics
    )
    pipeline.on_enqueue = dispatcher.kick
    pipeline.on_queued = metrics.record_notifications
    health = Health(tick_seconds=cfg.daemon.tick_seconds, started_at=clock.wall())
    jobs: list[dict[str, Any]] = []
    metrics.read_state(
        lambda: DaemonState(
            jobs_watched=len(jobs),
            last_tick_at=health.last_tick_at,
            incidents_open=pipeline.open_counts(),
            outbox_pending=pipeline.outbox.pending_count(),
            sources_up={name: not edge.failing for name, edge in health.sources.items()},
        )
    )

    def snapshot() -> dict[str, Any]:
        now = clock.wall()
        return health.snapshot(pipeline.snapshot(now), {"notifiers": dispatcher.snapshot(), "jobs": jobs})

    status = StatusServer(cfg.daemon.socket_path, snapshot, group=cfg.daemon.socket_group)
    metrics_server = MetricsServer(
        metrics, cfg.daemon.metrics_host, 0
    )  # a real port even though config says off
    lc = Lifecycle(watchdog_check=health.watchdog_check(clock.wall))
    lc.add_step("alert store", cleanup=pipeline.close)
    lc.add_step("status socket", status.start, status.stop)
    lc.add_step("metrics", metrics_server.start, metrics_server.stop)
    lc.add_step("final delivery", cleanup=dispatcher.drain)  # best effort within the stop budget
    lc.add_task("dispatcher", dispatcher.run, drain=False)

    seen: dict[str, Any] = {}

    async def engine() -> None:
        # Stands in for service/engine.py: gather -> detect -> incidents -> deliver, once per tick.
        scripted = [
            [Finding("hang", "77", "hang", "critical", "no step since step 316", at_step=316)],
            [Finding("hang", "77", "hang", "critical", "no step since step 316", at_step=316)],
            [Finding("hang", "77", "hang", "info", "steps resumed at step 317", at_step=317, resolved=True)],
        ]
        for findings in scripted:
            started = clock.monotonic()
            now = clock.wall()
            squeue = health.source("squeue")
            squeue.success(now)
            jobs[:] = [{"job_id": "77", "state": "RUNNING", "name": "demo", "last_step": 316}]
            pipeline.observe(findings, now)
            health.tick_done(clock.wall(), ok=True)
            metrics.observe_tick(clock.monotonic() - started, True)
            if lc.stopping or await lc.sleep(cfg.daemon.tick_seconds):
                return
        # Inspect the running daemon from outside, as `jobdiagd status` and Prometheus would.
        seen["status"] = await asyncio.to_thread(request, cfg.daemon.socket_path)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{metrics_server.port}/metrics") as resp,
        ):
            seen["metrics"] = await resp.text()
        lc.request_stop("script done")

    lc.add_task("engine", engine)
    await asyncio.wait_for(lc.run(), timeout=60)

    reply = seen["status"]
    assert reply["ok"] is True
    result = reply["result"]
    assert result["ticks"] == 3 and result["last_tick_ok"] is True
    assert result["open_incidents"] == []  # resolved on the third tick
    assert result["sources"]["squeue"]["failing"] is False
    assert 'jobdiagd_incidents_opened_total{kind="hang"} 1.0' in seen["metrics"]
    assert 'jobdiagd_ticks_total{outcome="ok"} 3.0' in seen["metrics"]

    lines = [json.loads(line) for line in cfg.notifiers.jsonl.path.read_text().splitlines()]
    assert [(n["event"], n["id"]) for n in lines] == [
        ("open", "77:hang:1:open"),
        ("resolve", "77:hang:1:resolve"),
    ]
    assert not cfg.daemon.socket_path.exists()  # cleaned up
