"""The simulator's scenario corpus as a session fixture (`corpus`): built once, read by many tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd_sim import scenarios


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, object]]]:
    root = tmp_path_factory.mktemp("corpus") / "outputs"
    root.mkdir()
    exps = {name: scenarios.build(name, root, seed=0).to_dict() for name in scenarios.SCENARIOS}
    return root, exps
