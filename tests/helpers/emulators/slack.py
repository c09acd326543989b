"""A local emulator of the Slack endpoints jobdiagd uses, for the real slack-sdk client (Web API + Socket Mode).

It speaks the real protocol: `POST /api/<method>` with the token as `Authorization: Bearer`,
arguments as JSON, form or query parameters (slack-sdk uses all three), answers
`{"ok": true, ...}` and errors as Slack does (`{"ok": false, "error": ...}`, HTTP 429 with
`Retry-After` for rate limits). `apps.connections.open` hands out a `ws://127.0.0.1` URL whose
websocket sends `hello` and then the envelopes a test injects (slash_commands, interactive
block_actions, events_api app_mention), and records each ack (`envelope_id`) in the order it
arrived relative to the API calls. Files follow the upload v2 flow (getUploadURLExternal, a
raw POST to the upload URL, completeUploadExternal sharing to a channel or thread); each
envelope that Slack gives a `response_url` gets one here (at most 5 uses). Block Kit is
validated against Slack's limits (50 blocks, 3000-character sections, 150-character headers,
button text/value/action_id lengths, unique action ids) and rejected with `invalid_blocks`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

TEAM = "T0TEAM001"
APP_ID = "A0APP0001"
BOT_USER = "U0BOT0001"
BOT_ID = "B0BOT0001"
BOT_NAME = "jobdiagd"
ALL_SCOPES = "chat:write,files:write,commands,app_mentions:read,users:read"
BOT_METHODS = {
    "auth.test",
    "chat.postMessage",
    "chat.update",
    "chat.postEphemeral",
    "files.getUploadURLExternal",
    "files.completeUploadExternal",
    "users.info",
}
_CONTROL = re.compile(r"<(?:[@#!][^<>]*|https?://[^<>]*|mailto:[^<>]*)>")


def visible_text(mrkdwn: str) -> str:
    """What a reader sees of a mrkdwn text: links as their labels, *bold*/_italic_/`code` marks
    dropped, escapes undone (code fences stay)."""
    text = re.sub(r"<([^<>|]+)\|([^<>]+)>", r"\2", mrkdwn)
    text = re.sub(r"<([^<>]+)>", r"\1", text)
    text = re.sub(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])", r"\1", text)
    text = re.sub(r"(?<![\w_])_([^_\n]+)_(?![\w_])", r"\1", text)
    text = re.sub(r"(?<!`)`([^`\n]+)`(?!`)", r"\1", text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def stray_markup(mrkdwn: str) -> list[str]:
    """`<`/`>` that are neither escaped nor a Slack control sequence (link, mention): an escaping bug."""
    rest = _CONTROL.sub("", mrkdwn)
    return [c for c in rest if c in "<>"]


class ApiError(Exception):
    def __init__(
        self, error: str, *, status: int = 200, retry_after: int | None = None, **extra: Any
    ) -> None:
        super().__init__(error)
        self.error = error
        self.status = status
        self.retry_after = retry_after
        self.extra = extra


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    token: str
    seq: int
    at: float


@dataclass
class Failure:
    error: str
    status: int
    retry_after: int | None
    times: int
    extra: dict[str, Any]


@dataclass
class StoredFile:
    id: str
    filename: str
    length: int
    alt_txt: str | None = None
    title: str | None = None
    data: bytes | None = None
    channel: str | None = None
    thread_ts: str | None = None


@dataclass
class SlackMessage:
    channel: str
    ts: str
    text: str = ""
    blocks: list[dict[str, Any]] = field(default_factory=list)
    thread_ts: str | None = None
    user: str = BOT_USER
    bot: bool = True
    files: list[StoredFile] = field(default_factory=list)
    reply_broadcast: bool = False
    edits: list[dict[str, Any]] = field(default_factory=list)

    @property
    def buttons(self) -> list[list[tuple[str, str]]]:
        return [
            [
                (e["text"]["text"], e.get("value", ""))
                for e in b.get("elements", [])
                if e.get("type") == "button"
            ]
            for b in self.blocks
            if b.get("type") == "actions"
        ]

    @property
    def labels(self) -> list[str]:
        return [label for row in self.buttons for label, _ in row]

    def value_of(self, label: str) -> str:
        return next(v for row in self.buttons for lb, v in row if lb == label)

    @property
    def visible(self) -> str:
        """Header, context lines and sections as a reader sees them (the text fallback without blocks)."""
        if not self.blocks:
            return visible_text(self.text)
        parts: list[str] = []
        for b in self.blocks:
            if b.get("type") in ("header", "section") and b.get("text"):
                parts.append(
                    visible_text(b["text"]["text"]) if b["text"]["type"] == "mrkdwn" else b["text"]["text"]
                )
            elif b.get("type") == "context":
                parts += [visible_text(e.get("text", "")) for e in b.get("elements", [])]
        return "\n".join(parts)

    @property
    def mrkdwn(self) -> list[str]:
        out = [self.text]
        for b in self.blocks:
            if b.get("type") == "section" and b.get("text", {}).get("type") == "mrkdwn":
                out.append(b["text"]["text"])
            out += [e.get("text", "") for e in b.get("elements", []) if e.get("type") == "mrkdwn"]
        return out

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "message", "ts": self.ts, "text": self.text, "team": TEAM}
        if self.bot:
            out.update(user=BOT_USER, bot_id=BOT_ID, app_id=APP_ID)
        else:
            out["user"] = self.user
        if self.blocks:
            out["blocks"] = self.blocks
        if self.thread_ts is not None:
            out["thread_ts"] = self.thread_ts
        if self.files:
            out["files"] = [{"id": f.id, "name": f.filename, "title": f.title} for f in self.files]
        return out


@dataclass
class Envelope:
    id: str
    type: str
    payload: dict[str, Any]
    seq: int
    acked_seq: int | None = None
    acked_at: float | None = None  # wall clock, for the benchmark (tests use the order, not times)
    ack_payload: dict[str, Any] | None = None


@dataclass
class Ephemeral:
    channel: str
    user: str
    text: str
    blocks: list[dict[str, Any]]
    via: str  # "chat.postEphemeral" | "response_url"
    seq: int

    @property
    def visible(self) -> str:
        return SlackMessage(self.channel, "0", self.text, self.blocks).visible


@dataclass
class ResponseUrl:
    channel: str
    user: str
    message_ts: str | None
    uses: int = 0
    posts: list[dict[str, Any]] = field(default_factory=list)


class SlackEmulator:
    def __init__(
        self,
        bot_token: str = "xoxb-111-222-emulator-bot-token",
        app_token: str = "xapp-1-A0APP0001-333-emulator",
    ) -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.scopes = ALL_SCOPES
        self.channels: dict[str, dict[str, Any]] = {}
        self.users: dict[str, str] = {}
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, str], SlackMessage] = {}
        self.ephemerals: list[Ephemeral] = []
        self.envelopes: dict[str, Envelope] = {}
        self.files: dict[str, StoredFile] = {}
        self.response_urls: dict[str, ResponseUrl] = {}
        self.failures: dict[str, list[Failure]] = {}
        self.connections_opened = 0
        self._seq = itertools.count(1)
        self._ts = itertools.count(1)
        self._ts_base = int(time.time())
        self._file_ids = itertools.count(1)
        self._tickets: set[str] = set()
        self._sockets: list[web.WebSocketResponse] = []
        self._socket_up: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- setup -------------------------------------------------------------------------
    def add_channel(self, channel_id: str, name: str = "ops", *, member: bool = True) -> None:
        self.channels[channel_id] = {"id": channel_id, "name": name, "member": member, "archived": False}

    def add_user(self, user_id: str, name: str) -> None:
        self.users[user_id] = name

    def fail(
        self,
        method: str,
        error: str,
        *,
        status: int = 200,
        retry_after: int | None = None,
        times: int = 1,
        **extra: Any,
    ) -> None:
        """The next `times` calls of `method` fail as Slack would (429 + Retry-After for "ratelimited")."""
        self.failures.setdefault(method, []).append(Failure(error, status, retry_after, times, extra))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    async def start(self) -> None:
        self._socket_up = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/api/{method}", self._handle)
        app.router.add_get("/api/{method}", self._handle)
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_post("/response/{key}", self._response)
        app.router.add_get("/link/", self._websocket)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- what tests inject -------------------------------------------------------------
    def _next_ts(self) -> str:
        return f"{self._ts_base}.{next(self._ts):06d}"

    def _response_url(self, channel: str, user: str, message_ts: str | None = None) -> str:
        key = uuid.uuid4().hex
        self.response_urls[key] = ResponseUrl(channel, user, message_ts)
        return f"http://127.0.0.1:{self.port}/response/{key}"

    async def wait_connected(self, within: float = 60.0) -> None:
        assert self._socket_up is not None
        await asyncio.wait_for(self._socket_up.wait(), within)

    def open_sockets(self) -> int:
        return len([w for w in self._sockets if not w.closed])

    async def refresh(self) -> None:
        """Slack asks the client to reconnect (it does so every few hours): a `disconnect` frame."""
        assert self._socket_up is not None
        self._socket_up.clear()
        ws = next(w for w in reversed(self._sockets) if not w.closed)
        await ws.send_str(
            json.dumps(
                {"type": "disconnect", "reason": "refresh_requested", "debug_info": {"host": "emulator"}}
            )
        )

    async def drop(self) -> None:
        """The connection breaks (a load balancer, a network blip): every socket closed by the server."""
        assert self._socket_up is not None
        self._socket_up.clear()
        for ws in list(self._sockets):
            await ws.close()

    async def _send_envelope(self, kind: str, payload: dict[str, Any], **extra: Any) -> str:
        await self.wait_connected()
        env = Envelope(str(uuid.uuid4()), kind, payload, next(self._seq))
        self.envelopes[env.id] = env
        frame = {"envelope_id": env.id, "type": kind, "payload": payload, **extra}
        ws = next(w for w in reversed(self._sockets) if not w.closed)
        await ws.send_str(json.dumps(frame))
        return env.id

    async def slash(self, channel: str, user: str, text: str, *, command: str = "/jobdiagd") -> str:
        """A user runs `/jobdiagd <text>` in a channel; returns the envelope id."""
        payload = {
            "token": "verification-token-unused-in-socket-mode",
            "team_id": TEAM,
            "team_domain": "emulated",
            "channel_id": channel,
            "channel_name": self.channels.get(channel, {}).get("name", "unknown"),
            "user_id": user,
            "user_name": self.users.get(user, user.lower()),
            "command": command,
            "text": text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"),
            "api_app_id": APP_ID,
            "is_enterprise_install": "false",
            "response_url": self._response_url(channel, user),
            "trigger_id": f"{uuid.uuid4().int % 10**12}.{TEAM}",
        }
        return await self._send_envelope("slash_commands", payload, accepts_response_payload=True)

    async def mention(
        self, channel: str, user: str, text: str, *, thread_ts: str | None = None
    ) -> tuple[str, str]:
        """A user writes `@jobdiagd <text>`; returns (envelope id, the message's ts)."""
        ts = self._next_ts()
        full = f"<@{BOT_USER}> {text}"
        self.messages[(channel, ts)] = SlackMessage(
            channel, ts, full, thread_ts=thread_ts, user=user, bot=False
        )
        event: dict[str, Any] = {
            "type": "app_mention",
            "user": user,
            "text": full,
            "ts": ts,
            "channel": channel,
            "event_ts": ts,
            "team": TEAM,
        }
        if thread_ts is not None:
            event["thread_ts"] = thread_ts
        payload = {
            "token": "unused",
            "team_id": TEAM,
            "api_app_id": APP_ID,
            "event": event,
            "type": "event_callback",
            "event_id": f"Ev{uuid.uuid4().hex[:10].upper()}",
            "event_time": int(time.time()),
        }
        env = await self._send_envelope(
            "events_api", payload, accepts_response_payload=False, retry_attempt=0
        )
        return env, ts

    async def press(
        self, channel: str, ts: str, user: str, value: str, *, action_id: str | None = None
    ) -> str:
        """A user presses a button (or a client forges an action) on a message; returns the envelope id."""
        stored = self.messages.get((channel, ts))
        message = stored.json() if stored is not None else {"type": "message", "ts": ts, "text": ""}
        block_id = "forged"
        label = "?"
        if stored is not None:
            for b in stored.blocks:
                for e in b.get("elements", []):
                    if e.get("type") == "button" and e.get("value") == value:
                        block_id, label = b.get("block_id", ""), e["text"]["text"]
        name = self.users.get(user, user.lower())
        payload = {
            "type": "block_actions",
            "user": {"id": user, "username": name, "name": name, "team_id": TEAM},
            "api_app_id": APP_ID,
            "token": "unused",
            "container": {"type": "message", "message_ts": ts, "channel_id": channel, "is_ephemeral": False},
            "trigger_id": f"{uuid.uuid4().int % 10**12}.{TEAM}",
            "team": {"id": TEAM, "domain": "emulated"},
            "channel": {"id": channel, "name": self.channels.get(channel, {}).get("name", "unknown")},
            "message": message,
            "response_url": self._response_url(channel, user, ts),
            "actions": [
                {
                    "action_id": action_id or value,
                    "block_id": block_id,
                    "text": {"type": "plain_text", "text": label, "emoji": True},
                    "value": value,
                    "type": "button",
                    "action_ts": str(time.time()),
                }
            ],
        }
        return await self._send_envelope("interactive", payload, accepts_response_payload=False)

    # -- queries for tests ---------------------------------------------------------------
    def bot_messages(self, channel: str | None = None, *, top_level: bool = False) -> list[SlackMessage]:
        return [
            m
            for m in self.messages.values()
            if m.bot
            and (channel is None or m.channel == channel)
            and (not top_level or m.thread_ts is None or m.reply_broadcast)
        ]

    def thread(self, channel: str, ts: str) -> list[SlackMessage]:
        return [m for m in self.messages.values() if m.channel == channel and m.thread_ts == ts]

    def ephemerals_for(self, user: str) -> list[Ephemeral]:
        return [e for e in self.ephemerals if e.user == user]

    def calls_of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def first_call_after(self, seq: int) -> Call | None:
        return next((c for c in self.calls if c.seq > seq), None)

    async def wait_for(self, pred: Callable[[], Any], what: str, within: float = 60.0) -> Any:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            got = pred()
            if got:
                return got
            await asyncio.sleep(0.05)
        raise AssertionError(f"slack emulator: timed out waiting for {what}")

    # -- the Web API -------------------------------------------------------------------------
    async def _params(self, request: web.Request) -> dict[str, Any]:
        params: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            raw = await request.json()
            if isinstance(raw, dict):
                params.update(raw)
        elif request.can_read_body:
            form = await request.post()
            params.update({k: v for k, v in form.items() if isinstance(v, str)})
        return params

    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await self._params(request)
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else str(params.pop("token", ""))
        self.calls.append(Call(method, params, token, next(self._seq), time.time()))
        headers = {"x-oauth-scopes": self.scopes, "x-accepted-oauth-scopes": ""}
        try:
            self._authorize(method, token)
            self._inject_failure(method)
            handler = getattr(self, "_api_" + method.replace(".", "_"), None)
            if handler is None:
                raise ApiError("unknown_method", status=404)
            result = await handler(params)
        except ApiError as exc:
            body: dict[str, Any] = {"ok": False, "error": exc.error, **exc.extra}
            if exc.retry_after is not None:
                headers["Retry-After"] = str(exc.retry_after)
            return web.json_response(body, status=exc.status, headers=headers)
        return web.json_response({"ok": True, **result}, headers=headers)

    def _authorize(self, method: str, token: str) -> None:
        if not token:
            raise ApiError("not_authed")
        if method == "apps.connections.open":
            if token == self.bot_token:
                raise ApiError("not_allowed_token_type")
            if token != self.app_token:
                raise ApiError("invalid_auth")
            return
        if method in BOT_METHODS and token != self.bot_token:
            raise ApiError("not_allowed_token_type" if token == self.app_token else "invalid_auth")
        needed = {
            "chat.postMessage": "chat:write",
            "chat.update": "chat:write",
            "chat.postEphemeral": "chat:write",
            "files.getUploadURLExternal": "files:write",
            "files.completeUploadExternal": "files:write",
            "users.info": "users:read",
        }.get(method)
        if needed is not None and needed not in self.scopes.split(","):
            raise ApiError("missing_scope", needed=needed, provided=self.scopes)

    def _inject_failure(self, method: str) -> None:
        queue = self.failures.get(method)
        if not queue:
            return
        f = queue[0]
        f.times -= 1
        if f.times <= 0:
            queue.pop(0)
        raise ApiError(f.error, status=f.status, retry_after=f.retry_after, **f.extra)

    def _channel(self, params: dict[str, Any], key: str = "channel") -> str:
        channel = str(params.get(key) or "")
        info = self.channels.get(channel)
        if info is None:
            raise ApiError("channel_not_found")
        if info["archived"]:
            raise ApiError("is_archived")
        if not info["member"]:
            raise ApiError("not_in_channel")
        return channel

    def _blocks(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        raw = params.get("blocks")
        if raw is None:
            return []
        blocks = json.loads(raw) if isinstance(raw, str) else raw
        errors = block_errors(blocks)
        if errors:
            raise ApiError("invalid_blocks", errors=errors)
        return list(blocks)

    def _text(self, params: dict[str, Any], blocks: list[dict[str, Any]]) -> str:
        text = str(params.get("text") or "")
        if not text and not blocks:
            raise ApiError("no_text")
        if len(text) > 40000:
            raise ApiError("msg_too_long")
        return text

    async def _api_auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": "https://emulated.slack.com/",
            "team": "emulated",
            "user": BOT_NAME,
            "team_id": TEAM,
            "user_id": BOT_USER,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }

    async def _api_apps_connections_open(self, params: dict[str, Any]) -> dict[str, Any]:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        self.connections_opened += 1
        return {"url": f"ws://127.0.0.1:{self.port}/link/?ticket={ticket}&app_id={APP_ID}"}

    async def _api_chat_postMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(params)
        blocks = self._blocks(params)
        text = self._text(params, blocks)
        thread_ts = params.get("thread_ts") or None
        if thread_ts is not None and (channel, thread_ts) not in self.messages:
            raise ApiError("thread_not_found")
        ts = self._next_ts()
        m = SlackMessage(
            channel,
            ts,
            text,
            blocks,
            thread_ts=thread_ts,
            reply_broadcast=bool(params.get("reply_broadcast")),
        )
        self.messages[(channel, ts)] = m
        return {"channel": channel, "ts": ts, "message": m.json()}

    async def _api_chat_update(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(params)
        m = self.messages.get((channel, str(params.get("ts"))))
        if m is None:
            raise ApiError("message_not_found")
        if not m.bot:
            raise ApiError("cant_update_message")
        blocks = self._blocks(params)
        text = self._text(params, blocks)
        m.edits.append({"text": text, "blocks": blocks})
        m.text, m.blocks = text, blocks
        return {"channel": channel, "ts": m.ts, "text": text, "message": m.json()}

    async def _api_chat_postEphemeral(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(params)
        blocks = self._blocks(params)
        text = self._text(params, blocks)
        user = str(params.get("user") or "")
        if user not in self.users:
            raise ApiError("user_not_in_channel")
        self.ephemerals.append(Ephemeral(channel, user, text, blocks, "chat.postEphemeral", next(self._seq)))
        return {"message_ts": self._next_ts()}

    async def _api_users_info(self, params: dict[str, Any]) -> dict[str, Any]:
        user = str(params.get("user") or "")
        if user not in self.users:
            raise ApiError("user_not_found")
        return {
            "user": {
                "id": user,
                "team_id": TEAM,
                "name": self.users[user],
                "real_name": self.users[user].title(),
            }
        }

    async def _api_files_getUploadURLExternal(self, params: dict[str, Any]) -> dict[str, Any]:
        filename = str(params.get("filename") or "")
        try:
            length = int(params.get("length", ""))
        except ValueError:
            raise ApiError("invalid_arguments") from None
        if not filename or length <= 0:
            raise ApiError("invalid_arguments")
        fid = f"F{next(self._file_ids):08d}"
        self.files[fid] = StoredFile(fid, filename, length, alt_txt=params.get("alt_txt"))
        return {"upload_url": f"http://127.0.0.1:{self.port}/upload/{fid}", "file_id": fid}

    async def _upload(self, request: web.Request) -> web.Response:
        fid = request.match_info["file_id"]
        data = await request.read()
        self.calls.append(
            Call("upload", {"file_id": fid, "bytes": len(data)}, "", next(self._seq), time.time())
        )
        f = self.files.get(fid)
        if f is None:
            return web.Response(status=404, text="not found")
        if len(data) != f.length:
            return web.Response(status=400, text=f"length mismatch: {len(data)} != {f.length}")
        f.data = data
        return web.Response(text=f"OK - {len(data)}", content_type="text/plain")

    async def _api_files_completeUploadExternal(self, params: dict[str, Any]) -> dict[str, Any]:
        try:
            items = json.loads(str(params.get("files") or "[]"))
        except json.JSONDecodeError:
            raise ApiError("invalid_arguments") from None
        files = []
        for item in items:
            f = self.files.get(str(item.get("id")))
            if f is None or f.data is None:
                raise ApiError("file_not_found" if f is None else "file_upload_not_complete")
            f.title = item.get("title") or f.filename
            files.append(f)
        channel = params.get("channel_id") or None
        thread_ts = params.get("thread_ts") or None
        if channel is not None:
            channel = self._channel({"channel": channel})
            if thread_ts is not None and (channel, thread_ts) not in self.messages:
                raise ApiError("thread_not_found")
            for f in files:
                f.channel, f.thread_ts = channel, thread_ts
            ts = self._next_ts()
            self.messages[(channel, ts)] = SlackMessage(
                channel, ts, str(params.get("initial_comment") or ""), thread_ts=thread_ts, files=files
            )
        return {
            "files": [{"id": f.id, "name": f.filename, "title": f.title, "size": f.length} for f in files]
        }

    # -- response_url --------------------------------------------------------------------------
    async def _response(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        r = self.response_urls.get(key)
        body = await request.json()
        self.calls.append(Call("response_url", dict(body), "", next(self._seq), time.time()))
        if r is None:
            return web.Response(status=404, text="no_such_url")
        if r.uses >= 5:
            return web.Response(status=404, text="used_url")
        errors = block_errors(body.get("blocks") or [])
        if errors:
            return web.Response(status=400, text="invalid_blocks")
        r.uses += 1
        r.posts.append(body)
        blocks = list(body.get("blocks") or [])
        text = str(body.get("text") or "")
        if body.get("replace_original") and r.message_ts is not None:
            m = self.messages[(r.channel, r.message_ts)]
            m.edits.append({"text": text, "blocks": blocks})
            m.text, m.blocks = text, blocks
        elif body.get("response_type") == "in_channel":
            ts = self._next_ts()
            self.messages[(r.channel, ts)] = SlackMessage(r.channel, ts, text, blocks)
        else:
            self.ephemerals.append(
                Ephemeral(r.channel, r.user, text, blocks, "response_url", next(self._seq))
            )
        return web.Response(text="ok")

    # -- Socket Mode ---------------------------------------------------------------------------
    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            raise web.HTTPUnauthorized(text="bad ticket")
        self._tickets.discard(ticket)  # a URL is good for one connection
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.append(ws)
        await ws.send_str(
            json.dumps(
                {
                    "type": "hello",
                    "num_connections": len([w for w in self._sockets if not w.closed]),
                    "debug_info": {"host": "emulator", "approximate_connection_time": 18060},
                    "connection_info": {"app_id": APP_ID},
                }
            )
        )
        assert self._socket_up is not None
        self._socket_up.set()
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            try:
                data = json.loads(msg.data)
            except json.JSONDecodeError:
                continue
            env = self.envelopes.get(str(data.get("envelope_id")))
            if env is not None and env.acked_seq is None:
                env.acked_seq = next(self._seq)
                env.acked_at = time.time()
                env.ack_payload = data.get("payload")
        return ws


def block_errors(blocks: Any) -> list[str]:
    """Slack's Block Kit limits for the block types jobdiagd uses; [] when valid."""
    if not isinstance(blocks, list):
        return ["blocks must be an array"]
    errors: list[str] = []
    if len(blocks) > 50:
        errors.append(
            f"must provide an array of no more than 50 items [json-pointer:/blocks] ({len(blocks)})"
        )
    action_ids: set[str] = set()
    block_ids: set[str] = set()
    for i, b in enumerate(blocks):
        where = f"[json-pointer:/blocks/{i}]"
        kind = b.get("type")
        bid = b.get("block_id")
        if bid is not None:
            if bid in block_ids or len(bid) > 255:
                errors.append(f"duplicate or too long block_id {where}")
            block_ids.add(bid)
        if kind == "header":
            t = b.get("text") or {}
            if t.get("type") != "plain_text" or not 0 < len(t.get("text", "")) <= 150:
                errors.append(f"header text must be plain_text of 1..150 characters {where}")
        elif kind == "section":
            t = b.get("text") or {}
            if t.get("type") not in ("mrkdwn", "plain_text") or not 0 < len(t.get("text", "")) <= 3000:
                errors.append(f"section text must be 1..3000 characters {where}")
        elif kind == "context":
            els = b.get("elements") or []
            if not 0 < len(els) <= 10:
                errors.append(f"context needs 1..10 elements {where}")
            for e in els:
                if e.get("type") not in ("mrkdwn", "plain_text", "image") or len(e.get("text", "")) > 3000:
                    errors.append(f"bad context element {where}")
        elif kind == "actions":
            els = b.get("elements") or []
            if not 0 < len(els) <= 25:
                errors.append(f"actions needs 1..25 elements {where}")
            for e in els:
                if e.get("type") != "button":
                    errors.append(f"only buttons here {where}")
                    continue
                text = (e.get("text") or {}).get("text", "")
                aid = e.get("action_id", "")
                if not 0 < len(text) <= 75:
                    errors.append(f"button text must be 1..75 characters {where}")
                if not 0 < len(aid) <= 255 or aid in action_ids:
                    errors.append(f"action_id missing, too long or not unique {where}")
                action_ids.add(aid)
                if len(e.get("value", "")) > 2000:
                    errors.append(f"button value longer than 2000 characters {where}")
                if e.get("style") not in (None, "primary", "danger"):
                    errors.append(f"bad button style {where}")
        elif kind not in ("divider", "image"):
            errors.append(f"unsupported block type {kind!r} {where}")
    return errors
