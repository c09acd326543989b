"""The playbook registry: one instance of each playbook (one module per runbook playbook), by name."""

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
