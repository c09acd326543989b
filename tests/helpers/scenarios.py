"""The simulator's scenario corpus as a session fixture (`corpus`): built once per run (shared by the
xdist workers: tests/helpers/parallel.py), read by many tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd_sim import scenarios
from tests.helpers.parallel import built_once, run_dir


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, object]]]:
    def build(root: Path) -> dict[str, dict[str, object]]:
        return {name: scenarios.build(name, root, seed=0).to_dict() for name in scenarios.SCENARIOS}

    root = run_dir(tmp_path_factory, "corpus") / "outputs"
    return root, built_once(root, build)
