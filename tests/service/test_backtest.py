"""`jobdiagd backtest`: the log's own clock, the daemon's detectors, ground truth from the scenario corpus."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.config import default_config
from jobdiagd.logs import file_clock
from jobdiagd.logs.file_clock import survey
from jobdiagd.logs.replay_read import FORK_MIN, place_unstamped, timeline
from jobdiagd.logs.state import LogState
from jobdiagd.model.jobref import JobRef
from jobdiagd.service import backtest
from jobdiagd.service.backtest import replay
from jobdiagd.sources.tail import PrefilterTailReader
from jobdiagd.triage.resolve import resolve
from jobdiagd_sim import lines as L
from jobdiagd_sim import metrics, multitask
from jobdiagd_sim.biglog import write_biglog
from jobdiagd_sim.scenarios import build
from tests.helpers.joblog import JobLog

NOW = 1_800_000_000.0
TICK = 15.0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("corpus")
    names = [
        "hanging",
        "hang-init-barrier",
        "cancelled-after-hang",
        "heartbeat-after-stall",
        "completed-ray0",
        "completed-ray1-truncated",
        "running",
        "restored",
        "tgs-periodic",
        "tgs-constant-drop",
        "oom-cascade",
        "soft-success-b",
        "cancelled-plain",
    ]
    return {n: build(n, root).job_dir for n in names}


def run(job_dir: Path):  # type: ignore[no-untyped-def]
    return replay(resolve(str(job_dir), []), default_config(), tick=TICK, ref_time=NOW)


@pytest.mark.parametrize(
    ("name", "phase"),
    [
        # Hung right after its save at step 100: the wait for step 101 may be a save blocking on
        # a slow filesystem, so the configured checkpoint budget applies (rule HANG-4).
        ("hanging", "checkpoint"),
        ("cancelled-after-hang", "steady"),
        ("heartbeat-after-stall", "steady"),
    ],
)
def test_mid_training_hangs_page_within_the_target(corpus: dict[str, Path], name: str, phase: str) -> None:
    r = run(corpus[name])
    opened = [a for a in r.alerts if a.event == "open"]
    assert [a.kind for a in opened] == ["hang"]
    assert r.step_time_s and r.last_step_at_s is not None
    due = r.last_step_at_s + r.step_time_s  # when the next step should have completed
    latency = opened[0].at_s - due
    target = max(3 * r.step_time_s, 120.0)
    if phase == "checkpoint":
        target = default_config().detectors.hang.checkpoint_budget_seconds
    assert opened[0].phase == phase
    assert 0 < latency <= target + TICK
    assert opened[0].at_step == r.last_step


def test_init_hang_pages_after_the_startup_budget(corpus: dict[str, Path]) -> None:
    r = run(corpus["hang-init-barrier"])
    (a,) = [a for a in r.alerts if a.event == "open"]
    assert a.kind == "hang" and a.at_step is None
    assert 1800.0 <= a.at_s <= 1800.0 + 2 * TICK


@pytest.mark.parametrize(
    "name",
    [
        "completed-ray0",
        "completed-ray1-truncated",
        "running",
        "restored",
        "tgs-periodic",
        "soft-success-b",
        "cancelled-plain",
    ],
)
def test_healthy_jobs_raise_no_alert(corpus: dict[str, Path], name: str) -> None:
    r = run(corpus[name])
    assert [a for a in r.alerts if a.event == "open"] == []


def test_cascade_is_one_failure_alert_naming_the_root_cause(corpus: dict[str, Path]) -> None:
    r = run(corpus["oom-cascade"])
    opened = [a for a in r.alerts if a.event == "open"]
    assert [(a.kind, a.cls) for a in opened] == [("failure", "oom-host")]
    (rep,) = [a for a in r.alerts if a.event == "report"]
    assert rep.cls == "oom-host" and rep.at_s >= opened[0].at_s


def test_tgs_slide_is_one_alert_with_its_pattern(corpus: dict[str, Path]) -> None:
    r = run(corpus["tgs-constant-drop"])
    opened = [a for a in r.alerts if a.event == "open"]
    assert [a.kind for a in opened] == ["tgs-degradation"]
    assert "%" in opened[0].summary and "steps" in opened[0].summary


def test_virtual_clock_sums_step_seconds_when_the_log_has_no_timestamps(tmp_path: Path) -> None:
    job = JobLog(tmp_path, "9001", nnodes=1)
    for k in range(5):
        job.step(k, seconds=7.0)
    tl = timeline(job.path, 0, NOW)
    steps = [ln for ln in tl if "completed step:" in ln.text]
    assert [ln.t - steps[0].t for ln in steps] == [0.0, 7.0, 14.0, 21.0, 28.0]


def test_cli_json_shape(corpus: dict[str, Path]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "jobdiagd.cli", "backtest", str(corpus["hanging"]), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    doc = json.loads(out.stdout)
    (job,) = doc["jobs"]
    assert job["job"] == "48104"
    kinds = [(a["kind"], a["class"]) for a in job["alerts"]]
    assert kinds[0] == ("hang", "hang")
    for a in job["alerts"]:
        assert {"kind", "at_step", "at_s", "class"} <= set(a)


def test_a_fifo_or_a_link_out_of_the_root_among_the_logs_is_left_out(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    job = JobLog(outputs, "9301", nnodes=1)  # JOB_NODELIST=node001: the Ray head's worker logs
    for k in range(5):
        job.step(k, seconds=2.0)
    job.summary(0)
    head = job.dir / "ray_logs" / "node001"
    head.mkdir(parents=True)
    os.mkfifo(head / "worker-0001-01000000-11.out")  # open() would wait for a writer forever
    secret = tmp_path / "shadow"
    secret.write_text("slurmstepd: error: Detected 1 oom-kill event(s) SECRET\n")
    (head / "worker-0002-01000000-12.out").symlink_to(secret)
    out = subprocess.run(
        [sys.executable, "-m", "jobdiagd.cli", "backtest", str(job.dir), "--json"],
        capture_output=True,
        text=True,
        timeout=60,  # the old reader blocked here; bounded, it fails instead
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "SECRET" not in out.stdout
    (res,) = json.loads(out.stdout)["jobs"]
    assert res["last_step"] == 4 and res["final_status"] == "completed"


# ---------------------------------------------------------------------------------------------
# The undated tail: lines after a file's last dated line or step line have no time of their own.
# ---------------------------------------------------------------------------------------------


def test_the_undated_tail_of_a_file_is_found_and_placed_where_asked(tmp_path: Path) -> None:
    job = JobLog(tmp_path, "9201", nnodes=1)
    base = NOW - 7200.0
    for k in range(3):
        job.task(0, L.absl_prefix(base + 10.0 * k, 1, "metric_logger.py:232") + L.step_line(_fields(k, 10.0)))
    job.task(0, L.absl_prefix(base + 100.0, 1, "a.cc:1") + "the last dated line")
    job.task(0, L.actor_exited(0, "node001", 1))
    job.summary(1, "Training FAILED (exit=1)")
    fc = survey(job.path, 0, NOW)
    text = job.path.read_bytes()
    assert fc.tail_from == text.index(b"0: " + L.absl_prefix(base + 100.0, 1, "a.cc:1").encode())
    tl = timeline(job.path, 0, NOW)
    dated = next(ln.t for ln in tl if "the last dated line" in ln.text)
    tail = [ln for ln in tl if ln.offset > fc.tail_from]
    assert tail and all(ln.t == dated for ln in tail)  # alone, a file's tail is at its last known time
    later = timeline(job.path, 0, NOW, undated_at=dated + 2700.0)
    assert [ln.t for ln in later if ln.offset > fc.tail_from] == [dated + 2700.0] * len(tail)
    before = [ln.t for ln in tl if ln.offset <= fc.tail_from]
    assert [ln.t for ln in later if ln.offset <= fc.tail_from] == before


@pytest.mark.parametrize("block", [16, 64, 1 << 20])
def test_the_last_dated_line_is_found_backwards_across_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(file_clock, "TAIL_BLOCK", block)
    job = JobLog(tmp_path, "9202", nnodes=1)
    base = NOW - 7200.0
    job.task(0, L.absl_prefix(base, 1, "metric_logger.py:232") + L.step_line(_fields(0, 10.0)))
    job.task(0, L.absl_prefix(base + 50.0, 1, "a.cc:1") + "dated " + "x" * 100)  # longer than a block
    job.task(0, L.absl_prefix(base + 60.0, 1, "a.cc:1") + "the last dated line")
    for i in range(20):
        job.task(0, f"undated line {i} " + "y" * (i * 7))
    text = job.path.read_bytes()
    fc = survey(job.path, 0, NOW)
    assert fc.tail_from == text.index(b"0: " + L.absl_prefix(base + 60.0, 1, "a.cc:1").encode())


def test_a_file_without_any_time_has_no_tail(tmp_path: Path) -> None:
    path = tmp_path / "plain.log"
    path.write_text("no stamp\nno step line either\n")
    assert survey(path, 0, NOW).tail_from is None


def test_undated_lines_after_the_last_dated_one_wait_for_the_jobs_end(tmp_path: Path) -> None:
    """RAY=1: Ray stopped forwarding after the last step; the heartbeat error 45 min later is in
    the head's worker log only, and the job log ends with the job script's undated lines. They
    are taken in at the job's end, not at the last step's time (where the "Training subprocess
    exited" line opened a failure incident that superseded the stall)."""
    sc = metrics.scenario("hang-then-heartbeat", step_time=20.0, hang_s=2700.0)
    sim = metrics.JobSim(dataclasses.replace(sc, extra={**sc.extra, "unforwarded_end": True}))
    files = metrics.write_job(sim, tmp_path / "outputs", with_tsdb=False)
    r = run(files.job_dir)
    opened = [a for a in r.alerts if a.event == "open"]
    assert [a.kind for a in opened] == ["hang"]  # the step budget's page (no TSDB), not superseded
    assert r.step_time_s and r.last_step_at_s is not None and r.end_at_s is not None
    assert 0 < opened[0].at_s - (r.last_step_at_s + r.step_time_s) <= max(3 * r.step_time_s, 120.0) + TICK
    assert r.undated_lines >= len(sim.sc.nodes)
    assert r.end_at_s - r.last_step_at_s == pytest.approx(2700.0, abs=1.0)  # the heartbeat kill
    assert r.final_status == "failed" and r.final_primary == "hang"


# ---------------------------------------------------------------------------------------------
# Multi-task logs whose step lines carry no timestamp: one step series drives the clock.
# ---------------------------------------------------------------------------------------------


def _fields(step: int, seconds: float) -> L.StepFields:
    return L.StepFields(
        step=step, seconds=seconds, tflops=120.0, tokens=8000.0, total_weights=196608, loss=2.5
    )


def _undated_steps(job: JobLog, secs: list[float], *, period: int | None = None, seed: int = 1) -> None:
    """Every task prints every step (undated), in srun's shuffled order; saves after k*period."""
    rng = random.Random(seed)
    for k, s in enumerate(secs):
        order = list(range(job.nnodes))
        rng.shuffle(order)
        for r in order:
            job.task(r, L.step_line(_fields(k, s)))
        if period and k % period == 0:
            for r in order:
                job.task(r, L.checkpoint_saved(k))


def _four_task_job(tmp_path: Path) -> tuple[JobLog, list[float]]:
    # Step 0 compiles for 500 s; the saves after steps 0, 10, 20 block the next step for 80 s.
    secs = [500.0 if k == 0 else 6.0 + (80.0 if k in (1, 11, 21) else 0.0) + 0.1 * (k % 3) for k in range(30)]
    job = JobLog(tmp_path, "9101", nnodes=4, steps=30, checkpoint_period=10)
    for r in range(4):
        job.task(r, L.BARRIER_PASSED)
    _undated_steps(job, secs, period=10)
    job.summary(0)
    return job, secs


def test_four_task_undated_log_runs_at_one_tasks_pace(tmp_path: Path) -> None:
    job, secs = _four_task_job(tmp_path)
    tl = timeline(job.path, 0, NOW)
    at: dict[int, set[float]] = {}
    task0: dict[int, float] = {}
    for ln in tl:
        m = re.search(r"^\s*(\d+): completed step: (\d+),", ln.text)
        if m:
            at.setdefault(int(m.group(2)), set()).add(ln.t)
            if m.group(1) == "0":
                task0[int(m.group(2))] = ln.t
    # Each step is one instant, whichever task printed it, and the steps are as far apart as
    # one task's `seconds:` say: the whole run lasts the summed seconds of one task.
    assert all(len(ts) == 1 for ts in at.values())
    for k in range(1, 30):
        assert task0[k] - task0[k - 1] == pytest.approx(secs[k], abs=1e-3)
    assert task0[29] - task0[0] == pytest.approx(sum(secs[1:]), abs=1e-3)
    assert tl[-1].t - task0[0] == pytest.approx(sum(secs[1:]), abs=1e-3)  # the summary follows the last step


def test_four_task_undated_replay_raises_no_false_alert(tmp_path: Path) -> None:
    job, secs = _four_task_job(tmp_path)
    r = replay(resolve(str(job.dir), []), default_config(), tick=TICK, ref_time=NOW)
    assert [a for a in r.alerts if a.event == "open"] == []
    assert r.last_step == 29 and r.final_status == "completed"
    assert r.last_step_at_s == pytest.approx(sum(secs[1:]), abs=1e-3)
    assert r.barrier_at_s == pytest.approx(-secs[0], abs=1e-3)  # step 0 came 500 s after the barrier


def test_hang_in_an_undated_multi_task_log_pages_within_the_budget(tmp_path: Path) -> None:
    """8 tasks print undated steps; after the hang only XLA's own (dated) chatter goes on."""
    job = JobLog(tmp_path, "9102", nnodes=8, steps=1000)
    for r in range(8):
        job.task(r, L.BARRIER_PASSED)
    secs = [60.0] + [5.0] * 30
    _undated_steps(job, secs, seed=3)
    stall = NOW - 86400.0  # when the last step completed (the log's clock, once it has stamps)
    for i in range(1, 61):
        job.task(i % 8, L.absl_prefix(stall + 60.0 * i, 140000 + i % 8, "gpu_hlo_schedule.cc:728", "W") + "x")
    job.summary(143, L.CANCELLED_TEXT)
    tl = timeline(job.path, 0, NOW)
    first_stamp = next(ln.t for ln in tl if "gpu_hlo_schedule" in ln.text)
    r = replay(resolve(str(job.dir), []), default_config(), tick=TICK, ref_time=NOW)
    (a,) = [a for a in r.alerts if a.event == "open"]
    assert a.kind == "hang" and a.at_step == 30 and a.phase == "steady" and a.budget_s == 120.0
    # Back-dated from the first stamp: the steps keep their spacing and the last one is read no
    # later than the first line after it that carries a time.
    assert r.last_step_at_s == pytest.approx(sum(secs[1:]), abs=1e-3)
    assert r.first_step_at is not None and a.at is not None
    last_step_at = r.first_step_at + sum(secs[1:])
    assert last_step_at == pytest.approx(first_stamp, abs=1e-3)
    assert 120.0 < a.at - last_step_at <= 120.0 + TICK


def test_mixed_dated_and_undated_lines_keep_the_clock_monotone(tmp_path: Path) -> None:
    job = JobLog(tmp_path, "9103", nnodes=2)
    base = NOW - 3600.0
    job.task(1, L.absl_prefix(base, 1, "a.cc:1") + "first stamp")
    for k in range(3):
        for r in (1, 0):
            job.task(r, L.step_line(_fields(k, 10.0)))
    job.task(1, L.absl_prefix(base + 5.0, 1, "a.cc:1") + "behind the clock")
    job.task(0, L.absl_prefix(base + 500.0, 1, "a.cc:1") + "ahead of the clock")
    job.task(1, L.step_line(_fields(3, 10.0)))
    job.task(0, L.step_line(_fields(3, 10.0)))
    tl = timeline(job.path, 0, NOW)
    assert all(b.t >= a.t for a, b in zip(tl, tl[1:], strict=False))
    first = next(ln.t for ln in tl if "first stamp" in ln.text)
    ahead = next(ln.t for ln in tl if "ahead of" in ln.text)
    behind = next(ln.t for ln in tl if "behind the" in ln.text)
    step3 = [ln.t for ln in tl if "completed step: 3," in ln.text]
    assert behind == pytest.approx(first + 30.0, abs=1e-3)  # clamped: steps 0-2 already took 30 s
    assert ahead - first == pytest.approx(500.0, abs=1e-3)  # its own time
    assert step3 == [pytest.approx(ahead + 10.0, abs=1e-3)] * 2


def test_copies_without_task_prefix_move_the_clock_once(tmp_path: Path) -> None:
    path = tmp_path / "plain.log"
    lines = []
    for k in range(5):
        lines += [L.step_line(_fields(k, 7.0))] * 3  # `srun` without -l: three copies per step
    path.write_text("\n".join(lines) + "\n")
    tl = timeline(path, 0, NOW)
    assert tl[-1].t - tl[0].t == pytest.approx(28.0, abs=1e-3)


def test_first_task_that_prints_steps_drives_the_clock_when_task_0_prints_none(tmp_path: Path) -> None:
    job = JobLog(tmp_path, "9104", nnodes=3)
    job.task(0, "task 0 prints no step lines")
    for k in range(4):
        job.task(2, L.step_line(_fields(k, 10.0)))
        job.task(1, L.step_line(_fields(k, 99.0)))
    assert survey(job.path, 0, NOW).auth_task == 2
    tl = timeline(job.path, 0, NOW)
    steps = [ln.t for ln in tl if "completed step" in ln.text]
    assert steps[-1] - steps[0] == pytest.approx(30.0, abs=1e-3)


def test_ray_worker_log_without_stamps_is_placed_at_the_forwarded_step(tmp_path: Path) -> None:
    case = multitask.build(next(p for p in multitask.PLANS if p.name == "hang-8-ray-mid"), tmp_path)
    worker = sorted(case.job_dir.glob("ray_logs/node001/worker-*-01000000-*.out"))[0]
    clocks = [survey(case.log, 0, NOW), survey(worker, 1, NOW)]
    assert clocks[1].start is None  # no timestamp at all
    starts = place_unstamped(clocks, NOW)
    main_step0 = next(
        ln.t for ln in timeline(case.log, 0, NOW) if re.search(r"^\s*\d+: .*completed step: 0,", ln.text)
    )
    worker_step0 = next(ln.t for ln in timeline(worker, 1, NOW, starts[1]) if "completed step: 0," in ln.text)
    assert worker_step0 == pytest.approx(main_step0, abs=1e-3)


def test_multi_task_undated_corpus_no_false_alert_and_hangs_paged_in_budget(tmp_path: Path) -> None:
    for case in multitask.build_all(tmp_path):
        r = replay(resolve(str(case.job_dir), []), default_config(), tick=TICK, ref_time=NOW)
        opened = [a for a in r.alerts if a.event == "open"]
        if case.healthy:
            assert opened == [], case.plan.name
            continue
        (a,) = opened
        assert a.kind == "hang" and a.at_step == case.last_step and a.budget_s is not None, case.plan.name
        if case.last_step is None:
            assert r.barrier_at_s is not None
            due = r.barrier_at_s
        else:
            assert r.last_step_at_s is not None and r.step_time_s
            due = r.last_step_at_s + r.step_time_s
        assert 0 < a.at_s - due <= a.budget_s + TICK, case.plan.name
        if case.last_step is not None:  # two hours of silence: the end report names the hang too
            assert r.final_primary == "hang", case.plan.name


def _facts(st: LogState) -> dict[str, object]:
    return {
        "step_lines": st.step_lines,
        "steps": len(st.steps),
        "max_step": st.steps.max_step,
        "sum_seconds": round(st.steps.sum_seconds, 6),
        "task_last_step": dict(st.task_last_step),
        "saves": dict(st.saves),
        "barrier_passed": st.barrier_passed,
        "hits": {c: len(h.all()) for c, h in st.hits.items()},
        "summary": None if st.summary is None else (st.summary.status, st.summary.exit_code),
        "header": dict(st.header),
        "config": dict(st.config),
    }


def test_replay_feeds_what_the_daemons_tail_reader_feeds(tmp_path: Path) -> None:
    """Parity with the live tick's input: the replay's state of a log equals what the daemon's
    PrefilterTailReader builds following the same file as it grows, line by line."""
    job, _ = _four_task_job(tmp_path)
    job.task(2, "Traceback (most recent call last):")  # evidence lines after training started
    job.task(2, L.node_exit("node003", 1))
    r = replay(resolve(str(job.dir), []), default_config(), tick=TICK, ref_time=NOW)
    grown = tmp_path / "grown.log"
    grown.write_bytes(b"")
    reader = PrefilterTailReader(grown, LogState(str(grown), ref_time=NOW))
    with open(grown, "ab") as out:
        for line in job.path.read_bytes().splitlines(keepends=True):
            out.write(line)
            out.flush()
            reader.poll()
    assert _facts(r.states[0]) == _facts(reader.state)
    assert r.states[0].step_lines == 4 * 30  # every task's copy was read, as the daemon reads it


def test_forked_reader_gives_the_same_replay(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    name = "99002-JAX-llama3.1-405b-bench"
    log = outputs / f"{name}.log"
    write_biglog(log, FORK_MIN + (1 << 20), nodes=12, undated_steps=True)
    (outputs / name).mkdir()
    (outputs / name / "log").symlink_to(f"../{log.name}")
    ref = resolve(str(outputs / name), [])
    one = replay(ref, default_config(), tick=TICK, ref_time=NOW, workers=1)
    two = replay(ref, default_config(), tick=TICK, ref_time=NOW, workers=2)
    assert one.to_dict() == two.to_dict()
    assert _facts(one.states[0]) == _facts(two.states[0])
    assert one.last_step is not None and one.last_step > 100 and one.end_at_s
    assert one.undated_lines > 0  # the summary after the last dated line: the tail, forked too


def test_one_failing_job_does_not_lose_the_others(
    corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = backtest.replay

    def flaky(ref: JobRef, *args: Any, **kw: Any) -> backtest.JobReplay:
        if ref.job_id == "48104":
            raise OverflowError("cannot convert float infinity to integer")
        return real(ref, *args, **kw)

    monkeypatch.setattr(backtest, "replay", flaky)
    args = argparse.Namespace(
        config=None, tick=TICK, json=True, workers=1, paths=[str(corpus["hanging"]), str(corpus["running"])]
    )
    assert backtest.main(args) == 1
    out = capsys.readouterr()
    assert [j["job"] for j in json.loads(out.out)["jobs"]] == ["48103"]
    assert (
        out.err.strip()
        == "jobdiagd backtest: job 48104: OverflowError: cannot convert float infinity to integer"
    )
