"""Real Alertmanagers for tests (scripts/services/alertmanager.sh) and a webhook receiver counting their deliveries.

The fixtures are registered for every test by tests/conftest.py (`pytest_plugins`); a test
using `alertmanager` or `alertmanager_pair` is marked `alertmanager` automatically.

    async def test_x(alertmanager: Alertmanager, webhook: Webhook) -> None:
        ...  # alertmanager.url, await alertmanager.alerts(), webhook.deliveries

Every test gets its own service dir (names never collide with another session's) and its own
instances, stopped by PID afterwards. The Alertmanager config routes everything to the webhook
with short group timers, so a test sees a notification about a second after the alert.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.helpers.local_services import service_env

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "services" / "alertmanager.sh"

# bcrypt of "jobdiagd-test-password" (Alertmanager's --web.config.file wants a bcrypt hash).
TEST_USER = "jobdiagd"
TEST_PASSWORD = "jobdiagd-test-password"
TEST_PASSWORD_BCRYPT = "$2b$10$hN7vm.tJ8sYJSibV/CubJu3B2MwaZqzZf20CjKNSdbPfaFlIVTkT6"


class Webhook:
    """An aiohttp server that Alertmanager's webhook_configs post to; keeps every delivery."""

    def __init__(self) -> None:
        self.deliveries: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.json()
        body["_received"] = time.time()
        self.deliveries.append(body)
        return web.Response(text="ok")

    def timeline(self) -> str:
        """One line per delivery (arrival, status, job, startsAt/endsAt): a failure's evidence.

        A duplicate with the same startsAt but a resolved one between them is an alert that
        expired while its sender was stalled; two of the same status seconds apart came from
        both peers (the second did not see the first's notification log in its peer timeout).
        """
        t0 = self.deliveries[0]["_received"] if self.deliveries else 0.0
        return "\n".join(
            f"+{d['_received'] - t0:6.2f}s {d.get('status')} job {a['labels'].get('job_id')} "
            f"starts {a.get('startsAt', '')[11:23]} ends {a.get('endsAt', '')[11:23]}"
            for d in self.deliveries
            for a in d["alerts"]
        )

    def notifications(self, status: str, **labels: str) -> list[dict[str, Any]]:
        """Deliveries of `status` ("firing"/"resolved") holding an alert with these labels."""
        return [
            d
            for d in self.deliveries
            if d.get("status") == status
            and any(all(a["labels"].get(k) == v for k, v in labels.items()) for a in d["alerts"])
        ]


def am_config(webhook_url: str, *, group_interval: str = "1s", repeat_interval: str = "1h") -> str:
    # resolve_timeout is short on purpose: only re-posting keeps an alert firing.
    return f"""
global:
  resolve_timeout: 2s
route:
  receiver: hook
  group_by: ['alertname', 'cluster', 'job_id']
  group_wait: 500ms
  group_interval: {group_interval}
  repeat_interval: {repeat_interval}
receivers:
- name: hook
  webhook_configs:
  - url: {webhook_url}
    send_resolved: true
"""


def _script(env: dict[str, str], *args: str, timeout: float = 60) -> str:
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"alertmanager.sh {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class Alertmanager:
    """One instance started by the script; `stop()`/`start()` keep its port and storage."""

    name: str
    config: Path
    svc: Path
    env: dict[str, str]
    port: int = 0
    cluster_args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.svc / f"alertmanager-{self.name}.log"

    def start(self) -> None:
        _script(self.env, "start", self.name, str(self.config), str(self.port or ""), *self.cluster_args)
        self.port = int((self.svc / f"alertmanager-{self.name}.port").read_text())

    def stop(self) -> None:
        _script(self.env, "stop", self.name)

    async def alerts(self, *filters: str, authorization: str | None = None) -> list[dict[str, Any]]:
        """GET /api/v2/alerts (active, silenced and inhibited; resolved ones are not listed)."""
        params = [("filter", f) for f in filters]
        headers = {"Authorization": authorization} if authorization is not None else {}
        async with (
            aiohttp.ClientSession(headers=headers) as http,
            http.get(f"{self.url}/api/v2/alerts", params=params) as resp,
        ):
            resp.raise_for_status()
            out: list[dict[str, Any]] = await resp.json()
            return out


def epoch(stamp: str) -> float:
    """An Alertmanager time ("2026-12-01T15:21:10.64Z", trailing zeros dropped) as epoch seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


async def wait_until(pred: Callable[[], Any], what: str, within: float = 30.0) -> Any:
    """Poll a sync or async predicate until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + within
    while True:
        value = pred()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(0.1)


@pytest.fixture
async def webhook() -> AsyncIterator[Webhook]:
    hook = Webhook()
    await hook.start()
    try:
        yield hook
    finally:
        await hook.stop()


@pytest.fixture
def am_dir(tmp_path: Path) -> Path:
    # Short and private: the service dir holds pid files and the instances' storage.
    return tmp_path


@pytest.fixture
def alertmanager(am_dir: Path, webhook: Webhook) -> Iterator[Alertmanager]:
    cfg = am_dir / "alertmanager.yml"
    cfg.write_text(am_config(webhook.url))
    am = Alertmanager("single", cfg, am_dir / "svc", service_env(am_dir / "svc"))
    am.start()
    try:
        yield am
    finally:
        am.stop()


@dataclass
class Pair:
    peers: tuple[Alertmanager, Alertmanager]

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.peers]


# Short peer timeout (the second peer waits this long for the first to notify) and fast gossip:
# test speed only; Alertmanager's defaults are 15 s and 200 ms.
PEER_TIMEOUT = 2.0
# A pair's group_interval must exceed the peer timeout, as Alertmanager's defaults do (5 min vs
# 15 s). The second peer's flush lasts one peer timeout and works on the alerts as they were when
# it began; with flushes every 1 s it is always in one, and an alert that resolves while it waits
# is paged again, stale, after the first peer's "resolved" (then resolved a second time): one CI
# run counted 2 firing + 2 resolved for one incident.
PAIR_GROUP_INTERVAL = "4s"
PAIR_ENV = {"ALERTMANAGER_PEER_TIMEOUT": f"{PEER_TIMEOUT:g}s", "ALERTMANAGER_GOSSIP_INTERVAL": "50ms"}


@pytest.fixture
def alertmanager_pair(am_dir: Path, webhook: Webhook) -> Iterator[Pair]:
    cfg = am_dir / "alertmanager.yml"
    cfg.write_text(am_config(webhook.url, group_interval=PAIR_GROUP_INTERVAL))
    svc = am_dir / "svc"
    env = service_env(svc, **PAIR_ENV)
    _script(env, "start-pair", "ha", str(cfg))
    peers = []
    for i in (0, 1):
        name = f"ha-{i}"
        port = int((svc / f"alertmanager-{name}.port").read_text())
        cport = (svc / f"alertmanager-{name}.cport").read_text().strip()
        other = (svc / f"alertmanager-ha-{1 - i}.cport").read_text().strip()
        peers.append(Alertmanager(name, cfg, svc, env, port, (cport, f"127.0.0.1:{other}")))
    try:
        yield Pair((peers[0], peers[1]))
    finally:
        _script(env, "stop-pair", "ha")
