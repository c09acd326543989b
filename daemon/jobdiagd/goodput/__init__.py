"""The goodput ledger: where the GPU-hours of every job chain went (docs/rules.md §GP)."""
