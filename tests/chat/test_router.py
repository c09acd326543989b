"""The shared router with a fake daemon and a recording conversation: authorization, long commands, buttons."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from jobdiagd.chat.auth import Authorizer, Sender
from jobdiagd.chat.model import Button, ChatMessage
from jobdiagd.chat.ports import TaskError, TaskResult
from jobdiagd.chat.router import WORKING, ChatRouter
from jobdiagd.model.alerts import Incident

NOW = 1_000_000.0


class FakeBackend:
    def __init__(self) -> None:
        self.incidents = {
            1: Incident("123:hang:1", "123", "hang", 1, "hang", "critical", "stalled", NOW - 600, NOW),
            2: Incident(
                "124:hang:1", "124", "hang", 1, "hang", "critical", "x", NOW - 900, NOW, resolved_at=NOW - 120
            ),
        }
        self.acks: list[tuple[str, str]] = []
        self.cancelled: list[str] = []
        self.release = asyncio.Event()
        self.task_calls: list[tuple[str, tuple[str, ...]]] = []
        self.fail: str | None = None

    outputs_roots: Sequence[Path] = ()
    playbooks: Sequence[str] = ("hang",)

    def status(self, now: float) -> ChatMessage:
        return ChatMessage("status", "ok", preformatted=True)

    def jobs(self, now: float) -> ChatMessage:
        return ChatMessage("jobs")

    def job(self, job_id: str, now: float) -> ChatMessage | None:
        return None

    def open_incidents(self, job_id: str, kind: str | None) -> list[Incident]:
        return [i for i in self.incidents.values() if i.job_id == job_id and i.is_open]

    def incident(self, token: int) -> Incident | None:
        return self.incidents.get(token)

    def incident_token(self, incident_id: str) -> int | None:
        return next((t for t, i in self.incidents.items() if i.id == incident_id), None)

    def snapshot(self, incident: Incident, now: float) -> Mapping[str, Any]:
        return {**asdict(incident), "muted_until": None}

    def ack(self, incident: Incident, by: str, now: float) -> None:
        self.acks.append((incident.id, by))
        self.incidents[1] = replace(incident, acked_at=now, acked_by=by)

    def mute(self, job_id: str, kind: str, until: float, by: str, now: float) -> None:
        pass

    def unmute(self, job_id: str, kind: str, by: str, now: float) -> bool:
        return True

    async def run_task(self, name: str, args: tuple[str, ...]) -> TaskResult:
        self.task_calls.append((name, args))
        await self.release.wait()
        if self.fail:
            raise TaskError(self.fail)
        return TaskResult(f"{name} {args[0]}", "**Status:** done")

    async def scancel(self, job_id: str, by: str) -> str:
        if self.fail:
            raise TaskError(self.fail)
        self.cancelled.append(job_id)
        return f"scancel {job_id}: requested by {by}"


class Conv:
    def __init__(self, chat: str = "-1", user: str = "10", name: str = "alice") -> None:
        self._sender = Sender(chat, user, name)
        self.sent: list[ChatMessage] = []
        self.edits: list[tuple[object, ChatMessage]] = []
        self.toasts: list[tuple[str, bool]] = []
        self.buttons: list[tuple[tuple[Button, ...], ...]] = []

    @property
    def sender(self) -> Sender:
        return self._sender

    async def send(self, msg: ChatMessage) -> object:
        self.sent.append(msg)
        return len(self.sent)

    async def edit(self, handle: object, msg: ChatMessage) -> None:
        self.edits.append((handle, msg))

    async def toast(self, text: str, *, alert: bool = False) -> None:
        self.toasts.append((text, alert))

    async def set_buttons(self, rows: tuple[tuple[Button, ...], ...]) -> None:
        self.buttons.append(rows)


def router(backend: FakeBackend, **kw: Any) -> ChatRouter:
    auth = Authorizer.of(["-1", "-2", "-3"], ["10", "11"], operators=["11"])
    return ChatRouter(backend, auth, transport="test", now=lambda: NOW, **kw)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_long_command_answers_working_then_edits_in_the_result() -> None:
    b = FakeBackend()
    r = router(b)
    c = Conv()
    await r.on_command("/triage 123", c)
    assert [m.title for m in c.sent] == [WORKING] and c.edits == []  # answered before the work is done
    b.release.set()
    await settle()
    ((handle, result),) = c.edits
    assert handle == 1 and result.title == "triage 123" and "done" in result.body
    assert b.task_calls == [("triage", ("123",))]


async def test_one_command_in_flight_per_chat_and_a_bounded_queue() -> None:
    b = FakeBackend()
    r = router(b, max_running=1, max_queued=1)
    c1, c1b, c2, c3 = Conv("-1"), Conv("-1"), Conv("-2"), Conv("-3", "11")
    await r.on_command("/triage 1", c1)
    await r.on_command("/triage 2", c1b)  # same chat: refused while the first runs
    assert "still running" in c1b.sent[0].title
    await r.on_command("/triage 3", c2)  # another chat: queued behind the running one
    assert c2.sent[0].title == WORKING
    await r.on_command("/plot 4", c3)  # over running + queued: busy
    assert "Busy" in c3.sent[0].title
    b.release.set()
    await settle()
    assert len(c1.edits) == 1 and len(c2.edits) == 1
    await r.on_command("/triage 5", c1b)  # free again
    await settle()
    assert len(c1b.edits) == 1


async def test_timeouts_and_failures_are_answered() -> None:
    b = FakeBackend()
    r = router(b, task_timeout_s=0.05)
    c = Conv()
    await r.on_command("/diagnose 123", c)
    await asyncio.sleep(0.2)
    assert "timed out" in c.edits[0][1].title
    b.release.set()
    b.fail = "no such job"
    c2 = Conv("-2")
    await r.on_command("/triage 9", c2)
    await settle()
    assert c2.edits[0][1].title == "⚠ /triage failed" and c2.edits[0][1].body == "no such job"


async def test_refusals_are_logged_and_bad_arguments_never_reach_the_backend() -> None:
    b = FakeBackend()
    r = router(b)
    with capture_logs() as logs:
        stranger = Conv("-1", "99", "mallory")
        await r.on_command("/ack 123", stranger)
        foreign = Conv("-9", "10")
        await r.on_command("/status", foreign)  # right user, a chat off the list
        press = Conv("-9", "10")
        await r.on_press("ack:1", press)
    # A stranger in an allowed chat is told why not; a chat off the list hears nothing at all
    # (a press's spinner is stopped without a word).
    assert "allowed users" in stranger.sent[0].body
    assert foreign.sent == [] and press.toasts == [("", False)] and press.sent == []
    assert [(e["event"], e["user"]) for e in logs if e["event"] in ("chat_refused", "chat_ignored")] == [
        ("chat_refused", "99"),
        ("chat_ignored", "10"),
        ("chat_ignored", "10"),
    ]
    assert b.acks == []
    c = Conv()
    await r.on_command("/triage ../../etc/passwd", c)
    await r.on_command("/diagnose 123 rm", c)
    await r.on_command("/mute 123 99d", c)
    assert [m.title[:2] for m in c.sent] == ["⚠ "] * 3 and b.task_calls == [] and b.acks == []


async def test_button_presses() -> None:
    b = FakeBackend()
    r = router(b)
    c = Conv()
    await r.on_press("ack:1", c)
    assert b.acks == [("123:hang:1", "alice")] and "Acked by alice" in c.toasts[0][0]
    c2 = Conv()
    await r.on_press("ack:1", c2)  # a second press: already acked, nothing done twice
    assert len(b.acks) == 1 and "Already acked" in c2.toasts[0][0]
    late = Conv()
    await r.on_press("m1h:2", late)  # resolved two minutes ago
    assert "resolved 2 min ago" in late.toasts[0][0] and late.buttons == [()]
    gone = Conv()
    await r.on_press("ack:77", gone)
    assert "expired" in gone.toasts[0][0] and gone.buttons == [()]


async def test_scancel_needs_an_operator_and_a_confirmation() -> None:
    b = FakeBackend()
    r = router(b, scancel_enabled=True)
    user = Conv("-1", "10")
    await r.on_press("scancel:1", user)
    assert "Only operators" in user.toasts[0][0] and b.cancelled == []
    op = Conv("-1", "11", "olga")
    await r.on_press("scancel:1", op)
    assert [btn.token for btn in op.buttons[0][0]] == ["scancel_yes:1", "scancel_no:1"] and b.cancelled == []
    no = Conv("-1", "11", "olga")
    await r.on_press("scancel_no:1", no)
    assert b.cancelled == [] and no.buttons[0][-1][0].token == "scancel:1"  # keyboard restored
    user_yes = Conv("-1", "10")
    await r.on_press("scancel_yes:1", user_yes)  # a confirmation press is checked again
    assert b.cancelled == []
    with capture_logs() as logs:
        yes = Conv("-1", "11", "olga")
        await r.on_press("scancel_yes:1", yes)
    assert b.cancelled == ["123"] and "requested by olga" in yes.sent[0].body
    assert any(e["event"] == "scancel_requested" and e["user"] == "11" for e in logs)
    off = router(FakeBackend(), scancel_enabled=False)
    disabled = Conv("-1", "11")
    await off.on_press("scancel_yes:1", disabled)
    assert "not enabled" in disabled.toasts[0][0]


async def test_a_failed_scancel_is_titled_as_failed() -> None:
    b = FakeBackend()
    b.fail = "scancel: error: Kill job error on job id 123: Access/permission denied"
    r = router(b, scancel_enabled=True)
    with capture_logs() as logs:
        op = Conv("-1", "11", "olga")
        await r.on_press("scancel_yes:1", op)
    (msg,) = op.sent
    assert msg.title == f"⚠ scancel 123 failed: {b.fail}" and "by" not in msg.title.split("failed")[0]
    assert "not cancelled" in msg.body and "olga" in msg.body
    assert op.toasts[0] == (f"scancel 123 failed: {b.fail}", True) and b.cancelled == []
    assert op.buttons[-1][-1][0].token == "scancel:1"  # the keyboard is back for another try
    assert [e["event"] for e in logs if e["event"].startswith("scancel")] == [
        "scancel_requested",
        "scancel_failed",
    ]


async def test_help_lists_the_scancel_button_only_where_it_is_enabled() -> None:
    for enabled in (False, True):
        c = Conv()
        await router(FakeBackend(), scancel_enabled=enabled).on_command("/help", c)
        (msg,) = c.sent
        assert ("scancel" in msg.body) is enabled, msg.body
    assert "⛔ scancel… (operators only" in msg.body
