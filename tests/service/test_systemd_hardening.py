"""The systemd unit's hardening: its exposure score, and a system call filter the daemon lives within.

`systemd-analyze security --offline=true` scores the shipped unit (printed; it must stay
under 2.0). The test machine's PID 1 is not systemd, so the unit cannot be started here;
instead a real daemon run (a watched job paged through the jsonl notifier, `jobdiagd status`
over the socket) is traced with strace, and every system call it and its children made must
be in the set the unit's SystemCallFilter= lines allow, expanded by systemd-analyze itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from jobdiagd_sim import lines as L

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "jobdiagd.service"
PY = sys.executable


def analyze(*args: str) -> str:
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze missing: scripts/setup.sh installs the systemd package"
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, check=False)
    return done.stdout + done.stderr


def test_the_unit_s_exposure_score_is_below_2() -> None:
    out = analyze("security", "--offline=true", str(UNIT))
    m = re.search(r"Overall exposure level for jobdiagd\.service: (\d+\.\d+)", out)
    assert m, out
    print(f"systemd-analyze security: exposure {m.group(1)}")
    assert float(m.group(1)) < 2.0, out


@cache
def expand(name: str) -> frozenset[str]:
    """The system calls of a systemd syscall group (nested groups expanded)."""
    calls: set[str] = set()
    for line in analyze("syscall-filter", name).splitlines()[1:]:
        item = line.split("#")[0].strip()
        if item.startswith("@"):
            calls |= expand(item)
        elif item:
            calls.add(item)
    return frozenset(calls)


def allowed_by_unit() -> frozenset[str]:
    """SystemCallFilter= lines in order: the first an allow list, then `~` removes, others add."""
    allowed: set[str] = set()
    lines = [ln.split("=", 1)[1] for ln in UNIT.read_text().splitlines() if ln.startswith("SystemCallFilter=")]
    assert lines and not lines[0].startswith("~"), "the unit's filter must start with an allow list"
    for value in lines:
        deny = value.startswith("~")
        names = set().union(*(expand(n) if n.startswith("@") else {n} for n in value.lstrip("~").split()))
        allowed = allowed - names if deny else allowed | names
    return frozenset(allowed)


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="jdsys-", dir="/tmp") as d:
        yield Path(d)


def hung_job(outputs: Path) -> None:
    name = "9901-JAX-llama3.1-8b-sys"
    (outputs / name).mkdir(parents=True)
    (outputs / name / "log").symlink_to(f"../{name}.log")
    lines = L.header_lines(
        job_id="9901", name="JAX-llama3.1-8b-sys", nnodes=1, nodelist="node001", jax_port=12321, ray_port=None,
        passthrough={"steps": 100}, model="llama3.1-8b",
    )
    for k in range(6):
        f = L.StepFields(step=k, seconds=0.2, tflops=40.0, tokens=3000.0, total_weights=196608, loss=2.5)
        lines.append(L.srun_prefix(0, 1) + L.step_line(f))
    (outputs / f"{name}.log").write_text("\n".join(lines) + "\n")


@pytest.mark.daemon
def test_the_daemon_makes_no_system_call_the_unit_filters_out(work: Path) -> None:
    strace = shutil.which("strace")
    assert strace, "strace missing (apt-get install strace)"
    allowed = allowed_by_unit()
    # A sane expansion, with what squeue/scancel and the chat workers need (fork, setsid, pipes, wait).
    assert {"read", "openat", "connect", "clone3", "execve", "fchown", "setsid", "pipe2", "wait4", "kill"} <= allowed
    assert not {"setuid", "mount", "reboot", "setrlimit", "init_module"} & allowed
    outputs = work / "outputs"
    hung_job(outputs)
    cfg = work / "cfg.toml"
    cfg.write_text(
        f"""
[daemon]
state_dir = "{work}/state"
socket_path = "{work}/jd.sock"
tick_seconds = 0.5
[detectors.hang]
min_stall_seconds = 2
startup_grace_seconds = 60
[notifiers.console]
enabled = false
[notifiers.jsonl]
enabled = true
"""
    )
    summary = work / "strace.txt"
    proc = subprocess.Popen(
        [strace, "-f", "-qq", "-c", "-o", str(summary), PY, "-m", "jobdiagd.cli", "run", "--config", str(cfg),
         "--watch", str(outputs)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        notes = work / "state" / "notifications.jsonl"
        deadline = time.monotonic() + 120
        while not (notes.exists() and "9901" in notes.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the daemon did not page the hang"
            time.sleep(0.3)
        status = subprocess.run(
            [PY, "-m", "jobdiagd.cli", "status", "--config", str(cfg), "--json"],
            capture_output=True, text=True, timeout=60,
        )
        assert "9901" in status.stdout, status.stdout + status.stderr
        daemon_pid = json.loads(status.stdout)["status"]["pid"]
        os.kill(daemon_pid, signal.SIGTERM)  # the daemon, not strace: a clean shutdown is traced too
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    used = set()
    for line in summary.read_text().splitlines():
        parts = line.split()
        if parts and re.fullmatch(r"[\d.]+", parts[0]) and parts[-1] != "total":
            used.add(parts[-1])
    print(f"{len(used)} distinct system calls used: {sorted(used)}")
    assert len(used) > 20, summary.read_text()
    assert used <= allowed, f"filtered out by the unit but used: {sorted(used - allowed)}"
