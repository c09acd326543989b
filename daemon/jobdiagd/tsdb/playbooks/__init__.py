"""Playbook registry (one module per runbook playbook) and the triage-class -> playbook mapping."""

from __future__ import annotations

from jobdiagd.tsdb.playbooks.base import Playbook
from jobdiagd.tsdb.playbooks.gpu_health import GpuHealthPlaybook
from jobdiagd.tsdb.playbooks.hang import HangPlaybook
from jobdiagd.tsdb.playbooks.hardware import HardwarePlaybook
from jobdiagd.tsdb.playbooks.heartbeat import HeartbeatPlaybook
from jobdiagd.tsdb.playbooks.network import NetworkPlaybook
from jobdiagd.tsdb.playbooks.oom import OomPlaybook
from jobdiagd.tsdb.playbooks.training import TrainingStabilityPlaybook

PLAYBOOKS: dict[str, Playbook] = {
    p.name: p
    for p in (
        HangPlaybook(),
        HeartbeatPlaybook(),
        OomPlaybook(),
        HardwarePlaybook(),
        GpuHealthPlaybook(),
        NetworkPlaybook(),
        TrainingStabilityPlaybook(),
    )
}

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
