"""The hang detector's early page: a GPU-confirmed verdict turns an overdue step into a page before the budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd.alerts.incidents import IncidentBook
from jobdiagd.config import IncidentsConfig
from jobdiagd.detectors import EarlyMemo, NoData, keep_resolution
from jobdiagd.detectors.hang import EARLY_DETAIL, EarlyRule, HangDetector
from jobdiagd.logs.state import LogState
from jobdiagd.model.alerts import Finding
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.kinds import GpuHangState
from jobdiagd.service.jobs import JobView
from jobdiagd.triage.stall import StallPolicy
from jobdiagd.tsdb.gpu_hang import GpuVerdict
from jobdiagd_sim import lines as L

POLICY = StallPolicy(stall_factor=3.0, min_stall_s=120.0, startup_s=1800.0, checkpoint_s=600.0)
RULE = EarlyRule(factor=1.5, slack_s=20.0)
T0 = 1_780_000_000.0
STEP = 10.0
# Steps of 10 s: the early point is 10 + 1.5 x 10 + 20 = 45 s after the last step's read, the budget 120 s.
EARLY_AT = STEP + 1.5 * STEP + 20.0
BUSY = GpuVerdict(GpuHangState.BUSY_WAIT, "every GPU busy-waits", T0)
DEAD = GpuVerdict(
    GpuHangState.DEAD_NODE, "node002 dead", T0, suspects=("node002",), per_host={"node002": "dead"}
)


class Job:
    """A job view fed line by line, the daemon clock advanced by hand."""

    def __init__(self) -> None:
        self.state = LogState("/x/7001-JAX-t.log", ref_time=T0)
        ref = JobRef("7001", "JAX-t", None, Path("/x/7001-JAX-t.log"), "slurm")
        self.view = JobView(key="7001", ref=ref, first_seen=T0, main=self.state, policy=POLICY)
        self.n = 0
        for ln in L.header_lines(
            job_id="7001",
            name="JAX-t",
            nnodes=2,
            nodelist="node[001-002]",
            jax_port=1,
            ray_port=6379,
            passthrough={"steps": 1000},
            model="m",
        ):
            self.feed(ln, T0)

    def feed(self, text: str, now: float) -> None:
        self.n += 1
        self.state.feed(text, self.n)
        self.view.note_read(now)

    def step(self, k: int, now: float) -> None:
        f = L.StepFields(step=k, seconds=STEP, tflops=1.0, tokens=3000.0, total_weights=1, loss=1.0)
        self.feed("0: " + L.absl_prefix(now, 4242, "metric_logger.py:232") + L.step_line(f), now)


def steady(det: HangDetector, steps: int = 30) -> tuple[Job, float]:
    job = Job()
    t = T0
    for k in range(steps):
        t += STEP
        job.step(k, t)
        det.check(job.view, t)
    return job, t


def one(out: object) -> Finding:
    assert not isinstance(out, NoData) and isinstance(out, list) and len(out) == 1
    f = out[0]
    assert isinstance(f, Finding)
    return f


def test_a_confirmed_verdict_pages_at_the_early_point_not_before() -> None:
    det = HangDetector(POLICY, RULE)
    job, last = steady(det)
    assert det.early_due_at(job.view, RULE) == last + EARLY_AT
    job.view.gpu_check = EarlyMemo(29, BUSY, job.view.last_step_at)
    assert one(det.check(job.view, last + EARLY_AT - 1)).resolved
    f = one(det.check(job.view, last + EARLY_AT))
    assert not f.resolved and f.severity == "critical" and f.at_step == 29
    assert f.summary.startswith("GPU-confirmed hang (busy-wait)")
    assert EARLY_DETAIL in f.details and "busy-wait" in str(f.details["mechanism"])
    assert f.gpu_confirmed
    assert f.details["suspect host"] == "none singled out"


def test_a_dead_node_page_names_the_suspect_host() -> None:
    det = HangDetector(POLICY, RULE)
    job, last = steady(det)
    job.view.gpu_check = EarlyMemo(29, DEAD, job.view.last_step_at)
    f = one(det.check(job.view, last + EARLY_AT + 1))
    assert not f.resolved and "Suspect host: node002" in f.summary
    assert f.details["suspect host"] == "node002" and f.details["GPU state per host"] == "node002: dead"


def test_without_confirmation_the_step_budget_decides() -> None:
    det = HangDetector(POLICY, RULE)
    job, last = steady(det)
    job.view.gpu_check = EarlyMemo(29, GpuVerdict(GpuHangState.NOT_A_HANG, "eval", T0), job.view.last_step_at)
    assert one(det.check(job.view, last + 100.0)).resolved
    f = one(det.check(job.view, last + 121.0))
    assert not f.resolved and EARLY_DETAIL not in f.details and not f.gpu_confirmed
    job.view.gpu_check = EarlyMemo(
        29, GpuVerdict(GpuHangState.NO_DATA, "metrics stale", T0), job.view.last_step_at
    )
    assert one(det.check(job.view, last + 100.0)).resolved


def test_a_verdict_of_an_older_step_is_not_evidence() -> None:
    det = HangDetector(POLICY, RULE)
    job, last = steady(det)
    job.view.gpu_check = EarlyMemo(28, BUSY, job.view.last_step_at)
    assert one(det.check(job.view, last + EARLY_AT + 5)).resolved


def test_a_confirmed_page_stays_until_a_new_step() -> None:
    det = HangDetector(POLICY, RULE)
    job, last = steady(det)
    job.view.gpu_check = EarlyMemo(29, BUSY, job.view.last_step_at)
    for dt in (EARLY_AT, 90.0, 130.0, 600.0):  # before and after the step budget
        f = one(det.check(job.view, last + dt))
        assert not f.resolved and EARLY_DETAIL in f.details and f.gpu_confirmed, dt
    job.step(30, last + 700.0)
    f = one(det.check(job.view, last + 700.0))
    assert f.resolved and f.summary == "steps resumed at step 30"


def test_not_armed_during_warmup() -> None:
    det = HangDetector(POLICY, RULE)
    job, last = steady(det, steps=3)  # compilation and the first steps: no steady step time yet
    assert det.early_due_at(job.view, RULE) is None
    job.view.gpu_check = EarlyMemo(2, BUSY, job.view.last_step_at)
    assert one(det.check(job.view, last + 60.0)).resolved


def test_not_armed_when_the_step_budget_comes_first() -> None:
    det = HangDetector(POLICY, EarlyRule(factor=20.0, slack_s=20.0))
    job, _ = steady(det)
    assert det.early_due_at(job.view, EarlyRule(factor=20.0, slack_s=20.0)) is None


def test_disabled_early_page_ignores_the_memo() -> None:
    det = HangDetector(POLICY, None)
    job, last = steady(det)
    job.view.gpu_check = EarlyMemo(29, BUSY, job.view.last_step_at)
    assert one(det.check(job.view, last + EARLY_AT + 5)).resolved


def test_a_page_is_not_taken_back_when_the_rule_changes() -> None:
    """A reload that moves the early point later must not resolve a paged hang as 'steps resumed'.

    A reload builds new detectors (no state: nothing computed under the old rule survives) and
    drops the view's GPU verdict; the new detector's "steps resumed" names no newer step than the
    open incident's, so the incident book never sees it (`keep_resolution`)."""
    det = HangDetector(POLICY, RULE)
    job, last = steady(det)
    job.view.gpu_check = EarlyMemo(29, BUSY, job.view.last_step_at)
    book = IncidentBook.from_config(IncidentsConfig())
    paged = one(det.check(job.view, last + EARLY_AT))
    assert not paged.resolved and EARLY_DETAIL in paged.details
    book.observe_all([paged], last + EARLY_AT)
    job.view.gpu_check = None
    reloaded = HangDetector(POLICY, EarlyRule(factor=1.5, slack_s=60.0))
    f = one(reloaded.check(job.view, last + EARLY_AT + 15))
    assert f.resolved and not keep_resolution(book, f)
    assert book.get("7001", "hang") is not None


def test_a_verdict_of_a_replaced_log_is_not_evidence() -> None:
    """The log was replaced (a restart) and the new run reached the same step number: the old
    run's verdict is about another step."""
    det = HangDetector(POLICY, RULE)
    job, last = steady(det)
    job.view.gpu_check = EarlyMemo(29, BUSY, job.view.last_step_at - 3600.0)
    assert one(det.check(job.view, last + EARLY_AT + 5)).resolved


@pytest.mark.parametrize(
    ("line", "primary"),
    [
        # One task's training process exited right after the last step (a carrier): triage,
        # told the GPU-confirmed stall (rule VIEW-1), names the hang primary, the exit secondary.
        (L.actor_exited(1, "node002", 1), "hang"),
        # A root cause: without GPU evidence the stall stays the failure incident's (one cascade).
        ("[Node 1 @ node002] oom-kill event: Killed process 4242 (python3) total-vm:1TB", "oom-host"),
    ],
    ids=["carrier", "root-cause"],
)
def test_a_failure_signature_does_not_hold_back_a_gpu_confirmed_page(line: str, primary: str) -> None:
    """Rule HANG-7: the others spin in the collective; the GPU-confirmed page comes at the early
    point whatever failure the log showed (it was held back as "superseded" until triage itself
    called the job hanging, at the step budget or later)."""
    det = HangDetector(POLICY, RULE)
    job, last = steady(det)
    job.feed("1: " + line, last + 1.0)
    job.view.gpu_check = EarlyMemo(29, BUSY, job.view.last_step_at)
    f = one(det.check(job.view, last + EARLY_AT))
    assert not f.resolved and f.summary.startswith("GPU-confirmed hang (busy-wait)")
    assert f.details["primary failure"] == primary and EARLY_DETAIL in f.details and f.gpu_confirmed


def test_without_gpu_evidence_a_root_cause_still_supersedes_the_stall() -> None:
    det = HangDetector(POLICY, RULE)
    job, last = steady(det)
    job.feed("1: [Node 1 @ node002] oom-kill event: Killed process 4242 (python3) total-vm:1TB", last + 1.0)
    f = one(det.check(job.view, last + 121.0))
    assert f.resolved and f.summary.startswith("superseded: the stall is a consequence of oom-host")


def test_a_site_prometheus_arms_the_early_page_of_every_job_slurm_placed() -> None:
    """The first budget of a job an early page may ask about is never put off (`MAX_FIRST_BUDGETS`):
    a RAY=1 job (its own Prometheus) and, with [site_prometheus], any job whose nodes Slurm names."""
    from jobdiagd.sources.slurm_parse import SlurmJob

    def view(ray: bool, nodes: str) -> JobView:
        state = LogState("/x/7002-JAX-t.log", ref_time=T0)
        for i, ln in enumerate(
            L.header_lines(
                job_id="7002",
                name="JAX-t",
                nnodes=2,
                nodelist="node[001-002]",
                jax_port=1,
                ray_port=6379 if ray else None,
                passthrough={"steps": 1000},
                model="m",
            ),
            1,
        ):
            state.feed(ln, i)
        slurm = SlurmJob("7002", "JAX-t", "alice", "RUNNING", "gpu", nodes=nodes)
        ref = JobRef("7002", "JAX-t", None, Path("/x/7002-JAX-t.log"), "slurm")
        v = JobView(key="7002", ref=ref, first_seen=T0, main=state, policy=POLICY, slurm=slurm)
        v.note_read(T0)
        return v

    for ray, nodes, site, armed in (
        (True, "", False, True),
        (False, "node[001-002]", False, False),
        (False, "node[001-002]", True, True),
        (False, "", True, False),  # pending in Slurm: no node to ask about
    ):
        det = HangDetector(POLICY, RULE, first_budgets=0, site=site)
        v = view(ray, nodes)
        assert det.has_gpu_source(v) is armed
        det.check(v, T0 + 1)
        assert (det.budget_state("7002") is not None) is armed, (ray, nodes, site)
