"""An HA pair end to end: two `jobdiagd run` processes ("login1", "login2", separate state dirs)
watch the same jobs and post to a two-peer Alertmanager cluster (Debian's alertmanager, gossip
on loopback) whose only receiver is a webhook in the test.

Counted at the webhook: one firing and one resolved notification per incident although both
daemons post it to both peers; after one daemon is killed (SIGKILL), the other alone pages
the next incident, once.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers.alertmanager import (  # noqa: F401  (fixtures)
    PEER_TIMEOUT,
    Pair,
    Webhook,
    alertmanager_pair,
    am_dir,
    wait_until,
    webhook,
)
from tests.helpers.daemon import start_daemon, write_cfg
from tests.helpers.faults import record_fault, short_dir  # noqa: F401  (fixture)
from tests.helpers.joblog import JobLog

RESEND = 1.0
# Long enough for the second Alertmanager peer to decide (PEER_TIMEOUT), with a margin.
PEER_DECIDES = PEER_TIMEOUT + 1.0

pytestmark = [pytest.mark.alertmanager, pytest.mark.daemon, pytest.mark.timeout(240)]


def login_node(work: Path, name: str, outputs: Path, urls: list[str]) -> Path:
    home = work / name
    home.mkdir()
    am = f"""[notifiers.alertmanager]
enabled = true
urls = {json.dumps(urls)}
cluster = "testcluster"
instance = "{name}"
resend_interval_seconds = {RESEND}
timeout_seconds = 2
[delivery]
retry_initial_seconds = 0.2
retry_max_seconds = 1
"""
    return write_cfg(home, min_stall=3, console=False, outputs_roots=[outputs], extra=am)


def start(cfg: Path, outputs: Path) -> subprocess.Popen[bytes]:
    return start_daemon(cfg, outputs, cfg.parent / "daemon.out")


def hung_job(outputs: Path, job_id: str) -> JobLog:
    job = JobLog(outputs, job_id)
    for k in range(8):
        job.step(k, seconds=0.2)
    return job


def opened_by(cfg: Path, job_id: str) -> bool:
    path = cfg.parent / "state" / "notifications.jsonl"
    return path.exists() and f'"{job_id}:hang:1:open"' in path.read_text()


async def test_two_daemons_page_each_incident_once_and_one_survivor_still_pages(
    alertmanager_pair: Pair,  # noqa: F811 - the fixtures
    webhook: Webhook,  # noqa: F811
    short_dir: Path,  # noqa: F811
) -> None:
    outputs = short_dir / "outputs"
    outputs.mkdir()
    cfgs = [login_node(short_dir, n, outputs, alertmanager_pair.urls) for n in ("login1", "login2")]
    procs = [start(c, outputs) for c in cfgs]
    try:
        first = hung_job(outputs, "5101")
        # Both daemons see the hang on their own: each opens the incident in its own store.
        for cfg in cfgs:
            await wait_until(lambda c=cfg: opened_by(c, "5101"), f"{cfg.parent.name} opening 5101", within=60)
        await wait_until(
            lambda: webhook.notifications("firing", job_id="5101"), "the page of 5101", within=60
        )
        # The second Alertmanager peer decides one peer timeout after the first: let it decide
        # (not to page) while the incident is open, as it does for real incidents.
        await asyncio.sleep(PEER_DECIDES)
        first.step(8, seconds=5.0)
        first.summary(0)  # resumed and finished: no second hang
        await wait_until(lambda: webhook.notifications("resolved", job_id="5101"), "5101 resolved", within=60)

        # login1 dies; login2 alone pages the next incident.
        procs[0].send_signal(signal.SIGKILL)
        assert await asyncio.to_thread(procs[0].wait, 30) == -signal.SIGKILL
        second = hung_job(outputs, "5102")
        await wait_until(
            lambda: webhook.notifications("firing", job_id="5102"), "the page of 5102", within=60
        )
        assert not opened_by(cfgs[0], "5102")  # paged by the survivor alone
        assert opened_by(cfgs[1], "5102")
        await asyncio.sleep(PEER_DECIDES)
        second.step(8, seconds=5.0)
        second.summary(0)
        await wait_until(lambda: webhook.notifications("resolved", job_id="5102"), "5102 resolved", within=60)
        await asyncio.sleep(PEER_DECIDES)  # a duplicate would come from the other peer one peer timeout later

        counts = {
            (job, status): len(webhook.notifications(status, job_id=job))
            for job in ("5101", "5102")
            for status in ("firing", "resolved")
        }
        assert counts == {
            ("5101", "firing"): 1,
            ("5101", "resolved"): 1,
            ("5102", "firing"): 1,
            ("5102", "resolved"): 1,
        }, webhook.timeline()
        procs[1].send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(procs[1].wait, 30) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
    record_fault(
        "HA pair: one daemon killed",
        injected="two daemons (separate state dirs) on the same jobs, each posting to both peers of an "
        "Alertmanager pair; one daemon SIGKILLed between two incidents",
        daemon="both opened the first incident and posted it; the survivor alone opened and posted "
        "the second; Alertmanager deduplicated the pair's identical label sets",
        delivered=", ".join(f"{job} {status} {n}" for (job, status), n in counts.items()),
        figures={"webhook deliveries": len(webhook.deliveries), "daemons": 2, "alertmanager peers": 2},
    )
