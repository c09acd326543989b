"""A local emulator of the Telegram Bot API endpoints jobdiagd uses, for the real python-telegram-bot client.

It speaks the real protocol: `POST /bot<token>/<method>` with form or multipart bodies (PTB
sends JSON-encoded values in form fields and files as multipart parts), answers
`{"ok": true, "result": ...}` with the objects PTB parses, and errors as Telegram does
(400 with its descriptions, 401 for a bad token, 403 Forbidden, 429 with
`parameters.retry_after`). It validates HTML parse mode (allowed tags, balanced) and the
4096/1024 limits, keeps every message and its edits, records every call, and lets a test
inject updates (commands and button presses) that a long-polling `getUpdates` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from aiohttp import web

BOT_ID = 4242
BOT_USERNAME = "jobdiagd_bot"
ALLOWED_TAGS = {
    "b",
    "strong",
    "i",
    "em",
    "u",
    "ins",
    "s",
    "strike",
    "del",
    "code",
    "pre",
    "a",
    "blockquote",
    "tg-spoiler",
    "span",
    "tg-emoji",
}
JSON_FIELDS = {
    "reply_markup",
    "reply_parameters",
    "allowed_updates",
    "commands",
    "link_preview_options",
    "entities",
    "caption_entities",
    "scope",
}


class _HtmlCheck(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.error: str | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in ALLOWED_TAGS:
            self.error = self.error or f'Unsupported start tag "{tag}"'
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.error = self.error or f'Unexpected end tag "{tag}"'
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse_html(text: str) -> tuple[str, str | None]:
    """(visible text, error) as Telegram's parser would judge HTML parse mode."""
    p = _HtmlCheck()
    p.feed(text)
    p.close()
    if p.error is None and p.stack:
        p.error = f'Can\'t find end tag corresponding to start tag "{p.stack[-1]}"'
    return "".join(p.text), p.error


class ApiError(Exception):
    def __init__(self, status: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    files: dict[str, tuple[str, bytes]]
    at: float


@dataclass
class Failure:
    status: int
    description: str
    retry_after: int | None
    times: int


@dataclass
class StoredMessage:
    chat_id: int
    message_id: int
    text: str | None = None  # visible text (entities parsed)
    html: str | None = None  # as sent
    caption: str | None = None
    caption_html: str | None = None
    photo: bytes | None = None
    document: tuple[str, bytes] | None = None
    reply_markup: dict[str, Any] | None = None
    reply_to: int | None = None
    silent: bool = False
    edits: list[dict[str, Any]] = field(default_factory=list)
    from_bot: bool = True

    @property
    def buttons(self) -> list[list[tuple[str, str]]]:
        rows = (self.reply_markup or {}).get("inline_keyboard") or []
        return [[(b["text"], b.get("callback_data", "")) for b in row] for row in rows]


class TelegramEmulator:
    def __init__(self, token: str = "123456:TEST-token-for-the-emulator") -> None:
        self.token = token
        self.chats: dict[int, dict[str, Any]] = {}
        self.forbidden: dict[int, str] = {}
        self.calls: list[Call] = []
        self.messages: dict[tuple[int, int], StoredMessage] = {}
        self.answers: list[dict[str, Any]] = []
        self.failures: dict[str, list[Failure]] = {}
        self._updates: list[dict[str, Any]] = []
        self._update_ids = itertools.count(1)
        self._message_ids = itertools.count(100)
        self._query_ids = itertools.count(9000)
        self._cond: asyncio.Condition | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- setup -----------------------------------------------------------------------
    def add_chat(self, chat_id: int, *, kind: str = "group", title: str = "ops") -> None:
        self.chats[chat_id] = (
            {"id": chat_id, "type": kind, "title": title}
            if kind != "private"
            else {"id": chat_id, "type": "private", "first_name": title}
        )

    def fail(
        self, method: str, status: int, description: str, *, retry_after: int | None = None, times: int = 1
    ) -> None:
        """The next `times` calls of `method` fail like Telegram would."""
        self.failures.setdefault(method, []).append(Failure(status, description, retry_after, times))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._cond = asyncio.Condition()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- what tests inject --------------------------------------------------------------
    def _user(self, user_id: int, name: str) -> dict[str, Any]:
        return {"id": user_id, "is_bot": False, "first_name": name, "username": name}

    async def _push(self, update: dict[str, Any]) -> None:
        assert self._cond is not None
        async with self._cond:
            update["update_id"] = next(self._update_ids)
            self._updates.append(update)
            self._cond.notify_all()

    async def send_command(self, chat_id: int, user_id: int, text: str, name: str = "alice") -> int:
        """A user types `text` (a /command) in a chat; returns the message id."""
        mid = next(self._message_ids)
        command = text.split()[0]
        msg = {
            "message_id": mid,
            "date": int(time.time()),
            "chat": self.chats.get(chat_id, {"id": chat_id, "type": "group", "title": "?"}),
            "from": self._user(user_id, name),
            "text": text,
            "entities": [{"type": "bot_command", "offset": 0, "length": len(command)}],
        }
        self.messages[(chat_id, mid)] = StoredMessage(chat_id, mid, text=text, html=text, from_bot=False)
        await self._push({"message": msg})
        return mid

    async def press(self, chat_id: int, message_id: int, user_id: int, data: str, name: str = "alice") -> str:
        """A user presses a button (or a client forges callback data) on a message; returns the query id."""
        qid = str(next(self._query_ids))
        stored = self.messages.get((chat_id, message_id))
        message = (
            self._message_json(stored)
            if stored is not None
            else {
                "message_id": message_id,
                "date": int(time.time()),
                "chat": self.chats.get(chat_id, {"id": chat_id, "type": "group"}),
            }
        )
        await self._push(
            {
                "callback_query": {
                    "id": qid,
                    "from": self._user(user_id, name),
                    "message": message,
                    "chat_instance": "1",
                    "data": data,
                }
            }
        )
        return qid

    # -- queries for tests ----------------------------------------------------------------
    def bot_messages(self, chat_id: int | None = None) -> list[StoredMessage]:
        return [m for m in self.messages.values() if m.from_bot and (chat_id is None or m.chat_id == chat_id)]

    def calls_of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def answer_for(self, query_id: str) -> dict[str, Any] | None:
        return next((a for a in self.answers if a["callback_query_id"] == query_id), None)

    async def wait_for(self, pred: Callable[[], Any], what: str, within: float = 60.0) -> Any:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            got = pred()
            if got:
                return got
            await asyncio.sleep(0.05)
        raise AssertionError(f"emulator: timed out waiting for {what}")

    # -- the API ----------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params, files = await self._params(request)
        self.calls.append(Call(method, params, files, time.time()))
        try:
            if request.match_info["token"] != self.token:
                raise ApiError(401, "Unauthorized")
            self._inject_failure(method)
            handler = getattr(self, f"_api_{method}", None)
            if handler is None:
                raise ApiError(404, "Not Found")
            result = await handler(params, files)
        except ApiError as exc:
            body: dict[str, Any] = {"ok": False, "error_code": exc.status, "description": exc.description}
            if exc.retry_after is not None:
                body["parameters"] = {"retry_after": exc.retry_after}
            return web.json_response(body, status=exc.status)
        return web.json_response({"ok": True, "result": result})

    def _inject_failure(self, method: str) -> None:
        queue = self.failures.get(method)
        if not queue:
            return
        f = queue[0]
        f.times -= 1
        if f.times <= 0:
            queue.pop(0)
        raise ApiError(f.status, f.description, f.retry_after)

    async def _params(self, request: web.Request) -> tuple[dict[str, Any], dict[str, tuple[str, bytes]]]:
        params: dict[str, Any] = {}
        files: dict[str, tuple[str, bytes]] = {}
        if request.content_type == "application/json":
            raw = await request.json()
            params = dict(raw) if isinstance(raw, dict) else {}
        elif request.content_type.startswith("multipart/"):
            reader = await request.multipart()
            async for part in reader:
                if part.name is None:
                    continue
                data = await part.read()  # type: ignore[union-attr]
                if part.filename:  # type: ignore[union-attr]
                    files[part.name] = (part.filename, bytes(data))  # type: ignore[union-attr]
                else:
                    params[part.name] = data.decode()
        else:
            form = await request.post()
            params = {k: v for k, v in form.items() if isinstance(v, str)}
        for k in list(params):
            if k in JSON_FIELDS and isinstance(params[k], str):
                params[k] = json.loads(params[k])
        for k, v in list(params.items()):  # "attach://name" points at a multipart file part
            if isinstance(v, str) and v.startswith("attach://") and v[9:] in files:
                files[k] = files[v[9:]]
        return params, files

    def _chat(self, params: dict[str, Any]) -> int:
        try:
            chat_id = int(params.get("chat_id", ""))
        except ValueError:
            raise ApiError(400, "Bad Request: chat not found") from None
        if chat_id not in self.chats:
            raise ApiError(400, "Bad Request: chat not found")
        if chat_id in self.forbidden:
            raise ApiError(403, f"Forbidden: {self.forbidden[chat_id]}")
        return chat_id

    def _message_json(self, m: StoredMessage) -> dict[str, Any]:
        out: dict[str, Any] = {
            "message_id": m.message_id,
            "date": int(time.time()),
            "chat": self.chats.get(m.chat_id, {"id": m.chat_id, "type": "group"}),
        }
        if m.from_bot:
            out["from"] = {"id": BOT_ID, "is_bot": True, "first_name": "jobdiagd", "username": BOT_USERNAME}
        if m.text is not None:
            out["text"] = m.text
        if m.photo is not None:
            out["photo"] = [
                {
                    "file_id": f"photo-{m.message_id}",
                    "file_unique_id": f"p{m.message_id}",
                    "width": 1280,
                    "height": 960,
                    "file_size": len(m.photo),
                }
            ]
        if m.document is not None:
            out["document"] = {
                "file_id": f"doc-{m.message_id}",
                "file_unique_id": f"d{m.message_id}",
                "file_name": m.document[0],
                "mime_type": "text/markdown",
                "file_size": len(m.document[1]),
            }
        if m.caption is not None:
            out["caption"] = m.caption
        if m.reply_markup:
            out["reply_markup"] = m.reply_markup
        if m.reply_to is not None and (m.chat_id, m.reply_to) in self.messages:
            parent = self.messages[(m.chat_id, m.reply_to)]
            out["reply_to_message"] = {
                "message_id": parent.message_id,
                "date": int(time.time()),
                "chat": out["chat"],
            }
        return out

    def _formatted(
        self, params: dict[str, Any], key: str, limit: int, too_long: str
    ) -> tuple[str | None, str | None]:
        raw = params.get(key)
        if raw is None:
            return None, None
        if params.get("parse_mode") == "HTML":
            visible, error = parse_html(raw)
            if error is not None:
                raise ApiError(400, f"Bad Request: can't parse entities: {error}")
        else:
            visible = raw
        if len(visible) > limit:
            raise ApiError(400, too_long)
        if key == "text" and not visible.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        return visible, raw

    def _reply_to(self, chat_id: int, params: dict[str, Any]) -> int | None:
        rp = params.get("reply_parameters")
        if not rp:
            return None
        mid = int(rp["message_id"])
        if (chat_id, mid) not in self.messages and not rp.get("allow_sending_without_reply"):
            raise ApiError(400, "Bad Request: message to be replied not found")
        return mid

    def _new(self, chat_id: int, params: dict[str, Any], **kw: Any) -> dict[str, Any]:
        mid = next(self._message_ids)
        m = StoredMessage(
            chat_id,
            mid,
            reply_markup=params.get("reply_markup") or None,
            reply_to=self._reply_to(chat_id, params),
            silent=str(params.get("disable_notification", "false")).lower() == "true",
            **kw,
        )
        self.messages[(chat_id, mid)] = m
        return self._message_json(m)

    async def _api_getMe(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        return {
            "id": BOT_ID,
            "is_bot": True,
            "first_name": "jobdiagd",
            "username": BOT_USERNAME,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    async def _api_deleteWebhook(self, params: dict[str, Any], files: Any) -> bool:
        return True

    async def _api_setMyCommands(self, params: dict[str, Any], files: Any) -> bool:
        return True

    async def _api_getUpdates(self, params: dict[str, Any], files: Any) -> list[dict[str, Any]]:
        assert self._cond is not None
        offset = int(params.get("offset", 0) or 0)
        timeout = float(params.get("timeout", 0) or 0)
        limit = int(params.get("limit", 100) or 100)
        async with self._cond:
            # Telegram forgets updates below the offset a client confirms.
            self._updates = [u for u in self._updates if u["update_id"] >= offset]
            if not self._updates and timeout > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._cond.wait_for(lambda: bool(self._updates)), timeout)
            return list(self._updates[:limit])

    async def _api_sendMessage(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        chat = self._chat(params)
        text, html = self._formatted(params, "text", 4096, "Bad Request: message is too long")
        return self._new(chat, params, text=text, html=html)

    async def _api_sendPhoto(
        self, params: dict[str, Any], files: dict[str, tuple[str, bytes]]
    ) -> dict[str, Any]:
        chat = self._chat(params)
        caption, html = self._formatted(params, "caption", 1024, "Bad Request: message caption is too long")
        if "photo" not in files:
            raise ApiError(400, "Bad Request: there is no photo in the request")
        return self._new(chat, params, caption=caption, caption_html=html, photo=files["photo"][1])

    async def _api_sendDocument(
        self, params: dict[str, Any], files: dict[str, tuple[str, bytes]]
    ) -> dict[str, Any]:
        chat = self._chat(params)
        caption, html = self._formatted(params, "caption", 1024, "Bad Request: message caption is too long")
        if "document" not in files:
            raise ApiError(400, "Bad Request: there is no document in the request")
        return self._new(chat, params, caption=caption, caption_html=html, document=files["document"])

    def _target(self, params: dict[str, Any]) -> StoredMessage:
        chat = self._chat(params)
        m = self.messages.get((chat, int(params.get("message_id", 0))))
        if m is None or not m.from_bot:
            raise ApiError(400, "Bad Request: message to edit not found")
        return m

    def _not_modified(self) -> ApiError:
        return ApiError(
            400,
            "Bad Request: message is not modified: specified new message content and reply "
            "markup are exactly the same as a current content and reply markup of the message",
        )

    async def _api_editMessageText(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        m = self._target(params)
        if m.text is None:
            raise ApiError(400, "Bad Request: there is no text in the message to edit")
        text, html = self._formatted(params, "text", 4096, "Bad Request: message is too long")
        markup = params.get("reply_markup") or None
        if html == m.html and markup == m.reply_markup:
            raise self._not_modified()
        m.edits.append({"text": text, "reply_markup": markup})
        m.text, m.html, m.reply_markup = text, html, markup
        return self._message_json(m)

    async def _api_editMessageCaption(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        m = self._target(params)
        if m.photo is None and m.document is None:
            raise ApiError(400, "Bad Request: there is no caption in the message to edit")
        caption, html = self._formatted(params, "caption", 1024, "Bad Request: message caption is too long")
        markup = params.get("reply_markup") or None
        if html == m.caption_html and markup == m.reply_markup:
            raise self._not_modified()
        m.edits.append({"caption": caption, "reply_markup": markup})
        m.caption, m.caption_html, m.reply_markup = caption, html, markup
        return self._message_json(m)

    async def _api_editMessageReplyMarkup(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        m = self._target(params)
        markup = params.get("reply_markup") or None
        if markup == m.reply_markup:
            raise self._not_modified()
        m.edits.append({"reply_markup": markup})
        m.reply_markup = markup
        return self._message_json(m)

    async def _api_answerCallbackQuery(self, params: dict[str, Any], files: Any) -> bool:
        self.answers.append(
            {
                "callback_query_id": str(params.get("callback_query_id")),
                "text": params.get("text"),
                "show_alert": str(params.get("show_alert")).lower() == "true",
            }
        )
        return True
