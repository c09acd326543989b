"""One view of a live job (rules VIEW-1 to VIEW-4), in-process on the daemon's clock set by hand.

The engine pages a hang with a tuned 5 s budget; then the chat backend's Full triage (the real
`jobdiagd triage` worker process, told the daemon's view), `/job` and the job view's own analysis
are asked at +10 s and at +150 s after the page — before and after the 120 s the command's
built-in policy would flip its answer at — and must all say what the page says.
"""

from __future__ import annotations

from pathlib import Path

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.alerts.store import DB_NAME
from jobdiagd.config import Config, loads
from jobdiagd.detectors import build
from jobdiagd.detectors.hang import HangDetector
from jobdiagd.service.chat_backend import DaemonChatBackend
from jobdiagd.service.discovery import OutputsDiscovery
from jobdiagd.service.engine import Engine
from jobdiagd.sources.tail import OffsetStore
from jobdiagd.triage.cli import _knowledge, _policy
from jobdiagd.triage.stall import StallPolicy
from tests.helpers.engine import T0, outbox
from tests.helpers.joblog import JobLog

KEY = "7020"


def _cfg(state: Path, min_stall: float) -> Config:
    return loads(
        f"""
[daemon]
state_dir = "{state}"
socket_path = "{state}/s.sock"
tick_seconds = 1
[detectors.hang]
min_stall_seconds = {min_stall}
startup_grace_seconds = 60
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
"""
    )


class _Rig:
    def __init__(self, state: Path, outputs: Path) -> None:
        state.mkdir(parents=True)
        self.cfg = _cfg(state, 5)
        self.pipeline = AlertPipeline.open(state, self.cfg.incidents, ["jsonl"])
        self.offsets = OffsetStore(state / DB_NAME)
        self.engine = Engine(
            self.cfg, self.pipeline, build(self.cfg), OutputsDiscovery([outputs], set()), offsets=self.offsets
        )
        self.now = T0
        self.backend = DaemonChatBackend(
            self.cfg, state / "cfg.toml", self.engine, self.pipeline, lambda: {}, now=lambda: self.now
        )

    async def tick(self, now: float) -> None:
        self.now = now
        assert (await self.engine.tick(now)).ok

    def close(self) -> None:
        self.offsets.close()
        self.pipeline.close()


def _status_lines(markdown: str) -> tuple[str, str]:
    lines = markdown.splitlines()
    return (
        next(ln for ln in lines if ln.startswith("**Status:**")),
        next(ln for ln in lines if ln.startswith("**Primary failure:**")),
    )


async def test_the_page_full_triage_job_and_the_view_agree_before_and_after_120_s(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = JobLog(outputs, KEY)  # undated step lines: only the daemon's clock can time the stall
    rig = _Rig(state, outputs)
    t = T0
    for k in range(8):
        job.step(k, seconds=0.2)
        t += 1.0
        await rig.tick(t)
    read = t
    await rig.tick(read + 3)
    view = rig.engine.jobs[KEY].view
    assert view.analysis(read + 3).status == "running"  # within the 5 s budget
    await rig.tick(read + 6)  # past it: the page
    (page,) = [n for n in outbox(state) if n["event"] == "open"]
    assert page["kind"] == "hang" and "(budget 5s, phase steady)" in page["incident"]["summary"]
    assert "**status**: hanging" in page["body"] and "**primary failure**: hang" in page["body"]
    # The view's cached analysis from +3 s is not served after the stall crossed its budget.
    assert view.analysis(read + 6).status == "hanging"

    answers = {}
    for after in (10.0, 150.0):
        now = read + 6 + after
        await rig.tick(now)
        res = await rig.backend.run_task("triage", (KEY,))
        status, primary = _status_lines(res.markdown)
        assert (status, primary) == ("**Status:** hanging", "**Primary failure:** hang"), res.markdown
        assert "(the daemon's clock: budget 5s, phase steady)" in res.markdown
        shown = rig.backend.job(KEY, now)
        assert shown is not None
        assert "- triage: hanging, primary hang — no step for" in shown.body
        assert "(budget 5s, phase steady)" in shown.body and "incident `" in shown.body
        assert view.analysis(now).status == "hanging"
        answers[after] = (status, primary)
    assert answers[10.0] == answers[150.0]
    rig.close()


async def test_the_triage_worker_gets_the_daemons_policy_and_clock(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = JobLog(outputs, KEY)
    rig = _Rig(state, outputs)
    job.step(0, seconds=0.2)
    await rig.tick(T0 + 1)
    job.step(1, seconds=0.2)
    await rig.tick(T0 + 2)
    path = rig.backend._locate(KEY)
    argv = rig.backend._daemon_view_args(KEY, path, T0 + 4)
    # By id, by the job's own directory or by its log: the same watched job, the same view.
    assert rig.backend._daemon_view_args(path, path, T0 + 4) == argv
    log = str(job.path)
    assert log.endswith(".log") and rig.backend._daemon_view_args(log, log, T0 + 4) == argv
    from jobdiagd.cli import build_parser

    args = build_parser("triage").parse_args(["triage", path, *argv])
    assert args.now == T0 + 4 and args.no_slurm and args.slurm_state is None
    assert _policy(args) == rig.engine.policy == StallPolicy(min_stall_s=5.0, startup_s=60.0)
    known = _knowledge(args)
    assert known == rig.engine.stall_knowledge(KEY, T0 + 4) and known is not None
    assert known.since == T0 + 2  # when step 1 was read, on the daemon's clock
    rig.close()


async def test_slurms_state_is_passed_only_as_squeue_gave_it(short_tmp: Path) -> None:
    from dataclasses import replace

    from jobdiagd.sources.slurm_parse import SlurmJob

    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = JobLog(outputs, KEY)
    rig = _Rig(state, outputs)
    job.step(0, seconds=0.2)
    await rig.tick(T0 + 1)
    view = rig.engine.jobs[KEY].view
    path = rig.backend._locate(KEY)
    view.slurm = SlurmJob(KEY, "JAX-t", "alice", "RUNNING", "debug", start_time=T0)
    argv = rig.backend._daemon_view_args(KEY, path, T0 + 2)
    assert argv[argv.index("--slurm-state") + 1] == "RUNNING" and "--no-slurm" not in argv
    # A state word that is not one (never from a parser, but never passed on either): no claim.
    view.slurm = replace(view.slurm, state="RUNNING --now 0")
    argv = rig.backend._daemon_view_args(KEY, path, T0 + 2)
    assert "--slurm-state" not in argv and "--no-slurm" in argv
    rig.close()


async def test_a_reload_with_a_new_policy_never_serves_a_stale_analysis(short_tmp: Path) -> None:
    state, outputs = short_tmp / "state", short_tmp / "outputs"
    job = JobLog(outputs, KEY)
    rig = _Rig(state, outputs)
    for k in range(8):
        job.step(k, seconds=0.2)
        await rig.tick(T0 + k + 1)
    read = T0 + 8
    await rig.tick(read + 20)
    view = rig.engine.jobs[KEY].view
    assert view.analysis(read + 20).status == "hanging"
    slow = _cfg(state, 300)
    rig.engine.reconfigure(slow, build(slow))
    (hang,) = [d for d in rig.engine.detectors if isinstance(d, HangDetector)]
    assert view.policy == rig.engine.policy == hang.policy and view.policy.min_stall_s == 300
    # Nothing new was read, the cache is young: the new policy alone makes a new analysis.
    res = view.analysis(read + 20)
    assert res.status == "running" and res.cls.stall is not None and res.cls.stall.budget_s == 300
    rig.close()
