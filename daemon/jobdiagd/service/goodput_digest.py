"""The weekly goodput digest, sent by the daemon (`[goodput.digest]`, off by default; rules GP-13, GP-14).

Once a week, at `weekday`/`hour` local time, the daemon accounts the archive (`jobdiagd
goodput` over the digest's outputs roots, else the daemon's own: `service.goodput_cmd.
archive_ledger`), makes the digest of the 7 days before now (`goodput.digest.weekly_digest`:
goodput, the top causes of lost GPU-hours, the suspect nodes, the slowest detections, the
checkpoint advice) and queues it as one report of kind `goodput-digest` carrying its picture's
inputs (`service.plots_bridge.goodput_payload`): the chat transports post the text, then the
picture rendered by the plot renderer's worker process at send time (Telegram: a message, or a
summary and a .md document when long, then a photo; Slack: blocks, then the file). A report
never rings (rule CHAT-3). Its chat or channel is a route's, as for any notification.

Decisions (rule GP-13):
- **Schedule.** The digest's instant of a week is `weekday` at `hour`:00 in `timezone` (empty:
  `[chat] timezone`, else the host's). It is due from that instant for a day (`GRACE_S`): a
  daemon that was down, or started, within the day sends it when it is up; one that comes later
  skips that week (a digest days late is noise; the next one comes).
- **Once per week, across restarts.** The ISO week of the instant sent is kept in the state
  store (`meta`), written after the report is queued; the report's id is the week's, so a crash
  between the two queues it again as the same notification, which the outbox ignores.
- **Off the event loop.** Accounting an archive parses every log not cached yet (a first run
  over 10,000 jobs: minutes of CPU; warm: ~2 s), so it runs in a spawned worker process at a
  lower CPU priority (`nice` +10: the login node is shared), killed past `timeout_seconds`; what
  it read is kept in the cache (committed as it goes), and it is tried again every `RETRY_S`
  while the day lasts. The daemon hands it the hang pages from its incident store (rule GP-2's
  detection times), so the worker never opens the live store.
- The worker also refreshes the fleet figures the job-end advice reads (as `jobdiagd goodput
  --config` does): the weekly digest keeps that advice current without an operator's run.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.pool
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, tzinfo
from pathlib import Path
from typing import Any

from jobdiagd import clock
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import WEEKDAYS, Config, DigestConfig
from jobdiagd.detectors.hang import KIND as HANG_KIND
from jobdiagd.goodput.advice import advise_chains
from jobdiagd.goodput.cache import FactsCache
from jobdiagd.goodput.chains import DEFAULT_WINDOW_S
from jobdiagd.goodput.collect import job_refs
from jobdiagd.goodput.digest import weekly_digest
from jobdiagd.logsetup import get_logger
from jobdiagd.model.alerts import Incident
from jobdiagd.quiet_hours import zone
from jobdiagd.service.goodput_cmd import archive_ledger, save_fleet
from jobdiagd.service.plots_bridge import goodput_payload

DIGEST_KIND = "goodput-digest"  # the notification kind a route names to choose the digest's chat
META_KEY = "goodput_digest_week"  # the ISO week of the last digest queued
WEEK_S = 7 * 86400.0
GRACE_S = 86400.0
RETRY_S = 3600.0
CHECK_S = 900.0  # the longest sleep: a reload (enabled, another hour) is seen within it
NICE = 10

# The scheduler's clock: the real one (tests inject another).
wall: Callable[[], float] = clock.wall


# -- the schedule (pure) ------------------------------------------------------------------------


def _local_date(t: float, tz: tzinfo | None) -> date:
    return (datetime.fromtimestamp(t, tz=tz) if tz else datetime.fromtimestamp(t).astimezone()).date()


def slot_in_week(t: float, tz: tzinfo | None, weekday: int, hour: int) -> float:
    """The digest's instant in the local week (Monday to Sunday) holding `t`."""
    day = _local_date(t, tz)
    day = day - timedelta(days=day.weekday()) + timedelta(days=weekday)
    return datetime.combine(day, time(hour), tzinfo=tz).timestamp()  # tz None: the host's


def week_of(slot: float, tz: tzinfo | None) -> str:
    """The ISO week of an instant, local time: "2026-W36"."""
    return _local_date(slot, tz).strftime("%G-W%V")


def due(
    now: float, tz: tzinfo | None, weekday: int, hour: int, last_week: str | None, grace_s: float = GRACE_S
) -> tuple[str, float] | None:
    """(week, its instant) when a digest is due now: the week's instant has passed, less than
    `grace_s` ago, and no digest of that week (or a later one) was sent."""
    slot = slot_in_week(now, tz, weekday, hour)
    if slot > now:
        slot = slot_in_week(now - WEEK_S, tz, weekday, hour)
    week = week_of(slot, tz)
    if (last_week is not None and week <= last_week) or now - slot > grace_s:
        return None
    return week, slot


def next_slot(now: float, tz: tzinfo | None, weekday: int, hour: int) -> float:
    """The first digest instant after `now`."""
    slot = slot_in_week(now, tz, weekday, hour)
    return slot if slot > now else slot_in_week(now + WEEK_S, tz, weekday, hour)


def schedule_of(cfg: Config) -> tuple[tzinfo | None, int, int]:
    d = cfg.goodput.digest
    return zone(d.timezone or cfg.chat.timezone), WEEKDAYS.index(d.weekday), d.hour


# -- the digest (in the worker process) ---------------------------------------------------------


@dataclass(frozen=True)
class DigestRequest:
    cfg: Config
    roots: tuple[str, ...]
    cache_dir: str
    now: float
    pages: dict[str, list[float]]  # job id -> when its hang incidents opened (the daemon's store)


@dataclass(frozen=True)
class DigestResult:
    title: str
    markdown: str
    plot: dict[str, Any]  # the picture's inputs (`plots_bridge.goodput_payload`)
    jobs: int
    cached: int
    notes: tuple[str, ...]


def make_digest(req: DigestRequest) -> DigestResult:
    """The digest of the 7 days before `req.now` over the archive (runs in the worker process)."""
    d = req.cfg.goodput.digest
    refs, errors = job_refs(req.roots)
    archive = archive_ledger(
        refs,
        req.cfg,
        FactsCache(Path(req.cache_dir)),
        now=req.now,
        accounting=d.accounting,
        replay_ok=d.replay,
        pages=req.pages,
        window_s=DEFAULT_WINDOW_S,
    )
    digest = weekly_digest(archive.chains, now=req.now, advice=advise_chains(archive.chains))
    notes = [*errors, *archive.notes, save_fleet(req.cfg, archive.chains, req.now)]
    return DigestResult(
        digest.title,
        digest.markdown,
        goodput_payload(digest.chart),
        archive.jobs,
        archive.cached,
        tuple(notes),
    )


def hang_pages(incidents: Iterable[Incident]) -> dict[str, list[float]]:
    """Job id -> when each of its hang incidents opened."""
    out: dict[str, list[float]] = {}
    for inc in incidents:
        if inc.kind == HANG_KIND:
            out.setdefault(inc.job_id, []).append(inc.opened_at)
    return out


def _lower_priority() -> None:
    os.nice(NICE)


async def in_worker_process(
    fn: Callable[[DigestRequest], DigestResult], req: DigestRequest, timeout_s: float
) -> DigestResult:
    """`fn(req)` in a spawned process (a fork of a daemon with threads is unsafe) at a lower
    priority; killed past `timeout_s` (TimeoutError) or when the caller is cancelled."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[DigestResult] = loop.create_future()

    def settle(value: DigestResult | None, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            assert value is not None
            fut.set_result(value)

    pool = multiprocessing.get_context("spawn").Pool(1, initializer=_lower_priority)
    try:
        pool.apply_async(
            fn,
            (req,),
            callback=lambda v: loop.call_soon_threadsafe(settle, v, None),
            error_callback=lambda e: loop.call_soon_threadsafe(settle, None, e),
        )
        async with asyncio.timeout(timeout_s):
            return await fut
    finally:
        await asyncio.shield(asyncio.to_thread(_terminate, pool))


def _terminate(pool: multiprocessing.pool.Pool) -> None:
    pool.terminate()
    pool.join()


# -- in the daemon ------------------------------------------------------------------------------

Compute = Callable[[Callable[[DigestRequest], DigestResult], DigestRequest, float], Awaitable[DigestResult]]


def digest_body(title: str, markdown: str) -> str:
    """The digest's Markdown without its own title line (the message's title says it)."""
    return markdown.removeprefix(f"**{title}**\n").lstrip("\n")


class DigestScheduler:
    """The daemon's task: sleeps until a digest is due, has it made, queues it (module docstring)."""

    def __init__(
        self,
        cfg: Callable[[], Config],
        pipeline: AlertPipeline,
        sleep: Callable[[float], Awaitable[bool]],
        *,
        watched_roots: Iterable[Path] = (),
        compute: Compute = in_worker_process,
    ) -> None:
        self.cfg = cfg
        self.pipeline = pipeline
        self.sleep = sleep
        self.watched_roots = tuple(watched_roots)
        self.compute = compute
        self._sent: str | None = None  # the last week queued by this process (the store may refuse the mark)
        self._failed: tuple[str, float] | None = None  # (week, when) of the last failure
        self._log = get_logger(component="goodput_digest")

    def last_week(self) -> str | None:
        try:
            stored = self.pipeline.store.meta(META_KEY)
        except Exception as exc:  # the store cannot be read now: what this process sent stands
            self._log.warning("goodput_digest_state_unreadable", error=f"{type(exc).__name__}: {exc}")
            stored = None
        weeks = [w for w in (stored, self._sent) if w is not None]
        return max(weeks) if weeks else None

    async def run(self) -> None:
        while True:
            cfg = self.cfg()
            wait = CHECK_S
            if cfg.goodput.digest.enabled:
                wait = await self._step(cfg, wall())
            if await self.sleep(wait):
                return

    async def _step(self, cfg: Config, now: float) -> float:
        """Send a digest if one is due; how long to sleep before looking again."""
        tz, weekday, hour = schedule_of(cfg)
        got = due(now, tz, weekday, hour, self.last_week())
        if got is None:
            return min(CHECK_S, max(1.0, next_slot(now, tz, weekday, hour) - now))
        week, _ = got
        if self._failed is not None and self._failed[0] == week and now - self._failed[1] < RETRY_S:
            return min(CHECK_S, RETRY_S - (now - self._failed[1]))
        try:
            await self.send(cfg, week, now)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed = (week, now)
            self._log.error(
                "goodput_digest_failed", week=week, error=f"{type(exc).__name__}: {exc}", retry_in_s=RETRY_S
            )
            return min(CHECK_S, RETRY_S)
        return 1.0

    def request(self, cfg: Config, now: float) -> DigestRequest:
        d: DigestConfig = cfg.goodput.digest
        roots = d.outputs_roots or self.watched_roots or cfg.slurm.outputs_roots
        cache = d.cache_dir if d.cache_dir is not None else cfg.daemon.state_dir / "goodput-cache"
        pages = hang_pages(self.pipeline.store.load_incidents(open_only=False))
        return DigestRequest(cfg, tuple(str(r) for r in roots), str(cache), now, pages)

    async def send(self, cfg: Config, week: str, now: float) -> None:
        req = self.request(cfg, now)
        if not req.roots:
            raise ValueError("no outputs roots: set [goodput.digest] outputs_roots or [slurm] outputs_roots")
        self._log.info("goodput_digest_computing", week=week, roots=list(req.roots))
        started = clock.monotonic()
        out = await self.compute(make_digest, req, cfg.goodput.digest.timeout_seconds)
        self.pipeline.report(
            "", DIGEST_KIND, week, out.title, digest_body(out.title, out.markdown), now, plot=out.plot
        )
        self._sent = week
        try:
            self.pipeline.store.set_meta(META_KEY, week)
        except Exception as exc:  # the report is queued (or held); its id keeps a repeat out
            self._log.warning("goodput_digest_mark_failed", week=week, error=f"{type(exc).__name__}: {exc}")
        self._failed = None
        self._log.info(
            "goodput_digest_queued",
            week=week,
            jobs=out.jobs,
            cached=out.cached,
            seconds=round(clock.monotonic() - started, 1),
            notes=list(out.notes),
        )
