"""Runbook knowledge as data (docs/rules.md): signatures, Slurm states and syntax, MaxText settings (no I/O)."""
