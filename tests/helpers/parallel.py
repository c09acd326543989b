"""The suite on pytest-xdist workers: which tests share a worker, in which order they start, and
session data built once per run instead of once per worker.

`scripts/test.sh` runs every test on several workers (`-n`, more workers than cores: most
service tests wait on real time). Three rules keep that as safe as one process:

- Groups: every test that uses the shared Slurm cluster (`slurm_cluster`, `slurm_conf_env`)
  runs on one worker, one after another (group `slurm`): the one-node cluster has 2 CPUs and
  most test jobs take both, so concurrent jobs would only queue behind each other while their
  tests' clocks run. (`tests/service/test_slurmctld_restart.py` restarts slurmctld, but of a
  private cluster on its own ports: it is not in the group.) A module with a module-scoped
  fixture runs on one worker (group = the module), so that fixture is built once, as in one
  process. `@pytest.mark.xdist_group("name")` puts a test in a group of its own choosing.
- Order (`order_for_workers`): the `slurm` group first (the longest chain of tests that must
  run one after another), then the other service tests, longest declared first (their
  `pytest.mark.timeout`, then their marker), then the rest in collection order. The long tests
  start at once and the many short no-service tests fill the workers around them, instead of a
  100 s test starting last.
- Session data (`built_once`): a session fixture that builds files (the TSDB fixtures' promtool
  blocks, the simulator's scenario corpus) builds them once per run in a directory every worker
  of the run shares, under a file lock; the other workers wait for it and read the same files.
  Whatever a test changes, it changes in a private copy (tests/helpers/tsdb.py), so sharing is
  safe. Without xdist the directory is the session's own, as before.

The hooks below do it (the module is a plugin: `pytest_plugins` in tests/conftest.py). How the
groups reach xdist's scheduler: not through xdist's own `--dist loadgroup`, which
appends `@group` to node ids and no longer works with pytest 9.2 (pytest-xdist issue 1386:
the ids are structured now, the suffix is silently dropped and every test is scheduled on its
own). Each worker writes {node id: group} of its collection to a file the controller named
(`workerinput`), and the controller's scheduler (`GroupScheduling`, xdist's scope scheduler
with our scopes) reads it once every worker has collected. `--dist loadgroup` (or a plain
`-n`, which tests/conftest.py turns into it) selects this scheduler.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.helpers.services import SERVICE_MARKERS

T = TypeVar("T")

SLURM_GROUP = "slurm"
SHARED_CLUSTER_FIXTURES = frozenset({"slurm_cluster", "slurm_conf_env"})
# After the slurm group: tests of these markers, in this order (the ones that wait longest first).
MARKER_ORDER = ("slurm", "daemon", "alertmanager", "sshd", "prometheus")
DEFAULT_TIMEOUT = 120.0  # pyproject.toml [tool.pytest.ini_options] timeout
GROUPS_KEY = "jobdiagd_xdist_groups"  # workerinput: where a worker writes its groups


def in_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


# -- session data built once per run ----------------------------------------------------------


def run_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A directory for `name` shared by every xdist worker of this run (xdist gives each worker
    a base temp dir inside the run's own one); outside xdist, a fresh one of this session."""
    if not in_worker():
        return tmp_path_factory.mktemp(name)
    path = tmp_path_factory.getbasetemp().parent / f"shared-{name}"
    path.mkdir(exist_ok=True)
    return path


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def built_once(where: Path, build: Callable[[Path], T]) -> T:
    """`build(where)` once per run: the first worker builds (holding `where`.lock) and pickles
    the result beside; the others wait for the lock, then load that result. A build that failed
    halfway leaves no result file: the next caller clears `where` and builds again."""
    done = where.with_name(where.name + ".result")
    with _locked(where.with_name(where.name + ".lock")):
        if done.exists():
            with open(done, "rb") as fh:
                out: T = pickle.load(fh)
            return out
        if where.exists():
            shutil.rmtree(where)
        where.mkdir(parents=True)
        result = build(where)
        tmp = done.with_name(done.name + ".tmp")
        with open(tmp, "wb") as fh:
            pickle.dump(result, fh)
        os.replace(tmp, done)
        return result


# -- groups and order (on the workers) --------------------------------------------------------


def _uses_shared_cluster(item: pytest.Item) -> bool:
    return not SHARED_CLUSTER_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def _has_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs and defs[-1].scope == "module"
        for name, defs in info.name2fixturedefs.items()
        if name in info.names_closure
    )


def group_of(item: pytest.Item) -> str | None:
    """An explicit `xdist_group`, else `slurm` for the shared cluster's tests, else the module
    for a module-scoped fixture; None: the test may run anywhere."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    if _uses_shared_cluster(item):
        return SLURM_GROUP
    if _has_module_fixture(item):
        return item.nodeid.split("::", 1)[0]
    return None


def _timeout(item: pytest.Item) -> float:
    mark = item.get_closest_marker("timeout")
    if mark is not None and mark.args:
        return float(mark.args[0])
    return DEFAULT_TIMEOUT


def _rank(item: pytest.Item) -> tuple[int, float, int]:
    if _uses_shared_cluster(item):
        return (0, 0.0, 0)
    markers = [m for m in SERVICE_MARKERS if item.get_closest_marker(m) is not None]
    if not markers:
        return (2, 0.0, 0)
    first = min(MARKER_ORDER.index(m) if m in MARKER_ORDER else len(MARKER_ORDER) for m in markers)
    return (1, -_timeout(item), first)


def order_for_workers(items: list[pytest.Item]) -> None:
    """Slurm group, then the service tests (longest declared timeout first), then the rest; the
    sort is stable, so a module's tests stay together and in their order."""
    items.sort(key=_rank)


def write_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: {node id: group} of the collection, for the controller's scheduler."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is None or GROUPS_KEY not in workerinput:
        return
    groups = {item.nodeid: g for item in items if (g := group_of(item)) is not None}
    path = Path(workerinput[GROUPS_KEY])
    tmp = path.with_name(f"{path.name}.{workerinput.get('workerid', os.getpid())}")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, path)  # every worker collects the same tests: the same content


# -- the controller ---------------------------------------------------------------------------


def _scheduler_class() -> type:
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's scope scheduler (a scope is sent whole to one worker, scopes in collection
        order), with a test's group as its scope, else the test itself."""

        def __init__(self, config: pytest.Config, log: Any, groups: Path) -> None:
            super().__init__(config, log)
            self._groups_file = groups
            self._groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                # Written by every worker before it reported its collection: never missing here.
                self._groups = json.loads(self._groups_file.read_text())
            return self._groups.get(nodeid, nodeid)

    return GroupScheduling


class Controller:
    """Registered on the controller of a `--dist loadgroup` run (tests/conftest.py)."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="jobdiagd-xdist-"))
        self.groups = self._dir / "groups.json"

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[GROUPS_KEY] = str(self.groups)

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        return _scheduler_class()(config, log, self.groups)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


# -- the hooks --------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    # A plain `-n` run (dist "load") would ignore the groups: it becomes "loadgroup", ours.
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.pluginmanager.register(Controller(), "jobdiagd-xdist-groups")


# trylast: after tests/conftest.py has marked the tests that use a service fixture.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):
        order_for_workers(items)


# tryfirst: before xdist's own hook sends the collection to the controller.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    write_groups(session.config, session.items)
