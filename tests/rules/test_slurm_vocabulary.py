"""Slurm's vocabulary in rules.slurm: exit code -> end state, and how the state sets relate."""

from __future__ import annotations

import pytest

from jobdiagd.rules.slurm import (
    ALIVE_STATES,
    BASE_STATES,
    CANCEL_EXITS,
    FINISHED_STATES,
    RUNNING_STATES,
    end_state,
)


@pytest.mark.parametrize(
    ("exit_code", "state"),
    [
        (None, "UNKNOWN"),
        (0, "COMPLETED"),
        (130, "CANCELLED"),
        (143, "CANCELLED"),
        (1, "FAILED"),
        (137, "FAILED"),
    ],
)
def test_end_state_of_an_exit_code(exit_code: int | None, state: str) -> None:
    assert end_state(exit_code) == state


def test_cancel_exits_are_sigint_and_sigterm() -> None:
    assert {128 + 2, 128 + 15} == CANCEL_EXITS


def test_state_sets_agree() -> None:
    assert not ALIVE_STATES & FINISHED_STATES
    # A running job is alive; SIGNALING (scancel in progress) is the one flag state only the
    # running set names.
    assert RUNNING_STATES - {"SIGNALING"} <= ALIVE_STATES
    assert "PENDING" in ALIVE_STATES and "PENDING" not in RUNNING_STATES
    assert (
        {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT"}
        <= FINISHED_STATES
        <= BASE_STATES
        | {
            "SPECIAL_EXIT",
            "REVOKED",
        }
    )
