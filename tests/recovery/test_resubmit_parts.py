"""The pure parts of a resubmission (rules REC-13, REC-16 to REC-18): sbatch's argv from the job's
record, the job's environment, the job directory, and the intent joining the incident's commit."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import IncidentsConfig, RecoveryConfig
from jobdiagd.model.alerts import Finding
from jobdiagd.recovery.executor import ExecutionError, command_args, job_env, lay_out_job_dir, sbatch_argv
from jobdiagd.recovery.manager import RecoveryManager
from jobdiagd.recovery.policy import Case, Plan
from jobdiagd.recovery.slurm_ops import JobSpec, SlurmOps, _command_of, check_reason
from jobdiagd.sources.slurm_parse import parse_scontrol_pairs

T0 = 1_800_000_000.0
ME = __import__("pwd").getpwuid(os.geteuid()).pw_name


def spec(root: Path, *, user: str = ME, extra: str = "") -> JobSpec:
    line = (
        f"JobId=4242 JobName=JAX-llama2-70b UserId={user}(0) GroupId=g(0) Priority=1 Account=proj QOS=(null) "
        "JobState=RUNNING Reason=None Requeue=1 Restarts=0 BatchFlag=1 TimeLimit=2-00:00:00 "
        "Partition=gpu NodeList=node[001-002] ReqNodeList=(null) ExcNodeList=node009 NumNodes=2 "
        "NumCPUs=4 NumTasks=2 CPUs/Task=1 Features=mi300 OverSubscribe=NO "
        f"Command={root}/_job.sbatch llama2-70b   -- steps=10 Foo=bar WorkDir={root} "
        f"StdErr={root}/4242-JAX-llama2-70b.log StdOut={root}/4242-JAX-llama2-70b.log {extra}"
    )
    return JobSpec("4242", parse_scontrol_pairs(line), _command_of(line))


def plan(**kw: object) -> Plan:
    base = Plan("4242", "4242", 1, "hang", "retry-same-nodes", "REC-4", "hang", "resubmit", ME, "gpu",
                exclude=("node003",), nodelist=("node001", "node002"), env={"NCCL_DEBUG": "INFO"})
    import dataclasses

    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_sbatch_argv_carries_the_recorded_settings_the_marker_and_the_changes(tmp_path: Path) -> None:
    s = spec(tmp_path)
    assert s.command.endswith("llama2-70b   -- steps=10 Foo=bar")  # Foo=bar is an argument, not a key
    argv = sbatch_argv(s, plan(), tmp_path / "x.sbatch", running_as=ME, owner=ME)
    assert argv[:4] == ["sbatch", "--parsable", "--hold", "--comment=jobdiagd:restart-of=4242"]
    for opt in ("--job-name=JAX-llama2-70b", "--partition=gpu", "--account=proj", "--constraint=mi300",
                f"--chdir={tmp_path}", "--time=2-00:00:00", "--nodes=2", "--ntasks=2", "--cpus-per-task=1",
                "--exclusive", f"--output={tmp_path}/%j-JAX-llama2-70b.log", "--exclude=node003,node009",
                "--nodelist=node001,node002", "--export=ALL"):
        assert opt in argv, opt
    assert not any(a.startswith(("--error", "--qos", "--uid")) for a in argv)
    i = argv.index(str(tmp_path / "x.sbatch"))
    assert argv[i + 1 :] == ["llama2-70b", "", "", "--", "steps=10", "Foo=bar"]
    assert command_args("/s.sh") == [] and command_args("") == []


def test_the_output_pattern_gets_its_job_id_back_and_nothing_else() -> None:
    from jobdiagd.recovery.executor import _new_output

    assert _new_output("/o/1-JAX-llama3.1-8b.log", "1") == "/o/%j-JAX-llama3.1-8b.log"
    assert _new_output("/o/slurm-77.out", "77") == "/o/slurm-%j.out"
    assert _new_output("/o/run_1771.log", "77") == "/o/run_1771.log"
    assert _new_output(None, "1") is None


def test_another_users_job_needs_root_to_resubmit(tmp_path: Path) -> None:
    s = spec(tmp_path, user="someoneelse")
    if os.geteuid() == 0:
        assert "--uid=someoneelse" in sbatch_argv(s, plan(), tmp_path / "x", running_as="root", owner="someoneelse")
    else:
        with pytest.raises(ExecutionError, match="needs root"):
            sbatch_argv(s, plan(), tmp_path / "x", running_as=ME, owner="someoneelse")


def test_the_environment_is_rebuilt_from_the_job_directory_never_the_daemons(tmp_path: Path) -> None:
    root = tmp_path
    art = root / ".artifacts" / "artifact_1"
    art.mkdir(parents=True)
    (art / "submit_cmd.txt").write_text(f"JOB_WORKSPACE={root} RAY=1 ./submit.sh 70b -N 2\n")
    jd = root / "4242-JAX-llama2-70b"
    jd.mkdir()
    (jd / "artifact").symlink_to("../.artifacts/artifact_1")
    base = {"PATH": "/usr/bin", "TELEGRAM_TOKEN": "secret", "SLURM_CONF": "/etc/slurm.conf", "HOME": "/daemon"}
    cfg = RecoveryConfig(resubmit_env=("DOCKER_IMAGE=img:1",))
    env = job_env(spec(root), plan(), cfg, [root], base=base)
    assert "TELEGRAM_TOKEN" not in env and env["HOME"] != "/daemon"
    assert env["MAXTEXT_SLURM_DIR"] == str(art) and env["JOB_WORKSPACE"] == str(root)
    assert env["USE_RAY"] == "true" and env["LOGIN_NODE_HOSTNAME"].startswith(f"{ME}@")
    assert env["DOCKER_IMAGE"] == "img:1" and env["NCCL_DEBUG"] == "INFO" and env["SLURM_CONF"] == "/etc/slurm.conf"
    # An artifact link that leaves the outputs root is not followed.
    (jd / "artifact").unlink()
    (jd / "artifact").symlink_to("/etc")
    assert "MAXTEXT_SLURM_DIR" not in job_env(spec(root), plan(), cfg, [root], base=base)


def test_the_new_job_directory_mirrors_what_submit_sh_makes(tmp_path: Path) -> None:
    jd = tmp_path / "4242-JAX-llama2-70b"
    jd.mkdir()
    (jd / "artifact").symlink_to("../.artifacts/artifact_1")
    (jd / "log").symlink_to("../4242-JAX-llama2-70b.log")
    new = lay_out_job_dir(spec(tmp_path), "4243", [tmp_path])
    assert new == tmp_path / "4243-JAX-llama2-70b"
    assert os.readlink(new / "log") == "../4243-JAX-llama2-70b.log"
    assert os.readlink(new / "artifact") == "../.artifacts/artifact_1"
    assert lay_out_job_dir(spec(tmp_path), "4243", [tmp_path]) == new  # idempotent
    assert lay_out_job_dir(spec(tmp_path), "4244", [tmp_path / "elsewhere"]) is None


def test_drain_reasons_and_node_names_are_validated() -> None:
    assert SlurmOps.drain_argv("node017", "jobdiagd: 3 hangs")[-1] == "Reason=jobdiagd: 3 hangs"
    for node, reason in (("node017;id", "x"), ("-oProxy", "x"), ("node017", "a\nb"), ("node017", 'x" y')):
        with pytest.raises(ValueError):
            SlurmOps.drain_argv(node, reason)
    with pytest.raises(ValueError):
        check_reason("")


def test_the_intent_commits_with_the_incident_or_not_at_all(tmp_path: Path) -> None:
    """Rule REC-13: one transaction holds the incident, its page and the intent."""
    pipeline = AlertPipeline.open(tmp_path, IncidentsConfig(), ["jsonl"])
    cfg = RecoveryConfig(mode="auto", users=(ME,), countdown_seconds=300)
    mgr = RecoveryManager(cfg, pipeline.store, SlurmOps(), work_dir=tmp_path / "rec", now=lambda: T0)
    case = Case("4242", ME, "gpu", "hang", nodes=("node001",), last_step=10, incident_id="4242:hang:1")

    class Boom(Exception):
        pass

    with pytest.raises(Boom), pipeline.store.transaction():
        pipeline.observe([Finding("hang", "4242", "hang", "critical", "no step")], T0)
        mgr.consider(case, T0)
        raise Boom
    assert mgr.book.intents_for_job("4242") == []
    assert pipeline.store.conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 0

    with pipeline.store.transaction():
        decision, intent = mgr.consider(case, T0)
    assert intent is not None and intent.status == "scheduled" and intent.due_at == T0 + 300
    assert mgr.consider(case, T0 + 15)[1] == intent  # the next tick: the same intent, not a second
    assert mgr.book.due(T0 + 299) == [] and [i.id for i in mgr.book.due(T0 + 300)] == [intent.id]
    # Keep the job: cancelled; nothing is due any more.
    (kept,) = mgr.keep("4242", "alice", T0 + 10)
    assert kept.status == "cancelled" and mgr.book.due(T0 + 1000) == []
    assert [e.action for e in mgr.book.entries("4242")] == ["plan-auto", "keep"]
    with pytest.raises(sqlite3.IntegrityError):  # the status column refuses what is not a status
        pipeline.store.conn.execute("UPDATE recovery_intents SET status = 'bogus'")
    pipeline.close()


def test_suggest_waits_for_restart_by_the_owner_or_an_operator(tmp_path: Path) -> None:
    from jobdiagd.alerts.store import AlertStore

    cfg = RecoveryConfig(mode="suggest", users=(ME,))
    store = AlertStore.in_state_dir(tmp_path)
    mgr = RecoveryManager(cfg, store, SlurmOps(), work_dir=tmp_path / "rec", now=lambda: T0)
    case = Case("4242", ME, "gpu", "node-fail", nodes=("node001",), last_step=10, suspects=("node001",))
    decision, intent = mgr.consider(case, T0)
    assert decision.mode == "suggest" and intent is not None and intent.status == "suggested"
    assert intent.due_at is None and mgr.book.due(T0 + 10**6) == []
    assert mgr.approve("4242", "mallory", allowed=False, now=T0 + 1) is None
    approved = mgr.approve("4242", "alice", allowed=True, now=T0 + 2)
    assert approved is not None and approved.status == "scheduled" and approved.due_at == T0 + 2
    assert [i.id for i in mgr.book.due(T0 + 2)] == [approved.id]
    assert [(e.actor, e.action, e.outcome) for e in mgr.book.entries("4242")][1:] == [
        ("mallory", "approve", "refused: not owner/operator"),
        ("alice", "approve", "restart approved"),
    ]
    store.close()


def test_what_people_read() -> None:
    from jobdiagd.recovery.book import Intent, LogEntry
    from jobdiagd.recovery.messages import action_text, countdown_text, restarted_text

    intent = Intent("rec:4242:1", "4242", "4242:hang:1", "scheduled", T0 + 300, T0, T0, plan())
    text = countdown_text(intent, T0 + 10)
    assert text.splitlines()[0] == (
        "♻ Auto-restart of job 4242 in 5 min (retry-same-nodes). Press “Keep the job” or ack to cancel."
    )
    assert "- exclude: node003" in text and "- environment: NCCL_DEBUG=INFO" in text
    entry = LogEntry(T0, "4242", "jobdiagd (auto)", "REC-4", "cancel", ("scancel", "4242"), "job 4242 cancelled")
    assert action_text(entry) == "♻ jobdiagd (auto) · cancel · rule REC-4 · `scancel 4242` → job 4242 cancelled"
    assert restarted_text("12345", "12346", 4100) == "restarted as 12346, step 4100 restored"
    assert restarted_text("12345", "12345", None).startswith("requeued job 12345, no checkpoint restored")


@pytest.mark.slurm  # runs the real scontrol (against an empty slurm.conf: no cluster needed)
def test_a_failing_slurm_command_is_retried_then_given_up(tmp_path: Path) -> None:
    """Rule REC-13: a passing Slurm fault (here: no usable slurm.conf) keeps the intent running and
    retries it after a delay; only after MAX_RETRIES is it failed."""
    from jobdiagd.alerts.store import AlertStore
    from jobdiagd.recovery.executor import MAX_RETRIES, RETRY_DELAY_S

    clock = [T0]
    store = AlertStore.in_state_dir(tmp_path / "state")
    empty = tmp_path / "slurm.conf"  # an empty file fails at once (a missing one is retried for 60 s)
    empty.write_text("")
    ops = SlurmOps({"SLURM_CONF": str(empty)}, timeout_s=20)
    cfg = RecoveryConfig(mode="auto", users=(ME,), countdown_seconds=0, max_actions_per_hour=100)
    mgr = RecoveryManager(cfg, store, ops, work_dir=tmp_path / "rec", now=lambda: clock[0])
    mgr.consider(Case("4242", ME, "gpu", "checkpoint-fs-error", last_step=10), T0)
    (first,) = mgr.run_due(T0)
    assert first.error and first.intent.status == "running" and first.intent.progress["retries"] == 1
    assert mgr.run_due(T0 + 1) == []  # not before its delay
    for i in range(MAX_RETRIES):
        clock[0] = T0 + (i + 1) * (RETRY_DELAY_S + 1)
        (outcome,) = mgr.run_due(clock[0])
        assert outcome.error
    assert outcome.intent.status == "failed" and "gave up after" in str(outcome.intent.result)
    actions = [e.action for e in mgr.book.entries("4242")]
    assert actions.count("retry") == MAX_RETRIES and actions[-1] == "failed" and actions.count("restart") == 1
    store.close()
