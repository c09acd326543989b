"""Self-metrics: a private prometheus-client registry served on a loopback port by aiohttp."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from jobdiagd import __version__
from jobdiagd.model.alerts import Notification

_TICK_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class DaemonMetrics:
    """Every metric the daemon exports; names start with `jobdiagd_`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_info = Gauge("jobdiagd_build_info", "Build information.", ["version"], registry=r)
        self.build_info.labels(__version__).set(1)
        self.jobs_watched = Gauge("jobdiagd_jobs_watched", "Jobs currently watched.", registry=r)
        self.ticks = Counter("jobdiagd_ticks", "Ticks run, by outcome.", ["outcome"], registry=r)
        self.tick_duration = Histogram(
            "jobdiagd_tick_duration_seconds", "Wall time of one tick.", buckets=_TICK_BUCKETS, registry=r
        )
        self.last_tick = Gauge(
            "jobdiagd_last_tick_timestamp_seconds", "When the last tick finished.", registry=r
        )
        # node_exporter style: per-detector duration and success of the last run.
        self.detector_duration = Gauge(
            "jobdiagd_detector_duration_seconds",
            "Duration of the detector's last run.",
            ["detector"],
            registry=r,
        )
        self.detector_success = Gauge(
            "jobdiagd_detector_success", "1 if the detector's last run succeeded.", ["detector"], registry=r
        )
        self.detector_errors = Counter(
            "jobdiagd_detector_errors", "Detector runs that raised.", ["detector"], registry=r
        )
        self.incidents_open = Gauge(
            "jobdiagd_incidents_open", "Open incidents by kind.", ["kind"], registry=r
        )
        self.incidents_opened = Counter(
            "jobdiagd_incidents_opened", "Incidents opened (announced) by kind.", ["kind"], registry=r
        )
        self.notifications = Counter(
            "jobdiagd_notifications_enqueued", "Notifications queued, by event.", ["event"], registry=r
        )
        self.notifications_sent = Counter(
            "jobdiagd_notifications_sent", "Successful sends by notifier.", ["notifier"], registry=r
        )
        self.notifications_failed = Counter(
            "jobdiagd_notifications_failed", "Failed send attempts by notifier.", ["notifier"], registry=r
        )
        self.send_duration = Histogram(
            "jobdiagd_notification_send_duration_seconds", "Send attempt duration.", ["notifier"], registry=r
        )
        self.outbox_pending = Gauge(
            "jobdiagd_outbox_pending", "Deliveries waiting in the outbox.", registry=r
        )
        self.source_errors = Counter(
            "jobdiagd_source_errors", "Failed reads from an input source.", ["source"], registry=r
        )
        self.source_up = Gauge(
            "jobdiagd_source_up", "1 if the source's last read succeeded.", ["source"], registry=r
        )
        self._kinds: set[str] = set()

    # -- helpers the engine calls -----------------------------------------

    def observe_tick(self, seconds: float, ok: bool, finished_at: float) -> None:
        self.ticks.labels("ok" if ok else "error").inc()
        self.tick_duration.observe(seconds)
        self.last_tick.set(finished_at)

    def observe_detector(self, detector: str, seconds: float, ok: bool) -> None:
        self.detector_duration.labels(detector).set(seconds)
        self.detector_success.labels(detector).set(1 if ok else 0)
        if not ok:
            self.detector_errors.labels(detector).inc()

    def observe_source(self, source: str, ok: bool) -> None:
        self.source_up.labels(source).set(1 if ok else 0)
        if not ok:
            self.source_errors.labels(source).inc()

    def set_incidents_open(self, counts: Mapping[str, int]) -> None:
        """Replace the open-incident gauge; kinds no longer open drop to 0 rather than vanish."""
        self._kinds |= set(counts)
        for kind in self._kinds:
            self.incidents_open.labels(kind).set(counts.get(kind, 0))

    def record_notifications(self, notifications: Iterable[Notification]) -> None:
        for n in notifications:
            self.notifications.labels(n.event).inc()
            if n.event == "open":
                self.incidents_opened.labels(n.kind).inc()

    def delivery_result(self, notifier: str, ok: bool, seconds: float) -> None:
        """DeliveryObserver for the Dispatcher."""
        (self.notifications_sent if ok else self.notifications_failed).labels(notifier).inc()
        self.send_duration.labels(notifier).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """GET /metrics on host:port (port 0 picks a free port; see `.port` after start)."""

    def __init__(self, metrics: DaemonMetrics, host: str = "127.0.0.1", port: int = 0) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        app.router.add_get("/", self._index)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        for addr in runner.addresses:
            self.port = int(addr[1])
            break

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(text="jobdiagd: see /metrics\n")
