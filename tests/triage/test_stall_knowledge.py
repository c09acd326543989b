"""Triage given the daemon's knowledge of a live job's progress (rule VIEW-1): pure, on a fake clock.

The daemon read the job's last step at `READ`; its hang detector applies a 5 s budget (a tuned
`min_stall_seconds`). Triage told so concludes what the page says, before and after the
built-in policy's 120 s budget would have flipped its own answer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd.durations import exact_duration
from jobdiagd.logs.job import JobLogs
from jobdiagd.logs.state import LogState
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.kinds import StallPhase
from jobdiagd.model.triage import StallKnowledge, TriageResult
from jobdiagd.triage.classes import NEXT_STEPS as TEMPLATES
from jobdiagd.triage.engine import analyze
from jobdiagd.triage.report import render_markdown, what_happened
from jobdiagd.triage.stall import StallPolicy
from jobdiagd_sim import lines as L

T0 = 1_780_000_000.0
READ = T0 + 80.0  # when the daemon read step 7 (its line is stamped T0 + 80 too)
DAEMON = StallPolicy(min_stall_s=5.0, startup_s=60.0)
BUDGET = StallKnowledge(READ, 5.0, StallPhase.STEADY)
REF = JobRef("7001", "JAX-t", None, Path("/x/7001-JAX-t.log"), "slurm")


def _logs(*, dated: bool = True, tail: tuple[str, ...] = ()) -> JobLogs:
    """A job that trained steps 0..7 (10 s each, the last at READ) and then went silent."""
    state = LogState(str(REF.log), ref_time=T0)
    lines = L.header_lines(
        job_id="7001",
        name="JAX-t",
        nnodes=2,
        nodelist="node[001-002]",
        jax_port=1,
        ray_port=None,
        passthrough={"steps": 1000},
        model="m",
    )
    for k in range(8):
        f = L.StepFields(step=k, seconds=10.0, tflops=1.0, tokens=3000.0, total_weights=1, loss=1.0)
        stamp = L.absl_prefix(T0 + 10.0 * (k + 1), 4242, "metric_logger.py:232") if dated else ""
        lines += [f"{r}: {stamp}{L.step_line(f)}" for r in (0, 1)]
    for n, ln in enumerate([*lines, *tail], 1):
        state.feed(ln, n)
    return JobLogs(ref=REF, main=state)


def _says(r: TriageResult) -> tuple[str, str | None]:
    return str(r.status), r.primary


@pytest.mark.parametrize("slurm", ["RUNNING", None])
@pytest.mark.parametrize("after", [10.0, 150.0])
def test_a_stall_past_the_daemons_budget_is_hanging_with_that_budget(slurm: str | None, after: float) -> None:
    now = READ + after
    r = analyze(_logs(), now=now, slurm_state=slurm, policy=DAEMON, stall=BUDGET)
    assert _says(r) == ("hanging", "hang") and r.cls.stage == "Training"
    st = r.cls.stall
    assert st is not None and (st.basis, st.stalled, st.gap_s, st.budget_s) == (
        "daemon-clock",
        True,
        after,
        5.0,
    )
    assert "budget 5s, phase steady" in what_happened(r)
    report = render_markdown(r)
    assert "**Status:** hanging" in report and "**Primary failure:** hang" in report
    assert (
        f"| No step for (daemon's clock) | {exact_duration(after)} since step 7 was read — budget 5s, phase steady: stalled |"
        in report
    )
    # Next steps are the hang's from the start (nothing patched afterwards), a live job's: scancel
    # first (the RAY=1 dashboard step does not apply to this RAY=0 job).
    assert (
        r.next_steps[0] == "Kill the job: scancel 7001."
        and "Kill the job: scancel {job_id}." in TEMPLATES["hang"]
    )


def test_without_the_daemons_knowledge_the_log_alone_contradicts_the_page() -> None:
    """What Full triage said before it was told (the contradiction the knowledge removes)."""
    cli = StallPolicy()  # the command's built-in policy: min stall 120 s
    assert _says(analyze(_logs(), now=READ + 10, slurm_state="RUNNING", policy=cli)) == ("running", None)
    assert _says(analyze(_logs(), now=READ + 150, slurm_state=None, policy=cli)) == (
        "unknown-death",
        "unknown-death",
    )
    # Told, the same answers agree with the page whatever the policy says.
    for now, slurm in ((READ + 10, "RUNNING"), (READ + 150, None)):
        assert _says(analyze(_logs(), now=now, slurm_state=slurm, policy=cli, stall=BUDGET)) == (
            "hanging",
            "hang",
        )


def test_within_the_budget_a_watched_job_is_running_even_without_slurm_or_stamps() -> None:
    r = analyze(_logs(dated=False), now=READ + 3, slurm_state=None, policy=DAEMON, stall=BUDGET)
    assert _says(r) == ("running", None) and r.next_steps == []
    st = r.cls.stall
    assert st is not None and (st.basis, st.stalled, st.gap_s) == ("daemon-clock", False, 3.0)
    assert (
        "| No step for (daemon's clock) | 3s since step 7 was read — budget 5s, phase steady: within budget |"
        in (render_markdown(r))
    )
    # The same undated log without the knowledge and without Slurm: dead, as the runbook reads it.
    assert _says(analyze(_logs(dated=False), now=READ + 3, policy=DAEMON)) == (
        "unknown-death",
        "unknown-death",
    )


def test_a_gpu_confirmed_page_is_hanging_before_the_budget_runs_out() -> None:
    known = StallKnowledge(READ, 180.0, StallPhase.STEADY, gpu_confirmed=True)
    r = analyze(_logs(), now=READ + 40, slurm_state="RUNNING", policy=DAEMON, stall=known)
    assert _says(r) == ("hanging", "hang")
    assert "budget 3m 0s, phase steady; GPU-confirmed before it ran out" in what_happened(r)


def test_slurms_end_and_the_job_summary_outrank_the_daemons_clock() -> None:
    """The knowledge speaks of a live job only: an ended job keeps the log's and Slurm's answer."""
    ended = analyze(_logs(), now=READ + 150, slurm_state="COMPLETED", policy=DAEMON, stall=BUDGET)
    assert ended.status == "unknown-death" and ended.cls.stall is not None
    assert ended.cls.stall.basis != "daemon-clock"
    summary = L.job_summary(job_id="7001", name="JAX-t", model="m", nnodes=2, wall=600, rc=0)
    done = analyze(
        _logs(tail=tuple(summary)), now=READ + 150, slurm_state="RUNNING", policy=DAEMON, stall=BUDGET
    )
    assert done.status == "completed"


def test_a_failure_signature_stays_primary_on_a_stalled_job() -> None:
    """The daemon's clock decides running or hanging, never the root cause the log names."""
    oom = ("0: " + L.absl_prefix(READ + 2, 4242, "train.py:1") + L.xla_oom(2**34),)
    r = analyze(_logs(tail=oom), now=READ + 30, slurm_state="RUNNING", policy=DAEMON, stall=BUDGET)
    assert r.status == "hanging" and r.primary == "oom-gpu"
