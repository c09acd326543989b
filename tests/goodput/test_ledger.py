"""The ledger: every second of a run in one bucket, on literal timelines and on random ones (rule GP-4)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobdiagd.goodput.facts import RunFacts
from jobdiagd.goodput.ledger import (
    BUCKETS,
    Chain,
    Run,
    SlurmFacts,
    ledger_chain,
    redo_seconds,
    resolve_run,
    run_ledger,
)
from tests.helpers.fuzz import fuzz_settings

T0 = 1_781_251_200.0


def facts(**kw: object) -> RunFacts:
    base: dict[str, object] = {"key": "a.log#0", "job_id": "100", "nnodes": 2, "gpus_per_node": 8}
    base.update(kw)
    return RunFacts(**base)  # type: ignore[arg-type]


def trained(**kw: object) -> RunFacts:
    """Steps 0..99 at 10 s, the first one 70 s (compile), dated: first line at T0+200."""
    base: dict[str, object] = {
        "first_step": 0,
        "last_step": 99,
        "first_step_at": T0 + 200,
        "first_step_s": 70.0,
        "last_step_at": T0 + 200 + 99 * 10 + 30,  # + 30 s of saves
        "step_time_s": 10.0,
        "train_s": 70.0 + 99 * 10 + 30,
        "checkpoint_s": 30.0,
        "fresh": True,
        "checkpoint_period": 40,
        "tails": ((40, 590.0), (80, 190.0)),
    }
    base.update(kw)
    return facts(**base)


def test_a_completed_run_splits_into_queue_startup_saves_productive_and_teardown() -> None:
    f = trained(status="completed")
    run = Run(facts=f, submit=T0 - 600, start=T0, end=T0 + 200 + 99 * 10 + 30 + 50)
    led = run_ledger(run)
    s = led.seconds
    assert s["queue"] == 600
    assert s["startup"] == pytest.approx(130 + 60)  # start -> first step's beginning, + compile
    assert s["checkpoint"] == 30
    assert s["productive"] == pytest.approx(100 * 10)  # every step's steady part
    assert s["rest"] == pytest.approx(50)  # teardown after the last step
    assert s["stall_to_detection"] == s["detection_to_kill"] == s["redone"] == 0
    assert led.wall_s == pytest.approx(run.end - run.submit)
    assert led.gpu_seconds["productive"] == pytest.approx(1000 * 16)  # 2 nodes x 8 GPUs
    assert led.goodput == pytest.approx(1000 / (run.end - run.start))


def test_a_hang_splits_its_stall_at_the_page() -> None:
    f = trained(status="cancelled", primary="hang", hang=True)
    last = f.last_step_at
    assert last is not None
    run = Run(facts=f, submit=None, start=T0, end=last + 3600, detected_at=last + 300, detected_by="replay")
    s = run_ledger(run).seconds
    assert s["queue"] == 0
    assert s["stall_to_detection"] == pytest.approx(300)
    assert s["detection_to_kill"] == pytest.approx(3300)
    assert s["rest"] == 0


def test_a_hang_without_a_known_page_is_stalled_to_the_end() -> None:
    f = trained(hang=True)
    last = f.last_step_at
    assert last is not None
    led = run_ledger(Run(facts=f, submit=None, start=T0, end=last + 1000))
    assert led.seconds["stall_to_detection"] == pytest.approx(1000)
    assert led.seconds["detection_to_kill"] == 0
    assert any("unknown" in n for n in led.notes)


def test_a_hang_before_the_first_step_stalls_from_the_barrier() -> None:
    f = facts(hang=True, stall_origin=T0 + 400)
    s = run_ledger(Run(facts=f, submit=T0 - 10, start=T0, end=T0 + 4000, detected_at=T0 + 2200)).seconds
    assert (s["queue"], s["startup"], s["stall_to_detection"], s["detection_to_kill"]) == (
        10,
        400,
        1800,
        1800,
    )


def test_a_run_that_never_trained_is_all_startup() -> None:
    s = run_ledger(
        Run(facts=facts(primary="container-pull-fail"), submit=None, start=T0, end=T0 + 900)
    ).seconds
    assert s["startup"] == 900 and sum(s.values()) == 900


def test_undated_steps_keep_their_summed_seconds_and_the_rest_is_unattributed() -> None:
    f = trained(first_step_at=None, last_step_at=None)
    led = run_ledger(Run(facts=f, submit=None, start=T0, end=T0 + 3000))
    s = led.seconds
    assert s["startup"] == pytest.approx(60) and s["checkpoint"] == pytest.approx(30)
    assert s["productive"] == pytest.approx(100 * 10)
    assert s["rest"] == pytest.approx(3000 - (70 + 990 + 30))
    assert any("undated" in n for n in led.notes)


def test_the_redone_steps_are_those_after_the_checkpoint_the_next_run_restored() -> None:
    first = trained(key="a.log#0", primary="node-fail")
    again = trained(key="b.log#0", job_id="101", fresh=False, restored_from=80, first_step=81)
    runs = [
        Run(facts=first, submit=None, start=T0, end=T0 + 1400),
        Run(facts=again, submit=None, start=T0 + 2000, end=T0 + 3000),
    ]
    assert redo_seconds(runs[0], runs[1:]) == 190.0  # the tail after save 80, exact
    chain = ledger_chain(Chain(runs=runs, links=["restore"]))
    assert chain.ledgers[0].seconds["redone"] == pytest.approx(190.0)
    assert chain.ledgers[1].seconds["redone"] == 0
    assert chain.ledger.wall_s == pytest.approx(1400 + 1000)


def test_a_fresh_restart_redoes_everything_but_the_compile_and_the_saves() -> None:
    first = trained(primary="node-fail")
    again = trained(key="b.log#0", job_id="101")
    runs = [
        Run(facts=first, submit=None, start=T0, end=T0 + 1400),
        Run(facts=again, submit=None, start=T0 + 2000, end=T0 + 3400),
    ]
    assert redo_seconds(runs[0], runs[1:]) == math.inf  # all it trained
    s = ledger_chain(Chain(runs=runs, links=["marker"])).ledgers[0].seconds
    assert s["redone"] == pytest.approx(first.train_s - 60 - 30) and s["productive"] == 0


def test_a_fresh_restart_leaves_no_dated_jitter_in_productive() -> None:
    # Dated lines 2 ms later than the summed step seconds say (a real log's echo and date cost).
    first = trained(primary="node-fail", last_step_at=T0 + 200 + 99 * 10 + 30 + 0.002)
    runs = [
        Run(facts=first, submit=None, start=T0, end=T0 + 1400),
        Run(facts=trained(key="b.log#0", job_id="101"), submit=None, start=T0 + 2000, end=T0 + 3400),
    ]
    s = ledger_chain(Chain(runs=runs, links=["marker"])).ledgers[0].seconds
    assert s["productive"] == 0 and s["redone"] == pytest.approx(first.train_s - 60 - 30 + 0.002)


def test_a_restart_that_never_trained_passes_the_redo_to_the_next_one() -> None:
    first = trained(primary="node-fail")
    broken = facts(key="b.log#0", job_id="101", primary="container-pull-fail")
    again = trained(key="c.log#0", job_id="102", fresh=False, restored_from=40, first_step=41)
    runs = [
        Run(facts=f, submit=None, start=T0 + i * 2000, end=T0 + i * 2000 + 1400)
        for i, f in enumerate((first, broken, again))
    ]
    assert redo_seconds(runs[0], runs[1:]) == 590.0


def test_slurm_places_the_last_run_of_a_log_and_the_log_places_the_rest() -> None:
    slurm = SlurmFacts(
        submit=T0 - 50, start=T0, end=T0 + 5000, user="alice", partition="gpu", nodes=("n1", "n2")
    )
    earlier = facts(key="a.log#0", run_index=0, runs_in_log=2, last_stamp=T0 - 100, wall_s=900.0)
    last = facts(key="a.log#1", run_index=1, runs_in_log=2, last_stamp=T0 + 4990, wall_s=4990.0)
    r0 = resolve_run(earlier, slurm, now=T0 + 9999)
    r1 = resolve_run(last, slurm, now=T0 + 9999)
    assert r0 is not None and r1 is not None
    assert (r0.start, r0.end, r0.submit, r0.times_from) == (T0 - 1000, T0 - 100, None, "log")
    assert (r1.start, r1.end, r1.submit, r1.times_from, r1.user) == (T0, T0 + 5000, T0 - 50, "slurm", "alice")


def test_a_live_run_ends_now_and_a_run_nothing_dates_is_left_out() -> None:
    live = resolve_run(facts(), SlurmFacts(start=T0, state="RUNNING"), now=T0 + 60)
    assert live is not None and live.live and live.end == T0 + 60
    assert resolve_run(facts(), None, now=T0) is None
    # Wall but no dated line: the log's mtime places it.
    placed = resolve_run(facts(wall_s=300.0, file_end=T0 + 900), None, now=T0 + 9999)
    assert placed is not None and (placed.start, placed.end) == (T0 + 600, T0 + 900)


times = st.floats(min_value=0, max_value=50_000, allow_nan=False)
maybe = st.one_of(st.none(), times)


@fuzz_settings(300)
@given(
    submit=maybe,
    start=times,
    length=times,
    first_at=maybe,
    first_s=st.one_of(st.none(), st.floats(min_value=0, max_value=5000)),
    last_at=maybe,
    train=st.floats(min_value=0, max_value=80_000),
    ckpt=st.floats(min_value=0, max_value=5000),
    gaps=st.floats(min_value=0, max_value=5000),
    redo=st.floats(min_value=0, max_value=80_000),
    hang=st.booleans(),
    steps=st.booleans(),
    detected=maybe,
    origin=maybe,
)
def test_the_buckets_always_add_up_to_the_wall_time(
    submit: float | None,
    start: float,
    length: float,
    first_at: float | None,
    first_s: float | None,
    last_at: float | None,
    train: float,
    ckpt: float,
    gaps: float,
    redo: float,
    hang: bool,
    steps: bool,
    detected: float | None,
    origin: float | None,
) -> None:
    f = facts(
        first_step=0 if steps else None,
        last_step=50 if steps else None,
        first_step_at=first_at,
        first_step_s=first_s,
        last_step_at=last_at,
        step_time_s=10.0,
        train_s=train,
        checkpoint_s=ckpt,
        gaps_s=gaps,
        hang=hang,
        stall_origin=origin,
    )
    run = Run(facts=f, submit=submit, start=start, end=start + length, detected_at=detected)
    led = run_ledger(run, redo)
    wall = run.end - (submit if submit is not None and submit < start else start)
    assert set(led.seconds) == set(BUCKETS)
    assert all(v >= 0 for v in led.seconds.values())
    assert led.wall_s == pytest.approx(wall, abs=1e-6)
    assert sum(led.gpu_seconds.values()) == pytest.approx(wall * 16, abs=1e-5)


def test_a_failure_after_a_stall_accounts_the_stall_like_a_hang() -> None:
    f = trained(primary="nccl-timeout", stalled=True)
    last = f.last_step_at
    assert last is not None
    s = run_ledger(Run(facts=f, submit=None, start=T0, end=last + 600, detected_at=last + 130)).seconds
    assert (s["stall_to_detection"], s["detection_to_kill"], s["rest"]) == (
        pytest.approx(130),
        pytest.approx(470),
        0,
    )
    crash = run_ledger(
        Run(facts=trained(primary="nccl-timeout"), submit=None, start=T0, end=last + 600)
    ).seconds
    assert crash["rest"] == pytest.approx(600) and crash["stall_to_detection"] == 0
