"""One command router for every chat transport: authorization, parsing, short answers, long commands
off the event loop (one in flight per chat, a bounded queue overall), and button presses.

What a command or a button does is in its table (`chat.commands.COMMANDS`, `chat.buttons.BUTTONS`):
the router looks it up and runs its handler; it holds no per-command or per-button code."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from jobdiagd import clock
from jobdiagd.chat import commands as C
from jobdiagd.chat.auth import Authorizer, Sender
from jobdiagd.chat.buttons import BUTTONS, NodePressed, Pressed, decode
from jobdiagd.chat.incident_view import DOCUMENT_OVER, long_report
from jobdiagd.chat.model import ChatMessage, Picture
from jobdiagd.chat.ports import ChatBackend, Conversation, PressConversation, TaskError, TaskResult
from jobdiagd.durations import rounded_duration

WORKING = "⏳ working…"


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
        recovery_enabled: bool = False,
        now: Callable[[], float] = clock.wall,
    ) -> None:
        self.backend = backend
        self.auth = auth
        self.transport = transport
        self.max_running = max_running
        self.max_queued = max_queued
        self.task_timeout_s = task_timeout_s
        self.scancel_enabled = scancel_enabled
        self.recovery_enabled = recovery_enabled
        self._now = now
        self._slots = asyncio.Semaphore(max_running)
        self._busy_chats: set[str] = set()
        self._waiting = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._log = structlog.get_logger("jobdiagd", component="chat", transport=transport)

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
            args = C.checked(parsed, self.backend)
            msg = self._answer(parsed.spec, args, sender)
        except C.UsageError as exc:
            await conv.send(ChatMessage("⚠ " + str(exc)))
            return
        if msg is not None:
            await conv.send(msg)
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
        spec = BUTTONS[press.action]
        if press.node is not None and spec.on_node is not None:
            log = self._log.bind(chat=sender.chat_id, user=sender.user_id, node=press.node, action=press.action)
            node = NodePressed(press.action, press.node, conv, self.backend, self._now(), log, self.auth)
            await spec.on_node(node)
            return
        assert spec.on_press is not None  # `decode` gives an incident's press only for such a spec
        inc = self.backend.incident(press.incident_token)
        now = self._now()
        if inc is None:
            await conv.toast("This alert has expired: its incident is no longer known.", alert=True)
            await conv.set_buttons(())
            return
        if inc.resolved_at is not None and not spec.after_resolve:
            ago = rounded_duration(now - inc.resolved_at)
            await conv.toast(f"Incident {inc.id} was resolved {ago} ago: nothing to do.", alert=True)
            await conv.set_buttons(())
            return
        log = self._log.bind(chat=sender.chat_id, user=sender.user_id, incident=inc.id, action=press.action)
        pressed = Pressed(
            press.action, inc, conv, self.backend, now, log, self.auth, self.scancel_enabled, self.start_long
        )
        await spec.on_press(pressed)

    # -- short commands ----------------------------------------------------------

    def _answer(self, spec: C.CommandSpec, args: C.Args, sender: Sender) -> ChatMessage | None:
        """A short command's answer; None for a long one (run by `start_long`)."""
        if spec.answer is None:
            return None
        call = C.Call(
            self.backend,
            sender,
            self._now(),
            self._log,
            self.task_timeout_s,
            self.scancel_enabled,
            self.recovery_enabled,
        )
        return spec.answer(call, args)

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


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text.rsplit("/", 1)[-1])[:40]
