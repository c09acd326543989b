"""The rule functions `classify` is made of, each on hand-built hits: one test per rule id (docs/rules.md).

Whole jobs through `classify` are tested in test_failure_classes.py and the goldens; these pin each
rule's own input/output so a rule can be read and changed on its own.
"""

from __future__ import annotations

from dataclasses import replace

from jobdiagd.logs.state import LogState
from jobdiagd.model.kinds import FailureClass, JobStatus, StallBasis, StallPhase
from jobdiagd.model.records import CancelLine, Evidence
from jobdiagd.model.triage import Stall, TgsAnalysis
from jobdiagd.triage import classify as C

MAIN = "slurm-1.out"


def ev(cls: str, line: int, text: str = "x", *, source: str = MAIN, rule: str | None = None) -> Evidence:
    return Evidence(cls, line, 0, source, None, None, text, None, rule=rule)


def stall(stalled: bool) -> Stall:
    return Stall(stalled, 500.0 if stalled else 10.0, 120.0, StallPhase.STEADY, StallBasis.TIMESTAMPS)


def tgs(degraded: bool) -> TgsAnalysis:
    return replace(TgsAnalysis.no_trend("tgs"), degraded=degraded)


def test_hl3_clean_scancel_node_exits_are_dropped_but_real_exits_kept() -> None:
    hits = {
        "node-fail": [
            ev("node-fail", 1, "NODE_EXIT host=n1 exit=143"),
            ev("node-fail", 2, "NODE_EXIT exit=137"),
        ]
    }
    assert [e.line for e in C._drop_clean_cancel_node_exits(hits)["node-fail"]] == [2]
    only_cancel = {
        "node-fail": [ev("node-fail", 1, "NODE_EXIT host=n1 exit=143")],
        "oom-host": [ev("oom-host", 3)],
    }
    assert list(C._drop_clean_cancel_node_exits(only_cancel)) == ["oom-host"]


def test_cas5_sigterm_carriers_of_a_cancel_are_dropped() -> None:
    hits = {
        "signal-kill": [ev("signal-kill", 4, "Received SIGTERM"), ev("signal-kill", 5, "signal 11")],
        "stage-fail": [ev("stage-fail", 6, "== Training FAILED (exit=143)")],
    }
    out = C._drop_cancel_carriers(hits)
    assert list(out) == ["signal-kill"]
    assert [e.line for e in out["signal-kill"]] == [5]


def test_cas5_hits_after_the_cancel_line_are_consequences() -> None:
    main = LogState(MAIN, ref_time=0.0)
    main.cancel = CancelLine("n1", "2026-06-12T11:57:00", "CANCELLED AT 2026-06-12T11:57:00", 10)
    hits = {
        "nccl-timeout": [ev("nccl-timeout", 9), ev("nccl-timeout", 11)],
        "traceback": [ev("traceback", 12)],
    }
    kept, dropped = C._drop_after_cancel(hits, main)
    assert dropped == 2
    assert list(kept) == ["nccl-timeout"]
    assert [e.line for e in kept["nccl-timeout"]] == [9]


def test_cas6_abort_after_a_compiler_fatal_is_its_consequence() -> None:
    abort = ev("signal-kill", 8, "Fatal Python error: Aborted")
    segv = ev("signal-kill", 9, "signal 11")
    with_fatal = C._drop_abort_after_compile_fail(
        {"xla-compile-fail": [ev("xla-compile-fail", 7)], "signal-kill": [abort, segv]}
    )
    assert with_fatal["signal-kill"] == [segv]
    without = {"signal-kill": [abort]}
    assert C._drop_abort_after_compile_fail(without) == without


def test_soft2_time_limit_line_is_the_soft_success_evidence() -> None:
    main = LogState(MAIN, ref_time=0.0)
    main.cancel_evidence = ev("cancelled", 20, "CANCELLED AT ... DUE TO TIME LIMIT")
    derived = C._time_limit_as_soft_success(main, {})
    assert [(e.cls, e.line) for e in derived["soft-success"]] == [("soft-success", 20)]
    assert C._time_limit_as_soft_success(LogState(MAIN, ref_time=0.0), {}) == {}


def test_ud2_srun_killed_is_the_oom_kill_with_an_oom_report() -> None:
    main = LogState(MAIN, ref_time=0.0)
    killed = ev("node-fail", 30, "srun: error: n1: task 3: Killed", rule="NODE-srun-killed")
    oom = ev("oom-host", 25, "Out of memory: Killed process")
    hits = {"oom-host": [oom], "node-fail": [killed]}
    out, derived, classes = C._route_srun_killed(hits, {}, ["oom-host", "node-fail"], JobStatus.FAILED, main)
    assert classes == ["oom-host"] and derived == {}
    assert [(e.cls, e.line) for e in out["oom-host"]] == [("oom-host", 25), ("oom-host", 30)]


def test_ud2_srun_killed_is_unknown_death_evidence_without_a_summary() -> None:
    main = LogState(MAIN, ref_time=0.0)
    killed = ev("node-fail", 30, "srun: error: n1: task 3: Killed", rule="NODE-srun-killed")
    hits = {"node-fail": [killed]}
    out, derived, classes = C._route_srun_killed(hits, {}, ["node-fail"], JobStatus.UNKNOWN_DEATH, main)
    assert out == {} and classes == []
    assert [e.cls for e in derived["unknown-death"]] == ["unknown-death"]
    # With a JOB SUMMARY (status failed) and no OOM report it stays node-fail evidence.
    assert C._route_srun_killed(hits, {}, ["node-fail"], JobStatus.FAILED, main)[0] == hits


def test_cl7_train_timeout_after_a_stall_is_a_hang() -> None:
    hits = {"train-timeout": [ev("train-timeout", 1)]}
    assert C._train_timeout_primary(hits, stall(True)) == "hang"
    assert C._train_timeout_primary(hits, stall(False)) == "train-timeout"
    assert C._train_timeout_primary({}, stall(True)) is None


def test_cas4_cancel_after_a_stall_is_a_hang_and_cl9_otherwise_cancelled() -> None:
    assert C._stalled_primary(JobStatus.CANCELLED, stall(True)) is FailureClass.HANG
    assert C._stalled_primary(JobStatus.CANCELLED, stall(False)) is None
    assert C._stalled_primary(JobStatus.HANGING, stall(False)) is FailureClass.HANG
    assert C._job_state_primary(JobStatus.CANCELLED) is FailureClass.CANCELLED
    assert C._job_state_primary(JobStatus.UNKNOWN_DEATH) is FailureClass.UNKNOWN_DEATH
    assert C._job_state_primary(JobStatus.FAILED) is None


def test_cl8_carriers_never_on_a_completed_job() -> None:
    cands = C._Candidates([], [], [ev("signal-kill", 3)])
    assert C._carrier_primary(cands, JobStatus.FAILED) is FailureClass.SIGNAL_KILL
    assert C._carrier_primary(cands, JobStatus.COMPLETED) is None


def test_cl9_tgs_degradation_only_for_a_running_job() -> None:
    assert C._tgs_primary(JobStatus.RUNNING, tgs(True)) is FailureClass.TGS_DEGRADATION
    assert C._tgs_primary(JobStatus.RUNNING, tgs(False)) is None
    assert C._tgs_primary(JobStatus.COMPLETED, tgs(True)) is None


def test_cas7_hanging_job_with_a_signature_primary_gets_the_waiting_note() -> None:
    assert C._hung_waiting_note(JobStatus.HANGING, FailureClass.OOM_HOST)
    assert C._hung_waiting_note(JobStatus.HANGING, FailureClass.HANG) == []
    assert C._hung_waiting_note(JobStatus.FAILED, FailureClass.OOM_HOST) == []


def test_reported_classes_put_a_derived_primary_first() -> None:
    assert C._reported_classes(FailureClass.HANG, ["nccl-timeout"], tgs(True), JobStatus.CANCELLED) == [
        FailureClass.HANG,
        "nccl-timeout",
        "tgs-degradation",
        "cancelled",
    ]
