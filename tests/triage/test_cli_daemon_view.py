"""`jobdiagd triage` with the daemon's view (rule VIEW-3): the stall policy and the daemon's clock as flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from jobdiagd.cli import build_parser, main
from jobdiagd.model.kinds import StallPhase
from jobdiagd.model.triage import StallKnowledge
from jobdiagd.triage.cli import _knowledge, _policy, policy_argv, stall_argv
from jobdiagd.triage.stall import StallPolicy
from jobdiagd_sim import lines as L
from tests.helpers.joblog import JobLog

T0 = 1_780_000_000.0


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser("triage").parse_args(["triage", *argv])


def test_the_flags_carry_the_policy_and_the_knowledge_exactly() -> None:
    policy = StallPolicy(stall_factor=2.5, min_stall_s=4.75, startup_s=61.0, checkpoint_s=0.1 + 0.2)
    known = StallKnowledge(T0 + 0.123456789, 4.75, StallPhase.CHECKPOINT, gpu_confirmed=True)
    args = _parse("x", *policy_argv(policy), *stall_argv(known))
    assert _policy(args) == policy  # repr() of a float reads back to the same float
    assert _knowledge(args) == known
    plain = _parse("x")
    assert _policy(plain) is None and _knowledge(plain) is None
    # One flag alone keeps the built-in values of the others.
    assert _policy(_parse("x", "--min-stall-seconds", "5")) == StallPolicy(min_stall_s=5.0)


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--daemon-since", "1", "--daemon-budget", "5"], "go together"),
        (["--daemon-gpu-confirmed"], "needs --daemon-since"),
        (
            ["--all", "--daemon-since", "1", "--daemon-budget", "5", "--daemon-phase", "steady"],
            "exactly one PATH",
        ),
    ],
)
def test_partial_or_shared_knowledge_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], why: str
) -> None:
    assert main(["triage", "--outputs", str(tmp_path), *argv]) == 2
    assert why in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--daemon-budget", "nan"],
        ["--min-stall-seconds", "-1"],
        ["--stall-factor", "0.5"],
        ["--daemon-since", "inf"],
        ["--daemon-phase", "sleeping"],
    ],
)
def test_values_that_are_no_policy_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse("x", *argv)
    assert exc.value.code == 2


def _hung(outputs: Path) -> Path:
    """Steps 0..7, 10 s each and stamped, the last at T0 + 80; then silence."""
    job = JobLog(outputs, "7001")
    for k in range(8):
        f = L.StepFields(step=k, seconds=10.0, tflops=1.0, tokens=3000.0, total_weights=1, loss=1.0)
        for r in range(job.nnodes):
            job.task(r, L.absl_prefix(T0 + 10.0 * (k + 1), 4242, "metric_logger.py:232") + L.step_line(f))
    return job.dir


def test_the_command_told_the_daemons_view_says_what_the_page_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = str(_hung(tmp_path / "outputs"))
    daemon = [*policy_argv(StallPolicy(min_stall_s=5.0)), "--no-slurm", "--now", str(T0 + 80 + 150)]
    # Alone (no Slurm, the log stamped 150 s ago): the runbook's reading, a dead job.
    assert main(["triage", job, *daemon]) == 0
    assert "**Status:** unknown-death" in capsys.readouterr().out
    known = StallKnowledge(T0 + 80, 5.0, StallPhase.STEADY)
    assert main(["triage", job, *daemon, *stall_argv(known)]) == 0
    out = capsys.readouterr().out
    assert "**Status:** hanging" in out and "**Primary failure:** hang" in out
    assert "(the daemon's clock: budget 5s, phase steady)" in out
    assert (
        "| No step for (daemon's clock) | 2m 30s since step 7 was read — budget 5s, phase steady: stalled |"
        in out
    )
