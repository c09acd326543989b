"""Fixtures for the Slurm source tests; the cluster fixture lives in tests/helpers for reuse."""

from tests.helpers.slurm_cluster import slurm_cluster, slurm_conf_env

__all__ = ["slurm_cluster", "slurm_conf_env"]
