"""The recovery tables (rules REC-2, REC-4, REC-11, REC-20) agree with the failure classes."""

from __future__ import annotations

import pytest

from jobdiagd.model.kinds import FailureClass
from jobdiagd.rules import recovery as R


def test_every_class_named_by_the_recovery_tables_is_a_failure_class() -> None:
    named = set(R.RECOVERABLE) | R.USER_ERRORS | R.NOT_FAILURES | R.HARDWARE_CLASSES
    assert named <= {c.value for c in FailureClass}


def test_no_class_is_both_restarted_and_a_user_error() -> None:
    assert not set(R.RECOVERABLE) & (R.USER_ERRORS | R.NOT_FAILURES)
    assert R.family_of("python-exception") is None and R.family_of(None) is None
    assert R.family_of("hang") is R.Family.HANG and R.family_of("node-fail") is R.Family.NODE
    assert R.family_of("checkpoint-fs-error") is R.Family.CHECKPOINT


def test_every_evidence_kind_has_a_weight() -> None:
    assert set(R.EVIDENCE_WEIGHTS) == {e.value for e in R.Evidence}
    assert all(w > 0 for w in R.EVIDENCE_WEIGHTS.values())


def test_restart_marker_round_trips_and_is_found_among_other_comment_text() -> None:
    assert R.restart_marker("12345") == "jobdiagd:restart-of=12345"
    assert R.parse_restart_marker("jobdiagd:restart-of=12345") == "12345"
    assert R.parse_restart_marker("site-tag, jobdiagd:restart-of=77 other") == "77"
    assert R.parse_restart_marker("x jobdiagd:restart-of=77#2") == "77"


@pytest.mark.parametrize(
    "comment",
    [None, "", "(null)", "jobdiagd:restart-of=", "jobdiagd:restart-of=12a", "notjobdiagd:restart-of=5",
     "jobdiagd:restart-of=1234567890123", "jobdiagd:restart-of=５"],
)
def test_malformed_markers_name_no_job(comment: str | None) -> None:
    assert R.parse_restart_marker(comment) is None


@pytest.mark.parametrize("bad", ["", "12_3", "1;rm", "-1", "1\n", "١٢"])
def test_restart_marker_refuses_what_is_not_a_plain_job_id(bad: str) -> None:
    with pytest.raises(ValueError):
        R.restart_marker(bad)
