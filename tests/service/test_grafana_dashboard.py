"""deploy/grafana/jobdiagd.json: a well-formed dashboard over the daemon's own metrics, and every
panel's every query answered by a real Prometheus scraping a running daemon.

The live test runs `jobdiagd run` on two jobs (one training, one hung), a Prometheus
(`scripts/services/prometheus.sh`) scraping its `/metrics` every second, and asks Prometheus each
query of the dashboard with the template variables substituted, the job being the hung one
(every per-job number is known for it, open incidents included).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.detectors.hang import KIND as HANG
from jobdiagd.service.metrics import JOB_GAUGES, DaemonMetrics, DaemonState, JobSample
from jobdiagd_sim import lines as L
from tests.helpers.daemon import start_daemon, write_cfg
from tests.helpers.joblog import JobLog
from tests.helpers.local_services import running_prometheus, scrape_config

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "jobdiagd.json"
# Grafana's built-in variables a query may use, as a dashboard with 1 s scrapes would resolve them.
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel but rows (and the panels of collapsed rows)."""
    out: list[dict[str, Any]] = []
    for p in doc["panels"]:
        if p["type"] == "row":
            out += p.get("panels") or []
        else:
            out.append(p)
    return out


def queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title / refId, expr) of every target of every panel."""
    return [(f"{p['title']} / {t['refId']}", t["expr"]) for p in panels(doc) for t in p["targets"]]


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name in values:
            return values[name]
        if name in BUILTINS:
            return BUILTINS[name]
        raise AssertionError(f"unknown template variable ${name} in {expr!r}")

    return VAR.sub(one, expr)


def exported_names() -> set[str]:
    """Every series name the daemon's collector exports (histogram and counter suffixes included)."""
    m = DaemonMetrics()
    m.read_state(lambda: DaemonState(jobs=[JobSample("1", step=1)]))
    names: set[str] = set()
    for fam in m.collect():
        names.add(fam.name)
        names |= {s.name for s in fam.samples}
        if fam.type == "counter":
            names.add(fam.name + "_total")
        if fam.type == "histogram":
            names |= {fam.name + suffix for suffix in ("_bucket", "_count", "_sum")}
    return names


# -- the file --------------------------------------------------------------------------------------


def test_the_dashboard_is_grafana_shaped_and_queries_only_what_the_daemon_exports() -> None:
    doc = dashboard()
    assert doc["uid"] == "jobdiagd" and doc["title"] and isinstance(doc["schemaVersion"], int)
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    job = variables["job_id"]
    assert job["type"] == "query" and job["datasource"]["uid"] == "${datasource}"
    assert re.fullmatch(r"label_values\(jobdiagd_job_\w+, job_id\)", job["query"]["query"])
    ids = [p["id"] for p in doc["panels"]] + [p["id"] for p in panels(doc) if p not in doc["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    exported = exported_names()
    cells: set[tuple[int, int]] = set()
    for p in doc["panels"]:
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in ("x", "y", "w", "h")) and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not (mine & cells), f"panel {p['title']!r} overlaps another"
        cells |= mine
    for p in panels(doc):
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], f"panel {p['title']!r} has no query"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip(), p["title"]
            for name in re.findall(r"\bjobdiagd_\w+", t["expr"]):
                assert name in exported, f"{p['title']}: {name} is not a metric the daemon exports"
    per_job = [e for _, e in queries(doc) if "jobdiagd_job_" in e and "$job_id" in e]
    # The job row: step vs expected, step time, TGS, stall vs budget, ETA, goodput, incidents.
    shown = {n for e in per_job for n in re.findall(r"\bjobdiagd_job_\w+", e)}
    wanted = {
        "jobdiagd_job_step",
        "jobdiagd_job_expected_step",
        "jobdiagd_job_step_time_seconds",
        "jobdiagd_job_tokens_per_second_per_device",
        "jobdiagd_job_stall_seconds",
        "jobdiagd_job_stall_budget_seconds",
        "jobdiagd_job_eta_seconds",
        "jobdiagd_job_goodput_ratio",
        "jobdiagd_job_open_incidents",
    }
    assert wanted <= shown
    assert wanted - {"jobdiagd_job_open_incidents"} <= {name for name, _, _ in JOB_GAUGES}


def test_template_variables_are_substituted_and_unknown_ones_refused() -> None:
    assert substitute('x{job_id="$job_id"}[$__rate_interval]', {"job_id": "7"}) == 'x{job_id="7"}[1m]'
    assert substitute("${job_id}", {"job_id": "7"}) == "7"
    with pytest.raises(AssertionError):
        substitute("$nope", {})


# -- against a real Prometheus scraping a running daemon ---------------------------------------------


def prom(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as resp:
        doc = json.load(resp)
    assert doc["status"] == "success", doc
    return doc["data"]


def query(port: int, expr: str) -> list[dict[str, Any]]:
    data = prom(port, "/api/v1/query", query=expr)
    result: list[dict[str, Any]] = data["result"]
    return result


def wait_until(port: int, expr: str, what: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            if query(port, expr):
                return
        except OSError:
            pass  # Prometheus still starting
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what} ({expr})")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dated_step(job: JobLog, n: int, at: float) -> None:
    f = L.StepFields(step=n, seconds=2.0, tflops=47.0, tokens=3000.0 + n % 7, total_weights=196608, loss=2.5)
    job.write("0: " + L.absl_prefix(at, 77, "metric_logger.py:232") + L.step_line(f))


@pytest.fixture
def training(tmp_path: Path) -> Iterator[tuple[JobLog, JobLog]]:
    """Job 7101 trains (a dated step every 0.4 s); job 7102 trained 30 steps and went silent."""
    outputs = tmp_path / "outputs"
    now = time.time()
    jobs = []
    for job_id in ("7101", "7102"):
        job = JobLog(outputs, job_id, nnodes=1)
        job.write(
            *("0: " + x for x in L.env_dump({"SLURM_JOB_USER": "alice", "SLURM_JOB_PARTITION": "mi300x"}))
        )
        for n in range(30):
            dated_step(job, n, now - 62 + 2 * n)
        jobs.append(job)
    stop = threading.Event()

    def train() -> None:
        n = 30
        while not stop.wait(0.4):
            dated_step(jobs[0], n, time.time())
            n += 1

    t = threading.Thread(target=train, daemon=True)
    t.start()
    try:
        yield jobs[0], jobs[1]
    finally:
        stop.set()
        t.join(timeout=5)


@pytest.mark.prometheus
@pytest.mark.daemon
def test_every_panel_query_returns_data_from_prometheus_scraping_the_daemon(
    tmp_path: Path,
    training: tuple[JobLog, JobLog],
    procs: list[subprocess.Popen[bytes]],
) -> None:
    healthy, hung = training
    metrics_port = free_port()
    metrics_key = f"metrics_port = {metrics_port}\n"
    cfg = write_cfg(tmp_path, min_stall=3, log_level="warning", console=False, daemon=metrics_key)
    procs.append(start_daemon(cfg, healthy.outputs, tmp_path / "daemon.log"))
    prom_cfg = tmp_path / "prometheus.yml"
    prom_cfg.write_text(scrape_config("jobdiagd", [metrics_port]))
    with running_prometheus(tmp_path / "svc", "grafana-test", prom_cfg, tmp_path / "prom-data") as port:
        deadline = time.monotonic() + 120
        # The first scrapes landed: the hung job's page open, both jobs' goodput computed, the
        # daemon's counters scraped often enough for a rate.
        wait_until(
            port, f'jobdiagd_job_open_incidents{{job_id="{hung.job_id}",kind="{HANG}"}}', "the hang", deadline
        )
        wait_until(port, "count(jobdiagd_job_goodput_ratio) == 2", "both goodputs", deadline)
        wait_until(port, "count_over_time(jobdiagd_ticks_total[1m]) >= 3", "three scrapes", deadline)
        values = {"job_id": hung.job_id, "datasource": "prometheus"}
        empty = [
            (where, expr) for where, expr in queries(dashboard()) if not query(port, substitute(expr, values))
        ]
        assert not empty, f"panel queries without data: {empty}"
        # The job variable's query lists both jobs.
        var = prom(port, "/api/v1/label/job_id/values", **{"match[]": "jobdiagd_job_step"})
        assert set(var) == {healthy.job_id, hung.job_id}
        # The training job's numbers are there too (its stall within budget, no incident).
        for name, _, _ in JOB_GAUGES:
            assert query(port, f'{name}{{job_id="{healthy.job_id}"}}'), name
        assert not query(port, f'jobdiagd_job_open_incidents{{job_id="{healthy.job_id}"}}')
