"""One row per failure class: its next-step templates (rule NS-1) and its TSDB playbook (rule PB-MAP-1).

A class's other knowledge stays where it is used: its signature families and tier in
`rules.signatures` (the tier places it in the primary-failure choice, rule MATCH-4), and in
`triage.classify` only what a derived class or a new precedence needs. `triage.nextsteps` fills
and filters the templates; `tsdb.playbooks.CLASS_TO_PLAYBOOK` is read from `playbook` (a class
without one gets `tsdb.playbooks.DEFAULT_PLAYBOOK`). tests/triage/test_classes.py checks that
every class has a row and every playbook named here is registered.

A variant holds the templates of a wording family that decided the class (rules
CL-SLURM-TIME-LIMIT, NF-3, CL-INIT): `triage.nextsteps` picks the row by its `FailureClass` and
the variant by name. `NEXT_STEPS` lists every template set by a text key (`class`,
`class/variant`), for the tests and for people reading the templates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from jobdiagd.model.kinds import FailureClass, PlaybookName


@dataclass(frozen=True, slots=True)
class ClassRow:
    next_steps: tuple[str, ...]
    playbook: PlaybookName | None = None  # the TSDB playbook for it (rule PB-MAP-1); None: the default
    variants: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


F = FailureClass
P = PlaybookName

# Runbook "Next-step templates by failure class"; classes the runbook gives none get one
# written from their row (rule NS-1). Playbooks: runbook "Integration with Triage".
CLASSES: Mapping[FailureClass, ClassRow] = {
    F.PROLOG_KILL_NO_LOG: ClassRow(
        (
            "Check the --output path length (ext4 allows 255 bytes per path segment; shorten JOB_NAME).",
            "If it recurs on a fresh submit the cause is partition-side: check slurmd logs on the allocated nodes, or try another partition.",
        ),
    ),
    F.CONTAINER_PULL_FAIL: ClassRow(
        (
            "Verify image name in container_env.sh.",
            "Check registry credentials.",
            "Try manual docker pull.",
        ),
    ),
    F.CONTAINER_LOAD_FAIL: ClassRow(
        (
            "Check the image tarball (docker load output) and its path.",
            "Re-create the tarball or pull the image instead.",
        ),
    ),
    F.NO_GPU: ClassRow(
        (
            "Check that the node has GPUs (rocm-smi or nvidia-smi).",
            "Check container device flags in _container.sh.",
        ),
        playbook=P.GPU_HEALTH,
    ),
    F.NCCL_NIC_FAIL: ClassRow(
        (
            "Run ip link show on compute nodes to verify NIC availability.",
            "Check choose_nccl_socket_ifname.sh logic.",
        ),
    ),
    F.PORT_FAIL: ClassRow(
        (
            "Check for stale processes holding ports on the allocated nodes (ss -tlnp).",
            "Resubmit; ports are chosen at job start.",
        ),
    ),
    F.MODEL_NOT_FOUND: ClassRow(
        (
            "List available configs: ls configs/*.gpu.yml.",
            "Create a new config per docs/model-configs.md.",
        ),
    ),
    F.PATCH_BRANCH_FAIL: ClassRow(
        (
            "Check that the hotfix branch exists and is reachable from the node.",
            "Resubmit without the patch branch to confirm.",
        ),
    ),
    F.RAY_START_FAIL: ClassRow(
        (
            "Non-critical — training falls back to non-Ray mode. If observability is needed: check port conflicts.",
            "Check Ray logs in the job dir.",
        ),
    ),
    F.PREFLIGHT_TIMEOUT: ClassRow(
        (
            "Check for stuck GPU processes: rocm-smi / nvidia-smi.",
            'Increase timeout: STAGE_TIMEOUTS="preflight:1800".',
        ),
    ),
    F.PULL_TIMEOUT: ClassRow(
        (
            "Check network/registry speed.",
            "Pre-pull the image.",
            'Increase timeout: STAGE_TIMEOUTS="pull:1800".',
        ),
    ),
    F.ECC_TIMEOUT: ClassRow(
        (
            "Check the GPU driver on the allocated nodes (dmesg, rocm-smi).",
            'Increase timeout: STAGE_TIMEOUTS="ecc:600" only after ruling out a driver issue.',
        ),
        playbook=P.GPU_HEALTH,
    ),
    F.TRAIN_TIMEOUT: ClassRow(
        (
            'Increase timeout: STAGE_TIMEOUTS="train:<seconds>".',
            "Verify it's not a hang (check if training was progressing).",
        ),
        playbook=P.HANG,
    ),
    F.HEARTBEAT_TIMEOUT: ClassRow(
        (
            "Known bug — almost certainly a false positive (see docs/jax-heartbeat-false-positive-postmortem.md).",
            "Increase jax_distributed_heartbeat_timeout_seconds to several hours (e.g., 14400).",
            "Use jobdiagd (step-progress hang detection) for independent hang detection.",
            "Follow the heartbeat diagnosis checklist to confirm (`jobdiagd diagnose {target} --playbook heartbeat` for RAY=1 jobs).",
        ),
        playbook=P.HEARTBEAT,
    ),
    F.OOM_HOST: ClassRow(
        (
            "Reduce per_device_batch_size.",
            "Enable remat_policy=full.",
            "Check for checkpoint memory spike (DP replica #0 pattern).",
        ),
        playbook=P.OOM,
    ),
    F.OOM_GPU: ClassRow(
        (
            "First check XLA_PYTHON_CLIENT_MEM_FRACTION{mem_fraction} — if the fraction is too low for the model size, increase it (e.g., .85 → .93).",
            "Only after ruling that out: reduce per_device_batch_size or max_target_length.",
            "Try remat_policy=full.",
            "Check XLA buffer assignment for memory usage.",
        ),
        playbook=P.GPU_HEALTH,
    ),
    F.NCCL_TIMEOUT: ClassRow(
        (
            "Check network health (ip link, ethtool, RDMA counters).",
            "Run with _env_NCCL_DEBUG=INFO for detailed NCCL logs.",
            "Check if specific nodes are consistently failing.",
        ),
        playbook=P.NETWORK_HEALTH,
    ),
    F.XLA_COMPILE_FAIL: ClassRow(
        (
            "Check XLA flags in train_env.sh for conflicting settings.",
            "Try _env_ENABLE_XLA_DUMP=1 to capture the failing HLO.",
            "Reduce model complexity to isolate the issue.",
        ),
    ),
    F.PYTHON_EXCEPTION: ClassRow(
        (
            "Read the full traceback.",
            "Check if it's a known MaxText issue.",
            "Verify config parameters.",
        ),
    ),
    F.SIGNAL_KILL: ClassRow(
        (
            "Check for core dumps in the coredump path candidates: {job_dir}/core*, {outputs_root}/core*, and paths from COREDUMP_EXTRA_DIRS in container_env.sh.",
            "Inspect with gdb python3 <core_file> inside the Docker container.",
            "If logs show NCCL_DMABUF_ENABLE=1, check for the runtime warning Forcing NCCL_DMABUF_ENABLE=0 (missing /boot kernel metadata safeguard).",
            "See docs/debugging.md.",
        ),
        playbook=P.HARDWARE,
    ),
    F.SUBPROCESS_FAIL: ClassRow(
        (
            "Read the output preceding the exit for the real error.",
            "Check the failing node's task output (lines prefixed with its task id).",
        ),
    ),
    F.ACTOR_FAIL: ClassRow(
        (
            "Read the actor's traceback in ray_logs/<host>/worker-*.err.",
            "Check if it's a known MaxText issue.",
        ),
    ),
    F.CHECKPOINT_FS_ERROR: ClassRow(
        (
            "Check other workers' logs first — the checkpoint may be intact despite the error.",
            "If checkpoint is intact: resubmit restoring from that checkpoint; zero progress lost.",
            "If checkpoint is corrupt: resubmit restoring from the previous periodic checkpoint.",
            "For RAY=1 jobs: query TSDB for I/O pressure (hw_io_pressure_full_pct) and TCP retransmits (rate(hw_tcp_retransmits_total[5m])) on checkpoint-writing nodes during the failure window.",
            "Check VAST/NFS storage health.",
        ),
        playbook=P.TRAINING_STABILITY,
    ),
    F.NODE_FAIL: ClassRow(
        (
            "Identify which nodes failed: {failed_nodes}.",
            "Read their task output.",
            "For exit 137: likely OOM. For exit 134/139: check core dumps.",
        ),
        playbook=P.HARDWARE,
        variants={
            # A Slurm node failure (rule NF-3): the node itself went down.
            "slurm": (
                "Slurm marked a node of the job failed: check `sinfo -R` / the slurmctld log for that node's reason and `scontrol show node <host>`.",
                "Resubmit excluding that node (--exclude=<host>) and restore from the last checkpoint.",
                "If the same node fails again, report it to the cluster admins (hardware fault).",
            ),
            # A JAX distributed-initialization deadline (rule CL-INIT): tasks that never joined.
            "init": (
                "Read the output of the tasks the coordinator names as never registered (or not at the barrier): they crashed, never started, or cannot reach the coordinator at JAX_COORDINATOR_PORT.",
                "Identify which nodes failed: {failed_nodes}.",
                "If they only started late (slow image pull, setup, model loading), raise the distributed initialization timeout; otherwise exclude the node that never joined.",
            ),
        },
    ),
    F.STAGE_FAIL: ClassRow(
        (
            "Read the failing stage's output above its FAILED marker.",
            "Check the exit code: 137 = SIGKILL/OOM, 134 = SIGABRT, 139 = SIGSEGV.",
        ),
    ),
    F.HANG: ClassRow(
        (
            "If RAY=1 and job is still live: check Ray Dashboard (port 8265) for actor status and stack traces to confirm RCCL hang and identify the stuck collective.",
            "Query Prometheus TSDB at hang time for GPU util (check per-GPU per-node for partial utilization patterns), power watts, TCP retransmits (both rate and absolute totals across nodes), RDMA counters (`jobdiagd diagnose {target} --playbook hang`).",
            "Kill the job: scancel {job_id}.",
            "Retry on the same nodes first — init-phase hangs (before step 0) are often transient RCCL race conditions. If the retry succeeds, no further action needed; note TCP retransmit outliers for awareness only.",
            "Only if the hang recurs: exclude suspect nodes (--exclude=<nodes> targeting TCP retransmit or GPU pattern outliers), add _env_NCCL_DEBUG=INFO, and keep jobdiagd watching for early detection.",
        ),
        playbook=P.HANG,
    ),
    F.CANCELLED: ClassRow(
        (
            "Cancellation is the mechanism, not the root cause; no underlying hang or failure was found, so no action is needed.",
        ),
        playbook=P.HANG,  # cancellation is the mechanism; the usual underlying cause is a hang
        variants={
            # Slurm's own time-limit cancel (rule CL-SLURM-TIME-LIMIT), not the job script's train stage timeout.
            "time-limit": (
                "Slurm's time limit (--time) ended a job that was still training: increase it (sbatch --time=...) or resume from the last checkpoint in a new job.",
                "Verify it's not a hang (training was progressing until the cancel).",
            ),
        },
    ),
    F.UNKNOWN_DEATH: ClassRow(
        (
            "Check dmesg for OOM kills.",
            "Check Slurm state: scontrol show job {job_id}.",
            "If recurring: run with RAY=1 for TSDB diagnostics.",
        ),
        playbook=P.HARDWARE,
    ),
    F.SOFT_SUCCESS: ClassRow(
        (
            "Training data is intact (full loss curve in TensorBoard, full step-time history in the log); the non-zero exit is a post-training artifact.",
            "Do not resubmit unless training beyond what was captured is needed.",
        ),
    ),
    F.TGS_DEGRADATION: ClassRow(
        (
            "Extract the TGS timeline from the worker logs (see the TGS analysis above).",
            "Identify the degradation pattern (constant drop, phased, gradual, periodic).",
            "For RAY=1 jobs: query TSDB — Playbook 6 (Network Health) for RDMA retransmits per host, Playbook 7 (Training Stability) contention checklist (`jobdiagd diagnose {target} --playbook network`).",
            "Identify the offending nodes from per-host RDMA retransmit rates.",
            "Resubmit with --exclude=<bad_nodes> targeting nodes with RDMA retry exhaustion or sustained RDMA retransmits.",
        ),
        playbook=P.TRAINING_STABILITY,
    ),
}

# Template key -> templates: the class's own, and `class/variant` for each of its variants (a view of
# CLASSES by text; the code reads CLASSES).
NEXT_STEPS: Mapping[str, tuple[str, ...]] = {
    **{str(c): row.next_steps for c, row in CLASSES.items()},
    **{f"{c}/{v}": steps for c, row in CLASSES.items() for v, steps in row.variants.items()},
}
