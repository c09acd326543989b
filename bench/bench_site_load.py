"""The load the daemon's early page puts on a site Prometheus: N watched non-RAY jobs, some overdue.

    .venv/bin/python bench/bench_site_load.py [--jobs 1000] [--overdue-pct 5] [--seconds 60] [--share 1]

(also run by bench/bench_early_page.py). A real Prometheus (scripts/services/prometheus.sh)
scrapes simulated DCGM and node exporters (tests/helpers/site_exporters.py, every 5 s) of every
overdue job's nodes; the daemon's early page (`service.early_page.EarlyConfirmer` with
`service.site_source.SiteJobs`, the map checked first, scrape interval 15 s as configured at a
site) is polled every 0.5 s over the watched jobs' views, as the tick loop polls it (at least
`MIN_EARLY_GAP_S` apart). Reported: Prometheus' own count of `/api/v1/query_range` requests
over the window, per second, beside the bound (overdue jobs / scrape interval) and the source's
own count. Node sharing: each overdue job on its own 4 nodes (no two share a node set: the
worst case for the source's per-node-set cache); `--share K` puts K overdue jobs on each node
set (what a partition of small shared nodes does), which the cache answers with one query. The other jobs' steps are recent (their early
point is 70 s away, past the window): they cost nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.site_exporters import ExporterServer, SimNode, SiteCluster  # noqa: E402

from jobdiagd.config import Config, loads  # noqa: E402
from jobdiagd.detectors.hang import HangDetector, early_rule_from_config, policy_from_config  # noqa: E402
from jobdiagd.logs.state import LogState  # noqa: E402
from jobdiagd.model.jobref import JobRef  # noqa: E402
from jobdiagd.service.early_page import EarlyConfirmer  # noqa: E402
from jobdiagd.service.jobs import JobView  # noqa: E402
from jobdiagd.service.site_source import SiteJobs, build_site_source  # noqa: E402
from jobdiagd.sources.slurm_parse import SlurmJob  # noqa: E402
from jobdiagd.tsdb.access import SshTunnelPool  # noqa: E402
from jobdiagd_sim import lines as L  # noqa: E402

PROM_SH = REPO / "scripts" / "services" / "prometheus.sh"
STEP_S = 20.0  # early point 20 + 1.5 x 20 + 20 = 70 s after a step's read
NODES_PER_JOB = 4
INTERVAL_S = 15.0  # the source's scrape interval (a site's usual)
SCRAPE = "5s"  # how often the test Prometheus scrapes (data sooner; the load follows INTERVAL_S)
POLL_S = 0.5


def _config(url: str) -> Config:
    return loads(
        f"""
[detectors.hang]
min_stall_seconds = 900
[site_prometheus]
enabled = true
url = "{url}"
profile = "dcgm"
exclusive_nodes = true
scrape_interval_seconds = {INTERVAL_S}
"""
    )


def _view(key: str, nodes: str, last_at: float, cfg: Config, det: HangDetector) -> JobView:
    """A non-RAY job 30 steps in, its last step read at `last_at`, its budget computed."""
    state = LogState(f"/x/{key}.log", ref_time=last_at)
    view = JobView(
        key=key,
        ref=JobRef(key, "JAX-t", None, Path(f"/x/{key}.log"), "slurm"),
        first_seen=last_at - 30 * STEP_S,
        main=state,
        policy=policy_from_config(cfg),
        slurm=SlurmJob(key, "JAX-t", "alice", "RUNNING", "gpu", nodes=nodes),
    )
    n = 0
    for ln in L.header_lines(
        job_id=key,
        name="JAX-t",
        nnodes=NODES_PER_JOB,
        nodelist=nodes,
        jax_port=1,
        ray_port=None,
        passthrough={"steps": 100_000},
        model="m",
    ):
        n += 1
        state.feed(ln, n)
    t = last_at - 29 * STEP_S
    for k in range(30):
        f = L.StepFields(step=k, seconds=STEP_S, tflops=1.0, tokens=3000.0, total_weights=1, loss=1.0)
        n += 1
        state.feed("0: " + L.absl_prefix(t, 4242, "metric_logger.py:232") + L.step_line(f), n)
        view.note_read(t)
        det.check(view, t)
        t += STEP_S
    return view


def _requests(port: int) -> float:
    """Prometheus' own count of `/api/v1/query_range` requests (its /metrics: it does not scrape itself)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query_range"' in line
    )


def _scraped(port: int, targets: int) -> bool:
    q = urllib.parse.urlencode({"query": "count(count_over_time(up[1m]) >= 3)"})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{q}", timeout=10) as r:
        res = json.load(r)["data"]["result"]
    return bool(res) and int(float(res[0]["value"][1])) >= targets


def run_load(jobs: int, overdue_pct: float, seconds: float, root: Path, share: int = 1) -> dict[str, Any]:
    overdue = max(1, round(jobs * overdue_pct / 100.0))
    cluster = SiteCluster()
    for i in range(-(-overdue // share) * NODES_PER_JOB):
        # Training at full power (the log lags): never confirmed, so asked every interval until the
        # step budget -- the most queries an overdue job can cost.
        cluster.add(SimNode(f"n{i + 1:04d}", "dcgm"))
    env = {**os.environ, "JOBDIAGD_SVC_DIR": str(root / "svc")}
    with ExporterServer(cluster) as server:
        (root / "prometheus.yml").write_text(server.prometheus_config(SCRAPE))
        subprocess.run(
            ["bash", str(PROM_SH), "start", "site-load", str(root / "prometheus.yml"), str(root / "data")],
            env=env,
            check=True,
            capture_output=True,
        )
        try:
            port = int((root / "svc" / "prometheus-site-load.port").read_text())
            deadline = time.monotonic() + 120
            while not _scraped(port, 2 * len(cluster.nodes)):
                if time.monotonic() > deadline:
                    raise RuntimeError("Prometheus did not scrape every exporter 3 times in 120 s")
                time.sleep(1.0)
            return asyncio.run(_measure(port, jobs, overdue, seconds, share))
        finally:
            subprocess.run(
                ["bash", str(PROM_SH), "stop", "site-load"], env=env, check=False, capture_output=True
            )


async def _measure(port: int, jobs: int, overdue: int, seconds: float, share: int) -> dict[str, Any]:
    cfg = _config(f"http://127.0.0.1:{port}")
    src = build_site_source(cfg)
    assert src is not None
    check = await src.check_map()
    if not check.ok:
        raise RuntimeError(f"the map check failed: {check.errors}")
    site = SiteJobs(cfg, src)
    det = HangDetector(policy_from_config(cfg), early_rule_from_config(cfg), site=True)
    now = time.time()
    views: dict[str, JobView] = {}
    for j in range(jobs):
        key = str(100_000 + j)
        if j < overdue:
            first = (j // share) * NODES_PER_JOB + 1
            nodes = f"n[{first:04d}-{first + NODES_PER_JOB - 1:04d}]"
            views[key] = _view(key, nodes, now - 80.0, cfg, det)  # overdue since 10 s
        else:  # its step read "later": its early point comes after the measurement
            views[key] = _view(key, "n9999", now + seconds + 60.0, cfg, det)
    early = EarlyConfirmer(cfg.tsdb, SshTunnelPool(cfg.tsdb.ssh))
    early.site = site

    # Every overdue job is asked once per interval, in rounds (they became overdue together). The
    # rate is taken over whole rounds: the queries sent from the start of the first round to the
    # start of the last one, over the time between them (a window cut mid-round would count a
    # round more or less). Prometheus' own count over the whole run checks the source's.
    before_prom, before_src = _requests(port), src.queries
    samples: list[tuple[float, int]] = []  # (time of a poll, queries sent before it)
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        samples.append((time.monotonic(), src.queries))
        early.poll(views, time.time(), [det])
        await asyncio.sleep(POLL_S)
    await asyncio.sleep(src.cfg.timeout_s)  # the last queries answered
    prom_queries = _requests(port) - before_prom
    starts = _round_starts(samples)
    if len(starts) >= 2:
        (t0, q0), (t1, q1) = starts[0], starts[-1]
        qps, rounds, period = (q1 - q0) / (t1 - t0), len(starts) - 1, (t1 - t0) / (len(starts) - 1)
    else:
        qps, rounds, period = float("nan"), 0, float("nan")
    states: dict[str, int] = {}
    for v in views.values():
        if v.gpu_check is not None:
            states[str(v.gpu_check.verdict.state)] = states.get(str(v.gpu_check.verdict.state), 0) + 1
    await early.close()
    await site.close()
    return {
        "jobs": jobs,
        "overdue": overdue,
        "overdue_pct": 100.0 * overdue / jobs,
        "nodes_per_job": NODES_PER_JOB,
        "jobs_per_node_set": share,
        "node_sets": -(-overdue // share),
        "interval_s": INTERVAL_S,
        "seconds": seconds,
        "prometheus_queries": int(prom_queries),
        "source_queries": src.queries - before_src,
        "rounds": rounds,
        "round_period_s": period,
        "qps": qps,
        "bound_qps": overdue / INTERVAL_S,
        "answers": src.answers,
        "answered_jobs": sum(states.values()),
        "states": states,
    }


def _round_starts(samples: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """(poll time, queries sent before it) of each poll that started a round: the first poll whose
    queries grew after at least half an interval without any."""
    out: list[tuple[float, int]] = []
    last_growth = float("-inf")
    for (t, q), (_t_next, q_next) in zip(samples, samples[1:], strict=False):
        if q_next > q:
            if t - last_growth >= INTERVAL_S / 2:
                out.append((t, q))
            last_growth = t
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--overdue-pct", type=float, default=5.0)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--share", type=int, default=1, help="overdue jobs per node set")
    a = p.parse_args(argv)
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    with tempfile.TemporaryDirectory(prefix="bench-site-load-") as tmp:
        r = run_load(a.jobs, a.overdue_pct, a.seconds, Path(tmp), a.share)
    print(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
