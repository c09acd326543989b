"""The shared-cluster lease bookkeeping of tests/helpers/slurm_cluster.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.slurm_cluster import SlurmCluster, live_leases


def test_dead_leases_are_pruned(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / str(os.getpid())).write_text("")
    (tmp_path / str(dead.pid)).write_text("")
    (tmp_path / "README").write_text("")
    assert live_leases(tmp_path) == [os.getpid()]
    assert not (tmp_path / str(dead.pid)).exists()


def test_fixture_cluster_is_usable(slurm_cluster: SlurmCluster) -> None:
    proc = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %P %T")
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()}
    assert sorted(rows) == sorted([slurm_cluster.node, *slurm_cluster.spare_nodes])
    partition, state = rows[slurm_cluster.node]
    assert partition.rstrip("*") == slurm_cluster.partition
    assert state in {"idle", "mixed", "allocated", "completing"}
    # The spare nodes have no slurmd: DOWN (a drain test may have left one DOWN+DRAIN: "drained*").
    for node in slurm_cluster.spare_nodes:
        assert rows[node][1].rstrip("*") in {"down", "drained", "draining"}, rows[node]
    assert slurm_cluster.conf.is_file()
    assert slurm_cluster.env["SLURM_CONF"] == str(slurm_cluster.conf)
