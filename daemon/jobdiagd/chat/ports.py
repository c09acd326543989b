"""The chat's two sides as Protocols: what it asks of the daemon (`ChatBackend`, `Worker`) and of a transport (`Conversation`).

`chat/` is below `service/`: the daemon implements these (service/chat_backend.py) and the
router's unit tests fake them; nothing here imports the daemon. A command's or a button's
handler calls only what these declare, so a new one that needs something new from the daemon
adds a method here and its implementation there (docs/architecture.md § Extension points).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from jobdiagd.chat.auth import Sender
from jobdiagd.chat.model import Button, ChatMessage
from jobdiagd.model.alerts import Incident


@dataclass(frozen=True, slots=True)
class TaskResult:
    """What a long command produced: a Markdown report and/or a picture."""

    title: str
    markdown: str = ""
    png: bytes | None = None
    ok: bool = True


class TaskError(Exception):
    """A long command failed (timeout, bad target, tool error); the message is shown to the user."""


class ChatBackend(Protocol):
    """What the router and the short commands' and buttons' handlers need from the daemon."""

    @property
    def outputs_roots(self) -> Sequence[Path]: ...

    @property
    def playbooks(self) -> Sequence[str]: ...

    def status(self, now: float) -> ChatMessage: ...

    def jobs(self, now: float) -> ChatMessage: ...

    def job(self, job_id: str, now: float) -> ChatMessage | None: ...

    def open_incidents(self, job_id: str, kind: str | None) -> list[Incident]: ...

    def incident(self, token: int) -> Incident | None: ...

    def incident_token(self, incident_id: str) -> int | None: ...

    def snapshot(self, incident: Incident, now: float) -> Mapping[str, Any]: ...

    def ack(self, incident: Incident, by: str, now: float) -> None: ...

    def mute(self, job_id: str, kind: str, until: float, by: str, now: float) -> None: ...

    def unmute(self, job_id: str, kind: str, by: str, now: float) -> bool: ...

    async def run_task(self, name: str, args: tuple[str, ...]) -> TaskResult:
        """Run long command `name` on validated `args` (the daemon: `chat.commands.run_long`
        with itself as the `Worker`); the router bounds how many run and for how long."""
        ...

    async def scancel(self, job_id: str, by: str) -> str: ...

    # -- recovery (docs/recovery.md): what its buttons and /nodes need ------------------------

    def nodes(self, now: float) -> ChatMessage:
        """/nodes: the suspect nodes of node memory, with the jobs and evidence behind each."""
        ...

    def recovery_operator(self, sender: Sender) -> bool:
        """The sender is on `[recovery] operators` (Drain, Restart of anyone's job)."""
        ...

    def keep_recovery(self, incident: Incident, by: str, now: float) -> str:
        """Keep the job: cancel the pending restart of the incident's job; what to tell the
        presser ("" when none was pending)."""
        ...

    def approve_recovery(
        self, incident: Incident, sender: Sender, *, operator: bool, now: float
    ) -> tuple[str, bool]:
        """Restart a suggested restart now, if `sender` is the job's owner or an operator
        (`operator`: of the transport); (what to tell the presser, whether it was approved)."""
        ...

    async def drain(self, node: str, by: str, *, operator: bool) -> str:
        """Drain `node` (rule REC-23), logged; raises `TaskError` when refused (not `operator`)
        or when Slurm refuses."""
        ...


class Worker(Protocol):
    """What the long commands' handlers call in the daemon: each runs a tool (or renders a
    picture) on validated arguments and raises `TaskError` with what went wrong."""

    async def triage(self, target: str) -> str:
        """`jobdiagd triage` of a job id or path, with the daemon's view of the job: Markdown."""
        ...

    async def diagnose(self, target: str, playbook: str | None) -> str: ...

    async def compare(self, a: str, b: str) -> str: ...

    async def plot(self, job_id: str) -> bytes:
        """The PNG of a watched job's step chart."""
        ...


class Conversation(Protocol):
    """The transport's side of one inbound command: send and edit messages in the sender's chat."""

    @property
    def sender(self) -> Sender: ...

    async def send(self, msg: ChatMessage) -> object:
        """Post a message; returns a handle `edit` accepts."""
        ...

    async def edit(self, handle: object, msg: ChatMessage) -> None: ...


class PressConversation(Conversation, Protocol):
    """A button press: also answer it (a toast) and change the pressed message's buttons."""

    async def toast(self, text: str, *, alert: bool = False) -> None: ...

    async def set_buttons(self, rows: tuple[tuple[Button, ...], ...]) -> None: ...
