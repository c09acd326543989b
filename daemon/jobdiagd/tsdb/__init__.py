"""TSDB diagnosis: query a job's Prometheus (live over ssh, or read-only on disk) and run its playbooks (rule PB-MAP-1)."""
