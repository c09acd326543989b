"""`jobdiagd run` as a real process in tests: its config, start, status, notes, stop, `procs` fixture."""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import multiprocessing.process
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from jobdiagd.cli import main
from jobdiagd_sim import live

if TYPE_CHECKING:  # imported by pytest as a plugin of its own, after this one
    from tests.helpers.slurm_cluster import SlurmCluster

PY = sys.executable
SIM_JOB = Path(live.__file__).with_name("slurm_job.sh")


def daemon_toml(
    work: Path,
    *,
    min_stall: float,
    tick: float = 0.5,
    grace: float | None = 60,
    log_level: str = "info",
    console: bool | None = True,
    outputs_roots: Sequence[Path] = (),
    slurm_conf: Path | None = None,
    daemon: str = "",
    slurm: str = "",
    extra: str = "",
) -> str:
    """The config of a `jobdiagd run` under test, its state and socket in `work`: a hang detector
    with `min_stall`/`grace` (None: the default grace), the jsonl notifier on (what `notes` reads), the console on stdout
    (`console=False`: off; `None`: the default section). `slurm_conf` selects Slurm discovery
    through the CLI backend, polled every second; `daemon`, `slurm` add keys to those sections,
    `extra` whole sections."""
    slurm_keys = ""
    if slurm_conf is not None:
        slurm_keys += f'backend = "cli"\nslurm_conf = "{slurm_conf}"\n'
        daemon = "squeue_interval_seconds = 1\n" + daemon
    if outputs_roots:
        slurm_keys += f"outputs_roots = {json.dumps([str(p) for p in outputs_roots])}\n"
    slurm_keys += slurm
    console_section = {
        True: '[notifiers.console]\nstream = "stdout"\ncolor = "never"\n',
        False: "[notifiers.console]\nenabled = false\n",
        None: "",
    }[console]
    return f"""
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jd.sock"
tick_seconds = {tick}
log_level = "{log_level}"
{daemon}{"[slurm]" + chr(10) + slurm_keys if slurm_keys else ""}
[detectors.hang]
min_stall_seconds = {min_stall}
{"" if grace is None else f"startup_grace_seconds = {grace}" + chr(10)}{console_section}[notifiers.jsonl]
enabled = true
{extra}"""


def write_cfg(work: Path, *, min_stall: float, tick: float = 0.5, **overrides: Any) -> Path:
    """`work/cfg.toml` from `daemon_toml` (its keywords are the overrides)."""
    cfg = work / "cfg.toml"
    cfg.write_text(daemon_toml(work, min_stall=min_stall, tick=tick, **overrides))
    return cfg


def chat_daemon_toml(work: Path, *, min_stall: float) -> str:
    """The part of a chat conversation daemon's config both transports share (quiet console,
    jsonl on, fast retries); the Telegram and Slack rigs append their notifier's section."""
    return f"""
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jd.sock"
tick_seconds = 0.5
log_level = "error"
[slurm]
outputs_roots = ["{work}/outputs"]
[detectors.hang]
min_stall_seconds = {min_stall}
startup_grace_seconds = 60
[delivery]
retry_initial_seconds = 0.2
retry_max_seconds = 1
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
"""


def start_daemon(
    cfg: Path,
    outputs: Path | None,
    log: Path,
    *,
    env: dict[str, str] | None = None,
    prefix: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """`jobdiagd run --config CFG`, watching `outputs` (None: `--discover slurm`), its output
    appended to `log`; `prefix` goes before the interpreter (e.g. a capability-dropping wrapper)."""
    discover = ["--watch", str(outputs)] if outputs is not None else ["--discover", "slurm"]
    with open(log, "ab") as fh:  # the child keeps its own descriptor
        return subprocess.Popen(
            [*prefix, PY, "-m", "jobdiagd.cli", "run", "--config", str(cfg), *discover],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
        )


def notes(work: Path) -> list[dict[str, Any]]:
    p = work / "state" / "notifications.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def wait_for(pred: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def status_cli(cfg: Path, *args: str) -> tuple[int, str]:
    """`jobdiagd status --config CFG ARGS...`: its exit code and what it printed.

    Run in this process (the same `jobdiagd.cli.main` a subprocess would run), not as a new
    Python: tests poll it every 0.2 s while they wait, and a fresh interpreter per poll cost
    about 0.1 s of CPU each, a fifth of a core per waiting test on the 2-core CI machine."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["status", "--config", str(cfg), *args])
    return rc, out.getvalue() or err.getvalue()


def status(cfg: Path) -> dict[str, Any]:
    rc, out = status_cli(cfg, "--json")
    assert rc in (0, 1, 3), out  # 3: not (yet) running
    res: dict[str, Any] = json.loads(out)
    return res


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    return proc.wait(timeout=30)


# What `jobdiagd run` imports before its first tick (python-telegram-bot and slack_sdk included).
RUN_MODULES = ["jobdiagd.cli", "jobdiagd.service.cli", "jobdiagd.service.runner", "tests.helpers.daemon"]


def _run_cli(argv: list[str], log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.exit(main(argv))


class ForkedDaemon:
    """A `jobdiagd run` process forked from a server that has imported the daemon already (see
    `fork_daemon`); the part of subprocess.Popen the tests use."""

    def __init__(self, proc: multiprocessing.process.BaseProcess) -> None:
        self._proc = proc

    @property
    def pid(self) -> int:
        assert self._proc.pid is not None
        return self._proc.pid

    def poll(self) -> int | None:
        return None if self._proc.is_alive() else self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(f"jobdiagd run (pid {self.pid})", timeout or 0)
        return self._proc.exitcode


def fork_daemon(argv: list[str], log: Path) -> ForkedDaemon:
    """`jobdiagd <argv>` (`jobdiagd.cli.main`, as `python -m jobdiagd.cli` runs it), output
    appended to `log`, forked from this test process's multiprocessing fork server, which
    imported the daemon's modules once. For a test that starts the daemon dozens of times (the
    kill -9 loop): a fresh interpreter spends about a second of CPU importing them, each time.
    The forked daemons share the server's multiprocessing resource tracker: the semaphores of
    the plot pools of daemons killed with SIGKILL are cleaned up when the test process exits
    (with a "leaked semaphore" warning), not when each daemon dies."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(RUN_MODULES)
    proc = ctx.Process(target=_run_cli, args=(argv, str(log)), daemon=False)
    proc.start()
    return ForkedDaemon(proc)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Daemons started by a test; killed at its end whatever happened (a wedged one too)."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


FINISHED = ("CANCELLED", "COMPLETED", "FAILED", None)


@dataclass
class DaemonRig:
    """One `jobdiagd run` under test: its work dir (config, state, socket, output logs), the
    outputs root it watches, and, for Slurm discovery, the cluster its jobs run on. Made by the
    `daemon_rig` fixture, which cancels the rig's unfinished Slurm jobs and kills its daemons that
    are still running at the end of the test, whatever happened."""

    work: Path
    outputs: Path
    cfg: Path
    cluster: SlurmCluster | None = None
    env: dict[str, str] | None = None
    prefix: Sequence[str] = ()
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    job_ids: list[str] = field(default_factory=list)
    out: Path = field(init=False)

    def __post_init__(self) -> None:
        self.out = self.work / "daemon.out"

    @property
    def daemon(self) -> subprocess.Popen[bytes]:
        """The daemon started last."""
        return self.procs[-1]

    def start(self, log: str = "daemon.out") -> subprocess.Popen[bytes]:
        """Start the daemon (watching `outputs`, or through squeue on the rig's cluster)."""
        self.out = self.work / log
        env = self.env if self.env is not None else (self.cluster.env if self.cluster else None)
        watch = None if self.cluster is not None else self.outputs
        self.procs.append(start_daemon(self.cfg, watch, self.out, env=env, prefix=self.prefix))
        return self.procs[-1]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Stop the daemon started last; its exit code."""
        return stop(self.daemon, sig)

    def log(self, chars: int = 3000) -> str:
        """The tail of the current daemon's output (for an assertion's message)."""
        return self.out.read_text(errors="replace")[-chars:]

    def notes(self) -> list[dict[str, Any]]:
        return notes(self.work)

    def status(self) -> dict[str, Any]:
        return status(self.cfg)

    def sbatch_sim(self, name: str, *live_args: str, ntasks: int = 2) -> str:
        """Submit the simulator's `slurm_job.sh` as job `name`, writing into `outputs`; the job is
        cancelled at the end of the test if it is still queued or running."""
        assert self.cluster is not None, "a Slurm rig"
        job_id = self.cluster.sbatch(
            f"--export=ALL,SIM_PYTHON={PY}",
            f"--job-name={name}",
            f"--output={self.outputs}/%j-%x.log",
            f"--ntasks={ntasks}",
            "--overcommit",
            str(SIM_JOB),
            str(self.outputs),
            *live_args,
        )
        self.job_ids.append(job_id)
        return job_id

    def cleanup(self) -> None:
        if self.cluster is not None:
            cluster = self.cluster
            with contextlib.suppress(subprocess.TimeoutExpired):  # a cluster a failed test left down
                cluster.scancel(*[j for j in self.job_ids if cluster.state(j) not in FINISHED])
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


MakeRig = Callable[..., DaemonRig]


@pytest.fixture
def daemon_rig() -> Iterator[MakeRig]:
    """`daemon_rig(work, *, cluster=None, outputs=None, env=None, prefix=(), **config)`: writes
    `work/cfg.toml` (`daemon_toml`'s keywords override it) and returns the `DaemonRig`, not yet
    started. With a `cluster` the daemon finds its jobs through squeue and the outputs root is
    made world-writable (Slurm's jobs run as their user); without, it watches `outputs`."""
    made: list[DaemonRig] = []

    def make(
        work: Path,
        *,
        cluster: SlurmCluster | None = None,
        outputs: Path | None = None,
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
        **config: Any,
    ) -> DaemonRig:
        outputs = outputs if outputs is not None else work / "outputs"
        if cluster is not None:
            outputs.mkdir(exist_ok=True)
            outputs.chmod(0o777)
            config = {"slurm_conf": cluster.conf, "outputs_roots": [outputs], **config}
        rig = DaemonRig(work, outputs, write_cfg(work, **config), cluster, env, prefix)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.cleanup()
