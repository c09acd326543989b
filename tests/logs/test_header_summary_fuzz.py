"""Fuzzing the Slurm log header (`KEY=value`, PASSTHROUGH_ARGS) and JOB SUMMARY parsers of logs.state.

Properties: any header or summary block is read without raising and keeps what it reads
within the module's caps; a header or summary written the way the job scripts write them
reads back as the values they were written from (Wall in both of its forms, the exit code,
the reason, the node count, the passthrough arguments).
"""

from __future__ import annotations

import string

from hypothesis import example, given
from hypothesis import strategies as st

from jobdiagd.logs.state import MAX_ENV_KEYS, LogState, parse_passthrough, parse_wall
from jobdiagd.logs.steps import TAIL, TRIAGE
from tests.helpers.fuzz import fuzz_settings

NOW = 1_750_000_000.0
RULE = "=" * 65
_any = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\n\r"), max_size=80)
_key = st.one_of(
    st.sampled_from(["JOB_ID", "JOB_NAME", "NNODES", "JOB_NODELIST", "RAY", "RAY_PORT", "PASSTHROUGH_ARGS"]),
    st.from_regex(r"[A-Z][A-Z0-9_]{0,20}", fullmatch=True),
)


def _state(lines: list[str], retention: object = TRIAGE) -> LogState:
    state = LogState("h.log", ref_time=NOW, retention=retention)  # type: ignore[arg-type]
    for i, text in enumerate(lines, 1):
        state.feed_bytes(text.encode("utf-8", "surrogatepass"), i)
    return state


@fuzz_settings(examples=150)
@given(
    st.lists(st.tuples(_key, _any), max_size=30),
    st.lists(st.tuples(st.sampled_from(["Job", "Model", "Nodes", "Wall", "Status", "x"]), _any), max_size=10),
    st.booleans(),
)
# Found by the log fuzz test: a 400-digit Wall overflowed float(), a 5000-digit Nodes int().
@example([], [("Wall", "9" * 400 + "s")], True)
@example([], [("Nodes", "9" * 5000)], True)
@example([], [("Status", "FAILED (exit " + "9" * 5000 + ")")], True)
@example([("PASSTHROUGH_ARGS", '"steps=1e400 checkpoint_period=1e400 enable_checkpointing=true"')], [], False)
def test_any_header_and_summary_are_read_without_raising(
    header: list[tuple[str, str]], summary: list[tuple[str, str]], closed: bool
) -> None:
    lines = [f"{k}={v}" for k, v in header]
    lines += ["=" * 26 + " JOB SUMMARY " + "=" * 26, *(f"  {k}: {v}" for k, v in summary)]
    if closed:
        lines.append(RULE)
    for retention in (TRIAGE, TAIL):
        state = _state(lines, retention)
        assert len(state.env) <= MAX_ENV_KEYS
        assert all(len(v) <= 65_536 for v in state.header.values())
        assert state.summary is not None
        s = state.summary
        assert s.wall_s is None or 0 <= s.wall_s < 10**18
        assert s.exit_code is None or 0 <= s.exit_code < 10**18
        assert s.nodes is None or abs(s.nodes) < 10**18
        assert len(s.status_text or "") <= 65_536 and len(s.reason or "") <= 65_536
        state.passthrough()


_value = st.text(string.ascii_letters + string.digits + "_.,:/@-", min_size=1, max_size=20)


@fuzz_settings(examples=150)
@given(
    st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True), _value, max_size=8),
    st.sampled_from(['"{}"', "'{}'", "{}"]),
)
@example({"a": "jax_worker/replica"}, '"{}"')  # was taken for a heartbeat's accused-task path
def test_passthrough_args_read_back_as_written(args: dict[str, str], quoting: str) -> None:
    text = quoting.format(" ".join(f"{k}={v}" for k, v in args.items()))
    assert parse_passthrough(text) == args
    state = _state(["JOB_ID=1", f"PASSTHROUGH_ARGS={text}"], TAIL)
    assert state.passthrough() == args


@fuzz_settings(examples=200)
@given(
    st.integers(0, 400), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59),
    st.integers(0, 255), st.text(string.ascii_letters + " ()=", max_size=40).map(str.strip),
    st.integers(1, 10_000), st.booleans(),
)
def test_a_job_summary_as_the_scripts_write_it_reads_back(
    days: int, hours: int, minutes: int, seconds: int, code: int, reason: str, nodes: int, slurm_wall: bool
) -> None:
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if slurm_wall:
        wall = f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}" if days else f"{hours:02d}:{minutes:02d}:{seconds:02d}"
    else:
        wall = " ".join(f"{n}{u}" for n, u in ((days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")) if n) or "0s"
    assert parse_wall(wall) == total
    status = "SUCCESS" if code == 0 else "FAILED"
    tail = f" — {reason}" if reason else ""
    lines = [
        "=" * 26 + " JOB SUMMARY " + "=" * 26,
        "  Job:    123 (JAX-llama2-70b)",
        "  Model:  llama2-70b",
        f"  Nodes:  {nodes}",
        f"  Wall:   {wall}",
        f"  Status: {status} (exit {code}){tail}",
        RULE,
    ]
    state = _state(lines, TAIL)
    s = state.summary
    assert s is not None
    assert (s.job, s.model, s.nodes, s.wall_s) == ("123 (JAX-llama2-70b)", "llama2-70b", nodes, total)
    assert (s.status, s.exit_code, s.reason) == (status, code, reason or None)
