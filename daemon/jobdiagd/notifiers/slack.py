"""Slack transport (slack-sdk): incident messages in Block Kit kept current with chat.update, thread replies,
pictures and long reports through the files upload v2 flow, and the slash command, @mentions and buttons
over Socket Mode (an outbound websocket) inside the daemon's own event loop.

Sending goes through the outbox like every notifier (`send` raises NotifierError to be retried):
`open` posts the incident's message (chat.postMessage, Block Kit with buttons) and records its
`ts`; when the notification carries plot inputs the PNG is rendered first and uploaded with
files_upload_v2 (files.getUploadURLExternal -> upload -> files.completeUploadExternal) into the
message's thread, the message saying "plot in the thread". `remind`/`resolve` reply in the
thread (`thread_ts` = the parent's ts) and edit the parent; `update` edits the parent; the
job-end `report` replies in the thread of the job's newest incident message (a long report as a
.md file beside its summary); `notice` is a plain message. Every posted part is recorded
(alerts.messages) before the dispatcher marks the delivery sent, so a retry skips what went out.

Decisions (the issue is silent on these):
- slack-sdk alone, not slack-bolt: the shared chat router does the routing, so bolt's listener
  middleware would only add a dependency and a second lifecycle; the transport needs three
  envelope types and an ack, which `SocketModeClient` gives directly.
- Slack has no silent flag: a message that should ring (not info; in quiet hours only critical)
  carries `page_mention` (e.g. "<!here>"), and a ringing reminder is also broadcast from the
  thread to the channel; silent messages have no mention and stay in the thread.
- Commands: one slash command, `/jobdiagd triage 123` (`slash_command`, one entry in the app
  manifest); per-command slash commands (`/triage 123`) work too if the app registers them.
  `@jobdiagd triage 123` works where the app is a member. Every Socket Mode envelope is acked
  before any work (Slack's 3 s); answers go to the channel (a mention's in its thread), long
  ones as "working…" edited with chat.update. A refused sender's answer is ephemeral (only they
  see it; through the slash command's response_url, else chat.postEphemeral); so is a
  button's feedback. A press that changes the keyboard rewrites the pressed message's blocks.
- Delivery: 429 and `ratelimited` raise NotifierError with Slack's Retry-After, so the
  dispatcher holds this notifier's queue (order kept) until then; 5xx and network errors go
  back to its backoff; content Slack rejects (invalid_blocks, msg_too_long) drops that one
  notification; auth, channel and scope errors wait in the outbox, named in the error.
  Interactive answers (not in the outbox) retry a 429 in place when Slack asks for <= 5 s.
- An incident message deleted in Slack ("message_not_found") is posted anew and the new one
  kept. A picture that Slack refuses for good (e.g. missing files:write) is logged and dropped:
  the page is out, and the message stops pointing at the thread.
- The app connects in the background with backoff (a daemon must start while Slack is
  unreachable); until auth.test succeeds sends fail and wait in the outbox. Tokens are never
  logged: slack_sdk's own log records go through a scrubbing handler at WARNING and up.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import tzinfo
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import structlog
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import AsyncConnectionErrorRetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from jobdiagd import clock
from jobdiagd.alerts.messages import ChatMessageRef, MessageStore
from jobdiagd.chat.auth import Authorizer, Sender
from jobdiagd.chat.incident_view import incident_message
from jobdiagd.chat.model import Button, ChatMessage
from jobdiagd.chat.routes import QuietHours, Route
from jobdiagd.chat.slack_blocks import escape, render, with_buttons
from jobdiagd.model.alerts import Notification
from jobdiagd.notifiers.base import CheckResult, NotifierError, PlotFn
from jobdiagd.notifiers.chat_delivery import (
    REPORT_PICTURE_PART,
    ChatDelivery,
    LibraryLogHandler,
    route_library_logs,
)

INTERACTIVE_RETRY_MAX_S = 5.0
PLOT_NOTE = "📈 plot in the thread"
PLOT_ALT = "Step time and tokens/s per device over training steps, the incident marked"
STRIP_ALT = "GPU power and utilization per host over the last hour, the busy-wait band shaded"
REPORT_ALT = "GPU-hours per group by where they went, and the GPU-hours lost by how runs ended"
SEEN_EVENTS = 512

# Slack error codes, grouped by what the sender should do about them.
AUTH_ERRORS = {
    "invalid_auth": "bad token: Slack rejected it (invalid_auth)",
    "not_authed": "no token was sent (not_authed)",
    "account_inactive": "the token's app or user was deactivated (account_inactive)",
    "token_revoked": "the token was revoked (token_revoked)",
    "token_expired": "the token expired (token_expired)",
    "not_allowed_token_type": "wrong kind of token for this call (not_allowed_token_type)",
}
DESTINATION_ERRORS = {
    "channel_not_found": "unknown channel: wrong id, or a private channel the app was not invited to",
    "not_in_channel": "the app is not a member of the channel: /invite it there",
    "is_archived": "the channel is archived",
    "restricted_action": "the workspace does not let the app post there (restricted_action)",
    "ekm_access_denied": "the workspace's key management denied access (ekm_access_denied)",
}
CONTENT_ERRORS = {
    "invalid_blocks",
    "invalid_blocks_format",
    "msg_too_long",
    "no_text",
    "too_many_attachments",
    "invalid_attachments",
    "invalid_arguments",
    "invalid_form_data",
    "invalid_json",
    "json_not_object",
    "invalid_array_arg",
    "invalid_thread_ts",
}
SERVER_ERRORS = {"internal_error", "fatal_error", "service_unavailable", "request_timeout"}
MESSAGE_GONE = {"message_not_found", "cant_update_message", "thread_not_found"}
_MENTION_AT_START = re.compile(r"^\s*(<@[A-Z0-9]+(?:\|[^>]*)?>\s*)+")
_LINK = re.compile(r"<([^<>|]+)\|([^<>]*)>|<([^<>]+)>")


@dataclass(frozen=True, slots=True)
class SlackSettings:
    bot_token: str = field(repr=False)  # never in logs, reprs or status
    app_token: str | None = field(repr=False)
    channel_ids: tuple[str, ...]
    default_channel: str
    allowed_users: tuple[str, ...] = ()
    operators: tuple[str, ...] = ()
    routes: tuple[Route, ...] = ()
    api_base_url: str = "https://slack.com/api/"
    commands: bool = True
    slash_command: str = "/jobdiagd"
    page_mention: str = ""
    quiet: QuietHours | None = None
    tz: tzinfo | None = None
    scancel_button: bool = False
    http_timeout_s: float = 30.0
    ping_interval_s: float = 10.0


def error_code(exc: SlackApiError) -> str:
    data = getattr(exc.response, "data", None)
    return str(data.get("error", "")) if isinstance(data, Mapping) else ""


def status_of(exc: SlackApiError) -> int:
    resp = exc.response
    status = getattr(resp, "status_code", None) or getattr(resp, "status", 0)
    return int(status or 0)


def retry_after_s(headers: Mapping[str, Any] | None) -> float | None:
    """Slack's Retry-After (seconds) from a 429's headers; None when absent or unreadable."""
    if not headers:
        return None
    for key, value in headers.items():
        if key.lower() == "retry-after":
            raw = value[0] if isinstance(value, list | tuple) and value else value
            try:
                return max(0.0, float(str(raw).strip()))
            except ValueError:
                return None
    return None


def explain(exc: SlackApiError) -> str:
    """One line naming a Slack error the way a person fixes it."""
    code = error_code(exc)
    if code == "missing_scope":
        data = getattr(exc.response, "data", None)
        needed = data.get("needed") if isinstance(data, Mapping) else None
        return f"missing permission: the app lacks scope {needed or '?'} (add it, reinstall the app)"
    if code in AUTH_ERRORS:
        return AUTH_ERRORS[code]
    if code in DESTINATION_ERRORS:
        return DESTINATION_ERRORS[code]
    if code:
        return f"Slack said {code}"
    return f"HTTP {status_of(exc)}"


class _BoundedRateLimitRetry(AsyncRetryHandler):
    """Retries a 429 in place when Slack asks for a short wait: someone is waiting for this answer,
    and it has no outbox to come back from. A longer wait fails at once."""

    def __init__(self, max_wait_s: float, max_retry_count: int = 2) -> None:
        super().__init__(max_retry_count=max_retry_count)
        self.max_wait_s = max_wait_s

    def _wait(self, response: HttpResponse | None) -> float | None:
        if response is None or response.status_code != 429:
            return None
        wait = retry_after_s(response.headers)
        return 1.0 if wait is None else wait

    async def _can_retry_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        wait = self._wait(response)
        return wait is not None and wait <= self.max_wait_s

    async def prepare_for_next_attempt_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> None:
        state.next_attempt_requested = True
        await asyncio.sleep(self._wait(response) or 0.0)
        state.increment_current_attempt()


def _thread_ts(ref: ChatMessageRef) -> str:
    """The thread a message's replies go in: its own, or the thread it was posted in (Slack's
    threads are one level deep: a restarted job's page lives in the old page's thread)."""
    return str((ref.extra or {}).get("thread_ts") or ref.message_id)


def from_slack_text(text: str) -> str:
    """A command typed in Slack as plain text: the leading @mention dropped, links as their
    text, Slack's escapes undone (paths and ids then go to the shared parser's validation)."""
    text = _MENTION_AT_START.sub("", text)
    text = _LINK.sub(lambda m: m.group(2) if m.group(1) else m.group(3), text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").strip()


class SlackTransport(ChatDelivery[SlackSettings]):
    """Notifier + command intake for one Slack app. `start()`/`stop()` are the daemon's lifecycle step."""

    name = "slack"

    def __init__(
        self,
        settings: SlackSettings,
        messages: MessageStore | None = None,
        *,
        render_plot: PlotFn | None = None,
        now: Callable[[], float] = clock.wall,
    ) -> None:
        super().__init__(
            settings,
            messages,
            render_plot=render_plot,
            now=now,
            log=structlog.get_logger("jobdiagd", component="slack"),
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._seen_events: OrderedDict[str, None] = OrderedDict()
        self._user_names: dict[str, str] = {}
        self.socket: SocketModeClient | None = None
        self.bot_user_id: str | None = None
        self.bot_name: str | None = None
        # slack_sdk logs through stdlib logging: its warnings and errors go to the daemon's JSON
        # log, both tokens blanked (the SDK redacts headers, but error texts quote responses).
        self.sdk_logger = route_library_logs(
            "jobdiagd.slack_sdk", LibraryLogHandler(self.scrub, component="slack", event="slack_sdk")
        )
        # slack_sdk's module loggers (used where a client takes no logger) stay quiet below WARNING:
        # at DEBUG they print request bodies.
        logging.getLogger("slack_sdk").setLevel(logging.WARNING)
        # The outbox's client hands a 429 to the dispatcher (which holds the queue, keeping
        # order); the interactive one retries short waits in place for people waiting on an answer.
        self.web = self._client([AsyncConnectionErrorRetryHandler()])
        self.web_interactive = self._client(
            [AsyncConnectionErrorRetryHandler(), _BoundedRateLimitRetry(INTERACTIVE_RETRY_MAX_S)]
        )

    def _client(self, retry_handlers: list[AsyncRetryHandler]) -> AsyncWebClient:
        return AsyncWebClient(
            token=self.settings.bot_token,
            base_url=self.settings.api_base_url,
            timeout=int(self.settings.http_timeout_s),
            logger=self.sdk_logger,
            retry_handlers=retry_handlers,
        )

    @property
    def auth(self) -> Authorizer:
        """Commands and presses from these channels AND users; scancel for the operators."""
        return Authorizer.of(self.settings.channel_ids, self.settings.allowed_users, self.settings.operators)

    @property
    def default_destination(self) -> str:
        return self.settings.default_channel

    def scrub(self, text: str) -> str:
        for secret in (self.settings.bot_token, self.settings.app_token):
            if secret:
                text = text.replace(secret, "<token>")
        return text

    def describe(self, exc: BaseException) -> str:
        if isinstance(exc, SlackApiError):
            return self.scrub(explain(exc))
        return self.scrub(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Connect in the background (auth.test with backoff), then open the Socket Mode websocket."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.settings.http_timeout_s)
        )
        self.web.session = self._session
        self.web_interactive.session = self._session
        self._start_connecting()

    async def _connect(self) -> None:
        auth = await self._retrying(self.web.auth_test, step="auth.test")
        self.bot_user_id = str(auth.get("user_id") or "") or None
        self.bot_name = str(auth.get("user") or "") or None
        self._connect_error = None
        self._ready.set()
        self._log.info("slack_connected", bot=self.bot_name, team=auth.get("team"))
        if not (self.settings.commands and self.settings.app_token):
            return
        socket = SocketModeClient(
            app_token=self.settings.app_token,
            web_client=self.web,
            logger=self.sdk_logger,
            ping_interval=self.settings.ping_interval_s,
        )
        socket.socket_mode_request_listeners.append(self._on_request)  # type: ignore[arg-type]
        self.socket = socket
        socket.wss_uri = await self._retrying(socket.issue_new_wss_url, step="apps.connections.open")
        await socket.connect()  # type: ignore[no-untyped-call]
        self._connect_error = None
        self._log.info("slack_socket_connected", commands=self.settings.slash_command)

    async def stop(self) -> None:
        """Stop in reverse: the connect task, the websocket, answers in flight, the HTTP session."""
        await self._stop_connecting()
        if self.socket is not None:
            with contextlib.suppress(Exception):
                await self.socket.close()  # type: ignore[no-untyped-call]
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self.router is not None:
            await self.router.close()
        if self._session is not None:
            await self._session.close()
        self._ready.clear()

    # -- Notifier -----------------------------------------------------------------------

    def render(self, notification: Notification) -> str:
        n = notification
        if n.incident is not None and n.event == "open":
            msg = incident_message(n, n.body, token=None, now=n.created_at, tz=self.settings.tz)
        else:
            msg = self._plain_message(n)
        text, blocks = render(msg)
        return "\n\n".join([text, *(str(b["text"]["text"]) for b in blocks if b.get("type") == "section")])

    async def send(self, notification: Notification) -> None:
        self._check_ready()
        try:
            await self._deliver(notification)
        except SlackApiError as exc:
            raise self._notifier_error(exc) from None
        except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise NotifierError(f"slack: {self.describe(exc)}") from None

    def _notifier_error(self, exc: SlackApiError) -> NotifierError:
        code, status = error_code(exc), status_of(exc)
        if status == 429 or code == "ratelimited":
            wait = retry_after_s(getattr(exc.response, "headers", None))
            when = f", retry in {wait:g} s" if wait is not None else ""
            return NotifierError(f"slack: rate limited{when}", retry_after=wait)
        if status >= 500 or code in SERVER_ERRORS:
            return NotifierError(f"slack: server error (HTTP {status}{', ' + code if code else ''})")
        text = self.describe(exc)
        if code in CONTENT_ERRORS:
            return NotifierError(f"slack: rejected ({text})", permanent=True)
        return NotifierError(f"slack: {text}")

    # -- events -------------------------------------------------------------------------

    async def _send_open(self, n: Notification) -> None:
        """The page, then its pictures (the step chart; a RAY=1 hang's GPU power strip) in its thread."""
        done = self.messages.sent(n.id, self.name)
        parent = next((r for r in done if r.role == "parent"), None)
        uploaded = {str((r.extra or {}).get("part")) for r in done if r.kind == "file"}
        expected = (1 + bool(n.plot.get("strip"))) if n.plot else 0
        pictures = await self._pictures(n) if len(uploaded) < expected else []
        if parent is None:
            thread = self._thread(n)  # a restarted job: in the thread of the job it replaces
            dest = thread.destination if thread is not None else self._route(n)
            root = _thread_ts(thread) if thread is not None else None
            parent = await self._post_parent(n, dest, n.body, plot=bool(pictures), thread_ts=root)
        # else: posted before a crash/timeout; the outbox only missed the mark
        for i, png in enumerate(pictures):
            if f"picture-{i}" not in uploaded:
                await self._upload_picture(n, parent, png, i)

    async def _post_parent(
        self, n: Notification, dest: str, open_body: str, *, plot: bool, thread_ts: str | None = None
    ) -> ChatMessageRef:
        """The incident's message; `thread_ts`: in that thread (a restarted job's, broadcast to
        the channel when it rings), its own replies and pictures in the same thread."""
        silent = self._silent(n)
        msg = self._incident_view(n, open_body, silent=silent)
        ts = await self._post_message(
            self.web,
            dest,
            msg,
            thread_ts=thread_ts,
            mention="" if silent else self.settings.page_mention,
            notes=(PLOT_NOTE,) if plot else (),
            broadcast=thread_ts is not None and not silent,
        )
        extra: dict[str, Any] = {"body": open_body, "plot": plot}
        if thread_ts is not None:
            extra["thread_ts"] = thread_ts
        return self._record(n, dest, ts, role="parent", kind="blocks", extra=extra)

    async def _upload_picture(self, n: Notification, parent: ChatMessageRef, png: bytes, index: int) -> None:
        if index == 0:
            name, title, alt = f"{n.job_id}-{n.kind}.png", f"{n.kind} on job {n.job_id}", PLOT_ALT
        else:
            name = f"{n.job_id}-gpu-{index}.png"
            title, alt = f"GPU power and utilization per host, last hour — job {n.job_id}", STRIP_ALT
        try:
            file_id = await self._upload(
                self.web,
                parent.destination,
                data=png,
                filename=name,
                title=title,
                thread_ts=_thread_ts(parent),
                alt_text=alt,
            )
        except SlackApiError as exc:
            code, status = error_code(exc), status_of(exc)
            if status == 429 or status >= 500 or code in ("ratelimited", *SERVER_ERRORS):
                raise  # worth another try: the dispatcher comes back
            self._log.warning("slack_picture_dropped", incident=n.incident_id, error=self.describe(exc))
            if index == 0:  # the page must not point at a thread without its chart
                extra = {**(parent.extra or {}), "plot": False}
                self.messages.record(dataclasses.replace(parent, extra=extra))
            return
        self._record_reply(
            n, parent.destination, file_id, kind="file", part=f"picture-{index}", thread_ts=_thread_ts(parent)
        )

    async def _edit_parent(self, n: Notification, parent: ChatMessageRef) -> None:
        extra = parent.extra or {}
        body = str(extra.get("body", ""))
        msg = self._incident_view(n, body)
        text, blocks = render(msg, notes=(PLOT_NOTE,) if extra.get("plot") else ())
        try:
            await self.web.chat_update(
                channel=parent.destination, ts=parent.message_id, text=text, blocks=blocks
            )
        except SlackApiError as exc:
            if error_code(exc) not in MESSAGE_GONE:
                raise
            self._log.warning("slack_message_gone", incident=n.incident_id, channel=parent.destination)
            self.messages.forget(parent.notifier, parent.destination, parent.message_id)
            await self._post_parent(n, parent.destination, body, plot=False)

    async def _post_reply(self, n: Notification, dest: str, parent: ChatMessageRef | None) -> None:
        thread_ts = _thread_ts(parent) if parent is not None else None
        await self._post(n, dest, self._plain_message(n), thread_ts=thread_ts)

    async def _post_report_picture(
        self, n: Notification, dest: str, parent: ChatMessageRef | None, png: bytes
    ) -> None:
        """The report's picture as a file shared where its text went (in the incident's thread, or
        the channel); one Slack refuses for good is logged and dropped, the report stays."""
        thread_ts = parent.message_id if parent is not None else None
        try:
            file_id = await self._upload(
                self.web,
                dest,
                data=png,
                filename=f"{n.kind}.png",
                title=n.title,
                thread_ts=thread_ts,
                alt_text=REPORT_ALT,
            )
        except SlackApiError as exc:
            code, status = error_code(exc), status_of(exc)
            if status == 429 or status >= 500 or code in ("ratelimited", *SERVER_ERRORS):
                raise  # worth another try: the dispatcher comes back
            self._log.warning("slack_picture_dropped", report=n.id, error=self.describe(exc))
            file_id = f"dropped:{n.id}"
        self._record_reply(n, dest, file_id, kind="file", part=REPORT_PICTURE_PART, thread_ts=thread_ts)

    async def _post(self, n: Notification, dest: str, msg: ChatMessage, *, thread_ts: str | None) -> None:
        """Post `msg` (text, then its file) to `dest`, skipping parts this notification already posted.

        A message that rings carries the page mention, and in a thread is broadcast to the
        channel too (a reminder must be seen); a silent one stays quiet in its thread.
        """
        done = {
            (r.extra or {}).get("part"): r
            for r in self.messages.sent(n.id, self.name)
            if r.destination == dest and r.role == "reply"
        }
        ring = not msg.silent
        head = done.get(0)
        if head is None:
            ts = await self._post_message(
                self.web,
                dest,
                msg,
                thread_ts=thread_ts,
                mention=self.settings.page_mention if ring else "",
                broadcast=ring and thread_ts is not None,
            )
            self._record_reply(n, dest, ts, kind="blocks", part=0, thread_ts=thread_ts)
        else:
            ts = head.message_id
        if msg.document is not None and 1 not in done:
            doc = msg.document
            file_id = await self._upload(
                self.web,
                dest,
                data=doc.content.encode(),
                filename=doc.filename,
                title=msg.title,
                thread_ts=thread_ts or ts,  # a top-level summary gets its file in its own thread
            )
            self._record_reply(n, dest, file_id, kind="file", part=1, thread_ts=thread_ts or ts)

    def _record_reply(
        self,
        n: Notification,
        dest: str,
        message_id: str,
        *,
        kind: str,
        part: int | str,
        thread_ts: str | None,
    ) -> None:
        self._record(
            n, dest, message_id, role="reply", kind=kind, extra={"part": part, "thread_ts": thread_ts}
        )

    # -- Web API calls (shared by the outbox and the conversations) ---------------------------

    async def _post_message(
        self,
        client: AsyncWebClient,
        channel: str,
        msg: ChatMessage,
        *,
        thread_ts: str | None = None,
        mention: str = "",
        notes: Sequence[str] = (),
        broadcast: bool = False,
    ) -> str:
        text, blocks = render(msg, mention=mention, notes=notes)
        resp = await client.chat_postMessage(
            channel=channel,
            text=text,
            blocks=blocks,
            thread_ts=thread_ts,
            reply_broadcast=True if broadcast else None,
            unfurl_links=False,
            unfurl_media=False,
        )
        return str(resp["ts"])

    async def _upload(
        self,
        client: AsyncWebClient,
        channel: str,
        *,
        data: bytes,
        filename: str,
        title: str,
        thread_ts: str | None,
        alt_text: str | None = None,
    ) -> str:
        """files_upload_v2, shared to the channel (in the thread when given); returns the file id."""
        resp = await client.files_upload_v2(
            file=data,
            filename=filename,
            title=title[:250],
            alt_txt=alt_text,
            channel=channel,
            thread_ts=thread_ts,
        )
        files = resp.get("files") or []
        return str(files[0]["id"]) if files else f"upload:{filename}"

    # -- intake -------------------------------------------------------------------------

    async def _on_request(self, client: SocketModeClient, req: SocketModeRequest) -> None:
        # Ack first, whatever the envelope: Slack gives 3 s, a /triage takes longer.
        try:
            await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))
        except Exception as exc:
            self._log.warning("slack_ack_failed", envelope=req.type, error=self.describe(exc))
        if self.router is None:
            return
        work: Awaitable[None] | None = None
        if req.type == "slash_commands":
            work = self._on_slash(req.payload)
        elif req.type == "interactive" and req.payload.get("type") == "block_actions":
            work = self._on_block_actions(req.payload)
        elif req.type == "events_api":
            work = self._on_event(req.payload)
        if work is None:
            return
        task = asyncio.get_running_loop().create_task(self._guard(work, req.type))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refused(self, sender: Sender) -> bool:
        return self.auth.refusal(sender) is not None

    async def _on_slash(self, payload: Mapping[str, Any]) -> None:
        assert self.router is not None
        command = str(payload.get("command", ""))
        text = from_slack_text(str(payload.get("text", "")))
        if command == self.settings.slash_command:
            line = text or "help"
        else:  # a per-command slash command the app registered: "/triage" + "123"
            line = f"{command} {text}".strip()
        sender = Sender(
            str(payload.get("channel_id", "")),
            str(payload.get("user_id", "")),
            str(payload.get("user_name", "")),
        )
        conv = SlackConversation(
            self,
            sender,
            thread_ts=None,
            response_url=str(payload.get("response_url") or "") or None,
            invocation=f"{command} {text}".strip(),
        )
        await self.router.on_command(line, conv)

    async def _on_event(self, payload: Mapping[str, Any]) -> None:
        assert self.router is not None
        event = payload.get("event")
        if not isinstance(event, Mapping) or event.get("type") != "app_mention":
            return
        if event.get("bot_id") or (self.bot_user_id and event.get("user") == self.bot_user_id):
            return  # never answer a bot (ourselves included)
        event_id = str(payload.get("event_id") or "")
        if event_id:
            if event_id in self._seen_events:
                return  # Slack re-delivers an event it thinks was not acked
            self._seen_events[event_id] = None
            while len(self._seen_events) > SEEN_EVENTS:
                self._seen_events.popitem(last=False)
        user = str(event.get("user", ""))
        sender = Sender(str(event.get("channel", "")), user, await self._user_name(user))
        conv = SlackConversation(
            self,
            sender,
            thread_ts=str(event.get("thread_ts") or event.get("ts") or "") or None,
            response_url=None,
        )
        await self.router.on_command(from_slack_text(str(event.get("text", ""))) or "help", conv)

    async def _user_name(self, user_id: str) -> str:
        """The user's handle for "acked by …" (events carry only the id); the id if unknown."""
        if user_id in self._user_names or not user_id:
            return self._user_names.get(user_id, user_id)
        name = user_id
        try:
            resp = await self.web_interactive.users_info(user=user_id)
            user = resp.get("user") or {}
            name = str(user.get("name") or user.get("real_name") or user_id)
        except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._log.info("slack_user_name_unknown", user=user_id, error=self.describe(exc))
        self._user_names[user_id] = name
        return name

    async def _on_block_actions(self, payload: Mapping[str, Any]) -> None:
        assert self.router is not None
        actions = payload.get("actions") or []
        if not actions:
            return
        action = actions[0]
        data = str(action.get("value") or action.get("action_id") or "")
        user = payload.get("user") or {}
        channel = (payload.get("channel") or {}).get("id") or (payload.get("container") or {}).get(
            "channel_id"
        )
        sender = Sender(
            str(channel or ""), str(user.get("id", "")), str(user.get("username") or user.get("name") or "")
        )
        await self.router.on_press(data, SlackPress(self, sender, payload))

    def response_url_allowed(self, url: str) -> bool:
        """Slack's response_url is https; an emulator or gateway answers on the API's own host."""
        try:
            got, api = urlsplit(url), urlsplit(self.settings.api_base_url)
        except ValueError:
            return False
        return got.scheme == "https" or (got.scheme == api.scheme and got.netloc == api.netloc)

    # -- notify-test ------------------------------------------------------------------

    async def check(self, text: str) -> list[CheckResult]:
        """auth.test (and the scopes it reports), apps.connections.open with the app-level token,
        then a test message to every channel; each problem named."""
        out: list[CheckResult] = []
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.settings.http_timeout_s)
        ) as s:
            client = self._client([AsyncConnectionErrorRetryHandler()])
            client.session = s
            api = self.settings.api_base_url
            try:
                auth = await client.auth_test()
            except SlackApiError as exc:
                return [CheckResult("bot token", False, self.describe(exc))]
            except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                return [CheckResult("bot token", False, f"cannot reach {api}: {self.describe(exc)}")]
            out.append(CheckResult("bot token", True, f"bot @{auth.get('user')} in {auth.get('team')}"))
            out.append(self._check_scopes(auth.headers))
            if self.settings.commands:
                out.append(await self._check_app_token(client))
            for channel in self.settings.channel_ids:
                what = f"channel {channel}"
                try:
                    await client.chat_postMessage(channel=channel, text=escape(text))
                    out.append(CheckResult(what, True, "test message sent"))
                except SlackApiError as exc:
                    out.append(CheckResult(what, False, self.describe(exc)))
                except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                    out.append(CheckResult(what, False, self.describe(exc)))
        return out

    def _check_scopes(self, headers: Mapping[str, Any]) -> CheckResult:
        raw = next((str(v) for k, v in (headers or {}).items() if k.lower() == "x-oauth-scopes"), None)
        if raw is None:
            return CheckResult("scopes", True, "not reported by this server")
        have = {s.strip() for s in raw.split(",") if s.strip()}
        needed = {"chat:write": "posting", "files:write": "pictures and long reports"}
        if self.settings.commands:
            needed |= {"commands": "the slash command", "app_mentions:read": "@mentions"}
        missing = [f"{scope} ({why})" for scope, why in needed.items() if scope not in have]
        if missing:
            return CheckResult("scopes", False, "missing permission: " + ", ".join(missing))
        return CheckResult("scopes", True, ", ".join(sorted(needed)))

    async def _check_app_token(self, client: AsyncWebClient) -> CheckResult:
        what = "app-level token"
        if not self.settings.app_token:
            return CheckResult(what, False, "missing: Socket Mode needs the app-level token (xapp-…)")
        try:
            await client.apps_connections_open(app_token=self.settings.app_token)
        except SlackApiError as exc:
            if error_code(exc) == "not_allowed_token_type":
                detail = "not an app-level token: create one (xapp-…) with scope connections:write"
            else:
                detail = self.describe(exc)
            return CheckResult(what, False, detail)
        except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            return CheckResult(what, False, self.describe(exc))
        return CheckResult(what, True, "Socket Mode available")


class SlackConversation:
    """The router's view of one channel (or thread): post and update messages there.

    A refused sender is answered only where they alone see it (ephemeral).
    """

    def __init__(
        self,
        transport: SlackTransport,
        sender: Sender,
        *,
        thread_ts: str | None,
        response_url: str | None,
        invocation: str = "",
    ) -> None:
        self.transport = transport
        self._sender = sender
        self.thread_ts = thread_ts
        self.response_url = response_url
        self.invocation = invocation
        self.private = transport._refused(sender)

    @property
    def sender(self) -> Sender:
        return self._sender

    @property
    def client(self) -> AsyncWebClient:
        return self.transport.web_interactive

    def _notes(self) -> tuple[str, ...]:
        if not self.invocation:
            return ()
        return (f"`{escape(self.invocation)}` asked by {escape(self._sender.label)}",)

    async def send(self, msg: ChatMessage) -> object:
        if self.private:
            await self.ephemeral(msg)
            return None
        try:
            return await self._send_public(msg)
        except SlackApiError as exc:
            # The app is not in this channel: a slash command still has its response_url.
            if error_code(exc) in ("not_in_channel", "channel_not_found") and self.response_url:
                await self.ephemeral(msg)
                return None
            raise

    async def _send_public(self, msg: ChatMessage) -> str | None:
        t = self.transport
        channel = self._sender.chat_id
        ts: str | None = None
        if msg.body or msg.status or (msg.picture is None and msg.document is None):
            ts = await t._post_message(
                self.client, channel, msg, thread_ts=self.thread_ts, notes=self._notes()
            )
        await self._files(msg, ts)
        return ts

    async def _files(self, msg: ChatMessage, ts: str | None) -> None:
        t = self.transport
        channel = self._sender.chat_id
        if msg.picture is not None:
            await t._upload(
                self.client,
                channel,
                data=msg.picture.png,
                filename=msg.picture.filename,
                title=msg.title,
                thread_ts=self.thread_ts,
                alt_text=PLOT_ALT,
            )
        if msg.document is not None:
            await t._upload(
                self.client,
                channel,
                data=msg.document.content.encode(),
                filename=msg.document.filename,
                title=msg.title,
                thread_ts=self.thread_ts or ts,
            )

    async def edit(self, handle: object, msg: ChatMessage) -> None:
        if self.private or not isinstance(handle, str):
            await self.send(msg)
            return
        text, blocks = render(msg, notes=self._notes())
        await self.client.chat_update(channel=self._sender.chat_id, ts=handle, text=text, blocks=blocks)
        await self._files(msg, handle)

    async def ephemeral(self, msg: ChatMessage, *, compact: bool = False) -> None:
        """Only the sender sees it: through response_url when there is one, else chat.postEphemeral."""
        if compact:  # a button's feedback: one line, no header
            text, blocks = (
                escape(msg.title),
                [{"type": "section", "text": {"type": "mrkdwn", "text": escape(msg.title)}}],
            )
        else:
            text, blocks = render(msg)
        url = self.response_url
        if url and self.transport.response_url_allowed(url):
            hook = AsyncWebhookClient(url, session=self.transport._session, logger=self.transport.sdk_logger)
            resp = await hook.send(
                text=text, blocks=blocks, response_type="ephemeral", replace_original=False
            )
            if resp.status_code == 200:
                return
            self.transport._log.warning("slack_response_url_failed", status=resp.status_code)
        await self.client.chat_postEphemeral(
            channel=self._sender.chat_id,
            user=self._sender.user_id,
            text=text,
            blocks=blocks,
            thread_ts=self.thread_ts,
        )


class SlackPress(SlackConversation):
    """A button press: feedback to the presser (ephemeral), the pressed message's buttons rewritten."""

    def __init__(self, transport: SlackTransport, sender: Sender, payload: Mapping[str, Any]) -> None:
        message = payload.get("message")
        self.message: dict[str, Any] = dict(message) if isinstance(message, Mapping) else {}
        container = payload.get("container") or {}
        self.message_ts = str(container.get("message_ts") or self.message.get("ts") or "") or None
        super().__init__(
            transport,
            sender,
            thread_ts=str(self.message.get("thread_ts") or "") or self.message_ts,
            response_url=str(payload.get("response_url") or "") or None,
        )

    async def toast(self, text: str, *, alert: bool = False) -> None:
        if text:  # nothing to say (a press from a channel off the list): Slack needs no answer
            await self.ephemeral(ChatMessage(text), compact=True)

    async def set_buttons(self, rows: tuple[tuple[Button, ...], ...]) -> None:
        if self.message_ts is None or not self.message:
            return
        blocks = with_buttons(self.message.get("blocks") or [], rows)
        await self.client.chat_update(
            channel=self._sender.chat_id,
            ts=self.message_ts,
            text=str(self.message.get("text") or "jobdiagd"),
            blocks=blocks,
        )
        self.message["blocks"] = blocks


def settings_from_config(cfg: Any, chat_cfg: Any, bot_token: str, app_token: str | None) -> SlackSettings:
    """SlackSettings from [notifiers.slack] and [chat] (already validated by config.py)."""
    from jobdiagd.chat.routes import parse_quiet_hours, zone

    routes = tuple(
        Route(
            destination=r.channel,
            kinds=frozenset(r.kinds),
            severities=frozenset(r.severities),
            owners=frozenset(r.owners),
        )
        for r in cfg.routes
    )
    return SlackSettings(
        bot_token=bot_token,
        app_token=app_token,
        channel_ids=tuple(cfg.channel_ids),
        default_channel=cfg.default_channel or cfg.channel_ids[0],
        allowed_users=tuple(cfg.allowed_users),
        operators=tuple(cfg.operators),
        routes=routes,
        api_base_url=cfg.api_base_url,
        commands=cfg.commands,
        slash_command=cfg.slash_command,
        page_mention=cfg.page_mention,
        quiet=parse_quiet_hours(chat_cfg.quiet_hours, chat_cfg.timezone),
        tz=zone(chat_cfg.timezone),
        scancel_button=chat_cfg.scancel_button,
    )


__all__: Sequence[str] = ["SlackSettings", "SlackTransport", "settings_from_config"]
