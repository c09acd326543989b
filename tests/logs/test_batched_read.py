"""The batched body read (`logs.body`, `LogState.add_fast_steps`) against the line-by-line
reference (`read_fd(batched=False)`): same state, same reports, on messy generated logs."""

from __future__ import annotations

import dataclasses
import math
import random
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobdiagd.logs import body, reader
from jobdiagd.logs.body import BodyPiece, StepColumns, scan_buffer
from jobdiagd.logs.scan import HyperscanScanner, NeedleGate, PythonScanner
from jobdiagd.logs.state import LogState, StampClock, parse_fast_step
from jobdiagd.logs.steps import TAIL, TRIAGE, Retention, StepSeries
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.records import StepRecord
from jobdiagd.rules.signatures import SIGNATURE_NEEDLES
from jobdiagd.triage.engine import analyze
from jobdiagd.triage.report import render_json, render_markdown

NOW = 1781900000.0  # 2026-06-19: the generated June stamps are in the past


def _now(seed: int) -> float:
    """Every third log is read on New Year's Eve: its January stamps roll the clock over."""
    return NOW if seed % 3 else 1798750800.0  # 2026-12-31 ~21:00-23:00 in any zone near UTC


# ---------------------------------------------------------------- messy logs

_NOISE = [
    "node{h:03d}:81838:82106 [0] NCCL INFO NET/IB : Using [0]bnxt_re0:1/RoCE",
    "node{h:03d}:34444:34444 [0] NCCL WARN MSCCL++: Feature not enabled. ENABLE_MSCCLPP must be defined",
    "I0612 08:10:00.000000 134444 xla_bridge.py:907] Unable to initialize backend 'cuda': Failed call to cuInit",
    "W0612 08:10:00.000000 152625 topology.cc:1011] Cannot read CPU core 147",
    "\x1b[33mWARNING\x1b[0m: tensorboard data loader is slow (8.9s); consider prefetch",
    "Error response from daemon: cannot remove container",
    "node{h:03d}:1:2 [3] NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0",
    "Traceback (most recent call last):",
    '  File "/maxtext/train.py", line 10, in <module>',
    "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.0GiB",
    "Saved a checkpoint at step {s}.",
    "restoring from this run's directory latest step {s}",
    "completed profiler activation step: {s}",
    "[Prometheus] Started on port 9191",
    "Config param checkpoint_period: 50",
    "====== BARRIER PASSED: Starting training loop ======",
]


def _stamp(t: float) -> str:
    """An absl `MMDD hh:mm:ss.uuuuuu` for `t` seconds after June 12 00:00."""
    sec = t % 86400
    month, day = (6 if t < 86400 * 20 else 7), 12 + int(t // 86400) % 19
    clock = f"{int(sec // 3600):02d}:{int(sec % 3600 // 60):02d}:{int(sec % 60):02d}"
    return f"{month:02d}{day:02d} {clock}.{int(t * 1e6) % 1_000_000:06d}"


def messy_log(seed: int) -> bytes:
    """A multi-task job log that exercises every branch of the step fast path: srun -l and
    srun -u (lines glued together), dated and undated steps, restarts with and without a
    restore line, steps going back, gaps and repeats, CR line ends, colour codes, Ray actors,
    odd `seconds:` fields, binary garbage, huge and runaway lines, New Year, future stamps."""
    rng = random.Random(seed)
    tasks = rng.choice([1, 3, 12, 24])
    width = len(str(tasks - 1))
    het = rng.random() < 0.15
    dated = rng.random() < 0.7
    ray = rng.random() < 0.15

    def pre(task: int) -> str:
        if tasks == 1:
            return ""
        p = f"{task:>{width}}: "
        return f"P0 {p}" if het else p

    out: list[bytes] = []
    emit = out.append
    emit(f'JOB_ID={seed}\nJOB_NAME=JAX-messy\nNNODES={tasks}\nPASSTHROUGH_ARGS="steps=400"\n'.encode())
    for task in range(tasks):
        emit(f"{pre(task)}HOSTNAME=node{task + 1:03d}\n".encode())
        emit(f"{pre(task)}RAY=0\n".encode())
    t = rng.choice([0.0, 86400.0 * 3 + 86000.0])  # some runs cross midnight
    new_year = rng.random() < 0.1
    step = 0
    nsteps = rng.randint(30, 900)
    for _ in range(nsteps):
        t += rng.uniform(0.5, 900.0 if rng.random() < 0.01 else 6.0)
        r = rng.random()
        if r < 0.02:
            step = max(0, step - rng.randint(1, 20))  # back without a restore line
        elif r < 0.04:
            step = max(0, step - rng.randint(1, 20))
            emit(f"{pre(0)}restoring from this run's directory latest step {step - 1}\n".encode())
        elif r < 0.06:
            step += rng.randint(2, 50)  # a gap
        elif r > 0.98:
            pass  # the same step again
        else:
            step += 1
        secs = (
            rng.choice(["5.645", "5", ".5", "5.", "1e-3", "nan", "5.6.7", ""])
            if rng.random() < 0.05
            else f"{rng.uniform(1, 9):.3f}"
        )
        fields = f", seconds: {secs}, TFLOP/s/device: 51.2, Tokens/s/device: {rng.uniform(3000, 3400):.3f}, loss: 3.2"
        if rng.random() < 0.02:
            fields = f" seconds: {secs}" if rng.random() < 0.5 else ""
        order = list(range(tasks))
        if rng.random() < 0.5:
            rng.shuffle(order)
        for task in order:
            stamp = ""
            if dated:
                mon_day = "1231" if new_year and t < 86400 * 2 else None
                st_ = _stamp(t)
                if mon_day:
                    st_ = mon_day + st_[4:]
                elif new_year:
                    st_ = "0101" + st_[4:]
                if rng.random() < 0.01:
                    st_ = "0231" + st_[4:]  # no such day
                if rng.random() < 0.005:
                    st_ = "1230" + st_[4:]  # half a year back: the clock rolls over
                stamp = f"I{st_} {130000 + task} metric_logger.py:232] "
            actor = f"(MaxTextTrainerActor pid={100 + task}, ip=10.0.0.{task}) " if ray else ""
            line = f"{pre(task)}{actor}{stamp}completed step: {step}{fields}"
            x = rng.random()
            if x < 0.01:
                line += "\r"
            elif x < 0.02:
                line = line.replace("completed", "\x1b[32mcompleted", 1)
            elif x < 0.03:
                line += f"{pre(rng.randrange(tasks))}completed step: {step + 1}, seconds: 1.0"  # srun -u
            elif x < 0.035:
                line = f"{pre(task)}completed step: {step}{pre(task)}{stamp}completed step: {step}{fields}"
            elif x < 0.04:
                line += ", junk: \x1b[0m"
            elif x < 0.045:
                line = line.replace("completed step: ", "[Rampup Batch Size Phase], completed step: ", 1)
            elif x < 0.05:
                line = "  " + line
            emit(line.encode("utf-8") + b"\n")
        for _ in range(rng.randint(0, 6)):
            tmpl = rng.choice(_NOISE)
            task = rng.randrange(tasks)
            emit(f"{pre(task)}{tmpl.format(h=task + 1, s=step)}\n".encode())
        z = rng.random()
        if z < 0.01:
            emit(bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))) + b"\n")
        elif z < 0.012:
            emit(
                f"{pre(0)}".encode()
                + b"x" * rng.choice([5000, 70_000, 300_000])
                + b" completed step: 3, seconds: 1.0\n"
            )
        elif z < 0.014:
            emit(
                f"{pre(0)}{_stamp(t)[:4]}".encode()
                + "é".encode() * 3
                + b" completed step: 99999999999, seconds: 1.0\n"
            )
    if rng.random() < 0.5:
        emit(
            b"====================== JOB SUMMARY ==========================\nStatus: SUCCESS (exit 0)\nWall: 1h 2m 3s\n"
        )
    if rng.random() < 0.3:
        emit(b" 0: no newline at the end completed step: 5, seconds: 1.0")
    return b"".join(out)


# ---------------------------------------------------------------- comparisons


def _state_facts(state: LogState) -> dict[str, Any]:
    """Every attribute of a state, the step store's internals included (not the clock's caches)."""
    facts: dict[str, Any] = {}
    for key, value in vars(state).items():
        if key == "clock":
            facts[key] = (value.ref_year, value.learned_year, value._latest)
        elif key == "steps":
            facts[key] = _series_facts(value)
        elif key == "hits":
            facts[key] = {cls: list(h.all()) for cls, h in value.items()}
        else:
            facts[key] = value
    return _canon(facts)


def _series_facts(series: StepSeries) -> dict[str, Any]:
    out = dict(vars(series))
    out["_recent"] = list(series._recent.items())  # the order is the eviction order
    out["_sampled"] = sorted(series._sampled.items())
    out["_early"] = sorted(series._early.items())
    return _canon(out)


def _canon(x: Any) -> Any:
    """`x` with NaN comparable (a `seconds: nan` field sums to NaN on both paths)."""
    if isinstance(x, float) and x != x:
        return "NaN"
    if isinstance(x, dict):
        return {k: _canon(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(_canon(v) for v in x) if not hasattr(x, "_fields") else x
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, *(_canon(getattr(x, f.name)) for f in dataclasses.fields(x)))
    return x


def _read(path: Path, *, batched: bool, workers: int, retention: Retention | None, now: float) -> LogState:
    return reader.read_file(
        path, LogState(str(path), ref_time=now, retention=retention), batched=batched, workers=workers
    )


def _report(state: LogState, path: Path, now: float) -> tuple[str, str] | str:
    """The triage report of a state (markdown, JSON), or the error it fails with (a NaN
    `seconds:` field makes the summed time NaN, which the report cannot print: noted, not
    this test's business, but both paths must fail alike)."""
    from jobdiagd.logs.job import JobLogs

    ref = JobRef(job_dir=None, log=path, job_id=None, name="messy", platform="slurm")
    result = analyze(JobLogs(ref=ref, main=state), now=now)
    try:
        return render_markdown(result), render_json(result)
    except ValueError as exc:
        return repr(exc)


@pytest.fixture
def small_pieces() -> Iterator[None]:
    """Small heads, tails, chunks, pieces and folds: every boundary is crossed many times."""
    mp = pytest.MonkeyPatch()
    mp.setattr(reader, "HEAD_FULL", 2000)
    mp.setattr(reader, "TAIL_FULL", 1500)
    mp.setattr(reader, "PARALLEL_MIN", 0)
    mp.setattr(reader, "PIECE", 40_000)
    mp.setattr(reader, "CHUNK", 300_000)
    mp.setattr(reader, "FOLD_STEPS", 37)
    yield
    mp.undo()


@pytest.mark.parametrize("seed", range(24))
def test_batched_read_equals_reference(tmp_path: Path, seed: int, small_pieces: None) -> None:
    path = tmp_path / f"{seed}.log"
    path.write_bytes(messy_log(seed))
    now = _now(seed)
    for retention in (TRIAGE, TAIL, None):
        ref = _read(path, batched=False, workers=1, retention=retention, now=now)
        want = _state_facts(ref)
        for workers in (1, 2):
            got = _read(path, batched=True, workers=workers, retention=retention, now=now)
            assert _state_facts(got) == want, (seed, retention, workers)
        if retention is TRIAGE:
            assert _report(got, path, now) == _report(ref, path, now)


def test_messy_logs_take_every_path(tmp_path: Path, small_pieces: None) -> None:
    """The generated logs reach the bulk fold, the one-by-one fallbacks and the clock's special
    cases (so the test above compares what it claims to)."""
    seen: dict[str, int] = {"bulk": 0, "one": 0, "clock-none": 0}
    real_run, real_one = LogState._fast_run, LogState._one_fast_step
    real_epochs = StampClock.epochs_undated

    def run(self: LogState, *a: Any) -> bool:
        ok = real_run(self, *a)
        seen["bulk"] += ok
        return ok

    def one(self: LogState, *a: Any) -> None:
        seen["one"] += 1
        real_one(self, *a)

    def epochs(self: StampClock, *a: Any) -> Any:
        got = real_epochs(self, *a)
        seen["clock-none"] += got is None
        return got

    mp = pytest.MonkeyPatch()
    mp.setattr(LogState, "_fast_run", run)
    mp.setattr(LogState, "_one_fast_step", one)
    mp.setattr(StampClock, "epochs_undated", epochs)
    try:
        for seed in range(24):
            path = tmp_path / f"{seed}.log"
            path.write_bytes(messy_log(seed))
            _read(path, batched=True, workers=1, retention=TRIAGE, now=_now(seed))
    finally:
        mp.undo()
    assert seen["bulk"] > 50 and seen["one"] > 50 and seen["clock-none"] > 0, seen


# ---------------------------------------------------------------- the pieces


_prefix = st.sampled_from(["", " 0: ", "0: ", "  0: ", " 3: ", "P0  0: ", "P1 0: ", "12: ", " 0:  "])
_actor = st.sampled_from(
    ["", "(MaxTextTrainerActor pid=12) ", "(A pid=1, ip=1.2.3.4) ", "(x pid=1 completed step: 4, ) "]
)
_stamp_s = st.sampled_from(
    [
        "",
        "I0612 08:12:31.187187 143111 metric_logger.py:232] ",
        "E1231 23:59:59.9 1 a.py:1] ",
        "I0612 08:12:31 1 a.py:1] ",
        "I0612 08:12:31.1234567 1 a.py:1] ",
        "W0012 00:00:00.000001 7  b] ",
        "I0612 08:12:31.187187 1 a b.py:1] ",
        "I0612 08:12:31.187187\t1 a.py:1] ",
    ]
)
# Absurd numbers too (19 and 5000 digits, 10 digits of seconds, 1e400): the full parser drops
# them, so the columns must not take them either.
_num = st.sampled_from(["7", "0", "0012", "123456789012", "", "7a", "-1", "٣", "9" * 19, "9" * 5000])
_secs = st.sampled_from(
    ["5.645", "5", ".5", "5.", "1e-3", "", "5.6.7", "00.10", "nan", "١.٥", "9999999999.5", "1e400", "9" * 400 + ".0"]
)
_tail = st.sampled_from(["", ", loss: 3.2", ",", " , x", "\r", "\x1b[0m", ", TFLOP/s: 1\r", "é"])


@st.composite
def _step_lines(draw: st.DrawFn) -> str:
    rampup = draw(st.sampled_from(["", "[Rampup Batch Size Phase], "]))
    sep = draw(st.sampled_from([", seconds: ", ",seconds: ", ", seconds:", " seconds: "]))
    return (
        draw(_prefix)
        + draw(_actor)
        + draw(_stamp_s)
        + rampup
        + "completed step: "
        + draw(_num)
        + sep
        + draw(_secs)
        + draw(_tail)
    )


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_step_lines(), min_size=1, max_size=12), st.sampled_from([(), (b" 0: ",), (b" 0: ", b"P0  0: ")])
)
def test_fast_step_columns_equal_parse_fast_step(lines: list[str], prefixes: tuple[bytes, ...]) -> None:
    """Each step line lands in the columns with exactly `parse_fast_step`'s facts, or among the
    other candidates when `parse_fast_step` would not parse it."""
    data = b"\n" + "\n".join(lines).encode("utf-8", "surrogateescape")
    for scan in (HyperscanScanner(), PythonScanner()):
        piece = BodyPiece()
        scan_buffer(data, len(data) - 1, 1000, prefixes, scan, piece)
        cols = piece.steps
        rows = data[1:].split(b"\n")
        for j in range(len(cols)):
            raw = rows[cols.line[j]]
            assert cols.offset[j] == 1000 + sum(len(r) + 1 for r in rows[: cols.line[j]])
            assert cols.length[j] == len(raw)
            assert cols.fast(j, raw) == parse_fast_step(raw), raw
        for i, offset, raw in piece.others:
            assert rows[i] == raw and parse_fast_step(raw) is None
            assert offset == 1000 + sum(len(r) + 1 for r in rows[:i])
        assert piece.lines == len(rows)


def _records(steps: list[int], seconds: list[float | None]) -> list[StepRecord]:
    return [
        StepRecord(s, x, None, None, None, float(s), s + 1, 0, "t")
        for s, x in zip(steps, seconds, strict=True)
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 40), min_size=0, max_size=400),
    st.lists(st.integers(1, 40), min_size=1, max_size=5000),
    st.sampled_from(
        [
            TRIAGE,
            Retention(early=3, recent=5, sampled=4),
            Retention(early=4, recent=3, sampled=2, early_by_count=True),
            None,
        ]
    ),
    st.integers(0, 2),
    st.randoms(use_true_random=False),
)
def test_add_run_equals_add(
    before: list[int], run: list[int], retention: Retention | None, start: int, rng: random.Random
) -> None:
    """`StepSeries.add_run` leaves exactly the store `add` one by one leaves."""
    steps_before = list(itertools_accumulate(start, before))
    steps_run = list(itertools_accumulate(steps_before[-1] if steps_before else start, run))
    secs = [None if rng.random() < 0.05 else rng.uniform(0.1, 9.0) for _ in steps_before + steps_run]
    recs = _records(steps_before + steps_run, secs)
    one, bulk = StepSeries(retention), StepSeries(retention)
    for rec in recs[: len(steps_before)]:
        one.add(rec)
        bulk.add(rec)
    for rec in recs[len(steps_before) :]:
        one.add(rec)
    lo = len(steps_before)
    made: list[int] = []

    def make(i: int) -> StepRecord:
        made.append(i)
        return recs[i]

    all_steps = steps_before + steps_run
    bulk.add_run(all_steps, secs[lo:], lo, len(all_steps), make)
    assert _series_facts(bulk) == _series_facts(one)
    if retention is TRIAGE and len(steps_run) > 5000:
        assert len(made) < len(steps_run)


def itertools_accumulate(start: int, gaps: list[int]) -> Iterator[int]:
    for g in gaps:
        start += g
        yield start


_md = st.tuples(st.integers(0, 13), st.integers(0, 32), st.floats(0, 86399.999999))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_md, min_size=1, max_size=60),
    st.sampled_from([1781900000.0, 1767225600.0 + 3600, 1700000000.0]),
    st.booleans(),
)
def test_epochs_undated_equals_epoch_undated(
    stamps: list[tuple[int, int, float]], now: float, learn: bool
) -> None:
    """The clock over a run at once gives `epoch_undated`'s values and leaves the same latest
    stamp; when it declines (year not learned, New Year), it changed nothing."""
    months, days, secs = (
        array("q", [s[0] for s in stamps]),
        array("q", [s[1] for s in stamps]),
        array("d", [s[2] for s in stamps]),
    )
    one, bulk = StampClock(now), StampClock(now)
    if learn:
        one.epoch_undated(6, 12, 100.0)
        bulk.epoch_undated(6, 12, 100.0)
    before = (bulk.ref_year, bulk.learned_year, bulk._latest)
    got = bulk.epochs_undated(months, days, secs, 0, len(stamps))
    if got is None:
        assert (bulk.ref_year, bulk.learned_year, bulk._latest) == before
        return
    want = [one.epoch_undated(m, d, s) if m else None for m, d, s in stamps]
    assert got == want
    assert (bulk.ref_year, bulk.learned_year, bulk._latest) == (one.ref_year, one.learned_year, one._latest)


def test_columns_pickle_and_nan_means_no_seconds() -> None:
    import pickle

    cols = StepColumns()
    data = b"\n 0: completed step: 3, x: 1\n 0: completed step: 4, seconds: 2.5\n"
    piece = BodyPiece()
    scan_buffer(data, len(data) - 1, 0, (b" 0: ",), HyperscanScanner(), piece)
    cols = pickle.loads(pickle.dumps(piece.steps))
    assert list(cols.step) == [3, 4] and math.isnan(cols.seconds[0])
    assert cols.fast(0, b" 0: completed step: 3, x: 1")[5] is None
    assert body.NO_TASK == -1 and list(cols.task) == [0, 0]


_needle_text = st.lists(
    st.one_of(
        st.sampled_from(SIGNATURE_NEEDLES),
        st.text(max_size=20),
        st.sampled_from(["\ud800", "é", "\x00", "NCCL", " WARN", "Error"]),
    ),
    max_size=6,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(_needle_text, min_size=1, max_size=8), st.sampled_from([0, 3, NeedleGate.WARM_UP]))
def test_needle_gate_is_substring_search(texts: list[str], warm_up: int) -> None:
    """The gate in front of `match_line` says yes exactly when a signature needle is in the line,
    with hyperscan (after its warm-up) and with the regex alike."""
    gate = NeedleGate(SIGNATURE_NEEDLES)
    gate.WARM_UP = warm_up
    for text in texts * 2:
        assert gate(text) == any(n in text for n in SIGNATURE_NEEDLES), text
    assert (gate._hs is not None) == (len(texts) * 2 > warm_up)


_head_line = st.tuples(
    st.sampled_from(
        ["", " 0: ", "0: ", "  0: ", "P0 0: ", "P1  3: ", " 1: ", "12: ", "00: ", "1234567: ", " 7: "]
    ),
    st.sampled_from(["x", "NNODES=24", "NNODES=3", "NNODES=", "0: y", "", "completed step: 1"]),
).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(_head_line, max_size=30))
def test_task0_prefixes_equals_the_walk_over_every_line(lines: list[str]) -> None:
    head = "\n".join(lines).encode()
    assert reader.task0_prefixes(head) == reader._task0_reference(head)
