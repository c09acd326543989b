"""Shared fixtures (their code lives in tests/helpers) and the service markers of the suite.

A test that needs a service carries its marker: `slurm` (the one-node Slurm cluster),
`prometheus` (promtool-built TSDBs, a local Prometheus), `sshd`, `alertmanager`, `daemon` (a
real `jobdiagd run`, in a subprocess or in-process, waiting on real time). `pytest --unit`
(`scripts/test.sh --unit`) runs every other test; a plain run (CI) runs all of them.

Forgetting a marker is hard: tests using a service fixture get its marker automatically
(FIXTURE_MARKERS), and in a `--unit` run any attempt to start a service binary or the daemon
fails the test with the marker to add (the guard below).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.services import FIXTURE_MARKERS, SERVICE_MARKERS, UNIT_ENV, service_of

# A plugin another one imports comes first: pytest marks each for assert rewriting as it loads
# it, and a module already imported can no longer be rewritten (chat imports daemon).
pytest_plugins = [
    "tests.helpers.daemon",
    "tests.helpers.alertmanager",
    "tests.helpers.chat",
    "tests.helpers.parallel",
    "tests.helpers.scenarios",
    "tests.helpers.slack",
    "tests.helpers.slurm_cluster",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--unit",
        action="store_true",
        help="run only the tests that need no service: not " + ", ".join(SERVICE_MARKERS),
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, why in SERVICE_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {why}")
    if config.getoption("--unit"):
        os.environ[UNIT_ENV] = "1"  # subprocesses of the tests see it too


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            marker = FIXTURE_MARKERS.get(fixture)
            if marker is not None:
                item.add_marker(marker)
    if not config.getoption("--unit"):
        return
    keep, drop = [], []
    for item in items:
        (drop if any(item.get_closest_marker(m) for m in SERVICE_MARKERS) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _unit_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a --unit run, starting a service fails the test and names the marker it lacks."""
    if not request.config.getoption("--unit"):
        return
    real_init = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen[Any], args: Any, *a: Any, **kw: Any) -> None:
        marker = service_of(args)
        if marker is not None:
            pytest.fail(
                f"{request.node.nodeid} starts {args!r} in a --unit run: mark it "
                f"`@pytest.mark.{marker}` ({SERVICE_MARKERS[marker]})",
                pytrace=False,
            )
        real_init(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # Unix socket paths must stay under 108 bytes: pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="jdd-", dir="/tmp") as d:
        yield Path(d)
