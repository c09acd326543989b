"""Which of a node's GPU series belong to the job: the shared-node rule (rule SITE-4).

A node of a GPU-sharing partition may run two jobs; the exporter reports every GPU of the node,
and the other job's GPUs must never confirm (or veto) this job's hang. For each node of the
job, the first rule that applies decides:

1. The exporter labels GPUs with their Slurm job (DCGM's `hpc_job`, AMD's `job_id`) on this
   node: keep the GPUs labelled with this job. A GPU labelled with this job *and* another one
   (GPU sharing) makes the node unusable; so does a node where the exporter labels GPUs with
   jobs but none with this one (a mapping that lags or is broken).
2. Slurm shows the job holds GPU shards or MPS shares on the node (`shard:`/`mps:` GRES):
   its GPUs are shared with other jobs -- unusable.
3. Slurm shows the GPU indices it allotted on the node (`scontrol -d show job`: `IDX:0-3`):
   keep those GPUs.
4. The job holds its nodes whole (`OverSubscribe=NO`, or `[site_prometheus] exclusive_nodes`),
   or Slurm's GPU count for the node covers every GPU the exporter reports there: keep all.
5. Otherwise the node may be shared and nothing tells the GPUs apart: unusable.

An unusable ("refused") node is named in the verdict, which is then `no-data`: the early page
is not confirmed from it and the step budget stays in charge. Host metrics (I/O and memory
pressure, retransmits) are per host and kept as they are: a neighbour's checkpoint I/O can
only veto a confirmation, never make one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from jobdiagd.rules.hostlist import parse_hostlist, valid_host
from jobdiagd.sources.slurm_gres import JobGpus, NodeGpus
from jobdiagd.tsdb.site.profiles import GPU_ROLES


@dataclass(frozen=True)
class SiteSeries:
    """One exporter series mapped to the job's vocabulary: the job node it is on, the GPU index
    (`""` for host metrics), the exporter's job label value, the GPU model label, and its points
    (sample time, value in the judges' unit)."""

    role: str
    node: str
    gpu: str
    points: tuple[tuple[float, float], ...]
    job: str = ""
    model: str = ""


@dataclass(frozen=True)
class JobPlacement:
    """A job's place on the cluster: its Slurm id, node names, and what Slurm says of its GPUs."""

    job_id: str
    nodes: tuple[str, ...]
    gpus: Mapping[str, NodeGpus] = field(default_factory=dict)
    exclusive: bool = False

    @classmethod
    def from_slurm(
        cls, job_id: str, nodelist: str, detail: JobGpus | None = None, *, exclusive_nodes: bool = False
    ) -> JobPlacement:
        """From squeue's node list (a Slurm host list) and, when asked, `scontrol -d show job`."""
        nodes = tuple(n for n in dict.fromkeys(parse_hostlist(nodelist)) if valid_host(n))
        return cls(
            job_id,
            nodes,
            dict(detail.nodes) if detail else {},
            exclusive=exclusive_nodes or bool(detail and detail.exclusive),
        )


def _gpu_index(label: str) -> int | None:
    return int(label) if label.isdigit() else None


def _by_job_label(node: str, gpu_series: list[SiteSeries], job_id: str) -> tuple[list[SiteSeries], str]:
    jobs_of: dict[str, set[str]] = {}
    for s in gpu_series:
        if s.job:
            jobs_of.setdefault(s.gpu, set()).add(s.job)
    shared = sorted(g for g, jobs in jobs_of.items() if job_id in jobs and len(jobs) > 1)
    if shared:
        return [], f"GPU {', '.join(shared)} of {node} is mapped to this job and another one (shared GPUs)"
    mine = [s for s in gpu_series if s.job == job_id]
    if not mine:
        return [], f"the exporter maps GPUs of {node} to jobs, none to job {job_id}"
    return mine, ""


def _by_slurm(
    node: str, gpu_series: list[SiteSeries], alloc: NodeGpus | None, exclusive: bool
) -> tuple[list[SiteSeries], str]:
    if alloc is not None and alloc.shared:
        return [], f"the job holds GPU shards on {node}: its GPUs are shared with other jobs"
    if alloc is not None and alloc.indices is not None:
        return [s for s in gpu_series if _gpu_index(s.gpu) in alloc.indices], ""
    reported = {s.gpu for s in gpu_series}
    if exclusive or (alloc is not None and alloc.count is not None and alloc.count >= len(reported)):
        return gpu_series, ""
    return [], (
        f"{node} may be shared with another job and neither the exporter (no job label) nor Slurm "
        "(no GPU indices) tells its GPUs apart"
    )


def select(
    series: Iterable[SiteSeries], placement: JobPlacement, job_label: bool
) -> tuple[list[SiteSeries], dict[str, str]]:
    """(the job's series, {refused node: why}). `job_label`: the map names a job label for the
    GPU metrics (else rule 1 never applies)."""
    gpu_by_node: dict[str, list[SiteSeries]] = {}
    out: list[SiteSeries] = []
    for s in series:
        if s.role in GPU_ROLES:
            gpu_by_node.setdefault(s.node, []).append(s)
        else:
            out.append(s)
    refused: dict[str, str] = {}
    for node, gs in gpu_by_node.items():
        if job_label and any(s.job for s in gs):
            kept, why = _by_job_label(node, gs, placement.job_id)
        else:
            kept, why = _by_slurm(node, gs, placement.gpus.get(node), placement.exclusive)
        if why:
            refused[node] = why
        else:
            out.extend(kept)
    return out, refused

