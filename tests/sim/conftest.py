"""Fixtures for the simulator tests: the shared one-node Slurm cluster for slurm_job.sh."""

from tests.helpers.slurm_cluster import slurm_cluster

__all__ = ["slurm_cluster"]
