"""Recovery on the real Slurm cluster (docs/recovery.md): a simulated job hangs, is cancelled and
resubmitted with its own script; a recurrence is resubmitted with --exclude (ExcNodeList) and
NCCL_DEBUG=INFO; and the guardrails: a no-progress chain stops at 3, an acked job is left alone,
two daemons make one resubmission, kill -9 between cancel and submit neither loses nor doubles the
restart, only operators drain, and node memory across three jobs."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobdiagd.alerts.store import AlertStore
from jobdiagd.config import RecoveryConfig
from jobdiagd.model.kinds import GpuHangState
from jobdiagd.recovery.manager import RecoveryManager
from jobdiagd.recovery.nodes import DrainRefused, suspects_from
from jobdiagd.recovery.policy import Case
from jobdiagd.recovery.slurm_ops import SlurmOps
from jobdiagd.rules.recovery import parse_restart_marker
from jobdiagd.tsdb.gpu_hang import GpuVerdict
from jobdiagd_sim import live
from tests.helpers.slurm_cluster import SlurmCluster

SCRIPT = Path(live.__file__).with_name("slurm_job.sh")
ME = pwd.getpwuid(os.geteuid()).pw_name
STEP_RE = re.compile(rb"completed step: (\d+)")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def work(short_tmp: Path) -> Path:
    (short_tmp / "outputs").mkdir()
    return short_tmp


@pytest.fixture
def submitted(slurm_cluster: SlurmCluster) -> Iterator[list[str]]:
    """Job ids a test made or caused (restarts included): cancelled at the end."""
    ids: list[str] = []
    yield ids
    restarts = [j for j, _ in marker_jobs(slurm_cluster) if j not in ids]
    slurm_cluster.scancel(*ids, *restarts)


def marker_jobs(cluster: SlurmCluster, old: str | None = None) -> list[tuple[str, str]]:
    """(job id, state) of the jobs whose comment marks them a restart (of `old`)."""
    out = cluster.run("squeue", "-h", "-t", "all", "-o", "%i|%T|%k").stdout
    rows = [line.split("|", 2) for line in out.splitlines()]
    return [
        (r[0], r[1])
        for r in rows
        if len(r) == 3 and (m := parse_restart_marker(r[2])) is not None and (old is None or m == old)
    ]


def submit(cluster: SlurmCluster, outputs: Path, name: str, *, hang_after: int = 4) -> str:
    return cluster.sbatch(
        f"--export=ALL,SIM_PYTHON={sys.executable}",
        f"--job-name={name}",
        f"--output={outputs}/%j-%x.log",
        "--ntasks=2",
        "--overcommit",
        str(SCRIPT),
        str(outputs),
        *("--steps", "300", "--step-time", "0.2", "--hang-after", str(hang_after)),
        *("--noise-every", "0.5", "--compile-time", "0.2"),
    )


def log_of(outputs: Path, job_id: str) -> Path:
    (log,) = outputs.glob(f"{job_id}-*.log")
    return log


def steps(outputs: Path, job_id: str) -> list[int]:
    found = list(outputs.glob(f"{job_id}-*.log"))
    return [int(s) for s in STEP_RE.findall(found[0].read_bytes())] if found else []


def wait_for(cond, what: str, timeout: float = 90) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def show(cluster: SlurmCluster, job_id: str) -> str:
    return cluster.run("scontrol", "-o", "show", "job", job_id).stdout


def field(cluster: SlurmCluster, job_id: str, key: str) -> str:
    m = re.search(rf"\b{re.escape(key)}=(\S*)", show(cluster, job_id))
    assert m, f"{key} not in scontrol show job {job_id}"
    return m.group(1)


def script_of(cluster: SlurmCluster, job_id: str) -> str:
    return cluster.run("scontrol", "write", "batch_script", job_id, "-").stdout


def job_environ(job_id: str) -> dict[str, str]:
    """The environment of a running job's processes on this machine (the one node runs them)."""
    needle = f"SLURM_JOB_ID={job_id}\0".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if raw.startswith(needle) or b"\0" + needle in raw:
            pairs = [kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv]
            return dict(pairs)
    return {}


def manager(cluster: SlurmCluster, work: Path, **cfg: object) -> RecoveryManager:
    settings: dict[str, object] = {
        "mode": "auto",
        "users": (ME,),
        "countdown_seconds": 0.0,
        "resubmit_env": (f"SIM_PYTHON={sys.executable}",),
    } | cfg
    return RecoveryManager(
        RecoveryConfig(**settings),  # type: ignore[arg-type]
        AlertStore.in_state_dir(work / "state"),
        SlurmOps(cluster.backend_env),
        work_dir=work / "state" / "recovery",
        outputs_roots=[work / "outputs"],
        now=time.time,
    )


def hang_case(job_id: str, last_step: int | None, **kw: object) -> Case:
    case = Case(job_id, ME, "debug", "hang", nodes=("node001",), last_step=last_step, incident_id=f"{job_id}:hang:1")
    return dataclasses.replace(case, **kw)  # type: ignore[arg-type]


def test_a_hung_job_is_resubmitted_with_its_script_and_a_recurrence_excludes_the_suspects(
    slurm_cluster: SlurmCluster, work: Path, submitted: list[str]
) -> None:
    outputs = work / "outputs"
    a = submit(slurm_cluster, outputs, "JAX-llama3.1-8b-rec")
    submitted.append(a)
    wait_for(lambda: 4 in steps(outputs, a), "job A's hang at step 4")
    mgr = manager(slurm_cluster, work)

    decision, intent = mgr.consider(hang_case(a, 4), time.time())
    assert intent is not None and decision.plan is not None and decision.plan.rule == "REC-4"
    (outcome,) = mgr.run_due(time.time())
    assert outcome.error is None, outcome.error
    b = outcome.intent.new_job_id
    assert b and b != a and outcome.intent.status == "done"
    submitted.append(b)
    assert slurm_cluster.wait_state(a, ["CANCELLED"]) == "CANCELLED"
    # The same script, the same arguments, the marker, the same node; then it runs and logs steps.
    assert script_of(slurm_cluster, b) == script_of(slurm_cluster, a)
    assert field(slurm_cluster, b, "Comment") == f"jobdiagd:restart-of={a}"
    assert field(slurm_cluster, b, "ReqNodeList") == "node001"
    assert field(slurm_cluster, b, "JobName") == field(slurm_cluster, a, "JobName")
    # The arguments too (the script is a private copy, so its path differs).
    cmd_a = show(slurm_cluster, a).split(" Command=")[1].split(" WorkDir=")[0].split(" ")[1:]
    assert show(slurm_cluster, b).split(" Command=")[1].split(" WorkDir=")[0].split(" ")[1:] == cmd_a
    assert field(slurm_cluster, b, "StdOut") == str(outputs / f"{b}-JAX-llama3.1-8b-rec.log")
    wait_for(lambda: 4 in steps(outputs, b), "job B's first steps and its hang")
    assert (outputs / f"{b}-JAX-llama3.1-8b-rec" / "log").is_symlink()
    assert [e.action for e in mgr.book.entries(a)] == ["plan-auto", "restart", "cancel", "submit", "release", "done"]
    cancel = next(e for e in mgr.book.entries(a) if e.action == "cancel")
    assert cancel.command == f"scancel {a}" and cancel.actor == "jobdiagd (auto)" and cancel.rule == "REC-4"
    assert mgr.continuation_of(b) == a

    # B hangs where A did: a recurrence within the window, node003 named by its diagnosis.
    decision, intent = mgr.consider(hang_case(b, 4, suspects=("node003",)), time.time())
    assert decision.plan is not None and decision.plan.rule == "REC-5" and decision.plan.no_progress == 1
    (outcome,) = mgr.run_due(time.time())
    assert outcome.error is None, outcome.error
    c = outcome.intent.new_job_id
    assert c and c not in (a, b)
    submitted.append(c)
    assert field(slurm_cluster, c, "ExcNodeList") == "node003"
    assert field(slurm_cluster, c, "Comment") == f"jobdiagd:restart-of={b}"
    slurm_cluster.wait_state(c, ["RUNNING"])
    wait_for(lambda: job_environ(c).get("NCCL_DEBUG") == "INFO", "NCCL_DEBUG=INFO in job C's environment")
    env = job_environ(c)
    assert "TELEGRAM_TOKEN" not in env and env.get("SIM_PYTHON") == sys.executable
    run = mgr.book.run_of(c)
    assert run is not None and (run.chain, run.attempt, run.parent, run.no_progress) == (a, 2, b, 1)
    mgr.store.close()


def test_a_chain_without_progress_stops_at_three_restarts(
    slurm_cluster: SlurmCluster, work: Path, submitted: list[str]
) -> None:
    mgr = manager(slurm_cluster, work, recurrence_window_seconds=60.0)
    job = submit(slurm_cluster, work / "outputs", "JAX-llama3.1-8b-chain")
    submitted.append(job)
    chain = [job]
    for _ in range(3):
        decision, _intent = mgr.consider(hang_case(chain[-1], 4), time.time())
        assert decision.plan is not None, decision
        (outcome,) = mgr.run_due(time.time())
        assert outcome.error is None and outcome.intent.new_job_id
        chain.append(outcome.intent.new_job_id)
        submitted.append(chain[-1])
    decision, intent = mgr.consider(hang_case(chain[-1], 4), time.time())
    assert (decision.plan, intent, decision.rule) == (None, None, "REC-8")
    assert "no progress in its last 3 restart(s)" in decision.reason
    assert mgr.run_due(time.time()) == []
    assert marker_jobs(slurm_cluster, chain[-1]) == []
    assert [mgr.book.run_of(j).no_progress for j in chain[1:]] == [0, 1, 2]  # type: ignore[union-attr]
    assert mgr.book.entries(chain[-1])[-1].action == "decline"
    mgr.store.close()


def test_an_acked_or_kept_job_is_left_alone(slurm_cluster: SlurmCluster, work: Path, submitted: list[str]) -> None:
    job = submit(slurm_cluster, work / "outputs", "JAX-llama3.1-8b-ack")
    submitted.append(job)
    mgr = manager(slurm_cluster, work, countdown_seconds=300.0)
    now = time.time()
    decision, intent = mgr.consider(hang_case(job, 4, acked=True), now)
    assert (intent, decision.rule) == (None, "REC-9")
    decision, intent = mgr.consider(hang_case(job, 4), now)
    assert intent is not None and intent.status == "scheduled"
    mgr.keep(job, "ack by alice", now + 5, rule="REC-9")
    assert mgr.run_due(now + 301) == []
    assert slurm_cluster.state(job) in ("PENDING", "RUNNING")
    assert marker_jobs(slurm_cluster, job) == []
    # A hung job a person cancels during the countdown is theirs now (rule REC-14).
    other = submit(slurm_cluster, work / "outputs", "JAX-llama3.1-8b-taken")
    submitted.append(other)
    _, intent = mgr.consider(hang_case(other, 4), now)
    assert intent is not None
    slurm_cluster.scancel(other)
    slurm_cluster.wait_state(other, ["CANCELLED"])
    (outcome,) = mgr.run_due(now + 301)
    assert outcome.intent.status == "cancelled" and "ended during the countdown" in str(outcome.intent.result)
    assert marker_jobs(slurm_cluster, other) == []
    mgr.store.close()


def child(work: Path, name: str, cluster: SlurmCluster, case: Case, *extra: str) -> subprocess.Popen[str]:
    doc = json.dumps({k: getattr(case, k) for k in case.__slots__})  # type: ignore[attr-defined]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.recovery.recovery_child", str(work / name), str(cluster.conf),
         str(work / "outputs"), doc, *extra],
        cwd=REPO, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def result(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("race", ["both-submit", "free", "one-after-the-other"])
def test_two_daemons_make_one_resubmission(
    slurm_cluster: SlurmCluster, work: Path, submitted: list[str], race: str
) -> None:
    job = submit(slurm_cluster, work / "outputs", "JAX-llama3.1-8b-ha")
    submitted.append(job)
    slurm_cluster.wait_state(job, ["RUNNING"])
    barrier = work / "barrier"
    barrier.mkdir()
    extra = ("--barrier", str(barrier), "2") if race == "both-submit" else ()
    if race == "one-after-the-other":
        # The second daemon's countdown ends after the first restarted the job: it must join that
        # restart (the old job's comment says "restarting"), not call the job taken over by a person.
        results = [result(child(work, f"state{i}", slurm_cluster, hang_case(job, 4))) for i in (1, 2)]
        assert "jobdiagd:restarting" in field(slurm_cluster, job, "Comment")
    else:
        procs = [child(work, f"state{i}", slurm_cluster, hang_case(job, 4), *extra) for i in (1, 2)]
        results = [result(p) for p in procs]
    live = [j for j, st in marker_jobs(slurm_cluster, job) if not st.startswith("CANCELLED")]
    submitted.extend(j for j, _ in marker_jobs(slurm_cluster, job))
    assert len(live) == 1, (results, marker_jobs(slurm_cluster, job))
    assert [r["status"] for r in results] == ["done", "done"]
    assert {r["new_job_id"] for r in results} == {live[0]}
    if race == "both-submit":
        # Both submitted (held); the higher id withdrew itself, the lowest was released.
        assert len(marker_jobs(slurm_cluster, job)) == 2
        assert sum("withdraw" in r["actions"] for r in results) == 1  # type: ignore[operator]
    wait_for(lambda: slurm_cluster.state(live[0]) in ("RUNNING", "COMPLETED"), "the one restart running")


@pytest.mark.parametrize("kill_at", ["cancelled", "submitted"])
def test_kill_9_mid_restart_neither_loses_nor_doubles_it(
    slurm_cluster: SlurmCluster, work: Path, submitted: list[str], kill_at: str
) -> None:
    job = submit(slurm_cluster, work / "outputs", "JAX-llama3.1-8b-kill")
    submitted.append(job)
    slurm_cluster.wait_state(job, ["RUNNING"])
    proc = child(work, "state", slurm_cluster, hang_case(job, 4), "--kill-at", kill_at)
    out, _err = proc.communicate(timeout=120)
    assert proc.returncode == -9 and f"KILLING at {kill_at}" in out
    assert slurm_cluster.wait_state(job, ["CANCELLED"]) == "CANCELLED"
    held = marker_jobs(slurm_cluster, job)
    assert len(held) == (1 if kill_at == "submitted" else 0)
    store = AlertStore.in_state_dir(work / "state")
    (row,) = store.conn.execute("SELECT status FROM recovery_intents").fetchall()
    assert row[0] == "running"
    store.close()

    again = result(child(work, "state", slurm_cluster, hang_case(job, 4)))  # the daemon restarted
    jobs = marker_jobs(slurm_cluster, job)
    submitted.extend(j for j, _ in jobs)
    assert len(jobs) == 1 and again["status"] == "done" and again["new_job_id"] == jobs[0][0]
    if kill_at == "submitted":
        assert jobs[0][0] == held[0][0]  # the job submitted before the crash, released now
    assert again["actions"].count("submit") == 1  # type: ignore[union-attr]
    wait_for(lambda: slurm_cluster.state(jobs[0][0]) == "RUNNING", "the restart running")


def test_node_memory_across_three_jobs_excludes_and_notices_once(
    slurm_cluster: SlurmCluster, work: Path, submitted: list[str]
) -> None:
    mgr = manager(slurm_cluster, work)
    verdict = GpuVerdict(GpuHangState.DEAD_NODE, "node003 idle with no GPU process", suspects=("node003",))
    notices = []
    restarts = []
    for i in range(3):
        job = submit(slurm_cluster, work / "outputs", f"JAX-llama3.1-8b-mem{i}")
        submitted.append(job)
        decision, _ = mgr.consider(hang_case(job, 4), time.time())
        assert decision.plan is not None
        (outcome,) = mgr.run_due(time.time())
        assert outcome.error is None and outcome.intent.new_job_id
        restarts.append(outcome.intent.new_job_id)
        submitted.append(restarts[-1])
        notices += mgr.observe_nodes(job, suspects_from(verdict=verdict), time.time())
    # Two jobs named node003 (score 2 > node_exclude_score 1.5): the third job's first retry excludes it.
    assert [field(slurm_cluster, r, "ExcNodeList") for r in restarts] == ["(null)", "(null)", "node003"]
    (notice,) = notices
    assert notice.node == "node003" and notice.text.startswith("node003 in 3 hangs of 3 job(s)")
    assert notice.drain_command.startswith("scontrol update NodeName=node003 State=DRAIN 'Reason=jobdiagd: in 3")
    assert mgr.observe_nodes(restarts[-1], [], time.time()) == []  # one notice per node
    nodes = subprocess.run(
        [sys.executable, "-m", "jobdiagd.cli", "nodes", "--json", "--config", str(write_cfg(work))],
        capture_output=True, text=True, check=True, cwd=REPO,
    )
    (row,) = json.loads(nodes.stdout)["nodes"]
    assert row["node"] == "node003" and len(row["jobs"]) == 3
    mgr.store.close()


def write_cfg(work: Path) -> Path:
    cfg = work / "cfg.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{work / "state"}"\n')
    return cfg


def test_drain_is_for_operators_only_and_logged(slurm_cluster: SlurmCluster, work: Path) -> None:
    node = slurm_cluster.spare_nodes[-1]  # DOWN, never scheduled on: draining it disturbs nobody
    mgr = manager(slurm_cluster, work)
    try:
        with pytest.raises(DrainRefused, match="not an operator"):
            mgr.drain(node, by="mallory", is_operator=False, now=time.time())
        assert "DRAIN" not in slurm_cluster.run("scontrol", "show", "node", node).stdout
        text = mgr.drain(node, by="ops-alice", is_operator=True, now=time.time())
        assert text.startswith(f"scontrol update NodeName={node} State=DRAIN")
        shown = slurm_cluster.run("scontrol", "show", "node", node).stdout
        assert "DRAIN" in shown and "Reason=jobdiagd: drained by ops-alice" in shown
        entries = mgr.book.entries(f"node:{node}")
        assert [(e.actor, e.outcome) for e in entries] == [
            ("mallory", "refused: not an operator"),
            ("ops-alice", f"{node} drained"),
        ]
        assert entries[1].command.startswith(f"scontrol update NodeName={node} State=DRAIN")
    finally:
        slurm_cluster.run("scontrol", "update", f"NodeName={node}", "State=UNDRAIN", check=False)
        mgr.store.close()


def test_dry_run_prints_the_commands_and_runs_none(
    slurm_cluster: SlurmCluster, work: Path, submitted: list[str]
) -> None:
    job = submit(slurm_cluster, work / "outputs", "JAX-llama3.1-8b-dry")
    submitted.append(job)
    mgr = manager(slurm_cluster, work, dry_run=True)
    decision, intent = mgr.consider(hang_case(job, 4), time.time())
    assert decision.mode == "dry-run" and intent is not None
    (outcome,) = mgr.run_due(time.time())
    assert outcome.intent.status == "dry-run"
    would = [e for e in outcome.entries if e.action == "would-run"]
    assert [e.argv[0] for e in would] == ["scancel", "env"]
    assert f"--comment=jobdiagd:restart-of={job}" in would[1].argv and "--nodelist=node001" in would[1].argv
    assert slurm_cluster.state(job) in ("PENDING", "RUNNING") and marker_jobs(slurm_cluster, job) == []
    mgr.store.close()


def test_requeue_keeps_the_job_and_excludes_while_pending(
    slurm_cluster: SlurmCluster, work: Path, submitted: list[str]
) -> None:
    job = submit(slurm_cluster, work / "outputs", "JAX-llama3.1-8b-rq")
    submitted.append(job)
    slurm_cluster.wait_state(job, ["RUNNING"])
    mgr = manager(slurm_cluster, work, method="requeue")
    decision, _ = mgr.consider(hang_case(job, 4, failure_class="node-fail", suspects=("node002",)), time.time())
    assert decision.plan is not None and decision.plan.rule == "REC-6"
    (outcome,) = mgr.run_due(time.time())
    assert outcome.error is None and outcome.intent.new_job_id == job
    assert field(slurm_cluster, job, "Restarts") == "1"
    assert field(slurm_cluster, job, "ExcNodeList") == "node002"
    # Requeued: it passes through COMPLETING (epilog) before it waits again.
    assert slurm_cluster.wait_state(job, ["PENDING"], timeout=30) == "PENDING"
    # Run again after a crash: Slurm's restart count moved, so no second requeue.
    mgr.book.update(outcome.intent, time.time(), status="running")
    (again,) = mgr.run_due(time.time())
    assert again.error is None and field(slurm_cluster, job, "Restarts") == "1"
    mgr.store.close()
