"""The GPU allotment of a job from `scontrol -d show job` text (sources/slurm_gres.py)."""

from __future__ import annotations

from pathlib import Path

from jobdiagd.sources.slurm_gres import NodeGpus, parse_gres, parse_indices, parse_job_gpus
from tests.helpers.slurm_cluster import SlurmCluster

MULTI_LINE = """JobId=4242 JobName=llama
   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=node[001-003]
   NumNodes=3 NumCPUs=336 NumTasks=3 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   ReqTRES=cpu=3,mem=0,node=3,billing=3,gres/gpu=20
   JOB_GRES=gpu:20
     Nodes=node[001-002] CPU_IDs=0-111 Mem=0 GRES=gpu:8(IDX:0-7)
     Nodes=node003 CPU_IDs=0-55 Mem=0 GRES=gpu:h100:4(IDX:0,2-4)
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
   OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)
"""


def test_multi_line_detail_gives_each_node_its_indices() -> None:
    job = parse_job_gpus(MULTI_LINE)
    assert job.nodes["node001"] == NodeGpus(8, frozenset(range(8)))
    assert job.nodes["node002"] == NodeGpus(8, frozenset(range(8)))
    assert job.nodes["node003"] == NodeGpus(4, frozenset({0, 2, 3, 4}))
    assert not job.exclusive


def test_one_line_output_and_exclusive_job() -> None:
    text = (
        "JobId=7 JobName=x NodeList=gpu-a[1-2] OverSubscribe=NO Contiguous=0 "
        "Nodes=gpu-a1 CPU_IDs=0-3 Mem=0 GRES=gpu:(null):2(IDX:0-1) "
        "Nodes=gpu-a2 CPU_IDs=0-3 Mem=0 GRES=gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:2)"
    )
    job = parse_job_gpus(text)
    assert job.exclusive
    assert job.nodes["gpu-a1"] == NodeGpus(2, frozenset({0, 1}))
    assert job.nodes["gpu-a2"] == NodeGpus(3, frozenset({0, 1, 2}))


def test_an_entry_without_gres_does_not_take_the_next_entrys() -> None:
    text = "Nodes=cpu01 CPU_IDs=0-3 Mem=0 Nodes=gpu01 CPU_IDs=0-3 Mem=0 GRES=gpu:4(IDX:0-3)"
    job = parse_job_gpus(text)
    assert "cpu01" not in job.nodes
    assert job.nodes["gpu01"].indices == frozenset(range(4))


def test_sharing_and_unknown_indices() -> None:
    assert parse_gres("shard:a100:2(2/4,0/4)").shared
    shared = parse_gres("gpu:1(IDX:0),mps:50")
    assert shared.shared and shared.indices == frozenset({0})
    na = parse_gres("gpu:(null):0(IDX:N/A)")
    assert na.count == 0 and na.indices is None
    assert parse_gres("gpu:4").indices is None  # count without indices (no -d detail)
    assert parse_gres("gpu:4").count == 4
    assert parse_gres("(null)") == NodeGpus()


def test_old_gres_idx_form_and_malformed_ranges() -> None:
    job = parse_job_gpus("Nodes=n1 CPU_IDs=0-1 Mem=0 GRES_IDX=gpu(IDX:0-3)")
    assert job.nodes["n1"].indices == frozenset(range(4))
    assert parse_indices("3-1") is None
    assert parse_indices("0-99999") is None
    assert parse_indices("a") is None
    assert parse_job_gpus("Nodes=bad[1-x] CPU_IDs=0 GRES=gpu:1(IDX:0)").nodes == {}


def test_real_scontrol_detail_of_an_exclusive_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The test cluster has no GPUs: its detail lines carry no GRES, so no node gets an allotment,
    and `--exclusive` shows as OverSubscribe=NO (both forms of the output)."""
    job_id = slurm_cluster.sbatch("--exclusive", f"--output={tmp_path}/%j.out", "--wrap", "sleep 60")
    try:
        slurm_cluster.wait_state(job_id, ["RUNNING"])
        for argv in (
            ["scontrol", "-d", "show", "job", job_id],
            ["scontrol", "-d", "-o", "show", "job", job_id],
        ):
            text = slurm_cluster.run(*argv).stdout
            assert f"Nodes={slurm_cluster.node}" in text  # the detail entry is there...
            job = parse_job_gpus(text)
            assert job.exclusive
            assert job.nodes == {}  # ...without a GPU allotment
    finally:
        slurm_cluster.scancel(job_id)
