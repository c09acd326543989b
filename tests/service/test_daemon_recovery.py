"""Recovery through the running daemon, on the real Slurm cluster, paged through Telegram (the real
python-telegram-bot against the emulator): a simulated job hangs under `auto`, the countdown is in
its page, it is cancelled and resubmitted with its own script; the restart lives in the old page's
thread and restores its checkpoint; it hangs again and the recurrence excludes the suspect node;
the chain stops after three restarts without progress. And the guardrails through the daemon: an
ack or "Keep the job" during the countdown leaves the job alone, a suggestion waits for its owner
or an operator, Drain is for operators, node memory across three jobs.

Short steps, tiny budgets and countdowns of a few seconds; every wait is on an event (a message, a
Slurm state), never a sleep. docs/recovery.md "Guardrails" lists which test covers what.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from jobdiagd.alerts.store import DB_NAME
from jobdiagd.recovery.nodes import NodeEvidence, NodeMemory
from jobdiagd.rules.recovery import parse_restart_marker
from jobdiagd.service.status_cli import format_status
from jobdiagd_sim import live
from tests.helpers.chat import ALICE, CHAT, OPERATOR, start_daemon, until
from tests.helpers.daemon import status, stop, wait_for
from tests.helpers.emulators.slack import SlackEmulator
from tests.helpers.emulators.telegram import StoredMessage, TelegramEmulator
from tests.helpers.joblog import JobLog
from tests.helpers.slack import ALICE as SLACK_ALICE
from tests.helpers.slack import CHAN as SLACK_CHAN
from tests.helpers.slack import OPERATOR as SLACK_OPERATOR
from tests.helpers.slack import slack_daemon_config
from tests.helpers.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.daemon

SCRIPT = Path(live.__file__).with_name("slurm_job.sh")
ME = pwd.getpwuid(os.geteuid()).pw_name


def config(
    work: Path, em: TelegramEmulator | None, cluster: SlurmCluster, recovery: str, *, state: str = "state"
) -> Path:
    """A daemon on the cluster (squeue discovery, fast ticks), paging Telegram (with `em`), with `recovery`."""
    chat = ""
    if em is not None:
        token = work / "tg-token"
        token.write_text(em.token + "\n")
        chat = f"""
[notifiers.telegram]
enabled = true
token_file = "{token}"
chat_ids = [{CHAT}]
allowed_users = [{ALICE}, {OPERATOR}]
operators = [{OPERATOR}]
api_base_url = "{em.base_url}"
poll_timeout_seconds = 1
"""
    cfg = work / f"{state}.toml"
    cfg.write_text(
        f"""
[daemon]
state_dir = "{work}/{state}"
socket_path = "{work}/{state}.sock"
tick_seconds = 0.5
squeue_interval_seconds = 1
log_level = "error"
[slurm]
backend = "cli"
slurm_conf = "{cluster.conf}"
outputs_roots = ["{work}/outputs"]
command_timeout_seconds = 60
[detectors.hang]
min_stall_seconds = 2
startup_grace_seconds = 30
[delivery]
retry_initial_seconds = 0.2
retry_max_seconds = 1
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
{chat}
[recovery]
users = ["{ME}"]
resubmit_env = ["SIM_PYTHON={sys.executable}"]
{recovery}
"""
    )
    return cfg


def body(m: StoredMessage) -> str:
    return m.text or m.caption or ""


def current(tg: TelegramEmulator, m: StoredMessage) -> StoredMessage:
    return tg.messages[(m.chat_id, m.message_id)]


def page_of(tg: TelegramEmulator, job: str) -> Callable[[], StoredMessage | None]:
    """The hang page of `job` (the incident's own message, its title first: not a reply about it)."""
    title = re.compile(rf"^(🔴|✅) hang on job {job}\b")
    return lambda: next((m for m in tg.bot_messages(CHAT) if title.match(body(m))), None)


def replies_to(tg: TelegramEmulator, m: StoredMessage, needle: str) -> Callable[[], list[StoredMessage]]:
    return lambda: [r for r in tg.bot_messages(CHAT) if r.reply_to == m.message_id and needle in body(r)]


def button(m: StoredMessage, label: str) -> str:
    found = [data for row in m.buttons for text, data in row if text.startswith(label)]
    assert found, (label, m.buttons)
    return found[0]


def submit(cluster: SlurmCluster, outputs: Path, name: str, *extra: str) -> str:
    return cluster.sbatch(
        f"--export=ALL,SIM_PYTHON={sys.executable}",
        f"--job-name={name}",
        f"--output={outputs}/%j-%x.log",
        "--ntasks=2",
        "--overcommit",
        str(SCRIPT),
        str(outputs),
        *("--steps", "300", "--step-time", "0.2", "--hang-after", "4", "--noise-every", "0.5"),
        *("--compile-time", "0.2", *extra),
    )


def restart_of(cluster: SlurmCluster, old: str) -> str | None:
    """The job whose comment marks it as the restart of `old` (not cancelled), if any."""
    out = cluster.run("squeue", "-h", "-t", "all", "-o", "%i|%T|%k").stdout
    for line in out.splitlines():
        jid, state, comment = (line.split("|", 2) + ["", ""])[:3]
        if parse_restart_marker(comment) == old and not state.startswith("CANCELLED"):
            return jid
    return None


def field(cluster: SlurmCluster, job: str, key: str) -> str:
    m = re.search(rf"\b{re.escape(key)}=(\S*)", cluster.run("scontrol", "-o", "show", "job", job).stdout)
    assert m, f"{key} not in scontrol show job {job}"
    return m.group(1)


def script_of(cluster: SlurmCluster, job: str) -> str:
    return cluster.run("scontrol", "write", "batch_script", job, "-").stdout


def log_entries(work: Path, job: str, state: str = "state") -> list[tuple[str, str, str, str]]:
    """(action, rule, actor, outcome) of the recovery log, read as `jobdiagd recovery-log` does.

    A plain read-only SQLite connection: the daemons of these tests run in this process, where
    opening the file by other means would drop their SQLite locks (`AlertStore.connect_again`)."""
    with contextlib.closing(sqlite3.connect(f"file:{work / state / DB_NAME}?mode=ro", uri=True)) as c:
        rows = c.execute(
            "SELECT action, rule, actor, outcome FROM recovery_log WHERE job_id = ? ORDER BY at, rowid", (job,)
        )
        return [tuple(r) for r in rows]


def log_actions(work: Path, job: str, state: str = "state") -> list[tuple[str, str]]:
    return [(a, r) for a, r, _, _ in log_entries(work, job, state)]


@pytest.fixture
async def jobs(slurm_cluster: SlurmCluster) -> AsyncIterator[list[str]]:
    """Job ids a test made or caused: cancelled at its end (restarts included)."""
    ids: list[str] = []
    yield ids
    restarts = [restart_of(slurm_cluster, j) for j in ids]
    slurm_cluster.scancel(*ids, *(r for r in restarts if r))


async def test_a_hung_job_is_restarted_in_its_thread_and_the_chain_stops_after_three_restarts(
    slurm_cluster: SlurmCluster, short_tmp: Path, tg: TelegramEmulator, jobs: list[str]
) -> None:
    work, outputs = short_tmp, short_tmp / "outputs"
    outputs.mkdir()
    cfg = config(
        work, tg, slurm_cluster, 'mode = "auto"\ncountdown_seconds = 2\nrecurrence_window_seconds = 600'
    )
    d = await start_daemon(cfg, outputs, discover="slurm")
    try:
        # Saves at steps 0 and 3; every run hangs after step 4, so a restart restores step 3, redoes
        # step 4 and hangs: no progress (rule REC-8 counts steps gained past the run it replaces).
        ckpt = ("--checkpoint-period", "3", "--checkpoint-dir", str(outputs / "llama3.1-8b" / "checkpoints"))
        a = submit(slurm_cluster, outputs, "JAX-llama3.1-8b-rec", *ckpt)
        jobs.append(a)

        # The page, then the countdown edited into it, with its Keep button.
        page_a = await until(page_of(tg, a), "job A's hang page")
        counting = await until(
            lambda: "Auto-restart of job" in body(current(tg, page_a)) and current(tg, page_a), "the countdown"
        )
        assert "rule REC-4" in body(counting) and "same nodes: node001" in body(counting)
        assert button(counting, "✋ Keep the job").startswith("keep:")

        # Cancelled and resubmitted with its own script, on the same node, after the countdown.
        b = await until(lambda: restart_of(slurm_cluster, a), "job A's restart", within=60)
        jobs.append(b)
        assert script_of(slurm_cluster, b) == script_of(slurm_cluster, a)
        assert field(slurm_cluster, b, "ReqNodeList") == "node001"
        assert await until(lambda: slurm_cluster.state(a) == "CANCELLED", "job A cancelled")
        # Every action in the thread: who, the rule, the exact commands.
        (done,) = await until(replies_to(tg, page_a, f"restarted as {b}"), "the restart's reply in A's thread")
        assert "jobdiagd (auto)" in body(done) and f"scancel {a}" in body(done) and "sbatch" in body(done)
        assert "rule REC-4" in body(done)
        # A resolves "restarted as B" (not "job ended"); B's restore line is read: said in the thread.
        await until(lambda: "RESOLVED after" in body(current(tg, page_a)), "A's page resolved")
        assert f"restarted as {b}" in body(current(tg, page_a))
        await until(replies_to(tg, page_a, f"restarted as {b}, step 3 restored"), "the continuation line")

        # Node memory suspects node003 meanwhile (an ECC error in some other job, weight 2 > 1.5).
        NodeMemory(d.engine.pipeline.store, half_life_days=3).record(
            "999", [NodeEvidence("node003", "ecc", "ecc-timeout", 2.0, "ECC check timed out")], time.time()
        )

        # B hangs after step 4 too: its page is in A's thread; the recurrence excludes the
        # suspect node, with NCCL_DEBUG=INFO.
        page_b = await until(page_of(tg, b), "job B's hang page")
        assert page_b.reply_to == page_a.message_id
        counting_b = await until(
            lambda: "Auto-restart of job" in body(current(tg, page_b)) and current(tg, page_b), "B's countdown"
        )
        assert "rule REC-5" in body(counting_b) and "exclude: node003" in body(counting_b)
        assert "NCCL_DEBUG=INFO" in body(counting_b)
        c = await until(lambda: restart_of(slurm_cluster, b), "job B's restart", within=60)
        jobs.append(c)
        assert field(slurm_cluster, c, "ExcNodeList") == "node003"
        assert script_of(slurm_cluster, c) == script_of(slurm_cluster, a)

        # C and D hang the same way: no progress in three restarts, so D is left to people.
        d_job = await until(lambda: restart_of(slurm_cluster, c), "job C's restart", within=90)
        jobs.append(d_job)
        page_d = await until(page_of(tg, d_job), "job D's hang page", within=60)
        refused = await until(
            lambda: "No automatic restart" in body(current(tg, page_d)) and current(tg, page_d), "D's refusal"
        )
        assert "no progress in its last 3 restart(s)" in body(refused) and "rule REC-8" in body(refused)
        assert not [data for row in refused.buttons for _, data in row if data.startswith("keep:")]
        assert restart_of(slurm_cluster, d_job) is None
        assert log_actions(work, d_job) == [("decline", "REC-8")]
        assert ("done", "REC-5") in log_actions(work, c)
    finally:
        await d.stop()




async def test_an_ack_or_keep_the_job_during_the_countdown_leaves_the_job_alone(
    slurm_cluster: SlurmCluster, short_tmp: Path, tg: TelegramEmulator, jobs: list[str]
) -> None:
    work, outputs = short_tmp, short_tmp / "outputs"
    outputs.mkdir()
    cfg = config(work, tg, slurm_cluster, 'mode = "auto"\ncountdown_seconds = 120')
    d = await start_daemon(cfg, outputs, discover="slurm")
    try:
        acked, kept = submit(slurm_cluster, outputs, "JAX-llama3.1-8b-ack"), submit(slurm_cluster, outputs, "JAX-x-keep")
        jobs += [acked, kept]
        counting = {}
        for job in (acked, kept):
            page = await until(page_of(tg, job), f"job {job}'s hang page")
            counting[job] = await until(
                lambda page=page: "Auto-restart of job" in body(current(tg, page)) and current(tg, page),
                f"job {job}'s countdown",
            )
        # `jobdiagd status` lists both countdowns.
        snap = (await asyncio.to_thread(status, cfg))["status"]["recovery"]
        assert sorted((p["job_id"], p["status"]) for p in snap["pending"]) == sorted(
            [(acked, "scheduled"), (kept, "scheduled")]
        )
        assert "recovery (auto): 2 pending" in format_status((await asyncio.to_thread(status, cfg))["status"], time.time())

        # An ack cancels one (rule REC-9), Keep the job the other (rule REC-14): the messages say so.
        q1 = await tg.press(CHAT, counting[acked].message_id, ALICE, button(counting[acked], "✔ Ack"), name="alice")
        q2 = await tg.press(
            CHAT, counting[kept].message_id, ALICE, button(counting[kept], "✋ Keep the job"), name="alice"
        )
        assert "Kept" in (await until(lambda: tg.answer_for(q2), "Keep answered"))["text"]
        await until(lambda: tg.answer_for(q1), "Ack answered")
        for job, why in ((acked, "acked by alice"), (kept, "kept by alice")):
            m = await until(
                lambda job=job, why=why: f"cancelled: {why}" in body(current(tg, counting[job]))
                and current(tg, counting[job]),
                f"job {job}'s message: restart cancelled",
            )
            assert not [data for row in m.buttons for _, data in row if data.startswith("keep:")]
        assert log_actions(work, acked)[-1] == ("keep", "REC-9")
        assert log_actions(work, kept)[-1] == ("keep", "REC-14")
        snap = (await asyncio.to_thread(status, cfg))["status"]["recovery"]
        assert snap["pending"] == []
        # Nothing restarted: both still run, no job carries their restart marker.
        assert {slurm_cluster.state(acked), slurm_cluster.state(kept)} == {"RUNNING"}
        assert restart_of(slurm_cluster, acked) is None and restart_of(slurm_cluster, kept) is None
    finally:
        await d.stop()


async def test_a_suggested_restart_waits_for_an_operator_and_refuses_others(
    slurm_cluster: SlurmCluster, short_tmp: Path, tg: TelegramEmulator, jobs: list[str]
) -> None:
    work, outputs = short_tmp, short_tmp / "outputs"
    outputs.mkdir()
    cfg = config(work, tg, slurm_cluster, 'mode = "suggest"')
    d = await start_daemon(cfg, outputs, discover="slurm")
    try:
        job = submit(slurm_cluster, outputs, "JAX-llama3.1-8b-sug")
        jobs.append(job)
        page = await until(page_of(tg, job), "the hang page")
        suggested = await until(
            lambda: "Suggested: restart job" in body(current(tg, page)) and current(tg, page), "the suggestion"
        )
        restart = button(suggested, "♻ Restart")
        # alice may use the bot but is neither an operator nor, by [recovery] chat_users, the owner.
        q = await tg.press(CHAT, page.message_id, ALICE, restart, name="alice")
        refused = await until(lambda: tg.answer_for(q), "alice's press answered")
        assert refused["show_alert"] and "Only the job's owner or an operator" in refused["text"]
        assert log_actions(work, job)[-1] == ("approve", "REC-14") and restart_of(slurm_cluster, job) is None
        q = await tg.press(CHAT, page.message_id, OPERATOR, restart, name="olga")
        assert "approved by olga" in (await until(lambda: tg.answer_for(q), "olga's press answered"))["text"]
        new = await until(lambda: restart_of(slurm_cluster, job), "the restart", within=60)
        jobs.append(new)
        (done,) = await until(replies_to(tg, page, f"restarted as {new}"), "the restart's reply")
        assert "olga · cancel · rule REC-4" in body(done) and f"scancel {job}" in body(done)
        # /help names the recovery buttons where recovery can act (and /nodes).
        cmd = await tg.send_command(CHAT, ALICE, "/help")
        (helped,) = await until(lambda: [m for m in tg.bot_messages(CHAT) if m.reply_to == cmd], "/help")
        assert "Restart" in body(helped) and "Keep the job" in body(helped) and "/nodes" in body(helped)
    finally:
        await d.stop()


async def test_node_memory_across_three_jobs_notices_once_and_drain_is_for_operators(
    slurm_cluster: SlurmCluster, short_tmp: Path, tg: TelegramEmulator
) -> None:
    """Three jobs fail on node002 (NODE_EXIT, a node-fail: weight 2 each); past the notice score
    (5.5 here) operators get one notice, with the scontrol line and a Drain button that only they
    may press, and /nodes lists the node with its three jobs. Node memory runs with recovery off."""
    work, outputs = short_tmp, short_tmp / "outputs"
    outputs.mkdir()
    node = "node002"  # DOWN, never scheduled on: draining it disturbs nobody (not the node other tests drain)
    cfg = config(work, tg, slurm_cluster, "node_notice_score = 5.5")
    d = await start_daemon(cfg, outputs)  # outputs discovery: logs only, no Slurm job
    try:
        for k in range(3):
            job = JobLog(outputs, f"880{k}", f"JAX-llama3.1-8b-node{k}", nnodes=2)
            for step in range(3):
                job.step(step, seconds=0.2)
            job.task(1, f"srun: error: Node failure on {node}")
            job.task(1, f"NODE_EXIT host={node} exit=1")
            await until(
                lambda k=k: [m for m in tg.bot_messages(CHAT) if body(m).startswith(f"🔴 failure on job 880{k}")],
                f"job 880{k}'s failure page",
            )
        notice = await until(
            lambda: next((m for m in tg.bot_messages(CHAT) if body(m).startswith(f"suspect node: {node}")), None),
            "the suspect-node notice",
        )
        assert f"{node} in 3 node-fail of 3 job(s)" in body(notice)
        assert f"scontrol update NodeName={node} State=DRAIN" in body(notice)
        drain = button(notice, f"⛔ Drain {node}")
        assert drain == f"drain:@{node}"

        q = await tg.press(CHAT, notice.message_id, ALICE, drain, name="alice")
        assert "Only operators" in (await until(lambda: tg.answer_for(q), "alice's press answered"))["text"]
        assert "DRAIN" not in slurm_cluster.run("scontrol", "show", "node", node).stdout
        q = await tg.press(CHAT, notice.message_id, OPERATOR, drain, name="olga")
        assert f"Confirm: drain {node}?" in (await until(lambda: tg.answer_for(q), "the ask"))["text"]
        confirm = await until(lambda: [b for row in current(tg, notice).buttons for b in row if b[1].startswith("drain_yes")], "confirmation")
        q = await tg.press(CHAT, notice.message_id, OPERATOR, confirm[0][1], name="olga")
        said = (await until(lambda: tg.answer_for(q), "the drain answered", within=30))["text"]
        assert said.startswith(f"scontrol update NodeName={node} State=DRAIN") and said.endswith("requested by olga")
        shown = slurm_cluster.run("scontrol", "show", "node", node).stdout
        assert "DRAIN" in shown and "Reason=jobdiagd: in 3 node-fail of 3 job(s)" in shown
        assert [(actor, outcome) for _, _, actor, outcome in log_entries(work, f"node:{node}")] == [
            ("alice", "refused: not an operator"),
            ("olga", f"{node} drained"),
        ]

        cmd = await tg.send_command(CHAT, ALICE, "/nodes")
        (answer,) = await until(lambda: [m for m in tg.bot_messages(CHAT) if m.reply_to == cmd], "/nodes answered")
        assert "1 suspect node(s)" in body(answer) and f"{node}  score 6.00" in body(answer)
        assert all(f"job 880{k}" in body(answer) for k in range(3))
    finally:
        slurm_cluster.run("scontrol", "update", f"NodeName={node}", "State=UNDRAIN", check=False)
        await d.stop()


async def test_two_daemons_make_one_resubmission(
    slurm_cluster: SlurmCluster, short_tmp: Path, jobs: list[str]
) -> None:
    """An HA pair: both daemons page the hang, both count down, both restart; Slurm is the lock
    (rule REC-12), so there is one new job, and both record it as the restart."""
    work, outputs = short_tmp, short_tmp / "outputs"
    outputs.mkdir()
    auto = 'mode = "auto"\ncountdown_seconds = 1'
    daemons = [
        await start_daemon(config(work, None, slurm_cluster, auto, state=name), outputs, discover="slurm")
        for name in ("one", "two")
    ]
    try:
        job = submit(slurm_cluster, outputs, "JAX-llama3.1-8b-ha")
        jobs.append(job)
        for name in ("one", "two"):
            await until(
                lambda name=name: ("done", "REC-4") in log_actions(work, job, name), f"daemon {name} done", within=90
            )
        out = slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%i|%T|%k").stdout
        rows = [ln.split("|", 2) for ln in out.splitlines()]
        markers = {r[0]: r[1] for r in rows if len(r) == 3 and parse_restart_marker(r[2]) == job}
        jobs.extend(markers)
        live = [j for j, state in markers.items() if not state.startswith("CANCELLED")]
        assert len(live) == 1, markers  # both may have submitted (held): the higher id withdrew itself
        await until(lambda: slurm_cluster.state(live[0]) == "RUNNING", "the one restart running")
        actions = [a for name in ("one", "two") for a, _ in log_actions(work, job, name)]
        assert actions.count("submit") - actions.count("withdraw") == 1, actions
        assert actions.count("done") == 2
    finally:
        for d in daemons:
            await d.stop()


def test_a_kill_9_between_cancel_and_submit_neither_loses_nor_doubles_the_restart(
    slurm_cluster: SlurmCluster, short_tmp: Path, jobs: list[str], procs: list[subprocess.Popen[bytes]]
) -> None:
    """The real `jobdiagd run`, SIGKILLed while its sbatch hangs (after the cancel, before the
    submit): the intent is left `running`; the restarted daemon resumes it and submits once."""
    work, outputs = short_tmp, short_tmp / "outputs"
    outputs.mkdir()
    cfg = config(work, None, slurm_cluster, 'mode = "auto"\ncountdown_seconds = 1')
    bin_dir = work / "bin"
    bin_dir.mkdir()
    stuck = bin_dir / "sbatch"  # first on the daemon's PATH: it never submits, it only waits
    stuck.write_text(f'#!/bin/sh\ntouch "{work}/sbatch-called"\nexec sleep 300\n')
    stuck.chmod(0o755)

    def run(path: str) -> subprocess.Popen[bytes]:
        env = dict(slurm_cluster.env, PATH=path)
        with open(work / "daemon.out", "ab") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "jobdiagd.cli", "run", "--config", str(cfg), "--discover", "slurm"],
                stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        procs.append(proc)
        return proc

    first = run(f"{bin_dir}:{os.environ['PATH']}")
    job = submit(slurm_cluster, outputs, "JAX-llama3.1-8b-kill")
    jobs.append(job)
    wait_for(lambda: (work / "sbatch-called").exists(), "the daemon's sbatch", timeout=90)
    assert slurm_cluster.wait_state(job, ["CANCELLED"]) == "CANCELLED"
    os.killpg(first.pid, signal.SIGKILL)  # the daemon and its stuck sbatch
    first.wait(timeout=10)
    assert restart_of(slurm_cluster, job) is None
    assert log_actions(work, job) == [("plan-auto", "REC-4"), ("restart", "REC-4"), ("cancel", "REC-4")]

    second = run(os.environ["PATH"])
    wait_for(lambda: restart_of(slurm_cluster, job) is not None, "the resumed restart", timeout=90)
    new = restart_of(slurm_cluster, job)
    assert new is not None
    jobs.append(new)
    wait_for(lambda: ("done", "REC-4") in log_actions(work, job), "the intent done")
    actions = [a for a, _ in log_actions(work, job)]
    assert actions.count("submit") == 1 and actions.count("cancel") == 1, actions
    markers = slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%i|%k").stdout
    assert [ln.split("|")[0] for ln in markers.splitlines() if parse_restart_marker(ln.split("|", 1)[1]) == job] == [new]
    wait_for(lambda: slurm_cluster.state(new) == "RUNNING", "the restart running")
    assert stop(second) == 0, (work / "daemon.out").read_text()[-3000:]


async def test_slack_a_suspect_node_notice_carries_drain_for_operators_only(
    short_tmp: Path, slack: SlackEmulator
) -> None:
    """The Slack variant: the notice's Drain button (refused for a user who is no operator; an
    operator gets the confirmation and may step back) and `/jobdiagd nodes`."""
    outputs = short_tmp / "outputs"
    cfg = slack_daemon_config(short_tmp, slack, extra="[recovery]\nnode_notice_score = 3.5\n")
    d = await start_daemon(cfg, outputs)
    try:
        for k in range(2):
            job = JobLog(outputs, f"890{k}", f"JAX-llama3.1-8b-sl{k}")
            for step in range(3):
                job.step(step, seconds=0.2)
            job.task(1, "srun: error: Node failure on node002")
            job.task(1, "NODE_EXIT host=node002 exit=1")
        notice = await until(
            lambda: next((m for m in slack.bot_messages(SLACK_CHAN) if "suspect node: node002" in m.visible), None),
            "the notice",
        )
        assert notice.labels == ["⛔ Drain node002…"] and "State=DRAIN" in notice.visible
        await slack.press(SLACK_CHAN, notice.ts, SLACK_ALICE, notice.value_of("⛔ Drain node002…"))
        await until(lambda: any("Only operators" in e.visible for e in slack.ephemerals_for(SLACK_ALICE)), "refusal")
        await slack.press(SLACK_CHAN, notice.ts, SLACK_OPERATOR, notice.value_of("⛔ Drain node002…"))
        confirm = await until(
            lambda: "⛔ Yes, drain node002" in slack.messages[(SLACK_CHAN, notice.ts)].labels
            and slack.messages[(SLACK_CHAN, notice.ts)],
            "the confirmation",
        )
        await slack.press(SLACK_CHAN, notice.ts, SLACK_OPERATOR, confirm.value_of("Not now"))
        await until(
            lambda: slack.messages[(SLACK_CHAN, notice.ts)].labels == ["⛔ Drain node002…"], "the button back"
        )
        seen = {m.ts for m in slack.bot_messages(SLACK_CHAN)}
        await slack.slash(SLACK_CHAN, SLACK_ALICE, "nodes")
        (answer,) = await until(
            lambda: [m for m in slack.bot_messages(SLACK_CHAN) if m.ts not in seen and m.thread_ts is None],
            "/jobdiagd nodes answered",
        )
        assert "node002  score 4.00" in answer.visible and "job 8901" in answer.visible
    finally:
        await d.stop()
