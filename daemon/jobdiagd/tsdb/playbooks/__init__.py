"""The playbooks by name and the triage-class -> playbook mapping, rule PB-MAP-1 (the registry: `playbooks.registry`)."""

from __future__ import annotations

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

# Runbook "Integration with Triage" and the triage next-step templates.
CLASS_TO_PLAYBOOK: dict[str, str] = {
    "hang": "hang",
    "cancelled": "hang",  # cancellation is the mechanism; the usual underlying cause is a hang
    "train-timeout": "hang",
    "heartbeat-timeout": "heartbeat",
    "oom-host": "oom",
    "node-fail": "hardware",
    "signal-kill": "hardware",
    "unknown-death": "hardware",
    "nccl-timeout": "network-health",
    "tgs-degradation": "training-stability",
    "checkpoint-fs-error": "training-stability",
    "oom-gpu": "gpu-health",
    "no-gpu": "gpu-health",
    "ecc-timeout": "gpu-health",
}
DEFAULT_PLAYBOOK = "training-stability"


def playbook_name_for_class(class_name: str | None) -> str:
    return CLASS_TO_PLAYBOOK.get((class_name or "").strip().lower(), DEFAULT_PLAYBOOK)
