"""The README's example pages: the daemon's own engine, detectors and chat rendering over simulated jobs.

Two jobs of `jobdiagd_sim.metrics` (the same numbers the pictures are drawn from):

- a RAY=1 job on 8 nodes whose collective hangs after step 737 while node005's training process
  dies. Its log is fed to the real engine step by step on the simulator's clock; once the next
  step is overdue by the early page's margin, the GPU verdict is asked of a real Prometheus
  serving the job's promtool-built TSDB (`tsdb.gpu_hang`, the query and judge the daemon's early
  page uses) and the engine pages the GPU-confirmed hang. Its pictures: the step chart from the
  page's own plot inputs, and the power strip of the last hour read from the same Prometheus;
- the I/O-contention job whose steps are 20 % slower in the last 40 % of the run: the TGS
  detector opens the degradation, the picture comes from the page's plot inputs.

Each page is the incident's Telegram message as a phone shows it (a photo's caption, cut to
Telegram's 1024 characters by the same code as the daemon), with its buttons. The jobs are
watched as `--watch` finds them, with no Slurm: the title names no owner (under squeue it does).
The temporary outputs root is shown as /shared/outputs, so the text is the same on every run.
Needs `prometheus` and `promtool` (scripts/setup.sh installs them).
"""

from __future__ import annotations

import html
import json
import re
import sqlite3
import tempfile
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.alerts.store import DB_NAME
from jobdiagd.chat.incident_view import incident_message
from jobdiagd.chat.model import ChatMessage
from jobdiagd.chat.plot_inputs import chart_title, power_bands, power_strip
from jobdiagd.chat.plots import render
from jobdiagd.chat.telegram_html import CAPTION_LIMIT, render_single
from jobdiagd.config import Config, loads
from jobdiagd.detectors import EarlyMemo, build
from jobdiagd.detectors.hang import HangDetector
from jobdiagd.model.alerts import Notification
from jobdiagd.service.discovery import OutputsDiscovery
from jobdiagd.service.engine import Engine
from jobdiagd.service.plots_bridge import chart_from_payload
from jobdiagd.service.runner import plot_inputs
from jobdiagd.sources.tail import OffsetStore
from jobdiagd.tsdb.access import LocalPrometheus
from jobdiagd.tsdb.client import PromClient
from jobdiagd.tsdb.gpu_hang import GpuVerdict, gpu_query, judge, profile_for
from jobdiagd.tsdb.gpu_strip import WINDOW_S, fetch_gpu_strip
from jobdiagd_sim.joblog import JobLog
from jobdiagd_sim.metrics import JobSim, job_name, scenario, write_job

NODES = tuple(f"node{i:03d}" for i in range(1, 9))
TICK_S = 5.0
# The power strip as `/plot` draws it ten minutes into the stall (at the page it holds 35 s of it).
STRIP_AFTER_S = 600.0


@dataclass(frozen=True)
class Example:
    """One page: its text as a phone shows it, and its pictures (PNG) in the order they are sent."""

    name: str
    text: str
    pictures: tuple[tuple[str, bytes], ...]


def hang_job() -> JobSim:
    return JobSim(
        scenario(
            "dead-process",
            nodes=NODES,
            steps=3000,
            hang_after_steps=737,
            bad_host="node005",
            job_id="4242",
        )
    )


def slide_job() -> JobSim:
    return JobSim(scenario("io-contention", steps=400, job_id="4243"))


def _config(state: Path) -> Config:
    return loads(
        f"""
[daemon]
state_dir = "{state}"
socket_path = "{state}/s.sock"
tick_seconds = {TICK_S}
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
"""
    )


class _Daemon:
    """The engine in-process over one outputs root, on the simulator's clock."""

    def __init__(self, work: Path) -> None:
        self.state, self.outputs = work / "state", work / "outputs"
        self.state.mkdir(parents=True)
        self.cfg = _config(self.state)
        self.pipeline = AlertPipeline.open(self.state, self.cfg.incidents, ["jsonl"])
        self.offsets = OffsetStore(self.state / DB_NAME)
        self.engine = Engine(
            self.cfg,
            self.pipeline,
            build(self.cfg),
            OutputsDiscovery([self.outputs], set()),
            offsets=self.offsets,
            plot_inputs=plot_inputs(self.cfg),
        )

    def opened(self, kind: str) -> Notification | None:
        with sqlite3.connect(self.state / DB_NAME) as c:
            rows = [json.loads(r[0]) for r in c.execute("SELECT data FROM outbox ORDER BY rowid")]
        found = [r for r in rows if r["event"] == "open" and r["kind"] == kind]
        return Notification.from_json(json.dumps(found[0])) if found else None

    def close(self) -> None:
        self.offsets.close()
        self.pipeline.close()


async def _feed(d: _Daemon, job: JobLog, sim: JobSim) -> float:
    """Print the job's steps one by one and tick after each, as the daemon reads a live log."""
    now = sim.train_start
    for s in sim.steps:
        job.step(s.step, seconds=s.seconds, tokens=s.tgs)
        now = s.t
        await d.engine.tick(now)
        if d.opened("tgs-degradation") is not None:
            break
    return now


def as_phone_shows(msg: ChatMessage) -> str:
    """A photo caption as Telegram renders it: the daemon's HTML without its tags, then the buttons."""
    shown = html.unescape(re.sub(r"<[^>]+>", "", render_single(msg, CAPTION_LIMIT)))
    rows = ["  ".join(f"[ {b.label} ]" for b in row) for row in msg.buttons]
    return shown.rstrip() + ("\n\n" + "\n".join(rows) if rows else "")


SHOWN_ROOT = "/shared/outputs"


def _page_text(n: Notification, outputs: Path) -> str:
    """The page as a phone shows it, the temporary outputs root written as SHOWN_ROOT (the same
    text on every run)."""
    text = as_phone_shows(incident_message(n, n.body, token=1, now=n.created_at, tz=UTC))
    return text.replace(str(outputs), SHOWN_ROOT)


def _chart_png(n: Notification) -> bytes:
    if n.plot is None:
        raise RuntimeError(f"the {n.kind} page of job {n.job_id} carries no picture inputs")
    return render(chart_from_payload(n.plot))


async def _gpu_verdict(prom: PromClient, sim: JobSim, at: float, d: _Daemon) -> GpuVerdict:
    settings = d.cfg.tsdb
    series = await prom.query_matrix(gpu_query(settings.early_scrape_interval_s), at)
    return judge(
        series,
        at=at,
        nodes=sim.sc.nodes,
        profile=profile_for(series, settings),
        thresholds=settings.thresholds,
        scrape_interval_s=settings.early_scrape_interval_s,
    )


async def _hang_until_paged(d: _Daemon, sim: JobSim, prom: PromClient, now: float) -> Notification:
    """After the last step: ticks, and the early page's question once the next step is overdue."""
    hang = next(det for det in d.engine.detectors if isinstance(det, HangDetector))
    rule = hang.early
    end = now + 3600.0
    while now < end:
        now += TICK_S
        await d.engine.tick(now)
        w = next(iter(d.engine.jobs.values()))
        due = hang.early_due_at(w.view, rule) if rule is not None else None
        if due is not None and now >= due and w.view.gpu_check is None and w.view.last_step is not None:
            verdict = await _gpu_verdict(prom, sim, now, d)
            w.view.gpu_check = EarlyMemo(w.view.last_step, verdict, w.view.last_step_at)
            await d.engine.tick(now, {w.view.key}, early=True)
        n = d.opened("hang")
        if n is not None:
            return n
    raise RuntimeError("the simulated hang was not paged within an hour")


async def _strip_png(prom: PromClient, sim: JobSim, d: _Daemon, at: float) -> bytes:
    strip = await fetch_gpu_strip(prom, start=at - WINDOW_S, end=at, nodes=sim.sc.nodes)
    last = sim.steps[-1]
    spec = power_strip(
        strip.power,
        strip.util,
        power_bands(d.cfg.tsdb.profile(sim.sc.model), d.cfg.tsdb.thresholds),
        title=chart_title(sim.sc.job_id, job_name(sim.sc), "GPU power"),
        start=strip.start,
        end=strip.end,
        last_step=last.step,
        last_step_at=last.t,
        notes=strip.notes,
    )
    return render(spec)


async def hang_example(work: Path) -> Example:
    sim = hang_job()
    files = write_job(sim, work / "tsdb")
    d = _Daemon(work / "daemon")
    try:
        job = JobLog(
            d.outputs,
            sim.sc.job_id,
            job_name(sim.sc),
            steps=sim.sc.steps,
            nnodes=len(sim.sc.nodes),
            checkpoint_period=sim.sc.checkpoint_period,
            ray_port=6379,
        )
        now = await _feed(d, job, sim)
        settings = d.cfg.tsdb
        async with LocalPrometheus(files.prometheus, settings) as lp, PromClient(lp.base_url) as prom:
            n = await _hang_until_paged(d, sim, prom, now)
            strip = await _strip_png(prom, sim, d, n.created_at + STRIP_AFTER_S)
    finally:
        d.close()
    return Example("hang", _page_text(n, d.outputs), (("hang-alert.png", _chart_png(n)), ("ray-power-strip.png", strip)))


async def tgs_example(work: Path) -> Example:
    sim = slide_job()
    d = _Daemon(work / "daemon")
    try:
        job = JobLog(
            d.outputs,
            sim.sc.job_id,
            job_name(sim.sc),
            steps=sim.sc.steps,
            nnodes=len(sim.sc.nodes),
            checkpoint_period=sim.sc.checkpoint_period,
        )
        await _feed(d, job, sim)
        n = d.opened("tgs-degradation")
    finally:
        d.close()
    if n is None:
        raise RuntimeError("the simulated TGS slide was not paged")
    return Example("tgs", _page_text(n, d.outputs), (("tgs-slide.png", _chart_png(n)),))


async def examples() -> list[Example]:
    with tempfile.TemporaryDirectory(prefix="jobdiagd-examples-") as tmp:
        return [await hang_example(Path(tmp) / "hang"), await tgs_example(Path(tmp) / "tgs")]


def page_block(text: str) -> str:
    return "```text\n" + text.rstrip() + "\n```"


def with_pages(readme: str, pages: list[Example]) -> str:
    """README.md with each page's text between its markers."""
    for ex in pages:
        pattern = re.compile(rf"(<!-- page:{ex.name} -->\n)(?:.*?\n)?(<!-- /page:{ex.name} -->)", re.S)
        m = pattern.search(readme)
        if m is None:
            raise ValueError(f"README.md has no <!-- page:{ex.name} --> ... <!-- /page:{ex.name} --> block")
        readme = readme[: m.start()] + m.group(1) + page_block(ex.text) + "\n" + m.group(2) + readme[m.end() :]
    return readme
