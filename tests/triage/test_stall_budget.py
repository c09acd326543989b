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


# Rule HANG-4: a save's budget is never learned down from `checkpoint_s`.
STEP_S = 30.0  # the runbook's ~30 s steps


def run(seconds: dict[int, float], last: int, *, first: int = 0) -> list[StepRecord]:
    """Steps first..last, dated back to back; `seconds` overrides the 30 s of some steps."""
    out: list[StepRecord] = []
    t = T0
    for n in range(first, last + 1):
        s = seconds.get(n, STEP_S)
        t += s
        out.append(step(n, s, t))
    return out


def saving(
    period: int, *, asynchronous: bool = False, saves: frozenset[int] = frozenset({0})
) -> CheckpointConfig:
    return CheckpointConfig(enabled=True, period=period, asynchronous=asynchronous, saves=saves)


def test_one_cheap_sample_after_the_initial_save_does_not_shrink_the_budget() -> None:
    # The jobs: the async step-0 save barely slowed step 1 (33 s); the first periodic save
    # (step 20 -> 21) then blocked for 5-20 steps. 1.5 x 33 s gave the normal 2 min and paged.
    steps = run({0: 300.0, 1: 33.0}, 20)
    b = stall_budget(steps, STEP_S, saving(20), POLICY)
    assert (b.phase, b.seconds) == ("checkpoint", POLICY.checkpoint_s)
    for blocked in (5, 12, 20):  # a save blocking that many steps' worth of time is no hang
        assert blocked * STEP_S < b.seconds


def test_one_cheap_periodic_save_does_not_shrink_the_next_saves_budget() -> None:
    # Synchronous saves: the first periodic one took 45 s (a quiet filesystem); the next may block
    # 5-20 steps on a busy one.
    steps = run({0: 300.0, 1: 33.0, 21: 45.0}, 40)
    b = stall_budget(steps, STEP_S, saving(20), POLICY)
    assert (b.phase, b.seconds) == ("checkpoint", POLICY.checkpoint_s)


def test_a_run_whose_saves_took_longer_than_the_configured_budget_gets_more() -> None:
    steps = run({0: 300.0, 1: 33.0, 21: 700.0}, 40)  # a 23-step block on a slow filesystem
    b = stall_budget(steps, STEP_S, saving(20), POLICY)
    assert (b.phase, b.seconds) == ("checkpoint", 1.5 * 700.0)


def test_the_step_after_a_save_is_where_a_multi_step_block_sits() -> None:
    # Waiting for k*P+1 (the save's blocking time lands there): checkpoint phase; for k*P+2 of a
    # synchronous save the normal budget again.
    steps = run({0: 300.0, 1: 33.0, 21: 600.0}, 40)
    assert stall_budget(steps, STEP_S, saving(20), POLICY).phase == "checkpoint"  # next: 41
    steps = run({0: 300.0, 1: 33.0, 21: 600.0, 41: 600.0}, 41)
    b = stall_budget(steps, STEP_S, saving(20), POLICY)
    assert (b.phase, b.seconds) == ("steady", max(3 * STEP_S, POLICY.min_stall_s))


def test_an_asynchronous_saves_commit_may_block_the_second_step_after_it() -> None:
    # Orbax async: the commit blocks the step that runs beside it, k*P+1 or k*P+2.
    cfg = saving(20, asynchronous=True)
    steps = run({0: 300.0, 1: 31.0, 22: 400.0}, 41)  # waiting for 42 = k*P+2
    b = stall_budget(steps, STEP_S, cfg, POLICY)
    assert (b.phase, b.seconds) == ("checkpoint", POLICY.checkpoint_s)
    b = stall_budget(run({0: 300.0, 1: 31.0, 22: 400.0}, 42), STEP_S, cfg, POLICY)  # waiting for 43
    assert b.phase == "steady"


def test_a_hang_during_a_save_pages_within_the_checkpoint_budget() -> None:
    # Saves of 2-5 min shown: the budget stays the configured 15 min, not more; a stall past it
    # is a hang (triage and the detector both use this budget).
    steps = run({0: 300.0, 1: 33.0, 21: 120.0, 41: 300.0}, 60)
    b = stall_budget(steps, STEP_S, saving(20), POLICY)
    assert (b.phase, b.seconds) == ("checkpoint", POLICY.checkpoint_s)


def test_an_eval_is_learned_from_the_evals_the_run_showed() -> None:
    # Evals are the job's own compute: one shown eval predicts the next (below `checkpoint_s`).
    cfg = CheckpointConfig(enabled=False, period=None, asynchronous=False, eval_period=20)
    steps = run({0: 300.0, 21: 90.0}, 39)  # waiting for 40 = k*E
    b = stall_budget(steps, STEP_S, cfg, POLICY)
    assert (b.phase, b.seconds) == ("checkpoint", 1.5 * 90.0)


def test_an_eval_not_yet_shown_gets_the_configured_budget_not_a_saves_sample() -> None:
    cfg = CheckpointConfig(enabled=True, period=20, asynchronous=False, saves=frozenset({0}), eval_period=30)
    steps = run({0: 300.0, 1: 33.0, 21: 40.0}, 29)  # a cheap save shown; waiting for 30 = the first eval
    b = stall_budget(steps, STEP_S, cfg, POLICY)
    assert (b.phase, b.seconds) == ("checkpoint", POLICY.checkpoint_s)


def test_the_profilers_trace_dump_keeps_the_configured_budget() -> None:
    cfg = CheckpointConfig(enabled=False, period=None, asynchronous=False, profile=(10, 16))
    steps = run({}, 15)  # the capture steps ran at normal speed; 16 dumps the trace
    b = stall_budget(steps, STEP_S, cfg, POLICY)
    assert (b.phase, b.seconds) == ("checkpoint", POLICY.checkpoint_s)


@settings(max_examples=200, deadline=None)
@given(
    costs=st.dictionaries(st.integers(0, 80), st.floats(0.1, 2000.0), max_size=20),
    last=st.integers(5, 80),
    period=st.integers(2, 25),
    asynchronous=st.booleans(),
    eval_period=st.one_of(st.none(), st.integers(2, 25)),
)
def test_a_save_never_gets_less_than_the_configured_budget(
    costs: dict[int, float], last: int, period: int, asynchronous: bool, eval_period: int | None
) -> None:
    """Whatever the run has shown, the wait for a save-slowed step past warmup is >= `checkpoint_s`."""
    cfg = CheckpointConfig(
        enabled=True, period=period, asynchronous=asynchronous, saves=frozenset({0}), eval_period=eval_period
    )
    b = stall_budget(run(costs, last), STEP_S, cfg, POLICY)
    if cfg.saving(last + 1):
        assert b.phase == "checkpoint" and b.seconds >= POLICY.checkpoint_s
