"""Shared fixtures: the simulated-job corpus, built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd.sim import scenarios
from tests.helpers.slurm_cluster import slurm_cluster  # noqa: F401  (session fixture for test_real_slurm)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, object]]]:
    root = tmp_path_factory.mktemp("corpus") / "outputs"
    root.mkdir()
    exps = {name: scenarios.build(name, root, seed=0).to_dict() for name in scenarios.SCENARIOS}
    return root, exps
