"""The real services integration tests start through `scripts/services/*.sh`, one place for each.

    with running_sshd(tmp_path / "svc") as ssh, running_prometheus(...) as port:
        ssh_config.write_text(ssh.stanza("node001"))

Every test names its own service dir (pid files, ports, logs): instances never collide with
another test's or another session's. The scripts' paths stay in the argv, so a `--unit` run
still tells which service marker a test lacks (tests/helpers/services.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from jobdiagd.tsdb.access import free_loopback_port

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "services"


def service_env(svc: Path, **extra: str) -> dict[str, str]:
    """The environment of a service script whose instances live in `svc`."""
    return {**os.environ, "JOBDIAGD_SVC_DIR": str(svc), **extra}


def run_service(env: dict[str, str], script: str, *args: str, check: bool = True) -> str:
    """`bash scripts/services/<script> <args>`; its stdout."""
    out = subprocess.run(
        ["bash", str(SCRIPTS / script), *args], env=env, check=check, capture_output=True, text=True
    )
    return out.stdout


@dataclass(frozen=True)
class Sshd:
    """A running sshd on 127.0.0.1 with key auth for the current user."""

    port: int
    user: str
    key: str
    known_hosts: str

    def stanza(self, host: str, port: int | None = None) -> str:
        """An ssh_config block reaching this sshd as `host` (`port`: another one, e.g. a closed port)."""
        return (
            f"Host {host}\n  HostName 127.0.0.1\n  Port {self.port if port is None else port}\n"
            f"  User {self.user}\n  IdentityFile {self.key}\n  UserKnownHostsFile {self.known_hosts}\n"
        )


@contextmanager
def running_sshd(svc: Path) -> Iterator[Sshd]:
    """An sshd on a free loopback port for the block's duration."""
    env = service_env(svc, SSHD_PORT=str(free_loopback_port()))
    run_service(env, "sshd.sh", "start")
    try:
        info = dict(line.split("=", 1) for line in run_service(env, "sshd.sh", "env").split())
        yield Sshd(int(info["SSHD_PORT"]), info["SSH_USER"], info["SSH_KEY"], info["SSH_KNOWN_HOSTS"])
    finally:
        run_service(env, "sshd.sh", "stop", check=False)


@contextmanager
def running_prometheus(svc: Path, name: str, config: Path, data: Path) -> Iterator[int]:
    """Prometheus instance `name` on `config`, writing its TSDB to `data`; yields its port."""
    env = service_env(svc)
    run_service(env, "prometheus.sh", "start", name, str(config), str(data))
    try:
        yield int((svc / f"prometheus-{name}.port").read_text())
    finally:
        run_service(env, "prometheus.sh", "stop", name, check=False)


def scrape_config(job: str, ports: Iterable[int], interval: str = "1s") -> str:
    """A prometheus.yml scraping the loopback `ports` as one scrape job, every `interval`."""
    targets = ", ".join(f"'127.0.0.1:{p}'" for p in ports)
    return (
        f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\nscrape_configs:\n"
        f"  - job_name: {job}\n    static_configs:\n      - targets: [{targets}]\n"
    )


def wait_scraped(port: int, targets: int, within: float = 60.0) -> None:
    """Until every one of `targets` was scraped at least 4 times (rates need 3 samples, the
    hang judge 2 fresh ones)."""
    q = urllib.parse.urlencode({"query": "count(count_over_time(up[20s]) >= 4)"})
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{q}", timeout=5) as r:
            res = json.load(r)["data"]["result"]
        if res and int(float(res[0]["value"][1])) >= targets:
            return
        time.sleep(0.2)
    raise AssertionError(f"Prometheus did not scrape every exporter 4 times within {within:g} s")
