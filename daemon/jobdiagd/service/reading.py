"""The reading room: the daemon's watched files, read when the tick asks (`ReadingRoom.read`).

It keeps every watched job's `Watched` (its `JobView` and its file tails), the file watcher's
directories, the catch-up backlog (`service.catchup.Backlog`), and the saved offsets; the engine asks it to read a tick's
jobs and judges what was read. It never judges: it only reads and says what it could not.

Decided here (moved from the engine, rules unchanged):

- Access: a job's logs are read only inside `[slurm] outputs_roots` or the directory holding its
  job dir (the watched root; under Slurm the root it was found in, or the directory of its
  StdOut before the job dir exists), and only when owned by its Slurm user (without Slurm: the
  job dir's owner) — `triage.resolve.job_access`.
- Blind: a file that cannot be read or is refused, from the first read on (only "does not exist
  yet" is waiting), gives one "monitoring blind" notice and pauses that job's detectors; the
  others keep running. Readable again: "monitoring restored". A job that leaves the watch still
  blind gets "monitoring ended" (`follow_up_blind`, rule CHAT-6). The words: `alerts.notices`.
- Worker logs: on a RAY=1 job the head node's worker logs under `ray_logs/<head>/` are followed
  too (the authoritative step record), at most `MAX_WORKER_FILES`, looked for every
  `WORKER_RESCAN_S`.
- Catching up: a job's first read takes in everything its log already holds. A full tick does
  that for at most `catchup.CATCH_UP_INLINE_BYTES` worth of jobs (at least one, and always for a
  job whose end is due), in `service.catchup` order — quiet longest first, the job closest to a hang or a
  crash page; the rest is read in the background between ticks, so a daemon (re)starting on 1000
  jobs has a short first tick. A job is judged only once read (by the tick that read it, or the
  first tick after its background read); its step arrival times are when that read began (the
  daemon's clock, as always), and a restart's saved hang clock is restored. A job found already
  finished (its JOB SUMMARY there at the first read) is dropped without a report whether it was
  read in the tick or in the background (`Watched.over_before_watched`).
- Offsets: re-derivable (a restart re-reads the files), but the arrival time of a job's newest
  step is not: it is the hang clock. It is written in the tick that read the step (a few rows,
  only those jobs), so a crash or a wedge does not restart the clock; the rest once a minute
  (`PERSIST_EVERY_S`), and at once when the tick told people something (`persist`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from jobdiagd.alerts import notices
from jobdiagd.alerts.notices import Notice
from jobdiagd.edge_trigger import EdgeTrigger
from jobdiagd.logs.job import load_job
from jobdiagd.logs.safeopen import ANYWHERE, LogAccess, RefusedFile
from jobdiagd.logsetup import get_logger
from jobdiagd.model.jobref import JobRef
from jobdiagd.rules.hostlist import expand_hostlist
from jobdiagd.rules.slurm import end_state
from jobdiagd.service.catchup import Backlog, Pending
from jobdiagd.service.discovery import Discovery, NewJob
from jobdiagd.service.jobs import JobView
from jobdiagd.sources.slurm import SlurmJob
from jobdiagd.sources.slurmstate import slurm_wall_s
from jobdiagd.sources.tail import ChangeWatcher, FileTail, OffsetStore
from jobdiagd.triage.engine import analyze
from jobdiagd.triage.resolve import job_access

PERSIST_EVERY_S = 60.0
WORKER_RESCAN_S = 30.0
MAX_WORKER_FILES = 16

# Queue one of the daemon's notices; False when it could not be made (tried again next time).
Tell = Callable[[Notice, float], bool]


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
    gone: bool = False  # without Slurm: its job dir disappeared; the tick drops it (`Engine._drop_gone`)

    def tails(self) -> list[FileTail]:
        return ([self.main] if self.main is not None else []) + list(self.workers.values())

    def over_before_watched(self) -> bool:
        """A job dir found with its JOB SUMMARY already written: it finished before we watched it."""
        return not self.slurm_mode and not self.known_before and self.ended_at_first_read


def _followed(ref: JobRef) -> JobRef:
    """The ref with its `log` link resolved (triage wants the file, e.g. for the report title)."""
    return replace(ref, log=Path(os.path.realpath(ref.log))) if ref.log is not None else ref


def _dir_gone(job_dir: Path | None) -> bool:
    """The job's directory no longer exists (not even as a dangling link)."""
    return job_dir is not None and not os.path.lexists(job_dir)


def _summary_state(view: JobView) -> str:
    s = view.main.summary if view.main is not None else None
    return end_state(s.exit_code if s is not None else None)


class ReadingRoom:
    """The watched jobs' files: the watch, the reads, the catch-up backlog, the saved offsets."""

    def __init__(
        self,
        roots: Sequence[Path],
        tell: Tell,
        *,
        discovery: Discovery | None = None,
        offsets: OffsetStore | None = None,
        watcher: ChangeWatcher | None = None,
        read_final: bool = True,
    ) -> None:
        self.roots = list(roots)  # [slurm] outputs_roots (`access_for`)
        self.tell = tell
        self.discovery = discovery
        self.offsets = offsets
        self.watcher = watcher
        self.read_final = read_final
        self.jobs: dict[str, Watched] = {}
        self._path_jobs: dict[str, str] = {}
        self._watch_stale = False  # jobs were added since the watcher's directories were set
        self._stepped: set[str] = set()  # jobs whose newest step arrived since the last save
        self._persisted_at = float("-inf")
        self._log = get_logger(component="engine")
        self._offsets_edge = EdgeTrigger("tail offsets", kind="state_store", logger=self._log)
        # Jobs whose existing logs are still to be read, read a tick's share inline, the rest
        # in the background between ticks (`service.catchup`).
        self.backlog = Backlog(self._first_read, self._ended)

    # -- the watch -------------------------------------------------------------------------

    def add(self, new: NewJob, view: JobView, now: float) -> Watched:
        """Watch a new job; the file watcher's dirs are set once per batch of new jobs (per job
        it is O(jobs): 500 at once took 15 s)."""
        link = new.ref.log
        access = self.access_for(new.ref, new.slurm)
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
        self._watch_stale = True  # applied once per batch of news (`watch_news`), not per job
        return w

    def access_for(self, ref: JobRef, job: SlurmJob | None) -> LogAccess:
        """The job's logs must lie in a configured outputs root or the directory holding its
        job dir (outputs mode: the watched root; Slurm: the root it was found in, or StdOut's
        directory) and belong to its Slurm user (else the job dir's owner)."""
        return job_access(ref, self.roots, job.user if job is not None else None)

    def relink(self, w: Watched, ref: JobRef, job: SlurmJob) -> None:
        """The job dir appeared (the batch script makes it after the job starts): follow its
        `log` link from now on, under the access its new ref allows."""
        w.view.ref = ref
        w.access = self.access_for(ref, job)
        if w.main is not None and ref.log is not None:
            w.main.link = ref.log
            w.main.access = w.access
            if w.main.reader is not None:
                w.main.reader.access = w.access

    def remove(self, key: str) -> Watched:
        return self.jobs.pop(key)

    def watch_news(self, relinked: bool) -> None:
        """After discovery's news: the watcher's dirs once, if jobs were added or relinked."""
        if relinked or self._watch_stale:
            self.update_watch_dirs()

    def update_watch_dirs(self) -> None:
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
        return {self._path_jobs[p] for p in paths if p in self._path_jobs}

    def take_events(self) -> tuple[bool, set[str]]:
        """The file events since the last call: (something new under an outputs root that no
        watched job names — discover now —, else the watched jobs whose files changed)."""
        if self.watcher is None:
            return False, set()
        changed, added = self.watcher.take()
        roots = {str(d) for d in self.discovery.dirs()} if self.discovery is not None else set()
        if any(str(Path(p).parent) in roots and p not in self._path_jobs for p in added):
            return True, set()
        return False, self.jobs_for_paths(changed)

    # -- reading ---------------------------------------------------------------------------

    async def read(self, keys: list[str], full: bool, now: float) -> None:
        """Read the tick's jobs: a full tick's share of the catch-up backlog, then every job
        already caught up (each file once)."""
        self._enqueue_catch_up(keys)
        fresh = await self.backlog.read_inline(now) if full else set()
        for key in keys:
            w = self.jobs[key]
            if w.caught_up and key not in fresh:
                await self._read(w, now)
        if self._watch_stale:
            self.update_watch_dirs()

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
            self._unreadable(w, ft, exc, now)
            return
        if ft.blind_since is not None:
            self._log.info("monitoring_restored", job_id=view.key, path=ft.key)
            self.tell(notices.monitoring_restored(view.key, ft.key, now), now)
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

    def _unreadable(self, w: Watched, ft: FileTail, exc: OSError, now: float) -> None:
        view = w.view
        ft.error = f"{type(exc).__name__}: {exc.strerror or exc}"
        if not w.slurm_mode and _dir_gone(view.ref.job_dir):
            w.gone = True  # not blind: there is nothing left to watch (`Engine._drop_gone`)
            return
        # Unreadable is blind whether or not it was ever read; only a file that does not
        # exist yet (a job whose log Slurm has not created) is merely waiting.
        if ft.blind_since is None and (ft.ever_read or not isinstance(exc, FileNotFoundError)):
            ft.blind_since = now
            ft.dirty = True
            self._log.warning("monitoring_blind", job_id=view.key, path=ft.key, error=ft.error)
            refused = (ft.error or "").startswith(f"{RefusedFile.__name__}:")
            self.tell(notices.monitoring_blind(view.key, ft.key, ft.error, refused=refused, now=now), now)
        if ft.blind_since is not None:
            view.blind[ft.key] = ft.error

    def follow_up_blind(self, key: str, w: Watched, why: str, now: float) -> None:
        """Close a "monitoring blind" notice of a job that leaves the watch still blind (its dir
        gone, or its end confirmed): people were told "the daemon will say when it is"."""
        blind = [ft for ft in w.tails() if ft.blind_since is not None]
        if not blind:
            return
        ft = blind[0]
        since = ft.blind_since if ft.blind_since is not None else now
        self._log.info("monitoring_ended", job_id=key, path=ft.key, reason=why)
        self.tell(notices.monitoring_ended(key, ft.key, why, since, now), now)

    def _steps_ignored(self, view: JobView, ignored: list[tuple[int, str]], now: float) -> None:
        """Implausible step lines (`model.stepguard`): each logged, the first one per job announced."""
        for step, why in ignored[:20]:
            self._log.warning("step_ignored", job_id=view.key, step=step, reason=why)
        step, why = ignored[0]
        self.tell(notices.steps_ignored(view.key, step, why, view.last_step), now)

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

    async def final_read(self, w: Watched, now: float) -> None:
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

    # -- catching up with existing logs ------------------------------------------------------

    def _enqueue_catch_up(self, keys: list[str]) -> None:
        """Jobs never read join the backlog, ranked by `catch_up_order` (a stat each, once)."""
        self.backlog.add(self._pending(self.jobs[k]) for k in keys if not self._caught_up_or_queued(k))

    def _caught_up_or_queued(self, key: str) -> bool:
        return self.jobs[key].caught_up or key in self.backlog

    @staticmethod
    def _pending(w: Watched) -> Pending:
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
        return Pending(w.view.key, quiet, size)

    async def _first_read(self, key: str, now: float) -> None:
        """The first read of one job (everything its files hold), stamped `now`."""
        w = self.jobs.get(key)
        if w is None:
            return
        try:
            await self._read(w, now)
            w.ended_at_first_read = w.view.ended
        finally:
            w.caught_up = True

    def _ended(self, key: str) -> bool:
        w = self.jobs.get(key)
        return w is None or w.view.ended

    @property
    def catching_up(self) -> int:
        """Jobs whose existing logs are not read yet (their detectors wait for that read)."""
        return len(self.backlog)

    # -- saved offsets -----------------------------------------------------------------------

    def persist(self, now: float, *, full: bool, told: bool) -> None:
        """The tick's save (see the module docstring): a full tick's every minute, or at once when
        it `told` people something; any tick's rows of the jobs whose newest step it read."""
        if full and (told or now - self._persisted_at >= PERSIST_EVERY_S):
            self._save(now)
            self._persisted_at = now
        elif self._stepped:
            self._save(now, only=self._stepped)
        self._stepped = set()

    def _save(self, now: float, only: set[str] | None = None) -> None:
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
        try:
            self.offsets.save(rows, now)
        except Exception as exc:
            # Offsets are re-derivable: keep them dirty for the next save, say so once per episode.
            for w in self.jobs.values():
                for ft in w.tails():
                    ft.dirty = True
            self._offsets_edge.failure(exc, now)
        else:
            self._offsets_edge.success(now)

    def forget(self, keys: list[str], now: float) -> None:
        """The saved offsets of jobs that left the watch for good."""
        if self.offsets is None:
            return
        try:
            for key in keys:
                self.offsets.forget_job(key)
        except Exception as exc:
            self._offsets_edge.failure(exc, now)  # the rows stay: a restart re-derives the same report id
        else:
            self._offsets_edge.success(now)
