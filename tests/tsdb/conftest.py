"""Fixtures of the TSDB tests: simulated jobs with promtool-built TSDBs, built once per run (shared
by the xdist workers: tests/helpers/parallel.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd.tsdb.settings import TsdbSettings
from tests.helpers.parallel import run_dir
from tests.helpers.tsdb import Fixtures


@pytest.fixture(scope="session")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Fixtures:
    return Fixtures(run_dir(tmp_path_factory, "tsdb-fixtures"))


@pytest.fixture
def settings(tmp_path: Path) -> TsdbSettings:
    return TsdbSettings(work_dir=str(tmp_path))
