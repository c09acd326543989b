"""Recovery's stage in the engine's tick (service.recovery_wiring), on real files and a real store,
on a hand-driven clock: the intent and its countdown commit with the incident (rule REC-13), an ack
or a resolved hang cancels it, a done restart resolves "restarted as N", the continuation line,
node memory's notice. What needs Slurm (run_due, drain) is in test_daemon_recovery.py."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

from jobdiagd.chat.auth import Sender
from jobdiagd.model.alerts import Finding
from jobdiagd.model.kinds import IncidentKind
from jobdiagd.recovery.book import RecoveryBook
from jobdiagd.recovery.policy import RunInfo
from jobdiagd.service.stages import Batch, StageContext, observe, plan_recovery, run_stages
from jobdiagd.sources.slurm_parse import SlurmJob
from jobdiagd_sim import lines as L
from tests.helpers.engine import T0, Daemon, outbox
from tests.helpers.joblog import JobLog

AUTO = '[recovery]\nmode = "auto"\nusers = ["alice"]\ncountdown_seconds = 300\nchat_users = ["alice=501"]\n'


def slurm(job: str, state: str = "RUNNING") -> SlurmJob:
    return SlurmJob(job, "JAX-llama3.1-8b-test", "alice", state, "gpu", "node[001-002]", ("node001", "node002"))


async def hung(d: Daemon, job: JobLog, t: float) -> float:
    """Steps of 10 s, then silence past the 120 s budget: the hang page (and the countdown)."""
    for k in range(5):
        job.step(k, seconds=10.0)
        t += 10.0
        await d.tick(t)
        d.engine.jobs[job.job_id].view.slurm = slurm(job.job_id)
    for _ in range(10):
        job.task(0, "node001:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read")
        t += 15.0
        await d.tick(t)
    return t


def updates(state: Path) -> list[str]:
    return [n["body"] for n in outbox(state) if n["event"] == "update"]


async def test_the_countdown_is_decided_with_the_page_and_shown_in_its_message(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    d = Daemon(state, outputs, extra=AUTO, recovery=True)
    t = await hung(d, JobLog(outputs, "7001"), T0)
    notes = outbox(state)
    assert [(n["event"], n["kind"]) for n in notes] == [("open", "hang"), ("update", "hang")]
    rec = notes[1]["incident"]["recovery"]
    assert rec["status"] == "scheduled" and rec["text"].startswith("♻ Auto-restart of job 7001 in 5 min")
    assert "same nodes: node001,node002" in rec["text"] and rec["due_at"] == pytest.approx(notes[1]["created_at"] + 300)
    # The intent, and nothing more on the next ticks (the hang repeats; consider is idempotent).
    (intent,) = RecoveryBook(d.pipeline.store).intents_for_job("7001")
    assert (intent.status, intent.incident_id, intent.plan.rule) == ("scheduled", "7001:hang:1", "REC-4")
    for _ in range(3):
        t += 15.0
        await d.tick(t)
    assert len(outbox(state)) == 2 and len(RecoveryBook(d.pipeline.store).intents_for_job("7001")) == 1
    assert d.recovery is not None and [p["job_id"] for p in d.recovery.snapshot(t)["pending"]] == ["7001"]
    d.close()


async def test_the_intent_commits_with_the_incident_or_not_at_all(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule REC-13: a store fault while deciding rolls back the page with the intent; the next
    tick decides both again."""
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    d = Daemon(state, outputs, extra=AUTO, recovery=True)
    assert d.recovery is not None
    real = d.recovery.manager.consider

    def broken(*a: object, **kw: object) -> object:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(d.recovery.manager, "consider", broken)
    job = JobLog(outputs, "7002")
    t = T0
    for k in range(5):
        job.step(k, seconds=10.0)
        t += 10.0
        await d.tick(t)
        d.engine.jobs["7002"].view.slurm = slurm("7002")
    for _ in range(10):
        t += 15.0
        await d.tick(t)  # a store fault never fails the tick: the pipeline holds what it could not write
    assert outbox(state) == [] and [n.event for n in d.pipeline.held] == ["open"]  # nor the page, nor the intent
    assert d.pipeline.store.conn.execute("SELECT COUNT(*) FROM recovery_intents").fetchone()[0] == 0
    monkeypatch.setattr(d.recovery.manager, "consider", real)
    t += 15.0
    await d.tick(t)
    assert [n["event"] for n in outbox(state)] == ["open", "update"]
    assert len(RecoveryBook(d.pipeline.store).intents_for_job("7002")) == 1
    d.close()


async def test_an_ack_or_resumed_steps_cancel_the_countdown(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    d = Daemon(state, outputs, extra=AUTO, recovery=True)
    assert d.recovery is not None
    acked, resumed = JobLog(outputs, "7003"), JobLog(outputs, "7004")
    t = T0
    for k in range(5):
        for job in (acked, resumed):
            job.step(k, seconds=10.0)
        t += 10.0
        await d.tick(t)
        for job in (acked, resumed):
            d.engine.jobs[job.job_id].view.slurm = slurm(job.job_id)
    for _ in range(10):
        t += 15.0
        await d.tick(t)
    d.pipeline.ack("7003", "hang", t, "bob")
    d.recovery.keep("7003", "bob", t, rule="REC-9", why="acked by bob")
    resumed.step(5, seconds=200.0)
    t += 15.0
    await d.tick(t)
    book = RecoveryBook(d.pipeline.store)
    assert [(i.status, i.result) for i in book.intents_for_job("7003")] == [("cancelled", "acked by bob")]
    assert [(i.status, i.result) for i in book.intents_for_job("7004")] == [
        ("cancelled", "the hang resolved (steps resumed): nothing to restart")
    ]
    assert [e.action for e in book.entries("7003")][-1] == "keep" and book.entries("7003")[-1].rule == "REC-9"
    cancelled = [b for b in updates(state) if "cancelled" in b]
    assert sorted(cancelled) == sorted(
        [
            "♻ Restart of job 7003 cancelled: acked by bob",
            "♻ Restart of job 7004 cancelled: the hang resolved (steps resumed): nothing to restart",
        ]
    )
    last = [n for n in outbox(state) if n["job_id"] == "7003"][-1]["incident"]
    assert last["recovery"]["status"] == "cancelled" and last["acked_by"] == "bob"
    d.close()


async def test_a_done_restart_resolves_the_old_incident_and_the_new_job_continues_its_thread(
    short_tmp: Path,
) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    d = Daemon(state, outputs, extra=AUTO, recovery=True)
    assert d.recovery is not None
    old = JobLog(outputs, "7005")
    t = await hung(d, old, T0)
    # What the worker does at the countdown's end (its Slurm part is test_daemon_recovery's).
    book = RecoveryBook(d.pipeline.store)
    (intent,) = book.intents_for_job("7005")
    book.update(intent, t, status="done", new_job_id="7006", result="restarted as 7006")
    book.add_run(RunInfo("7006", 1, "7005", "7005", 4, 0, "hang", (), t))
    d.recovery._parents["7006"] = "7005"
    new = JobLog(outputs, "7006")
    new.task(0, L.absl_prefix(t, 1234, "checkpointing.py:214") + L.restore_line(3))
    old.summary(143, "CANCELLED (scancel / SIGTERM)")
    d.engine.jobs["7005"].view.slurm = slurm("7005", "CANCELLED")
    t += 15.0
    await d.tick(t)
    t += 15.0
    await d.tick(t)
    notes = outbox(state)
    resolved = next(n for n in notes if n["event"] == "resolve" and n["job_id"] == "7005")
    assert resolved["body"].startswith("restarted as 7006 after")
    (line,) = [n for n in notes if n["event"] == "report" and n["kind"] == IncidentKind.RECOVERY]
    assert (line["job_id"], line["title"]) == ("7005", "♻ restarted as 7006, step 3 restored")
    for _ in range(3):  # said once
        t += 15.0
        await d.tick(t)
    assert len([n for n in outbox(state) if n["kind"] == IncidentKind.RECOVERY]) == 1
    d.close()


async def test_a_failure_naming_a_node_feeds_node_memory_and_its_notice(short_tmp: Path) -> None:
    """Recovery off: node memory still records; past the notice score, one notice with its
    scontrol line (its Drain button is the chat's)."""
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    d = Daemon(state, outputs, extra="[recovery]\nnode_notice_score = 3.5\n", recovery=True)
    t = T0
    for k in range(2):
        job = JobLog(outputs, f"710{k}")
        for step in range(3):
            job.step(step)
        job.task(1, "srun: error: Node failure on node002")
        job.task(1, "NODE_EXIT host=node002 exit=1")
        t += 5.0
        await d.tick(t)
    notes = outbox(state)
    assert [n["kind"] for n in notes].count("failure") == 2
    (notice,) = [n for n in notes if n["event"] == "notice"]
    assert notice["id"].startswith("notice:suspect-node:node002:")
    assert notice["title"] == "suspect node: node002 in 2 node-fail of 2 job(s) in 60 s"
    assert "scontrol update NodeName=node002 State=DRAIN" in notice["body"]
    assert RecoveryBook(d.pipeline.store).intents_for_job("7100") == []  # no restart: recovery is off
    assert d.recovery is not None and "node002  score 4.00" in d.recovery.nodes(t).body
    d.close()


def test_restart_is_for_the_owner_by_chat_id_or_an_operator(short_tmp: Path) -> None:
    d = Daemon(short_tmp / "state", short_tmp / "outputs", extra=AUTO + 'operators = ["olga"]\n', recovery=True)
    w = d.recovery
    assert w is not None
    assert w.is_owner(Sender("-1", "501", "whoever"), "alice")
    assert not w.is_owner(Sender("-1", "502", "alice"), "alice")  # a chat name is never an owner
    assert w.is_operator(Sender("-1", "777", "olga")) and not w.is_operator(Sender("-1", "501", "alice"))
    assert w.approve("1", Sender("-1", "501", "alice"), operator=False, now=T0) == (
        "No suggested restart of job 1 is waiting.",
        False,
    )
    d.close()


def test_reload_applies_new_recovery_settings(short_tmp: Path) -> None:
    d = Daemon(short_tmp / "state", short_tmp / "outputs", extra=AUTO, recovery=True)
    w = d.recovery
    assert w is not None and w.acts
    new = dataclasses.replace(d.cfg, recovery=dataclasses.replace(d.cfg.recovery, mode="off"))
    w.reconfigure(new)
    assert not w.acts and w.manager.cfg.mode == "off" and w.manager.executor.cfg.mode == "off"
    d.close()


async def test_a_job_outside_the_outputs_roots_is_never_restarted(short_tmp: Path) -> None:
    """Rule REC-25: on a shared cluster the daemon sees every job squeue shows; it restarts only
    those whose log is under its outputs roots (node memory still learns from the others)."""
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    elsewhere = short_tmp / "elsewhere"
    elsewhere.mkdir()
    d = Daemon(state, outputs, extra=AUTO + f'[slurm]\noutputs_roots = ["{elsewhere}"]\n', recovery=True)
    await hung(d, JobLog(outputs, "7200"), T0)
    assert [n["event"] for n in outbox(state)] == ["open"]  # paged, no countdown
    assert RecoveryBook(d.pipeline.store).intents_for_job("7200") == []
    assert RecoveryBook(d.pipeline.store).entries("7200") == []
    d.close()


async def test_a_tgs_slides_slow_host_feeds_node_memory_and_restarts_nothing(short_tmp: Path) -> None:
    """The site Prometheus names a TGS slide's slow host (rule SLOW-5): evidence, never a restart."""
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    d = Daemon(state, outputs, extra=AUTO, recovery=True)
    JobLog(outputs, "7300").step(0)
    await d.tick(T0)
    d.engine.jobs["7300"].view.slurm = slurm("7300")
    views = {k: w.view for k, w in d.engine.jobs.items()}
    slide = Finding(
        "tgs", "7300", IncidentKind.TGS_DEGRADATION, "warning", "tokens/s/device 20% below baseline",
        {"slow host": "node005: GPU power 40% below the median", "suspect host": "node005"}, at_step=0,
    )
    batch = run_stages(Batch([slide], []), StageContext(T0 + 1, views, d.pipeline, lambda *a: None, recovery=d.recovery))
    assert batch.ok
    rows = d.pipeline.store.conn.execute("SELECT node, job_id, kind, failure_class FROM node_evidence").fetchall()
    assert [tuple(r) for r in rows] == [("node005", "7300", "slow-host", "tgs-degradation")]
    assert RecoveryBook(d.pipeline.store).intents_for_job("7300") == []
    d.close()


async def test_a_failed_jobs_end_playbook_feeds_node_memory(short_tmp: Path) -> None:
    """The enricher keeps the end-of-job diagnosis of a failed RAY=1 job when it releases its
    report; the recovery stage takes it (once) for node memory."""
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    d = Daemon(state, outputs, extra=AUTO, recovery=True)
    enricher = SimpleNamespace(
        diagnoses={"7400": {"playbook": "gpu-health", "verdict": "hardware-fault", "anomalous_hosts": ["node021"]}}
    )
    ctx = StageContext(T0, {}, d.pipeline, lambda *a: None, enricher=enricher, recovery=d.recovery)  # type: ignore[arg-type]
    for _ in range(2):
        observe(plan_recovery(Batch([], []), ctx), ctx)
    rows = d.pipeline.store.conn.execute("SELECT node, job_id, kind, weight FROM node_evidence").fetchall()
    assert [tuple(r) for r in rows] == [("node021", "7400", "gpu-health", 1.5)] and enricher.diagnoses == {}
    d.close()
