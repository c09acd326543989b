"""The daemon's tick: gather sources -> update job views -> run detectors -> update incidents -> deliver.

A full tick (every `tick_seconds`) asks discovery (squeue every `squeue_interval_seconds`, or
the outputs roots), reads every watched file, and runs every detector. A watchfiles event
wakes a *partial* tick for the jobs whose files changed: it reads them (so step arrival
times are precise) and runs only the detectors that react to new lines (failure signature,
job end) — absence-of-data checks (hang) and trends (TGS) wait for the full tick.

Discovery (`service.discovery`) runs as its own task, so a hung squeue (bounded by command_timeout_seconds) never
holds file reading or hang detection. A job leaves the watch only on an end Slurm confirms
(SlurmWatcher's rule); an end whose Slurm state is still live is refused. A source that fails
twice in a row gets one "source degraded" notice, and one "source recovered" when it answers.

Decided here: a job's logs are read only inside `[slurm] outputs_roots` or the directory
holding its job dir (the watched root; under Slurm the root it was found in, or the
directory of its StdOut before the job dir exists), and only when owned by its Slurm user
(without Slurm: the job dir's owner) — `triage.resolve.job_access`. A file that cannot be read
or is refused, from the first read on (only "does not exist yet" is waiting), gives one
"monitoring blind" notice and pauses that job's detectors; the others keep running.

Catching up (decided here): a job's first read takes in everything its log already holds. A
full tick does that for at most `CATCH_UP_INLINE_BYTES` worth of jobs (at least one, and
always for a job whose end is due), in `service.catchup` order — quiet longest first, the job
closest to a hang or a crash page; the rest is read in the background between ticks, so a
daemon (re)starting on 1000 jobs has a short first tick. A job is judged only once read (by
the tick that read it, or the first tick after its background read); its step arrival times
are when that read began (the daemon's clock, as always), and a restart's saved hang clock is
restored as before. A job found already finished (its JOB SUMMARY there at the first read) is dropped
without a report whether it was read in the tick or in the background.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jobdiagd import clock
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import Config
from jobdiagd.detectors import CATALOG, Detector, Report, early_memo
from jobdiagd.detectors.hang import HangDetector, policy_from_config
from jobdiagd.durations import rounded_duration
from jobdiagd.edge_trigger import EdgeTrigger
from jobdiagd.logs.job import load_job
from jobdiagd.logs.safeopen import ANYWHERE, LogAccess, RefusedFile
from jobdiagd.logsetup import get_logger
from jobdiagd.model.alerts import Finding, Severity
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.triage import StallKnowledge
from jobdiagd.rules.hostlist import expand_hostlist
from jobdiagd.rules.slurm import FINISHED_STATES, end_state
from jobdiagd.service.catchup import Pending, catch_up_order
from jobdiagd.service.discovery import Discovered, Discovery, NewJob, OutputsDiscovery, SlurmDiscovery
from jobdiagd.service.early_page import EarlyConfirmer
from jobdiagd.service.health import Health
from jobdiagd.service.jobs import JobView
from jobdiagd.service.judging import Judged, run_detectors
from jobdiagd.service.metrics import DaemonMetrics
from jobdiagd.service.tsdb_enrich import TsdbEnricher
from jobdiagd.sources.slurm import SlurmError, SlurmJob
from jobdiagd.sources.slurmstate import slurm_wall_s
from jobdiagd.sources.tail import ChangeWatcher, FileTail, OffsetStore
from jobdiagd.triage.engine import analyze
from jobdiagd.triage.resolve import job_access

# (view, incident kind, now) -> bounded JSON-ready inputs of the incident's picture, or None.
PlotInputs = Callable[[JobView, str, float], dict[str, Any] | None]
PLOTTED_KINDS = frozenset({"hang", "tgs-degradation"})

MIN_PARTIAL_GAP_S = 2.5
# Past this many jobs read by one partial tick, the next one settles longer, in proportion (up
# to MAX_PARTIAL_GAP_S). A partial tick costs a fixed ~60 us per job it reads, whatever the job
# wrote: 1000 busy jobs read every 2.5 s spent half the event loop's CPU on that (bench_daemon).
# Decision: at such a site a new line reaches the detectors up to 6-10 s after it is written
# instead of 2.5 s; a failure is still paged within seconds, a hang's budget is minutes.
PARTIAL_JOBS_AT_MIN_GAP = 400
MAX_PARTIAL_GAP_S = 10.0

# The early page's polls are at least this far apart (its own cadence is the scrape interval).
MIN_EARLY_GAP_S = 0.5
# A full tick waits at most this long (and at most half a tick) for a discovery poll it started.
DISCOVERY_WAIT_S = 1.0
# A source's "degraded" notice goes out after this many failures in a row (one blip is not news).
SOURCE_NOTICE_AFTER = 2
GC_EVERY_S = 300.0
PERSIST_EVERY_S = 60.0
WORKER_RESCAN_S = 30.0
MAX_WORKER_FILES = 16
# A job's first read catches up with everything its log already holds. A full tick does at most
# this much of that (and at least one job), in `catch_up_order`; the rest is read in the
# background between ticks, so the first tick of a daemon finding 1000 jobs stays short. A first
# read's fixed cost (open, header parsed in full, the thread hop) counts as CATCH_UP_FILE_BYTES.
CATCH_UP_INLINE_BYTES = 4 << 20
CATCH_UP_FILE_BYTES = 16 << 10


def partial_gap(jobs_read: int) -> float:
    """How long file events settle into one partial tick, after one that read `jobs_read` jobs."""
    scaled = MIN_PARTIAL_GAP_S * jobs_read / PARTIAL_JOBS_AT_MIN_GAP
    return min(MAX_PARTIAL_GAP_S, max(MIN_PARTIAL_GAP_S, scaled))


@dataclass
class Watched:
    view: JobView
    main: FileTail | None
    workers: dict[str, FileTail] = field(default_factory=dict)
    worker_scan_at: float = float("-inf")
    slurm_mode: bool = False
    known_before: bool = False  # watched before a restart: its end is still owed a report
    access: LogAccess = ANYWHERE  # which files of this job may be read (`job_access`)
    caught_up: bool = False  # its files were read (or tried) once: ticks read it from now on
    ended_at_first_read: bool = False  # its JOB SUMMARY was already there when first read
    gone: bool = False  # without Slurm: its job dir disappeared; the tick drops it (`_drop_gone`)

    def tails(self) -> list[FileTail]:
        return ([self.main] if self.main is not None else []) + list(self.workers.values())


def _followed(ref: JobRef) -> JobRef:
    """The ref with its `log` link resolved (triage wants the file, e.g. for the report title)."""
    return replace(ref, log=Path(os.path.realpath(ref.log))) if ref.log is not None else ref


def _dir_gone(job_dir: Path | None) -> bool:
    """The job's directory no longer exists (not even as a dangling link)."""
    return job_dir is not None and not os.path.lexists(job_dir)


def _summary_state(view: JobView) -> str:
    s = view.main.summary if view.main is not None else None
    return end_state(s.exit_code if s is not None else None)


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


class Engine:
    """Owns the job views; `tick(now)` is one pass of the pipeline. Detectors are injected."""

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
    ) -> None:
        self.cfg = cfg
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
        self.offsets = offsets
        self.watcher = watcher
        self.read_final = read_final
        self.enricher = enricher
        self.jobs: dict[str, Watched] = {}
        self._path_jobs: dict[str, str] = {}
        self._edges: dict[str, EdgeTrigger] = {}
        self._log = get_logger(component="engine")
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
        self._persisted_at = float("-inf")
        self._discovery_task: asyncio.Future[Discovered | None] | None = None
        self._sources_noticed: dict[str, float] = {}  # source -> failing since, once "degraded" was sent
        self._stepped: set[str] = set()  # jobs whose newest step arrived since the last save
        self._partial_jobs = 0  # jobs the last file-event partial tick read (`partial_gap`)
        self._watch_stale = False  # jobs were added since the watcher's directories were set
        # Jobs whose existing logs are still to be read (`service.catchup`), in reading order.
        self._backlog: dict[str, Pending] = {}
        self._backlog_order: deque[str] = deque()
        self._catching: set[str] = set()  # backlog jobs being read (a tick's share, the background's)
        self._catch_up_task: asyncio.Future[None] | None = None
        # Set between ticks: the background catch-up starts its next read only then, so a tick
        # shares the interpreter with at most the one read already under way.
        self._between_ticks = asyncio.Event()
        self._between_ticks.set()
        self.catch_up_inline_bytes = CATCH_UP_INLINE_BYTES

    def reconfigure(self, cfg: Config, detectors: Sequence[Detector]) -> None:
        """SIGHUP: new detector settings apply from the next tick, to jobs already watched too."""
        self.cfg = cfg
        self.detectors = list(detectors)
        self.policy = policy_from_config(cfg)
        self._stall_source = _stall_source(self.detectors)
        for w in self.jobs.values():
            # The new detectors start with no state: nothing computed under the old settings
            # survives (the view's analysis is keyed by the policy and the new detector's
            # knowledge); nor does the early page's GPU verdict (asked again if still overdue).
            w.view.policy = self.policy
            w.view.stall_source = self._stall_source
            w.view.gpu_check = None

    def stall_knowledge(self, key: str, now: float) -> StallKnowledge | None:
        """What the daemon knows of a watched job's progress (rule VIEW-1), None if nothing."""
        w = self.jobs.get(key)
        return w.view.stall_knowledge(now) if w is not None else None

    # -- what findings carry for people ---------------------------------------

    def _owner(self, job_id: str) -> str | None:
        w = self.jobs.get(job_id)
        return w.view.slurm.user if w is not None and w.view.slurm is not None else None

    def _stamp(self, f: Finding, now: float) -> Finding:
        """The job's owner and RAY flag (routing, buttons) and, on the finding that opens a hang or
        TGS incident, the picture's inputs (built only then: a stalled job re-emits every tick)."""
        w = self.jobs.get(f.job_id)
        if w is None:
            return f
        view = w.view
        owner = (view.slurm.user or None) if view.slurm is not None else None
        ray = view.logs().ray if view.main is not None else False
        plot = None
        if self.plot_inputs is not None and not f.resolved and f.kind in PLOTTED_KINDS:
            inc = self.pipeline.book.get(f.job_id, f.kind)
            if inc is None or inc.announced_at is None:
                try:
                    plot = self.plot_inputs(view, f.kind, now)
                except Exception as exc:  # a picture is optional; the page is not
                    self._log.warning(
                        "plot_inputs_failed", job_id=f.job_id, error=f"{type(exc).__name__}: {exc}"
                    )
        if owner == f.owner and ray == f.ray and plot is None:
            return f
        return replace(f, owner=owner, ray=ray, plot=plot)

    # -- job set -----------------------------------------------------------

    def add_job(self, new: NewJob, now: float) -> Watched:
        """Watch a new job; the file watcher's dirs are set once per batch of new jobs (per job
        it is O(jobs): 500 at once took 15 s)."""
        view = JobView(
            key=new.key,
            ref=new.ref,
            first_seen=now,
            slurm=new.slurm,
            policy=self.policy,
            stall_source=self._stall_source,
        )
        link = new.ref.log
        access = self._access_for(new.ref, new.slurm)
        main = FileTail(link, ref_time=now, access=access) if link is not None else None
        w = Watched(
            view, main, slurm_mode=new.slurm is not None, known_before=new.restart_known, access=access
        )
        if main is not None and self.offsets is not None:
            main.saved = self.offsets.load(main.key)
            if main.saved is not None:
                main.blind_since = main.saved.blind_since
        self.jobs[new.key] = w
        self._log.info("job_watched", job_id=new.key, log=str(link) if link else None, slurm=w.slurm_mode)
        self._watch_stale = True  # applied once per batch of news (`_take_news`), not per job
        return w

    def _access_for(self, ref: JobRef, job: SlurmJob | None) -> LogAccess:
        """The job's logs must lie in a configured outputs root or the directory holding its
        job dir (outputs mode: the watched root; Slurm: the root it was found in, or StdOut's
        directory) and belong to its Slurm user (else the job dir's owner)."""
        return job_access(ref, self.cfg.slurm.outputs_roots, job.user if job is not None else None)

    def _update_watch_dirs(self) -> None:
        """Point the watcher at the directories of every watched file (and map paths to jobs).

        Linear in the files watched, and run once per change of the set (never once per job
        added: 1000 jobs found in one poll made that quadratic, a 40 s first tick). A file
        already read is named by the target its tail resolved at the last poll; only files
        never read cost a `realpath`."""
        self._watch_stale = False
        if self.watcher is None:
            return
        dirs: set[Path] = set(self.discovery.dirs()) if self.discovery is not None else set()
        self._path_jobs.clear()
        for key, w in self.jobs.items():
            for ft in w.tails():
                target = ft.reader.path if ft.reader is not None else Path(os.path.realpath(ft.link))
                for p in (ft.link, target):
                    dirs.add(p.parent)
                    self._path_jobs[str(p)] = key
            if w.view.ref.job_dir is not None:
                dirs.add(w.view.ref.job_dir)
        self.watcher.set_dirs(dirs)

    def jobs_for_paths(self, paths: set[str]) -> set[str]:
        out = {self._path_jobs[p] for p in paths if p in self._path_jobs}
        return out

    # -- the tick ------------------------------------------------------------

    async def tick(self, now: float, only: set[str] | None = None, *, early: bool = False) -> TickStats:
        """One pass. `only`: a partial tick for these jobs (file events); None: a full tick.

        `early`: a partial tick for jobs whose hang the GPUs just confirmed (the hang detector runs too)."""
        started = clock.monotonic()
        started_cpu = clock.thread_cpu()
        stats = TickStats()
        full = only is None
        if full:
            await self._discover(now)
        keys = self._tick_keys(only)
        await self._read_jobs(keys, full, now)
        self._drop_gone(keys, now)
        ending = [k for k in keys if self.jobs[k].view.ended]
        self._drop_finished_before_watched(keys, ending, now)
        for key in ending:
            await self._finalize(self.jobs[key], now)
        watch = _TickWatch(self, now)
        judged = self._judge(keys, ending, full, early, watch, now)
        for name, secs in watch.durations.items():
            self.metrics.observe_detector(name, secs, watch.ok_by.get(name, True))
        findings = [self._stamp(f, now) for f in judged.kept(self.pipeline.book)]
        reports = judged.reports
        if self.enricher is not None:
            # RAY=1 jobs: hang alerts carry the GPU power verdict, failed jobs' end reports the
            # class playbook; both are held (a tick, a playbook run) rather than sent without it.
            views = {k: w.view for k, w in self.jobs.items()}
            findings = self.enricher.enrich_findings(findings, views, now)
            reports = self.enricher.hold_reports(reports, views, now) + self.enricher.ready_reports()
        stats.findings = len(findings)
        self._deliver(findings, reports, ending, now, stats)
        if ending:
            self._update_watch_dirs()
        self._tick_done(full, started, started_cpu, now, stats, all(watch.ok_by.values()))
        stats.jobs = len(keys)
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

    async def _read_jobs(self, keys: list[str], full: bool, now: float) -> None:
        """Read the tick's jobs: a full tick's share of the catch-up backlog, then every job
        already caught up (each file once)."""
        self._enqueue_catch_up(keys)
        fresh = await self._catch_up_inline(now) if full else set()
        for key in keys:
            w = self.jobs[key]
            if w.caught_up and key not in fresh:
                await self._read(w, now)
        if self._watch_stale:
            self._update_watch_dirs()

    def _drop_finished_before_watched(self, keys: list[str], ending: list[str], now: float) -> None:
        """A dir found with its JOB SUMMARY already written: finished before we watched it."""
        stale = [k for k in ending if self._over_before_watched(self.jobs[k], now)]
        for key in stale:
            ending.remove(key)
            keys.remove(key)
            self._unwatch(key)
            self._log.info("job_already_ended", job_id=key)
        if stale:
            self._update_watch_dirs()

    def _drop_gone(self, keys: list[str], now: float) -> None:
        """Without Slurm the job dir is the job: once it is gone, the job leaves the watch, its
        incidents are resolved, and a "monitoring blind" notice gets its follow-up (rule CHAT-6)."""
        gone = [k for k, w in self.jobs.items() if w.gone]
        for key in gone:
            if key in keys:
                keys.remove(key)
            w = self._unwatch(key)
            where = w.view.ref.job_dir
            self._log.warning("job_dir_gone", job_id=key, path=str(where))
            self._blind_follow_up(key, w, f"its directory `{where}` is gone", now)
            try:
                self.metrics.record_notifications(self.pipeline.job_ended(key, "job directory gone", now))
            except Exception as exc:
                self._log.error("incident_update_failed", error=f"{type(exc).__name__}: {exc}")
            if self.offsets is not None:
                self._forget([key], now)
            if isinstance(self.discovery, OutputsDiscovery) and where is not None:
                self.discovery.forget(where.name)  # a dir made again under that name is a job again
        if gone:
            self._update_watch_dirs()

    def _unwatch(self, key: str) -> Watched:
        """The job leaves the watch; the detectors forget it, and so do their per-job failure
        triggers (a check failing on this job is no longer news)."""
        w = self.jobs.pop(key)
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

    def _deliver(
        self, findings: list[Finding], reports: list[Report], ending: list[str], now: float, stats: TickStats
    ) -> None:
        """Findings to the incident book, ended jobs out of the watch, reports queued."""
        try:
            notes = self.pipeline.observe(findings, now)
            # Causal order: a job's incidents resolve ("job ended") before its end report is queued.
            owners = {r.job_id: self._owner(r.job_id) for r in reports}  # before ended jobs go
            for key in ending:
                w = self._unwatch(key)
                state = w.view.end_state or "UNKNOWN"
                self._blind_follow_up(key, w, f"the job ended ({state})", now)
                notes += self.pipeline.job_ended(key, state, now)
                self._log.info("job_ended", job_id=key, state=state)
            for r in reports:
                notes += self.pipeline.report(
                    r.job_id, r.kind, r.key, r.title, r.body, now, owner=owners[r.job_id]
                )
            if self.offsets is not None and ending and not self.pipeline.held:
                # Only once the end is stored: until then a restart must still know the job.
                self._forget(ending, now)
            self.metrics.record_notifications(notes)
            stats.notifications = len(notes)
        except Exception as exc:
            stats.ok = False
            self._log.error("incident_update_failed", error=f"{type(exc).__name__}: {exc}")

    def _tick_done(
        self, full: bool, started: float, started_cpu: float, now: float, stats: TickStats, checks_ok: bool
    ) -> None:
        """Tick times, the saved hang clock, and (full ticks) metrics and health."""
        # The first full tick catches up with every file (a restart re-reads them): kept apart.
        kind = "partial" if not full else ("full" if self._full_ticks else "startup")
        self.durations[kind].append(clock.monotonic() - started)
        self.cpu_durations[kind].append(clock.thread_cpu() - started_cpu)
        # Offsets are re-derivable (a restart re-reads the files), the arrival time of a job's
        # newest step is not: it is the hang clock. Write it in the tick that read the step (a
        # few rows, only those jobs), so a crash or a wedge does not restart the clock; the
        # rest once a minute, and at once when this tick told people something.
        if full and (stats.notifications or now - self._persisted_at >= PERSIST_EVERY_S):
            self._persist(now)
            self._persisted_at = now
        elif self._stepped:
            self._persist(now, only=self._stepped)
        self._stepped = set()
        if not full:
            return
        self._full_ticks += 1
        self.metrics.set_incidents_open(self.pipeline.open_counts())
        self.metrics.outbox_pending.set(self.pipeline.outbox.pending_count())
        self.metrics.jobs_watched.set(len(self.jobs))
        elapsed = clock.monotonic() - started
        stats.ok = stats.ok and checks_ok
        if self.health is not None:
            self.health.tick_done(now, stats.ok)
        self.metrics.observe_tick(elapsed, stats.ok, now)

    async def _discover(self, now: float) -> None:
        """Apply discovery's news. The poll runs as its own task: a tick waits for it at most
        DISCOVERY_WAIT_S (a quick squeue is used at once); a slow one is applied by a later
        tick, while this one reads files and checks hangs (squeue may block up to its timeout)."""
        d = self.discovery
        if d is None:
            return
        task = self._discovery_task
        if task is not None and task.done():
            self._discovery_task = None
            self._take_news(d, task, now)  # a late answer: then ask again at once
        if self._discovery_task is None:
            task = self._discovery_task = asyncio.ensure_future(d.poll(now, set(self.jobs)))
            await asyncio.wait({task}, timeout=min(DISCOVERY_WAIT_S, self.cfg.daemon.tick_seconds / 2))
            if task.done():
                self._discovery_task = None
                self._take_news(d, task, now)

    def _take_news(self, d: Discovery, task: asyncio.Future[Discovered | None], now: float) -> None:
        if task.cancelled():
            return
        try:
            news = task.result()
        except (SlurmError, OSError, ValueError) as exc:
            self._source_failed(d.name, exc, now)
            return
        if news is None:
            return
        if news.problem is not None:
            self._source_failed(d.name, news.problem, now)
        else:
            self._source_ok(d.name, now)
        for new in news.new:
            if new.key not in self.jobs:
                self.add_job(new, now)
        relinked = self._watch_stale
        for key, job in news.slurm.items():
            w = self.jobs.get(key)
            if w is None:
                continue
            w.view.slurm = job
            relinked = self._pick_up_job_dir(d, w, job) or relinked
        if relinked:
            self._update_watch_dirs()
        self._take_ends(news, now)

    def _pick_up_job_dir(self, d: Discovery, w: Watched, job: SlurmJob) -> bool:
        """The batch script creates the job dir after the job starts: pick it up (RAY=1 worker
        logs live there) and follow its `log` link from now on. True when the job was relinked."""
        if w.view.ref.job_dir is not None or not isinstance(d, SlurmDiscovery):
            return False
        ref = d.ref_for(job)
        if ref.job_dir is None:
            return False
        w.view.ref = ref
        w.access = self._access_for(ref, job)
        if w.main is not None and ref.log is not None:
            w.main.link = ref.log
            w.main.access = w.access
            if w.main.reader is not None:
                w.main.reader.access = w.access
        return True

    def _take_ends(self, news: Discovered, now: float) -> None:
        """Jobs whose end Slurm confirms are marked ended (their end report is due this tick)."""
        for key, (state, final) in news.ended.items():
            w2 = self.jobs.get(key)
            if w2 is None:
                continue
            live = final.state if final is not None and not final.is_finished else None
            if live is None and state != "UNKNOWN" and state not in FINISHED_STATES:
                live = state
            if live is not None:
                # Never an end report for a job Slurm still runs (a broken squeue answer).
                self._log.error("job_end_refused", job_id=key, slurm_state=live)
                continue
            w2.view.ended = True
            w2.view.end_state = state
            if final is not None:
                w2.view.slurm = final

    def _source_failed(self, name: str, error: BaseException | str, now: float) -> None:
        edge = self._source(name)
        edge.failure(error, now)
        self.metrics.observe_source(name, False)
        if edge.failures < SOURCE_NOTICE_AFTER or name in self._sources_noticed:
            return
        since = edge.failing_since if edge.failing_since is not None else now
        sent = self._source_notice(
            f"source-degraded:{name}:{int(since)}",
            f"source degraded: {name}",
            f"`{name}` has failed {edge.failures} times in a row: {edge.last_error}\n\n"
            "Jobs already watched are still read and checked for hangs, but new jobs are not "
            "discovered and job ends are not confirmed until it answers again; the daemon will "
            "say when it does.",
            now,
            "warning",
        )
        if sent:  # else tried again at the next failure (same id: never sent twice)
            self._sources_noticed[name] = since

    def _source_ok(self, name: str, now: float) -> None:
        self._source(name).success(now)
        self.metrics.observe_source(name, True)
        since = self._sources_noticed.get(name)
        if since is not None and self._source_notice(
            f"source-recovered:{name}:{int(since)}",
            f"source recovered: {name}",
            f"`{name}` answers again (degraded for {rounded_duration(now - since)}).",
            now,
            "info",
        ):
            del self._sources_noticed[name]

    def _source_notice(self, key: str, title: str, body: str, now: float, severity: Severity) -> bool:
        try:
            self.metrics.record_notifications(self.pipeline.notice(key, title, body, now, severity=severity))
        except Exception as exc:
            self._log.error("notice_failed", error=f"{type(exc).__name__}: {exc}")
            return False
        return True

    def _source(self, name: str) -> EdgeTrigger:
        if self.health is not None:
            return self.health.source(name)
        return self._edge(f"source:{name}", "source")

    def _edge(self, key: str, kind: str) -> EdgeTrigger:
        e = self._edges.get(key)
        if e is None:
            e = self._edges[key] = EdgeTrigger(key, kind=kind, logger=self._log)
        return e

    async def _read(self, w: Watched, now: float) -> None:
        view = w.view
        if w.main is not None:
            await self._poll_file(w, w.main, now, main=True)
        if view.main is not None and now - w.worker_scan_at >= WORKER_RESCAN_S:
            w.worker_scan_at = now
            self._scan_workers(w, now)
        for ft in list(w.workers.values()):
            await self._poll_file(w, ft, now, main=False)
        if view.note_read(now):
            self._stepped.add(view.key)
        ignored = view.step_guard.take_news()
        if ignored:
            self._steps_ignored(view, ignored, now)
        if w.main is not None and w.main.saved is not None and view.last_step is not None:
            saved = w.main.saved
            if saved.last_step is not None and saved.last_step_at is not None:
                view.restore_arrival(saved.last_step, saved.last_step_at)
            w.main.saved = None
        if not w.slurm_mode and not view.ended and view.summary_seen:
            view.ended = True
            view.end_state = _summary_state(view)

    async def _poll_file(self, w: Watched, ft: FileTail, now: float, *, main: bool) -> None:
        view = w.view
        try:
            if ft.reader is None:
                await asyncio.to_thread(ft.poll)
                replaced = False
            else:
                _, replaced = ft.poll()
        except OSError as exc:
            ft.error = f"{type(exc).__name__}: {exc.strerror or exc}"
            if not w.slurm_mode and _dir_gone(view.ref.job_dir):
                w.gone = True  # not blind: there is nothing left to watch (`_drop_gone`)
                return
            # Unreadable is blind whether or not it was ever read; only a file that does not
            # exist yet (a job whose log Slurm has not created) is merely waiting.
            if ft.blind_since is None and (ft.ever_read or not isinstance(exc, FileNotFoundError)):
                ft.blind_since = now
                ft.dirty = True
                self._blind_notice(view, ft, now)
            if ft.blind_since is not None:
                view.blind[ft.key] = ft.error
            return
        if ft.blind_since is not None:
            self._log.info("monitoring_restored", job_id=view.key, path=ft.key)
            self.pipeline.notice(
                f"unblind:{view.key}:{ft.key}:{int(now)}",
                f"monitoring restored: job {view.key}",
                f"`{ft.key}` is readable again; detection resumed.",
                now,
            )
            ft.blind_since = None
            ft.dirty = True
        view.blind.pop(ft.key, None)
        if self.watcher is not None and ft.reader is not None and str(ft.reader.path) not in self._path_jobs:
            self._watch_stale = True  # the link now names another file: watch its directory
        state = ft.state
        if main:
            if replaced:
                view.reset_steps()
            view.main = state
        elif state is not None and view.head_host is not None:
            sts = view.workers.setdefault(view.head_host, [])
            if state not in sts:
                # A replaced worker file: drop the old state of the same path.
                sts[:] = [s for s in sts if s.source != state.source and s.source != ft.key] + [state]

    def _blind_notice(self, view: JobView, ft: FileTail, now: float) -> None:
        self._log.warning("monitoring_blind", job_id=view.key, path=ft.key, error=ft.error)
        refused = (ft.error or "").startswith(f"{RefusedFile.__name__}:")
        what = "is refused and not read" if refused else "cannot be read"
        try:
            notes = self.pipeline.notice(
                f"blind:{view.key}:{ft.key}:{int(now)}",
                f"monitoring blind: job {view.key}",
                f"`{ft.key}` {what} ({ft.error}). Hang and failure detection for this job are "
                "paused until it is readable again; the daemon will say when it is.",
                now,
                severity="warning",
            )
            self.metrics.record_notifications(notes)
        except Exception as exc:
            self._log.error("notice_failed", error=f"{type(exc).__name__}: {exc}")

    def _blind_follow_up(self, key: str, w: Watched, why: str, now: float) -> None:
        """Close a "monitoring blind" notice of a job that leaves the watch still blind (its dir
        gone, or its end confirmed): people were told "the daemon will say when it is"."""
        blind = [ft for ft in w.tails() if ft.blind_since is not None]
        if not blind:
            return
        ft = blind[0]
        since = ft.blind_since if ft.blind_since is not None else now
        self._log.info("monitoring_ended", job_id=key, path=ft.key, reason=why)
        try:
            notes = self.pipeline.notice(
                f"blind-end:{key}:{ft.key}:{int(since)}",
                f"monitoring ended: job {key}",
                f"{why[:1].upper()}{why[1:]}: the job is no longer watched, and `{ft.key}` was "
                f"never readable again (blind for {rounded_duration(now - since)}).",
                now,
            )
            self.metrics.record_notifications(notes)
        except Exception as exc:
            self._log.error("notice_failed", error=f"{type(exc).__name__}: {exc}")

    def _steps_ignored(self, view: JobView, ignored: list[tuple[int, str]], now: float) -> None:
        """Implausible step lines (`model.stepguard`): each logged, the first one per job announced."""
        for step, why in ignored[:20]:
            self._log.warning("step_ignored", job_id=view.key, step=step, reason=why)
        try:
            step, why = ignored[0]
            kept = view.last_step
            notes = self.pipeline.notice(
                f"steps-ignored:{view.key}",  # one notice per job, ever (the outbox id dedupes)
                f"implausible step line ignored: job {view.key}",
                f"A `completed step: {step}` line was read but not counted as progress: {why}. "
                f"Status and hang detection keep using step {kept if kept is not None else 'none'}; "
                "the hang clock keeps running. Later implausible step lines of this job are only logged.",
                now,
                severity="warning",
            )
            self.metrics.record_notifications(notes)
        except Exception as exc:
            self._log.error("notice_failed", error=f"{type(exc).__name__}: {exc}")

    def _scan_workers(self, w: Watched, now: float) -> None:
        """RAY=1: follow the head node's worker logs (the authoritative step record)."""
        view = w.view
        main = view.main
        d = view.ref.job_dir
        if main is None or d is None or len(w.workers) >= MAX_WORKER_FILES:
            return
        ray_dir = d / "ray_logs"
        if not ray_dir.is_dir():
            return
        head = main.ray_head or main.tunnel_host
        if head is None:
            nodes = main.header.get("JOB_NODELIST")
            expanded = expand_hostlist(nodes) if nodes else []
            head = expanded[0] if expanded else None
        if head is None or not (ray_dir / head).is_dir():
            return
        view.head_host = head
        files = sorted((ray_dir / head).glob("worker-*.out")) + sorted((ray_dir / head).glob("worker-*.err"))
        added = False
        for f in files[:MAX_WORKER_FILES]:
            if str(f) not in w.workers:
                w.workers[str(f)] = FileTail(f, ref_time=now, access=w.access)
                added = True
        if added:
            self._watch_stale = True  # the tick updates the watcher once, after its reads

    @staticmethod
    def _over_before_watched(w: Watched, now: float) -> bool:
        return not w.slurm_mode and not w.known_before and w.ended_at_first_read

    # -- catching up with existing logs --------------------------------------------

    def _enqueue_catch_up(self, keys: list[str]) -> None:
        """Jobs never read join the backlog, ranked by `catch_up_order` (a stat each, once)."""
        new = False
        for key in keys:
            w = self.jobs[key]
            if w.caught_up or key in self._backlog:
                continue
            saved = w.main.saved if w.main is not None else None
            quiet: float | None = saved.last_step_at if saved is not None else None
            size = 0
            if w.main is not None:
                try:
                    st = os.stat(w.main.link)  # ordering only: the read goes through `access`
                except OSError:
                    quiet = None
                else:
                    size = st.st_size
                    quiet = st.st_mtime if quiet is None else quiet
            self._backlog[key] = Pending(key, quiet, size)
            new = True
        if new:
            self._backlog_order = deque(catch_up_order(self._backlog.values()))

    def _next_pending(self) -> str | None:
        while self._backlog_order:
            key = self._backlog_order.popleft()
            if key in self._backlog and key not in self._catching:
                return key
        return None

    async def _catch_up(self, key: str, now: float) -> None:
        """The first read of one job (everything its files hold), stamped `now`."""
        w = self.jobs.get(key)
        self._catching.add(key)
        try:
            if w is not None:
                await self._read(w, now)
                w.ended_at_first_read = w.view.ended
        finally:
            self._catching.discard(key)
            self._backlog.pop(key, None)
            if w is not None:
                w.caught_up = True

    async def _catch_up_inline(self, now: float) -> set[str]:
        """A full tick's share of the backlog: jobs Slurm says ended (their end is due now), then
        the backlog in order while it fits `catch_up_inline_bytes` (at least one job)."""
        done: set[str] = set()
        for due in [k for k in self._backlog if k not in self._catching and self._ended(k)]:
            await self._catch_up(due, now)
            done.add(due)
        spent = 0
        while True:
            key = self._next_pending()
            if key is None:
                break
            size = self._backlog[key].size + CATCH_UP_FILE_BYTES
            if done and spent + size > self.catch_up_inline_bytes:
                self._backlog_order.appendleft(key)
                break
            spent += size
            await self._catch_up(key, now)
            done.add(key)
        return done

    def _ended(self, key: str) -> bool:
        w = self.jobs.get(key)
        return w is None or w.view.ended

    async def catch_up_next(self, now: float) -> str | None:
        """Read the next backlog job's existing logs, stamped `now` (the daemon's clock when the
        read starts: arrival times stay "when the daemon read the line"); its key, or None."""
        key = self._next_pending()
        if key is None:
            return None
        await self._catch_up(key, now)
        return key

    @property
    def catching_up(self) -> int:
        """Jobs whose existing logs are not read yet (their detectors wait for that read)."""
        return len(self._backlog)

    def _start_catch_up(self) -> None:
        if self._backlog and (self._catch_up_task is None or self._catch_up_task.done()):
            self._catch_up_task = asyncio.ensure_future(self._catch_up_loop())

    async def _catch_up_loop(self) -> None:
        while self._backlog:
            await self._between_ticks.wait()
            try:
                if await self.catch_up_next(clock.wall()) is None:
                    return
            except Exception as exc:
                self._log.exception("catch_up_failed", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0)  # a tick, a file event or a status request may run in between

    async def _finalize(self, w: Watched, now: float) -> None:
        """Last read, then the full triage (all files re-read: parity with `jobdiagd triage`)."""
        view = w.view
        if not self.read_final:
            return
        ref = _followed(view.ref)
        job = view.slurm if w.slurm_mode else None
        state = job.state if job is not None else None
        try:
            logs = await asyncio.to_thread(load_job, ref, ref_time=now, access=w.access)
            view.final = analyze(
                logs,
                now=now,
                slurm_state=state,
                policy=view.policy,
                slurm_wall_s=slurm_wall_s(job, now),
                ignore_steps=view.step_guard.suspects,
            )
        except Exception as exc:
            self._log.error("final_triage_failed", job_id=view.key, error=f"{type(exc).__name__}: {exc}")

    def _persist(self, now: float, only: set[str] | None = None) -> None:
        if self.offsets is None:
            return
        rows = []
        for key, w in self.jobs.items():
            if only is not None and key not in only:
                continue
            for ft in w.tails():
                if ft.dirty or w.view.last_step_at is not None:
                    rows.append(ft.row(key, w.view.last_step, w.view.last_step_at))
                    ft.dirty = False
        edge = self._edge("tail offsets", "state_store")
        try:
            self.offsets.save(rows, now)
        except Exception as exc:
            # Offsets are re-derivable: keep them dirty for the next save, say so once per episode.
            for w in self.jobs.values():
                for ft in w.tails():
                    ft.dirty = True
            edge.failure(exc, now)
        else:
            edge.success(now)

    def _forget(self, keys: list[str], now: float) -> None:
        assert self.offsets is not None
        edge = self._edge("tail offsets", "state_store")
        try:
            for key in keys:
                self.offsets.forget_job(key)
        except Exception as exc:
            edge.failure(exc, now)  # the rows stay: a restart re-derives the same report id
        else:
            edge.success(now)

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

    # -- the loop ----------------------------------------------------------------

    async def run(
        self, sleep: Callable[[float], Awaitable[bool]], tick_seconds: float | Callable[[], float]
    ) -> None:
        """Full ticks every `tick_seconds`; file events wake partial ticks in between.

        `sleep(s)` returns True when the service is stopping (Lifecycle.sleep).
        """
        try:
            await self._run(sleep, tick_seconds)
        finally:
            await self.stop_discovery()
            task, self._catch_up_task = self._catch_up_task, None
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def stop_discovery(self) -> None:
        """Cancel a discovery poll in flight (its Slurm command's process group is killed)."""
        task, self._discovery_task = self._discovery_task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(
        self, sleep: Callable[[float], Awaitable[bool]], tick_seconds: float | Callable[[], float]
    ) -> None:
        def period() -> float:
            return tick_seconds() if callable(tick_seconds) else tick_seconds

        next_full = clock.wall()
        last_gc = clock.monotonic()
        early = self.enricher.early if self.enricher is not None else None
        while True:
            now = clock.wall()
            # The early page is polled after full ticks and when a poll is due, not after every
            # file event: its due times are at least the slack (20 s) after a step's read.
            due_poll = early.next_poll_at() if early is not None else None
            poll_early = due_poll is not None and now >= due_poll
            if now >= next_full:
                await self._safe_tick(now, None)
                self._start_catch_up()
                next_full = now + period()
                poll_early = True
                if clock.monotonic() - last_gc >= GC_EVERY_S:
                    last_gc = self._collect()
            elif await self._tick_on_events(now, early):
                next_full = now + period()
            wake_at = next_full
            if early is not None:
                if poll_early:
                    self._early_poll(early, clock.wall())
                due = early.next_poll_at()
                if due is not None:
                    wake_at = min(wake_at, max(due, clock.wall() + MIN_EARLY_GAP_S))
            if await self._pause(sleep, wake_at, next_full, early):
                return

    async def _tick_on_events(self, now: float, early: EarlyConfirmer | None) -> bool:
        """Between full ticks: a partial tick for GPU-confirmed hangs or changed files, or a full
        one for something new under an outputs root (True: the full-tick period starts again)."""
        if early is not None and early.wake.is_set():
            # GPU-confirmed hangs page now, not at the next full tick.
            keys = {k for k in early.take_confirmed() if k in self.jobs}
            if keys:
                await self._safe_tick(now, keys, early=True)
            return False
        if self.watcher is None:
            return False
        changed, added = self.watcher.take()
        roots = {str(d) for d in self.discovery.dirs()} if self.discovery is not None else set()
        if any(str(Path(p).parent) in roots and p not in self._path_jobs for p in added):
            await self._safe_tick(now, None)  # something new under an outputs root: discover now
            self._start_catch_up()
            return True
        keys = self.jobs_for_paths(changed)
        if keys:
            self._partial_jobs = len(keys)
            await self._safe_tick(now, keys)
        return False

    async def _pause(
        self,
        sleep: Callable[[float], Awaitable[bool]],
        wake_at: float,
        next_full: float,
        early: EarlyConfirmer | None,
    ) -> bool:
        """Sleep until `wake_at` or a file event / GPU confirmation; True when the service stops."""
        timeout = max(0.0, wake_at - clock.wall())
        events = [e for e in (self.watcher.wake if self.watcher is not None else None,) if e is not None]
        if early is not None:
            events.append(early.wake)
        if not events:
            return await sleep(timeout)
        if await self._wait(sleep, timeout, events):
            return True
        if self.watcher is not None and self.watcher.wake.is_set():
            # Woken by a file event: let a burst of writes settle into one partial tick.
            rest = next_full - clock.wall()
            if rest > 0 and await sleep(min(partial_gap(self._partial_jobs), rest)):
                return True
        return False

    def _early_poll(self, early: EarlyConfirmer, now: float) -> None:
        try:
            early.poll({k: w.view for k, w in self.jobs.items()}, now, self.detectors)
        except Exception as exc:  # the early page is an extra: the step budget still pages
            self._edge("early page", "early_page").failure(exc, now)

    def _collect(self) -> float:
        """A full garbage collection between ticks, on our schedule (the runner turns off the
        automatic oldest-generation collections, whose 50+ ms pauses would land inside ticks)."""
        started = clock.monotonic()
        gc.collect()
        done = clock.monotonic()
        self.durations["gc"].append(done - started)
        return done

    async def _wait(
        self, sleep: Callable[[float], Awaitable[bool]], seconds: float, events: Sequence[asyncio.Event]
    ) -> bool:
        sleeper = asyncio.ensure_future(sleep(seconds))
        wakers = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            done, _ = await asyncio.wait({sleeper, *wakers}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sleeper, *wakers):
                if not t.done():
                    t.cancel()
            await asyncio.gather(sleeper, *wakers, return_exceptions=True)
        return sleeper in done and not sleeper.cancelled() and bool(sleeper.result())

    async def _safe_tick(self, now: float, only: set[str] | None, *, early: bool = False) -> None:
        self._between_ticks.clear()
        try:
            await self.tick(now, only, early=early)
        except Exception as exc:
            self._log.exception("tick_failed", error=f"{type(exc).__name__}: {exc}")
            if only is None:
                if self.health is not None:
                    self.health.tick_done(now, False)
                self.metrics.observe_tick(0.0, False, now)
        finally:
            self._between_ticks.set()


def _stall_source(detectors: Sequence[Detector]) -> Callable[[JobView, float], StallKnowledge | None] | None:
    """The hang detector's knowledge of a job's progress, the one source of it (None: disabled)."""
    hang = next((d for d in detectors if isinstance(d, HangDetector)), None)
    return hang.knowledge if hang is not None else None
