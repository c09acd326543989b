"""`jobdiagd backtest --site-prometheus URL`: a job without a TSDB of its own (not RAY=1) replayed
against a site Prometheus serving a promtool-built TSDB of AMD Device Metrics Exporter and
node_exporter series (jobdiagd_sim.site_metrics), the early page's queries at the virtual time."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from jobdiagd.cli import main
from jobdiagd.config import loads
from jobdiagd.detectors.hang import KIND as HANG
from jobdiagd.model.kinds import GpuHangState
from jobdiagd.tsdb.access import LocalPrometheus
from jobdiagd_sim.metrics import JobFiles, JobSim, scenario, write_job
from jobdiagd_sim.site_metrics import build_site_tsdb


def config(tmp: Path) -> Path:
    path = tmp / "jobdiagd.toml"
    path.write_text(
        f'[tsdb]\nwork_dir = "{tmp}"\n'
        # The simulator's exporters are scraped every 10 s (its hw_interval).
        '[site_prometheus]\nprofile = "amd"\nscrape_interval_seconds = 10\ntimeout_seconds = 5\n'
    )
    return path


@contextlib.asynccontextmanager
async def site_of(name: str, tmp: Path, **sc: object) -> AsyncIterator[tuple[JobSim, JobFiles, str]]:
    """A non-RAY job's files and a Prometheus serving its hosts' site series."""
    sim = JobSim(scenario(name, **sc))  # type: ignore[arg-type]
    files = write_job(sim, tmp / "outputs", ray=False, with_tsdb=False, hang_chatter_s=45.0)
    assert not files.prometheus.exists()  # nothing of its own to ask
    build_site_tsdb(sim, tmp / "site", vendor="amd", work=tmp)
    async with LocalPrometheus(tmp / "site", loads(config(tmp).read_text()).tsdb) as prom:
        yield sim, files, prom.base_url


def backtest(*args: str) -> tuple[int, dict[str, object]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["backtest", "--json", *args])
    return rc, json.loads(out.getvalue())


@pytest.mark.prometheus
async def test_a_non_ray_hang_is_paged_early_from_the_site_tsdb(tmp_path: Path) -> None:
    async with site_of("rccl-hang", tmp_path) as (sim, files, url):
        rc, doc = await asyncio.to_thread(
            backtest, str(files.job_dir), "--config", str(config(tmp_path)), "--site-prometheus", url
        )
    assert rc == 0
    (job,) = doc["jobs"]  # type: ignore[misc]
    pages = [a for a in job["alerts"] if a["kind"] == HANG and a["event"] == "open"]
    (page,) = pages
    assert page["gpu_confirmed"] and "GPU-confirmed hang (busy-wait)" in page["summary"]
    assert "MI300X" in page["summary"]  # the bands of the exporter's card_series
    assert job["early_source"] == f"site Prometheus {url}"
    assert job["early_states"] == {GpuHangState.BUSY_WAIT: 1}
    st = job["step_time_s"]
    latency = page["at_s"] - (job["last_step_at_s"] + st)
    assert latency <= 1.5 * st + 20.0 + 10.0  # the early point plus one scrape interval


@pytest.mark.prometheus
async def test_a_dead_node_is_named_and_a_healthy_pause_is_not_paged(tmp_path: Path) -> None:
    async with site_of("dead-process", tmp_path / "dead") as (sim, files, url):
        rc, doc = await asyncio.to_thread(
            backtest, str(files.job_dir), "--config", str(config(tmp_path / "dead")), "--site-prometheus", url
        )
    assert rc == 0
    (job,) = doc["jobs"]  # type: ignore[misc]
    (page,) = [a for a in job["alerts"] if a["kind"] == HANG and a["event"] == "open"]
    assert page["gpu_confirmed"] and "(dead-node)" in page["summary"]
    assert f"Suspect host: {sim.sc.bad_host}" in page["summary"]

    async with site_of("healthy-evals", tmp_path / "healthy") as (_sim, files, url):
        rc, doc = await asyncio.to_thread(
            backtest,
            str(files.job_dir),
            "--config",
            str(config(tmp_path / "healthy")),
            "--site-prometheus",
            url,
        )
    (job,) = doc["jobs"]  # type: ignore[misc]
    assert not [a for a in job["alerts"] if a["kind"] == HANG]
    assert job["early_queries"] > 0 and GpuHangState.BUSY_WAIT not in job["early_states"]


def test_a_url_with_credentials_is_refused_without_echoing_it(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["backtest", "/nonexistent", "--site-prometheus", "http://user:hunter2@prom:9090"])
    err = capsys.readouterr().err
    assert rc == 2 and "must not carry credentials" in err and "hunter2" not in err
