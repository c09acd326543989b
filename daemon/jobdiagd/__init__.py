"""jobdiagd: monitoring and diagnosis of multi-node MaxText/JAX training jobs on Slurm."""

__version__ = "0.1.0"
