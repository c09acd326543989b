"""JobSpec.hosts: a simulated job can run on the host names a real log names."""

from __future__ import annotations

import random

import pytest

from jobdiagd_sim import lines as L
from jobdiagd_sim.job import JobSim, JobSpec


def test_explicit_hosts_flow_into_header_env_and_exits() -> None:
    hosts = ("worker-2", "worker-5", "worker-1")
    sim = JobSim(JobSpec(job_id="77", nnodes=3, hosts=hosts), random.Random(0))
    sim.header()
    sim.env_dumps()
    sim.node_exits({1: 137})
    log = "\n".join(sim.slurm)
    assert sim.hosts == list(hosts) and sim.head == "worker-2"
    assert f"JOB_NODELIST={L.compact_nodelist(list(hosts))}" in log
    assert "1: HOSTNAME=worker-5" in log
    assert "1: NODE_EXIT host=worker-5 exit=137" in log
    assert "srun: error: worker-5: task 1: Exited with exit code 137" in log


def test_default_hosts_unchanged() -> None:
    sim = JobSim(JobSpec(job_id="77", nnodes=2, first_node=4), random.Random(0))
    assert sim.hosts == ["node004", "node005"]


@pytest.mark.parametrize("hosts", [("a", "b"), ("a", "a", "b")])
def test_hosts_must_name_each_node_once(hosts: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="3 distinct hosts"):
        JobSim(JobSpec(job_id="77", nnodes=3, hosts=hosts), random.Random(0))
