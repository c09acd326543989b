"""The recovery decision (rules REC-1 to REC-10, REC-24): pure, so every guardrail is a table row."""

from __future__ import annotations

import dataclasses

import pytest

from jobdiagd.config import RecoveryConfig, RecoveryOverrideConfig, loads
from jobdiagd.recovery.policy import Action, Case, Plan, RunInfo, decide, effective_mode

T0 = 1_800_000_000.0
AUTO = RecoveryConfig(mode="auto", users=("alice",))


def hang(**kw: object) -> Case:
    base = Case("100", "alice", "gpu", "hang", nodes=("n1", "n2"), last_step=500, incident_id="100:hang:1")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def run(job: str = "100", **kw: object) -> RunInfo:
    base = RunInfo(job, 1, "90", "90", 500, 0, "hang", (), T0 - 600)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def go(case: Case, r: RunInfo | None = None, cfg: RecoveryConfig = AUTO, **kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {"actions_last_hour": 0, "suspected_nodes": (), "now": T0} | kw
    return decide(cfg, case, r, **args)  # type: ignore[arg-type]


def test_recovery_is_off_by_default_and_without_opt_in() -> None:
    assert loads("").recovery.mode == "off"
    d = go(hang(), cfg=RecoveryConfig())
    assert (d.mode, d.plan, d.rule) == ("off", None, "REC-3")
    d = go(hang(owner="bob"))
    assert (d.mode, d.plan, d.rule) == ("off", None, "REC-3")
    assert go(hang(owner=None)).plan is None


def test_overrides_pick_the_mode_by_partition_and_user_first_match_wins() -> None:
    cfg = RecoveryConfig(
        mode="auto",
        users=("alice", "bob"),
        overrides=(
            RecoveryOverrideConfig(partitions=("debug",), mode="off"),
            RecoveryOverrideConfig(users=("bob",), mode="suggest"),
            RecoveryOverrideConfig(users=("carol",), mode="auto"),
        ),
    )
    assert effective_mode(cfg, "alice", "gpu")[0] == "auto"
    assert effective_mode(cfg, "alice", "debug")[0] == "off"
    assert effective_mode(cfg, "bob", "gpu")[0] == "suggest"
    assert effective_mode(cfg, "carol", "gpu")[0] == "auto"  # opted in by an override naming her
    assert effective_mode(cfg, "dave", "gpu")[0] == "off"
    assert effective_mode(dataclasses.replace(cfg, dry_run=True), "alice", "gpu")[0] == "dry-run"
    assert effective_mode(RecoveryConfig(mode="auto", users=("*",), partitions=("gpu",)), "x", "cpu")[0] == "off"
    assert effective_mode(RecoveryConfig(mode="auto", users=("*",), partitions=("gpu",)), "x", "gpu")[0] == "auto"


@pytest.mark.parametrize(
    "cls", ["python-exception", "model-not-found", "oom-gpu", "soft-success", "cancelled", "tgs-degradation", None]
)
def test_user_errors_and_non_failures_are_never_acted_on(cls: str | None) -> None:
    d = go(hang(failure_class=cls))
    assert d.plan is None and d.rule == "REC-2" and d.mode == "auto"


def test_an_acked_or_muted_incident_is_left_to_people() -> None:
    assert go(hang(acked=True)).rule == "REC-9"
    assert go(hang(muted=True)).rule == "REC-9"
    assert go(hang(acked=True)).plan is None


def test_first_hang_retries_on_the_same_nodes_minus_known_suspects() -> None:
    d = go(hang(), suspected_nodes=("n2", "bad;host"))
    assert d.plan is not None
    p = d.plan
    assert (p.action, p.rule, p.attempt, p.chain) == (Action.RETRY_SAME_NODES, "REC-4", 1, "100")
    assert p.exclude == ("n2",) and p.nodelist == ("n1",) and dict(p.env) == {}
    assert any("already under suspicion: n2" in n for n in p.notes)
    no_pin = go(hang(), cfg=dataclasses.replace(AUTO, retry_same_nodes=False)).plan
    assert no_pin is not None and no_pin.nodelist == ()


def test_a_recurrence_within_the_window_excludes_suspects_with_nccl_debug() -> None:
    d = go(hang(suspects=("n2",)), run(excluded=("n9",)))
    assert d.plan is not None
    p = d.plan
    assert (p.action, p.rule, p.attempt, p.chain) == (Action.RETRY_EXCLUDING_SUSPECTS, "REC-5", 2, "90")
    assert p.exclude == ("n2", "n9") and dict(p.env) == {"NCCL_DEBUG": "INFO"} and p.nodelist == ()
    # Outside the window, a hang is a first hang again.
    late = go(hang(), run(started_at=T0 - AUTO.recurrence_window_seconds - 1)).plan
    assert late is not None and late.action == Action.RETRY_SAME_NODES
    # requeue cannot change the environment: said, not silently dropped.
    rq = go(hang(suspects=("n2",)), run(), cfg=dataclasses.replace(AUTO, method="requeue")).plan
    assert rq is not None and dict(rq.env) == {} and any("NCCL_DEBUG" in n for n in rq.notes)


def test_node_and_checkpoint_classes_get_their_runbook_action() -> None:
    node = go(hang(failure_class="node-fail", suspects=("n2",))).plan
    assert node is not None and (node.action, node.rule, node.exclude) == (
        Action.RESUBMIT_EXCLUDING_FAILED,
        "REC-6",
        ("n2",),
    )
    ckpt = go(hang(failure_class="checkpoint-fs-error")).plan
    assert ckpt is not None and (ckpt.action, ckpt.rule, ckpt.exclude) == (
        Action.RESUBMIT_RESTORE_CHECKPOINT,
        "REC-7",
        (),
    )


def test_a_chain_without_progress_stops_after_three_restarts_and_progress_resets_it() -> None:
    # B (1st restart) hung at the step A hung at: no progress, count 1 ... D's hang: refused.
    counts = []
    r: RunInfo | None = None
    for attempt in range(1, 5):
        d = go(hang(job_id=f"j{attempt}", last_step=500), r)
        if d.plan is None:
            counts.append(d.rule)
            break
        counts.append(d.plan.no_progress)
        r = run(f"j{attempt}", attempt=attempt, parent_last_step=500, no_progress=d.plan.no_progress,
                started_at=T0 - 7 * 3600)
    assert counts == [0, 1, 2, "REC-8"]
    # The same chain with steps gained: never stops.
    gained = go(hang(last_step=501), run(no_progress=2, parent_last_step=500))
    assert gained.plan is not None and gained.plan.no_progress == 0


def test_site_rate_limit() -> None:
    assert go(hang(), actions_last_hour=AUTO.max_actions_per_hour).rule == "REC-10"
    assert go(hang(), actions_last_hour=AUTO.max_actions_per_hour - 1).plan is not None


def test_a_plan_round_trips_through_json() -> None:
    d = go(hang(suspects=("n2",)), run())
    assert d.plan is not None
    assert Plan.from_json(d.plan.to_json()) == d.plan


def test_config_keys_are_checked() -> None:
    cfg = loads('[recovery]\nmode = "auto"\nusers = ["*", "alice"]\nresubmit_env = ["SIM_PYTHON=/x y"]\n')
    assert cfg.recovery.users == ("*", "alice") and cfg.recovery.resubmit_env == ("SIM_PYTHON=/x y",)
    for bad in ('mode = "yes"', 'users = ["a b"]', 'resubmit_env = ["1X=2"]', "countdown_seconds = -1",
                'method = "rerun"', "max_no_progress_restarts = 0"):
        with pytest.raises(ValueError, match=r"\[recovery\]"):
            loads(f"[recovery]\n{bad}\n")
