"""The Alertmanager notifier against Debian's real Alertmanager on loopback, fed by the real alert pipeline.

Each test runs its own Alertmanager (scripts/services/alertmanager.sh) whose only receiver is a
webhook in the test: what Alertmanager shows (GET /api/v2/alerts) and what it notifies (the
webhook's deliveries) are both checked.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Sequence
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from jobdiagd import clock
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import loads
from jobdiagd.model.alerts import Finding, Severity
from jobdiagd.notifiers.alertmanager import AlertmanagerNotifier, iso
from jobdiagd.notifiers.base import NotifierError
from jobdiagd.notifiers.dispatcher import Dispatcher, RetryPolicy
from jobdiagd.notifiers.registry import build_notifiers
from jobdiagd.service.alert_sync import current_state, resync_loop
from jobdiagd.service.health import Health
from tests.helpers.alertmanager import (
    PEER_TIMEOUT,
    TEST_PASSWORD,
    TEST_PASSWORD_BCRYPT,
    TEST_USER,
    Alertmanager,
    Pair,
    Webhook,
    am_config,
    epoch,
    wait_until,
)
from tests.helpers.local_services import service_env

RESEND = 1.0  # the smallest interval config allows; a post is valid for 4 of them
LIFETIME = 4 * RESEND


def at(stamp: str) -> datetime:
    """An RFC 3339 time as an instant: Alertmanager (Go) drops trailing zeros of the fraction,
    so `…29.49Z` and our `…29.490Z` are the same time but not the same text."""
    return datetime.fromisoformat(stamp)


class Sender:
    """One daemon's alerting half: config -> registry -> real SQLite pipeline, dispatcher, resync loop."""

    def __init__(self, state: Path, urls: Sequence[str], *, resync: bool = True, extra: str = "") -> None:
        self.cfg = loads(
            f"""
[daemon]
state_dir = "{state}"
[notifiers.console]
enabled = false
[notifiers.alertmanager]
enabled = true
urls = {list(urls)!r}
cluster = "testcluster"
instance = "login1"
resend_interval_seconds = {RESEND}
timeout_seconds = 2
runbook_url = "https://runbooks.example.org/jobdiagd#{{kind}}"
{extra}
[delivery]
retry_initial_seconds = 0.2
retry_max_seconds = 0.5
""".replace("'", '"'),
            source="test.toml",
        )
        notifiers, _ = build_notifiers(self.cfg)
        (am,) = notifiers
        assert isinstance(am, AlertmanagerNotifier)
        self.am = am
        self.pipeline = AlertPipeline.open(state, self.cfg.incidents, ["alertmanager"])
        self.dispatcher = Dispatcher(
            self.pipeline.outbox, notifiers, policy=RetryPolicy.from_config(self.cfg.delivery)
        )
        self.pipeline.on_enqueue = self.dispatcher.kick
        self.health = Health(tick_seconds=3600, started_at=clock.wall())
        self.resync = resync
        self._tasks: list[asyncio.Task[None]] = []

    def status(self) -> dict[str, Any]:
        # The shape runner.snapshot() gives the status socket, which the conditions are read from.
        return self.health.snapshot({"notifiers": self.dispatcher.snapshot(), "jobs": []})

    async def start(self) -> Sender:
        self.am.attach(self.pipeline.store.load_incident)
        self._tasks.append(asyncio.create_task(self.dispatcher.run()))
        if self.resync:
            state = partial(current_state, self.pipeline, self.status, ("alertmanager",))
            self._tasks.append(asyncio.create_task(resync_loop(self.am, state)))
        return self

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self.am.aclose()
        self.pipeline.close()

    def finding(
        self,
        job: str,
        *,
        kind: str = "hang",
        severity: Severity = "critical",
        owner: str | None = "alice",
        resolved: bool = False,
    ) -> None:
        summary = "steps resumed at step 317" if resolved else "no step since step 316 for 12 min"
        evidence = () if resolved else ("node001: [rank 0] NCCL WARN Timeout waiting for peer",)
        f = Finding(
            "hang" if kind == "hang" else "failure_signature",
            job,
            kind,
            severity,
            summary,
            {"last step": 316},
            evidence,
            at_step=316,
            resolved=resolved,
            owner=owner,
        )
        self.pipeline.observe([f], clock.wall())


def one(alerts: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(alerts) == 1, alerts
    return alerts[0]


async def test_open_incident_is_posted_kept_firing_by_reposts_and_resolved(
    alertmanager: Alertmanager, webhook: Webhook, tmp_path: Path
) -> None:
    s = await Sender(tmp_path / "state", [alertmanager.url]).start()
    try:
        s.finding("4101")
        alert = one(await wait_until(lambda: alertmanager.alerts('job_id="4101"'), "the alert"))
        assert alert["labels"] == {
            "alertname": "JobdiagdHang",
            "cluster": "testcluster",
            "job_id": "4101",
            "kind": "hang",
            "severity": "critical",
            "owner": "alice",
            "source": "jobdiagd",
        }
        ann = alert["annotations"]
        assert ann["summary"] == "hang on job 4101: no step since step 316 for 12 min"
        assert "**detector**: hang" in ann["description"] and "NCCL WARN Timeout" in ann["description"]
        assert ann["incident_id"] == "4101:hang:1"
        assert ann["runbook_url"] == "https://runbooks.example.org/jobdiagd#hang"
        inc = s.pipeline.book.get("4101", "hang")
        assert inc is not None and at(alert["startsAt"]) == at(iso(inc.opened_at))
        await wait_until(lambda: webhook.notifications("firing", job_id="4101"), "the firing notification")

        # Longer than a post's lifetime and Alertmanager's resolve_timeout: only re-posts keep it.
        first_update = alert["updatedAt"]
        await asyncio.sleep(LIFETIME + 2.5)
        alert = one(await alertmanager.alerts('job_id="4101"'))
        assert alert["status"]["state"] == "active" and epoch(alert["updatedAt"]) > epoch(first_update)
        assert webhook.notifications("resolved", job_id="4101") == []

        s.finding("4101", resolved=True)
        await wait_until(
            lambda: webhook.notifications("resolved", job_id="4101"), "the resolved notification"
        )
        assert await alertmanager.alerts('job_id="4101"') == []
        closed = s.pipeline.store.load_incident("4101:hang:1")
        assert closed is not None and closed.resolved_at is not None
        (resolved,) = webhook.notifications("resolved", job_id="4101")[0]["alerts"]
        assert at(resolved["endsAt"]) == at(iso(closed.resolved_at))
        assert resolved["labels"]["severity"] == "critical"  # the resolve message's "info" is not a label
        assert len(webhook.notifications("firing", job_id="4101")) == 1
    finally:
        await s.stop()


async def test_without_reposts_the_alert_resolves_by_itself(
    alertmanager: Alertmanager, webhook: Webhook, tmp_path: Path
) -> None:
    # The control for the test above: the outbox alone posts once, and the post expires.
    s = await Sender(tmp_path / "state", [alertmanager.url], resync=False).start()
    try:
        s.finding("4102")
        await wait_until(lambda: alertmanager.alerts('job_id="4102"'), "the alert")
        await wait_until(
            lambda: webhook.notifications("resolved", job_id="4102"), "expiry", within=LIFETIME + 10
        )
        assert await alertmanager.alerts('job_id="4102"') == []
    finally:
        await s.stop()


async def test_a_restarted_daemon_keeps_reposting_the_same_alert(
    alertmanager: Alertmanager, webhook: Webhook, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    first = await Sender(state, [alertmanager.url]).start()
    first.finding("4103", owner="bob")
    before = one(await wait_until(lambda: alertmanager.alerts('job_id="4103"'), "the alert"))
    await wait_until(lambda: webhook.notifications("firing", job_id="4103"), "the firing notification")
    await first.stop()

    second = await Sender(state, [alertmanager.url]).start()  # a new process: nothing kept in memory
    try:
        await asyncio.sleep(LIFETIME + 2.5)  # the first incarnation's last post has expired by now
        after = one(await alertmanager.alerts('job_id="4103"'))
        assert after["status"]["state"] == "active"
        assert after["fingerprint"] == before["fingerprint"] and after["labels"]["owner"] == "bob"
        assert after["annotations"]["description"] == before["annotations"]["description"]
        assert len(webhook.notifications("firing", job_id="4103")) == 1  # the same alert, not a new page

        second.finding("4103", resolved=True)  # the resolve after a restart reaches the same alert
        await wait_until(
            lambda: webhook.notifications("resolved", job_id="4103"), "the resolved notification"
        )
    finally:
        await second.stop()


async def test_alertmanager_down_then_back_gets_the_open_and_the_resolve(
    alertmanager: Alertmanager, webhook: Webhook, tmp_path: Path
) -> None:
    # No resync loop: what arrives here came through the outbox's retries.
    s = await Sender(tmp_path / "state", [alertmanager.url], resync=False).start()
    try:
        await asyncio.to_thread(alertmanager.stop)
        s.finding("4104")
        await wait_until(lambda: s.dispatcher.state["alertmanager"].failed >= 2, "failed attempts")
        await asyncio.to_thread(alertmanager.start)
        await wait_until(lambda: alertmanager.alerts('job_id="4104"'), "the alert after the outage")
        await wait_until(lambda: webhook.notifications("firing", job_id="4104"), "the firing notification")

        await asyncio.to_thread(alertmanager.stop)
        s.finding("4104", resolved=True)
        failed = s.dispatcher.state["alertmanager"].failed
        await wait_until(lambda: s.dispatcher.state["alertmanager"].failed > failed, "a failed resolve")
        await asyncio.to_thread(alertmanager.start)
        await wait_until(
            lambda: webhook.notifications("resolved", job_id="4104"), "the resolve after the outage"
        )
        assert s.pipeline.outbox.counts()["alertmanager"] == {"sent": 2}
    finally:
        await s.stop()


async def test_escalation_replaces_the_warning_alert_with_a_critical_one(
    alertmanager: Alertmanager, webhook: Webhook, tmp_path: Path
) -> None:
    s = await Sender(tmp_path / "state", [alertmanager.url]).start()
    try:
        s.finding("4105", kind="failure", severity="warning")
        alert = one(await wait_until(lambda: alertmanager.alerts('job_id="4105"'), "the warning"))
        assert (alert["labels"]["alertname"], alert["labels"]["severity"]) == ("JobdiagdFailure", "warning")
        s.finding("4105", kind="failure", severity="critical")

        async def critical_only() -> bool:
            alerts = await alertmanager.alerts('job_id="4105"')
            return [a["labels"]["severity"] for a in alerts] == ["critical"]

        await wait_until(critical_only, "only the critical alert left")
    finally:
        await s.stop()


async def test_the_daemons_own_trouble_fires_and_clears_as_its_own_alert(
    alertmanager: Alertmanager, webhook: Webhook, tmp_path: Path
) -> None:
    s = await Sender(tmp_path / "state", [alertmanager.url]).start()
    try:
        squeue = s.health.source("squeue")
        squeue.failure(
            "squeue: exit 1: slurm_load_jobs error: Unable to contact slurm controller", clock.wall()
        )
        s.am.resync_wanted.set()
        alert = one(await wait_until(lambda: alertmanager.alerts('alertname="JobdiagdSourceFailing"'), "it"))
        assert alert["labels"] == {
            "alertname": "JobdiagdSourceFailing",
            "cluster": "testcluster",
            "instance": "login1",
            "component": "squeue",
            "severity": "warning",
            "source": "jobdiagd",
        }
        assert "Unable to contact slurm controller" in alert["annotations"]["description"]
        await wait_until(
            lambda: webhook.notifications("firing", alertname="JobdiagdSourceFailing"), "the page"
        )
        squeue.success(clock.wall())
        s.am.resync_wanted.set()
        await wait_until(
            lambda: webhook.notifications("resolved", alertname="JobdiagdSourceFailing"), "its resolution"
        )
    finally:
        await s.stop()


async def test_ha_pair_notifies_once_per_incident(
    alertmanager_pair: Pair, webhook: Webhook, tmp_path: Path
) -> None:
    s = await Sender(tmp_path / "state", alertmanager_pair.urls).start()
    jobs = ["4201", "4202", "4203"]
    try:
        for job in jobs:
            s.finding(job)
        for peer in alertmanager_pair.peers:  # senders post to every instance: each holds the alerts
            await wait_until(lambda p=peer: _has_jobs(p, jobs), f"the alerts on {peer.name}", within=30)
        for job in jobs:
            await wait_until(lambda j=job: webhook.notifications("firing", job_id=j), f"firing {job}")
        # The second peer decides after its peer timeout (PEER_TIMEOUT here, 15 s by default):
        # let it decide (not to page) while the incidents are open, as real ones last minutes.
        await asyncio.sleep(PEER_TIMEOUT + 1)
        for job in jobs:
            s.finding(job, resolved=True)
        for job in jobs:
            await wait_until(lambda j=job: webhook.notifications("resolved", job_id=j), f"resolved {job}")
        # A duplicate would come from the second peer, one peer timeout after the first: wait it out.
        await asyncio.sleep(PEER_TIMEOUT + 1)
        for job in jobs:
            assert len(webhook.notifications("firing", job_id=job)) == 1, webhook.timeline()
            assert len(webhook.notifications("resolved", job_id=job)) == 1, webhook.timeline()
    finally:
        await s.stop()


async def _has_jobs(peer: Alertmanager, jobs: list[str]) -> bool:
    return sorted(a["labels"]["job_id"] for a in await peer.alerts('alertname="JobdiagdHang"')) == jobs


async def test_ha_pair_with_one_peer_down_still_delivers_and_the_peer_catches_up(
    alertmanager_pair: Pair, webhook: Webhook, tmp_path: Path
) -> None:
    up, down = alertmanager_pair.peers
    await asyncio.to_thread(down.stop)
    s = await Sender(tmp_path / "state", alertmanager_pair.urls).start()
    try:
        s.finding("4301")
        await wait_until(lambda: webhook.notifications("firing", job_id="4301"), "the page via the live peer")
        assert s.pipeline.outbox.counts()["alertmanager"] == {"sent": 1}  # delivered, not retried
        assert down.url + "/api/v2/alerts" in s.am.snapshot()["failing"]
        await asyncio.to_thread(down.start)  # same ports: it rejoins the cluster
        await wait_until(lambda: down.alerts('job_id="4301"'), "the re-post reaching the returned peer")
        await wait_until(lambda: not s.am.snapshot()["failing"], "the peer no longer failing")
    finally:
        await s.stop()


async def test_destination_trouble_is_retried_not_dropped(
    alertmanager: Alertmanager, webhook: Webhook, tmp_path: Path
) -> None:
    # A wrong route prefix: Alertmanager answers 404. Not this message's fault: keep it.
    s = await Sender(tmp_path / "state", [alertmanager.url + "/wrong-prefix"], resync=False).start()
    try:
        s.finding("4401")
        await wait_until(lambda: s.dispatcher.state["alertmanager"].failed >= 2, "retries")
        counts = s.pipeline.outbox.counts()["alertmanager"]
        assert counts == {"pending": 1}
        row = s.pipeline.store.conn.execute("SELECT last_error FROM deliveries").fetchone()
        assert "HTTP 404" in row[0] and "/wrong-prefix/api/v2/alerts" in row[0]
    finally:
        await s.stop()


async def test_a_hung_alertmanager_times_out(tmp_path: Path) -> None:
    # A listener that accepts and never answers (a wedged proxy): the send must give up on time.
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    s = Sender(tmp_path / "state", [f"http://127.0.0.1:{port}"], resync=False)
    s.am.timeout = 0.3
    try:
        s.finding("4501")
        (delivery,) = s.pipeline.outbox.due("alertmanager", clock.wall() + 1)
        with pytest.raises(NotifierError) as info:
            await s.am.send(delivery.notification)
        assert not info.value.permanent and "TimeoutError" in str(info.value)
    finally:
        server.close()
        await s.stop()


@pytest.mark.alertmanager
async def test_basic_auth_against_a_protected_alertmanager_and_the_secret_never_shows(
    am_dir: Path, webhook: Webhook, tmp_path: Path
) -> None:
    web = am_dir / "web.yml"
    web.write_text(f"basic_auth_users:\n  {TEST_USER}: {TEST_PASSWORD_BCRYPT}\n")
    cfg = am_dir / "alertmanager.yml"
    cfg.write_text(am_config(webhook.url))
    am = Alertmanager(
        "authd", cfg, am_dir / "svc", service_env(am_dir / "svc", ALERTMANAGER_WEB_CONFIG=str(web))
    )
    await asyncio.to_thread(am.start)
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text(TEST_PASSWORD + "\n")
    bad.write_text("not-the-password-x9\n")
    auth = f'auth = "basic"\nusername = "{TEST_USER}"\nsecret_file = "{{}}"'
    ok = await Sender(tmp_path / "s1", [am.url], extra=auth.format(good)).start()
    wrong = await Sender(tmp_path / "s2", [am.url], resync=False, extra=auth.format(bad)).start()
    try:
        with capture_logs() as logs:
            ok.finding("4601")
            wrong.finding("4602")
            basic = "Basic " + base64.b64encode(f"{TEST_USER}:{TEST_PASSWORD}".encode()).decode()
            await wait_until(
                lambda: am.alerts('job_id="4601"', authorization=basic), "the authenticated post"
            )
            await wait_until(lambda: wrong.dispatcher.state["alertmanager"].failed >= 2, "401 retries")
        assert wrong.pipeline.outbox.counts()["alertmanager"] == {"pending": 1}  # kept for a fixed secret
        (error,) = wrong.pipeline.store.conn.execute("SELECT last_error FROM deliveries").fetchone()
        assert "HTTP 401" in error
        shown = (
            repr(logs) + error + repr(ok.am) + repr(wrong.am) + str(ok.cfg) + str(ok.dispatcher.snapshot())
        )
        for secret in (TEST_PASSWORD, "not-the-password-x9", basic.removeprefix("Basic ")):
            assert secret not in shown
    finally:
        await ok.stop()
        await wrong.stop()
        await asyncio.to_thread(am.stop)
