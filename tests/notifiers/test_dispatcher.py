"""Dispatcher fan-out: every notifier gets every notification; a failing one backs off alone."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

import pytest

from jobdiagd.alerts.outbox import Outbox
from jobdiagd.alerts.store import AlertStore
from jobdiagd.model.alerts import Notification
from jobdiagd.notifiers.base import Notifier, NotifierError
from jobdiagd.notifiers.console import ConsoleNotifier
from jobdiagd.notifiers.dispatcher import Dispatcher, RetryPolicy

T0 = 1_800_000_000.0


class Recorder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.got: list[str] = []
        self.arrived = asyncio.Event()

    def render(self, notification: Notification) -> str:
        return notification.title

    async def send(self, notification: Notification) -> None:
        self.got.append(notification.id)
        self.arrived.set()


class Flaky(Recorder):
    """Fails the first `failures` attempts."""

    def __init__(self, name: str, failures: int) -> None:
        super().__init__(name)
        self.failures = failures
        self.attempts = 0

    async def send(self, notification: Notification) -> None:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise NotifierError("503 from chat API")
        await super().send(notification)


class Hangs(Recorder):
    async def send(self, notification: Notification) -> None:
        await asyncio.Event().wait()


class Observer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def delivery_result(self, notifier: str, ok: bool, seconds: float) -> None:
        self.calls.append((notifier, ok))


def note(nid: str, t: float = T0) -> Notification:
    return Notification(nid, "1", "hang", "open", f"hang on job {nid}", "body", t, severity="critical")


def outbox(tmp_path: Path, names: list[str]) -> Outbox:
    return Outbox(AlertStore.in_state_dir(tmp_path), names)


POLICY = RetryPolicy(initial=10, maximum=40, give_up_after=1000, send_timeout=5)


async def test_fan_out_with_a_failing_notifier(tmp_path: Path) -> None:
    box = outbox(tmp_path, ["good", "flaky"])
    good, flaky, obs = Recorder("good"), Flaky("flaky", failures=2), Observer()
    d = Dispatcher(box, [good, flaky], policy=POLICY, observer=obs)
    box.enqueue([note("n1"), note("n2")], T0)

    r = await d.drain(T0)
    assert (r.sent, r.failed) == (2, 1)
    assert good.got == ["n1", "n2"]
    assert flaky.got == [] and flaky.attempts == 1  # stops at the first failure: order is kept
    assert d.snapshot()["flaky"]["failing"] is True
    assert d.snapshot()["good"]["failing"] is False
    assert sorted(obs.calls) == [("flaky", False), ("good", True), ("good", True)]

    # Backoff: 10 s after the first failure, 20 s after the second.
    assert (await d.drain(T0 + 9)).failed == 0 and flaky.attempts == 1
    assert (await d.drain(T0 + 10)).failed == 1 and flaky.attempts == 2
    assert (await d.drain(T0 + 29)).sent == 0
    r = await d.drain(T0 + 30)
    assert r.sent == 2
    assert flaky.got == ["n1", "n2"]
    assert good.got == ["n1", "n2"]  # nobody got anything twice
    assert box.pending_count() == 0
    assert d.snapshot()["flaky"]["failing"] is False
    [delivery_row] = box.store.conn.execute(
        "SELECT attempts FROM deliveries WHERE notifier='flaky' AND notification_id='n1'"
    ).fetchall()
    assert delivery_row[0] == 3


async def test_gives_up_after_the_deadline(tmp_path: Path) -> None:
    box = outbox(tmp_path, ["down"])
    down = Flaky("down", failures=10**6)
    d = Dispatcher(box, [down], policy=POLICY)
    box.enqueue([note("old")], T0)
    await d.drain(T0 + 999)
    assert box.pending_count() == 1
    await d.drain(T0 + 2000)
    assert box.pending_count() == 0
    assert box.counts() == {"down": {"dead": 1}}


async def test_a_crashing_notifier_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    class Buggy(Recorder):
        async def send(self, notification: Notification) -> None:
            raise KeyError("bug")

    box = outbox(tmp_path, ["buggy"])
    d = Dispatcher(box, [Buggy("buggy")], policy=POLICY)
    box.enqueue([note("n")], T0)
    assert (await d.drain(T0)).failed == 1


async def test_run_loop_delivers_on_kick_and_a_hung_notifier_does_not_block(tmp_path: Path) -> None:
    box = outbox(tmp_path, ["fast", "stuck"])
    fast, stuck = Recorder("fast"), Hangs("stuck")
    d = Dispatcher(box, [fast, stuck], policy=RetryPolicy(initial=60, maximum=60, send_timeout=0.2))
    task = asyncio.create_task(d.run())
    try:
        box.enqueue([note("n1")], time.time())
        d.kick()  # returns at once: the tick never waits for delivery
        await asyncio.wait_for(fast.arrived.wait(), timeout=10)
        assert fast.got == ["n1"]
        # The stuck notifier times out and is recorded as failing, without holding up "fast".
        for _ in range(200):
            if d.snapshot()["stuck"]["failed"]:
                break
            await asyncio.sleep(0.05)
        assert d.snapshot()["stuck"]["failing"] is True
        assert "TimeoutError" in (d.snapshot()["stuck"]["last_error"] or "")
        fast.arrived.clear()
        box.enqueue([note("n2")], time.time())
        d.kick()
        await asyncio.wait_for(fast.arrived.wait(), timeout=10)
        assert fast.got == ["n1", "n2"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_pending_from_before_a_restart_goes_out_when_run_starts(tmp_path: Path) -> None:
    box = outbox(tmp_path, ["r"])
    box.enqueue([note("left-over")], time.time())
    rec = Recorder("r")
    task = asyncio.create_task(Dispatcher(box, [rec]).run())
    try:
        await asyncio.wait_for(rec.arrived.wait(), timeout=10)
        assert rec.got == ["left-over"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_dispatcher_rejects_unknown_or_duplicate_names(tmp_path: Path) -> None:
    box = outbox(tmp_path, ["a"])
    with pytest.raises(ValueError, match="not known"):
        Dispatcher(box, [Recorder("b")])
    with pytest.raises(ValueError, match="unique"):
        Dispatcher(box, [Recorder("a"), Recorder("a")])


def test_backoff_doubles_and_caps() -> None:
    assert [POLICY.delay(n) for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 40, 40]


async def test_console_renders_plainly_without_a_tty() -> None:
    buf = io.StringIO()
    c = ConsoleNotifier(buf, color="auto")
    assert isinstance(c, Notifier)
    await c.send(
        Notification(
            "x",
            "123",
            "hang",
            "open",
            "hang on job 123",
            "no step since 316\n\n- **step**: 316",
            T0,
            "critical",
        )
    )
    text = buf.getvalue()
    assert "\x1b[" not in text
    assert text.splitlines()[0] == "2027-01-15 08:00:00Z  OPEN     hang on job 123 [critical]"
    assert "    no step since 316" in text


def test_console_colours_when_asked_and_honours_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    n = Notification("x", "1", "hang", "resolve", "hang on job 1", "steps resumed", T0)
    assert "\x1b[32m" in ConsoleNotifier(Tty(), color="auto").render(n)
    assert "\x1b[" in ConsoleNotifier(io.StringIO(), color="always").render(n)
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in ConsoleNotifier(Tty(), color="auto").render(n)


async def test_a_permanently_rejected_message_does_not_block_the_queue(tmp_path: Path) -> None:
    class Picky(Recorder):
        async def send(self, notification: Notification) -> None:
            if notification.id == "poison":
                raise NotifierError("400: message too long", permanent=True)
            await super().send(notification)

    box = outbox(tmp_path, ["picky"])
    picky = Picky("picky")
    d = Dispatcher(box, [picky], policy=POLICY)
    box.enqueue([note("poison", T0), note("fine", T0 + 1)], T0 + 1)
    r = await d.drain(T0 + 1)
    assert (r.sent, r.failed, r.dropped) == (1, 0, 1)
    assert picky.got == ["fine"]
    assert box.counts() == {"picky": {"dead": 1, "sent": 1}}
    assert d.snapshot()["picky"]["failing"] is False


def test_build_notifiers_and_secrets(tmp_path: Path) -> None:
    from jobdiagd.config import loads
    from jobdiagd.notifiers.registry import build_notifiers, read_secret

    cfg = loads(
        f'[daemon]\nstate_dir = "{tmp_path}"\n[notifiers.jsonl]\nenabled = true\n'
        "[notifiers.telegram]\nenabled = true\ntoken_credential = 'telegram-token'\nchat_ids = [1]\n",
        source="t.toml",
    )
    notifiers, skipped = build_notifiers(cfg, env={})
    assert [n.name for n in notifiers] == ["console", "jsonl"]
    assert skipped == ["telegram: no token (credential 'telegram-token' missing or empty)"]

    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "telegram-token").write_text("\n")  # the unit's SetCredential= fallback
    env = {"CREDENTIALS_DIRECTORY": str(creds)}
    assert read_secret(None, "telegram-token", env) is None
    (creds / "telegram-token").write_text("123:abc\n")
    assert read_secret(None, "telegram-token", env) == "123:abc"
    notifiers, skipped = build_notifiers(cfg, env=env)  # with its token the bot is built
    assert [n.name for n in notifiers] == ["console", "jsonl", "telegram"] and skipped == []
    assert read_secret(None, "telegram-token", {}) is None
    assert read_secret(creds / "missing", "", env) is None


async def test_retry_after_counts_from_the_refusal_not_from_the_start_of_the_pass(tmp_path: Path) -> None:
    clock = [T0]

    class SlowThenLimited(Recorder):
        async def send(self, notification: Notification) -> None:
            clock[0] += 3.0  # the request took 3 s before the server said "come back in 10 s"
            raise NotifierError("429", retry_after=10.0)

    box = outbox(tmp_path, ["chat"])
    d = Dispatcher(
        box, [SlowThenLimited("chat")], policy=RetryPolicy(initial=1, maximum=5), now=lambda: clock[0]
    )
    box.enqueue([note("n1")], T0)
    assert (await d.drain(T0)).failed == 1
    assert d.state["chat"].blocked_until == T0 + 3 + 10  # not T0 + 10: that would be refused again
    assert box.next_attempt_at("chat") == T0 + 3 + 10
