"""Next-step templates by failure class (runbook "Next-step templates by failure class")."""

from __future__ import annotations

from jobdiagd.model.triage import TriageResult
from jobdiagd.rules.slurm import CANCEL_EXITS

TEMPLATES: dict[str, list[str]] = {
    "container-pull-fail": [
        "Verify image name in container_env.sh.",
        "Check registry credentials.",
        "Try manual docker pull.",
    ],
    "container-load-fail": [
        "Check the image tarball (docker load output) and its path.",
        "Re-create the tarball or pull the image instead.",
    ],
    "no-gpu": [
        "Check that the node has GPUs (rocm-smi or nvidia-smi).",
        "Check container device flags in _container.sh.",
    ],
    "nccl-nic-fail": [
        "Run ip link show on compute nodes to verify NIC availability.",
        "Check choose_nccl_socket_ifname.sh logic.",
    ],
    "port-fail": [
        "Check for stale processes holding ports on the allocated nodes (ss -tlnp).",
        "Resubmit; ports are chosen at job start.",
    ],
    "model-not-found": [
        "List available configs: ls configs/*.gpu.yml.",
        "Create a new config per docs/model-configs.md.",
    ],
    "patch-branch-fail": [
        "Check that the hotfix branch exists and is reachable from the node.",
        "Resubmit without the patch branch to confirm.",
    ],
    "preflight-timeout": [
        "Check for stuck GPU processes: rocm-smi / nvidia-smi.",
        'Increase timeout: STAGE_TIMEOUTS="preflight:1800".',
    ],
    "pull-timeout": [
        "Check network/registry speed.",
        "Pre-pull the image.",
        'Increase timeout: STAGE_TIMEOUTS="pull:1800".',
    ],
    "ecc-timeout": [
        "Check the GPU driver on the allocated nodes (dmesg, rocm-smi).",
        'Increase timeout: STAGE_TIMEOUTS="ecc:600" only after ruling out a driver issue.',
    ],
    "train-timeout": [
        'Increase timeout: STAGE_TIMEOUTS="train:<seconds>".',
        "Verify it's not a hang (check if training was progressing).",
    ],
    "hang": [
        "If RAY=1 and job is still live: check Ray Dashboard (port 8265) for actor status and stack traces to confirm RCCL hang and identify the stuck collective.",
        "Query Prometheus TSDB at hang time for GPU util (check per-GPU per-node for partial utilization patterns), power watts, TCP retransmits (both rate and absolute totals across nodes), RDMA counters (`jobdiagd diagnose {target} --playbook hang`).",
        "Kill the job: scancel {job_id}.",
        "Retry on the same nodes first — init-phase hangs (before step 0) are often transient RCCL race conditions. If the retry succeeds, no further action needed; note TCP retransmit outliers for awareness only.",
        "Only if the hang recurs: exclude suspect nodes (--exclude=<nodes> targeting TCP retransmit or GPU pattern outliers), add _env_NCCL_DEBUG=INFO, and keep jobdiagd watching for early detection.",
    ],
    "heartbeat-timeout": [
        "Known bug — almost certainly a false positive (see docs/jax-heartbeat-false-positive-postmortem.md).",
        "Increase jax_distributed_heartbeat_timeout_seconds to several hours (e.g., 14400).",
        "Use jobdiagd (step-progress hang detection) for independent hang detection.",
        "Follow the heartbeat diagnosis checklist to confirm (`jobdiagd diagnose {target} --playbook heartbeat` for RAY=1 jobs).",
    ],
    "oom-host": [
        "Reduce per_device_batch_size.",
        "Enable remat_policy=full.",
        "Check for checkpoint memory spike (DP replica #0 pattern).",
    ],
    "oom-gpu": [
        "First check XLA_PYTHON_CLIENT_MEM_FRACTION{mem_fraction} — if the fraction is too low for the model size, increase it (e.g., .85 → .93).",
        "Only after ruling that out: reduce per_device_batch_size or max_target_length.",
        "Try remat_policy=full.",
        "Check XLA buffer assignment for memory usage.",
    ],
    "nccl-timeout": [
        "Check network health (ip link, ethtool, RDMA counters).",
        "Run with _env_NCCL_DEBUG=INFO for detailed NCCL logs.",
        "Check if specific nodes are consistently failing.",
    ],
    "xla-compile-fail": [
        "Check XLA flags in train_env.sh for conflicting settings.",
        "Try _env_ENABLE_XLA_DUMP=1 to capture the failing HLO.",
        "Reduce model complexity to isolate the issue.",
    ],
    "python-exception": [
        "Read the full traceback.",
        "Check if it's a known MaxText issue.",
        "Verify config parameters.",
    ],
    "signal-kill": [
        "Check for core dumps in the coredump path candidates: {job_dir}/core*, {outputs_root}/core*, and paths from COREDUMP_EXTRA_DIRS in container_env.sh.",
        "Inspect with gdb python3 <core_file> inside the Docker container.",
        "If logs show NCCL_DMABUF_ENABLE=1, check for the runtime warning Forcing NCCL_DMABUF_ENABLE=0 (missing /boot kernel metadata safeguard).",
        "See docs/debugging.md.",
    ],
    "subprocess-fail": [
        "Read the output preceding the exit for the real error.",
        "Check the failing node's task output (lines prefixed with its task id).",
    ],
    "actor-fail": [
        "Read the actor's traceback in ray_logs/<host>/worker-*.err.",
        "Check if it's a known MaxText issue.",
    ],
    "cancelled": [
        "Cancellation is the mechanism, not the root cause; no underlying hang or failure was found, so no action is needed."
    ],
    # Slurm's own time-limit cancel (rule CL-SLURM-TIME-LIMIT), not the job script's train stage timeout.
    "cancelled/time-limit": [
        "Slurm's time limit (--time) ended a job that was still training: increase it (sbatch --time=...) or resume from the last checkpoint in a new job.",
        "Verify it's not a hang (training was progressing until the cancel).",
    ],
    "node-fail": [
        "Identify which nodes failed: {failed_nodes}.",
        "Read their task output.",
        "For exit 137: likely OOM. For exit 134/139: check core dumps.",
    ],
    # A Slurm node failure (rule NF-3): the node itself went down.
    "node-fail/slurm": [
        "Slurm marked a node of the job failed: check `sinfo -R` / the slurmctld log for that node's reason and `scontrol show node <host>`.",
        "Resubmit excluding that node (--exclude=<host>) and restore from the last checkpoint.",
        "If the same node fails again, report it to the cluster admins (hardware fault).",
    ],
    # A JAX distributed-initialization deadline (rule CL-INIT): tasks that never joined.
    "node-fail/init": [
        "Read the output of the tasks the coordinator names as never registered (or not at the barrier): they crashed, never started, or cannot reach the coordinator at JAX_COORDINATOR_PORT.",
        "Identify which nodes failed: {failed_nodes}.",
        "If they only started late (slow image pull, setup, model loading), raise the distributed initialization timeout; otherwise exclude the node that never joined.",
    ],
    "stage-fail": [
        "Read the failing stage's output above its FAILED marker.",
        "Check the exit code: 137 = SIGKILL/OOM, 134 = SIGABRT, 139 = SIGSEGV.",
    ],
    "unknown-death": [
        "Check dmesg for OOM kills.",
        "Check Slurm state: scontrol show job {job_id}.",
        "If recurring: run with RAY=1 for TSDB diagnostics.",
    ],
    "tgs-degradation": [
        "Extract the TGS timeline from the worker logs (see the TGS analysis above).",
        "Identify the degradation pattern (constant drop, phased, gradual, periodic).",
        "For RAY=1 jobs: query TSDB — Playbook 6 (Network Health) for RDMA retransmits per host, Playbook 7 (Training Stability) contention checklist (`jobdiagd diagnose {target} --playbook network`).",
        "Identify the offending nodes from per-host RDMA retransmit rates.",
        "Resubmit with --exclude=<bad_nodes> targeting nodes with RDMA retry exhaustion or sustained RDMA retransmits.",
    ],
    "checkpoint-fs-error": [
        "Check other workers' logs first — the checkpoint may be intact despite the error.",
        "If checkpoint is intact: resubmit restoring from that checkpoint; zero progress lost.",
        "If checkpoint is corrupt: resubmit restoring from the previous periodic checkpoint.",
        "For RAY=1 jobs: query TSDB for I/O pressure (hw_io_pressure_full_pct) and TCP retransmits (rate(hw_tcp_retransmits_total[5m])) on checkpoint-writing nodes during the failure window.",
        "Check VAST/NFS storage health.",
    ],
    "ray-start-fail": [
        "Non-critical — training falls back to non-Ray mode. If observability is needed: check port conflicts.",
        "Check Ray logs in the job dir.",
    ],
    "soft-success": [
        "Training data is intact (full loss curve in TensorBoard, full step-time history in the log); the non-zero exit is a post-training artifact.",
        "Do not resubmit unless training beyond what was captured is needed.",
    ],
    "prolog-kill-no-log": [
        "Check the --output path length (ext4 allows 255 bytes per path segment; shorten JOB_NAME).",
        "If it recurs on a fresh submit the cause is partition-side: check slurmd logs on the allocated nodes, or try another partition.",
    ],
}


def _applies(template: str, r: TriageResult) -> bool:
    """Drop advice that cannot apply to this job: killing a job that already ended, querying
    a TSDB that a RAY=0 job never had."""
    live = r.status in ("running", "hanging")
    if (template.startswith("Kill the job") or "job is still live" in template) and not live:
        return False
    if template.startswith("If RAY=1") and not r.ray:
        return False
    return not ("jobdiagd diagnose" in template and not r.ray)


def _fit(template: str, r: TriageResult) -> str:
    """The hang template speaks of init-phase hangs; a hang after step N is not one (rule NS-4)."""
    phrase = "init-phase hangs (before step 0) are often transient RCCL race conditions"
    if r.steps and phrase in template:
        return template.replace(
            phrase,
            f"RCCL hangs are often transient race conditions (this one came after step {r.steps[-1].step})",
        )
    return template


def _template_key(r: TriageResult, primary: str) -> str:
    """The template of the primary class, or of the wording family that decided it."""
    rule = r.cls.primary_rule
    if primary == "cancelled" and "TIME LIMIT" in (r.cls.cancel_reason or ""):
        return "cancelled/time-limit"
    if primary == "node-fail" and rule == "NODE-slurm-node-failure":
        return "node-fail/slurm"
    if primary == "node-fail" and rule in ("NODE-jax-init", "NODE-jax-init-deadline"):
        return "node-fail/init"
    return primary


def next_steps(r: TriageResult) -> list[str]:
    primary = r.cls.primary
    steps: list[str] = []
    fill = {
        "job_id": r.job_id or "<id>",
        "target": str(r.ref.job_dir or r.ref.log or "<job>"),
        "job_dir": str(r.ref.job_dir or "<job_dir>"),
        "outputs_root": str(r.ref.job_dir.parent) if r.ref.job_dir else "<outputs_root>",
        "mem_fraction": f" (this job: {r.env['XLA_PYTHON_CLIENT_MEM_FRACTION']})"
        if "XLA_PYTHON_CLIENT_MEM_FRACTION" in r.env
        else "",
        "failed_nodes": ", ".join(
            f"{n.host} (exit {n.exit_code})"
            for n in r.node_exits
            if n.exit_code != 0 and n.exit_code not in CANCEL_EXITS
        )
        or "see NODE_EXIT lines",
    }
    if primary is not None:
        key = _template_key(r, primary)
        steps.extend(_fit(t, r).format(**fill) for t in TEMPLATES.get(key, []) if _applies(t, r))
    hb = r.cls.heartbeat
    if hb is not None and primary != "heartbeat-timeout":
        steps.append(
            "The heartbeat timeout was the kill mechanism, not the root cause: raising "
            "jax_distributed_heartbeat_timeout_seconds only delays the kill; fix the root cause above."
        )
    if r.tgs.degraded and primary != "tgs-degradation":
        steps.extend(t.format(**fill) for t in TEMPLATES["tgs-degradation"])
    if r.status in ("running", "hanging") and r.ray and r.live.head_node:
        steps.append(
            f"Job is live: its Prometheus is on {r.live.head_node}:{r.live.prometheus_port or 9190} (127.0.0.1 only) — "
            f"`jobdiagd diagnose {fill['target']}` reaches it over ssh."
        )
    return steps
