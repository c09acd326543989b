"""A tailed job's memory is bounded whatever its length, and the bound changes no answer.

The daemon's tailed states keep `logs.steps.TAIL` retention; these tests feed one long job
(real-format multi-task step lines, through the daemon's tail reader) into a bounded and an
unbounded state side by side and compare what the detectors and the per-tick triage say.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import sys
import types
from pathlib import Path
from typing import Any

from jobdiagd.config import default_config
from jobdiagd.detectors import Detector, NoData, build
from jobdiagd.detectors import tgs as tgs_detector
from jobdiagd.detectors.hang import BudgetMemo, HangDetector
from jobdiagd.detectors.tgs import TgsDetector, TrendMemo
from jobdiagd.logs.reader import MAX_LINE, read_file
from jobdiagd.logs.state import EVENTS_KEEP, MAX_TASKS, SAVES_HEAD, SAVES_SLACK, SAVES_TAIL, LogState
from jobdiagd.logs.steps import TAIL, TRIAGE, StepSeries
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.records import StepRecord
from jobdiagd.model.triage import TriageResult
from jobdiagd.service.jobs import JobView
from jobdiagd.sources.tail import FileTail, PrefilterTailReader
from jobdiagd.triage.progress import STEADY_WINDOW, checkpoint_config
from jobdiagd.triage.report import what_happened
from jobdiagd_sim.job import SIM_EPOCH
from jobdiagd_sim.longrun import LongRun

PERIOD = 1000  # longer than the recent window: progress lost since a save needs the anchors
# A save that took 700 s outside its step's `seconds:` -- the slowest of the run, and longer than the
# configured checkpoint budget allows (rule HANG-4: only such a save extends the next saves' budget).
SLOW_SAVE = 17_000
SLOW_SAVE_S = 700.0
SURVIVED_ERROR_AT = 30_000
SLIDE_FROM = 52_000  # throughput drops by a quarter from here on


def deep_size(*roots: object) -> int:
    """Bytes of every object reachable from `roots` (code -- modules, classes, functions -- excluded)."""
    seen: set[int] = set()
    stack = list(roots)
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(
            obj, type | types.ModuleType | types.FunctionType | types.BuiltinFunctionType | types.MethodType
        ):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


class Side:
    """One way of following the job: a view, its reader, its own detectors."""

    def __init__(self, run: LongRun, bounded: bool) -> None:
        ref = JobRef(run.job_id, run.name, None, run.path, "slurm")
        self.view = JobView(key=run.job_id, ref=ref, first_seen=SIM_EPOCH)
        if bounded:
            self.tail: FileTail | None = FileTail(run.path, ref_time=SIM_EPOCH)  # the daemon's own reader
            self.reader: PrefilterTailReader | None = None
        else:
            self.tail = None
            state = LogState(str(run.path), ref_time=SIM_EPOCH, retention=None)
            self.reader = PrefilterTailReader(run.path, state)
        self.detectors: list[Detector] = build(default_config())

    def read(self, now: float) -> None:
        if self.tail is not None:
            self.tail.poll()
            self.view.main = self.tail.state
        else:
            assert self.reader is not None
            self.reader.poll()
            self.view.main = self.reader.state
        self.view.note_read(now)

    def hang_state(self) -> BudgetMemo | None:
        (det,) = [d for d in self.detectors if isinstance(d, HangDetector)]
        return det.budget_state(self.view.key)

    def tgs_state(self) -> TrendMemo | None:
        (det,) = [d for d in self.detectors if isinstance(d, TgsDetector)]
        return det.trend_state(self.view.key)

    def check(self, now: float) -> list[object]:
        out: list[object] = []
        for det in self.detectors:
            res = det.check(self.view, now)
            out.append(res if isinstance(res, NoData) else list(res))
        # What the hang budget and the TGS trend learned, beyond what a finding shows.
        hang, tgs = self.hang_state(), self.tgs_state()
        out.append((hang.budget, hang.step_time) if hang is not None else None)
        out.append((tgs.analysis, tgs.episode) if tgs is not None else None)
        return out


def triage_facts(res: TriageResult) -> dict[str, Any]:
    """Everything the per-tick triage says that is exact on a bounded state.

    Not compared: the whole-run TGS shape (pattern, range, magnitude of the live triage are
    computed on the down-sampled middle, see logs.steps) and the saves set (trimmed)."""
    ck, t = res.ckpt, res.tgs
    return {
        "status": res.status,
        "primary": res.primary,
        "stage": res.cls.stage,
        "classes": res.cls.classes,
        "evidence": [e.to_dict() for e in res.cls.evidence],
        "notes": res.cls.notes,
        "stall": res.cls.stall,
        "heartbeat": res.cls.heartbeat,
        "progress": dataclasses.asdict(res.progress),
        "checkpoint": (ck.enabled, ck.period, ck.asynchronous, ck.eval_period, ck.profile),
        "tgs": (t.baseline, t.recent, t.change_pct, t.degraded, t.metric),
        "next_steps": res.next_steps,
        "what_happened": what_happened(res) if res.primary != "tgs-degradation" else None,
        "first_steps": [dataclasses.astuple(s) for s in res.steps[:64]],
        "last_steps": [dataclasses.astuple(s) for s in res.steps[-512:]],
    }


def test_bounded_tail_state_answers_like_an_unbounded_one_on_a_53k_step_job(tmp_path: Path) -> None:
    run = LongRun(tmp_path / "900001-JAX-long.log", tasks=2, checkpoint_period=PERIOD)
    bounded, unbounded = Side(run, True), Side(run, False)
    compared = {"ticks": 0, "triage": 0}

    def tick(now: float, *, triage: bool = False) -> list[object]:
        for side in (bounded, unbounded):
            side.read(now)
        a, b = bounded.check(now), unbounded.check(now)
        assert a == b, f"detectors disagree at step {run.step - 1}, t+{now - run.t:.0f}s"
        compared["ticks"] += 1
        if triage:
            ra, rb = bounded.view.analysis(now), unbounded.view.analysis(now)
            assert triage_facts(ra) == triage_facts(rb), f"triage disagrees at step {run.step - 1}"
            compared["triage"] += 1
        return a

    def outside(k: int) -> float:
        return SLOW_SAVE_S if k == SLOW_SAVE else 0.0

    def slide(k: int) -> float:
        return 3000.0 * (0.75 if k >= SLIDE_FROM else 1.0) + (k % 13)

    while run.step < SLIDE_FROM:
        n = 1000 - run.step % 1000 if run.step % 1000 else 1000
        run.steps(n, outside=outside)
        tick(run.t, triage=run.step % 10_000 == 0)
        if run.step == SURVIVED_ERROR_AT:
            # An error the job survives: the failure incident opens, then resolves as steps go on.
            run.line("node001:1234:5678 [0] NCCL WARN Timeout waiting for proxy response")
            opened = tick(run.t + 1, triage=True)
            assert any(isinstance(f, list) and f and not f[0].resolved for f in opened)
            run.steps(3)
            tick(run.t, triage=True)

    bounded_state = bounded.view.main
    assert bounded_state is not None and len(list(bounded_state.steps)) < 1000  # really bounded
    assert SLOW_SAVE in bounded_state.steps and SLOW_SAVE - 1 in bounded_state.steps

    # The throughput slide late in the run: the TGS episode opens on both, with the same pattern.
    for _ in range(12):
        run.steps(50, tokens=slide)
        found = tick(run.t, triage=True)
    tgs = next(f for f in found if isinstance(f, list) and f and f[0].kind == "tgs-degradation")
    assert not tgs[0].resolved and "-25%" in tgs[0].summary, tgs[0].summary

    # A hang right after a checkpoint: budget learned from the slow save 36,000 steps ago.
    run.steps(PERIOD - run.step % PERIOD + 1, tokens=slide)  # through step 53,000, a save
    last_at = run.t
    tick(last_at)
    assert bounded.view.last_step == 53_000
    hang_state = bounded.hang_state()
    assert hang_state is not None
    hang_budget = hang_state.budget
    assert hang_budget.phase == "checkpoint" and abs(hang_budget.seconds - 1.5 * (SLOW_SAVE_S + 12.0)) < 0.1
    for dt in (60.0, 300.0, 900.0, 1060.0, 1075.0, 1500.0):
        found = tick(last_at + dt, triage=True)
        hang = next(f for f in found if isinstance(f, list) and f and f[0].kind == "hang")
        assert hang[0].resolved is (dt <= hang_budget.seconds)
    assert compared["ticks"] > 60 and compared["triage"] >= 13


def test_saves_only_checkpointing_is_learned_alike_from_trimmed_saves(tmp_path: Path) -> None:
    """No period in the arguments or config: the period comes from the save lines, which a
    tailed state trims to a few dozen. The detectors and triage still agree with an unbounded
    state, down to the budget of a hang after a save learned from a slow save long ago."""
    period = 30
    run = LongRun(
        tmp_path / "900005-JAX-long.log",
        job_id="900005",
        tasks=2,
        checkpoint_period=period,
        period_in_log=False,
    )
    bounded, unbounded = Side(run, True), Side(run, False)

    def tick(now: float, *, triage: bool = False) -> list[object]:
        for side in (bounded, unbounded):
            side.read(now)
        a, b = bounded.check(now), unbounded.check(now)
        assert a == b, f"detectors disagree at step {run.step - 1}, t+{now - run.t:.0f}s"
        if triage:
            ra, rb = bounded.view.analysis(now), unbounded.view.analysis(now)
            assert triage_facts(ra) == triage_facts(rb), f"triage disagrees at step {run.step - 1}"
        return a

    while run.step < 12_000:
        run.steps(500, outside=lambda k: 300.0 if k == 2010 else 0.0)
        tick(run.t, triage=run.step % 3000 == 0)
    state = bounded.view.main
    assert state is not None and len(state.saves) < 120 < len(unbounded.view.main.saves)  # type: ignore[union-attr]
    assert bounded.view.checkpoint().period == unbounded.view.checkpoint().period == period
    run.steps(period - run.step % period + 1)  # through a save step
    last_at = run.t
    tick(last_at)
    hang_state = bounded.hang_state()
    assert hang_state is not None
    budget = hang_state.budget
    assert budget.phase == "checkpoint" and budget.seconds > 450  # 1.5 x the 300 s save
    for dt in (200.0, budget.seconds - 1, budget.seconds + 1):
        found = tick(last_at + dt, triage=True)
        hang = next(f for f in found if isinstance(f, list) and f and f[0].kind == "hang")
        assert hang[0].resolved is (dt < budget.seconds)


def test_a_tailed_jobs_memory_stops_growing_with_its_steps(tmp_path: Path) -> None:
    """Through the daemon's path (tail reader, view, detectors, per-tick triage): what one job
    holds after N steps is what it holds after 4N, and far below an unbounded store."""
    run = LongRun(tmp_path / "900002-JAX-long.log", job_id="900002", tasks=2, checkpoint_period=50)
    side = Side(run, True)

    def feed(upto: int) -> int:
        while run.step < upto:
            run.steps(1000)
            side.read(run.t)
            side.check(run.t)
            side.view.analysis(run.t)
        assert side.tail is not None and side.tail.state is not None
        gc.collect()
        return deep_size(side.tail, side.view)

    n = 20_000
    at_n = feed(n)
    held_n = len(list(side.view.main.steps)) if side.view.main is not None else 0
    at_4n = feed(4 * n)
    state = side.view.main
    assert state is not None
    held_4n = len(list(state.steps))
    bound = TAIL.early + TAIL.recent + TAIL.sampled + 2 * TAIL.pinned + 1
    assert held_n <= bound and held_4n <= bound
    assert at_4n <= at_n * 1.05, (at_n, at_4n)  # 60,000 more steps, no more memory
    assert at_4n < 700_000, at_4n
    assert len(state.saves) + len(state.async_saves) <= SAVES_HEAD + SAVES_TAIL + SAVES_SLACK
    assert state.saves_seen == 80_000 // 50 - 1  # ... while every save was counted
    # The measure sees step records: the same job unbounded holds about 4x as much at 4N.
    ref = read_file(run.path, LogState(str(run.path), ref_time=SIM_EPOCH, retention=None))
    assert deep_size(ref) > 10 * at_4n


def test_step_series_summaries_are_exact() -> None:
    """TAIL keeps exact sums since any checkpoint step, the slowest steps with their predecessor,
    and a whole-run history whose buckets add up to every step."""
    tail, full = StepSeries(TAIL), StepSeries(None)
    t = 0.0
    for k in range(100_000):
        secs = 2.0 + (k % 7) * 0.01 + (30.0 if k % 1000 == 0 and k else 0.0)
        t += secs + (400.0 if k == 4321 else 0.0)
        if k % 1000 == 0:
            tail.want_anchor(k)
        for s in (tail, full):
            s.add(StepRecord(k, secs, 3000.0 - (k % 5), None, None, t, k + 1, 0, "x"))
    assert tail.count == full.count == 100_000 and tail.sum_seconds == full.sum_seconds
    assert len(list(tail)) <= TAIL.early + TAIL.recent + TAIL.sampled + 2 * TAIL.pinned + 1
    for since in (99_000, 98_000, 60_000, 99_600, -1):
        a, b = tail.seconds_after(since), full.seconds_after(since)
        assert a is not None and b is not None and abs(a - b) < 1e-6 * b, since
    assert tail.seconds_after(12_345) is None  # neither recent nor an anchor: the caller sums records
    assert StepSeries(TRIAGE).seconds_after(5) is None  # triage's store never answers: reports unchanged
    # The step whose line came 400 s after the previous one is kept, with that previous one.
    assert tail.get(4321) is not None and tail.get(4320) is not None
    ckpt = checkpoint_config({"enable_checkpointing": "true", "checkpoint_period": "1000"}, {}, [])
    points = tail.history(ckpt.marks)
    assert 512 <= len(points) <= TAIL.history + TAIL.early + TAIL.recent
    assert sum(p.steps for p in points) == 100_000
    assert points[0].first_step == 0 and points[-1].last_step == 99_999
    assert max(p.seconds_max or 0.0 for p in points) == max(r.seconds or 0.0 for r in full.values())
    covered = sum((p.seconds_mean or 0.0) * p.steps for p in points)
    assert abs(covered - full.sum_seconds) < 1e-6 * full.sum_seconds
    for p in points:
        has_save = any(
            p.first_step <= s + d <= p.last_step for s in range(1000, 100_000, 1000) for d in (0, 1)
        )
        assert ("checkpoint" in p.marks) is has_save


def test_tail_windows_cover_what_the_detectors_read() -> None:
    """The TGS detector's early/late windows and the steady step time's clean steps fit in TAIL's
    exact windows (change one, change the other)."""
    assert TAIL.early >= tgs_detector.EARLY and TAIL.recent >= tgs_detector.LATE
    assert TAIL.recent // 2 > STEADY_WINDOW  # room for checkpoint/eval steps among the last 50 clean


def test_tailed_state_caps_line_driven_lists_and_task_maps() -> None:
    """A runaway log (errors on every line, a task id on every line) grows a TAIL state no more."""
    tail = LogState("x", ref_time=SIM_EPOCH, retention=TAIL)
    full = LogState("x", ref_time=SIM_EPOCH)
    lines = [f"{k}: srun: error: node{k % 900:03d}: task {k}: Exited with exit code 1" for k in range(6000)]
    lines += [f"NODE_EXIT host=node{k:04d} exit=1" for k in range(6000)]
    lines += [f"{k}: completed step: {k // 100}, seconds: 1.0" for k in range(6000)]
    for i, text in enumerate(lines, 1):
        for st in (tail, full):
            st.feed(text, i)
    assert len(full.srun_errors) == 6000 and len(full.node_exits) == 6000  # triage keeps them all
    assert len(tail.srun_errors) == EVENTS_KEEP and len(tail.node_exits) == EVENTS_KEEP
    assert tail.srun_errors[0] == full.srun_errors[0] and tail.srun_errors[-1] == full.srun_errors[-1]
    assert len(tail.task_last_step) == MAX_TASKS < len(full.task_last_step)
    assert len(tail.first_error_by_task) <= MAX_TASKS
    # Stamps on ever more days (a clock's per-day cache), in any state: a cache, so capped everywhere.
    for st in (tail, full):
        for k in range(3000):
            day = datetime.date(2010, 1, 1) + datetime.timedelta(days=k)
            st.feed(f"[{day:%Y-%m-%d} 10:00:00] node001:1:2 [0] NCCL INFO Channel 00/0", k)
        assert len(st.clock._midnights) <= 1024


def test_the_daemon_tails_with_tail_retention_and_keeps_it_across_a_truncation(tmp_path: Path) -> None:
    run = LongRun(tmp_path / "900003-JAX-long.log", job_id="900003", tasks=2)
    ft = FileTail(run.path, ref_time=SIM_EPOCH)
    run.steps(10)
    ft.poll()
    assert ft.state is not None and ft.state.retention is TAIL
    run.path.write_text("")  # truncated in place: the reader starts a fresh state
    run.steps(5)
    ft.poll()
    assert ft.state.retention is TAIL and ft.state.steps.retention is TAIL


def test_a_line_that_never_ends_does_not_grow_the_reader(tmp_path: Path) -> None:
    """A progress bar redrawn with \\r and no newline for hours: the reader keeps its two ends,
    and once the line ends, the lines after it get their real numbers and offsets."""
    run = LongRun(tmp_path / "900004-JAX-long.log", job_id="900004", tasks=2)
    run.steps(3)
    ft = FileTail(run.path, ref_time=SIM_EPOCH)
    ft.poll()
    bar = "".join(f"\rdownloading shard {k}: {'#' * (k % 50):<50}|" for k in range(400))
    for _ in range(100):  # 2 MB without a newline
        with open(run.path, "a") as fh:
            fh.write(bar)
        ft.poll()
        assert ft.reader is not None and len(ft.reader._carry) <= 2 * MAX_LINE
    with open(run.path, "a") as fh:
        fh.write("\n")
    run.line("Traceback (most recent call last):")
    run.steps(2)
    ft.poll()
    # The truth, from the bytes (read_file cuts a runaway line into pieces: not a reference here).
    raw = run.path.read_bytes()
    starts = [0] + [i + 1 for i, b in enumerate(raw) if b == 10][:-1]
    numbered = {ln: (start, raw[start : raw.index(b"\n", start)]) for ln, start in enumerate(starts, 1)}
    live = ft.state
    assert live is not None and live.lines == raw.count(b"\n")
    for rec in live.sorted_steps():
        assert f"completed step: {rec.step},".encode() in numbered[rec.line][1]
    (ev,) = live.hits["python-exception"].all()
    assert numbered[ev.line] == (ev.offset, numbered[ev.line][1]) and b"Traceback" in numbered[ev.line][1]
