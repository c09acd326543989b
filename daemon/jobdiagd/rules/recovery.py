"""What the runbook's recovery does, as data: the restart marker, which failure classes restart
how, which never restart, and how much a node named by a diagnosis counts against it.

The restart marker (rule REC-11) is a Slurm job comment, `jobdiagd:restart-of=<old id>`, that a
resubmitted job carries: it links the new job to the one it replaces, and it is what two daemons
look for before they submit (rule REC-12). The goodput ledger reads the same constant; keep one
definition of it.

Families (rules REC-4 to REC-7), from the runbook (docs/runbooks/job-log-triage.md, "what that
person does"): a hang is killed and retried on the same nodes, and a recurrence is retried
excluding the suspect nodes with `NCCL_DEBUG=INFO`; a node-fail or a hardware class is resubmitted
excluding the failed node; a checkpoint filesystem error is resubmitted so that it restores the
newest intact checkpoint. Every other class — a user error, soft success, a cancel, a slowdown —
is never acted on (rule REC-2): the list is an allow-list, so a class added later stays manual
until someone decides otherwise. Classes are the strings of `model.kinds.FailureClass` (rules sit
beside model, not above it; tests/rules checks every name here is a class).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from jobdiagd.model.kinds import FailureClass, PlaybookName

RESTART_MARKER = "jobdiagd:restart-of="
_ID = re.compile(r"[0-9]{1,12}\Z", re.ASCII)
# The marker may share the comment with other text (a site's own tags): it is a token of its own.
_MARKER_RE = re.compile(r"(?:^|[\s,;|])jobdiagd:restart-of=([0-9]{1,12})(?=$|[\s,;|#])", re.ASCII)


# Added to the old job's comment right before jobdiagd cancels it for a restart (rule REC-12): a
# peer daemon whose countdown ends a moment later sees that the job's end was a restart, not a
# person taking over (rule REC-14).
RESTARTING_TAG = "jobdiagd:restarting"


def restarting(comment: str | None) -> bool:
    return bool(comment) and RESTARTING_TAG in (comment or "").split()


def restart_marker(old_id: str) -> str:
    """The comment a restart of Slurm job `old_id` carries (rule REC-11)."""
    if not isinstance(old_id, str) or not _ID.match(old_id):
        raise ValueError(f"not a Slurm job id: {old_id!r}")
    return f"{RESTART_MARKER}{old_id}"


def parse_restart_marker(comment: str | None) -> str | None:
    """The old job id a comment names as replaced, or None (no marker, or a malformed one)."""
    if not comment:
        return None
    m = _MARKER_RE.search(comment)
    return m.group(1) if m else None


class Family(StrEnum):
    """How a failure class is recovered (rules REC-4 to REC-7)."""

    HANG = "hang"  # kill, retry on the same nodes; on a recurrence exclude suspects + NCCL_DEBUG=INFO
    NODE = "node"  # resubmit excluding the failed node(s)
    CHECKPOINT = "checkpoint"  # resubmit; the rerun restores the newest intact checkpoint


# Rule REC-4: the classes the runbook restarts, by family. Allow-list: anything else is manual.
RECOVERABLE: Mapping[FailureClass, Family] = MappingProxyType(
    {
        FailureClass.HANG: Family.HANG,
        # A collective that timed out, or a heartbeat timeout, is a hang the watchdog ended.
        FailureClass.NCCL_TIMEOUT: Family.HANG,
        FailureClass.HEARTBEAT_TIMEOUT: Family.HANG,
        FailureClass.NODE_FAIL: Family.NODE,
        FailureClass.ECC_TIMEOUT: Family.NODE,
        FailureClass.NO_GPU: Family.NODE,
        FailureClass.NCCL_NIC_FAIL: Family.NODE,
        FailureClass.CHECKPOINT_FS_ERROR: Family.CHECKPOINT,
    }
)

# Rule REC-2: user errors and non-failures. Never restarted, and never counted against a node.
USER_ERRORS: frozenset[FailureClass] = frozenset(
    {
        FailureClass.PYTHON_EXCEPTION,
        FailureClass.MODEL_NOT_FOUND,
        FailureClass.PATCH_BRANCH_FAIL,
        FailureClass.XLA_COMPILE_FAIL,
        FailureClass.OOM_GPU,
        FailureClass.OOM_HOST,
        FailureClass.CONTAINER_LOAD_FAIL,
        FailureClass.SUBPROCESS_FAIL,
        FailureClass.ACTOR_FAIL,
    }
)
NOT_FAILURES: frozenset[FailureClass] = frozenset(
    {
        FailureClass.SOFT_SUCCESS,
        FailureClass.CANCELLED,
        FailureClass.TGS_DEGRADATION,
        FailureClass.TRAIN_TIMEOUT,
    }
)


def family_of(failure_class: str | None) -> Family | None:
    cls = FailureClass.named(failure_class)
    return None if cls is None else RECOVERABLE.get(cls)


class Evidence(StrEnum):
    """Why a node is named (rule REC-20): each kind has a weight in the node's score."""

    HANG_SUSPECT = "hang-suspect"  # the GPU-hang judge's suspect (dead node, outlier)
    NODE_FAIL = "node-fail"  # Slurm NODE_FAIL / the node-fail class naming the host
    NODE_EXIT = "node-exit"  # a NODE_EXIT line of a job whose class is a hardware class
    ECC = "ecc"
    GPU_HEALTH = "gpu-health"
    NETWORK_OUTLIER = "network-outlier"  # RDMA retry exhaustion / TCP retransmit outlier
    HARDWARE = "hardware"  # Playbook 4's anomalous hosts
    SLOW_HOST = "slow-host"  # the slow host of a TGS slide (site or own Prometheus, SLOW-5/6)


# Rule REC-20: a dead node or a node-fail weighs most; an outlier of a sweep least.
EVIDENCE_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {
        Evidence.HANG_SUSPECT: 1.0,
        Evidence.NODE_FAIL: 2.0,
        Evidence.NODE_EXIT: 1.0,
        Evidence.ECC: 2.0,
        Evidence.GPU_HEALTH: 1.5,
        Evidence.NETWORK_OUTLIER: 1.0,
        Evidence.HARDWARE: 1.5,
        Evidence.SLOW_HOST: 1.0,
    }
)

# Rule REC-20: which failure classes make a NODE_EXIT host evidence against the node (a hang's or
# a cancel's NODE_EXIT lines are every task's exit 143: consequences, not the node's fault).
HARDWARE_CLASSES: frozenset[FailureClass] = frozenset(
    {
        FailureClass.NODE_FAIL,
        FailureClass.ECC_TIMEOUT,
        FailureClass.NO_GPU,
        FailureClass.NCCL_NIC_FAIL,
        FailureClass.SIGNAL_KILL,
    }
)

# Playbook name (tsdb/playbooks/registry.py) -> the evidence its anomalous hosts are.
PLAYBOOK_EVIDENCE: Mapping[str, Evidence] = MappingProxyType(
    {
        PlaybookName.HANG: Evidence.HANG_SUSPECT,
        PlaybookName.HARDWARE: Evidence.HARDWARE,
        PlaybookName.GPU_HEALTH: Evidence.GPU_HEALTH,
        PlaybookName.NETWORK_HEALTH: Evidence.NETWORK_OUTLIER,
    }
)
