"""TSDB diagnosis: query a job's Prometheus (live over ssh, or read-only on disk) and run the runbook's playbooks."""
