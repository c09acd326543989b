"""The playbooks' table: the names the CLI offers (without importing them) are the registry's, and a name registers once."""

from __future__ import annotations

import pytest

from jobdiagd.tsdb.playbooks import CLASS_TO_PLAYBOOK, DEFAULT_PLAYBOOK, PLAYBOOK_NAMES, PlaybookSpec
from jobdiagd.tsdb.playbooks.hang import HangPlaybook
from jobdiagd.tsdb.playbooks.registry import PLAYBOOKS, PlaybookRegistry, load


def test_names_are_the_registry_s_sorted() -> None:
    assert tuple(sorted(PLAYBOOKS)) == PLAYBOOK_NAMES


def test_every_class_maps_to_a_registered_playbook() -> None:
    assert set(CLASS_TO_PLAYBOOK.values()) | {DEFAULT_PLAYBOOK} <= set(PLAYBOOK_NAMES)


def test_a_duplicate_playbook_name_is_refused() -> None:
    registry = PlaybookRegistry([HangPlaybook()])
    with pytest.raises(ValueError, match="Duplicated playbook in PlaybookRegistry: 'hang'"):
        registry.register(HangPlaybook())
    assert list(registry) == ["hang"]  # the first one stays
    with pytest.raises(ValueError, match="Duplicated playbook"):
        PlaybookRegistry(load(s) for s in (PlaybookSpec("hang", "hang", "HangPlaybook"),) * 2)


def test_a_spec_must_name_its_playbook_as_the_playbook_names_itself() -> None:
    with pytest.raises(ValueError, match="named 'hang', not 'stall'"):
        load(PlaybookSpec("stall", "hang", "HangPlaybook"))
