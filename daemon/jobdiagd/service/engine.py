"""The daemon's tick: discover -> read -> judge -> the post-judging stages -> persist.

`Engine.tick(now, only)` is one pass, and only that; each step's knowledge lives in its module:

1. discover (full ticks): discovery's news — new jobs, Slurm's records, confirmed ends, the
   source's health and its notices (`service.discovery_feed`);
2. read: the tick's jobs' files, a full tick's share of the catch-up backlog first; blind files
   said once (`service.reading`, the reading room);
3. judge: a job whose dir is gone, or that had finished before it was watched, leaves the
   watch; an ending job gets its full triage; every detector due checks each job read
   (`service.judging`);
4. the post-judging stages, one ordered list (`service.stages.STAGES`: keep resolution ->
   stamp -> enrich or hold -> slow host -> recovery -> observe -> end jobs -> enqueue), to the
   outbox; the dispatcher delivers from there, asynchronously;
5. persist: the saved offsets (the hang clock), the ended jobs' offsets forgotten once their end
   is stored, tick times, health.

A full tick (every `tick_seconds`) discovers, reads every watched file and runs every detector.
A watchfiles event wakes a *partial* tick for the jobs whose files changed: it reads them (so
step arrival times are precise) and runs only the detectors that react to new lines (failure
signature, job end) — absence-of-data checks (hang) and trends (TGS) wait for the full tick.
When they run is `service.tick_loop` (with the early page's polls and garbage collection
between ticks).

The engine owns the detectors and what they share: the stall policy (rule VIEW-2), and one
edge-triggered log line per detector and job whose check fails. Self-metrics read its state at
scrape time (`service.metrics`); it pushes only events (a tick's outcome and time, a detector's
error).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jobdiagd import clock
from jobdiagd.alerts import notices
from jobdiagd.alerts.notices import Notice
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import Config
from jobdiagd.detectors import CATALOG, Detector, early_memo
from jobdiagd.detectors.hang import HangDetector, policy_from_config
from jobdiagd.edge_trigger import EdgeTrigger
from jobdiagd.logsetup import get_logger
from jobdiagd.model.triage import StallKnowledge
from jobdiagd.service.discovery import Discovery, NewJob, OutputsDiscovery
from jobdiagd.service.discovery_feed import DiscoveryFeed
from jobdiagd.service.health import Health
from jobdiagd.service.jobs import JobView
from jobdiagd.service.judging import Judged, run_detectors
from jobdiagd.service.metrics import DaemonMetrics, DetectorRun
from jobdiagd.service.reading import ReadingRoom, Watched
from jobdiagd.service.stages import Batch, PlotInputs, RecoveryStage, StageContext, run_stages
from jobdiagd.service.tsdb_enrich import TsdbEnricher
from jobdiagd.sources.tail import ChangeWatcher, OffsetStore


def _gpu_check(view: JobView) -> dict[str, Any] | None:
    """The early page's last GPU verdict for the job's current step, for `jobdiagd status`."""
    memo = early_memo(view)
    if memo is None:
        return None
    v = memo.verdict
    return {"state": v.state, "at": v.at, "summary": v.summary, "suspects": list(v.suspects)}


@dataclass
class TickStats:
    jobs: int = 0
    findings: int = 0
    notifications: int = 0
    ok: bool = True


class _TickWatch:
    """One tick's record of the detector checks: time spent and failures per detector; a
    failing check is an edge-triggered log line per detector and job."""

    def __init__(self, engine: Engine, now: float) -> None:
        self.engine = engine
        self.now = now
        self.durations: dict[str, float] = {}
        self.ok_by: dict[str, bool] = {}

    def failed(self, det: Detector, key: str, exc: Exception) -> None:
        self.ok_by[det.name] = False
        self.engine._edge(f"detector:{det.name}:{key}", "detector").failure(exc, self.now)

    def passed(self, det: Detector, key: str) -> None:
        self.ok_by.setdefault(det.name, True)
        edge = self.engine._edges.get(f"detector:{det.name}:{key}")
        if edge is not None and edge.failing:
            edge.success(self.now)

    def spent(self, det: Detector, seconds: float) -> None:
        self.durations[det.name] = self.durations.get(det.name, 0.0) + seconds

    def record(self) -> None:
        """Each detector that ran: its last run (read by the self-metrics), an error counted."""
        for name, seconds in self.durations.items():
            ok = self.ok_by.get(name, True)
            self.engine.checks[name] = DetectorRun(seconds, ok)
            if not ok:
                self.engine.metrics.detector_failed(name)


class Engine:
    """Owns the detectors and the tick; `tick(now)` is one pass (module docstring)."""

    def __init__(
        self,
        cfg: Config,
        pipeline: AlertPipeline,
        detectors: Sequence[Detector],
        discovery: Discovery | None,
        *,
        metrics: DaemonMetrics | None = None,
        health: Health | None = None,
        offsets: OffsetStore | None = None,
        watcher: ChangeWatcher | None = None,
        read_final: bool = True,
        enricher: TsdbEnricher | None = None,
        plot_inputs: PlotInputs | None = None,
        recovery: RecoveryStage | None = None,
    ) -> None:
        self.cfg = cfg
        self.recovery = recovery
        self.plot_inputs = plot_inputs
        self.pipeline = pipeline
        self.detectors = list(detectors)
        # The stall policy, built once per config (rule VIEW-2): the views, the job-end triage and
        # the chat's triage use this one; the hang detector is built from the same config.
        self.policy = policy_from_config(cfg)
        self._stall_source = _stall_source(self.detectors)
        self.discovery = discovery
        self.metrics = metrics if metrics is not None else DaemonMetrics()
        self.health = health
        self.watcher = watcher
        self.enricher = enricher
        self._edges: dict[str, EdgeTrigger] = {}
        self._log = get_logger(component="engine")
        self.room = ReadingRoom(
            cfg.slurm.outputs_roots,
            self._tell,
            discovery=discovery,
            offsets=offsets,
            watcher=watcher,
            read_final=read_final,
        )
        self.feed = (
            DiscoveryFeed(
                discovery,
                self.room,
                self.add_job,
                self._tell,
                health=health,
                metrics=self.metrics,
                tick_seconds=lambda: self.cfg.daemon.tick_seconds,
            )
            if discovery is not None
            else None
        )
        self.checks: dict[str, DetectorRun] = {}  # each detector's last run on a tick
        # Recent tick wall times (seconds) for `jobdiagd status` and the benchmark.
        self.durations: dict[str, deque[float]] = {
            "startup": deque(maxlen=1),
            "full": deque(maxlen=2000),
            "partial": deque(maxlen=2000),
            "gc": deque(maxlen=100),
        }
        # The same ticks' CPU time on the event loop's thread (file reads of a first catch-up
        # run in worker threads and are not in it): on a shared machine, wall time also counts
        # the waits for a core.
        self.cpu_durations: dict[str, deque[float]] = {
            kind: deque(maxlen=q.maxlen) for kind, q in self.durations.items() if kind != "gc"
        }
        self._full_ticks = 0
        self._partial_jobs = 0  # jobs the last file-event partial tick read (`partial_gap`)

    def reconfigure(self, cfg: Config, detectors: Sequence[Detector]) -> None:
        """SIGHUP: new detector settings apply from the next tick, to jobs already watched too."""
        self.cfg = cfg
        self.detectors = list(detectors)
        self.policy = policy_from_config(cfg)
        self._stall_source = _stall_source(self.detectors)
        self.room.roots = list(cfg.slurm.outputs_roots)
        for w in self.jobs.values():
            # The new detectors start with no state: nothing computed under the old settings
            # survives (the view's analysis is keyed by the policy and the new detector's
            # knowledge); nor does the early page's GPU verdict (asked again if still overdue).
            w.view.policy = self.policy
            w.view.stall_source = self._stall_source
            w.view.gpu_check = None

    @property
    def jobs(self) -> dict[str, Watched]:
        """The watched jobs (the reading room's)."""
        return self.room.jobs

    def stall_knowledge(self, key: str, now: float) -> StallKnowledge | None:
        """What the daemon knows of a watched job's progress (rule VIEW-1), None if nothing."""
        w = self.jobs.get(key)
        return w.view.stall_knowledge(now) if w is not None else None

    def add_job(self, new: NewJob, now: float) -> Watched:
        """Watch a new job, its view under the engine's stall policy."""
        view = JobView(
            key=new.key,
            ref=new.ref,
            first_seen=now,
            slurm=new.slurm,
            policy=self.policy,
            stall_source=self._stall_source,
        )
        return self.room.add(new, view, now)

    def announce(self, notice: Notice, now: float) -> bool:
        """Queue one of the daemon's notices (`alerts.notices`); False (logged) when it could not be made."""
        return self._tell(notice, now)

    def _tell(self, notice: Notice, now: float) -> bool:
        """Queue one of the daemon's notices; False (logged) when it could not be made."""
        try:
            self.pipeline.announce(notice, now)
        except Exception as exc:
            self._log.error("notice_failed", error=f"{type(exc).__name__}: {exc}")
            return False
        return True

    def _edge(self, key: str, kind: str) -> EdgeTrigger:
        e = self._edges.get(key)
        if e is None:
            e = self._edges[key] = EdgeTrigger(key, kind=kind, logger=self._log)
        return e

    async def stop_discovery(self) -> None:
        """Cancel a discovery poll in flight (its Slurm command's process group is killed)."""
        if self.feed is not None:
            await self.feed.stop()

    # -- the tick ------------------------------------------------------------

    async def tick(self, now: float, only: set[str] | None = None, *, early: bool = False) -> TickStats:
        """One pass. `only`: a partial tick for these jobs (file events); None: a full tick.

        `early`: a partial tick for jobs whose hang the GPUs just confirmed (the hang detector runs too)."""
        started = clock.monotonic()
        started_cpu = clock.thread_cpu()
        full = only is None
        if full and self.feed is not None:
            await self.feed.discover(now)
        keys = self._tick_keys(only)
        await self.room.read(keys, full, now)
        ending = await self._ending(keys, now)
        watch = _TickWatch(self, now)
        judged = self._judge(keys, ending, full, early, watch, now)
        watch.record()
        views = {k: w.view for k, w in self.jobs.items()}  # as judged: before any job leaves
        ctx = StageContext(
            now, views, self.pipeline, self._leave, self.enricher, self.plot_inputs, recovery=self.recovery
        )
        batch = run_stages(Batch(judged.findings, judged.reports, ending), ctx)
        stats = TickStats(len(keys), len(batch.findings), len(batch.queued) if batch.ok else 0, batch.ok)
        self._tick_done(full, started, started_cpu, now, stats, batch, all(watch.ok_by.values()))
        return stats

    def _tick_keys(self, only: set[str] | None) -> list[str]:
        """The jobs of this tick; a full tick rotates their order, so detectors that ration
        optional work per tick serve every job in turn."""
        if only is not None:
            return [k for k in only if k in self.jobs]
        keys = list(self.jobs)
        if keys:
            shift = self._full_ticks % len(keys)
            keys = keys[shift:] + keys[:shift]
        return keys

    async def _ending(self, keys: list[str], now: float) -> list[str]:
        """The jobs whose end this tick confirms, each with its final read; first, the jobs whose
        dir is gone and those found already over leave the watch (and `keys`)."""
        self._drop_gone(keys, now)
        ending = [k for k in keys if self.jobs[k].view.ended]
        self._drop_finished_before_watched(keys, ending, now)
        for key in ending:
            await self.room.final_read(self.jobs[key], now)
        return ending

    def _drop_finished_before_watched(self, keys: list[str], ending: list[str], now: float) -> None:
        """A dir found with its JOB SUMMARY already written: finished before we watched it."""
        stale = [k for k in ending if self.jobs[k].over_before_watched()]
        for key in stale:
            ending.remove(key)
            keys.remove(key)
            self._unwatch(key)
            self._log.info("job_already_ended", job_id=key)
        if stale:
            self.room.update_watch_dirs()

    def _drop_gone(self, keys: list[str], now: float) -> None:
        """Without Slurm the job dir is the job: once it is gone, the job leaves the watch, its
        incidents are resolved, and a "monitoring blind" notice gets its follow-up (rule CHAT-6)."""
        gone = [k for k, w in self.jobs.items() if w.gone]
        for key in gone:
            if key in keys:
                keys.remove(key)
            where = self.jobs[key].view.ref.job_dir
            self._log.warning("job_dir_gone", job_id=key, path=str(where))
            self._leave(key, notices.why_gone(where), now)
            try:
                self.pipeline.job_ended(key, notices.JOB_DIR_GONE, now)
            except Exception as exc:
                self._log.error("incident_update_failed", error=f"{type(exc).__name__}: {exc}")
            self.room.forget([key], now)
            if isinstance(self.discovery, OutputsDiscovery) and where is not None:
                self.discovery.forget(where.name)  # a dir made again under that name is a job again
        if gone:
            self.room.update_watch_dirs()

    def _leave(self, key: str, why: str, now: float) -> None:
        """The job leaves the watch; a "monitoring blind" notice of it gets its follow-up."""
        w = self._unwatch(key)
        self.room.follow_up_blind(key, w, why, now)

    def _unwatch(self, key: str) -> Watched:
        """The job leaves the watch; the detectors forget it, and so do their per-job failure
        triggers (a check failing on this job is no longer news)."""
        w = self.room.remove(key)
        for det in self.detectors:
            det.forget(key)
            self._edges.pop(f"detector:{det.name}:{key}", None)
        return w

    def _judge(
        self, keys: list[str], ending: list[str], full: bool, early: bool, watch: _TickWatch, now: float
    ) -> Judged:
        """Every detector due on this tick checks each job read so far (`run_detectors`). A
        partial tick runs only the detectors that react to new lines (and, for a GPU-confirmed
        hang, the hang detector); a job that is ending gets all of them."""
        judged = Judged()
        for key in keys:
            w = self.jobs[key]
            if not w.caught_up and key not in ending:
                continue  # nothing read yet (or being read in the background): nothing to judge
            if full or key in ending:
                run_detectors(self.detectors, w.view, now, judged, watch=watch)
            else:
                run_detectors(
                    self.detectors,
                    w.view,
                    now,
                    judged,
                    runs=lambda d: d.on_data or (early and d.on_gpu_check),
                    watch=watch,
                )
        return judged

    def _tick_done(
        self,
        full: bool,
        started: float,
        started_cpu: float,
        now: float,
        stats: TickStats,
        batch: Batch,
        checks_ok: bool,
    ) -> None:
        """Persist: the ended jobs' offsets forgotten, the saved offsets, the watcher's dirs, tick
        times, and (full ticks) health and the tick's metrics."""
        if batch.ending:
            if batch.ok and not self.pipeline.held:
                # Only once the end is stored: until then a restart must still know the job.
                self.room.forget(batch.ending, now)
            self.room.update_watch_dirs()
        # The first full tick catches up with every file (a restart re-reads them): kept apart.
        kind = "partial" if not full else ("full" if self._full_ticks else "startup")
        self.durations[kind].append(clock.monotonic() - started)
        self.cpu_durations[kind].append(clock.thread_cpu() - started_cpu)
        self.room.persist(now, full=full, told=bool(stats.notifications))
        if not full:
            return
        self._full_ticks += 1
        stats.ok = stats.ok and checks_ok
        if self.health is not None:
            self.health.tick_done(now, stats.ok)
        self.metrics.observe_tick(clock.monotonic() - started, stats.ok)

    # -- status ----------------------------------------------------------------

    def tick_stats(self) -> dict[str, dict[str, float | int | None]]:
        """p50/p99/max wall time in ms of recent ticks (startup, full, partial) and scheduled GCs,
        and the ticks' CPU time p50/p99 (`cpu_p50_ms`, `cpu_p99_ms`)."""

        def q(xs: list[float], p: float) -> float | None:
            return round(xs[min(len(xs) - 1, int(p * len(xs)))] * 1000, 2) if xs else None

        out: dict[str, dict[str, float | int | None]] = {}
        for kind, vals in self.durations.items():
            xs = sorted(vals)
            out[kind] = {
                "n": len(xs),
                "p50_ms": q(xs, 0.5),
                "p99_ms": q(xs, 0.99),
                "max_ms": round(xs[-1] * 1000, 2) if xs else None,
            }
            if kind in self.cpu_durations:
                cpu = sorted(self.cpu_durations[kind])
                out[kind]["cpu_p50_ms"] = q(cpu, 0.5)
                out[kind]["cpu_p99_ms"] = q(cpu, 0.99)
        return out

    def snapshot_jobs(self, now: float) -> list[dict[str, Any]]:
        open_by_job: dict[str, list[str]] = {}
        for inc in self.pipeline.book.open_incidents():
            open_by_job.setdefault(inc.job_id, []).append(inc.kind)
        out: list[dict[str, Any]] = []
        for key, w in sorted(self.jobs.items()):
            v = w.view
            row: dict[str, Any] = {
                "job_id": key,
                "state": v.slurm_state
                or ("LIVE" if not v.ended else v.end_state),  # LIVE: no Slurm, no JOB SUMMARY yet
                "name": v.ref.name,
                "log": str(v.ref.log) if v.ref.log else None,
                "last_step": v.last_step,
                "last_step_at": v.last_step_at,
                "total_steps": v.total_steps(),
            }
            row.update(CATALOG.status(self.detectors, v, now))  # each detector's columns
            row["open_incidents"] = open_by_job.get(key, [])
            row["blind"] = sorted(v.blind)
            row["gpu_check"] = _gpu_check(v)
            out.append(row)
        return out


def _stall_source(detectors: Sequence[Detector]) -> Callable[[JobView, float], StallKnowledge | None] | None:
    """The hang detector's knowledge of a job's progress, the one source of it (None: disabled)."""
    hang = next((d for d in detectors if isinstance(d, HangDetector)), None)
    return hang.knowledge if hang is not None else None
