"""Simulated MaxText/Slurm jobs: real-format log lines, scenario corpora with ground truth, live and benchmark logs."""
