"""The engine's tick on real files and a real alert store, on a hand-driven clock (no sleeping)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from jobdiagd_sim import lines as L
from tests.helpers.engine import T0, Daemon, events, outbox
from tests.helpers.joblog import JobLog


async def test_hang_pages_once_with_triage_and_resolves_when_steps_resume(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = JobLog(outputs, "7001")
    d = Daemon(state, outputs)
    t = T0
    for k in range(30):
        job.step(k, seconds=10.0)
        t += 10.0
        await d.tick(t)
    assert events(state) == []
    assert d.engine.snapshot_jobs(t)[0]["last_step"] == 29
    # Stalled: chatter keeps the file growing (mtime fresh) but no step arrives.
    for _i in range(20):
        job.task(0, "node001:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read")
        t += 15.0
        await d.tick(t)
    ev = events(state)
    assert ev == [("open", "hang")]
    body = outbox(state)[0]["body"]
    assert "step 29" in body and "**triage**" in body and "**next step 1**" in body
    snap = d.engine.snapshot_jobs(t)[0]
    assert snap["open_incidents"] == ["hang"] and snap["expected_step"] > 29
    job.step(30, seconds=300.0)
    t += 15.0
    await d.tick(t)
    assert events(state) == [("open", "hang"), ("resolve", "hang")]
    assert "steps resumed at step 30" in outbox(state)[1]["body"]
    d.close()


async def test_restart_during_an_open_incident_neither_duplicates_nor_closes_it(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = JobLog(outputs, "7002")
    d = Daemon(state, outputs)
    t = T0
    for k in range(30):
        job.step(k, seconds=10.0)
        t += 10.0
        await d.tick(t)
    t += 200.0
    await d.tick(t)
    assert events(state) == [("open", "hang")]
    d.close()  # the process dies here (no cleanup beyond what SQLite already committed)

    d2 = Daemon(state, outputs)  # restart: re-reads the log, restores the arrival time of step 29
    for _ in range(4):
        t += 15.0
        await d2.tick(t)
    assert events(state) == [("open", "hang")]  # no duplicate, not resolved
    assert [i.kind for i in d2.pipeline.book.open_incidents()] == ["hang"]
    assert d2.engine.jobs["7002"].view.last_step_at is not None
    assert d2.engine.jobs["7002"].view.last_step_at < t - 200  # the stall clock survived
    job.step(30, seconds=300.0)
    t += 15.0
    await d2.tick(t)
    assert events(state) == [("open", "hang"), ("resolve", "hang")]
    d2.close()


async def test_failure_signature_pages_at_once_and_job_end_sends_the_report(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = JobLog(outputs, "7003")
    d = Daemon(state, outputs)
    t = T0
    for k in range(10):
        job.step(k)
        t += 2.0
        await d.tick(t)
    job.task(1, "Failed call to cuInit: UNKNOWN ERROR (303)")  # harmless table
    t += 2.0
    await d.tick(t)
    assert events(state) == []
    job.task(1, "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=7003.0.")
    job.task(0, "node001:1:2 [0] NCCL WARN Timeout waiting for proxy response")
    t += 2.0
    await d.tick(t)
    assert events(state) == [("open", "failure")]
    n = outbox(state)[0]
    assert "oom-host" in n["title"] + n["body"] and "nccl-timeout" in n["body"]
    job.write(L.node_exit("node002", 137))
    job.summary(1, "Training FAILED (exit=137)")
    t += 2.0
    await d.tick(t)
    # Causal order: the incident's resolve ("job ended") is queued before the job's end report.
    assert events(state) == [("open", "failure"), ("resolve", "failure"), ("report", "job-end")]
    report = outbox(state)[2]
    assert "## Job triage" in report["body"] and "oom-host" in report["title"]
    assert d.engine.jobs == {}
    d.close()


async def test_unreadable_log_gives_one_blind_notice(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = JobLog(outputs, "7004")
    d = Daemon(state, outputs)
    t = T0
    for k in range(8):
        job.step(k)
        t += 2.0
        await d.tick(t)
    os.unlink(job.path)  # deleted while watched
    for _ in range(30):
        t += 15.0
        await d.tick(t)
    ev = events(state)
    assert ev == [("notice", "notice")]
    assert "monitoring blind" in outbox(state)[0]["title"]
    assert d.engine.snapshot_jobs(t)[0]["blind"]
    d.close()


async def test_a_blind_job_whose_directory_disappears_gets_its_follow_up(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    blind, quiet = JobLog(outputs, "7014"), JobLog(outputs, "7015")
    d = Daemon(state, outputs)
    t = T0
    for k in range(30):
        blind.step(k, seconds=10.0)
        quiet.step(k, seconds=10.0)
        t += 10.0
        await d.tick(t)
    t += 200.0
    await d.tick(t)  # both hang: two pages
    assert events(state) == [("open", "hang"), ("open", "hang")]
    os.unlink(blind.path)  # 7014's log deleted: blind
    t += 15.0
    await d.tick(t)
    assert [n["title"] for n in outbox(state)[2:]] == ["monitoring blind: job 7014"]
    shutil.rmtree(blind.dir)  # then its directory
    shutil.rmtree(quiet.dir)  # 7015's directory goes while its log is still readable
    t += 15.0
    await d.tick(t)
    new = outbox(state)[3:]
    ended = [n for n in new if n["event"] == "notice"]
    assert [n["title"] for n in ended] == ["monitoring ended: job 7014"]  # 7015 was never blind
    assert f"Its directory `{blind.dir}` is gone: the job is no longer watched" in ended[0]["body"]
    assert sorted((n["event"], n["job_id"]) for n in new if n["event"] != "notice") == [
        ("resolve", "7014"),
        ("resolve", "7015"),
    ]
    assert all("job directory gone" in n["body"] for n in new if n["event"] == "resolve")
    assert d.engine.jobs == {} and d.engine.snapshot_jobs(t) == []
    for _ in range(4):  # nothing more: neither watched again nor told again
        t += 15.0
        await d.tick(t)
    assert len(outbox(state)) == 3 + len(new)
    blind.dir.mkdir()  # a directory made again under the name is a job again
    (blind.dir / "log").symlink_to(f"../{blind.path.name}")
    blind.step(0)
    t += 15.0
    await d.tick(t)
    assert list(d.engine.jobs) == ["7014"]
    d.close()


async def test_rename_with_repointed_link_keeps_reading_where_it_was(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = JobLog(outputs, "7005")
    d = Daemon(state, outputs)
    t = T0
    for k in range(10):
        job.step(k)
        t += 2.0
        await d.tick(t)
    view = d.engine.jobs["7005"].view
    lines_before = view.main.lines if view.main else 0
    # The TGS tagger renames the log and repoints the job dir's link.
    new = outputs / "7005-JAX-llama3.1-8b-test-2N-TGS_3000.log"
    os.rename(job.path, new)
    (job.dir / "log").unlink()
    (job.dir / "log").symlink_to(f"../{new.name}")
    job.path = new
    job.step(10)
    t += 2.0
    await d.tick(t)
    assert view.last_step == 10
    assert view.main is not None and view.main.lines == lines_before + 2  # two tasks' copies, nothing re-read
    # Rotation: a new file under the same name starts over.
    os.unlink(new)
    job.write("JOB_ID=7005")
    job.step(0)
    t += 2.0
    await d.tick(t)
    assert view.main is not None and view.main.lines == 3
    assert events(state) == []
    d.close()


async def test_a_job_already_over_when_found_is_not_reported(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = JobLog(outputs, "7006")
    for k in range(5):
        job.step(k)
    job.summary(0)
    d = Daemon(state, outputs)
    await d.tick(T0)
    await d.tick(T0 + 15)
    assert events(state) == [] and d.engine.jobs == {}
    d.close()


async def test_an_ended_jobs_detector_state_is_dropped_and_a_reload_starts_afresh(short_tmp: Path) -> None:
    """Detectors keep per-job state (the hang budget, the TGS trend); a job leaving the watch
    takes it with it, and a reload's new detectors start with none."""
    from jobdiagd.detectors import build
    from jobdiagd.detectors.hang import HangDetector
    from jobdiagd.detectors.tgs import TgsDetector

    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = JobLog(outputs, "7010")
    d = Daemon(state, outputs)
    t = T0
    for k in range(30):
        job.step(k, seconds=10.0)
        t += 10.0
        await d.tick(t)
    (hang,) = [x for x in d.engine.detectors if isinstance(x, HangDetector)]
    (tgs,) = [x for x in d.engine.detectors if isinstance(x, TgsDetector)]
    assert hang.budget_state("7010") is not None and tgs.trend_state("7010") is not None
    assert d.engine.snapshot_jobs(t)[0]["phase"] == "steady"

    d.engine.reconfigure(d.cfg, build(d.cfg))
    (fresh,) = [x for x in d.engine.detectors if isinstance(x, HangDetector)]
    assert fresh is not hang and fresh.budget_state("7010") is None
    assert d.engine.snapshot_jobs(t)[0]["phase"] == "startup"  # no budget under the new settings yet
    t += 10.0
    await d.tick(t)
    assert fresh.budget_state("7010") is not None

    job.summary(0)
    t += 2.0
    await d.tick(t)
    assert d.engine.jobs == {}
    (tgs2,) = [x for x in d.engine.detectors if isinstance(x, TgsDetector)]
    assert fresh.budget_state("7010") is None and tgs2.trend_state("7010") is None
    d.close()


async def test_an_ended_jobs_detector_failure_trigger_is_dropped(short_tmp: Path) -> None:
    """A check that raises on a job is an edge-triggered log line per (detector, job); the
    trigger goes with the job, so a daemon watching job after job does not keep one per job ever
    seen."""
    from jobdiagd.detectors.tgs import TgsDetector

    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = JobLog(outputs, "7011")
    d = Daemon(state, outputs)
    (tgs,) = [x for x in d.engine.detectors if isinstance(x, TgsDetector)]

    def broken(view: object, now: float) -> object:
        raise RuntimeError("boom")

    tgs.check = broken  # type: ignore[method-assign]
    t = T0
    for k in range(5):
        job.step(k, seconds=10.0)
        t += 10.0
        assert not (await d.engine.tick(t)).ok  # the tick reports the failing check, and goes on
    assert d.engine._edges["detector:tgs:7011"].failing
    job.summary(0)
    t += 2.0
    await d.engine.tick(t)
    assert d.engine.jobs == {} and "detector:tgs:7011" not in d.engine._edges
    d.close()
