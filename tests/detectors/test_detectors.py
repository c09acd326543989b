"""Detectors as pure functions of (JobView, now): hang phases, TGS episodes, failure cascades, registry."""

from __future__ import annotations

from pathlib import Path

from jobdiagd.config import loads
from jobdiagd.detectors import NoData, build, registered
from jobdiagd.detectors.failure import FailureSignatureDetector
from jobdiagd.detectors.hang import MAX_FIRST_BUDGETS, EarlyRule, HangDetector
from jobdiagd.detectors.jobend import JobEndDetector
from jobdiagd.detectors.tgs import TgsDetector
from jobdiagd.logs.state import LogState
from jobdiagd.model.alerts import Finding
from jobdiagd.model.jobref import JobRef
from jobdiagd.service.jobs import JobView
from jobdiagd.triage.progress import checkpoint_config
from jobdiagd.triage.stall import StallPolicy
from jobdiagd_sim import lines as L

POLICY = StallPolicy(stall_factor=3.0, min_stall_s=120.0, startup_s=1800.0, checkpoint_s=600.0)
T0 = 1_780_000_000.0


class Live:
    """A job view fed line by line, with the daemon clock advanced by hand."""

    def __init__(self, *, steps: int = 1000, checkpoint_period: int | None = None) -> None:
        self.state = LogState("/x/7001-JAX-t.log", ref_time=T0)
        ref = JobRef("7001", "JAX-t", None, Path("/x/7001-JAX-t.log"), "slurm")
        self.view = JobView(key="7001", ref=ref, first_seen=T0, main=self.state, policy=POLICY)
        self.n = 0
        pt: dict[str, object] = {"steps": steps}
        if checkpoint_period:
            pt.update(enable_checkpointing=True, checkpoint_period=checkpoint_period)
        for ln in L.header_lines(
            job_id="7001",
            name="JAX-t",
            nnodes=2,
            nodelist="node[001-002]",
            jax_port=1,
            ray_port=None,
            passthrough=pt,
            model="m",
        ):
            self.feed(ln, T0)

    def feed(self, text: str, now: float) -> None:
        self.n += 1
        self.state.feed(text, self.n)
        self.view.note_read(now)

    def step(self, k: int, now: float, seconds: float = 10.0, tokens: float = 3000.0) -> None:
        f = L.StepFields(step=k, seconds=seconds, tflops=1.0, tokens=tokens, total_weights=1, loss=1.0)
        self.feed("0: " + L.absl_prefix(now, 4242, "metric_logger.py:232") + L.step_line(f), now)


def only(out: object) -> Finding:
    assert not isinstance(out, NoData) and isinstance(out, list | tuple)
    assert len(out) == 1
    f = out[0]
    assert isinstance(f, Finding)
    return f


def test_healthy_job_never_pages_and_a_stall_pages_after_the_budget() -> None:
    job = Live()
    det = HangDetector(POLICY)
    t = T0
    for k in range(40):  # 10 s steps: steady budget = max(3 x 10, 120) = 120 s
        t += 10.0
        job.step(k, t)
        for dt in (0.0, 5.0, 9.9):
            f = only(det.check(job.view, t + dt))
            assert f.resolved  # never an open finding on a healthy job
    last_read = t
    assert only(det.check(job.view, last_read + 119.0)).resolved
    f = only(det.check(job.view, last_read + 121.0))
    assert not f.resolved and f.kind == "hang" and f.severity == "critical" and f.at_step == 39
    assert f.details["phase"] == "steady" and f.details["status"] == "hanging"
    assert f.details["primary failure"] == "hang"
    assert f.details["expected step"] == 39 + 12
    assert "collective hang" in str(f.details["triage"]) or "hang" in str(f.details["triage"])
    # Chatter without steps (mtime fresh) changes nothing; a new step resolves.
    job.feed("0: node001:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read", last_read + 130)
    assert not only(det.check(job.view, last_read + 131)).resolved
    job.step(40, last_read + 200.0)
    r = only(det.check(job.view, last_read + 201.0))
    assert r.resolved and r.at_step == 40 and r.summary == "steps resumed at step 40"


def test_first_budgets_of_many_fresh_jobs_spread_over_ticks_with_the_same_findings() -> None:
    """After a start with many jobs, a tick computes at most MAX_FIRST_BUDGETS first budgets of
    jobs that cannot be stalled yet; what it answers for the others is what their budget says."""
    jobs = [Live() for _ in range(MAX_FIRST_BUDGETS + 20)]
    for i, job in enumerate(jobs):
        job.view.key = f"70{i:02d}"
        for k in range(30):
            job.step(k, T0 + 10.0 * (k + 1))
    now = T0 + 300.0 + 60.0  # 60 s since the last step: within any budget
    det, ref = HangDetector(POLICY), HangDetector(POLICY, first_budgets=len(jobs))
    for tick in range(3):
        at = now + tick
        for job in jobs:
            assert det.check(job.view, at) == ref.check(job.view, at)
        primed = sum(det.budget_state(j.view.key) is not None for j in jobs)
        assert primed == min(len(jobs), MAX_FIRST_BUDGETS * (tick + 1))
        assert all(ref.budget_state(j.view.key) is not None for j in jobs)
    # A job that may be stalled gets its budget at once, the ration spent or not.
    late = Live()
    late.view.key = "7999"
    late.step(0, T0 + 10.0)
    busy = HangDetector(POLICY)
    for job in jobs:
        busy.check(job.view, now)
    f = only(busy.check(late.view, T0 + 10.0 + 2000.0))
    assert not f.resolved and busy.budget_state("7999") is not None
    # A RAY=1 job the early page may ask about is never deferred (it needs the step time).
    ray = Live()
    ray.view.key = "7998"
    ray.feed("RAY=1", T0)
    ray.step(0, T0 + 10.0)
    early = HangDetector(POLICY, EarlyRule())
    for job in jobs:
        early.check(job.view, now)
    assert ray.view.is_ray()
    early.check(ray.view, T0 + 20.0)
    assert early.budget_state("7998") is not None


def test_startup_budget_before_the_first_step_and_warmup_after_it() -> None:
    job = Live()
    det = HangDetector(POLICY)
    assert det.check(job.view, T0 + 1799) == []
    f = only(det.check(job.view, T0 + 1801))
    assert f.details["phase"] == "startup" and f.at_step is None
    job.step(0, T0 + 1850, seconds=60.0)
    # Warmup is learned from the run: 3 x the only step so far (60 s, compilation included),
    # at least twice it and 120 s -- not the 30-min startup budget any more.
    assert only(det.check(job.view, T0 + 1850 + 170)).resolved
    f = only(det.check(job.view, T0 + 1850 + 190))
    assert not f.resolved and f.details["phase"] == "warmup" and f.at_step == 0


def test_warmup_allows_a_second_compilation_as_long_as_the_first() -> None:
    job = Live()
    det = HangDetector(POLICY)
    job.step(0, T0 + 900, seconds=600.0)  # a 10-min compile inside step 0
    assert only(det.check(job.view, T0 + 900 + 1750)).resolved  # step 1 may recompile
    assert not only(det.check(job.view, T0 + 900 + 1850)).resolved


def test_the_initial_save_teaches_nothing_about_the_periodic_saves() -> None:
    job = Live(checkpoint_period=20)
    det = HangDetector(POLICY)
    t = T0
    for k in range(20):  # step 1 carries the initial save at step 0: 200 s; step 20 saves again
        t += 200.0 if k == 1 else 10.0
        job.step(k, t, seconds=200.0 if k == 1 else 10.0)
        if k == 0:
            job.feed(
                "0: " + L.absl_prefix(t, 4242, "checkpointing.py:80") + "Saved a checkpoint at step 0.", t
            )
    # Rule HANG-4: a save's budget is never learned down from the configured 600 s (1.5 x the
    # initial save's 200 s, 300 s, paged healthy jobs whose first periodic save blocked longer).
    assert only(det.check(job.view, t + 590)).resolved
    f = only(det.check(job.view, t + 601))
    assert not f.resolved and f.details["phase"] == "checkpoint" and f.details["budget"] == "10m 0s"


def test_checkpoint_step_budget_is_extended_by_this_jobs_own_slow_saves() -> None:
    job = Live(checkpoint_period=20)
    det = HangDetector(POLICY)
    t = T0
    for k in range(40):  # the save at step 20 blocked step 21 for 500 s; step 40 saves again
        s = 500.0 if k == 21 else 10.0
        t += s
        job.step(k, t, seconds=s)
    # Learned: 1.5 x the slowest periodic save this run has shown = 750 s, over the configured 600 s.
    assert only(det.check(job.view, t + 740)).resolved
    f = only(det.check(job.view, t + 751))
    assert not f.resolved and f.details["phase"] == "checkpoint" and f.details["budget"] == "12m 30s"


def test_a_hang_during_a_save_pages_once_the_checkpoint_budget_is_over() -> None:
    # Saves of 45 s shown (steps 21 and 41): the next save may take longer on a busy filesystem,
    # so the wait for step 61 gets the configured 600 s -- and a hang there pages right after it.
    job = Live(checkpoint_period=20)
    det = HangDetector(POLICY)
    t = T0
    for k in range(61):
        s = 45.0 if k in (21, 41) else 10.0
        t += s
        job.step(k, t, seconds=s)
    assert only(det.check(job.view, t + POLICY.checkpoint_s - 1)).resolved
    f = only(det.check(job.view, t + POLICY.checkpoint_s + 1))
    assert not f.resolved and f.at_step == 60
    assert f.details["phase"] == "checkpoint" and f.details["budget"] == "10m 0s"


def test_a_normal_step_1_is_not_taken_for_the_save_budget() -> None:
    # Step 1 sits on the period's grid but no save happened at step 0: the first real save
    # (step 20 -> step 21) gets the configured checkpoint budget, not 1.5 x a normal step.
    job = Live(checkpoint_period=20)
    det = HangDetector(POLICY)
    t = T0
    for k in range(21):
        t += 10.0
        job.step(k, t)
    assert only(det.check(job.view, t + POLICY.checkpoint_s - 10)).resolved
    f = only(det.check(job.view, t + POLICY.checkpoint_s + 10))
    assert not f.resolved
    assert f.details["phase"] == "checkpoint"


def test_the_step_after_the_slow_post_save_step_has_the_normal_budget() -> None:
    job = Live(checkpoint_period=20)
    det = HangDetector(POLICY)
    t = T0
    for k in range(23):  # steps 20, 21 slowed by the save; 22 is normal again
        s = 200.0 if k == 21 else 10.0
        t += s
        job.step(k, t, seconds=s)
    f = only(det.check(job.view, t + 130))
    assert f.details["phase"] == "steady"


def test_eval_and_profiler_steps_are_expected_to_be_slow() -> None:
    ck = checkpoint_config(
        {
            "eval_interval": "100",
            "profiler": "xplane",
            "skip_first_n_steps_for_profiler": "50",
            "profiler_steps": "5",
        },
        {},
        [],
    )
    assert ck.adjacent(100) and ck.adjacent(101) and not ck.adjacent(102)
    assert all(ck.adjacent(s) for s in range(50, 57)) and not ck.adjacent(57)


def test_async_save_lines_make_the_second_step_after_a_save_slow_too() -> None:
    ck = checkpoint_config(
        {"enable_checkpointing": "true", "checkpoint_period": "50"}, {}, [50], async_seen=True
    )
    assert ck.asynchronous and ck.adjacent(52) and not ck.adjacent(53)


def test_the_learned_budget_counts_time_the_step_seconds_do_not(tmp_path: Path) -> None:
    # Evals every 100 steps take 300 s of wall time that the step's own `seconds` leave out;
    # the dated step lines show it (310 s for step 101), so the next eval gets 1.5 x 310 s.
    job = Live()
    job.state.config["eval_interval"] = "100"
    det = HangDetector(POLICY)
    t = T0
    for k in range(201):
        t += 310.0 if k == 101 else 10.0
        job.step(k, t)
    assert only(det.check(job.view, t + 455)).resolved
    f = only(det.check(job.view, t + 475))
    assert not f.resolved and f.details["phase"] == "checkpoint"


def test_final_step_reached_is_not_a_hang() -> None:
    job = Live(steps=10)
    t = T0
    for k in range(10):
        t += 10.0
        job.step(k, t)
    out = HangDetector(POLICY).check(job.view, t + 10_000)
    assert isinstance(out, NoData) and "final step" in out.reason


def test_tgs_episode_opens_once_with_pattern_and_resolves_with_hysteresis() -> None:
    job = Live()
    det = TgsDetector(10.0)
    t = T0
    opened = []
    for k in range(80):
        t += 10.0
        tokens = 3000.0 if k < 40 else 2400.0  # -20% from step 40
        job.step(k, t, tokens=tokens)
        out = det.check(job.view, t)
        if not isinstance(out, NoData) and out and not out[0].resolved:
            opened.append(k)
    assert opened and opened[0] >= 40
    f = only(det.check(job.view, t))
    assert f.kind == "tgs-degradation" and "-20%" in f.summary and f.details["pattern"] != "none"
    for k in range(80, 110):  # recovery
        t += 10.0
        job.step(k, t, tokens=3000.0)
    assert only(det.check(job.view, t)).resolved


def test_a_level_hovering_near_the_threshold_is_one_tgs_episode() -> None:
    # After a 10000 baseline, throughput runs 20 steps at 8500 then 10 at 9900, repeatedly:
    # the recent 10-step mean keeps crossing the close threshold, the 30-step median does not.
    job = Live()
    det = TgsDetector(10.0)
    t = T0
    opens, is_open = 0, False
    for k in range(160):
        t += 30.0
        tokens = 10000.0 if k < 20 else (8500.0 if (k - 20) % 30 < 20 else 9900.0)
        job.step(k, t, seconds=30.0, tokens=tokens)
        out = det.check(job.view, t)
        if isinstance(out, NoData) or not out:
            continue
        now_open = not out[0].resolved
        opens += now_open and not is_open
        is_open = now_open
    assert opens == 1 and is_open


def test_one_slow_step_is_not_a_tgs_episode() -> None:
    job = Live()
    det = TgsDetector(10.0)
    t = T0
    for k in range(40):
        t += 10.0
        job.step(k, t, tokens=300.0 if k == 34 else 3000.0)  # a recompilation spike
        out = det.check(job.view, t)
        assert isinstance(out, NoData) or all(f.resolved for f in out)  # type: ignore[union-attr]


def test_failure_cascade_is_one_finding_naming_the_root_cause() -> None:
    job = Live()
    t = T0
    for k in range(20):
        t += 10.0
        job.step(k, t)
    det = FailureSignatureDetector()
    assert isinstance(det.check(job.view, t), NoData)
    # Harmless lines are not failures.
    job.feed("1: Failed call to cuInit: UNKNOWN ERROR (303)", t + 1)
    assert isinstance(det.check(job.view, t + 2), NoData)
    job.feed("1: [Node 1 @ node002] oom-kill event: Killed process 4242 (python3) total-vm:1TB", t + 3)
    job.feed("0: node001:1:2 [0] NCCL WARN Timeout waiting for proxy response", t + 40)
    f = only(det.check(job.view, t + 41))
    assert f.kind == "failure" and f.details["root cause"] == "oom-host" == f.failure_class
    assert "nccl-timeout" in str(f.details.get("cascade (also seen)"))
    assert any("oom" in e.lower() or "killed" in e.lower() for e in f.evidence)
    # The hang detector defers to it: one cascade, one incident.
    hang = only(HangDetector(POLICY).check(job.view, t + 500))
    assert hang.resolved and "superseded" in hang.summary


def test_a_survived_error_resolves_when_training_goes_on() -> None:
    job = Live()
    t = T0
    for k in range(10):
        t += 10.0
        job.step(k, t)
    job.feed("0: node001:1:2 [0] NCCL WARN Timeout waiting for proxy response", t + 1)
    det = FailureSignatureDetector()
    f = only(det.check(job.view, t + 2))
    assert not f.resolved
    for k in range(10, 14):
        t += 10.0
        job.step(k, t)
    r = only(det.check(job.view, t + 1))
    assert r.resolved and r.at_step == 13


def test_job_end_reports_the_triage_when_the_job_ended() -> None:
    job = Live()
    det = JobEndDetector()
    assert isinstance(det.check(job.view, T0), NoData)
    job.view.ended = True
    job.view.end_state = "CANCELLED"
    out = det.check(job.view, T0 + 10)
    assert not isinstance(out, NoData)
    (rep,) = out
    assert rep.kind == "job-end" and "## Job triage" in rep.body  # type: ignore[union-attr]


def test_job_end_of_a_job_whose_log_was_never_readable_says_so_instead_of_a_prolog_kill() -> None:
    ref = JobRef("7002", "JAX-t", None, Path("/x/7002-JAX-t/log"), "slurm")
    view = JobView(key="7002", ref=ref, first_seen=T0, policy=POLICY)
    view.blind["/x/7002-JAX-t/log"] = "RefusedFile: not a regular file (a FIFO)"
    view.ended = True
    view.end_state = "CANCELLED"
    out = JobEndDetector().check(view, T0 + 10)
    assert not isinstance(out, NoData)
    (rep,) = out
    assert rep.title == "job 7002 ended: not triaged (its log could not be read)"  # type: ignore[union-attr]
    assert "prolog" not in rep.body and "not a regular file (a FIFO)" in rep.body  # type: ignore[union-attr]


def test_registry_lists_all_detectors_and_config_disables_them() -> None:
    assert [d.name for d in registered()] == ["failure_signature", "hang", "job_end", "tgs"]
    cfg = loads("[detectors.tgs]\nenabled = false\n")
    assert sorted(d.name for d in build(cfg)) == ["failure_signature", "hang", "job_end"]


def test_detectors_cli_lists_defaults_and_config(tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "c.toml"
    cfg.write_text("[detectors.hang]\nenabled = false\n")
    out = subprocess.run(
        [sys.executable, "-m", "jobdiagd.cli", "detectors", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines()[1:]}
    assert rows == {
        "failure_signature": ["on", "yes"],
        "hang": ["on", "no"],
        "job_end": ["on", "yes"],
        "tgs": ["on", "yes"],
    }
