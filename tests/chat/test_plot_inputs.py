"""Picture inputs from the daemon's data: step history, checkpoint config, incident, GPU profile."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from jobdiagd.chat.plot_inputs import (
    MAX_MARKS,
    chart_title,
    checkpoint_steps,
    eval_steps,
    hang_chart,
    power_bands,
    power_strip,
    projected_step,
    step_points,
    tgs_chart,
)
from jobdiagd.chat.plots import HostSeries, StepPoint, render, step_figure
from jobdiagd.detectors.hang import HangDetector
from jobdiagd.logs.state import LogState
from jobdiagd.logs.steps import TAIL, TRIAGE, Retention
from jobdiagd.model.alerts import Finding
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.records import StepRecord
from jobdiagd.service.jobs import JobView
from jobdiagd.service.plots_bridge import chart_for_view
from jobdiagd.triage.progress import checkpoint_config
from jobdiagd.triage.stall import StallPolicy
from jobdiagd.triage.tgs import analyze_tgs
from jobdiagd.tsdb.settings import DEFAULT_PROFILES, Thresholds
from jobdiagd_sim import lines as L

T0 = 1_780_000_000.0
POLICY = StallPolicy(stall_factor=3.0, min_stall_s=120.0, startup_s=1800.0, checkpoint_s=600.0)
CKPT = checkpoint_config({"enable_checkpointing": "true", "checkpoint_period": "100"}, {}, [0, 100, 200])


def rec(step: int, seconds: float | None, tgs: float | None) -> StepRecord:
    return StepRecord(step, seconds, tgs, None, None, None, step, 0, "log")


def test_step_points_accept_records_points_and_tuples() -> None:
    history = [rec(2, 6.0, 8000.0), StepPoint(1, 6.1, 7900.0), (0, 36.0, 1300.0), rec(2, 99.0, 1.0)]
    points, unit = step_points(history)
    assert [p.step for p in points] == [0, 1, 2]
    assert points[2] == StepPoint(2, 6.0, 8000.0)  # the first copy of a step wins
    assert unit == "tokens/s/device"


def test_logs_without_tokens_use_steps_per_second_like_triage() -> None:
    points, unit = step_points([rec(k, 4.0, None) for k in range(10)])
    assert unit == "steps/s"
    assert all(p.tokens_per_s == 0.25 for p in points)


def test_checkpoint_marks_are_period_multiples_and_seen_saves() -> None:
    assert checkpoint_steps(CKPT, 0, 836) == (0, 100, 200, 300, 400, 500, 600, 700, 800)
    ck = checkpoint_config({}, {}, [150, 300, 450])  # period learned from the saves
    assert checkpoint_steps(ck, 200, 1000) == (300, 450, 600, 750, 900)
    off = checkpoint_config({"enable_checkpointing": "false"}, {}, [])
    assert checkpoint_steps(off, 0, 1000) == ()


def test_marks_stay_bounded_on_a_million_steps() -> None:
    marks = checkpoint_steps(CKPT, 0, 10_000_000)
    assert len(marks) == MAX_MARKS and marks[-1] == 10_000_000
    evals = eval_steps(10, 0, 10_000_000)
    assert len(evals) == MAX_MARKS and evals[-1] == 10_000_000 and evals[1] - evals[0] == 10
    assert eval_steps(None, 0, 100) == () and eval_steps(50, 1, 149) == (50, 100)


def test_projection_is_the_hang_detectors() -> None:
    assert projected_step(736, 1000.0, 1600.0, 6.0) == 836
    assert projected_step(736, 1000.0, 1000.0, 6.0) == 736
    assert projected_step(None, 1000.0, 1600.0, 6.0) is None
    assert projected_step(736, None, 1600.0, 6.0) is None
    assert projected_step(736, 1000.0, 1600.0, None) is None


def test_hang_chart_marks_the_right_steps() -> None:
    steps = [rec(k, 6.0, 8600.0) for k in range(737)]
    chart = hang_chart(
        steps,
        CKPT,
        title=chart_title("4242", "JAX-llama2-70b", "Hang"),
        last_step=736,
        projected=836,
        stalled_s=600.0,
        step_time_s=6.0,
        eval_interval=250,
        incident_id="4242:hang:1",
    )
    assert chart.title == "Hang · job 4242 JAX-llama2-70b"
    m = chart.marks
    assert m is not None and (m.kind, m.start_step, m.projected_step, m.stalled_s) == (
        "hang",
        736,
        836,
        600.0,
    )
    assert chart.checkpoints[-1] == 800  # the checkpoint due inside the stall is marked too
    assert chart.evals == (250, 500, 750)
    assert chart.checkpoint_label == "checkpoint (every 100 steps)"
    assert chart.subtitle is not None and "no step for 10 min" in chart.subtitle
    assert "expected ≈ 836 by now" in chart.subtitle and "4242:hang:1" in chart.subtitle
    assert len(render(chart)) < 200 * 1024


def test_tgs_chart_takes_the_analysis_slide_and_an_absolute_baseline_window() -> None:
    # A restored run starting at step 200: the baseline window is steps 205-215, not 5-15.
    steps = [rec(k, 6.0 if k < 320 else 7.5, 8600.0 if k < 320 else 6880.0) for k in range(200, 400)]
    analysis = analyze_tgs(steps, CKPT)
    assert analysis.degraded and analysis.range_steps is not None
    chart = tgs_chart(
        steps, CKPT, analysis, title="TGS slide · job 5002", incident_id="5002:tgs-degradation:1"
    )
    m = chart.marks
    assert m is not None and m.kind == "tgs"
    assert m.baseline_steps == (205, 215)
    assert m.start_step == analysis.range_steps[0] and 315 <= m.start_step <= 325
    assert m.baseline == analysis.baseline and m.degraded == analysis.recent
    assert m.change_pct is not None and math.isclose(m.change_pct, -20.0, abs_tol=0.5)
    assert chart.checkpoints == (200, 300)
    assert chart.subtitle is not None and "-20%" in chart.subtitle


def test_power_bands_follow_the_gpu_profile() -> None:
    b = power_bands(DEFAULT_PROFILES["MI355X"], Thresholds(busy_util_pct=85.0))
    assert (b.gpu_model, b.busy_wait_w, b.train_w, b.idle_max_w, b.busy_util_pct) == (
        "MI355X",
        (240.0, 350.0),
        (800.0, 1000.0),
        120.0,
        85.0,
    )


def test_power_strip_marks_when_the_last_step_was_read() -> None:
    s = HostSeries("node001", (0.0, 60.0), (300.0, 300.0))
    strip = power_strip(
        [s],
        [s],
        power_bands(DEFAULT_PROFILES["MI300X"]),
        title="t",
        start=0.0,
        end=60.0,
        last_step=736,
        last_step_at=30.0,
        notes=["n"],
    )
    assert strip.since == 30.0 and strip.since_label == "last step 736 read" and strip.notes == ("n",)


def test_long_titles_are_cut() -> None:
    title = chart_title("4242", "JAX-" + "x" * 200, "Hang")
    assert len(title) == 64 and title.endswith("…")


# --- from a live job view ---------------------------------------------------------------------------


class Live:
    """A job view fed line by line with the daemon clock advanced by hand (as the detectors see it)."""

    def __init__(self, retention: Retention = TRIAGE) -> None:
        self.state = LogState("/x/7001-JAX-t.log", ref_time=T0, retention=retention)
        ref = JobRef("7001", "JAX-t", None, Path("/x/7001-JAX-t.log"), "slurm")
        self.view = JobView(key="7001", ref=ref, first_seen=T0, main=self.state, policy=POLICY)
        self.n = 0
        pt: dict[str, object] = {"steps": 100_000, "enable_checkpointing": True, "checkpoint_period": 20}
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


def test_chart_for_view_projects_like_the_hang_detector() -> None:
    job = Live()
    t = T0
    for k in range(60):
        t += 10.0
        job.step(k, t)
    now = t + 900.0
    out = HangDetector(POLICY).check(job.view, now)
    assert isinstance(out, list)
    finding = out[0]
    assert isinstance(finding, Finding) and not finding.resolved
    chart = chart_for_view(job.view, "hang", now, incident_id="7001:hang:1")
    m = chart.marks
    assert m is not None and m.start_step == 59
    assert m.projected_step == finding.details["expected step"] == 59 + 90
    assert m.stalled_s == 900.0
    assert chart.title == "Hang · job 7001 JAX-t"
    assert chart.checkpoints == (20, 40, 60, 80, 100, 120, 140)
    assert [p.step for p in chart.points] == list(range(60))
    fig = step_figure(chart)
    assert "last step 59" in [t.get_text() for leg in fig.legends for t in leg.get_texts()]


def test_chart_for_view_of_a_tgs_slide_and_of_an_unknown_kind() -> None:
    job = Live()
    t = T0
    for k in range(80):
        t += 10.0
        job.step(k, t, tokens=3000.0 if k < 40 else 2400.0)
    chart = chart_for_view(job.view, "tgs-degradation", t)
    m = chart.marks
    assert m is not None and m.kind == "tgs" and m.baseline == 3000.0 and m.degraded == 2400.0
    assert m.start_step is not None and 40 <= m.start_step <= 45
    assert chart.title.startswith("TGS slide · job 7001")
    with pytest.raises(ValueError, match="no step chart for incident kind 'oom'"):
        chart_for_view(job.view, "oom", t)


def test_chart_for_view_before_the_first_step_is_a_placeholder_chart() -> None:
    job = Live()
    chart = chart_for_view(job.view, "hang", T0 + 2000.0)
    assert chart.points == () and chart.marks is not None and chart.marks.start_step is None
    assert chart.marks.stalled_s == 2000.0
    fig = step_figure(chart)
    assert any("no training step" in t.get_text() for ax in fig.axes for t in ax.texts)


def test_the_tgs_chart_of_a_long_tailed_job_draws_the_whole_run() -> None:
    # The daemon's tailed state keeps only the detectors' windows of step records; the picture
    # still spans the run, from its bounded history.
    job = Live(TAIL)
    t = T0
    for k in range(6000):
        t += 10.0
        job.step(k, t, tokens=3000.0 if k < 5000 else 2400.0)
    assert len(job.view.sorted_steps()) < 2000  # bounded: most records were summarised
    chart = chart_for_view(job.view, "tgs-degradation", t)
    steps = [p.step for p in chart.points]
    assert steps[0] <= 5 and steps[-1] >= 5990
    # The evicted middle is drawn as densely as the rest, not from the few records kept there.
    assert sum(1000 <= s <= 4000 for s in steps) > 250
    m = chart.marks
    assert m is not None and m.baseline == 3000.0 and m.degraded == 2400.0
