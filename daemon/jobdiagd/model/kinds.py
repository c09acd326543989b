"""The fixed vocabularies of a triage (status, failure class, stall phase, TGS pattern, heartbeat
verdict), of the GPU-hang judge (one GPU's state, the job's GPU verdict), of the TSDB playbooks
(their names) and of the alerts (incident kind) as StrEnums.

Each member's value is the string reports, JSON documents and the daemon have always used: a
StrEnum *is* that string (`==`, hashing, `json.dumps`, f-strings and `str()` all give the
value), so typing a field with one of these changes no output. `FailureClass` holds every class
of the signature table (`rules.signatures`; tests/rules checks the two agree) and the classes
triage derives without a signature line of their own.

Code compares with members, never with the values written out (tests/model/test_vocabulary.py
fails on a literal): a misspelt member is an error where a misspelt string is a silent `False`.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """Rules ST-1 to ST-8."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RUNNING = "running"
    HANGING = "hanging"
    UNKNOWN_DEATH = "unknown-death"


class FailureClass(StrEnum):
    """Rule CL-* classes: the signature table's, in its order, then the derived ones (CL-9)."""

    PROLOG_KILL_NO_LOG = "prolog-kill-no-log"
    CONTAINER_PULL_FAIL = "container-pull-fail"
    CONTAINER_LOAD_FAIL = "container-load-fail"
    NO_GPU = "no-gpu"
    NCCL_NIC_FAIL = "nccl-nic-fail"
    PORT_FAIL = "port-fail"
    MODEL_NOT_FOUND = "model-not-found"
    PATCH_BRANCH_FAIL = "patch-branch-fail"
    RAY_START_FAIL = "ray-start-fail"
    PREFLIGHT_TIMEOUT = "preflight-timeout"
    PULL_TIMEOUT = "pull-timeout"
    ECC_TIMEOUT = "ecc-timeout"
    TRAIN_TIMEOUT = "train-timeout"
    HEARTBEAT_TIMEOUT = "heartbeat-timeout"
    OOM_HOST = "oom-host"
    OOM_GPU = "oom-gpu"
    NCCL_TIMEOUT = "nccl-timeout"
    XLA_COMPILE_FAIL = "xla-compile-fail"
    PYTHON_EXCEPTION = "python-exception"
    SIGNAL_KILL = "signal-kill"
    SUBPROCESS_FAIL = "subprocess-fail"
    ACTOR_FAIL = "actor-fail"
    CHECKPOINT_FS_ERROR = "checkpoint-fs-error"
    NODE_FAIL = "node-fail"
    STAGE_FAIL = "stage-fail"
    # Derived: no signature line of their own.
    HANG = "hang"
    CANCELLED = "cancelled"
    UNKNOWN_DEATH = "unknown-death"
    SOFT_SUCCESS = "soft-success"
    TGS_DEGRADATION = "tgs-degradation"

    @classmethod
    def named(cls, name: str | None) -> FailureClass | None:
        """The class called `name`, or None: no name, or one this version does not know (a stored
        record or a JSON document may hold any string)."""
        try:
            return None if name is None else cls(name)
        except ValueError:
            return None


class StallPhase(StrEnum):
    """Which stall budget applies (rules HANG-1 to HANG-4)."""

    STARTUP = "startup"
    WARMUP = "warmup"
    CHECKPOINT = "checkpoint"
    STEADY = "steady"


class StallBasis(StrEnum):
    """What measured a stall (rules HANG-5, VIEW-1): dated lines, the JOB SUMMARY wall time, the
    daemon's own clock (a live job it watches), or nothing."""

    TIMESTAMPS = "timestamps"
    WALL_TIME = "wall-time"
    DAEMON = "daemon-clock"
    NONE = "none"


class TgsPattern(StrEnum):
    """The shape of a throughput change (rules TGS-4 to TGS-7); `none`: no shape found."""

    NONE = "none"
    CONSTANT_DROP = "constant-drop"
    ONE_TIME = "one-time"
    PHASED = "phased"
    GRADUAL = "gradual"
    PERIODIC = "periodic"


class HeartbeatVerdict(StrEnum):
    """Rules HB-2, HB-4, HB-5."""

    TRUE_POSITIVE = "true-positive"
    HANG = "hang"
    FALSE_POSITIVE = "false-positive"


class HeartbeatPhase(StrEnum):
    """Rule HB-5: no step completed yet, or during training."""

    INIT = "init"
    MID_TRAINING = "mid-training"


class GpuState(StrEnum):
    """One GPU from its utilization and power (`tsdb.playbooks.base.gpu_state`, Playbook 1's bands)."""

    TRAINING = "training"  # at (or near) training power
    BUSY_WAIT = "busy-wait"  # high utilization in or below the busy-wait power band: spinning
    BUSY = "busy"  # high utilization above the busy-wait band, under training power (eval, forward passes)
    IDLE = "idle"  # idle utilization at idle power
    LOW_UTIL = "low-util"  # busy-wait power at low utilization
    PARTIAL = "partial"  # anything between
    ABSENT = "absent"  # neither utilization nor power


class GpuHangState(StrEnum):
    """The GPU-hang judge's verdict on a job (rule HANG-GPU, `tsdb.gpu_hang.judge`).

    `confirmed`: the GPUs show a collective hang (the early page pages on it). `denies`: the GPUs
    show the job working or in a known pause, so `[tsdb] confirm_hang_with_power` holds a step-budget
    page. The other states neither confirm nor deny: the step budget decides alone.
    """

    BUSY_WAIT = "busy-wait"  # every GPU of every host spins at busy-wait power: confirmed
    DEAD_NODE = "dead-node"  # hosts idle with no GPU process while the others busy-wait: confirmed
    TRAINING = "training"  # GPUs at training power: working, not a hang (log output may lag)
    NOT_A_HANG = "not-a-hang"  # I/O pressure, compilation/restore (idle, process alive), eval
    MIXED = "mixed"  # hosts disagree (part spins, part idles with its process alive, transitions)
    NO_PROCESS = "no-process"  # every GPU idle with no GPU process: the job's processes are gone
    NO_DATA = "no-data"  # metrics missing or stale, or the query failed

    @property
    def confirmed(self) -> bool:
        return self in (GpuHangState.BUSY_WAIT, GpuHangState.DEAD_NODE)

    @property
    def denies(self) -> bool:
        return self in (GpuHangState.TRAINING, GpuHangState.NOT_A_HANG)


class IncidentKind(StrEnum):
    """What a finding, an incident, a report or a notice is about: their `kind`.

    The detectors' kinds (`hang`, `tgs-degradation`, `failure`), the job-end report's, the
    daemon's own notices' and recovery's reports. It is the incident's identity with the job (`<job_id>:<kind>:<seq>`),
    the alert's `kind` label and the `alertname` (`JobdiagdHang`), and what people name in
    `/ack`, `/mute`. The stored records (incidents, notifications, mutes in the state store;
    a mute's kind may be `*`) keep `kind` as `str`, so a store written by another version of the
    daemon still loads; what the daemon produces is typed.
    """

    HANG = "hang"
    TGS_DEGRADATION = "tgs-degradation"
    FAILURE = "failure"
    JOB_END = "job-end"
    NOTICE = "notice"
    RECOVERY = "recovery"  # recovery's replies in an incident's thread (docs/recovery.md)


class PlaybookName(StrEnum):
    """The TSDB playbooks, by the name `jobdiagd diagnose --playbook` takes (rule PB-MAP-1): the
    failure classes name theirs in `triage.classes`, `tsdb.playbooks.PLAYBOOK_SPECS` registers them."""

    HANG = "hang"
    HEARTBEAT = "heartbeat"
    OOM = "oom"
    HARDWARE = "hardware"
    GPU_HEALTH = "gpu-health"
    NETWORK_HEALTH = "network-health"
    TRAINING_STABILITY = "training-stability"
