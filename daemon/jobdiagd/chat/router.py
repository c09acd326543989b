"""One command router for every chat transport: authorization, parsing, short answers, long commands
off the event loop (one in flight per chat, a bounded queue overall), and button presses."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from jobdiagd import clock
from jobdiagd.chat import commands as C
from jobdiagd.chat.auth import Authorizer, Sender
from jobdiagd.chat.buttons import MUTE_SECONDS, Press, can_scancel, confirm_keyboard, decode, keyboard
from jobdiagd.chat.incident_view import DOCUMENT_OVER, long_report
from jobdiagd.chat.model import Button, ChatMessage, Picture
from jobdiagd.durations import rounded_duration
from jobdiagd.model.alerts import Incident

WORKING = "⏳ working…"


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
    """What the router needs from the daemon (implemented in service/, faked in unit tests)."""

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

    async def run_task(self, name: str, args: tuple[str, ...]) -> TaskResult: ...

    async def scancel(self, job_id: str, by: str) -> str: ...


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


class ChatRouter:
    def __init__(
        self,
        backend: ChatBackend,
        auth: Authorizer,
        *,
        transport: str,
        max_running: int = 2,
        max_queued: int = 8,
        task_timeout_s: float = 120.0,
        scancel_enabled: bool = False,
        now: Callable[[], float] = clock.wall,
    ) -> None:
        self.backend = backend
        self.auth = auth
        self.transport = transport
        self.max_running = max_running
        self.max_queued = max_queued
        self.task_timeout_s = task_timeout_s
        self.scancel_enabled = scancel_enabled
        self._now = now
        self._slots = asyncio.Semaphore(max_running)
        self._busy_chats: set[str] = set()
        self._waiting = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._log = structlog.get_logger("jobdiagd").bind(component="chat", transport=transport)

    # -- inbound -------------------------------------------------------------

    async def on_command(self, text: str, conv: Conversation) -> None:
        """Handle one command; long ones are answered "working…" now and finished in a task.

        A chat off the allow-list gets no answer at all (one log line): the bot does not reveal
        itself there (rule CHAT-4). A stranger in an allowed chat is told why not.
        """
        sender = conv.sender
        if not self.auth.chat_allowed(sender):
            self._log.warning("chat_ignored", chat=sender.chat_id, user=sender.user_id, what="command")
            return
        refusal = self.auth.refusal(sender)
        if refusal is not None:
            self._log.warning(
                "chat_refused", chat=sender.chat_id, user=sender.user_id, what="command", reason=refusal
            )
            await conv.send(ChatMessage("⛔ Not allowed", refusal))
            return
        try:
            parsed = C.parse(text)
            msg = await self._short(parsed, sender)
        except C.UsageError as exc:
            await conv.send(ChatMessage("⚠ " + str(exc)))
            return
        if msg is not None:
            await conv.send(msg)
            return
        args = self._validated_long_args(parsed)
        if isinstance(args, ChatMessage):
            await conv.send(args)
            return
        self._log.info("chat_command", chat=sender.chat_id, user=sender.user_id, command=parsed.name)
        await self.start_long(parsed.name, args, conv)

    async def on_press(self, data: str, conv: PressConversation) -> None:
        sender = conv.sender
        press = decode(data)
        if not self.auth.chat_allowed(sender):
            # A press on a message the bot posted before its chat left the list: the spinner is
            # stopped without a word.
            self._log.warning("chat_ignored", chat=sender.chat_id, user=sender.user_id, what="button")
            await conv.toast("")
            return
        refusal = self.auth.refusal(sender)
        if refusal is not None:
            self._log.warning(
                "chat_refused", chat=sender.chat_id, user=sender.user_id, what="button", reason=refusal
            )
            await conv.toast(f"⛔ {refusal}", alert=True)
            return
        if press is None:
            self._log.warning("chat_bad_button", chat=sender.chat_id, user=sender.user_id)
            await conv.toast("This button is not valid (expired or unknown).", alert=True)
            return
        inc = self.backend.incident(press.incident_token)
        now = self._now()
        if inc is None:
            await conv.toast("This alert has expired: its incident is no longer known.", alert=True)
            await conv.set_buttons(())
            return
        if inc.resolved_at is not None and press.action not in ("triage", "diagnose"):
            ago = rounded_duration(now - inc.resolved_at)
            await conv.toast(f"Incident {inc.id} was resolved {ago} ago: nothing to do.", alert=True)
            await conv.set_buttons(())
            return
        await self._press(press, inc, conv, now)

    # -- short commands ----------------------------------------------------------

    async def _short(self, p: C.Parsed, sender: Sender) -> ChatMessage | None:
        now = self._now()
        b = self.backend
        who = sender.label
        if p.name in ("help", "start"):
            return ChatMessage("jobdiagd", C.help_text(self.task_timeout_s, scancel=self.scancel_enabled))
        if p.name == "status":
            return b.status(now)
        if p.name == "jobs":
            return b.jobs(now)
        if p.name == "job":
            jid = C.job_id(p.args[0])
            got = b.job(jid, now)
            return got if got is not None else ChatMessage(f"job {jid} is not being watched")
        if p.name == "ack":
            jid = C.job_id(p.args[0])
            kind = C.kind(p.args[1]) if len(p.args) > 1 else None
            incs = b.open_incidents(jid, kind)
            if not incs:
                return ChatMessage(f"no open incident for job {jid}" + (f" ({kind})" if kind else ""))
            for inc in incs:
                b.ack(inc, who, now)
            self._log.info("chat_ack", user=sender.user_id, incidents=[i.id for i in incs])
            return ChatMessage(f"✔ acked by {who}: " + ", ".join(i.id for i in incs))
        if p.name == "mute":
            jid = C.job_id(p.args[0])
            secs = C.duration(p.args[1])
            kind = C.kind(p.args[2]) if len(p.args) > 2 else "*"
            b.mute(jid, kind, now + secs, who, now)
            self._log.info("chat_mute", user=sender.user_id, job_id=jid, kind=kind, seconds=secs)
            what = "every alert" if kind == "*" else f"{kind} alerts"
            return ChatMessage(f"🔕 {what} of job {jid} muted for {rounded_duration(secs)} by {who}")
        if p.name == "unmute":
            jid = C.job_id(p.args[0])
            kind = C.kind(p.args[1]) if len(p.args) > 1 else "*"
            removed = b.unmute(jid, kind, who, now)
            return ChatMessage(f"🔔 job {jid} unmuted" if removed else f"job {jid} was not muted ({kind})")
        return None

    def _validated_long_args(self, p: C.Parsed) -> tuple[str, ...] | ChatMessage:
        try:
            roots = self.backend.outputs_roots
            if p.name == "triage":
                return (C.target(p.args[0], roots),)
            if p.name == "diagnose":
                jid = C.target(p.args[0], roots)
                if len(p.args) > 1:
                    return (jid, C.playbook(p.args[1], self.backend.playbooks))
                return (jid,)
            if p.name == "compare":
                return (C.target(p.args[0], roots), C.target(p.args[1], roots))
            if p.name == "plot":
                return (C.job_id(p.args[0]),)
        except C.UsageError as exc:
            return ChatMessage("⚠ " + str(exc))
        return ChatMessage(f"⚠ {p.name} is not a long command")

    # -- long commands --------------------------------------------------------------

    async def start_long(self, name: str, args: tuple[str, ...], conv: Conversation) -> None:
        """Answer "working…" at once, then run the command in a task that edits in the result."""
        chat = conv.sender.chat_id
        if chat in self._busy_chats:
            await conv.send(ChatMessage("⏳ A command is still running in this chat; wait for its answer."))
            return
        if self._waiting >= self.max_running + self.max_queued:
            await conv.send(ChatMessage("⏳ Busy: too many commands running; try again in a minute."))
            return
        self._busy_chats.add(chat)
        self._waiting += 1
        try:
            handle = await conv.send(ChatMessage(WORKING, f"`/{name} {' '.join(args)}`".strip()))
        except BaseException:
            self._busy_chats.discard(chat)
            self._waiting -= 1
            raise
        task = asyncio.get_running_loop().create_task(self._finish_long(name, args, conv, handle))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish_long(
        self, name: str, args: tuple[str, ...], conv: Conversation, handle: object
    ) -> None:
        chat = conv.sender.chat_id
        try:
            async with self._slots:
                try:
                    async with asyncio.timeout(self.task_timeout_s):
                        result = await self.backend.run_task(name, args)
                except TimeoutError:
                    result = TaskResult(
                        f"⌛ /{name} timed out", f"No answer after {self.task_timeout_s:g} s.", ok=False
                    )
                except TaskError as exc:
                    result = TaskResult(f"⚠ /{name} failed", str(exc), ok=False)
            await self._deliver(result, conv, handle, name, args)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a transport error while answering: logged, the router keeps going
            self._log.error("chat_answer_failed", command=name, error=f"{type(exc).__name__}: {exc}")
        finally:
            self._busy_chats.discard(chat)
            self._waiting -= 1

    async def _deliver(
        self, r: TaskResult, conv: Conversation, handle: object, name: str, args: tuple[str, ...]
    ) -> None:
        if r.png is not None:
            await conv.edit(handle, ChatMessage(r.title, "picture below ↓" if r.ok else r.markdown))
            await conv.send(ChatMessage(r.title, picture=Picture(r.png, f"{name}.png")))
            return
        if len(r.markdown) > DOCUMENT_OVER:
            doc = long_report(
                r.title, r.markdown, filename="-".join([name, *(_safe(a) for a in args)]) + ".md"
            )
            await conv.edit(handle, ChatMessage(r.title, doc.body))
            await conv.send(ChatMessage(r.title, "", document=doc.document))
            return
        await conv.edit(handle, ChatMessage(r.title, r.markdown))

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # -- buttons ---------------------------------------------------------------------

    async def _press(self, press: Press, inc: Incident, conv: PressConversation, now: float) -> None:
        b = self.backend
        sender = conv.sender
        who = sender.label
        a = press.action
        log = self._log.bind(chat=sender.chat_id, user=sender.user_id, incident=inc.id, action=a)
        if a == "ack":
            if inc.acked_at is not None:
                await conv.toast(f"Already acked by {inc.acked_by or 'someone'}.")
                return
            b.ack(inc, who, now)
            log.info("chat_button")
            await conv.toast(f"✔ Acked by {who}")
        elif a in MUTE_SECONDS:
            secs = MUTE_SECONDS[a]
            b.mute(inc.job_id, inc.kind, now + secs, who, now)
            log.info("chat_button", seconds=secs)
            await conv.toast(f"🔕 Muted for {rounded_duration(secs)}")
        elif a == "unmute":
            b.unmute(inc.job_id, inc.kind, who, now)
            b.unmute(inc.job_id, "*", who, now)
            log.info("chat_button")
            await conv.toast("🔔 Unmuted")
        elif a in ("triage", "diagnose"):
            if a == "diagnose" and not inc.ray:
                await conv.toast("Diagnose needs a RAY=1 job (its Prometheus).", alert=True)
                return
            await conv.toast("⏳ working…")
            log.info("chat_button")
            await self.start_long(a, (inc.job_id,), conv)
        elif a in ("scancel", "scancel_yes", "scancel_no"):
            await self._scancel(a, inc, conv, now, log)

    async def _scancel(self, a: str, inc: Incident, conv: PressConversation, now: float, log: Any) -> None:
        sender = conv.sender
        token = self.backend.incident_token(inc.id)
        if not self.scancel_enabled or token is None or not can_scancel(inc.job_id):
            await conv.toast("scancel is not enabled here.", alert=True)
            return
        if not self.auth.is_operator(sender):
            log.warning("chat_refused", what="scancel", reason="not an operator")
            await conv.toast("⛔ Only operators may scancel jobs.", alert=True)
            return
        restore = keyboard(self.backend.snapshot(inc, now), token, now=now, scancel=True)
        if a == "scancel":
            await conv.set_buttons(confirm_keyboard(inc.job_id, token))
            await conv.toast(f"Confirm: scancel job {inc.job_id}?")
            return
        if a == "scancel_no":
            await conv.set_buttons(restore)
            await conv.toast("Kept the job.")
            return
        log.warning("scancel_requested", job_id=inc.job_id, by=sender.label)
        try:
            outcome = await self.backend.scancel(inc.job_id, sender.label)
        except TaskError as exc:
            failed = f"scancel {inc.job_id} failed: {exc}"
            log.warning("scancel_failed", job_id=inc.job_id, error=str(exc))
            await conv.set_buttons(restore)
            await conv.toast(failed, alert=True)
            await conv.send(ChatMessage(f"⚠ {failed}", f"asked by {sender.label}; the job was not cancelled"))
            return
        log.warning("scancel_done", job_id=inc.job_id, outcome=outcome)
        await conv.set_buttons(restore)
        await conv.toast(outcome, alert=True)
        await conv.send(ChatMessage(f"⛔ scancel {inc.job_id} by {sender.label}", outcome))


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text.rsplit("/", 1)[-1])[:40]
