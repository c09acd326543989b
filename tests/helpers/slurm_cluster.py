"""A real Slurm cluster for tests, started through scripts/services/slurm.sh: node001 runs jobs,
node002..node004 are defined but DOWN (no slurmd), for --exclude / ExcNodeList / drain tests.

The fixtures are registered for every test by tests/conftest.py (`pytest_plugins`), and a test
using one is marked `slurm` automatically (tests/helpers/services.py):

    def test_x(slurm_cluster):             # SlurmCluster: .env, .conf, .sbatch(), .scancel() ...
        ...
    def test_y(slurm_conf_env):           # SLURM_CONF set in os.environ for this test
        ...

The cluster is shared: several pytest sessions (other agents, xdist workers) may use the same
state dir at once. Each session holds a lease (a file named after its PID); the session that
releases the last live lease stops the cluster.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "services" / "slurm.sh"


class SlurmClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class SlurmCluster:
    state_dir: Path
    conf: Path
    env: dict[str, str]  # os.environ plus SLURM_CONF: pass as env= to subprocesses
    node: str = "node001"
    partition: str = "debug"
    # Defined in slurm.conf, DOWN: never scheduled on. Drain only these (others share node001).
    spare_nodes: tuple[str, ...] = ("node002", "node003", "node004")
    started_here: bool = False

    @property
    def backend_env(self) -> dict[str, str]:
        """What CliSlurmBackend(env=...) needs on top of the process environment."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise SlurmClusterError(f"{' '.join(argv)} -> exit {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def sbatch(self, *args: str) -> str:
        """Submit (`--parsable` added); returns the job id."""
        out = self.run("sbatch", "--parsable", *args).stdout.strip()
        job_id = out.split(";", 1)[0]
        if not re.fullmatch(r"\d+", job_id):
            raise SlurmClusterError(f"sbatch printed {out!r}")
        return job_id

    def scancel(self, *job_ids: str) -> None:
        if job_ids:
            self.run("scancel", *job_ids, check=False)

    def state(self, job_id: str) -> str | None:
        """JobState from scontrol (None once the job is forgotten)."""
        proc = self.run("scontrol", "-o", "show", "job", job_id, check=False)
        m = re.search(r"\bJobState=(\S+)", proc.stdout)
        return m.group(1) if m else None

    def wait_state(self, job_id: str, states: Sequence[str], timeout: float = 60) -> str:
        """Block until the job reaches one of `states`; fail with what it was in otherwise."""
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            st = self.state(job_id)
            if st is not None and st in states:
                return st
            time.sleep(0.2)
        raise SlurmClusterError(f"job {job_id} not in {list(states)} after {timeout:g} s (last: {st})")


def _script(cmd: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), cmd], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _conf_path(env: dict[str, str]) -> Path:
    out = _script("env", env, 10).stdout
    m = re.search(r"export SLURM_CONF=(\S+)", out)
    if not m:
        raise SlurmClusterError(f"slurm.sh env printed {out!r}")
    return Path(m.group(1))


@contextlib.contextmanager
def _leases_locked(state_dir: Path) -> Iterator[Path]:
    leases = state_dir / "leases"
    leases.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "leases.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield leases
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_leases(leases: Path) -> list[int]:
    """PIDs holding a lease; leases of dead processes are removed."""
    alive = []
    for f in leases.iterdir():
        if not f.name.isdigit():
            continue
        pid = int(f.name)
        if _pid_alive(pid):
            alive.append(pid)
        else:
            f.unlink(missing_ok=True)
    return alive


def start_cluster(extra_env: dict[str, str] | None = None, timeout: float = 120) -> SlurmCluster:
    """Start (or reuse) the cluster and take a lease on it for this process."""
    env = dict(os.environ)
    env.update(extra_env or {})
    conf = _conf_path(env)
    state_dir = conf.parent.parent
    state_dir.mkdir(parents=True, exist_ok=True)
    with _leases_locked(state_dir) as leases:
        was_up = _script("status", env, 15).returncode == 0
        proc = _script("start", env, timeout)
        if proc.returncode != 0:
            raise SlurmClusterError(f"scripts/services/slurm.sh start failed:\n{proc.stderr}{proc.stdout}")
        (leases / str(os.getpid())).write_text(str(time.time()))
    cenv = dict(env)
    cenv["SLURM_CONF"] = str(conf)
    return SlurmCluster(state_dir=state_dir, conf=conf, env=cenv, started_here=not was_up)


def release_cluster(cluster: SlurmCluster, timeout: float = 120) -> bool:
    """Drop this process's lease; stop the cluster if no live lease is left. True if stopped."""
    with _leases_locked(cluster.state_dir) as leases:
        (leases / str(os.getpid())).unlink(missing_ok=True)
        if live_leases(leases):
            return False
        proc = _script("stop", cluster.env, timeout)
        if proc.returncode != 0:
            raise SlurmClusterError(f"scripts/services/slurm.sh stop failed:\n{proc.stderr}")
        return True


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The running one-node cluster (started once per session, stopped at its end)."""
    try:
        cluster = start_cluster()
    except (SlurmClusterError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"cannot start the Slurm test cluster: {e}", pytrace=False)
    try:
        yield cluster
    finally:
        release_cluster(cluster)


@pytest.fixture
def slurm_conf_env(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """Sets SLURM_CONF in os.environ for one test (for code that runs Slurm commands itself)."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    return slurm_cluster
