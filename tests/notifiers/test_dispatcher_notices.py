"""A failing notifier is told to people once per episode: not after one refused send, not per retry."""

from __future__ import annotations

from pathlib import Path

from jobdiagd.alerts.outbox import Outbox
from jobdiagd.alerts.store import AlertStore
from jobdiagd.model.alerts import Notification
from jobdiagd.notifiers.base import NotifierError
from jobdiagd.notifiers.dispatcher import Dispatcher, RetryPolicy

T0 = 1_800_000_000.0
POLICY = RetryPolicy(initial=10, maximum=40, give_up_after=100_000, send_timeout=5)


class Switch:
    """A notifier that fails while `down`."""

    name = "chat"

    def __init__(self) -> None:
        self.down = True
        self.got: list[str] = []

    def render(self, notification: Notification) -> str:
        return notification.title

    async def send(self, notification: Notification) -> None:
        if self.down:
            raise NotifierError("502 Bad Gateway")
        self.got.append(notification.id)


def note(nid: str) -> Notification:
    return Notification(nid, "1", "hang", "open", f"hang on job {nid}", "body", T0, severity="critical")


async def test_one_degraded_and_one_recovered_call_per_episode(tmp_path: Path) -> None:
    box = Outbox(AlertStore.in_state_dir(tmp_path), ["chat"])
    box.enqueue([note("a"), note("b")], T0)
    chat = Switch()
    clock = {"now": T0}
    d = Dispatcher(box, [chat], policy=POLICY, now=lambda: clock["now"])
    told: list[tuple[str, ...]] = []
    d.on_degraded = lambda name, error, since, now: told.append(
        ("degraded", name, error, str(since), str(now))
    )
    d.on_recovered = lambda name, since, now: told.append(("recovered", name, str(since), str(now)))

    await d.drain(T0)  # one refused send: retried, not news
    await d.drain(T0 + 20)  # failing 20 s, under the 40 s backoff cap: not yet
    assert told == []
    await d.drain(T0 + 60)
    await d.drain(T0 + 200)  # still down: no second notice
    assert told == [("degraded", "chat", "NotifierError: 502 Bad Gateway", str(T0), str(T0 + 60))]

    chat.down = False
    await d.drain(T0 + 400)
    assert chat.got == ["a", "b"]
    assert told[1:] == [("recovered", "chat", str(T0), str(T0 + 400))]

    # A new episode gets its own pair.
    chat.down = True
    box.enqueue([note("c")], T0 + 500)
    for t in (500, 560, 620):
        await d.drain(T0 + t)
    chat.down = False
    await d.drain(T0 + 700)
    assert [t[0] for t in told] == ["degraded", "recovered", "degraded", "recovered"]
    assert told[2][3] == str(T0 + 500)  # failing since the new episode began
