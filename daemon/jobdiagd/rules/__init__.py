"""The runbooks' knowledge as data: signature tables, Slurm states and syntax, MaxText settings (no I/O)."""
