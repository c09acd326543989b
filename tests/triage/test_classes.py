"""The failure-class table: one row per class, with next steps; variants and playbooks where the runbook gives them."""

from __future__ import annotations

from jobdiagd.model.kinds import FailureClass
from jobdiagd.triage.classes import CLASSES, NEXT_STEPS
from jobdiagd.tsdb.playbooks import PLAYBOOK_NAMES, playbook_name_for_class


def test_every_failure_class_has_a_row_with_next_steps() -> None:
    assert list(CLASSES) == list(FailureClass)  # every class, in the vocabulary's order
    assert [c for c, row in CLASSES.items() if not row.next_steps] == []


def test_every_named_playbook_is_registered_and_read_by_the_diagnosis() -> None:
    named = {c: row.playbook for c, row in CLASSES.items() if row.playbook is not None}
    assert set(named.values()) <= set(PLAYBOOK_NAMES)
    assert all(playbook_name_for_class(c) == p for c, p in named.items())
    assert playbook_name_for_class(" OOM-Host ") == "oom"  # as a report or an operator writes it


def test_a_variant_is_keyed_under_its_class() -> None:
    assert NEXT_STEPS["node-fail/slurm"] == CLASSES[FailureClass.NODE_FAIL].variants["slurm"]
    assert NEXT_STEPS["cancelled/time-limit"][0].startswith("Slurm's time limit")
    assert len(NEXT_STEPS) == len(CLASSES) + sum(len(r.variants) for r in CLASSES.values())
