"""The streaming reader: pre-filter equivalence, prefixes, and arbitrary bytes never crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobdiagd.logs import reader
from jobdiagd.logs.prefixes import strip
from jobdiagd.logs.scan import (
    HARMLESS_AFTER,
    HARMLESS_ONLY,
    TRIGGERS,
    HyperscanScanner,
    PythonScanner,
    candidates,
)
from jobdiagd.logs.state import LogState, parse_wall
from jobdiagd.logs.steps import parse_step_fields

_literal = st.sampled_from(TRIGGERS + tuple(h.decode() for h in HARMLESS_ONLY))
# A HARMLESS_AFTER literal followed by its tail cut anywhere (the whole tail: no trigger).
_cut_tail = st.sampled_from(sorted(HARMLESS_AFTER.items())).flatmap(
    lambda kv: st.integers(0, len(kv[1])).map(lambda k: kv[0] + kv[1][:k].decode())
)
_line = st.one_of(
    _literal.map(lambda t: f"x {t} y"),
    _cut_tail.map(lambda t: f"x {t}"),
    _cut_tail.map(lambda t: f"x {t}. y"),
    st.tuples(_literal, _literal).map(lambda ts: f"{ts[0]} {ts[1]}"),
    st.text(alphabet=st.characters(blacklist_characters="\n"), max_size=60),
)


_HS, _PY = HyperscanScanner(), PythonScanner()
_step = st.tuples(
    st.sampled_from([" 0: ", " 3: ", "", "P0  0: ", "I0612 10:15:22.481234 1 a.py:2] ", "12: "]),
    st.sampled_from(["", " MSCCL++: Feature not enabled", " NCCL WARN", " NCCL WARN MSCCL++: Feature not enabled"]),
).map(lambda t: f"{t[0]}completed step: 7, seconds: 1.0{t[1]}")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_line, _step), max_size=40))
def test_scanners_agree(lines: list[str]) -> None:
    buf = "\n".join(lines).encode("utf-8", "replace")
    assert candidates(_HS, buf) == candidates(_PY, buf)
    assert candidates(_HS, buf, (b" 0: ", b"P0  0: ")) == candidates(_PY, buf, (b" 0: ", b"P0  0: "))


@pytest.mark.parametrize("scan", [_HS, _PY], ids=["hyperscan", "python"])
def test_a_trigger_followed_by_its_harmless_tail_is_no_trigger(scan: Any) -> None:
    assert "NCCL WARN" in TRIGGERS and "NCCL WARN" in HARMLESS_AFTER
    lines = [
        "a NCCL WARN MSCCL++: Feature not enabled. ENABLE_MSCCLPP must be defined",  # harmless
        "b NCCL WARN MSCCL++: Feature not enabled NCCL WARN Timeout",  # a second, real one
        "c NCCL WARN MSCCL++: Feature",  # the tail cut short: a trigger
        "d NCCL WARN",  # at the line's end
        "e NCCL WARN NET/IB : Got completion with error 12",
        " 3: NCCL WARN MSCCL++: Feature not enabled completed step: 7, seconds: 1.0",  # other task
        "f NCCL WARN MSCCL++",  # at the buffer's end
    ]
    buf = "\n".join(lines).encode()
    picked = [buf[s:].split(b"\n", 1)[0].decode()[0] for s in candidates(scan, buf, (b" 0: ",))]
    assert picked == ["b", "c", "d", "e", "f"]


def test_step_prefilter_takes_task_zero_and_unprefixed_lines() -> None:
    lines = [
        " 0: completed step: 1, seconds: 1",
        " 3: completed step: 1, seconds: 1",
        "completed step: 2, seconds: 1",
        "(MaxTextTrainerActor pid=1) completed step: 3, seconds: 1",
        "12: completed step: 4, seconds: 1",
    ]
    buf = "\n".join(lines).encode()
    picked = [buf[s:].split(b"\n", 1)[0].decode() for s in candidates(_HS, buf, (b" 0: ",))]
    assert picked == [lines[0]]
    every = [buf[s:].split(b"\n", 1)[0].decode() for s in candidates(_HS, buf)]
    assert every == lines


def _facts(state: LogState) -> tuple[object, ...]:
    return (
        sorted((s.step, s.seconds, s.tgs, s.line) for s in state.steps.values()),
        {k: [(e.line, e.text) for e in v.all()] for k, v in state.hits.items()},
        state.header,
        state.config,
        state.summary,
        state.node_exits,
        state.restore,
        state.prom_port,
        state.tunnel,
    )


def test_prefiltered_read_equals_full_parse(
    corpus: tuple[Path, dict[str, dict[str, object]]], monkeypatch: object
) -> None:
    root, exps = corpus
    logs = sorted(root.glob("*.log"))[:25]
    assert logs
    import pytest

    mp = pytest.MonkeyPatch()
    mp.setattr(reader, "HEAD_FULL", 0)
    mp.setattr(reader, "TAIL_FULL", 0)
    try:
        for log in logs:
            fast = reader.read_file(log, LogState(str(log), ref_time=2e9))
            full = reader.read_file(log, LogState(str(log), ref_time=2e9), full=True)
            f1, f2 = _facts(fast), _facts(full)
            assert f1 == f2, log
            assert fast.lines == full.lines
    finally:
        mp.undo()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=4000))
def test_arbitrary_bytes_never_crash(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "x.log"
    p.write_bytes(data)
    state = reader.read_file(p, LogState(str(p), ref_time=1.7e9))
    assert state.bytes == len(data)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_lines_never_crash(text: str) -> None:
    state = LogState("t", ref_time=1.7e9)
    for i, line in enumerate(text.split("\n")):
        state.feed(line, i + 1)


def test_prefix_mix() -> None:
    s = strip(
        " 3: (MaxTextTrainerActor pid=2345, ip=10.0.0.1) I0612 10:15:22.481234 139872 metric_logger.py:232] completed step: 5"
    )
    assert (s.task, s.ray_actor, s.level, s.text) == (3, "MaxTextTrainerActor", "I", "completed step: 5")
    assert strip("P0  3: hello").task == 3
    assert strip("\x1b[1mStatus: SUCCESS (exit 0)\x1b[0m").text == "Status: SUCCESS (exit 0)"
    s2 = strip("[2025-06-01 12:34:56] node001:1:2 [3] NCCL WARN x")
    assert s2.stamp is not None and s2.stamp.year == 2025 and s2.text.startswith("node001")


def test_step_field_variants() -> None:
    f = parse_step_fields(
        " seconds: 5.668, TFLOP/s/device: 134.909, MFU: 16.08%, Tokens/s/device: 8671.794, total_weights: 196608, loss: 10.879"
    )
    assert (
        f["seconds"] == 5.668
        and f["Tokens/s/device"] == 8671.794
        and f["MFU"] == 16.08
        and f["loss"] == 10.879
    )
    assert parse_step_fields(", seconds: 2.0, TFLOP/s: 100.0, loss 10.4") == {
        "seconds": 2.0,
        "TFLOP/s": 100.0,
        "loss": 10.4,
    }
    st_ = LogState("t", ref_time=1.7e9)
    st_.feed(
        "[Rampup Batch Size Phase], completed step: 3, seconds: 1.5, Tokens/s/device: 10.0, loss: 9.0", 1
    )
    st_.feed("completed profiler activation step: 4", 2)
    assert st_.steps[3].seconds == 1.5 and 4 in st_.steps and st_.steps[4].seconds is None


def test_wall_forms() -> None:
    assert parse_wall("1h 1m 2s") == 3662
    assert parse_wall("3m 5s") == 185
    assert parse_wall("42s") == 42
    assert parse_wall("garbage") is None


def test_wall_in_slurm_clock_forms_reads_as_slurm_does() -> None:
    # One parser for Slurm's duration syntax (rules.slurm.parse_slurm_duration): D-H:MM is
    # days-hours:minutes, as squeue/sacct mean it (read as days-minutes:seconds before).
    assert parse_wall("1-02:03:04") == 86400 + 2 * 3600 + 3 * 60 + 4
    assert parse_wall("1-02:03") == 86400 + 2 * 3600 + 3 * 60
    assert parse_wall("01:02:03") == 3723
    assert parse_wall("12:34") == 12 * 60 + 34


def test_tail_reader_incremental_truncation_and_rotation(tmp_path: Path) -> None:
    p = tmp_path / "a.log"
    p.write_text("0: completed step: 0, seconds: 1.0\n0: completed st")
    t = reader.TailReader(p, LogState(str(p), ref_time=1.7e9))
    t.poll()
    assert sorted(t.state.steps) == [0]
    with p.open("a") as fh:
        fh.write("ep: 1, seconds: 1.0\n")
    t.poll()
    assert sorted(t.state.steps) == [0, 1]
    assert t.state.steps[1].line == 2
    p.write_text("0: completed step: 7, seconds: 1.0\n")  # truncated/rewritten: smaller than offset
    t.poll()
    assert sorted(t.state.steps) == [7]
    p.unlink()
    p.write_text("0: completed step: 9, seconds: 1.0\n0: completed step: 10, seconds: 1.0\n")
    t.poll()
    assert 9 in t.state.steps


@pytest.mark.parametrize("small_buffer", [0, reader.SMALL_BUFFER])
def test_parallel_read_equals_serial_read(
    corpus: tuple[Path, dict[str, dict[str, object]]], tmp_path: Path, small_buffer: int
) -> None:
    """Forked workers pre-filtering small pieces give the same facts, line numbers and offsets."""
    root, _ = corpus
    logs = sorted(root.glob("*.log"), key=lambda p: -p.stat().st_size)[:6]
    # One long log from several (so pieces cut through steps, events and the summary), and an
    # unterminated last line.
    big = tmp_path / "joined.log"
    big.write_bytes(b"".join(p.read_bytes() for p in logs) + b" 0: Error: no newline at the end")
    mp = pytest.MonkeyPatch()
    mp.setattr(reader, "HEAD_FULL", 1000)
    mp.setattr(reader, "TAIL_FULL", 1000)
    mp.setattr(reader, "PARALLEL_MIN", 0)
    mp.setattr(reader, "PIECE", 3000)
    mp.setattr(reader, "SMALL_BUFFER", small_buffer)  # 0: the vectorised path everywhere
    used: list[int] = []
    real = reader._parallel_middle

    def spy(*args: Any, **kwargs: Any) -> int:
        used.append(1)
        return real(*args, **kwargs)

    mp.setattr(reader, "_parallel_middle", spy)
    try:
        for path in [big, *logs]:
            serial = reader.read_file(path, LogState(str(path), ref_time=2e9), workers=1)
            parallel = reader.read_file(path, LogState(str(path), ref_time=2e9), workers=2)
            assert _facts(parallel) == _facts(serial), path
            offsets = {k: [e.offset for e in v.all()] for k, v in serial.hits.items()}
            assert {k: [e.offset for e in v.all()] for k, v in parallel.hits.items()} == offsets
            assert (parallel.lines, parallel.bytes, parallel.ends_with_newline) == (
                serial.lines,
                serial.bytes,
                serial.ends_with_newline,
            )
            assert parallel.task_last_step == serial.task_last_step
            assert (parallel.first_stamp, parallel.last_stamp) == (serial.first_stamp, serial.last_stamp)
            if path == big:
                assert serial.lines == big.read_bytes().count(b"\n") + 1
                assert not serial.ends_with_newline and serial.last_exception is not None
    finally:
        mp.undo()
    assert len(used) == 1 + len(logs)  # the parallel path really ran, once per parallel read


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_line, _step), max_size=40), st.booleans())
def test_small_and_vectorised_prefilter_agree(lines: list[str], newline_at_end: bool) -> None:
    buf = b"\n" + ("\n".join(lines) + ("\n" if newline_at_end else "")).encode("utf-8", "replace")
    small = reader.prefilter(buf, (b" 0: ",))
    mp = pytest.MonkeyPatch()
    mp.setattr(reader, "SMALL_BUFFER", 0)
    try:
        assert reader.prefilter(buf, (b" 0: ",)) == small
    finally:
        mp.undo()
    # line indexes and offsets point at the lines themselves
    body = buf[1:]
    for i, offset, raw in small[1]:
        assert body.split(b"\n")[i] == raw and body[offset:].startswith(raw)


# Issue 16's families: each line must reach the parser through both scanners (its trigger literal
# is in TRIGGERS), and the frame line before a header-less exception must too (rule PY-LOST-HEADER).
_FAMILY_LINES = [
    '3:   File "/usr/lib/python3.10/multiprocessing/synchronize.py", line 87, in _cleanup',
    "3:     sem_unlink(name)",
    "3: FileNotFoundError: [Errno 2] No such file or directory",
    "0: Original error: DEADLINE_EXCEEDED: Barrier timed out. Id: [Init]Wait_for_all_tasks_to_register::0.",
    "0: while calling /tensorflow.CoordinationService/RegisterTask:",
    "1: Status: INTERNAL: Failed to launch ROCm kernel: RepeatBufferKernel with block dimensions: 256x1x1",
    "1:     @     0x7f0e1c0cc4a4  xla::gpu::IrEmitterUnnested::EmitFusion()",
    "2: ChainedFuture completed 0/1 futures but timed out after 1199.96 seconds",
    "2: raceback (most recent call last):",
    "srun: error: Node failure on node003",
]


@pytest.mark.parametrize("scan", [_HS, _PY], ids=["hyperscan", "python"])
def test_family_lines_are_scanner_candidates(scan: Any) -> None:
    filler = [f" 2: completed step: {i}, seconds: 1.0" for i in range(50)]
    buf = "\n".join(filler + _FAMILY_LINES + filler).encode()
    picked = {buf[s:].split(b"\n", 1)[0].decode() for s in candidates(scan, buf, (b" 0: ",))}
    missing = [line for line in _FAMILY_LINES if line not in picked and "sem_unlink" not in line]
    assert not missing
    assert candidates(_HS, buf, (b" 0: ",)) == candidates(_PY, buf, (b" 0: ",))


def test_a_header_less_traceback_mid_log_reads_the_same_prefiltered(tmp_path: Path) -> None:
    steps = [f"{t}: completed step: {i}, seconds: 1.0" for i in range(400) for t in range(4)]
    log = tmp_path / "x.log"
    log.write_text("\n".join(steps[:800] + _FAMILY_LINES + steps[800:]) + "\n")
    mp = pytest.MonkeyPatch()
    mp.setattr(reader, "HEAD_FULL", 0)
    mp.setattr(reader, "TAIL_FULL", 0)
    try:
        fast = reader.read_file(log, LogState(str(log), ref_time=2e9))
        full = reader.read_file(log, LogState(str(log), ref_time=2e9), full=True)
    finally:
        mp.undo()
    assert _facts(fast) == _facts(full)
    exceptions = [e.text for e in fast.hits["python-exception"].all()]
    assert "FileNotFoundError: [Errno 2] No such file or directory" in exceptions
