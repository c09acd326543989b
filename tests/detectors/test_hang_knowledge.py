"""The hang detector tells triage what its clock saw (rule VIEW-1), and triage concludes the page's hang."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from jobdiagd.detectors import EarlyMemo, NoData
from jobdiagd.detectors.hang import EarlyRule, HangDetector
from jobdiagd.logs.state import LogState
from jobdiagd.model.alerts import Finding
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.kinds import GpuHangState, StallPhase
from jobdiagd.model.triage import StallKnowledge
from jobdiagd.service.jobs import JobView
from jobdiagd.sources.slurm_parse import SlurmJob
from jobdiagd.triage.stall import StallPolicy
from jobdiagd.tsdb.gpu_hang import GpuVerdict
from jobdiagd_sim import lines as L

POLICY = StallPolicy(stall_factor=3.0, min_stall_s=120.0, startup_s=1800.0, checkpoint_s=600.0)
RULE = EarlyRule(factor=1.5, slack_s=20.0)
T0 = 1_780_000_000.0


def _job(*, ray: bool = False) -> JobView:
    state = LogState("/x/7001-JAX-t.log", ref_time=T0)
    ref = JobRef("7001", "JAX-t", None, Path("/x/7001-JAX-t.log"), "slurm")
    view = JobView(key="7001", ref=ref, first_seen=T0, main=state, policy=POLICY)
    lines = L.header_lines(
        job_id="7001",
        name="JAX-t",
        nnodes=2,
        nodelist="node[001-002]",
        jax_port=1,
        ray_port=6379 if ray else None,
        passthrough={"steps": 1000},
        model="m",
    )
    for n, ln in enumerate(lines, 1):
        state.feed(ln, n)
    view.note_read(T0)
    return view


def _steps(view: JobView, det: HangDetector, n: int, *, dated: bool) -> float:
    """n steps of 10 s, each read when it is stamped; returns when the last was read."""
    assert view.main is not None
    t = T0
    for k in range(n):
        t += 10.0
        f = L.StepFields(step=k, seconds=10.0, tflops=1.0, tokens=3000.0, total_weights=1, loss=1.0)
        stamp = L.absl_prefix(t, 4242, "metric_logger.py:232") if dated else ""
        view.main.feed(f"0: {stamp}{L.step_line(f)}", view.main.lines + 1)
        view.note_read(t)
        det.check(view, t)
    return t


def _finding(out: object) -> Finding:
    assert not isinstance(out, NoData) and isinstance(out, list) and len(out) == 1
    f = out[0]
    assert isinstance(f, Finding)
    return f


def test_what_the_detector_knows_is_what_its_page_says() -> None:
    det = HangDetector(POLICY)
    view = _job()
    read = _steps(view, det, 30, dated=True)
    assert det.knowledge(view, read + 50) == StallKnowledge(read, 120.0, StallPhase.STEADY)
    f = _finding(det.check(view, read + 121))
    assert not f.resolved and "(budget 2m 0s, phase steady)" in f.summary
    assert (f.details["status"], f.details["primary failure"]) == ("hanging", "hang")
    assert "(the daemon's clock: budget 2m 0s, phase steady)" in str(f.details["triage"])


def test_an_undated_log_is_hanging_by_triages_own_conclusion() -> None:
    """No stamps: only the daemon's clock saw the stall. Triage, told, says hang with the hang's
    next steps from its first run (the old patch re-ran them afterwards)."""
    det = HangDetector(POLICY)
    view = _job()
    read = _steps(view, det, 30, dated=False)
    f = _finding(det.check(view, read + 121))
    assert (f.details["status"], f.details["primary failure"], f.details["stage"]) == (
        "hanging",
        "hang",
        "Training",
    )
    assert f.details["next step 1"] == "Kill the job: scancel 7001."
    # The view's own analysis (what the failure detector, the early page and /job read) agrees
    # once the engine wires the detector in as its source.
    view.stall_source = det.knowledge
    res = view.analysis(read + 121)
    assert (res.status, res.primary) == ("hanging", "hang")


def test_a_gpu_confirmed_page_is_known_as_such_until_a_new_step() -> None:
    det = HangDetector(POLICY, RULE)
    view = _job(ray=True)
    read = _steps(view, det, 30, dated=True)
    view.gpu_check = EarlyMemo(29, GpuVerdict(GpuHangState.BUSY_WAIT, "every GPU busy-waits", T0), read)
    early = read + 10.0 + 1.5 * 10.0 + 20.0
    f = _finding(det.check(view, early))
    assert not f.resolved and f.details["status"] == "hanging"
    assert "GPU-confirmed before it ran out" in str(f.details["triage"])
    known = det.knowledge(view, early)
    assert known is not None and known.gpu_confirmed and known.stalled(early)
    assert view.main is not None
    g = L.StepFields(step=30, seconds=10.0, tflops=1.0, tokens=3000.0, total_weights=1, loss=1.0)
    view.main.feed("0: " + L.absl_prefix(read + 10.0, 4242, "m.py:1") + L.step_line(g), view.main.lines + 1)
    view.note_read(early + 1)
    resumed = det.knowledge(view, early + 1)
    assert resumed is not None and not resumed.gpu_confirmed and not resumed.stalled(early + 1)


def test_a_job_the_detector_does_not_judge_has_no_knowledge() -> None:
    det = HangDetector(POLICY)
    view = _job()
    read = _steps(view, det, 5, dated=True)
    view.slurm = SlurmJob("7001", "JAX-t", "alice", "RUNNING", "debug")
    assert det.knowledge(view, read + 1) is not None
    view.slurm = replace(view.slurm, state="COMPLETING")
    assert det.knowledge(view, read + 1) is None
    view.slurm, view.ended = None, True
    assert det.knowledge(view, read + 1) is None
