"""The playbooks' names the CLI offers (without importing them) are the registry's."""

from __future__ import annotations

from jobdiagd.tsdb.playbooks import CLASS_TO_PLAYBOOK, DEFAULT_PLAYBOOK, PLAYBOOK_NAMES
from jobdiagd.tsdb.playbooks.registry import PLAYBOOKS


def test_names_are_the_registry_s_sorted() -> None:
    assert tuple(sorted(PLAYBOOKS)) == PLAYBOOK_NAMES


def test_every_class_maps_to_a_registered_playbook() -> None:
    assert set(CLASS_TO_PLAYBOOK.values()) | {DEFAULT_PLAYBOOK} <= set(PLAYBOOK_NAMES)
