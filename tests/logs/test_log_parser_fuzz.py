"""Fuzzing the log line parser (logs.state, logs.reader) and what triage makes of its result.

Lines are drawn from the shapes real logs have (docs/log-formats.md),
with every field fuzzed (numbers far out of range, NaN/inf, 5000-digit integers, hosts
and paths with shell syntax, binary garbage), mixed with random text. Properties: feeding
never raises, whatever the retention; what a tailed state keeps stays within its caps;
step records carry finite numbers only; triage and its three renderings never raise; and a
step line as MaxText prints it reads back as the numbers it was printed from.
"""

from __future__ import annotations

import math

from hypothesis import example, given
from hypothesis import strategies as st

from jobdiagd.logs import reader
from jobdiagd.logs.job import JobLogs
from jobdiagd.logs.scan import TRIGGERS, PythonScanner
from jobdiagd.logs.state import (
    EVENTS_KEEP,
    MAX_CONFIG_KEYS,
    MAX_ENV_KEYS,
    MAX_QUOTE,
    MAX_TASKS,
    MAX_TEXT,
    LogState,
)
from jobdiagd.logs.steps import MAX_STEP_SECONDS, TAIL, TRIAGE
from jobdiagd.model.jobref import JobRef
from jobdiagd.triage.engine import analyze
from jobdiagd.triage.report import render_json, render_markdown, render_row
from tests.helpers.fuzz import fuzz_settings

NOW = 1_750_000_000.0
REF = JobRef("123456", "JAX-llama2-70b", None, None, "slurm")
MAX_INPUT_LINES = 60

# -- strategies --------------------------------------------------------------------------

_odd_numbers = st.sampled_from(
    ["1e400", "-1e400", "1e308", "nan", "inf", "-inf", "-0", "0x1f", "1_000", "٣", "", "9" * 5000, "1." * 40]
)
number = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**15).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=1, max_value=400).map(lambda n: "9" * n),
    _odd_numbers,
)
_noise = st.characters(blacklist_categories=["Cs"], blacklist_characters="\n")
word = st.text(_noise, max_size=30)
host = st.one_of(
    st.sampled_from(["node001", "node-7.cluster", "$(reboot)", "a;id", "-oProxyCommand=id", "../../etc", "`id`"]),
    st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20),
)
prefix = st.one_of(
    st.just(""),
    st.sampled_from([" 0: ", "0: ", "12: ", "P0  3: ", "(MaxTextTrainerActor pid=2345) ", "[2025-06-01 12:34:56] "]),
    st.tuples(
        st.sampled_from("IWEF"), *(st.integers(0, 99) for _ in range(5)), st.integers(0, 999999)
    ).map(lambda t: f"{t[0]}{t[1]:02d}{t[2]:02d} {t[3]:02d}:{t[4]:02d}:{t[5]:02d}.{t[6]} 1 a.py:2] "),
)


def _step_line(t: tuple[str, str, str, str, str, str]) -> str:
    step, seconds, tflops, tgs, loss, extra = t
    return (
        f"completed step: {step}, seconds: {seconds}, TFLOP/s/device: {tflops}, "
        f"Tokens/s/device: {tgs}, total_weights: 196608, loss: {loss}{extra}"
    )


body = st.one_of(
    st.tuples(number, number, number, number, number, st.sampled_from(["", ", MFU: 1%", " x", ","])).map(
        _step_line
    ),
    number.map(lambda n: f"completed step: {n}"),
    number.map(lambda n: f"completed profiler activation step: {n}"),
    st.tuples(st.sampled_from(["JOB_ID", "JOB_NAME", "NNODES", "JOB_NODELIST", "RAY", "RAY_PORT",
                               "PASSTHROUGH_ARGS", "NODELIST_EXPANDED", "MODEL_NAME", "X_Y"]), word)
    .map(lambda t: f"{t[0]}={t[1]}"),
    word.map(lambda w: f'PASSTHROUGH_ARGS="steps={w} checkpoint_period={w} enable_checkpointing=true"'),
    st.tuples(st.sampled_from(["checkpoint_period", "steps", "enable_checkpointing", "x"]), number).map(
        lambda t: f"Config param {t[0]}: {t[1]}"
    ),
    st.just("========================== JOB SUMMARY =========================="),
    st.just("================================================================="),
    st.tuples(st.sampled_from(["Job", "Model", "Nodes", "Wall", "Status"]), word).map(lambda t: f"  {t[0]}: {t[1]}"),
    number.map(lambda n: f"  Wall:   {n}h {n}m {n}s"),
    number.map(lambda n: f"  Status: FAILED (exit {n}) — Training FAILED (exit={n})"),
    st.tuples(st.sampled_from(["Preflight", "Training", "Docker pull"]), st.sampled_from(["BEGIN", "END", "FAILED", "TIMEOUT"]), number)
    .map(lambda t: f"== {t[0]} {t[1]} (exit={t[2]}, {t[2]}s) =="),
    st.tuples(host, number).map(lambda t: f"NODE_EXIT host={t[0]} exit={t[1]}"),
    st.tuples(host, number).map(lambda t: f"srun: error: {t[0]}: task {t[1]}: Exited with exit code {t[1]}"),
    st.tuples(number, host).map(lambda t: f"slurmstepd: error: *** JOB {t[0]} ON {t[1]} CANCELLED AT x DUE TO TIME LIMIT ***"),
    st.tuples(host, number, host).map(lambda t: f"  ssh -J me@{t[0]} -L {t[1]}:localhost:{t[1]} root@{t[2]}"),
    number.map(lambda n: f"[Prometheus] Started on port {n} (ray: 'node001:55080')"),
    st.tuples(number, number).map(lambda t: f"[Prometheus] WARNING: port {t[0]} was occupied; using {t[1]} instead"),
    st.tuples(number, number).map(lambda t: f"[Prometheus] Port {t[0]} occupied, trying {t[1]}..."),
    st.tuples(host, number).map(lambda t: f"[Ray] Starting HEAD on {t[0]}:{t[1]} (bind=10.0.0.1)"),
    number.map(lambda n: f"restoring from this run's directory latest step   {n}"),
    number.map(lambda n: f"Saved a checkpoint at step {n}."),
    number.map(lambda n: f"Started an asynchronous checkpoint save for step {n}"),
    number.map(lambda n: f"[process=3][thread=async_save] Finished saving checkpoint (finalized tmp dir) to `/o/{n}`."),
    number.map(lambda n: f"/job:jax_worker/replica:0/task:{n}"),
    st.just("Terminating process because the JAX distributed service detected fatal errors. unhealthy"),
    st.just("====== BARRIER PASSED: Starting training loop ======"),
    st.tuples(st.sampled_from(TRIGGERS), word).map(lambda t: f"{t[1]} {t[0]} {t[1]}"),
    word,
)
line = st.tuples(prefix, body).map(lambda t: t[0] + t[1])
raw_line = st.one_of(
    line.map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ")),
    st.tuples(st.sampled_from([64 << 10, 70_000]), st.sampled_from(TRIGGERS)).map(
        lambda t: t[1].encode() + b"x" * t[0]  # longer than MAX_LINE_BYTES: cut in the middle
    ),
)
log = st.lists(raw_line, max_size=MAX_INPUT_LINES)

# -- checks --------------------------------------------------------------------------------


def _fed(lines: list[bytes], retention: object, *, full: bool) -> LogState:
    state = LogState("fuzz.log", ref_time=NOW, retention=retention)  # type: ignore[arg-type]
    buf = b"\n".join(lines) + b"\n"
    reader.feed_buffer(state, buf, base_offset=0, first_lineno=1, full=full, scan=PythonScanner())
    return state


def _check_bounded(st_: LogState) -> None:
    """What a state keeps per line stays within the module's caps (memory per input is bounded)."""
    for items in (st_.stages, st_.node_exits, st_.srun_errors, st_.prom_port_tried, st_.restarts):
        assert len(items) <= EVENTS_KEEP
    for tasks in (st_.task_last_step, st_.first_error_by_task):
        assert len(tasks) <= MAX_TASKS
    assert len(st_.env) <= MAX_ENV_KEYS and len(st_.config) <= MAX_CONFIG_KEYS
    for hits in st_.hits.values():
        assert len(hits.first) <= hits.keep and len(hits.last) <= hits.keep
        for ev in hits.all():
            assert len(ev.text) <= MAX_TEXT
            assert ev.raw is None or len(ev.raw) <= MAX_QUOTE + len(" [...] ")
    for rec in st_.sorted_steps():
        for value in (rec.seconds, rec.tgs, rec.tflops):
            assert value is None or math.isfinite(value), rec
    assert math.isfinite(st_.steps.sum_seconds) and math.isfinite(st_.superseded_seconds)


@fuzz_settings(examples=150)
@given(log)
# Found by this test: `seconds: 1e400` made every later sum infinite and the report's duration
# formatter raise OverflowError; a checkpoint period of 1e400 raised in the parser itself.
@example([b"completed step: 0, seconds: 1e400, loss: 1"])
@example([b"completed step: 0, seconds: 1.0", b"completed step: 1, seconds: 1e308", b"completed step: 2, seconds: 1e308"])
@example([b"Config param checkpoint_period: 1e400"])
@example([b"Config param checkpoint_period: inf"])
# A 5000-digit number is over Python's int-from-text limit (ValueError), and a 400-digit Wall
# over float's range (OverflowError).
@example([b"NODE_EXIT host=a exit=" + b"9" * 5000])
@example([b"completed step: " + b"9" * 5000])
@example([b"P0  3: completed step: " + b"9" * 5000 + b", seconds: 1"])
@example([b"JOB SUMMARY", b"  Wall: " + b"9" * 400 + b"s", b"======"])
def test_any_log_is_parsed_and_triaged_without_raising(lines: list[bytes]) -> None:
    for retention in (TRIAGE, TAIL):
        for full in (True, False):
            state = _fed(lines, retention, full=full)
            _check_bounded(state)
            result = analyze(JobLogs(REF, state), now=NOW)
            for text in (render_markdown(result), render_json(result), render_row(result)):
                assert len(text) < 200_000  # quotes and lists are capped: a report stays small


finite = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)


@fuzz_settings(examples=200)
@given(
    prefix,
    st.integers(min_value=0, max_value=10**9),
    st.floats(min_value=0, max_value=MAX_STEP_SECONDS),  # above it, a step time is garbage (None)
    finite,
    finite,
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.booleans(),
)
def test_a_printed_step_line_reads_back_as_its_numbers(
    pre: str, step: int, seconds: float, tflops: float, tgs: float, loss: float, mfu: bool
) -> None:
    mfu_field = " MFU: 16.08%," if mfu else ""
    text = (
        f"{pre}completed step: {step}, seconds: {seconds!r}, TFLOP/s/device: {tflops!r},{mfu_field} "
        f"Tokens/s/device: {tgs!r}, total_weights: 196608, loss: {loss!r}"
    )
    for retention in (TRIAGE, TAIL):
        for feed in ("bytes", "text"):  # the fast path and the general one
            state = LogState("s.log", ref_time=NOW, retention=retention)
            if feed == "bytes":
                state.feed_bytes(text.encode(), 1)
            else:
                state.feed(text, 1)
            (rec,) = state.sorted_steps()
            assert (rec.step, rec.seconds, rec.tflops, rec.tgs, rec.loss) == (step, seconds, tflops, tgs, loss)


# Lines a 64 KB cap still lets through, built to make a backtracking regex retry at every
# repeat: each took from 5 s to over 3 minutes on one line before the patterns were bounded.
_ADVERSARIAL = (
    "WorkNCCL(",
    "Check failed",
    "Non-OK-status",
    "RET_CHECK failure",
    "HloModule",
    ".__lock",
    "NCCL WARN",
    "Failed to acquire lock",
    "[OS error",
    "Finished saving checkpoint",
    "*** JOB 1 CANCELLED AT ",
    "ssh -J a -L 1:localhost:1 b",
    "[ERROR] Login to",
    "completed step: ",
    # Issue 16's families: start-up and checkpoint barriers, XLA frames, autotuner launches,
    # traceback frames without a header.
    "DEADLINE_EXCEEDED: Barrier timed out. Id: ",
    "XlaRuntimeError DEADLINE_EXCEEDED",
    "@ 0x1 xla::",
    "Failed to launch autotun",
    '", line 1, in f',
    "(most recent call last):",
    "Error writing DEADLINE_EXCEEDED",
)


@fuzz_settings(examples=40)
@given(st.sampled_from(_ADVERSARIAL), st.sampled_from(["", " ", "a", "1", ")", "/", "-", "  \t"]), st.booleans())
@example("WorkNCCL(", ")", True)
@example("Check failed", "a", False)
@example("ssh -J a -L 1:localhost:1 b", " ", False)
@example("*** JOB 1 CANCELLED AT ", "-", False)
def test_a_long_repetitive_line_is_parsed_within_the_deadline(needle: str, sep: str, repeat: bool) -> None:
    unit = needle + sep
    text = unit * (60_000 // len(unit)) if repeat else needle + (sep or "a") * 60_000 + "x"
    for retention in (TRIAGE, TAIL):
        state = LogState("long.log", ref_time=NOW, retention=retention)
        state.feed("JOB SUMMARY", 1)  # the summary-line branch reads the line too
        state.feed_bytes(text.encode(), 2)
        state.feed(text, 3)
        _check_bounded(state)
