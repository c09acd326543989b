"""The restart marker in a Slurm comment: what recovery writes, what the ledger reads (rule GP-3)."""

from __future__ import annotations

import pytest

from jobdiagd.rules.restart import RESTART_COMMENT_PREFIX, restart_comment, restart_of


def test_written_and_read_back() -> None:
    assert restart_comment("4711") == "jobdiagd:restart-of=4711"
    assert restart_of(restart_comment("4711")) == "4711"
    assert restart_of(restart_comment("4711_3")) == "4711_3"


@pytest.mark.parametrize(
    ("comment", "job"),
    [
        ("nightly run; jobdiagd:restart-of=88", "88"),
        ("jobdiagd:restart-of=88,tag=x", "88"),
        ("  jobdiagd:restart-of=88  ", "88"),
        (None, None),
        ("", None),
        ("jobdiagd:restart-of=", None),
        ("jobdiagd:restart-of=88x", None),  # not a job id
        ("jobdiagd:restart-of=-1", None),
        ("xjobdiagd:restart-of=88", None),  # not a token of its own
        ("jobdiagd:restart-of=12345678901", None),  # more digits than a Slurm id has
    ],
)
def test_the_marker_is_one_token_holding_a_job_id(comment: str | None, job: str | None) -> None:
    assert restart_of(comment) == job


def test_only_job_ids_are_written() -> None:
    for bad in ("", "12;rm", "-5", "12 13"):
        with pytest.raises(ValueError):
            restart_comment(bad)
    assert RESTART_COMMENT_PREFIX.endswith("=")
