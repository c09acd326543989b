"""Self-metrics: a private prometheus-client registry served on a loopback port by aiohttp.

Two kinds, by what they measure (decided here):

- **State is pulled.** What the daemon *is* at the moment of a scrape — jobs watched, when the
  last tick finished, each detector's last run (duration, success), open incidents by kind,
  deliveries pending in the outbox, which input sources answer — is read at scrape time:
  `DaemonMetrics` is a prometheus-client custom collector (`collect()` yields
  `GaugeMetricFamily`s, the library's pattern for values that live elsewhere), and its
  `DaemonState` is built by the function bound with `read_state` (`LiveDaemon.metrics_state` in
  `service.runner`, from the engine, the alert pipeline and `Health`). Nothing sets a gauge, so a
  gauge cannot lag or disagree with `jobdiagd status`, which reads the same objects.
- **Events are pushed where they happen.** What *happened* cannot be read back from state, so
  counters and histograms are incremented or observed at the event, each in one place: ticks and
  their wall time (`observe_tick`: the engine, when a full tick ends or fails), detector errors
  (the engine, after a tick's checks), source errors (`service.discovery_feed`, on a failed
  poll), notifications queued and incidents opened (`record_notifications`: the alert pipeline's
  `on_queued`, the one place every notification is queued), sends and their duration
  (`delivery_result`: the dispatcher's observer), recovery's actions (`recovery_action`:
  `service.recovery_wiring`, as it posts them).

An open-incident kind, once seen (open at a scrape, or opened), stays exported, at 0 when none is
open, rather than vanish. Every name, type, label and help text is as before the split; one
collector yields all families, in the order they always had.

**Per-job series** (`jobdiagd_job_*`, after the daemon's own families) are state too: one
`JobSample` per watched job, built at scrape time by `service.job_metrics` from the job views,
the hang detector's budget memo and the incident book (rule GP-11). Their labels are only
`job_id`, `user`, `partition` (and `kind` for open incidents), so the series are bounded by the
watched jobs; a job that leaves the watch is simply not in the next scrape's state, so its series
are gone from that scrape on, with nothing to remove. A number not known for a job (no step yet,
no budget yet) is no sample rather than a made-up zero.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from jobdiagd import __version__
from jobdiagd.logsetup import get_logger
from jobdiagd.model.alerts import Notification

_TICK_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class DetectorRun(NamedTuple):
    """A detector's last run on a tick: its checks' time summed, and whether none raised."""

    seconds: float
    ok: bool


JOB_LABELS = ("job_id", "user", "partition")


@dataclass(frozen=True, slots=True)
class JobSample:
    """One watched job's numbers at a scrape (None: not known now, no sample)."""

    job_id: str
    user: str = ""
    partition: str = ""
    step: int | None = None
    step_time_s: float | None = None
    tokens_per_s_device: float | None = None
    expected_step: int | None = None
    stall_s: float | None = None
    stall_budget_s: float | None = None
    eta_s: float | None = None
    goodput: float | None = None
    productive_gpu_s: float | None = None
    allocated_gpu_s: float | None = None
    open_incidents: Mapping[str, int] = field(default_factory=dict)


# (name, JobSample field, help): the per-job gauges, in the order they are exported.
JOB_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("jobdiagd_job_step", "step", "The job's last training step read."),
    ("jobdiagd_job_step_time_seconds", "step_time_s", "The job's steady-state step time."),
    (
        "jobdiagd_job_tokens_per_second_per_device",
        "tokens_per_s_device",
        "Tokens/s/device (TGS) of the job's last step.",
    ),
    (
        "jobdiagd_job_expected_step",
        "expected_step",
        "The step the job should be at now, projected from its last step and step time.",
    ),
    (
        "jobdiagd_job_stall_seconds",
        "stall_s",
        "Seconds since the job's last step was read (before its first: since training began or it was first seen).",
    ),
    (
        "jobdiagd_job_stall_budget_seconds",
        "stall_budget_s",
        "The stall the hang detector allows the job now (its phase's budget).",
    ),
    ("jobdiagd_job_eta_seconds", "eta_s", "Seconds to the job's last step at its steady step time."),
    (
        "jobdiagd_job_goodput_ratio",
        "goodput",
        "Productive over allocated GPU-seconds of the job's run so far (refreshed every few minutes).",
    ),
    (
        "jobdiagd_job_productive_gpu_seconds",
        "productive_gpu_s",
        "Productive GPU-seconds of the job's run so far (as of its goodput's refresh).",
    ),
    (
        "jobdiagd_job_allocated_gpu_seconds",
        "allocated_gpu_s",
        "Allocated GPU-seconds of the job's run so far (as of its goodput's refresh).",
    ),
)


@dataclass(frozen=True)
class DaemonState:
    """The daemon's state as one scrape reads it."""

    jobs_watched: int = 0
    last_tick_at: float | None = None  # when the last full tick finished (None: none yet)
    detectors: Mapping[str, DetectorRun] = field(default_factory=dict)
    incidents_open: Mapping[str, int] = field(default_factory=dict)
    outbox_pending: int | None = 0  # None: the store could not be asked (no sample this scrape)
    sources_up: Mapping[str, bool] = field(default_factory=dict)
    jobs: Sequence[JobSample] = ()  # one per watched job (`service.job_metrics`)
    # Recovery's open intents by status (suggested, scheduled, running); None: not readable now.
    recovery_pending: Mapping[str, int] | None = field(default_factory=dict)


class DaemonMetrics(Collector):
    """Every metric the daemon exports; names start with `jobdiagd_`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._read: Callable[[], DaemonState] = DaemonState
        self._kinds: set[str] = set()
        self._log = get_logger(component="metrics")
        # Events: pushed where they happen (module docstring); collected through `collect`.
        self.ticks = Counter("jobdiagd_ticks", "Ticks run, by outcome.", ["outcome"], registry=None)
        self.tick_duration = Histogram(
            "jobdiagd_tick_duration_seconds", "Wall time of one tick.", buckets=_TICK_BUCKETS, registry=None
        )
        self.detector_errors = Counter(
            "jobdiagd_detector_errors", "Detector runs that raised.", ["detector"], registry=None
        )
        self.incidents_opened = Counter(
            "jobdiagd_incidents_opened", "Incidents opened (announced) by kind.", ["kind"], registry=None
        )
        self.notifications = Counter(
            "jobdiagd_notifications_enqueued", "Notifications queued, by event.", ["event"], registry=None
        )
        self.notifications_sent = Counter(
            "jobdiagd_notifications_sent", "Successful sends by notifier.", ["notifier"], registry=None
        )
        self.notifications_failed = Counter(
            "jobdiagd_notifications_failed", "Failed send attempts by notifier.", ["notifier"], registry=None
        )
        self.send_duration = Histogram(
            "jobdiagd_notification_send_duration_seconds", "Send attempt duration.", ["notifier"], registry=None
        )
        self.source_errors = Counter(
            "jobdiagd_source_errors", "Failed reads from an input source.", ["source"], registry=None
        )
        self.recovery_actions = Counter(
            "jobdiagd_recovery_actions",
            "Recovery actions taken or refused (restart, cancel, submit, keep, drain, ...), by rule.",
            ["action", "rule"],
            registry=None,
        )
        self.registry.register(self)

    def read_state(self, read: Callable[[], DaemonState]) -> None:
        """Bind what a scrape reads (until then: a daemon with nothing watched, no tick yet)."""
        self._read = read

    # -- events ------------------------------------------------------------------------------

    def observe_tick(self, seconds: float, ok: bool) -> None:
        self.ticks.labels("ok" if ok else "error").inc()
        self.tick_duration.observe(seconds)

    def detector_failed(self, detector: str) -> None:
        """A tick in which a check of `detector` raised (once per tick, whatever the jobs)."""
        self.detector_errors.labels(detector).inc()

    def source_failed(self, source: str) -> None:
        self.source_errors.labels(source).inc()

    def record_notifications(self, notifications: Iterable[Notification]) -> None:
        """The alert pipeline's `on_queued`: notifications just queued."""
        for n in notifications:
            self.notifications.labels(n.event).inc()
            if n.event == "open":
                self.incidents_opened.labels(n.kind).inc()
                self._kinds.add(n.kind)

    def recovery_action(self, action: str, rule: str) -> None:
        """One recovery action (or refusal) as its log records it (`service.recovery_wiring`)."""
        self.recovery_actions.labels(action, rule).inc()

    def delivery_result(self, notifier: str, ok: bool, seconds: float) -> None:
        """DeliveryObserver for the Dispatcher."""
        (self.notifications_sent if ok else self.notifications_failed).labels(notifier).inc()
        self.send_duration.labels(notifier).observe(seconds)

    # -- the scrape ----------------------------------------------------------------------------

    def describe(self) -> Iterator[Metric]:
        return self._families(None)

    def collect(self) -> Iterator[Metric]:
        try:
            state: DaemonState | None = self._read()
        except Exception as exc:  # the events still go out; the state's families carry no sample
            self._log.error("metrics_state_failed", error=f"{type(exc).__name__}: {exc}")
            state = None
        return self._families(state)

    def _families(self, state: DaemonState | None) -> Iterator[Metric]:
        build = GaugeMetricFamily("jobdiagd_build_info", "Build information.", labels=["version"])
        build.add_metric([__version__], 1)
        yield build
        watched = state.jobs_watched if state is not None else None
        yield _gauge("jobdiagd_jobs_watched", "Jobs currently watched.", watched)
        yield from self.ticks.collect()
        yield from self.tick_duration.collect()
        last = (state.last_tick_at or 0.0) if state is not None else None
        yield _gauge("jobdiagd_last_tick_timestamp_seconds", "When the last tick finished.", last)
        runs = state.detectors if state is not None else {}
        yield _by(
            "jobdiagd_detector_duration_seconds",
            "Duration of the detector's last run.",
            "detector",
            {name: run.seconds for name, run in runs.items()},
        )
        yield _by(
            "jobdiagd_detector_success",
            "1 if the detector's last run succeeded.",
            "detector",
            {name: 1 if run.ok else 0 for name, run in runs.items()},
        )
        yield from self.detector_errors.collect()
        yield _by("jobdiagd_incidents_open", "Open incidents by kind.", "kind", self._open(state))
        yield from self.incidents_opened.collect()
        yield from self.notifications.collect()
        yield from self.notifications_sent.collect()
        yield from self.notifications_failed.collect()
        yield from self.send_duration.collect()
        pending = state.outbox_pending if state is not None else None
        yield _gauge("jobdiagd_outbox_pending", "Deliveries waiting in the outbox.", pending)
        yield from self.source_errors.collect()
        up = {name: 1 if ok else 0 for name, ok in state.sources_up.items()} if state is not None else {}
        yield _by("jobdiagd_source_up", "1 if the source's last read succeeded.", "source", up)
        yield from _job_families(state.jobs if state is not None else ())
        yield from self.recovery_actions.collect()
        intents = state.recovery_pending if state is not None else None
        yield _by(
            "jobdiagd_recovery_pending",
            "Recovery restarts not finished, by status (suggested, scheduled, running).",
            "status",
            {s: intents.get(s, 0) for s in ("suggested", "scheduled", "running")} if intents is not None else {},
        )

    def _open(self, state: DaemonState | None) -> dict[str, int]:
        """Open incidents by kind; a kind seen before and no longer open is 0 rather than absent."""
        if state is None:
            return {}
        self._kinds |= set(state.incidents_open)
        return {kind: state.incidents_open.get(kind, 0) for kind in sorted(self._kinds)}

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
    """An unlabelled gauge; None: no sample."""
    g = GaugeMetricFamily(name, doc)
    if value is not None:
        g.add_metric([], value)
    return g


def _by(name: str, doc: str, label: str, values: Mapping[str, float]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=[label])
    for key, value in values.items():
        g.add_metric([key], value)
    return g


def _job_families(jobs: Sequence[JobSample]) -> Iterator[Metric]:
    """The per-job gauges: a sample per job and known number; open incidents per job and kind."""
    for name, attr, doc in JOB_GAUGES:
        g = GaugeMetricFamily(name, doc, labels=JOB_LABELS)
        for j in jobs:
            value = getattr(j, attr)
            if value is not None:
                g.add_metric([j.job_id, j.user, j.partition], value)
        yield g
    inc = GaugeMetricFamily(
        "jobdiagd_job_open_incidents", "The job's open incidents by kind.", labels=[*JOB_LABELS, "kind"]
    )
    for j in jobs:
        for kind, n in sorted(j.open_incidents.items()):
            inc.add_metric([j.job_id, j.user, j.partition, kind], n)
    yield inc


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
