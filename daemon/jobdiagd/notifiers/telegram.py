"""Telegram transport (python-telegram-bot v22): incident messages kept current, replies, reports, and the
command/button intake by long polling inside the daemon's own event loop.

Sending goes through the outbox like every notifier (`send` raises NotifierError to be retried):
`open` posts the incident's message (a photo with the text as caption when the notification
carries plot inputs and a renderer is wired, else text) and records its id; `remind` and
`resolve` reply under it and edit it; `update` edits it; the job-end `report` replies to the
job's incident message when there is one (a long report as a .md document plus a summary);
`notice` is a plain message. Every posted message is recorded (alerts.messages) before the
dispatcher marks the delivery sent, so a retried notification skips what already went out.

Decisions: "message is not modified" is success; an incident message deleted in the chat
("message to edit not found") is posted anew and the new one kept; 429 is retried once by
PTB's AIORateLimiter after `retry_after`, then handed to the dispatcher with `retry_after`
(the transport opts in to PTB's timedelta time periods, PTB_TIMEDELTA, unless the operator set
it: PTB otherwise warns of a deprecation on every 429; opted in, a RetryAfter's own text reads
"Retry in 0:00:03" instead of "Retry in 3 seconds");
network errors and 5xx go back to the dispatcher's backoff; a content error the server
rejects (400) drops that one notification. The bot connects in the background with backoff
(a daemon must start when Telegram is unreachable); until it is connected sends fail and wait
in the outbox. The token is never logged: error texts are scrubbed and httpx's request log
(which carries the token in the URL) is kept at WARNING.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta, tzinfo
from typing import Any

from telegram import (
    Bot,
    BotCommand,
    CallbackQuery,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    InputFile,
    Message,
    ReplyParameters,
    Update,
)
from telegram.constants import ParseMode
from telegram.error import BadRequest, Forbidden, InvalidToken, NetworkError, RetryAfter, TelegramError
from telegram.ext import (
    AIORateLimiter,
    Application,
    CallbackQueryHandler,
    ContextTypes,
    MessageHandler,
    filters,
)
from telegram.request import HTTPXRequest

from jobdiagd import clock
from jobdiagd.alerts.messages import ChatMessageRef, MessageStore
from jobdiagd.chat.auth import Authorizer, Sender
from jobdiagd.chat.commands import COMMANDS
from jobdiagd.chat.incident_view import incident_message
from jobdiagd.chat.model import Button, ChatMessage, Picture
from jobdiagd.chat.routes import QuietHours, Route
from jobdiagd.chat.telegram_html import CAPTION_LIMIT, MESSAGE_LIMIT, escape, render_parts, render_single
from jobdiagd.config import bot_api_root
from jobdiagd.model.alerts import Notification
from jobdiagd.notifiers.base import CheckResult, NotifierError, PlotFn
from jobdiagd.notifiers.chat_delivery import (
    REPORT_PICTURE_PART,
    ChatDelivery,
    LibraryLogHandler,
    route_library_logs,
)

MAX_PARTS = 8  # a reply longer than this many messages is cut (reports go as documents before that)
_TOKEN_SHAPE = re.compile(r"^[0-9]{1,20}:[A-Za-z0-9_-]{20,}\Z")  # what Telegram accepts to look up


@dataclass(frozen=True, slots=True)
class TelegramSettings:
    token: str = field(repr=False)  # never in logs, reprs or status
    chat_ids: tuple[int, ...]
    default_chat: int
    allowed_users: tuple[int, ...] = ()
    operators: tuple[int, ...] = ()
    routes: tuple[Route, ...] = ()
    api_base_url: str = "https://api.telegram.org"
    commands: bool = True
    poll_timeout_s: float = 30.0
    quiet: QuietHours | None = None
    tz: tzinfo | None = None
    scancel_button: bool = False


def _opt_in_to_timedelta() -> None:
    """PTB's documented opt-in to its future time periods (v22.2+): without it PTB warns on every
    429, since it reads `RetryAfter.retry_after` as seconds itself while building the exception.
    The daemon owns its process; an operator's explicit PTB_TIMEDELTA is left as it is."""
    os.environ.setdefault("PTB_TIMEDELTA", "true")


def _retry_after_s(exc: RetryAfter) -> float:
    ra = exc.retry_after  # a timedelta once opted in; seconds where PTB_TIMEDELTA=false
    return ra.total_seconds() if isinstance(ra, timedelta) else float(ra)


def _markup(rows: tuple[tuple[Button, ...], ...]) -> InlineKeyboardMarkup | None:
    if not rows:
        return None
    return InlineKeyboardMarkup(
        [[InlineKeyboardButton(b.label, callback_data=b.token) for b in row] for row in rows]
    )


def _empty_markup() -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup([])


class TelegramTransport(ChatDelivery[TelegramSettings]):
    """Notifier + command intake for one bot. `start()`/`stop()` are the daemon's lifecycle step."""

    name = "telegram"

    def __init__(
        self,
        settings: TelegramSettings,
        messages: MessageStore | None = None,
        *,
        render_plot: PlotFn | None = None,
        now: Callable[[], float] = clock.wall,
    ) -> None:
        super().__init__(settings, messages, render_plot=render_plot, now=now, log=logging_bound())
        _opt_in_to_timedelta()
        self.username: str | None = None
        # httpx logs every request URL at INFO, and the URL carries the bot token.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        # PTB logs through stdlib logging, some of it with a traceback (a server answering
        # something other than JSON): one structured line each instead, the token scrubbed.
        route_library_logs(
            "telegram", LibraryLogHandler(self.scrub, component="telegram", event="telegram_ptb")
        )
        api = bot_api_root(settings.api_base_url)
        self.app: Application[Any, Any, Any, Any, Any, Any] = (
            Application.builder()
            .token(settings.token)
            .base_url(f"{api}/bot")
            .base_file_url(f"{api}/file/bot")
            .rate_limiter(AIORateLimiter(max_retries=1))
            .concurrent_updates(True)
            .build()
        )
        self.app.add_handler(MessageHandler(filters.COMMAND, self._on_command))
        self.app.add_handler(CallbackQueryHandler(self._on_callback))
        self.app.add_error_handler(self._on_error)

    @property
    def auth(self) -> Authorizer:
        """Commands and presses from these chats AND users; scancel for the operators."""
        return Authorizer.of(self.settings.chat_ids, self.settings.allowed_users, self.settings.operators)

    @property
    def default_destination(self) -> str:
        return str(self.settings.default_chat)

    def describe(self, exc: BaseException) -> str:
        return self.scrub(f"{type(exc).__name__}: {exc}")

    @property
    def bot(self) -> Bot:
        bot: Bot = self.app.bot
        return bot

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Connect in the background (getMe with backoff), then poll for commands and presses."""
        self._start_connecting()

    async def _connect(self) -> None:
        await self._retrying(self.app.initialize)
        self.username = self.app.bot.username
        await self.app.start()
        if self.settings.commands:
            with contextlib.suppress(TelegramError):
                await self.bot.set_my_commands(
                    [BotCommand(c.name, c.help[:256]) for c in COMMANDS.values() if c.listed]
                )
            await self.app.updater.start_polling(  # type: ignore[union-attr]
                timeout=timedelta(seconds=self.settings.poll_timeout_s),
                allowed_updates=["message", "callback_query"],
                error_callback=self._polling_error,
            )
        self._connect_error = None
        self._ready.set()
        self._log.info("telegram_connected", bot=self.username, commands=self.settings.commands)

    def _polling_error(self, exc: TelegramError) -> None:
        self._log.warning("telegram_polling_error", error=self.describe(exc))

    async def stop(self) -> None:
        """Stop in reverse: polling, the application, then its HTTP clients."""
        await self._stop_connecting()
        if self.router is not None:
            await self.router.close()
        updater = self.app.updater
        if updater is not None and updater.running:
            await updater.stop()
        if self.app.running:
            await self.app.stop()
        with contextlib.suppress(Exception):
            await self.app.shutdown()
        self._ready.clear()

    def scrub(self, text: str) -> str:
        return text.replace(self.settings.token, "<token>") if self.settings.token else text

    # -- Notifier -----------------------------------------------------------------------

    def render(self, notification: Notification) -> str:
        n = notification
        if n.incident is not None and n.event == "open":
            msg = incident_message(n, n.body, token=None, now=n.created_at, tz=self.settings.tz)
            return render_single(msg, MESSAGE_LIMIT)
        return "\n\n".join(render_parts(self._plain_message(n), MESSAGE_LIMIT))

    async def send(self, notification: Notification) -> None:
        self._check_ready()
        try:
            await self._deliver(notification)
        except RetryAfter as exc:
            raise NotifierError(
                f"telegram: flood control, retry in {_retry_after_s(exc):g} s",
                retry_after=_retry_after_s(exc),
            ) from None
        except InvalidToken as exc:
            raise NotifierError(f"telegram: bad token ({self.scrub(str(exc))})") from None
        except Forbidden as exc:
            raise NotifierError(f"telegram: missing permission ({self.scrub(exc.message)})") from None
        except BadRequest as exc:
            text = exc.message.lower()
            if "chat not found" in text:
                raise NotifierError(f"telegram: unknown chat ({exc.message})") from None
            raise NotifierError(f"telegram: rejected ({self.scrub(exc.message)})", permanent=True) from None
        except NetworkError as exc:  # TimedOut included; 5xx arrive as NetworkError too
            raise NotifierError(f"telegram: {self.describe(exc)}") from None

    # -- events -------------------------------------------------------------------------

    async def _send_open(self, n: Notification) -> None:
        """The page (a photo of the step chart with the text as caption, or text), then further
        pictures (a RAY=1 hang's GPU power strip) as replies under it."""
        sent = self.messages.sent(n.id, self.name)
        parent = next((r for r in sent if r.role == "parent"), None)
        pictures: list[bytes] | None = None
        if parent is None:
            pictures = await self._pictures(n)
            thread = self._thread(n)  # a restarted job: in the thread of the job it replaces
            dest = thread.destination if thread is not None else self._route(n)
            parent = await self._post_parent(
                n, dest, n.body, pictures[0] if pictures else None, reply_to=thread
            )
        wants_more = bool(n.plot and n.plot.get("strip"))
        if not wants_more or any(r.role == "reply" for r in sent):
            return  # nothing more, or posted before a crash/timeout: the outbox only missed the mark
        if pictures is None:
            pictures = await self._pictures(n)
        for i, png in enumerate(pictures[1:], start=1):
            msg = ChatMessage(
                f"GPU power and utilization per host, last hour — job {n.job_id}",
                picture=Picture(png, f"gpu-{i}.png"),
                silent=True,  # the page itself rang
            )
            await self._post(n, parent.destination, msg, role="reply", reply_to=parent, first_part=i)

    async def _post_parent(
        self,
        n: Notification,
        dest: str,
        open_body: str,
        png: bytes | None = None,
        *,
        reply_to: ChatMessageRef | None = None,
    ) -> ChatMessageRef:
        msg = self._incident_view(n, open_body, silent=self._silent(n))
        markup = _markup(msg.buttons)
        reply = (
            ReplyParameters(int(reply_to.message_id), allow_sending_without_reply=True)
            if reply_to is not None
            else None
        )
        if png is not None:
            sent = await self.bot.send_photo(
                chat_id=int(dest),
                photo=InputFile(png, filename="alert.png"),
                caption=render_single(msg, CAPTION_LIMIT),
                parse_mode=ParseMode.HTML,
                reply_markup=markup,
                reply_parameters=reply,
                disable_notification=msg.silent,
            )
            kind = "photo"
        else:
            sent = await self.bot.send_message(
                chat_id=int(dest),
                text=render_single(msg, MESSAGE_LIMIT),
                parse_mode=ParseMode.HTML,
                reply_markup=markup,
                reply_parameters=reply,
                disable_notification=msg.silent,
                link_preview_options=None,
            )
            kind = "text"
        return self._record(
            n, dest, str(sent.message_id), role="parent", kind=kind, extra={"body": open_body}
        )

    async def _edit_parent(self, n: Notification, parent: ChatMessageRef) -> None:
        body = str((parent.extra or {}).get("body", ""))
        msg = self._incident_view(n, body)
        markup = _markup(msg.buttons) or _empty_markup()
        try:
            if parent.kind == "photo":
                await self.bot.edit_message_caption(
                    chat_id=int(parent.destination),
                    message_id=int(parent.message_id),
                    caption=render_single(msg, CAPTION_LIMIT),
                    parse_mode=ParseMode.HTML,
                    reply_markup=markup,
                )
            else:
                await self.bot.edit_message_text(
                    chat_id=int(parent.destination),
                    message_id=int(parent.message_id),
                    text=render_single(msg, MESSAGE_LIMIT),
                    parse_mode=ParseMode.HTML,
                    reply_markup=markup,
                )
        except BadRequest as exc:
            text = exc.message.lower()
            if "not modified" in text:
                return  # the same edit again (a retry, or an idempotent update): done
            if "message to edit not found" in text or "message can't be edited" in text:
                self._log.warning("telegram_message_gone", incident=n.incident_id, chat=parent.destination)
                self.messages.forget(parent.notifier, parent.destination, parent.message_id)
                await self._post_parent(n, parent.destination, body)
                return
            raise

    async def _post_reply(self, n: Notification, dest: str, parent: ChatMessageRef | None) -> None:
        await self._post(n, dest, self._plain_message(n), role="reply", reply_to=parent)

    async def _post_report_picture(
        self, n: Notification, dest: str, parent: ChatMessageRef | None, png: bytes
    ) -> None:
        msg = ChatMessage(n.title, picture=Picture(png, f"{n.kind}.png"), silent=self._silent(n))
        await self._post(n, dest, msg, role="reply", reply_to=parent, first_part=REPORT_PICTURE_PART)

    async def _post(
        self,
        n: Notification,
        dest: str,
        msg: ChatMessage,
        *,
        role: str,
        reply_to: ChatMessageRef | None,
        first_part: int = 0,
    ) -> None:
        """Send `msg` (all its parts) to `dest`, skipping parts this notification already posted."""
        done = {
            int((r.extra or {}).get("part", 0))
            for r in self.messages.sent(n.id, self.name)
            if r.destination == dest and r.role == "reply"
        }
        reply_id = int(reply_to.message_id) if reply_to is not None else None
        for i, (kind, sent) in enumerate(self._outgoing(int(dest), msg, reply_id), start=first_part):
            if i in done:
                continue
            message = await sent()
            self._record(n, dest, str(message.message_id), role="reply", kind=kind, extra={"part": i})

    def _outgoing(
        self, chat: int, msg: ChatMessage, reply_to: int | None
    ) -> list[tuple[str, Callable[[], Awaitable[Message]]]]:
        """The API calls that post `msg`: text parts, then a picture or document if any (a
        document with nothing else to say is one message, its title the caption)."""
        reply = ReplyParameters(reply_to, allow_sending_without_reply=True) if reply_to is not None else None
        bot = self.bot
        out: list[tuple[str, Callable[[], Awaitable[Message]]]] = []
        if msg.picture is not None:
            pic = msg.picture
            out.append(
                (
                    "photo",
                    lambda: bot.send_photo(
                        chat_id=chat,
                        photo=InputFile(pic.png, filename=pic.filename),
                        caption=render_single(msg, CAPTION_LIMIT),
                        parse_mode=ParseMode.HTML,
                        reply_parameters=reply,
                        disable_notification=msg.silent,
                    ),
                )
            )
            return out
        alone = msg.document is not None and not (msg.body or msg.more or msg.status or msg.footer)
        parts = [] if alone else render_parts(msg, MESSAGE_LIMIT)
        if len(parts) > MAX_PARTS:
            parts = [*parts[: MAX_PARTS - 1], parts[MAX_PARTS - 1] + "\n<i>… cut: too long for chat</i>"]
        for i, text in enumerate(parts):
            # A message's buttons (a suspect-node notice's Drain) go under its last text part.
            markup = _markup(msg.buttons) if i == len(parts) - 1 else None
            out.append(
                (
                    "text",
                    lambda text=text, markup=markup: bot.send_message(  # type: ignore[misc]
                        chat_id=chat,
                        text=text,
                        parse_mode=ParseMode.HTML,
                        reply_parameters=reply,
                        reply_markup=markup,
                        disable_notification=msg.silent,
                    ),
                )
            )
        if msg.document is not None:
            doc = msg.document
            out.append(
                (
                    "document",
                    lambda: bot.send_document(
                        chat_id=chat,
                        document=InputFile(doc.content.encode(), filename=doc.filename),
                        caption=f"<b>{escape(msg.title)}</b>"[:CAPTION_LIMIT],
                        parse_mode=ParseMode.HTML,
                        reply_parameters=reply,
                        disable_notification=msg.silent,
                    ),
                )
            )
        return out

    # -- intake -------------------------------------------------------------------------

    async def _on_command(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.effective_message
        user = update.effective_user
        if self.router is None or message is None or message.text is None or user is None:
            return
        first = message.text.split(maxsplit=1)[0]
        if "@" in first and self.username and first.split("@", 1)[1].lower() != self.username.lower():
            return  # addressed to another bot in the same group
        sender = Sender(str(message.chat_id), str(user.id), user.username or user.full_name)
        conv = TelegramConversation(self, sender, reply_to=message.message_id)
        await self._guard(self.router.on_command(message.text, conv), "command")

    async def _on_callback(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        query = update.callback_query
        if self.router is None or query is None:
            return
        message = query.message
        chat_id = str(message.chat.id) if message is not None else ""
        sender = Sender(
            chat_id, str(query.from_user.id), query.from_user.username or query.from_user.full_name
        )
        conv = TelegramPress(self, sender, query)
        await self._guard(self.router.on_press(query.data or "", conv), "button")

    async def _on_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        # Instead of PTB's default (a stdlib traceback that may quote request details).
        exc = context.error
        self._log.error("telegram_update_failed", error=self.scrub(f"{type(exc).__name__}: {exc}"))

    # -- notify-test ------------------------------------------------------------------

    async def check(self, text: str) -> list[CheckResult]:
        """getMe, then a silent test message to every allowed chat; each problem named."""
        out: list[CheckResult] = []
        api = bot_api_root(self.settings.api_base_url)
        request = _AnswerRecorder()
        bot = Bot(
            self.settings.token, base_url=f"{api}/bot", base_file_url=f"{api}/file/bot", request=request
        )
        try:
            try:
                await bot.initialize()
            except TelegramError as exc:
                return [CheckResult("token", False, self._getme_problem(exc, request, api))]
            out.append(CheckResult("token", True, f"bot @{bot.username}"))
            for chat in self.settings.chat_ids:
                what = f"chat {chat}"
                try:
                    await bot.send_message(chat_id=chat, text=text, disable_notification=True)
                    out.append(CheckResult(what, True, "test message sent"))
                except BadRequest as exc:
                    if "chat not found" in exc.message.lower():
                        detail = "unknown chat: wrong id, or the bot was never added to it"
                    else:
                        detail = f"rejected: {exc.message}"
                    out.append(CheckResult(what, False, detail))
                except Forbidden as exc:
                    out.append(CheckResult(what, False, f"missing permission: {exc.message}"))
                except TelegramError as exc:
                    out.append(CheckResult(what, False, self.describe(exc)))
        finally:
            with contextlib.suppress(Exception):
                await bot.shutdown()
        return out

    def _getme_problem(self, exc: TelegramError, answer: _AnswerRecorder, api: str) -> str:
        """Why getMe failed, told apart by the HTTP answer: a server that is no Bot API server
        (a 404, or no Bot API JSON at all), a bad token (401; or a malformed one, which
        Telegram answers with its own 404), or no answer."""
        status, bot_api = answer.status, answer.bot_api
        if status == 401 or (status == 404 and bot_api and not _TOKEN_SHAPE.match(self.settings.token)):
            return f"bad token: the server rejected it (HTTP {status})"
        if status is not None and (status == 404 or not bot_api):
            return (
                f"this is not a Bot API server (HTTP {status} at {api}): check "
                "[notifiers.telegram] api_base_url"
            )
        if isinstance(exc, NetworkError):
            return f"cannot reach {api}: {self.scrub(str(exc)).splitlines()[0][:300]}"
        return f"getMe failed at {api}: {self.describe(exc).splitlines()[0][:300]}"


class _AnswerRecorder(HTTPXRequest):
    """PTB's HTTP client, remembering the status of its last answer and whether the body was the
    Bot API's JSON (`{"ok": ...}`): PTB raises the same InvalidToken for a 401 and a 404."""

    status: int | None = None
    bot_api = False

    async def do_request(self, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
        code, payload = await super().do_request(*args, **kwargs)
        self.status = code
        try:
            data = json.loads(payload)
        except ValueError:
            data = None
        self.bot_api = isinstance(data, dict) and "ok" in data
        return code, payload


class TelegramConversation:
    """The router's view of one chat: send and edit messages there (replies to the command)."""

    def __init__(self, transport: TelegramTransport, sender: Sender, reply_to: int | None = None) -> None:
        self.transport = transport
        self._sender = sender
        self.reply_to = reply_to

    @property
    def sender(self) -> Sender:
        return self._sender

    async def send(self, msg: ChatMessage) -> object:
        """Post an answer: silent, always (rule CHAT-3: the person who asked is looking at the
        chat; only pages and reminders ring)."""
        msg = dataclasses.replace(msg, silent=True)
        last: Message | None = None
        for _kind, call in self.transport._outgoing(int(self._sender.chat_id), msg, self.reply_to):
            last = await call()
        return last.message_id if last is not None else None

    async def edit(self, handle: object, msg: ChatMessage) -> None:
        parts = render_parts(msg, MESSAGE_LIMIT)
        if not isinstance(handle, int) or not parts:
            await self.send(msg)
            return
        try:
            await self.transport.bot.edit_message_text(
                chat_id=int(self._sender.chat_id), message_id=handle, text=parts[0], parse_mode=ParseMode.HTML
            )
        except BadRequest as exc:
            if "not modified" not in exc.message.lower():
                raise
        rest = ChatMessage(msg.title, "", document=msg.document, picture=msg.picture)
        for text in parts[1:MAX_PARTS]:
            await self.transport.bot.send_message(
                chat_id=int(self._sender.chat_id),
                text=text,
                parse_mode=ParseMode.HTML,
                disable_notification=True,
            )
        if msg.document is not None or msg.picture is not None:
            await self.send(rest)


class TelegramPress(TelegramConversation):
    """A button press: answer the callback query, change the pressed message's keyboard."""

    def __init__(self, transport: TelegramTransport, sender: Sender, query: CallbackQuery) -> None:
        message = query.message
        super().__init__(transport, sender, reply_to=message.message_id if message is not None else None)
        self.query = query
        self._answered = False

    async def toast(self, text: str, *, alert: bool = False) -> None:
        if self._answered:
            return  # a callback query is answered once; later words go to the chat
        self._answered = True
        await self.query.answer(text[:200] or None, show_alert=alert and bool(text))

    async def set_buttons(self, rows: tuple[tuple[Button, ...], ...]) -> None:
        try:
            await self.query.edit_message_reply_markup(reply_markup=_markup(rows) or _empty_markup())
        except BadRequest as exc:
            if "not modified" not in exc.message.lower():
                raise


def logging_bound() -> Any:
    import structlog

    return structlog.get_logger("jobdiagd", component="telegram")


def settings_from_config(cfg: Any, chat_cfg: Any, token: str) -> TelegramSettings:
    """TelegramSettings from [notifiers.telegram] and [chat] (already validated by config.py)."""
    from jobdiagd.chat.routes import parse_quiet_hours, zone

    tg = cfg
    routes = tuple(
        Route(
            destination=str(r.chat),
            kinds=frozenset(r.kinds),
            severities=frozenset(r.severities),
            owners=frozenset(r.owners),
        )
        for r in tg.routes
    )
    default = tg.default_chat if tg.default_chat is not None else tg.chat_ids[0]
    return TelegramSettings(
        token=token,
        chat_ids=tuple(tg.chat_ids),
        default_chat=default,
        allowed_users=tuple(tg.allowed_users),
        operators=tuple(tg.operators),
        routes=routes,
        api_base_url=bot_api_root(tg.api_base_url),
        commands=tg.commands,
        poll_timeout_s=tg.poll_timeout_seconds,
        quiet=parse_quiet_hours(chat_cfg.quiet_hours, chat_cfg.timezone),
        tz=zone(chat_cfg.timezone),
        scancel_button=chat_cfg.scancel_button,
    )


__all__: Sequence[str] = ["CheckResult", "TelegramSettings", "TelegramTransport", "settings_from_config"]
