"""The playbooks' table (name, module, class) and the triage-class -> playbook mapping, rule PB-MAP-1.

`PLAYBOOK_SPECS` is the one list of playbooks. It names each playbook's module instead of
importing it: `jobdiagd diagnose --playbook` offers `PLAYBOOK_NAMES` without loading the
playbooks and the TSDB client under them. `playbooks.registry.PLAYBOOKS` imports and registers
them (a name registers once). Which class a playbook diagnoses is in that class's row of
`triage.classes`, with the class's next steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobdiagd.model.kinds import FailureClass, PlaybookName
from jobdiagd.triage.classes import CLASSES


@dataclass(frozen=True, slots=True)
class PlaybookSpec:
    name: PlaybookName  # as `jobdiagd diagnose --playbook` takes it; the playbook's own `name`
    module: str  # its module under jobdiagd.tsdb.playbooks
    cls: str  # the `Playbook` class the module defines (built with no arguments)


# In the registry's order (an unknown playbook's error lists them so).
PLAYBOOK_SPECS: tuple[PlaybookSpec, ...] = (
    PlaybookSpec(PlaybookName.HANG, "hang", "HangPlaybook"),
    PlaybookSpec(PlaybookName.HEARTBEAT, "heartbeat", "HeartbeatPlaybook"),
    PlaybookSpec(PlaybookName.OOM, "oom", "OomPlaybook"),
    PlaybookSpec(PlaybookName.HARDWARE, "hardware", "HardwarePlaybook"),
    PlaybookSpec(PlaybookName.GPU_HEALTH, "gpu_health", "GpuHealthPlaybook"),
    PlaybookSpec(PlaybookName.NETWORK_HEALTH, "network", "NetworkPlaybook"),
    PlaybookSpec(PlaybookName.TRAINING_STABILITY, "training", "TrainingStabilityPlaybook"),
)

# The playbooks by name, sorted (`jobdiagd diagnose --playbook`).
PLAYBOOK_NAMES: tuple[str, ...] = tuple(sorted(s.name.value for s in PLAYBOOK_SPECS))

CLASS_TO_PLAYBOOK: dict[FailureClass, PlaybookName] = {
    c: row.playbook for c, row in CLASSES.items() if row.playbook
}
DEFAULT_PLAYBOOK = PlaybookName.TRAINING_STABILITY


def playbook_name_for_class(class_name: str | None) -> PlaybookName:
    cls = FailureClass.named((class_name or "").strip().lower())
    return DEFAULT_PLAYBOOK if cls is None else CLASS_TO_PLAYBOOK.get(cls, DEFAULT_PLAYBOOK)
