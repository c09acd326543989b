"""`jobdiagd run`: wires config, alert pipeline, notifiers, status socket, metrics and the engine into one process.

Start-up refusals are one line and a non-zero exit, never a traceback: an unsafe or unusable
state dir or notifier file (`privatefs`), a state dir locked by another jobdiagd, a store from
a newer schema. A store that cannot be read is quarantined (`alerts.store.open_store`). A store
locked by another process, or a disk too full to open it, is waited for: one log line, a retry
every `STORE_RETRY_S`, a systemd status text and start-timeout extension meanwhile; SIGTERM
ends the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import signal
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from jobdiagd import clock, config
from jobdiagd.alerts import notices
from jobdiagd.alerts.messages import MessageStore
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.alerts.store import DB_NAME, StoreError, StoreUnavailable
from jobdiagd.chat.router import ChatRouter
from jobdiagd.detectors import build as build_detectors
from jobdiagd.detectors import enabled_names
from jobdiagd.edge_trigger import EdgeTrigger
from jobdiagd.logsetup import configure_logging, get_logger
from jobdiagd.notifiers.base import ChatTransport, Notifier
from jobdiagd.notifiers.dispatcher import Dispatcher, RetryPolicy
from jobdiagd.notifiers.registry import build_notifiers
from jobdiagd.privatefs import check_private_file, check_private_parent, ensure_private_dir, lock_state_dir
from jobdiagd.service import plots_bridge
from jobdiagd.service.alert_sync import add_state_mirrors
from jobdiagd.service.chat_backend import DaemonChatBackend
from jobdiagd.service.discovery import Discovery, OutputsDiscovery, SlurmDiscovery
from jobdiagd.service.engine import Engine
from jobdiagd.service.goodput_digest import DigestScheduler
from jobdiagd.service.health import Health
from jobdiagd.service.housekeeping import prune_loop
from jobdiagd.service.job_metrics import JobMetrics
from jobdiagd.service.jobs import JobView
from jobdiagd.service.lifecycle import Lifecycle
from jobdiagd.service.metrics import DaemonMetrics, DaemonState, JobSample, MetricsServer
from jobdiagd.service.plots_bridge import PlotBridge
from jobdiagd.service.recovery_wiring import RecoveryWiring
from jobdiagd.service.sdnotify import SdNotifier
from jobdiagd.service.site_source import SiteJobs, open_site
from jobdiagd.service.stages import PlotInputs
from jobdiagd.service.status_socket import StatusServer
from jobdiagd.service.tick_loop import TickLoop
from jobdiagd.service.tsdb_enrich import TsdbEnricher
from jobdiagd.sources.slurm import CliSlurmBackend, SlurmWatcher, make_backend
from jobdiagd.sources.tail import ChangeWatcher, OffsetStore

DiscoverMode = Literal["auto", "slurm", "outputs"]
STORE_RETRY_S = 5.0
STORE_SOURCE = "state store"
SITE_SOURCE = "site_prometheus"


def check_state_paths(cfg: config.Config) -> None:
    """The state dir (created 0700) and the JSONL notifier file; raises privatefs.UnsafePathError."""
    state = ensure_private_dir(cfg.daemon.state_dir)
    jsonl = cfg.notifiers.jsonl
    if jsonl.enabled:
        if jsonl.path.parent.resolve() != state.resolve():
            check_private_parent(jsonl.path, "notifier file")
        check_private_file(jsonl.path, "notifier file")


def _open_state(cfg: config.Config, names: list[str]) -> tuple[AlertPipeline, OffsetStore]:
    pipeline = AlertPipeline.open(cfg.daemon.state_dir, cfg.incidents, names, now=clock.wall())
    try:
        offsets = OffsetStore(Path(cfg.daemon.state_dir) / DB_NAME)
    except sqlite3.Error as exc:
        pipeline.close()
        name = getattr(exc, "sqlite_errorname", "") or ""
        transient = name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_IOERR"))
        raise (StoreUnavailable if transient else StoreError)(f"tail offsets: {exc}") from exc
    return pipeline, offsets


async def open_state_waiting(
    cfg: config.Config, names: list[str], watch: EdgeTrigger, sd: SdNotifier, *, handle_signals: bool
) -> tuple[AlertPipeline, OffsetStore] | None:
    """Open the store, waiting while it is locked or the disk is too full; None: stopped meanwhile."""
    log = get_logger(component="runner")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    waiting_since: float | None = None
    try:
        while True:
            try:
                pipeline, offsets = _open_state(cfg, names)
            except StoreUnavailable as exc:
                if waiting_since is None:
                    waiting_since = clock.monotonic()
                    log.error(
                        "state_store_waiting",
                        error=str(exc),
                        retry_seconds=STORE_RETRY_S,
                        hint="another process holds the store's lock, or its disk is full",
                    )
                sd.notify(
                    STATUS=f"waiting for the state store: {exc}",
                    EXTEND_TIMEOUT_USEC=int((STORE_RETRY_S + 30) * 1_000_000),
                )
            else:
                if waiting_since is not None:
                    log.info("state_store_opened", waited_seconds=round(clock.monotonic() - waiting_since, 1))
                pipeline.store.watch = watch  # from now on every write reports to it
                return pipeline, offsets
            if handle_signals and not installed:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, stop.set)
                    installed.append(sig)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), STORE_RETRY_S)
            if stop.is_set():
                log.info("stopped", reason="signal while waiting for the state store")
                return None
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def add_notifier_notices(dispatcher: Dispatcher, pipeline: AlertPipeline) -> None:
    """One "notifier degraded" notice per episode of failed sends, one "recovered" once what
    waited is delivered. They go to every notifier: the others say it now; the failing one says it once it
    is back, after the pages it owed (its queue keeps its order)."""

    def degraded(name: str, error: str, since: float, now: float) -> None:
        pipeline.announce(notices.notifier_degraded(name, error, since, now), now)

    def recovered(name: str, since: float, now: float) -> None:
        pipeline.announce(notices.notifier_recovered(name, since, now), now)

    dispatcher.on_degraded = degraded
    dispatcher.on_recovered = recovered


def task_count() -> int | None:
    """Tasks alive in the daemon's loop: a leak shows as a count that keeps growing (bench/soak.py)."""
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # asked from outside the loop's thread
        return None


def chat_router(cfg: config.Config, transport: ChatTransport, backend: DaemonChatBackend) -> ChatRouter:
    """The shared router with this transport's allow-lists and the [chat] limits."""
    c = cfg.chat
    return ChatRouter(
        backend,
        transport.auth,
        transport=transport.name,
        max_running=c.max_running_commands,
        max_queued=c.max_queued_commands,
        task_timeout_s=c.command_timeout_seconds,
        scancel_enabled=c.scancel_button,
        recovery_enabled=backend.recovery is not None and backend.recovery.acts,
    )


def plot_inputs(cfg: config.Config) -> PlotInputs:
    """Picture inputs with the TGS detector's own threshold and baseline window."""
    tgs = cfg.detectors.tgs
    window = (tgs.baseline_first_step, tgs.baseline_last_step)

    def build(view: JobView, kind: str, now: float) -> dict[str, Any] | None:
        return plots_bridge.chart_payload(
            view, kind, now, tgs_threshold_pct=tgs.drop_pct, baseline_steps=window
        )

    return build


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


def close_store(pipeline: AlertPipeline, edge: EdgeTrigger) -> None:
    """Flush what the store still holds, say what could not be saved, then close it."""
    if pipeline.held:
        pipeline.flush(clock.wall())
    if pipeline.held:
        get_logger(component="runner").error(
            "notifications_unsaved",
            error=edge.last_error,
            # Incidents and job-end reports are derived again after the restart if still true.
            found_again_after_restart=[n.id for n in pipeline.held if n.event != "notice"],
            lost=[n.id for n in pipeline.held if n.event == "notice"],
        )
    pipeline.close()


def report_store_damage(pipeline: AlertPipeline) -> None:
    """One log line for a quarantined store and one per row that could not be read."""
    log = get_logger(component="runner")
    if pipeline.quarantined is not None:
        log.error(
            "state_store_quarantined",
            reason=pipeline.quarantined.reason,
            moved_to=[str(p) for p in pipeline.quarantined.moved],
            consequence="started with an empty store; a notice is queued for the notifiers",
        )
    for problem in pipeline.store.unreadable:
        log.error("state_row_unreadable", problem=problem)


async def open_state_dir(
    cfg: config.Config, lc: Lifecycle, names: list[str], health: Health, *, handle_signals: bool
) -> tuple[AlertPipeline, OffsetStore] | None:
    """Lock the state dir and open the store and tail offsets, each adopted by `lc` as it opens;
    None: stopped while waiting for the store."""
    lock_fd = lock_state_dir(cfg.daemon.state_dir)
    lc.adopt("state dir lock", lambda: os.close(lock_fd))
    # Every write to the store reports here: one log line when writes start failing (disk full,
    # locked) and one when they work again; `jobdiagd status` lists it with the sources.
    store_edge = health.sources[STORE_SOURCE] = EdgeTrigger(
        STORE_SOURCE, kind="state_store", logger=get_logger(component="store")
    )
    opened = await open_state_waiting(cfg, names, store_edge, lc.sd, handle_signals=handle_signals)
    if opened is None:
        return None
    pipeline, offsets = opened
    lc.adopt("alert store", lambda: close_store(pipeline, store_edge))
    lc.adopt("tail offsets", offsets.close)
    report_store_damage(pipeline)
    return opened


class LiveDaemon:
    """What the status socket, SIGHUP and the loops act on: the wired parts and the current config."""

    def __init__(
        self,
        cfg: config.Config,
        config_path: str | Path,
        *,
        health: Health,
        pipeline: AlertPipeline,
        dispatcher: Dispatcher,
        engine: Engine,
        discovery: Discovery,
        recovery: RecoveryWiring | None = None,
    ) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.health = health
        self.pipeline = pipeline
        self.dispatcher = dispatcher
        self.engine = engine
        self.discovery = discovery
        self.job_metrics = JobMetrics(engine, pipeline)
        self.recovery = recovery
        self._log = get_logger(component="runner")

    def snapshot(self) -> dict[str, Any]:
        now = clock.wall()
        return self.health.snapshot(
            self.pipeline.snapshot(now),
            {
                "notifiers": self.dispatcher.snapshot(),
                "jobs": self.engine.snapshot_jobs(now),
                "tick_durations": self.engine.tick_stats(),
                "catch_up": {"pending": self.engine.room.catching_up},
                "discovery": self.discovery.name,
                "detectors": enabled_names(self.cfg),
                "asyncio_tasks": task_count(),
                **self._site_status(),
                "recovery": self.recovery.snapshot(now) if self.recovery is not None else None,
            },
        )

    def _site_status(self) -> dict[str, Any]:
        enricher = self.engine.enricher
        site = enricher.site if enricher is not None else None
        if site is None:
            return {}
        assert enricher is not None
        return {"site_prometheus": {**site.status(), **enricher.slow.status()}}

    def metrics_state(self) -> DaemonState:
        """What a scrape of the self-metrics reads (`service.metrics`): the same objects as `snapshot`."""
        try:
            pending: int | None = self.pipeline.outbox.pending_count()
        except sqlite3.Error:
            pending = None  # the store cannot be asked now: no sample rather than a stale one
        return DaemonState(
            jobs_watched=len(self.engine.jobs),
            last_tick_at=self.health.last_tick_at,
            detectors=dict(self.engine.checks),
            incidents_open=self.pipeline.open_counts(),
            outbox_pending=pending,
            sources_up={
                name: not edge.failing
                for name, edge in self.health.sources.items()
                if edge.kind == "source" or name == SITE_SOURCE
            },
            jobs=self._job_samples(),
            recovery_pending=self._recovery_pending(),
        )

    def _job_samples(self) -> list[JobSample]:
        """The per-job series' state (`service.job_metrics`); a failure costs only those series."""
        try:
            return self.job_metrics.samples(clock.wall())
        except Exception as exc:
            self._log.error("job_metrics_failed", error=f"{type(exc).__name__}: {exc}")
            return []

    def _recovery_pending(self) -> dict[str, int] | None:
        if self.recovery is None:
            return {}
        try:
            return self.recovery.pending_counts()
        except sqlite3.Error:
            return None  # no sample rather than a stale one

    def reload(self) -> None:
        new = config.load(self.config_path)
        needs_restart = config.restart_required(self.cfg, new)
        if needs_restart:
            self._log.warning("reload_needs_restart", keys=needs_restart)
        self.engine.reconfigure(new, build_detectors(new))
        if self.recovery is not None:
            self.recovery.reconfigure(new)
        self.health.tick_seconds = new.daemon.tick_seconds
        if isinstance(self.discovery, SlurmDiscovery):
            self.discovery.interval = new.daemon.squeue_interval_seconds
        self.cfg = new
        self._log.info("config_reloaded", detectors=enabled_names(new))

    def add_tasks(self, lc: Lifecycle, watcher: ChangeWatcher, messages: MessageStore) -> None:
        lc.add_task("dispatcher", self.dispatcher.run, drain=False)
        lc.add_task("file watcher", watcher.run, drain=False)
        lc.add_task(
            "history pruning",
            lambda: prune_loop(
                self.pipeline.outbox, messages, lambda: self.cfg.delivery.keep_history_seconds, lc.sleep
            ),
            drain=False,
        )

        async def engine_loop() -> None:
            await TickLoop(self.engine).run(lc.sleep, lambda: self.cfg.daemon.tick_seconds)

        lc.add_task("engine", engine_loop)
        if self.recovery is not None:
            recovery = self.recovery
            lc.add_task("recovery", lambda: recovery.run(lc.sleep))


async def open_site_source(
    cfg: config.Config,
    lc: Lifecycle,
    enricher: TsdbEnricher,
    discovery: Discovery,
    pipeline: AlertPipeline,
    health: Health,
) -> SiteJobs | None:
    """`[site_prometheus]`: built and its map checked now (`service.site_source.open_site`; one line
    and one notice when unusable, the daemon runs without it), closed before the tunnels it may use.
    Its health is a source of `jobdiagd status` and of `jobdiagd_source_up`."""
    backend = discovery.watcher.backend if isinstance(discovery, SlurmDiscovery) else None
    site = await open_site(
        cfg,
        tunnels=enricher.tunnels,
        detail=backend.job_gres_detail if isinstance(backend, CliSlurmBackend) else None,
        announce=pipeline.announce,
        now=clock.wall(),
    )
    if site is not None:
        lc.adopt("site prometheus", site.close)
        health.sources[SITE_SOURCE] = site.source.health
    enricher.use_site(site)
    return site


def add_chat_steps(
    lc: Lifecycle,
    daemon: LiveDaemon,
    chats: Sequence[ChatTransport],
    messages: MessageStore,
    plots: PlotBridge | None,
) -> None:
    """Bind each chat transport to the store and the router; its bot starts and stops as a step."""
    backend = DaemonChatBackend(
        daemon.cfg,
        Path(daemon.config_path),
        daemon.engine,
        daemon.pipeline,
        daemon.snapshot,
        plots=plots,
        recovery=daemon.recovery,
    )
    for transport in chats:
        transport.bind(messages)
        transport.render_plot = plots.render if plots is not None else None
        transport.router = chat_router(daemon.cfg, transport, backend)
        # Set up before "final delivery": stopped after it, so the last deliveries still go out.
        lc.add_step(f"{transport.name} bot", transport.start, transport.stop)


async def wire_daemon(
    cfg: config.Config,
    config_path: str | Path,
    lc: Lifecycle,
    notifiers: Sequence[Notifier],
    health: Health,
    *,
    discover: DiscoverMode,
    watch: Sequence[Path],
    handle_signals: bool,
) -> LiveDaemon | None:
    """Open every resource and register its close with `lc` where it opens (in opening order, so
    the teardown runs in reverse); None: stopped while waiting for the store."""
    opened = await open_state_dir(cfg, lc, [n.name for n in notifiers], health, handle_signals=handle_signals)
    if opened is None:
        return None
    pipeline, offsets = opened
    metrics = DaemonMetrics()
    messages = MessageStore(pipeline.store)
    chats = [n for n in notifiers if isinstance(n, ChatTransport)]
    pictures = bool(chats) and plots_bridge.available()
    dispatcher = Dispatcher(
        pipeline.outbox, notifiers, policy=RetryPolicy.from_config(cfg.delivery), observer=metrics
    )
    pipeline.on_enqueue = dispatcher.kick
    pipeline.on_queued = metrics.record_notifications
    add_notifier_notices(dispatcher, pipeline)
    discovery = choose_discovery(cfg, discover, watch, offsets.known_jobs())
    watcher = ChangeWatcher()
    enricher = TsdbEnricher(
        cfg.tsdb, tick_s=cfg.daemon.tick_seconds, recent_steps=cfg.detectors.tgs.recent_steps
    )
    lc.adopt("tsdb connections", enricher.close)
    await open_site_source(cfg, lc, enricher, discovery, pipeline, health)
    # Restarts under guardrails and suspect-node memory (docs/recovery.md): a stage of the tick,
    # a task that acts, the chat's buttons.
    recovery = RecoveryWiring(cfg, pipeline, on_action=metrics.recovery_action)
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
        plot_inputs=plot_inputs(cfg) if pictures else None,
        recovery=recovery,
    )
    daemon = LiveDaemon(
        cfg,
        config_path,
        health=health,
        pipeline=pipeline,
        dispatcher=dispatcher,
        engine=engine,
        discovery=discovery,
        recovery=recovery,
    )
    lc.on_reload = daemon.reload
    metrics.read_state(daemon.metrics_state)
    status = StatusServer(cfg.daemon.socket_path, daemon.snapshot, group=cfg.daemon.socket_group)
    lc.add_step("status socket", status.start, status.stop)
    if cfg.daemon.metrics_port:
        ms = MetricsServer(metrics, cfg.daemon.metrics_host, cfg.daemon.metrics_port)
        lc.add_step("metrics", ms.start, ms.stop)
    plots = PlotBridge() if pictures else None
    if plots is not None:
        lc.add_step("plot renderer", cleanup=plots.close)
    if chats:
        add_chat_steps(lc, daemon, chats, messages, plots)
    # Alertmanager forgets alerts not re-posted: it gets the open incidents again every interval.
    add_state_mirrors(lc, notifiers, pipeline, daemon.snapshot)
    # Best effort within the stop budget (a chat's rate limit can hold the last replies back):
    # what is not sent stays in the outbox and goes first at the next start (at-least-once).
    lc.add_step("final delivery", cleanup=dispatcher.drain, cut_means="undelivered notifications wait in the outbox")
    daemon.add_tasks(lc, watcher, messages)
    digest = DigestScheduler(lambda: daemon.cfg, pipeline, lc.sleep, watched_roots=watch)
    lc.add_task("goodput digest", digest.run, drain=False)
    return daemon


async def run_daemon(
    config_path: str | Path,
    *,
    discover: DiscoverMode = "auto",
    watch: Sequence[Path] = (),
    handle_signals: bool = True,
    on_started: Callable[[Lifecycle, Engine], None] | None = None,
    configure_logs: bool = True,
) -> None:
    """Run until SIGTERM/SIGINT (or `lc.request_stop()`); raises ConfigError, UnsafePathError,
    StoreError / ExceptionGroup. Whatever fails while opening, what was opened before it is closed."""
    cfg = config.load(config_path)
    # Oldest-generation collections scan every step record of every job (50+ ms with 200 jobs);
    # the tick loop runs them itself between ticks (TickLoop.run), so none lands inside a tick.
    gc.set_threshold(700, 10, 1_000_000)
    if configure_logs:
        configure_logging(cfg.daemon.log_level)
    log = get_logger(component="runner")
    notifiers, skipped = build_notifiers(cfg)
    if skipped:
        log.warning("notifiers_not_available", names=skipped)
    check_state_paths(cfg)
    health = Health(tick_seconds=cfg.daemon.tick_seconds, started_at=clock.wall())
    lc = Lifecycle(sd=SdNotifier.from_env(), watchdog_check=health.watchdog_check(clock.wall))
    async with lc.opening():
        daemon = await wire_daemon(
            cfg,
            config_path,
            lc,
            notifiers,
            health,
            discover=discover,
            watch=watch,
            handle_signals=handle_signals,
        )
        if daemon is not None:
            log.info(
                "starting",
                config=str(config_path),
                discovery=daemon.discovery.name,
                detectors=enabled_names(cfg),
                notifiers=[n.name for n in notifiers],
            )
            if on_started is not None:
                on_started(lc, daemon.engine)
    if daemon is None:
        await lc.close_opened()
        return
    await lc.run(handle_signals=handle_signals)
