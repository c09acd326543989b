"""The services tests may need, their markers, and how a --unit run tells a test that lacks one."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

SERVICE_MARKERS = {
    "slurm": "needs the one-node Slurm test cluster (munge, slurmctld, slurmd)",
    "prometheus": "needs promtool / a local Prometheus (TSDBs built from the simulator)",
    "sshd": "needs an sshd on 127.0.0.1",
    "alertmanager": "needs a real Alertmanager",
    "daemon": "runs the real daemon (`jobdiagd run` or run_daemon) on real time",
}
# Fixtures that bring a service: a test using one (directly or through another fixture) is marked.
FIXTURE_MARKERS = {
    "slurm_cluster": "slurm",
    "slurm_conf_env": "slurm",
    "alertmanager": "alertmanager",
    "alertmanager_pair": "alertmanager",
    "fixtures": "prometheus",  # tests/tsdb: simulated jobs with promtool-built TSDBs
}
# What a test without the marker may not start in a --unit run: binary name -> marker.
SERVICE_BINARIES = {
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "prometheus-alertmanager": "alertmanager",
    "alertmanager": "alertmanager",
    "sshd": "sshd",
    "slurmctld": "slurm",
    "slurmd": "slurm",
    "munged": "slurm",
    "sbatch": "slurm",
    "srun": "slurm",
    "squeue": "slurm",
    "scontrol": "slurm",
    "sacct": "slurm",
    "scancel": "slurm",
}
UNIT_ENV = "JOBDIAGD_TEST_UNIT"


def service_of(argv: Any) -> str | None:
    """The marker a command line needs, if it starts a service or the daemon."""
    if isinstance(argv, str | bytes | os.PathLike):
        argv = [argv]
    words = [os.fsdecode(a) for a in argv]
    if not words:
        return None
    exe = words[0]
    resolved = exe if os.sep in exe else (shutil.which(exe) or exe)
    # Only the real binaries: tests that put a fake `squeue` script in a temp dir stay unit tests.
    if resolved.startswith(("/usr/bin/", "/usr/sbin/", "/bin/", "/sbin/")):
        marker = SERVICE_BINARIES.get(os.path.basename(resolved))
        if marker is not None:
            return marker
    if any(w.endswith(("scripts/services/slurm.sh", "slurm_job.sh")) for w in words):
        return "slurm"
    if any(w.endswith("scripts/services/prometheus.sh") for w in words):
        return "prometheus"
    if any(w.endswith("scripts/services/alertmanager.sh") for w in words):
        return "alertmanager"
    if any(w.endswith("scripts/services/sshd.sh") for w in words):
        return "sshd"
    if "jobdiagd.cli" in words and "run" in words:
        return "daemon"
    return None


def require_service(marker: str, what: str) -> None:
    """For helpers that start a service without a subprocess (the in-process daemon): in a --unit
    run, fail the calling test and name the marker it lacks."""
    if os.environ.get(UNIT_ENV):
        pytest.fail(f"{what} in a --unit run: mark the test `@pytest.mark.{marker}`", pytrace=False)
