"""The playbooks by name and the triage-class -> playbook mapping, rule PB-MAP-1 (the registry: `playbooks.registry`)."""

from __future__ import annotations

from jobdiagd.triage.classes import CLASSES

# The playbooks by name, sorted (`jobdiagd diagnose --playbook`). The registry itself,
# `playbooks.registry.PLAYBOOKS`, imports every playbook (and the TSDB client): this list lets
# the CLI name them without that (tests/tsdb check the two agree).
PLAYBOOK_NAMES: tuple[str, ...] = (
    "gpu-health",
    "hang",
    "hardware",
    "heartbeat",
    "network-health",
    "oom",
    "training-stability",
)

# Rule PB-MAP-1: each class's `playbook` in its row of the failure-class table.
CLASS_TO_PLAYBOOK: dict[str, str] = {c: row.playbook for c, row in CLASSES.items() if row.playbook}
DEFAULT_PLAYBOOK = "training-stability"


def playbook_name_for_class(class_name: str | None) -> str:
    return CLASS_TO_PLAYBOOK.get((class_name or "").strip().lower(), DEFAULT_PLAYBOOK)
