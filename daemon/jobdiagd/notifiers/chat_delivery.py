"""The delivery flow Telegram and Slack share: which event posts, replies or edits what, and what is recorded.

A chat transport subclasses `ChatDelivery` and supplies only what its API does differently:
how the page is posted (`_send_open`), how a plain reply goes out (`_post_reply`), how an
incident message is edited (`_edit_parent`), and how an exception reads in a log (`describe`).
Everything else (the event dispatch, "reply under every incident message, then edit it",
the job-end report under the newest incident message per chat, a restarted job's messages in
the thread of the job it replaces, the connect backoff, the
guard around an answer, the record of each posted message) is here once, with the
transport's name in its log events (`telegram_plot_failed`, `slack_connect_failed`, …).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import tzinfo
from typing import Any, Generic, Protocol, TypeVar

from jobdiagd.alerts.messages import ChatMessageRef, MessageStore, Role
from jobdiagd.chat.incident_view import incident_message, reply_message, report_message
from jobdiagd.chat.model import ChatMessage
from jobdiagd.chat.router import ChatRouter
from jobdiagd.chat.routes import QuietHours, Route, destination_for, is_silent
from jobdiagd.model.alerts import Notification
from jobdiagd.notifiers.base import NotifierError, PlotFn

CONNECT_BACKOFF_MAX_S = 300.0
# The recorded part of a report's picture: after any text parts and document of the report.
REPORT_PICTURE_PART = 100


class LibraryLogHandler(logging.Handler):
    """A chat library's stdlib log records (WARNING and up) as one structured line each: the first
    line of the message and of its exception, secrets scrubbed, never a traceback (a library's
    `logger.exception` would otherwise reach stderr through Python's last-resort handler)."""

    def __init__(self, scrub: Callable[[str], str], *, component: str, event: str) -> None:
        super().__init__(logging.WARNING)
        self.scrub = scrub
        self.event = event
        import structlog

        self.log = structlog.get_logger("jobdiagd", component=component)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.scrub(record.getMessage())
            exc = record.exc_info[1] if record.exc_info else None
            cause = self.scrub(f"{type(exc).__name__}: {exc}") if exc is not None else None
        except Exception:  # a broken log record must not break the transport
            return
        fields: dict[str, Any] = {"logger": record.name, "error": text.splitlines()[0][:500] if text else ""}
        if cause:
            fields["cause"] = cause.splitlines()[0][:500]
        if record.levelno >= logging.ERROR:
            self.log.error(f"{self.event}_error", **fields)
        else:
            self.log.warning(f"{self.event}_warning", **fields)


def route_library_logs(name: str, handler: LibraryLogHandler) -> logging.Logger:
    """Send logger `name` (and its children) to `handler` alone, at WARNING and up; a handler a
    previous transport of the same library installed is replaced (it scrubs an old token)."""
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.setLevel(logging.WARNING)
    for old in [h for h in logger.handlers if isinstance(h, LibraryLogHandler)]:
        logger.removeHandler(old)
    logger.addHandler(handler)
    return logger


class ChatSettings(Protocol):
    """What the shared flow reads from a transport's settings."""

    @property
    def routes(self) -> tuple[Route, ...]: ...

    @property
    def quiet(self) -> QuietHours | None: ...

    @property
    def tz(self) -> tzinfo | None: ...

    @property
    def scancel_button(self) -> bool: ...


SettingsT = TypeVar("SettingsT", bound=ChatSettings)


class ChatDelivery(Generic[SettingsT]):
    """The outbox side of a chat transport, and the pieces of its lifecycle both APIs share."""

    name: str

    def __init__(
        self,
        settings: SettingsT,
        messages: MessageStore | None,
        *,
        render_plot: PlotFn | None,
        now: Callable[[], float],
        log: Any,
    ) -> None:
        self.settings = settings
        self._messages = messages
        self.render_plot = render_plot
        self.router: ChatRouter | None = None
        self._now = now
        self._log = log
        self._ready = asyncio.Event()
        self._connect_error: str | None = None
        self._task: asyncio.Task[None] | None = None

    # -- what each transport supplies ------------------------------------------------------

    @property
    def default_destination(self) -> str:
        raise NotImplementedError

    def describe(self, exc: BaseException) -> str:
        """The exception as one log-safe line (secrets scrubbed)."""
        raise NotImplementedError

    async def _send_open(self, n: Notification) -> None:
        raise NotImplementedError

    async def _post_reply(self, n: Notification, dest: str, parent: ChatMessageRef | None) -> None:
        """Post `n`'s plain message to `dest`, under `parent` when there is one."""
        raise NotImplementedError

    async def _edit_parent(self, n: Notification, parent: ChatMessageRef) -> None:
        raise NotImplementedError

    # -- the message store --------------------------------------------------------------

    @property
    def messages(self) -> MessageStore:
        if self._messages is None:
            raise RuntimeError(f"{self.name} transport used before bind(message store)")
        return self._messages

    def bind(self, messages: MessageStore) -> None:
        """The daemon's message store (opened after the notifiers are built)."""
        self._messages = messages

    def _record(
        self,
        n: Notification,
        dest: str,
        message_id: str,
        *,
        role: Role,
        kind: str,
        extra: Mapping[str, Any],
    ) -> ChatMessageRef:
        """Record a posted message, so that a retried notification skips what already went out."""
        ref = ChatMessageRef(
            notifier=self.name,
            destination=dest,
            message_id=message_id,
            notification_id=n.id,
            incident_id=n.incident_id,
            job_id=n.job_id,
            role=role,
            kind=kind,
            extra=extra,
            created_at=self._now(),
        )
        self.messages.record(ref)
        return ref

    # -- lifecycle ----------------------------------------------------------------------

    async def _connect(self) -> None:
        raise NotImplementedError

    def _start_connecting(self) -> None:
        """Connect in the background: the daemon starts (and pages via other notifiers) meanwhile."""
        self._task = asyncio.get_running_loop().create_task(self._connect(), name=f"{self.name}-connect")

    async def _stop_connecting(self) -> None:
        """Cancel the background connect (a stop while it still backs off, or once it is done)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _retrying(self, call: Callable[[], Awaitable[Any]], **log_fields: Any) -> Any:
        """`call()` until it succeeds, doubling the wait up to CONNECT_BACKOFF_MAX_S (a daemon
        must start while the chat service is unreachable); each new error logged once."""
        delay = 1.0
        while True:
            try:
                return await call()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = self.describe(exc)
                if error != self._connect_error:
                    self._log.error(
                        f"{self.name}_connect_failed", **log_fields, error=error, retry_in_s=delay
                    )
                self._connect_error = error
                await asyncio.sleep(delay)
                delay = min(CONNECT_BACKOFF_MAX_S, delay * 2)

    async def _guard(self, work: Awaitable[None], what: str) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one failed answer must not stop the intake
            self._log.error(f"{self.name}_answer_failed", what=what, error=self.describe(exc))

    # -- delivery -----------------------------------------------------------------------

    def _check_ready(self) -> None:
        if not self._ready.is_set():
            raise NotifierError(f"{self.name}: not connected yet ({self._connect_error or 'connecting'})")

    async def _deliver(self, n: Notification) -> None:
        """Post, reply or edit as `n`'s event asks; the transport maps its API's errors."""
        if n.event == "open" and n.incident_id:
            await self._send_open(n)
        elif n.event in ("remind", "resolve") and n.incident_id:
            await self._reply_and_edit(n)
        elif n.event == "update" and n.incident_id:
            await self._edit_parents(n)
        elif n.event == "report":
            await self._send_report(n)
        else:
            await self._post_reply(n, self._route(n), None)

    def _route(self, n: Notification) -> str:
        return destination_for(n, self.settings.routes, self.default_destination)

    def _silent(self, n: Notification) -> bool:
        return is_silent(n, self.settings.quiet, self._now())

    def _plain_message(self, n: Notification) -> ChatMessage:
        if n.event in ("remind", "resolve", "update"):
            return reply_message(n, silent=self._silent(n), now=self._now(), tz=self.settings.tz)
        return report_message(n, silent=self._silent(n))

    def _incident_view(self, n: Notification, open_body: str, *, silent: bool = False) -> ChatMessage:
        token = self.messages.incident_token(n.incident_id) if n.incident_id else None
        return incident_message(
            n,
            open_body,
            token=token,
            now=self._now(),
            tz=self.settings.tz,
            scancel=self.settings.scancel_button,
            silent=silent,
        )

    async def _pictures(self, n: Notification) -> list[bytes]:
        if not n.plot or self.render_plot is None or n.event != "open":
            return []
        try:
            return list(await self.render_plot(n.plot))
        except Exception as exc:  # a picture must never keep a page from going out
            self._log.warning(
                f"{self.name}_plot_failed", incident=n.incident_id, error=f"{type(exc).__name__}: {exc}"
            )
            return []

    async def _reply_and_edit(self, n: Notification) -> None:
        assert n.incident_id is not None
        parents = self.messages.parents(n.incident_id, self.name)
        if not parents:
            # The incident's message never reached this chat (notifier added later, open
            # abandoned): say it on its own rather than lose it.
            await self._post_reply(n, self._route(n), None)
            return
        for parent in parents:
            await self._post_reply(n, parent.destination, parent)
            await self._edit_parent(n, parent)

    async def _edit_parents(self, n: Notification) -> None:
        assert n.incident_id is not None
        for parent in self.messages.parents(n.incident_id, self.name):
            await self._edit_parent(n, parent)

    def _thread(self, n: Notification) -> ChatMessageRef | None:
        """The message a restarted job's page replies to: the newest incident message of the job
        it replaces (rule REC-11, `MessageStore.thread_of`); None for any other job."""
        found = self.messages.thread_of(n.job_id, self.name) if n.job_id else []
        return found[0] if found else None

    async def _send_report(self, n: Notification) -> None:
        parents = self.messages.job_parents(n.job_id, self.name) if n.job_id else []
        if not parents and n.job_id:
            parents = self.messages.thread_of(n.job_id, self.name)  # a restart's: the old job's thread
        latest: dict[str, ChatMessageRef] = {}
        for p in parents:  # newest first: one reply per chat, under its newest incident message
            latest.setdefault(p.destination, p)
        targets: list[tuple[str, ChatMessageRef | None]] = list(latest.items()) or [(self._route(n), None)]
        for dest, parent in targets:
            await self._post_reply(n, dest, parent)
        if n.plot:
            await self._report_picture(n, targets)

    async def _report_picture(self, n: Notification, targets: list[tuple[str, ChatMessageRef | None]]) -> None:
        """A report's picture (the weekly goodput digest's) after its text, where the text went;
        rendered once per send, and only while some destination still lacks it. A picture that
        cannot be rendered is left out: the report has gone out already."""
        done = {
            r.destination
            for r in self.messages.sent(n.id, self.name)
            if r.role == "reply" and (r.extra or {}).get("part") == REPORT_PICTURE_PART
        }
        todo = [(dest, parent) for dest, parent in targets if dest not in done]
        if not todo or self.render_plot is None or n.plot is None:
            return
        try:
            pictures = list(await self.render_plot(n.plot))
        except Exception as exc:
            self._log.warning(f"{self.name}_plot_failed", report=n.id, error=f"{type(exc).__name__}: {exc}")
            return
        if not pictures:
            return
        for dest, parent in todo:
            await self._post_report_picture(n, dest, parent, pictures[0])

    async def _post_report_picture(
        self, n: Notification, dest: str, parent: ChatMessageRef | None, png: bytes
    ) -> None:
        """Post a report's picture to `dest` (under `parent` when there is one), recorded as a
        reply of part `REPORT_PICTURE_PART`."""
        raise NotImplementedError
