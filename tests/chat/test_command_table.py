"""The command and button tables: every spec has its handler, /help is the table, and a new row is all a
new command or button needs on the chat side (the router holds no per-command code)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.chat import commands as C
from jobdiagd.chat.auth import Authorizer, Sender
from jobdiagd.chat.buttons import (
    ACTIONS,
    BUTTONS,
    ButtonSpec,
    Pressed,
    confirm_keyboard,
    decode,
    drain_confirm_keyboard,
    drain_keyboard,
    keyboard,
)
from jobdiagd.chat.model import Button, ChatMessage
from jobdiagd.chat.ports import TaskError, TaskResult
from jobdiagd.chat.router import ChatRouter
from jobdiagd.model.alerts import Incident

NOW = 1_000_000.0


class Worker:
    """The daemon's long-command side, recording which capability each command called."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    async def triage(self, target: str) -> str:
        self.calls.append(("triage", (target,)))
        return "report"

    async def diagnose(self, target: str, playbook: str | None) -> str:
        self.calls.append(("diagnose", (target, playbook)))
        return "diagnosis"

    async def compare(self, a: str, b: str) -> str:
        self.calls.append(("compare", (a, b)))
        return "comparison"

    async def plot(self, job_id: str) -> bytes:
        self.calls.append(("plot", (job_id,)))
        return b"\x89PNG"


class Backend:
    """A minimal daemon for the router: answers, incidents and long commands through the table."""

    outputs_roots: Sequence[Path] = ()
    playbooks: Sequence[str] = ("hang",)

    def __init__(self) -> None:
        self.worker = Worker()
        self.inc = Incident("7:hang:1", "7", "hang", 1, "hang", "critical", "stalled", NOW - 60, NOW)
        self.drained: list[str] = []

    def status(self, now: float) -> ChatMessage:
        return ChatMessage("status")

    def jobs(self, now: float) -> ChatMessage:
        return ChatMessage("jobs")

    def job(self, job_id: str, now: float) -> ChatMessage | None:
        return None

    def open_incidents(self, job_id: str, kind: str | None) -> list[Incident]:
        return []

    def incident(self, token: int) -> Incident | None:
        return self.inc if token == 1 else None

    def incident_token(self, incident_id: str) -> int | None:
        return 1

    def snapshot(self, incident: Incident, now: float) -> Mapping[str, Any]:
        return {**asdict(incident), "muted_until": None}

    def ack(self, incident: Incident, by: str, now: float) -> None:
        pass

    def mute(self, job_id: str, kind: str, until: float, by: str, now: float) -> None:
        pass

    def unmute(self, job_id: str, kind: str, by: str, now: float) -> bool:
        return False

    async def run_task(self, name: str, args: tuple[str, ...]) -> TaskResult:
        return await C.run_long(self.worker, name, args)

    async def scancel(self, job_id: str, by: str) -> str:
        return "cancelled"


class Conv:
    def __init__(self) -> None:
        self.sender = Sender("-1", "10", "alice")
        self.sent: list[ChatMessage] = []
        self.edits: list[ChatMessage] = []
        self.toasts: list[str] = []

    async def send(self, msg: ChatMessage) -> object:
        self.sent.append(msg)
        return len(self.sent)

    async def edit(self, handle: object, msg: ChatMessage) -> None:
        self.edits.append(msg)

    async def toast(self, text: str, *, alert: bool = False) -> None:
        self.toasts.append(text)

    async def set_buttons(self, rows: tuple[tuple[Button, ...], ...]) -> None:
        pass


def _router(backend: Backend) -> ChatRouter:
    return ChatRouter(backend, Authorizer.of(["-1"], ["10"]), transport="test", now=lambda: NOW)


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_every_command_has_exactly_one_handler_and_a_usage_of_its_arguments() -> None:
    for name, spec in C.COMMANDS.items():
        assert spec.name == name
        assert (spec.answer is None) != (spec.work is None), name
        assert callable(spec.answer or spec.work) and spec.long is (spec.work is not None)
        assert spec.usage.startswith(f"/{name}") and spec.min_args <= spec.max_args == len(spec.args)
    assert {n for n, s in C.COMMANDS.items() if s.long} == {"triage", "diagnose", "compare", "plot"}
    with pytest.raises(ValueError, match="exactly one of answer and work"):
        C.CommandSpec("x", "both", answer=lambda c, a: ChatMessage("x"), work=C.COMMANDS["plot"].work)
    with pytest.raises(ValueError, match="optional argument before a required one"):
        C.CommandSpec("x", "bad", (C.KIND, C.JOB), answer=lambda c, a: ChatMessage("x"))


def test_help_is_built_from_the_table() -> None:
    lines = C.help_text(120.0).split("\n")
    listed = lines[1 : lines.index("")]
    assert listed == [f"- `{s.usage}` — {s.help}" for s in C.COMMANDS.values() if s.listed]
    assert [s.name for s in C.COMMANDS.values() if not s.listed] == ["start"]
    named = [b.help for b in BUTTONS.values() if b.help]
    plain = [b.help for b in BUTTONS.values() if b.help and not (b.only_with_scancel or b.only_with_recovery)]
    assert lines[-1] == f"Buttons on alerts: {', '.join(plain)}."
    assert "Drain" in lines[-1] and "Keep the job" not in lines[-1]  # node memory runs whatever the mode
    every = C.help_text(120.0, scancel=True, recovery=True).split("\n")[-1]
    assert every == f"Buttons on alerts: {', '.join(named)}."
    assert "Restart" in every and "Keep the job" in every


async def test_each_long_command_runs_its_worker_capability_through_the_table() -> None:
    w = Worker()
    results = [
        await C.run_long(w, "triage", ("7",)),
        await C.run_long(w, "diagnose", ("7", "hang")),
        await C.run_long(w, "diagnose", ("7",)),
        await C.run_long(w, "compare", ("7", "8")),
        await C.run_long(w, "plot", ("7",)),
    ]
    assert w.calls == [
        ("triage", ("7",)),
        ("diagnose", ("7", "hang")),
        ("diagnose", ("7", None)),
        ("compare", ("7", "8")),
        ("plot", ("7",)),
    ]
    assert [r.title for r in results] == [
        "📋 triage: 7",
        "🩺 diagnose: 7",
        "🩺 diagnose: 7",
        "⚖ compare: 7 vs 8",
        "📈 job 7",
    ]
    assert results[0].markdown == "report" and results[-1].png == b"\x89PNG"
    for name in ("status", "nope"):  # a short command is not run as a worker task
        with pytest.raises(TaskError, match=f"unknown command {name}"):
            await C.run_long(w, name, ())


async def test_a_new_command_is_one_table_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command the daemon does not have yet: its row (and a capability of the daemon) is all."""

    def suspects(c: C.Call, a: C.Args) -> ChatMessage:
        return ChatMessage(f"suspect nodes of job {a[0]}", "node007")

    monkeypatch.setitem(
        C.COMMANDS, "suspects", C.CommandSpec("suspects", "suspect nodes of a job", (C.JOB,), suspects)
    )
    conv = Conv()
    await _router(Backend()).on_command("/suspects 7", conv)
    await _router(Backend()).on_command("/suspects ../x", conv)
    await _router(Backend()).on_command("/help", conv)
    assert conv.sent[0].title == "suspect nodes of job 7" and conv.sent[0].body == "node007"
    assert conv.sent[1].title.startswith("⚠ not a job id: '../x'")  # its argument's validator ran
    assert "- `/suspects ID` — suspect nodes of a job" in conv.sent[2].body


async def test_a_long_command_goes_through_the_backend_and_the_table() -> None:
    b = Backend()
    conv = Conv()
    r = _router(b)
    await r.on_command("/diagnose 7 hang", conv)
    await _settle()
    assert b.worker.calls == [("diagnose", ("7", "hang"))]
    assert [m.title for m in conv.edits] == ["🩺 diagnose: 7"] and conv.edits[0].body == "diagnosis"
    await r.close()


def test_every_button_has_a_handler_and_every_keyboard_token_decodes() -> None:
    assert tuple(BUTTONS) == ACTIONS and all(callable(s.on_press or s.on_node) for s in BUTTONS.values())
    snap = {"job_id": "7", "ray": True, "acked_at": None, "muted_until": None, "resolved_at": None}
    muted = {**snap, "muted_until": NOW + 60}
    counting = {**snap, "recovery": {"status": "scheduled", "text": "♻ Auto-restart", "due_at": NOW + 60}}
    suggested = {**snap, "resolved_at": NOW, "recovery": {"status": "suggested", "text": "♻ Suggested"}}
    rows = [
        *keyboard(snap, 1, now=NOW, scancel=True),
        *keyboard(muted, 1, now=NOW),
        *confirm_keyboard("7", 1),
        *keyboard(counting, 1, now=NOW),
        *keyboard(suggested, 1, now=NOW),
        *drain_keyboard("node017"),
        *drain_confirm_keyboard("node017"),
    ]
    shown = {decode(b.token).action for row in rows for b in row}  # type: ignore[union-attr]
    assert shown == set(ACTIONS)
    # A resolved incident keeps only the button of its restart still pending.
    assert [[b.label for b in row] for row in keyboard(suggested, 1, now=NOW)] == [["♻ Restart"]]
    assert keyboard({**suggested, "recovery": {"status": "done", "text": "x"}}, 1, now=NOW) == ()
    assert keyboard(counting, 1, now=NOW)[0][0].label == "✋ Keep the job"
    with pytest.raises(ValueError, match="exactly one of on_press and on_node"):
        ButtonSpec("x")


async def test_a_new_button_is_one_table_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A button the daemon does not have yet: its row and handler (and a capability of the daemon)."""
    b = Backend()

    async def bounce(p: Pressed) -> None:
        b.drained.append(p.incident.job_id)
        await p.conv.toast(f"bouncing the nodes of job {p.incident.job_id}")

    monkeypatch.setitem(BUTTONS, "bounce", ButtonSpec("bounce", bounce, help="Bounce"))
    conv = Conv()
    await _router(b).on_press("bounce:1", conv)
    assert b.drained == ["7"] and conv.toasts == ["bouncing the nodes of job 7"]
    assert C.help_text(120.0).endswith(", Bounce.")
