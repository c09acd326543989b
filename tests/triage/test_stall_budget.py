"""The stall budget as a pure function of the steps seen so far and the checkpoint settings."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jobdiagd.model.records import StepRecord
from jobdiagd.model.triage import CheckpointConfig
from jobdiagd.triage.stall import StallPolicy, stall_budget

POLICY = StallPolicy()
T0 = 1_800_000_000.0


def step(n: int, seconds: float, at: float) -> StepRecord:
    return StepRecord(n, seconds, 3000.0, None, 2.0, at, n + 1, 0, "log")


def ckpt(*, enabled: bool | None, period: int | None = None, saves: frozenset[int] = frozenset()) -> CheckpointConfig:
    return CheckpointConfig(enabled=enabled, period=period, asynchronous=False, saves=saves)


def test_waiting_for_step_1_with_checkpointing_on_allows_the_initial_save() -> None:
    # A 55 s compile in step 0; the initial save of a large model may take minutes.
    b = stall_budget([step(0, 55.0, T0)], None, ckpt(enabled=True, period=1000), POLICY)
    assert (b.phase, b.seconds) == ("checkpoint", POLICY.checkpoint_s)


def test_a_save_line_at_step_0_counts_even_without_the_flag() -> None:
    b = stall_budget([step(0, 55.0, T0)], None, ckpt(enabled=None, saves=frozenset({0})), POLICY)
    assert b.phase == "checkpoint" and b.seconds == POLICY.checkpoint_s


def test_without_checkpointing_step_1_gets_the_warmup_budget() -> None:
    b = stall_budget([step(0, 55.0, T0)], None, ckpt(enabled=False), POLICY)
    assert b.phase == "warmup" and b.seconds == max(2 * 55.0, POLICY.min_stall_s)


def test_a_run_restored_at_a_later_step_makes_no_initial_save() -> None:
    b = stall_budget([step(5000, 55.0, T0)], None, ckpt(enabled=True, period=1000), POLICY)
    assert b.phase == "warmup" and b.seconds == max(2 * 55.0, POLICY.min_stall_s)


def test_a_compile_longer_than_the_save_budget_still_wins() -> None:
    b = stall_budget([step(0, 600.0, T0)], None, ckpt(enabled=True, period=1000), POLICY)
    assert b.seconds == 1200.0


@settings(max_examples=200, deadline=None)
@given(
    first=st.integers(0, 3000),
    seconds=st.lists(st.one_of(st.none(), st.floats(0.0, 5000.0)), max_size=30),
    step_time=st.one_of(st.none(), st.floats(0.0, 5000.0)),
    period=st.one_of(st.none(), st.integers(1, 50)),
    min_stall=st.floats(1.0, 3000.0),
    startup=st.floats(1.0, 3000.0),
)
def test_no_budget_is_shorter_than_the_policys_shortest(
    first: int,
    seconds: list[float | None],
    step_time: float | None,
    period: int | None,
    min_stall: float,
    startup: float,
) -> None:
    """The hang detector answers "not stalled" without a budget below `shortest_budget`."""
    policy = StallPolicy(min_stall_s=min_stall, startup_s=startup, checkpoint_s=min(min_stall, startup))
    steps = [StepRecord(first + i, s, 3000.0, None, 2.0, T0 + 10.0 * i, i + 1, 0, "log") for i, s in enumerate(seconds)]
    cfg = ckpt(enabled=period is not None, period=period)
    assert stall_budget(steps, step_time, cfg, policy).seconds >= policy.shortest_budget
