"""Linking restarts into chains (rule GP-3): requeue, the restart marker, restore, retry."""

from __future__ import annotations

from jobdiagd.goodput.chains import link
from jobdiagd.goodput.facts import RunFacts
from jobdiagd.goodput.ledger import Run

T0 = 1_781_251_200.0
H = 3600.0


def run(
    key: str,
    start: float,
    end: float,
    *,
    job_id: str | None = None,
    user: str = "alice",
    restart_of: str | None = None,
    **kw: object,
) -> Run:
    base: dict[str, object] = {
        "key": key,
        "job_id": job_id or key.split(".")[0],
        "log": key.split("#")[0],
        "job_name": "JAX-llama3.1-70b",
        "nnodes": 4,
        "first_step": 0,
        "last_step": 250,
        "checkpoint_period": 100,
        "tails": ((100, 1500.0), (200, 500.0)),
        "fresh": True,
        "primary": "node-fail",
    }
    base.update(kw)
    return Run(facts=RunFacts(**base), submit=None, start=start, end=end, user=user, restart_of=restart_of)  # type: ignore[arg-type]


def keys(chains: list) -> list[list[str]]:  # type: ignore[type-arg]
    return [[r.key for r in ch.runs] for ch in chains]


def test_a_resubmit_restoring_the_last_checkpoint_continues_the_run() -> None:
    a = run("1.log#0", T0, T0 + H)
    b = run("2.log#0", T0 + 2 * H, T0 + 3 * H, restored_from=200, first_step=201, fresh=False)
    chains = link([b, a])
    assert keys(chains) == [["1.log#0", "2.log#0"]] and chains[0].links == ["restore"]


def test_a_restore_links_only_within_the_window_same_config_and_user() -> None:
    a = run("1.log#0", T0, T0 + H)
    late = run("2.log#0", T0 + 30 * H, T0 + 31 * H, restored_from=200, fresh=False)
    other_user = run("3.log#0", T0 + 2 * H, T0 + 3 * H, restored_from=200, fresh=False, user="bob")
    other_size = run("4.log#0", T0 + 2 * H, T0 + 3 * H, restored_from=200, fresh=False, nnodes=8)
    never_saved = run("5.log#0", T0 + 2 * H, T0 + 3 * H, restored_from=300, fresh=False)
    started_before = run("6.log#0", T0 + 0.5 * H, T0 + 3 * H, restored_from=200, fresh=False)
    chains = link([a, late, other_user, other_size, never_saved, started_before])
    assert all(len(ch.runs) == 1 for ch in chains)
    assert len(link([a, late], window_s=48 * H)[0].runs) == 2


def test_a_run_has_one_successor_the_earliest_claimant() -> None:
    a = run("1.log#0", T0, T0 + H)
    b = run(
        "2.log#0",
        T0 + 2 * H,
        T0 + 3 * H,
        restored_from=200,
        first_step=201,
        last_step=230,
        tails=(),
        fresh=False,
    )
    c = run("3.log#0", T0 + 4 * H, T0 + 5 * H, restored_from=100, fresh=False)  # only `a` reached 100
    assert keys(link([c, b, a])) == [["1.log#0", "2.log#0"], ["3.log#0"]]


def test_the_latest_ending_candidate_wins() -> None:
    a = run("1.log#0", T0, T0 + H)
    b = run("2.log#0", T0 + 1.5 * H, T0 + 2 * H, restored_from=100, last_step=150, fresh=False)
    c = run("3.log#0", T0 + 3 * H, T0 + 4 * H, restored_from=100, fresh=False)
    # b and a both reached 100; b ended later, so c continues b (and b continues a).
    assert keys(link([a, b, c])) == [["1.log#0", "2.log#0", "3.log#0"]]


def test_requeued_runs_of_one_log_are_one_chain() -> None:
    a = run("9.log#0", T0, T0 + H, job_id="9", runs_in_log=2)
    b = run("9.log#1", T0 + 1.2 * H, T0 + 2 * H, job_id="9", run_index=1, runs_in_log=2, status="completed")
    chains = link([b, a])
    assert keys(chains) == [["9.log#0", "9.log#1"]] and chains[0].links == ["requeue"]


def test_the_restart_marker_links_whatever_the_config_or_the_gap() -> None:
    a = run("1.log#0", T0, T0 + H, job_id="1")
    b = run("2.log#0", T0 + 40 * H, T0 + 41 * H, job_id="2", restart_of="1", nnodes=8, user="bob")
    chains = link([a, b])
    assert keys(chains) == [["1.log#0", "2.log#0"]] and chains[0].links == ["marker"]


def test_a_fresh_retry_follows_an_interruption_that_left_no_checkpoint() -> None:
    early = run("1.log#0", T0, T0 + H, last_step=60, tails=())
    retry = run("2.log#0", T0 + 2 * H, T0 + 3 * H)
    assert link([early, retry])[0].links == ["retry"]
    # ... but not after a user error, nor after a run that had a checkpoint, nor with users unknown.
    assert (
        len(link([run("1.log#0", T0, T0 + H, last_step=60, tails=(), primary="python-exception"), retry]))
        == 2
    )
    assert len(link([run("1.log#0", T0, T0 + H), retry])) == 2
    anon = [
        run("1.log#0", T0, T0 + H, last_step=60, tails=(), user="?"),
        run("2.log#0", T0 + 2 * H, T0 + 3 * H, user="?"),
    ]
    assert len(link(anon)) == 2
