"""Self-metrics scraped over real HTTP, and edge-triggered error logging."""

from __future__ import annotations

import io
import json

import aiohttp
import structlog
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from jobdiagd.edge_trigger import EdgeTrigger
from jobdiagd.logsetup import configure_logging, get_logger
from jobdiagd.model.alerts import Notification
from jobdiagd.service.metrics import DaemonMetrics, DaemonState, DetectorRun, MetricsServer


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_endpoint_over_http() -> None:
    m = DaemonMetrics()
    # State is read at scrape time; events are counted as they happen.
    m.read_state(
        lambda: DaemonState(
            jobs_watched=3,
            last_tick_at=1_800_000_015,
            detectors={"hang": DetectorRun(0.01, ok=True), "tgs": DetectorRun(0.02, ok=False)},
            incidents_open={"tgs-degradation": 1},  # the hang opened below is no longer open
            sources_up={"squeue": False},
        )
    )
    m.observe_tick(0.2, ok=True)
    m.observe_tick(0.3, ok=False)
    m.detector_failed("tgs")
    m.source_failed("squeue")
    m.record_notifications([Notification("a", "1", "hang", "open", "t", "b", 0.0)])
    m.delivery_result("console", True, 0.001)
    m.delivery_result("telegram", False, 5.0)

    server = MetricsServer(m, "127.0.0.1", 0)
    await server.start()
    try:
        assert server.port != 0
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{server.port}/metrics") as resp,
        ):
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
    finally:
        await server.stop()

    s = samples(text)
    assert s[("jobdiagd_jobs_watched", ())] == 3
    assert s[("jobdiagd_ticks_total", (("outcome", "ok"),))] == 1
    assert s[("jobdiagd_ticks_total", (("outcome", "error"),))] == 1
    assert s[("jobdiagd_tick_duration_seconds_count", ())] == 2
    assert s[("jobdiagd_last_tick_timestamp_seconds", ())] == 1_800_000_015
    assert s[("jobdiagd_detector_success", (("detector", "hang"),))] == 1
    assert s[("jobdiagd_detector_success", (("detector", "tgs"),))] == 0
    assert s[("jobdiagd_detector_errors_total", (("detector", "tgs"),))] == 1
    assert s[("jobdiagd_source_up", (("source", "squeue"),))] == 0
    assert s[("jobdiagd_source_errors_total", (("source", "squeue"),))] == 1
    assert s[("jobdiagd_incidents_open", (("kind", "hang"),))] == 0
    assert s[("jobdiagd_incidents_open", (("kind", "tgs-degradation"),))] == 1
    assert s[("jobdiagd_incidents_opened_total", (("kind", "hang"),))] == 1
    assert s[("jobdiagd_notifications_enqueued_total", (("event", "open"),))] == 1
    assert s[("jobdiagd_notifications_sent_total", (("notifier", "console"),))] == 1
    assert s[("jobdiagd_notifications_failed_total", (("notifier", "telegram"),))] == 1
    assert s[("jobdiagd_build_info", (("version", "0.1.0"),))] == 1


def test_state_is_read_at_each_scrape() -> None:
    # Nothing sets a gauge: each scrape reads the daemon's state as it is then.
    now: dict[str, DaemonState] = {"state": DaemonState(jobs_watched=2, incidents_open={"hang": 1})}
    m = DaemonMetrics()
    m.read_state(lambda: now["state"])
    first = samples(m.render().decode())
    now["state"] = DaemonState(jobs_watched=5, outbox_pending=None)
    second = samples(m.render().decode())
    assert first[("jobdiagd_jobs_watched", ())] == 2 and second[("jobdiagd_jobs_watched", ())] == 5
    assert second[("jobdiagd_incidents_open", (("kind", "hang"),))] == 0  # seen once: 0, not absent
    assert ("jobdiagd_outbox_pending", ()) in first and ("jobdiagd_outbox_pending", ()) not in second


async def test_two_metric_objects_do_not_collide() -> None:
    # Each daemon (and each test) has its own registry, never the global one.
    DaemonMetrics()
    DaemonMetrics()


def test_edge_trigger_logs_transitions_only() -> None:
    with capture_logs() as logs:
        edge = EdgeTrigger("squeue", logger=get_logger())
        assert edge.success(0.0) is False  # healthy from the start: silent
        assert edge.failure(OSError("slurmctld unreachable"), 10.0) is True
        assert edge.failure("timeout", 25.0) is False
        assert edge.failure("timeout", 40.0) is False
        assert edge.success(55.0) is True
        assert edge.success(70.0) is False
        assert edge.failure("again", 85.0) is True
    assert [e["event"] for e in logs] == ["source_failing", "source_recovered", "source_failing"]
    assert logs[0] == {
        "event": "source_failing",
        "log_level": "warning",
        "source": "squeue",
        "error": "OSError: slurmctld unreachable",
    }
    assert logs[1]["failed_for_seconds"] == 45.0
    assert logs[1]["failures"] == 3
    assert logs[1]["last_error"] == "timeout"


def test_a_logger_made_before_configuration_writes_json() -> None:
    # Module-level loggers (`_log = get_logger(component=...)`) exist before the daemon
    # configures logging; their lines must still come out as JSON, not structlog's console text.
    structlog.reset_defaults()
    early = get_logger(component="engine")
    buf = io.StringIO()
    configure_logging("info", stream=buf)
    try:
        early.info("job_ended", job_id="5102", state="COMPLETED")
    finally:
        structlog.reset_defaults()
    line = json.loads(buf.getvalue())
    assert (line["event"], line["component"], line["job_id"], line["level"]) == (
        "job_ended",
        "engine",
        "5102",
        "info",
    )


def test_json_logs_carry_job_id() -> None:
    buf = io.StringIO()
    configure_logging("info", stream=buf)
    try:
        get_logger(job_id="123").info("step_seen", step=316)
        with structlog.contextvars.bound_contextvars(job_id="456"):
            get_logger().warning("stall")
        get_logger().debug("hidden")
    finally:
        structlog.reset_defaults()
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert [(d["event"], d["job_id"], d["level"]) for d in lines] == [
        ("step_seen", "123", "info"),
        ("stall", "456", "warning"),
    ]
    assert lines[0]["timestamp"].endswith("Z")
