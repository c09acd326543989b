"""The early page's scheduling edge: overdue RAY=1 jobs asked once per scrape interval, bounded, and the
engine paging a GPU-confirmed hang at once. The TSDB query is a stand-in here (it runs against real
Prometheus through the backtest in tests/service/test_backtest_early.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.alerts.store import DB_NAME
from jobdiagd.config import Config, loads
from jobdiagd.detectors import build
from jobdiagd.detectors.hang import HangDetector, early_rule_from_config, policy_from_config
from jobdiagd.logs.state import LogState
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.kinds import GpuHangState
from jobdiagd.service.discovery import OutputsDiscovery
from jobdiagd.service.early_page import EarlyConfirmer
from jobdiagd.service.engine import Engine
from jobdiagd.service.jobs import JobView
from jobdiagd.service.tick_loop import TickLoop
from jobdiagd.service.tsdb_enrich import TsdbEnricher
from jobdiagd.sources.tail import OffsetStore
from jobdiagd.tsdb.access import SshTunnelPool
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.gpu_hang import GpuVerdict
from jobdiagd.tsdb.settings import SshSettings
from jobdiagd_sim import lines as L
from tests.helpers.engine import make_cfg

T0 = 1_780_000_000.0
STEP = 10.0
EARLY_AT = STEP + 1.5 * STEP + 20.0  # after the last step's read; the step budget is 120 s
BUSY = GpuVerdict(
    GpuHangState.BUSY_WAIT, "every GPU of all 2 host(s) busy-waits", T0, per_host={"node001": "8 busy-wait"}
)


def ray_lines(job_id: str) -> list[str]:
    return [
        *L.header_lines(
            job_id=job_id,
            name="JAX-llama3.1-8b-test",
            nnodes=2,
            nodelist="node[001-002]",
            jax_port=12321,
            ray_port=6379,
            passthrough={"steps": 1000},
            model="llama3.1-8b",
        ),
        "[Ray] Starting HEAD on node001:6379 (bind=10.0.0.1)",
        "[Prometheus] Started on port 9191 (ray: 'node001:55080', node_hw: 'node001:9400')",
    ]


def step_line(k: int, t: float, seconds: float = STEP) -> str:
    f = L.StepFields(step=k, seconds=seconds, tflops=1.0, tokens=3000.0, total_weights=1, loss=1.0)
    return "0: " + L.absl_prefix(t, 4242, "metric_logger.py:232") + L.step_line(f)


def cfg_for(state: Path, **tsdb: Any) -> Config:
    return make_cfg(state, "[tsdb]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in tsdb.items()))


# --- the confirmer on job views --------------------------------------------------------------------


def stalled_view(
    key: str, cfg: Config, *, ray: bool = True, det: HangDetector | None = None
) -> tuple[JobView, float, HangDetector]:
    """A job view 30 steps in, its hang budget computed by `det` (a new one by default), as the
    tick leaves it."""
    state = LogState(f"/x/{key}.log", ref_time=T0)
    view = JobView(
        key=key,
        ref=JobRef(key, "JAX-t", None, Path(f"/x/{key}.log"), "slurm"),
        first_seen=T0,
        main=state,
        policy=policy_from_config(cfg),
    )
    n = 0
    for ln in ray_lines(key) if ray else ray_lines(key)[:-2]:
        n += 1
        state.feed(ln, n)
    det = det if det is not None else HangDetector(policy_from_config(cfg), early_rule_from_config(cfg))
    t = T0
    for k in range(30):
        t += STEP
        n += 1
        state.feed(step_line(k, t), n)
        view.note_read(t)
        det.check(view, t)
    return view, t, det


class Stub:
    """The query: records calls, can hold them until released, answers a fixed verdict."""

    def __init__(self, verdict: GpuVerdict, *, hold: bool = False, first: GpuVerdict | None = None) -> None:
        self.verdict = verdict
        self.first = first  # the answer to the first query, when it differs
        self.calls: list[tuple[str | None, float]] = []
        self.release = asyncio.Event()
        if not hold:
            self.release.set()
        self.running = 0
        self.peak = 0

    async def __call__(self, ctx: DiagnosisContext, now: float) -> GpuVerdict:
        self.calls.append((ctx.job_id, now))
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        return self.first if self.first is not None and len(self.calls) == 1 else self.verdict


def confirmer(cfg: Config, stub: Stub) -> EarlyConfirmer:
    return EarlyConfirmer(cfg.tsdb, SshTunnelPool(SshSettings()), query_fn=stub)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_asks_once_the_step_is_overdue_then_once_per_scrape_interval(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    view, last, det = stalled_view("7201", cfg)
    stub = Stub(GpuVerdict(GpuHangState.NOT_A_HANG, "eval: GPUs at 520 W", T0))
    early = confirmer(cfg, stub)
    early.poll({"7201": view}, last + EARLY_AT - 1, [det])
    assert stub.calls == [] and early.next_poll_at() == last + EARLY_AT
    early.poll({"7201": view}, last + EARLY_AT, [det])
    await settle()
    assert stub.calls == [("7201", last + EARLY_AT)]
    assert view.gpu_check is not None and view.gpu_check.verdict.state is GpuHangState.NOT_A_HANG
    early.poll({"7201": view}, last + EARLY_AT + 5, [det])  # within the scrape interval: no second query
    await settle()
    assert len(stub.calls) == 1 and early.next_poll_at() == last + EARLY_AT + 10
    early.poll({"7201": view}, last + EARLY_AT + 10, [det])
    await settle()
    assert len(stub.calls) == 2 and not early.wake.is_set()
    early.poll({"7201": view}, last + 121, [det])  # past the step budget: the budget pages, nothing to ask
    await settle()
    assert len(stub.calls) == 2 and early.next_poll_at() is None


async def test_a_confirmation_wakes_the_engine_and_stops_the_queries(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    view, last, det = stalled_view("7202", cfg)
    stub = Stub(BUSY)
    early = confirmer(cfg, stub)
    early.poll({"7202": view}, last + EARLY_AT, [det])
    await settle()
    assert early.wake.is_set() and early.take_confirmed() == {"7202"} and not early.wake.is_set()
    early.poll({"7202": view}, last + EARLY_AT + 10, [det])
    await settle()
    assert len(stub.calls) == 1  # confirmed for this step: nothing more to ask


async def test_concurrency_is_bounded_and_a_slow_job_is_not_queued_twice(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path, early_max_concurrent=2)
    views = {}
    last = 0.0
    det = HangDetector(policy_from_config(cfg), early_rule_from_config(cfg))
    for i in range(5):
        v, last, det = stalled_view(f"73{i:02d}", cfg, det=det)
        views[v.key] = v
    stub = Stub(GpuVerdict(GpuHangState.TRAINING, "training", T0), hold=True)
    early = confirmer(cfg, stub)
    early.poll(views, last + EARLY_AT, [det])
    await settle()
    assert stub.running == 2 and len(stub.calls) == 2  # the other three wait for the semaphore
    early.poll(views, last + EARLY_AT + 10, [det])  # every job still has its query in flight
    await settle()
    assert len(stub.calls) == 2
    stub.release.set()
    await settle()
    assert len(stub.calls) == 5 and stub.peak == 2
    await early.close()


async def test_a_job_without_a_tsdb_is_never_asked(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    view, last, det = stalled_view("7203", cfg, ray=False)
    stub = Stub(BUSY)
    early = confirmer(cfg, stub)
    early.poll({"7203": view}, last + EARLY_AT + 1, [det])
    await settle()
    assert stub.calls == []


async def test_a_failing_query_is_no_data(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    view, last, det = stalled_view("7204", cfg)

    async def broken(ctx: DiagnosisContext, now: float) -> GpuVerdict:
        raise RuntimeError("boom")

    early = EarlyConfirmer(cfg.tsdb, SshTunnelPool(SshSettings()), query_fn=broken)
    early.poll({"7204": view}, last + EARLY_AT, [det])
    await settle()
    memo = view.gpu_check
    assert (
        memo is not None
        and memo.verdict.state is GpuHangState.NO_DATA
        and "boom" in memo.verdict.summary
        and not early.wake.is_set()
    )


# --- through the engine ------------------------------------------------------------------------------


def outbox(state: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(state / "alerts.sqlite3") as c:
        return [json.loads(r[0]) for r in c.execute("SELECT data FROM outbox ORDER BY rowid")]


class Daemon:
    def __init__(self, state: Path, outputs: Path, stub: Stub, **tsdb: Any) -> None:
        self.cfg = cfg_for(state, **tsdb)
        self.pipeline = AlertPipeline.open(state, self.cfg.incidents, ["jsonl"])
        self.offsets = OffsetStore(state / DB_NAME)
        self.enricher = TsdbEnricher(self.cfg.tsdb, tick_s=15, early_fn=stub)
        self.engine = Engine(
            self.cfg,
            self.pipeline,
            build(self.cfg),
            OutputsDiscovery([outputs], set()),
            offsets=self.offsets,
            enricher=self.enricher,
        )

    def close(self) -> None:
        self.offsets.close()
        self.pipeline.close()


def write_job(outputs: Path, job_id: str) -> Path:
    name = "JAX-llama3.1-8b-test"
    d = outputs / f"{job_id}-{name}"
    d.mkdir(parents=True)
    log = outputs / f"{job_id}-{name}.log"
    (d / "log").symlink_to(f"../{log.name}")
    log.write_text("\n".join(ray_lines(job_id)) + "\n")
    return log


async def test_the_engine_pages_a_gpu_confirmed_hang_at_once(tmp_path: Path) -> None:
    state, outputs = tmp_path / "state", tmp_path / "outputs"
    log = write_job(outputs, "7210")
    stub = Stub(BUSY)
    d = Daemon(state, outputs, stub)
    early = d.enricher.early
    assert early is not None
    t = T0
    for k in range(30):
        t += STEP
        with log.open("a") as fh:
            fh.write(step_line(k, t) + "\n")
        await d.engine.tick(t)
    last = t
    views = {k: w.view for k, w in d.engine.jobs.items()}
    # What Engine.run does: full ticks, a poll after each and when one is due, and on a
    # confirmation an early partial tick.
    for now in (last + 15, last + 30):
        await d.engine.tick(now)
        early.poll(views, now, d.engine.detectors)
        await settle()
    assert stub.calls == [] and early.next_poll_at() == last + EARLY_AT
    early.poll(views, last + EARLY_AT, d.engine.detectors)
    await settle()
    assert len(stub.calls) == 1 and early.wake.is_set()
    await d.engine.tick(last + EARLY_AT, early.take_confirmed(), early=True)
    (opened,) = [n for n in outbox(state) if n["event"] == "open"]
    assert opened["kind"] == "hang" and "GPU-confirmed hang (busy-wait)" in opened["body"]
    assert "every GPU of all 2 host(s) busy-waits" in opened["body"]
    (snap,) = d.engine.snapshot_jobs(last + EARLY_AT)
    assert snap["gpu_check"]["state"] == "busy-wait" and snap["open_incidents"] == ["hang"]
    # Later full ticks (past the step budget too) keep the one incident, without a second verdict query.
    for now in (last + 60, last + 135, last + 150):
        await d.engine.tick(now)
        await settle()
    assert [(n["event"], n["kind"]) for n in outbox(state)] == [("open", "hang")]
    assert len(stub.calls) == 1
    await d.enricher.close()
    d.close()


async def test_an_open_failure_incident_does_not_hold_back_the_gpu_confirmed_page(tmp_path: Path) -> None:
    """One task's training process exits right after the last step (a failure incident opens at
    once) while the others spin in the collective: the GPU-confirmed hang page still goes out at
    the early point, not at the step budget (rule HANG-7)."""
    state, outputs = tmp_path / "state", tmp_path / "outputs"
    log = write_job(outputs, "7211")
    stub = Stub(BUSY)
    d = Daemon(state, outputs, stub)
    early = d.enricher.early
    assert early is not None
    t = T0
    for k in range(30):
        t += STEP
        with log.open("a") as fh:
            fh.write(step_line(k, t) + "\n")
        await d.engine.tick(t)
    last = t
    with log.open("a") as fh:
        fh.write("1: " + L.actor_exited(1, "node002", 1) + "\n")
    await d.engine.tick(last + 15)
    assert [(n["event"], n["kind"]) for n in outbox(state)] == [("open", "failure")]
    views = {k: w.view for k, w in d.engine.jobs.items()}
    early.poll(views, last + 15, d.engine.detectors)
    await settle()
    assert stub.calls == [] and early.next_poll_at() == last + EARLY_AT
    early.poll(views, last + EARLY_AT, d.engine.detectors)
    await settle()
    assert len(stub.calls) == 1 and early.wake.is_set()
    await d.engine.tick(last + EARLY_AT, early.take_confirmed(), early=True)
    opened = [n for n in outbox(state) if n["event"] == "open"]
    assert [n["kind"] for n in opened] == ["failure", "hang"]
    assert "GPU-confirmed hang (busy-wait)" in opened[1]["body"]
    for now in (last + 60, last + 135, last + 150):  # past the step budget: still the one page
        await d.engine.tick(now)
        await settle()
    assert [(n["event"], n["kind"]) for n in outbox(state)] == [("open", "failure"), ("open", "hang")]
    await d.enricher.close()
    d.close()


@pytest.mark.parametrize(
    "first", [None, GpuVerdict(GpuHangState.MIXED, "one scrape of busy-wait so far", T0)]
)
async def test_the_daemon_loop_pages_between_full_ticks(tmp_path: Path, first: GpuVerdict | None) -> None:
    """The tick loop on the real clock: once the steps stop, the next full tick is 30 s away and the
    step budget 120 s; the GPU-confirmed page comes from the loop's early polls (again one scrape
    interval after an unconfirmed answer) and its partial tick."""
    state, outputs = tmp_path / "state", tmp_path / "outputs"
    log = write_job(outputs, "7212")
    stub = Stub(BUSY, first=first)
    d = Daemon(state, outputs, stub, early_overdue_slack_s=0.5, early_scrape_interval_s=1.0)
    period = {"s": 0.05}
    stop = asyncio.Event()

    async def sleep(seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
        return stop.is_set()

    loop = asyncio.create_task(TickLoop(d.engine).run(sleep, lambda: period["s"]))
    try:
        for k in range(12):
            with log.open("a") as fh:
                fh.write(step_line(k, T0 + k, seconds=0.1) + "\n")
            await asyncio.sleep(0.1)
        period["s"] = 30.0
        await asyncio.sleep(0.2)  # the last short tick reads the last step
        full_before = len(d.engine.durations["full"])
        for _ in range(200):
            if any(n["event"] == "open" for n in outbox(state)):
                break
            await asyncio.sleep(0.1)
        (opened,) = [n for n in outbox(state) if n["event"] == "open"]
        assert "GPU-confirmed hang (busy-wait)" in opened["body"]
        assert len(d.engine.durations["full"]) == full_before  # no full tick in between
        assert len(d.engine.durations["partial"]) >= 1 and len(stub.calls) == (1 if first is None else 2)
    finally:
        stop.set()
        await loop
        await d.enricher.close()
        d.close()


# --- the site Prometheus as the second source ------------------------------------------------------------


def site_jobs(cfg: Config) -> Any:
    """A checked site source whose server does not answer (no Prometheus in a unit test): every
    verdict it gives is `no-data` naming the site."""
    from jobdiagd.service.site_source import SiteJobs, build_site_source
    from jobdiagd.tsdb.access import free_loopback_port

    site_cfg = loads(
        f'[site_prometheus]\nenabled = true\nurl = "http://127.0.0.1:{free_loopback_port()}"\n'
        "scrape_interval_seconds = 15\n"
    )
    src = build_site_source(site_cfg)
    assert src is not None
    return SiteJobs(site_cfg, src)


def placed(view: JobView, nodes: str = "node[001-002]") -> JobView:
    from jobdiagd.sources.slurm_parse import SlurmJob

    view.slurm = SlurmJob(view.key, "JAX-t", "alice", "RUNNING", "gpu", nodes=nodes)
    return view


async def test_a_job_without_its_own_prometheus_is_asked_on_the_site_at_its_interval(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    det = HangDetector(policy_from_config(cfg), early_rule_from_config(cfg), site=True)
    view, last, det = stalled_view("7220", cfg, ray=False, det=det)
    view = placed(view)
    stub = Stub(BUSY)
    early = confirmer(cfg, stub)
    early.site = site_jobs(cfg)
    early.poll({"7220": view}, last + EARLY_AT, [det])
    await settle()
    for _ in range(50):
        if view.gpu_check is not None:
            break
        await asyncio.sleep(0.02)
    assert stub.calls == []  # no Prometheus of its own
    memo = view.gpu_check
    assert memo is not None and memo.verdict.state is GpuHangState.NO_DATA
    assert "site Prometheus" in memo.verdict.summary and not early.wake.is_set()
    assert early.site.source.answers == 1
    assert early.next_poll_at() == last + EARLY_AT + 15  # the site's scrape interval, not the job's
    await early.site.close()


async def test_a_ray_jobs_own_prometheus_comes_first_and_the_site_answers_its_no_data(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    view, last, det = stalled_view("7221", cfg)
    view = placed(view)
    own = Stub(GpuVerdict(GpuHangState.NO_DATA, "no hw_gpu_power_watts on node001", T0))
    early = confirmer(cfg, own)
    early.site = site_jobs(cfg)
    early.poll({"7221": view}, last + EARLY_AT, [det])
    for _ in range(50):
        if view.gpu_check is not None:
            break
        await asyncio.sleep(0.02)
    assert len(own.calls) == 1 and early.site.source.answers == 1
    memo = view.gpu_check
    assert memo is not None and "no hw_gpu_power_watts" in memo.verdict.summary  # both unknown: its own said
    training = Stub(GpuVerdict(GpuHangState.TRAINING, "training", T0))
    view2, last2, det2 = stalled_view("7222", cfg)
    view2 = placed(view2)
    early2 = confirmer(cfg, training)
    early2.site = early.site
    early2.poll({"7222": view2}, last2 + EARLY_AT, [det2])
    await settle()
    assert len(training.calls) == 1 and early.site.source.answers == 1  # an answer of its own: no site query
    await early.site.close()
