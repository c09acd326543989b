"""The triage vocabularies (model/kinds.py) agree with the signature table and print as the strings they replace."""

from __future__ import annotations

import json

from jobdiagd.model.kinds import FailureClass, HeartbeatVerdict, JobStatus, StallPhase
from jobdiagd.rules.signatures import EVIDENCE_CLASSES, SIGNATURES


def test_every_signature_class_is_a_failure_class() -> None:
    table = {s.cls for s in SIGNATURES} | set(EVIDENCE_CLASSES)
    assert table - {c.value for c in FailureClass} == set()


def test_members_serialise_as_their_values() -> None:
    doc = {"status": JobStatus.UNKNOWN_DEATH, "classes": [FailureClass.SOFT_SUCCESS], FailureClass.HANG: 1}
    assert json.dumps(doc) == '{"status": "unknown-death", "classes": ["soft-success"], "hang": 1}'
    assert f"{StallPhase.CHECKPOINT} / {HeartbeatVerdict.FALSE_POSITIVE}" == "checkpoint / false-positive"
    assert str(JobStatus.CANCELLED) == "cancelled"


def test_members_equal_and_hash_as_plain_strings() -> None:
    plain: str = "cancelled"
    assert plain == JobStatus.CANCELLED
    assert FailureClass(JobStatus.CANCELLED) is FailureClass.CANCELLED
    assert {"node-fail": 1}[FailureClass.NODE_FAIL] == 1
    assert FailureClass("oom-host") is FailureClass.OOM_HOST


def test_a_class_named_by_a_string_is_its_member_or_none() -> None:
    assert FailureClass.named("oom-host") is FailureClass.OOM_HOST
    assert FailureClass.named(None) is None
    assert FailureClass.named("not-a-class") is None  # a stored record may name any string
