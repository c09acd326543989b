"""The xdist groups of tests/helpers/parallel.py hold: a small suite run on two workers (`-n 2`,
a plain `-n` as a developer types it) keeps each group on one worker and builds a module-scoped
fixture and a `built_once` session build once."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RECORD = """
import os
from pathlib import Path

def record(name: str) -> None:
    out = Path(os.environ["RECORD_DIR"])
    with open(out / name, "a") as fh:
        fh.write(os.environ.get("PYTEST_XDIST_WORKER", "-") + "\\n")
"""

SUITE = {
    "conftest.py": """
import pytest
from tests.helpers.parallel import built_once, run_dir
from record import record

pytest_plugins = ["tests.helpers.parallel"]

@pytest.fixture
def slurm_cluster():  # the name is what groups a test with the shared cluster's tests
    return None

@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    return built_once(run_dir(tmp_path_factory, "shared") / "data", lambda where: record("build") or 42)
""",
    "test_module_fixture.py": """
import pytest
from record import record

@pytest.fixture(scope="module")
def expensive():
    record("module-fixture")

@pytest.mark.parametrize("i", range(6))
def test_m(expensive, i):
    record("module")
""",
    "test_cluster_a.py": """
from record import record

def test_a1(slurm_cluster):
    record("cluster")

def test_a2(slurm_cluster):
    record("cluster")
""",
    "test_cluster_b.py": """
from record import record

def test_b1(slurm_cluster):
    record("cluster")
""",
    "test_free.py": """
import pytest
from record import record

@pytest.mark.xdist_group("mine")
@pytest.mark.parametrize("i", range(3))
def test_grouped(i):
    record("mine")

@pytest.mark.parametrize("i", range(12))
def test_free(shared, i):
    assert shared == 42
    record("free")
""",
}


def test_groups_stay_on_one_worker_and_shared_builds_run_once(tmp_path: Path) -> None:
    suite, out = tmp_path / "suite", tmp_path / "records"
    suite.mkdir()
    out.mkdir()
    (suite / "record.py").write_text(RECORD)
    for name, text in SUITE.items():
        (suite / name).write_text(text)
    env = {**os.environ, "RECORD_DIR": str(out), "PYTHONPATH": f"{REPO}{os.pathsep}{suite}"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", str(suite)],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {p.name: p.read_text().split() for p in out.iterdir()}
    assert all(w.startswith("gw") for ws in workers.values() for w in ws), workers
    assert len(workers["module"]) == 6 and len(set(workers["module"])) == 1, workers
    assert len(workers["cluster"]) == 3 and len(set(workers["cluster"])) == 1, workers
    assert len(workers["mine"]) == 3 and len(set(workers["mine"])) == 1, workers
    assert workers["module-fixture"] == workers["module"][:1]  # built once
    assert len(workers["build"]) == 1  # built once for both workers
    assert collections.Counter(workers["free"]).total() == 12
