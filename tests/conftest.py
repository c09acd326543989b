"""Fixtures shared by the whole suite: their code lives in tests/helpers, registered here."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.helpers.alertmanager",
    "tests.helpers.chat",
    "tests.helpers.daemon",
    "tests.helpers.scenarios",
    "tests.helpers.slack",
    "tests.helpers.slurm_cluster",
]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # Unix socket paths must stay under 108 bytes: pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="jdd-", dir="/tmp") as d:
        yield Path(d)
