"""Discovery's news fed into the watch: new jobs, Slurm's records, confirmed ends, and the source's health.

Decided here (moved from the engine, rules unchanged):

- The poll (`Discovery.poll`: squeue, or the outputs roots) runs as its own task, so a hung
  squeue (bounded by `command_timeout_seconds`) never holds file reading or hang detection: a
  full tick waits for it at most `DISCOVERY_WAIT_S` (and half a tick); a slow answer is taken by
  a later tick, which then asks again at once.
- A job leaves the watch only on an end Slurm confirms (SlurmWatcher's rule); an end whose
  Slurm state is still live is refused (`job_end_refused`): never an end report for a job Slurm
  still runs.
- The batch script creates the job dir after the job starts: it is picked up (RAY=1 worker logs
  live there) and the job's `log` link followed from then on.
- A source that fails `SOURCE_NOTICE_AFTER` times in a row gets one "source degraded" notice
  (one blip is not news), and one "source recovered" when it answers again. Its health is the
  `Health` edge trigger `jobdiagd status` lists and the self-metrics read (`source_up`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from jobdiagd.alerts import notices
from jobdiagd.edge_trigger import EdgeTrigger
from jobdiagd.logsetup import get_logger
from jobdiagd.rules.slurm import FINISHED_STATES
from jobdiagd.service.discovery import Discovered, Discovery, NewJob, SlurmDiscovery
from jobdiagd.service.health import Health
from jobdiagd.service.metrics import DaemonMetrics
from jobdiagd.service.reading import ReadingRoom, Tell, Watched
from jobdiagd.sources.slurm import SlurmError, SlurmJob

# A full tick waits at most this long (and at most half a tick) for a discovery poll it started.
DISCOVERY_WAIT_S = 1.0
# A source's "degraded" notice goes out after this many failures in a row (one blip is not news).
SOURCE_NOTICE_AFTER = 2


class DiscoveryFeed:
    """Runs `discovery`'s polls beside the ticks and applies their news to the reading room."""

    def __init__(
        self,
        discovery: Discovery,
        room: ReadingRoom,
        add_job: Callable[[NewJob, float], Watched],
        tell: Tell,
        *,
        health: Health | None,
        metrics: DaemonMetrics,
        tick_seconds: Callable[[], float],
    ) -> None:
        self.discovery = discovery
        self.room = room
        self.add_job = add_job  # the engine's: a new job's view carries its stall policy
        self.tell = tell
        self.health = health
        self.metrics = metrics
        self.tick_seconds = tick_seconds
        self.task: asyncio.Future[Discovered | None] | None = None
        self._noticed: dict[str, float] = {}  # source -> failing since, once "degraded" was sent
        self._edges: dict[str, EdgeTrigger] = {}  # without `health` (tests, tools)
        self._log = get_logger(component="engine")

    async def discover(self, now: float) -> None:
        """Apply discovery's news. A tick waits for the poll it starts at most DISCOVERY_WAIT_S
        (a quick squeue is used at once); a slow one is applied by a later tick, while this one
        reads files and checks hangs (squeue may block up to its timeout)."""
        task = self.task
        if task is not None and task.done():
            self.task = None
            self._take_news(task, now)  # a late answer: then ask again at once
        if self.task is None:
            task = self.task = asyncio.ensure_future(self.discovery.poll(now, set(self.room.jobs)))
            await asyncio.wait({task}, timeout=min(DISCOVERY_WAIT_S, self.tick_seconds() / 2))
            if task.done():
                self.task = None
                self._take_news(task, now)

    async def stop(self) -> None:
        """Cancel a poll in flight (its Slurm command's process group is killed)."""
        task, self.task = self.task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _take_news(self, task: asyncio.Future[Discovered | None], now: float) -> None:
        if task.cancelled():
            return
        name = self.discovery.name
        try:
            news = task.result()
        except (SlurmError, OSError, ValueError) as exc:
            self._source_failed(name, exc, now)
            return
        if news is None:
            return
        if news.problem is not None:
            self._source_failed(name, news.problem, now)
        else:
            self._source_ok(name, now)
        for new in news.new:
            if new.key not in self.room.jobs:
                self.add_job(new, now)
        relinked = False
        for key, job in news.slurm.items():
            w = self.room.jobs.get(key)
            if w is None:
                continue
            w.view.slurm = job
            relinked = self._pick_up_job_dir(w, job) or relinked
        self.room.watch_news(relinked)
        self._take_ends(news, now)

    def _pick_up_job_dir(self, w: Watched, job: SlurmJob) -> bool:
        """The job dir of a Slurm job, once it exists; True when the job was relinked."""
        d = self.discovery
        if w.view.ref.job_dir is not None or not isinstance(d, SlurmDiscovery):
            return False
        ref = d.ref_for(job)
        if ref.job_dir is None:
            return False
        self.room.relink(w, ref, job)
        return True

    def _take_ends(self, news: Discovered, now: float) -> None:
        """Jobs whose end Slurm confirms are marked ended (their end report is due this tick)."""
        for key, (state, final) in news.ended.items():
            w = self.room.jobs.get(key)
            if w is None:
                continue
            live = final.state if final is not None and not final.is_finished else None
            if live is None and state != "UNKNOWN" and state not in FINISHED_STATES:
                live = state
            if live is not None:
                # Never an end report for a job Slurm still runs (a broken squeue answer).
                self._log.error("job_end_refused", job_id=key, slurm_state=live)
                continue
            w.view.ended = True
            w.view.end_state = state
            if final is not None:
                w.view.slurm = final

    def _source_failed(self, name: str, error: BaseException | str, now: float) -> None:
        edge = self._source(name)
        edge.failure(error, now)
        self.metrics.source_failed(name)
        if edge.failures < SOURCE_NOTICE_AFTER or name in self._noticed:
            return
        since = edge.failing_since if edge.failing_since is not None else now
        # Sent, or tried again at the next failure (same key: never sent twice).
        if self.tell(notices.source_degraded(name, edge.failures, edge.last_error, since), now):
            self._noticed[name] = since

    def _source_ok(self, name: str, now: float) -> None:
        self._source(name).success(now)
        since = self._noticed.get(name)
        if since is not None and self.tell(notices.source_recovered(name, since, now), now):
            del self._noticed[name]

    def _source(self, name: str) -> EdgeTrigger:
        if self.health is not None:
            return self.health.source(name)
        edge = self._edges.get(name)
        if edge is None:
            edge = self._edges[name] = EdgeTrigger(f"source:{name}", kind="source", logger=self._log)
        return edge
