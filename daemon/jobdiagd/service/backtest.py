"""`jobdiagd backtest`: replay finished jobs through the daemon's detectors on a clock built from the log itself.

One clock per file (`logs.file_clock`: printed timestamps where present, else one step series
moves it by its `seconds:`); each file is read the way the daemon's tail reader reads it, every
line with its virtual time (`logs.replay_read`); the files are then merged by time (ties keep the
main log first; a file's undated tail comes at the job's end).
`at_s` is seconds since the first `completed step:` line read on that clock (negative before it).

Replay: the lines the daemon's tail reader would feed go to fresh `LogState`s through
`LogState.feed_bytes` (the fast step path) in clock order; with `workers` > 1 a big file's read
runs in a forked process. A step's arrival time is the time of its first line read; the view
takes in the other lines before each tick, as the engine does after every read. Full ticks run
every `tick` seconds of virtual time through the same detectors, the same resolution rule and
the same incident book as the daemon (the states change only where a line is fed, so ticks
between fed lines see what they would between all lines). The job ends at its last line (JOB
SUMMARY state, or UNKNOWN) and the job-end report runs on a fresh `load_job` of its files,
like the daemon's. The states keep the daemon's `TAIL` step retention, as a tailed job's do.
Files are opened as `jobdiagd triage` opens them (`triage.resolve.job_access`): one that is no
regular file, leaves the job's outputs root or belongs to another user is left out.

Early page (`[tsdb] early_page`, RAY=1 jobs with a `prometheus/` holding data): the replay asks
the job's own TSDB what the live daemon asks its Prometheus (`tsdb.gpu_hang.gpu_query`,
evaluated at the virtual time) whenever `HangDetector.early_due_at` says a step is overdue,
once per `early_scrape_interval_s` of virtual time, as `service.early_page` does live, and a
confirmation runs the detectors at that virtual time (the live daemon's immediate partial
tick). The TSDB is served read-only by a local Prometheus over a private copy of the directory
(WAL included, lock excluded), started only when a first query is due: the job's own directory
is never opened for writing and its lock never touched. Without a Prometheus binary, or with
no TSDB data, the replay goes on without the early page and says so in `early_note`.

Site Prometheus (`--site-prometheus URL`, docs/site-prometheus.md): a job without TSDB data of
its own (any job, RAY=1 or not) asks a site Prometheus instead, with `[site_prometheus]`'s map
(profile, host rewrite, scrape interval) and the same bounded query the live daemon sends
(`SitePrometheus.early_verdict`, evaluated at the virtual time). The job's nodes and id come from
its log header (`JOB_NODELIST`, the job id): a finished job has no `scontrol -d` any more, so a
shared node is told apart only by the exporter's job label (or `exclusive_nodes`), as live
without GPU indices (rule SITE-4). The map is not checked at start (its check asks "now", and a
replayed job's series are old): a wrong name shows as `no-data` verdicts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import heapq
import os
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobdiagd import clock, jsonsafe
from jobdiagd.alerts.incidents import IncidentBook
from jobdiagd.config import Config, ConfigError, load_for_command
from jobdiagd.detectors import Detector, EarlyMemo, early_memo
from jobdiagd.detectors import build as build_detectors
from jobdiagd.detectors.hang import EarlyRule, HangDetector, policy_from_config
from jobdiagd.logs.file_clock import FileClock, survey
from jobdiagd.logs.job import load_job
from jobdiagd.logs.reader import set_default_workers
from jobdiagd.logs.replay_read import (
    FORK_MIN,
    UNDATED,
    Event,
    place_unstamped,
    read_timed,
    read_timed_forked,
)
from jobdiagd.logs.safeopen import LogAccess
from jobdiagd.logs.state import LogState
from jobdiagd.logs.steps import TAIL
from jobdiagd.model.alerts import Finding
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.kinds import FailureClass, IncidentKind
from jobdiagd.rules.hostlist import expand_hostlist
from jobdiagd.rules.slurm import end_state
from jobdiagd.service.jobs import JobView
from jobdiagd.service.judging import Judged, run_detectors
from jobdiagd.service.site_source import placement_for, site_config
from jobdiagd.triage.engine import analyze
from jobdiagd.triage.resolve import ResolveError, job_access, list_jobs, resolve
from jobdiagd.tsdb.access import FULL_COPY_EXCLUDES, AccessError, LocalPrometheus, copy_tsdb, tsdb_has_data
from jobdiagd.tsdb.client import PromClient, PromError, Series
from jobdiagd.tsdb.gpu_hang import GpuVerdict, gpu_query, judge, profile_for
from jobdiagd.tsdb.settings import TsdbSettings
from jobdiagd.tsdb.site import JobPlacement, SitePrometheus

MAX_TICKS = 200_000  # a guard against a log whose clock jumps by years
JOB_TSDB = "the job's TSDB"  # `JobReplay.early_source` of the job's own prometheus/


@dataclass
class Alert:
    kind: str
    event: str
    at_step: int | None
    at_s: float
    cls: str | None
    summary: str
    budget_s: float | None = None  # hang alerts: the stall budget the detector applied
    phase: str | None = None  # hang alerts: its phase (startup | warmup | checkpoint | steady)
    at: float | None = None  # the tick's time on the virtual clock (epoch seconds when dated)
    gpu_confirmed: bool = False  # hang alerts: paged early on the GPUs' evidence

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "gpu_confirmed": self.gpu_confirmed,
            "event": self.event,
            "at_step": self.at_step,
            "at_s": round(self.at_s, 1),
            "class": self.cls,
            "summary": self.summary,
            "budget_s": None if self.budget_s is None else round(self.budget_s, 1),
            "phase": self.phase,
        }


@dataclass
class JobReplay:
    job: str
    log: str | None
    alerts: list[Alert] = field(default_factory=list)
    first_step_at: float | None = None
    last_step: int | None = None
    last_step_at_s: float | None = None
    step_time_s: float | None = None
    end_at_s: float | None = None
    barrier_at_s: float | None = None  # when the pre-training barrier line was read
    final_status: str | None = None
    final_primary: str | None = None
    early_queries: int = 0  # early-page queries answered from the job's TSDB
    early_note: str | None = None  # why the early page could not be replayed, if it could not
    early_states: dict[str, int] = field(default_factory=dict)  # early verdicts by state
    early_source: str | None = None  # what answered the early queries: the job's TSDB or a site Prometheus
    undated_lines: int = 0  # lines of an undated tail taken in at the job's end (their time is unknown)
    # What the replay fed, one state per file (main log first): the daemon's view at the end.
    states: list[LogState] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "log": self.log,
            "alerts": [a.to_dict() for a in self.alerts],
            "last_step": self.last_step,
            "last_step_at_s": None if self.last_step_at_s is None else round(self.last_step_at_s, 1),
            "step_time_s": self.step_time_s,
            "end_at_s": None if self.end_at_s is None else round(self.end_at_s, 1),
            "barrier_at_s": None if self.barrier_at_s is None else round(self.barrier_at_s, 1),
            "final_status": self.final_status,
            "final_primary": self.final_primary,
            "early_queries": self.early_queries,
            "early_note": self.early_note,
            "early_states": dict(self.early_states),
            "early_source": self.early_source,
            "undated_lines": self.undated_lines,
        }


def _readable(path: Path, access: LogAccess) -> bool:
    try:
        os.close(access.open(path))
    except OSError:
        return False
    return True


def _files(ref: JobRef, ref_time: float, access: LogAccess) -> tuple[list[Path], str | None]:
    """Main log plus, for RAY=1, the head node's worker logs (what the daemon tails); files that
    `access` refuses (not regular, outside the job's root, another user's) are left out."""
    files: list[Path] = [ref.log] if ref.log is not None and _readable(ref.log, access) else []
    head: str | None = None
    d = ref.job_dir
    if files and d is not None and (d / "ray_logs").is_dir():
        probe = load_job(
            JobRef(ref.job_id, ref.name, None, ref.log, ref.platform), ref_time=ref_time, access=access
        ).main
        if probe is not None:
            head = probe.ray_head or probe.tunnel_host
            if head is None and probe.header.get("JOB_NODELIST"):
                nodes = expand_hostlist(probe.header["JOB_NODELIST"])
                head = nodes[0] if nodes else None
        if head is not None and (d / "ray_logs" / head).is_dir():
            hd = d / "ray_logs" / head
            workers = sorted(hd.glob("worker-*.out")) + sorted(hd.glob("worker-*.err"))
            files += [f for f in workers if _readable(f, access)]
        else:
            head = None
    return files, head


def replay(
    ref: JobRef,
    cfg: Config,
    *,
    tick: float,
    ref_time: float,
    workers: int = 1,
    site_url: str | None = None,
) -> JobReplay:
    """`workers` > 1: files over `FORK_MIN` are read by forked processes (see `read_timed_forked`).
    `site_url`: a site Prometheus answers the early queries of a job without TSDB data."""
    key = ref.job_id or ref.name or str(ref.log)
    result = JobReplay(job=key, log=str(ref.log) if ref.log else None)
    access = job_access(ref)
    files, head = _files(ref, ref_time, access)
    if not files:
        return result
    clocks = [survey(f, i, ref_time, access) for i, f in enumerate(files)]
    starts = place_unstamped(clocks, ref_time)
    reads = [
        read_timed_forked(fc, start, ref_time)
        if workers > 1 and fc.path.stat().st_size >= FORK_MIN
        else read_timed(fc, start, ref_time)
        for fc, start in zip(clocks, starts, strict=True)
    ]
    events: Iterator[Event] = reads[0] if len(reads) == 1 else heapq.merge(*reads)
    first = min(starts)
    states = result.states = [LogState(str(f), ref_time=ref_time, retention=TAIL) for f in files]  # as tailed
    view = JobView(key=key, ref=ref, first_seen=first, policy=policy_from_config(cfg))
    view.main = states[0]
    if head is not None and len(states) > 1:
        view.head_host = head
        view.workers = {head: states[1:]}
    run = _Run(ref, cfg, view, result, first + tick, tick, head, clocks, site_url=site_url)
    try:
        run.feed(events, states)
        end = max(first, *(fc.end for fc in clocks))
        run.take_in()
        # Trailing lines that only moved the clock (chatter after the last fed line).
        run.until(end, inclusive=False)
    finally:
        if run.early is not None:
            run.early.close()
    run.end(ref, access, ref_time, end)
    base = run.t0 if run.t0 is not None else first
    result.end_at_s = end - base
    result.last_step = view.last_step
    if view.last_step_at is not None:
        result.last_step_at_s = view.last_step_at - base
    if view.marker_at is not None:
        result.barrier_at_s = view.marker_at - base
    st_time = view.step_time()
    result.step_time_s = round(st_time, 3) if st_time else None
    assert view.final is not None
    result.final_status = view.final.status
    result.final_primary = view.final.primary
    return result


class _Run:
    """One job's replay on its virtual clock: lines fed to the states, ticks (and early polls)
    run between them in time order, the job-end tick at the end."""

    def __init__(
        self,
        ref: JobRef,
        cfg: Config,
        view: JobView,
        out: JobReplay,
        next_tick: float,
        tick: float,
        head: str | None,
        clocks: Sequence[FileClock] = (),
        *,
        site_url: str | None = None,
    ) -> None:
        self.view, self.out, self.next_tick, self.tick = view, out, next_tick, tick
        self.clocks = clocks
        self.undated_at: float | None = None  # where the files' undated tails go: the job's end
        self.policy = view.policy
        self.detectors = build_detectors(cfg)
        hang = next((d for d in self.detectors if isinstance(d, HangDetector)), None)
        # As the engine wires it (rule VIEW-1): the view's triage knows what the detector knows.
        view.stall_source = hang.knowledge if hang is not None else None
        self.book = IncidentBook.from_config(cfg.incidents)
        self.ticks = 0
        self.t0: float | None = None
        self.fed_at: float | None = None  # the last fed line's time, until the view has taken it in
        self.early: _EarlyReplay | None = None
        if cfg.tsdb.early_page and hang is not None:
            if head is not None:
                self.early = _EarlyReplay.for_job(ref, cfg, out, hang)
            if self.early is None and site_url:
                self.early = _SiteEarlyReplay(ref, cfg, site_url, out, hang)

    def take_in(self) -> None:
        """The view takes in the lines fed so far (as the engine does after every read)."""
        if self.fed_at is not None:
            self.view.note_read(self.fed_at)
            self.fed_at = None

    def until(self, t: float, *, inclusive: bool) -> None:
        """Ticks (and early polls) due before `t` (at `t` too when `inclusive`), in time order."""
        view, early = self.view, self.early
        while self.ticks < MAX_TICKS:
            poll = early.next_poll(view) if early is not None else None
            if poll is not None and poll < self.next_tick and (poll < t or (inclusive and poll == t)):
                self.take_in()
                if early is not None and early.ask(view, poll):
                    self._tick(poll)  # the live daemon's early partial tick
                continue
            if not (self.next_tick < t or (inclusive and self.next_tick == t)):
                return
            self.take_in()  # before detectors
            self._tick(self.next_tick)
            self.next_tick += self.tick
            self.ticks += 1

    def feed(self, events: Iterator[Event], states: list[LogState]) -> None:
        view = self.view
        for t, order, lineno, offset, raw, head_line, cand in events:
            if t == UNDATED:
                t = self._undated_line()
            self.until(t, inclusive=True)
            st = states[order]
            # What PrefilterTailReader feeds: the head in full until training starts, then candidates.
            if not cand and not (head_line and not st.training_started):
                continue
            before = (len(st.steps), st.barrier_passed is None)
            st.feed_bytes(raw, lineno, offset)
            st.lines, st.bytes = lineno, offset + len(raw) + 1
            self.fed_at = t
            if (len(st.steps), st.barrier_passed is None) != before:
                # A new step or the barrier: its arrival is this line's time. (Other tasks' copies
                # change nothing the view needs before the next tick.)
                view.note_read(t)
                self.fed_at = None
                if self.t0 is None and view.last_step is not None:
                    self.t0 = t
                    self.out.first_step_at = t

    def _undated_line(self) -> float:
        """When a line of an undated tail is taken in: the job's end, the last time any of its files
        shows (the merge yields these lines last, so every file's last known time is in)."""
        if self.undated_at is None:
            known = [fc.known_end for fc in self.clocks if fc.known_end is not None]
            self.undated_at = max(known, default=self.view.first_seen)
        self.out.undated_lines += 1
        return self.undated_at

    def end(self, ref: JobRef, access: LogAccess, ref_time: float, end: float) -> None:
        """The job ends at its last line: the job-end report on a fresh read of its files."""
        view = self.view
        view.note_read(end)
        view.ended = True
        s = view.main.summary if view.main is not None else None
        view.end_state = end_state(s.exit_code if s is not None else None)
        view.final = analyze(load_job(ref, ref_time=ref_time, access=access), now=end, policy=self.policy)
        self._tick(end)

    def _tick(self, now: float) -> None:
        _tick(self.view, self.detectors, self.book, now, self.out, self.t0)


class ReplayTsdb:
    """A read-only Prometheus over a private copy of a finished job's TSDB, queried synchronously.

    The copy holds everything but the lock (WAL included: a job's last samples, its hang, are
    often not compacted yet); the job's own directory is only read."""

    def __init__(self, pdir: Path, settings: TsdbSettings, label: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._tmp = tempfile.TemporaryDirectory(prefix="jobdiagd-backtest-tsdb-", dir=settings.work_dir)
        self._prom: LocalPrometheus | None = None
        self._client: PromClient | None = None
        try:
            copy_tsdb(pdir, Path(self._tmp.name), FULL_COPY_EXCLUDES)
            prom = LocalPrometheus(Path(self._tmp.name), settings, label=label)
            self._loop.run_until_complete(prom.start())
            self._prom = prom
            self._client = PromClient(
                prom.base_url, label=f"read-only copy of {pdir}", timeout_s=settings.query_timeout_s
            )
        except BaseException:
            self.close()
            raise

    def query_matrix(self, promql: str, at: float) -> list[Series]:
        assert self._client is not None
        return self._loop.run_until_complete(self._client.query_matrix(promql, at))

    def close(self) -> None:
        try:
            if self._client is not None:
                self._loop.run_until_complete(self._client.close())
            if self._prom is not None:
                self._loop.run_until_complete(self._prom.stop())
        finally:
            self._client = self._prom = None
            self._loop.close()
            self._tmp.cleanup()


class _EarlyReplay:
    """The live `service.early_page` on the virtual clock: when a step is overdue, one query per
    scrape interval against the job's TSDB, judged by `tsdb.gpu_hang.judge`."""

    def __init__(
        self, pdir: Path, settings: TsdbSettings, label: str, out: JobReplay, hang: HangDetector
    ) -> None:
        self.pdir, self.settings, self.label, self.out = pdir, settings, label, out
        self.hang = hang  # its budget says when a step is overdue
        self.rule = EarlyRule(settings.early_overdue_factor, settings.early_overdue_slack_s)
        self.interval = settings.early_scrape_interval_s
        self.step: int | None = None
        self.next_at = float("-inf")
        self.tsdb: ReplayTsdb | None = None
        self.failed = False
        self.verdicts: list[GpuVerdict] = []

    @classmethod
    def for_job(cls, ref: JobRef, cfg: Config, out: JobReplay, hang: HangDetector) -> _EarlyReplay | None:
        pdir = ref.job_dir / "prometheus" if ref.job_dir is not None else None
        if pdir is None or not tsdb_has_data(pdir):
            out.early_note = "no TSDB data in the job's prometheus/: early page not replayed"
            return None
        return cls(pdir, cfg.tsdb, ref.job_id or ref.name or str(pdir), out, hang)

    def next_poll(self, view: JobView) -> float | None:
        if self.failed:
            return None
        memo = early_memo(view)
        if memo is not None and memo.verdict.confirmed:
            return None
        window = self.hang.early_window(view, self.rule)
        if window is None:
            return None
        due, budget_at = window
        if view.last_step != self.step:
            self.step, self.next_at = view.last_step, due
        at = max(due, self.next_at)
        return at if at <= budget_at else None  # past the step budget, the budget pages

    def ask(self, view: JobView, at: float) -> bool:
        """Query at virtual time `at`; True when the GPUs confirm the hang."""
        self.next_at = at + self.interval
        last = view.last_step
        assert last is not None
        verdict = self._verdict(view, at)
        if verdict is None:
            return False
        self.out.early_queries += 1
        self.verdicts.append(verdict)
        self.out.early_states[verdict.state] = self.out.early_states.get(verdict.state, 0) + 1
        view.gpu_check = EarlyMemo(last, verdict, view.last_step_at)
        return verdict.confirmed

    def _verdict(self, view: JobView, at: float) -> GpuVerdict | None:
        """The job's TSDB asked and judged at `at`; None (and no more queries) when it cannot be."""
        try:
            if self.tsdb is None:
                self.tsdb = ReplayTsdb(self.pdir, self.settings, self.label)
            series = self.tsdb.query_matrix(gpu_query(self.interval), at)
        except (AccessError, PromError, OSError) as exc:
            self.failed = True
            self.out.early_note = f"early page not replayed: {exc}"
            return None
        self.out.early_source = JOB_TSDB
        return judge(
            series,
            at=at,
            nodes=_nodes(view),
            profile=profile_for(series, self.settings),
            thresholds=self.settings.thresholds,
            scrape_interval_s=self.interval,
        )

    def close(self) -> None:
        if self.tsdb is not None:
            self.tsdb.close()
            self.tsdb = None


def _nodes(view: JobView) -> list[str]:
    """The job's nodes as its log header names them."""
    main = view.main
    if main is None or not main.header.get("JOB_NODELIST"):
        return []
    return expand_hostlist(main.header["JOB_NODELIST"])


class _SiteEarlyReplay(_EarlyReplay):
    """The early page's queries answered by a site Prometheus at the virtual time (module docstring)."""

    def __init__(self, ref: JobRef, cfg: Config, url: str, out: JobReplay, hang: HangDetector) -> None:
        site_cfg = site_config(_with_site_url(cfg, url))
        assert site_cfg is not None
        super().__init__(Path(url), cfg.tsdb, url, out, hang)
        self.interval = site_cfg.scrape_interval_s
        self.cfg = cfg
        self.job_id = ref.job_id or ref.name or ""
        self._loop = asyncio.new_event_loop()
        self.site = SitePrometheus(site_cfg, cfg.tsdb)
        self.placement: JobPlacement | None = None

    def _verdict(self, view: JobView, at: float) -> GpuVerdict | None:
        if self.placement is None:
            main = view.main
            nodelist = main.header.get("JOB_NODELIST", "") if main is not None else ""
            try:
                self.placement = placement_for(self.cfg, self.job_id, nodelist)
            except ValueError as exc:
                self.placement = JobPlacement(self.job_id, ())
                self.out.early_note = f"site Prometheus: the log's node list is unreadable: {exc}"
        if not self.placement.nodes:
            self.failed = True
            self.out.early_note = self.out.early_note or "site Prometheus: the log names no node of the job"
            return None
        self.out.early_source = f"site Prometheus {self.site.label}"
        return self._loop.run_until_complete(self.site.early_verdict(self.placement, now=at))

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self.site.close())
        finally:
            self._loop.close()


def _with_site_url(cfg: Config, url: str) -> Config:
    """`[site_prometheus]` as configured (map, rewrite, interval, auth), at `url`, enabled."""
    site = dataclasses.replace(cfg.site_prometheus, enabled=True, url=url)
    return dataclasses.replace(cfg, site_prometheus=site)


def _tick(
    view: JobView,
    detectors: Sequence[Detector],
    book: IncidentBook,
    now: float,
    out: JobReplay,
    t0: float | None,
) -> None:
    judged = Judged()
    run_detectors(detectors, view, now, judged)
    findings = judged.kept(book)
    by_kind: dict[str, Finding] = {f.kind: f for f in findings}
    base = t0 if t0 is not None else view.first_seen
    for n in book.observe_all(findings, now):
        if n.event != "open":
            continue
        f = by_kind.get(n.kind)
        inc = book.get(n.job_id, n.kind)
        alert = Alert(
            n.kind,
            "open",
            inc.first_step if inc else None,
            now - base,
            _alert_class(f),
            f.summary if f else n.title,
        )
        alert.at = now
        alert.gpu_confirmed = f is not None and f.gpu_confirmed
        hang = next((d for d in detectors if isinstance(d, HangDetector)), None)
        memo = hang.budget_state(view.key) if hang is not None else None
        if n.kind == IncidentKind.HANG and memo is not None:
            alert.budget_s, alert.phase = memo.budget.seconds, memo.budget.phase
        out.alerts.append(alert)
    for r in judged.reports:
        final = view.final
        out.alerts.append(
            Alert(
                r.kind,
                "report",
                view.last_step,
                now - base,
                (final.primary or final.status) if final is not None else None,
                r.title,
                at=now,
            )
        )


def _alert_class(f: Finding | None) -> str | None:
    if f is None:
        return None
    if f.kind == IncidentKind.FAILURE:
        return f.failure_class or f.kind
    if f.kind == IncidentKind.TGS_DEGRADATION:
        return FailureClass.TGS_DEGRADATION
    return f.kind


def site_url_problem(cfg: Config, url: str) -> str | None:
    """Why `url` cannot be the replay's site Prometheus, or None. The URL is never echoed (a
    pasted one may carry credentials); its secret, when `[site_prometheus] auth` names one, is
    read now."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a valid URL"
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        return "must be an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (use [site_prometheus] secret_file)"
    try:
        site_config(_with_site_url(cfg, url))
    except ConfigError as exc:
        return "; ".join(exc.errors)
    return None


def refs_for(paths: Sequence[str]) -> list[JobRef]:
    refs: list[JobRef] = []
    for p in paths:
        path = Path(p)
        # is_symlink first: a `log` link to a name longer than the filesystem allows cannot be
        # stat()ed (ENAMETOOLONG); resolve() reports such a job.
        if path.is_dir() and not (path / "log").is_symlink() and not (path / "log").exists():
            refs += [r for r in list_jobs(path) if r.log is not None]
            continue
        refs.append(resolve(p, []))
    return refs


def main(args: argparse.Namespace) -> int:
    import structlog

    if not structlog.is_configured():
        # The replay prints its report (or JSON) to stdout; the early page's Prometheus logs go to
        # stderr -- whatever sys.stderr is when a line is logged (a caller may swap it, as pytest does).
        structlog.configure(logger_factory=lambda *_args: structlog.PrintLogger(sys.stderr))
    cfg = load_for_command(args.config, "backtest")
    if cfg is None:
        return 2
    tick = args.tick or cfg.daemon.tick_seconds
    workers = getattr(args, "workers", 1)
    if workers < 1:
        print("jobdiagd backtest: --workers must be at least 1", file=sys.stderr)
        return 2
    set_default_workers(workers)  # the job-end report's read of big logs, as in `jobdiagd triage`
    site_url: str | None = getattr(args, "site_prometheus", None)
    if site_url:
        problem = site_url_problem(cfg, site_url)
        if problem is not None:
            print(f"jobdiagd backtest: --site-prometheus: {problem}", file=sys.stderr)
            return 2
    try:
        refs = refs_for(args.paths)
    except ResolveError as exc:
        print(f"jobdiagd backtest: {exc}", file=sys.stderr)
        return 2
    now = clock.wall()
    results: list[JobReplay] = []
    failed = 0
    for ref in refs:
        try:
            results.append(replay(ref, cfg, tick=tick, ref_time=now, workers=workers, site_url=site_url))
        except Exception as exc:  # one job's bad log must not lose the other jobs' replays
            failed += 1
            who = ref.job_id or ref.name or str(ref.log)
            print(f"jobdiagd backtest: job {who}: {type(exc).__name__}: {exc}", file=sys.stderr)
    if args.json:
        print(jsonsafe.dumps({"jobs": [r.to_dict() for r in results]}, indent=1))
    else:
        print_report(results)
    return 1 if failed else 0


def print_report(results: Sequence[JobReplay]) -> None:
    for r in results:
        print(
            f"job {r.job}  ({r.log})  final: {r.final_status}/{r.final_primary or '-'}  last step {r.last_step}"
        )
        if not r.alerts:
            print("    no alerts")
        for a in r.alerts:
            step = f"step {a.at_step}" if a.at_step is not None else "no step"
            print(f"    +{a.at_s:9.1f}s  {step:<10} {a.event.upper():<7} {a.kind:<16} [{a.cls}] {a.summary}")
        if r.early_queries:
            states = ", ".join(f"{n} {s}" for s, n in sorted(r.early_states.items()))
            source = "TSDB" if r.early_source == JOB_TSDB else str(r.early_source)
            print(f"    early page: {r.early_queries} {source} queries ({states})")
        elif r.early_note:
            print(f"    {r.early_note}")
        if r.undated_lines:
            print(
                f"    {r.undated_lines} undated line(s) after the last dated line of their file: taken in at the "
                "job's end (their time is unknown)"
            )
