"""`jobdiagd run`: wires config, alert pipeline, notifiers, status socket, metrics and the engine into one process."""

from __future__ import annotations

import gc
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from jobdiagd import clock, config
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.detectors import build as build_detectors
from jobdiagd.detectors import enabled_names
from jobdiagd.notifiers.dispatcher import Dispatcher, RetryPolicy
from jobdiagd.notifiers.registry import build_notifiers
from jobdiagd.service.alert_sync import add_state_mirrors
from jobdiagd.service.engine import Discovery, Engine, OutputsDiscovery, SlurmDiscovery
from jobdiagd.service.health import Health
from jobdiagd.service.lifecycle import Lifecycle
from jobdiagd.service.logging import configure_logging, get_logger
from jobdiagd.service.metrics import DaemonMetrics, MetricsServer
from jobdiagd.service.sdnotify import SdNotifier
from jobdiagd.service.status_socket import StatusServer
from jobdiagd.service.tsdb_enrich import TsdbEnricher
from jobdiagd.sources.slurm import SlurmError, SlurmWatcher, make_backend
from jobdiagd.sources.tail import ChangeWatcher, OffsetStore

DiscoverMode = Literal["auto", "slurm", "outputs"]


def choose_discovery(
    cfg: config.Config, mode: DiscoverMode, watch: Sequence[Path], known: set[str]
) -> Discovery:
    """slurm: squeue; outputs: job dirs under `watch` (or [slurm] outputs_roots); auto: slurm when
    `squeue` is installed and no --watch dirs were given."""
    if mode == "auto":
        mode = "outputs" if watch or shutil.which("squeue") is None else "slurm"
    if mode == "outputs":
        roots = list(watch) or list(cfg.slurm.outputs_roots)
        if not roots:
            raise config.ConfigError(
                ["outputs discovery needs --watch DIR or [slurm] outputs_roots (no Slurm found)"]
            )
        return OutputsDiscovery(roots, known)
    env = {"SLURM_CONF": str(cfg.slurm.slurm_conf)} if cfg.slurm.slurm_conf else None
    backend = make_backend(cfg.slurm.backend, env=env, timeout_s=cfg.slurm.command_timeout_seconds)
    watcher = SlurmWatcher(backend, cfg.slurm.users, cfg.slurm.partitions)
    return SlurmDiscovery(watcher, cfg.slurm.outputs_roots, cfg.daemon.squeue_interval_seconds, known)


async def run_daemon(
    config_path: str | Path,
    *,
    discover: DiscoverMode = "auto",
    watch: Sequence[Path] = (),
    handle_signals: bool = True,
    on_started: Callable[[Lifecycle, Engine], None] | None = None,
    configure_logs: bool = True,
) -> None:
    """Run until SIGTERM/SIGINT (or `lc.request_stop()`); raises ConfigError / ExceptionGroup."""
    cfg = config.load(config_path)
    # Oldest-generation collections scan every step record of every job (50+ ms with 200 jobs);
    # the engine runs them itself between ticks (Engine.run), so none lands inside a tick.
    gc.set_threshold(700, 10, 1_000_000)
    if configure_logs:
        configure_logging(cfg.daemon.log_level)
    log = get_logger(component="runner")
    metrics = DaemonMetrics()
    notifiers, skipped = build_notifiers(cfg)
    if skipped:
        log.warning("notifiers_not_available", names=skipped)
    pipeline = AlertPipeline.open(cfg.daemon.state_dir, cfg.incidents, [n.name for n in notifiers])
    offsets = OffsetStore.in_state_dir(cfg.daemon.state_dir)
    dispatcher = Dispatcher(
        pipeline.outbox, notifiers, policy=RetryPolicy.from_config(cfg.delivery), observer=metrics
    )
    pipeline.on_enqueue = dispatcher.kick
    health = Health(tick_seconds=cfg.daemon.tick_seconds, started_at=clock.wall())
    try:
        discovery = choose_discovery(cfg, discover, watch, offsets.known_jobs())
    except (config.ConfigError, SlurmError):
        offsets.close()
        pipeline.close()
        raise
    watcher = ChangeWatcher()
    enricher = TsdbEnricher(cfg.tsdb, tick_s=cfg.daemon.tick_seconds)
    engine = Engine(
        cfg,
        pipeline,
        build_detectors(cfg),
        discovery,
        metrics=metrics,
        health=health,
        offsets=offsets,
        watcher=watcher,
        enricher=enricher,
    )
    current = {"cfg": cfg}

    def snapshot() -> dict[str, Any]:
        now = clock.wall()
        return health.snapshot(
            pipeline.snapshot(now),
            {
                "notifiers": dispatcher.snapshot(),
                "jobs": engine.snapshot_jobs(now),
                "tick_durations": engine.tick_stats(),
                "discovery": discovery.name,
                "detectors": enabled_names(current["cfg"]),
            },
        )

    def reload() -> None:
        new = config.load(config_path)
        needs_restart = config.restart_required(current["cfg"], new)
        if needs_restart:
            log.warning("reload_needs_restart", keys=needs_restart)
        engine.reconfigure(new, build_detectors(new))
        health.tick_seconds = new.daemon.tick_seconds
        if isinstance(discovery, SlurmDiscovery):
            discovery.interval = new.daemon.squeue_interval_seconds
        current["cfg"] = new
        log.info("config_reloaded", detectors=enabled_names(new))

    status = StatusServer(cfg.daemon.socket_path, snapshot, group=cfg.daemon.socket_group)
    lc = Lifecycle(
        sd=SdNotifier.from_env(), on_reload=reload, watchdog_check=health.watchdog_check(clock.wall)
    )
    lc.add_step("alert store", cleanup=pipeline.close)
    lc.add_step("tail offsets", cleanup=offsets.close)
    lc.add_step("tsdb connections", cleanup=enricher.close)
    lc.add_step("status socket", status.start, status.stop)
    if cfg.daemon.metrics_port:
        ms = MetricsServer(metrics, cfg.daemon.metrics_host, cfg.daemon.metrics_port)
        lc.add_step("metrics", ms.start, ms.stop)
    # Alertmanager forgets alerts not re-posted: it gets the open incidents again every interval.
    add_state_mirrors(lc, notifiers, pipeline, snapshot)
    lc.add_step("final delivery", cleanup=dispatcher.drain)
    lc.add_task("dispatcher", dispatcher.run, drain=False)
    lc.add_task("file watcher", watcher.run, drain=False)

    async def engine_loop() -> None:
        await engine.run(lc.sleep, lambda: current["cfg"].daemon.tick_seconds)

    lc.add_task("engine", engine_loop)
    log.info(
        "starting",
        config=str(config_path),
        discovery=discovery.name,
        detectors=enabled_names(cfg),
        notifiers=[n.name for n in notifiers],
    )
    if on_started is not None:
        on_started(lc, engine)
    await lc.run(handle_signals=handle_signals)
