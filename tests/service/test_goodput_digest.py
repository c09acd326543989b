"""The weekly goodput digest in the daemon: its schedule, its content over an archive, once a week
across restarts, and its worker process."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time as _time
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import WEEKDAYS, Config, loads
from jobdiagd.goodput.fleet import FLEET_NAME, read_fleet
from jobdiagd.service import goodput_digest as gd
from jobdiagd.service.plots_bridge import GOODPUT, goodput_from_payload
from jobdiagd_sim.archive import build_archive

UTC_TZ = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")


def at(text: str, tz: ZoneInfo = UTC_TZ) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=tz).timestamp()


# -- the schedule -----------------------------------------------------------------------------------


def test_a_digest_is_due_from_its_hour_for_a_day_once_a_week() -> None:
    mon, nine = WEEKDAYS.index("monday"), 9
    # 2026-08-31 is a Monday (ISO week 36).
    assert (
        gd.due(at("2026-08-31T08:59:59"), UTC_TZ, mon, nine, None) is None
    )  # not yet: last week's is a week old
    assert gd.due(at("2026-08-31T09:00:00"), UTC_TZ, mon, nine, None) == (
        "2026-W36",
        at("2026-08-31T09:00:00"),
    )
    assert gd.due(at("2026-09-01T08:59:00"), UTC_TZ, mon, nine, None) == (
        "2026-W36",
        at("2026-08-31T09:00:00"),
    )
    assert gd.due(at("2026-09-01T09:00:01"), UTC_TZ, mon, nine, None) is None  # a day late: skipped
    assert gd.due(at("2026-08-31T12:00:00"), UTC_TZ, mon, nine, "2026-W36") is None  # sent
    assert gd.due(at("2026-08-31T12:00:00"), UTC_TZ, mon, nine, "2026-W37") is None  # a later one sent
    assert gd.due(at("2026-08-31T12:00:00"), UTC_TZ, mon, nine, "2026-W35")[0] == "2026-W36"  # type: ignore[index]
    assert gd.next_slot(at("2026-08-31T09:00:00"), UTC_TZ, mon, nine) == at("2026-09-07T09:00:00")
    assert gd.next_slot(at("2026-09-03T00:00:00"), UTC_TZ, mon, nine) == at("2026-09-07T09:00:00")
    # Sunday is the week's last day: its digest belongs to the week that began the Monday before.
    sun = WEEKDAYS.index("sunday")
    assert gd.due(at("2026-09-06T18:30:00"), UTC_TZ, sun, 18, None) == ("2026-W36", at("2026-09-06T18:00:00"))
    # Across the new year the ISO year is the week's: 2027-01-01 is in 2026-W53.
    fri = WEEKDAYS.index("friday")
    assert gd.due(at("2027-01-01T10:00:00"), UTC_TZ, fri, 9, None) == ("2026-W53", at("2027-01-01T09:00:00"))


def test_the_hour_is_local_time_of_the_zone_across_a_clock_change() -> None:
    mon = WEEKDAYS.index("monday")
    # Berlin is UTC+2 in summer, UTC+1 from 2026-10-25: 09:00 local is 07:00, then 08:00 UTC.
    assert gd.next_slot(at("2026-10-20T00:00:00"), BERLIN, mon, 9) == at("2026-10-26T08:00:00")
    assert gd.next_slot(at("2026-10-13T00:00:00"), BERLIN, mon, 9) == at("2026-10-19T07:00:00")
    assert gd.due(at("2026-10-26T08:30:00"), BERLIN, mon, 9, "2026-W43") == (
        "2026-W44",
        at("2026-10-26T08:00:00"),
    )


def test_the_schedule_reads_the_digest_zone_else_the_chats() -> None:
    base = "[notifiers.console]\nenabled = true\n"
    cfg = loads(
        base + '[chat]\ntimezone = "Europe/Berlin"\n[goodput.digest]\nweekday = "friday"\nhour = 17\n'
    )
    assert gd.schedule_of(cfg) == (BERLIN, 4, 17)
    cfg = loads(base + '[chat]\ntimezone = "Europe/Berlin"\n[goodput.digest]\ntimezone = "UTC"\n')
    assert gd.schedule_of(cfg) == (UTC_TZ, 0, 9)


# -- the content ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """A tiny archive and a `now` an hour after its last run ended (every run in the week)."""
    root = tmp_path_factory.mktemp("digest-archive") / "outputs"
    chains = build_archive(root, chains=4, seed=3, small=True, days=2)
    return root, max(r.end for c in chains for r in c.runs) + 3600.0


def make_cfg(tmp: Path, roots: Path, now: float, *, enabled: bool = True) -> Config:
    day = datetime.fromtimestamp(now, UTC)
    return loads(
        f"""
[daemon]
state_dir = "{tmp}/state"
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
[goodput.digest]
enabled = {str(enabled).lower()}
weekday = "{WEEKDAYS[day.weekday()]}"
hour = {day.hour}
timezone = "UTC"
outputs_roots = ["{roots}"]
accounting = false
"""
    )


def test_the_digest_of_an_archive(archive: tuple[Path, float], tmp_path: Path) -> None:
    root, now = archive
    cfg = make_cfg(tmp_path, root, now)
    out = gd.make_digest(gd.DigestRequest(cfg, (str(root),), str(tmp_path / "cache"), now, {}))
    day = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")
    assert out.title.startswith(f"Goodput, week to {day}: ") and "GPU-hours" in out.title
    for section in ("Where the lost GPU-hours went", "Suspect nodes", "Slowest hang detections"):
        assert f"**{section}" in out.markdown
    assert out.jobs == len(list(root.glob("*.log"))) and out.cached == 0
    chart = goodput_from_payload(json.loads(json.dumps(out.plot)))
    assert out.plot["type"] == GOODPUT and chart.by == "user" and chart.groups
    assert set(chart.groups) <= {"alice", "bob", "carol", "dave"}
    body = gd.digest_body(out.title, out.markdown)
    assert not body.startswith("**Goodput") and body.startswith("**Where the lost GPU-hours went**")
    fleet = read_fleet(cfg.daemon.state_dir / FLEET_NAME)  # the job-end advice's figures refreshed
    assert fleet is not None and fleet.made_at == now
    again = gd.make_digest(gd.DigestRequest(cfg, (str(root),), str(tmp_path / "cache"), now, {}))
    assert again.cached == out.jobs and again.markdown == out.markdown


# -- the scheduler ----------------------------------------------------------------------------------


class Worker:
    """Stands in for the worker process: runs `make_digest` in this process, counting the calls."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    async def __call__(
        self, fn: gd.Callable[[gd.DigestRequest], gd.DigestResult], req: gd.DigestRequest, timeout_s: float
    ) -> gd.DigestResult:
        self.calls += 1
        if self.fail:
            raise TimeoutError("took too long")
        return fn(req)


def reports(pipeline: AlertPipeline) -> list[dict[str, object]]:
    rows = pipeline.store.conn.execute("SELECT data FROM outbox ORDER BY rowid").fetchall()
    return [json.loads(r[0]) for r in rows if json.loads(r[0])["kind"] == gd.DIGEST_KIND]


async def never(seconds: float) -> bool:
    raise AssertionError("the test drives the steps itself")


async def test_one_digest_a_week_across_restarts(archive: tuple[Path, float], tmp_path: Path) -> None:
    root, now = archive
    cfg = make_cfg(tmp_path, root, now)
    pipeline = AlertPipeline.open(cfg.daemon.state_dir, cfg.incidents, ["jsonl"])
    try:
        worker = Worker()
        s = gd.DigestScheduler(lambda: cfg, pipeline, never, compute=worker)
        assert await s._step(cfg, now) == 1.0
        (n,) = reports(pipeline)
        week = datetime.fromtimestamp(now, UTC).strftime("%G-W%V")
        assert n["id"] == f"report::{gd.DIGEST_KIND}:{week}" and n["event"] == "report"
        assert (
            n["severity"] == "info" and n["job_id"] == "" and str(n["title"]).startswith("Goodput, week to")
        )
        assert isinstance(n["plot"], dict) and n["plot"]["type"] == GOODPUT
        assert pipeline.store.meta(gd.META_KEY) == week
        wait = await s._step(cfg, now + 60)  # sent: nothing until next week's hour
        assert worker.calls == 1 and 0 < wait <= gd.CHECK_S
        # A restart: a new scheduler reads the week from the store.
        again = gd.DigestScheduler(lambda: cfg, pipeline, never, compute=worker)
        await again._step(cfg, now + 120)
        assert worker.calls == 1 and len(reports(pipeline)) == 1
        # Next week it is due again.
        await again._step(cfg, now + gd.WEEK_S)
        assert worker.calls == 2 and len(reports(pipeline)) == 2
    finally:
        pipeline.close()


async def test_a_failed_digest_is_tried_again_after_an_hour_within_its_day(
    archive: tuple[Path, float], tmp_path: Path
) -> None:
    root, now = archive
    cfg = make_cfg(tmp_path, root, now)
    pipeline = AlertPipeline.open(cfg.daemon.state_dir, cfg.incidents, ["jsonl"])
    try:
        worker = Worker(fail=True)
        s = gd.DigestScheduler(lambda: cfg, pipeline, never, compute=worker)
        assert await s._step(cfg, now) == gd.CHECK_S
        await s._step(cfg, now + gd.CHECK_S)
        assert worker.calls == 1  # within the hour: not yet
        worker.fail = False
        await s._step(cfg, now + gd.RETRY_S)
        assert worker.calls == 2 and len(reports(pipeline)) == 1
    finally:
        pipeline.close()


async def test_a_disabled_digest_sends_nothing(tmp_path: Path) -> None:
    now = at("2026-08-31T09:30:00")
    cfg = make_cfg(tmp_path, tmp_path / "none", now, enabled=False)
    pipeline = AlertPipeline.open(cfg.daemon.state_dir, cfg.incidents, ["jsonl"])
    slept: list[float] = []

    async def sleep(seconds: float) -> bool:
        slept.append(seconds)
        return True  # stop after the first look

    try:
        worker = Worker()
        await gd.DigestScheduler(lambda: cfg, pipeline, sleep, compute=worker).run()
        assert slept == [gd.CHECK_S] and worker.calls == 0 and reports(pipeline) == []
    finally:
        pipeline.close()


async def test_the_archive_is_the_digests_roots_else_the_daemons_own(tmp_path: Path) -> None:
    now = at("2026-08-31T09:30:00")
    cfg = make_cfg(tmp_path, tmp_path / "archive", now)
    pipeline = AlertPipeline.open(cfg.daemon.state_dir, cfg.incidents, ["jsonl"])
    try:
        worker = Worker()
        watched = gd.DigestScheduler(
            lambda: cfg, pipeline, never, watched_roots=[tmp_path / "w"], compute=worker
        )
        req = watched.request(cfg, now)
        assert req.roots == (str(tmp_path / "archive"),) and req.cache_dir == str(
            cfg.daemon.state_dir / "goodput-cache"
        )
        digest = dataclasses.replace(cfg.goodput.digest, outputs_roots=())
        own = dataclasses.replace(cfg, goodput=dataclasses.replace(cfg.goodput, digest=digest))
        assert watched.request(own, now).roots == (str(tmp_path / "w"),)  # `jobdiagd run --watch`
        slurm = dataclasses.replace(
            own, slurm=dataclasses.replace(own.slurm, outputs_roots=(tmp_path / "s",))
        )
        bare = gd.DigestScheduler(lambda: slurm, pipeline, never, compute=worker)
        assert bare.request(slurm, now).roots == (str(tmp_path / "s"),)
        # No archive at all: a failure logged and retried, nothing sent.
        none = gd.DigestScheduler(lambda: own, pipeline, never, compute=worker)
        assert await none._step(own, now) == gd.CHECK_S
        assert worker.calls == 0 and reports(pipeline) == []
    finally:
        pipeline.close()


# -- the worker process -------------------------------------------------------------------------------


def _sleepy(req: gd.DigestRequest) -> gd.DigestResult:
    """Runs in the spawned worker: reports its pid and niceness, then never finishes."""
    Path(req.cache_dir).write_text(f"{os.getpid()} {os.nice(0)}")
    _time.sleep(3600)
    raise AssertionError("unreachable")


async def test_the_worker_runs_at_a_lower_priority_and_is_killed_past_its_timeout(
    tmp_path: Path, archive: tuple[Path, float]
) -> None:
    root, now = archive
    cfg = make_cfg(tmp_path, root, now)
    marker = tmp_path / "worker"
    req = gd.DigestRequest(cfg, (), str(marker), now, {})
    task = asyncio.ensure_future(gd.in_worker_process(_sleepy, req, 120.0))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while not marker.exists() or not marker.read_text():
        assert loop.time() < deadline, "the worker did not start"
        await asyncio.sleep(0.05)
    pid, nice = (int(x) for x in marker.read_text().split())
    assert nice == os.nice(0) + gd.NICE and pid != os.getpid()
    task.cancel()  # the daemon stopping: the worker goes with it
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(TimeoutError):
        await gd.in_worker_process(_sleepy, req, 0.5)
