"""The notifiers as a table of specs (console, JSONL, Telegram, Slack, Alertmanager), built with their secrets.

Adding a notifier (say `matrix`): write `notifiers/matrix.py` (the `notifiers.base.Notifier`
protocol; a chat transport also implements `ChatTransport`, see `jobdiagd.chat`), add its
`[notifiers.matrix]` section to `config.NotifiersConfig` (with `enabled`), and one
`NotifierSpec` row to `NOTIFIERS` below whose factory reads its secrets and raises `NotUsable`
when one is missing. docs/architecture.md § Extension points has the whole recipe.
"""

from __future__ import annotations

import base64
import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from jobdiagd.config import (
    AlertmanagerNotifierConfig,
    Config,
    ConfigError,
    ConsoleNotifierConfig,
    JsonlNotifierConfig,
    NotifiersConfig,
    SlackNotifierConfig,
    TelegramNotifierConfig,
)
from jobdiagd.notifiers.alertmanager import AlertmanagerNotifier, AlertOptions
from jobdiagd.notifiers.base import Notifier
from jobdiagd.notifiers.console import ConsoleNotifier
from jobdiagd.notifiers.jsonl import JsonlNotifier

Env = Mapping[str, str] | None


class Section(Protocol):
    @property
    def enabled(self) -> bool: ...


S = TypeVar("S", bound=Section)


class NotUsable(Exception):
    """A notifier enabled in config that cannot be built (a secret missing); the message says why."""


@dataclass(frozen=True, slots=True)
class NotifierSpec(Generic[S]):
    """One notifier: its `[notifiers.<name>]` section and how to build it from that section."""

    name: str  # as in [notifiers.<name>]; the notifier's own `name`
    section: Callable[[NotifiersConfig], S]
    factory: Callable[[S, Config, Env], Notifier]  # reads its secrets; raises NotUsable

    def build(self, cfg: Config, env: Env) -> Notifier | None:
        """The notifier, or None when its section is not enabled."""
        sec = self.section(cfg.notifiers)
        return self.factory(sec, cfg, env) if sec.enabled else None


def spec(
    name: str, section: Callable[[NotifiersConfig], S], factory: Callable[[S, Config, Env], Notifier]
) -> NotifierSpec[Any]:
    """A row of `NOTIFIERS` (type-checked: the factory takes what the section accessor gives)."""
    row: NotifierSpec[S] = NotifierSpec(name, section, factory)
    return row


def _console(sec: ConsoleNotifierConfig, cfg: Config, env: Env) -> Notifier:
    stream = sys.stdout if sec.stream == "stdout" else sys.stderr
    return ConsoleNotifier(stream, color=sec.color)


def _jsonl(sec: JsonlNotifierConfig, cfg: Config, env: Env) -> Notifier:
    return JsonlNotifier(sec.path)


def _telegram(sec: TelegramNotifierConfig, cfg: Config, env: Env) -> Notifier:
    token = read_secret(sec.token_file, sec.token_credential, env)
    if token is None:
        where = sec.token_file or f"credential {sec.token_credential!r}"
        raise NotUsable(f"no token ({where} missing or empty)")
    # The chat transports load their SDKs only when configured.
    from jobdiagd.notifiers.telegram import TelegramTransport, settings_from_config

    return TelegramTransport(settings_from_config(sec, cfg.chat, token))


def _slack(sec: SlackNotifierConfig, cfg: Config, env: Env) -> Notifier:
    bot = read_secret(sec.token_file, sec.token_credential, env)
    app = read_secret(sec.app_token_file, sec.app_token_credential, env) if sec.commands else None
    if bot is None:
        where = sec.token_file or f"credential {sec.token_credential!r}"
        raise NotUsable(f"no bot token ({where} missing or empty)")
    if sec.commands and app is None:
        where = sec.app_token_file or f"credential {sec.app_token_credential!r}"
        raise NotUsable(f"no app-level token ({where} missing or empty; or set commands = false)")
    from jobdiagd.notifiers.slack import SlackTransport
    from jobdiagd.notifiers.slack import settings_from_config as slack_settings

    return SlackTransport(slack_settings(sec, cfg.chat, bot, app))


def _alertmanager(sec: AlertmanagerNotifierConfig, cfg: Config, env: Env) -> Notifier:
    return build_alertmanager(sec, source=cfg.source)


# In the order they are built.
NOTIFIERS: tuple[NotifierSpec[Any], ...] = (
    spec("console", lambda n: n.console, _console),
    spec("jsonl", lambda n: n.jsonl, _jsonl),
    spec("telegram", lambda n: n.telegram, _telegram),
    spec("slack", lambda n: n.slack, _slack),
    spec("alertmanager", lambda n: n.alertmanager, _alertmanager),
)


def build_notifiers(cfg: Config, env: Env = None) -> tuple[list[Notifier], list[str]]:
    """(notifiers to use, "name: why" for those enabled in config but not usable)."""
    out: list[Notifier] = []
    skipped: list[str] = []
    for spec in NOTIFIERS:
        try:
            built = spec.build(cfg, env)
        except NotUsable as exc:
            skipped.append(f"{spec.name}: {exc}")
            continue
        if built is not None:
            out.append(built)
    return out, skipped


def read_secret(token_file: Path | None, credential: str, env: Mapping[str, str] | None = None) -> str | None:
    """A chat token from a file or a systemd credential; blank (the unit's fallback) means none."""
    env = os.environ if env is None else env
    if token_file is not None:
        path = token_file
    elif credential:
        cred_dir = env.get("CREDENTIALS_DIRECTORY")
        if not cred_dir:
            return None
        path = Path(cred_dir) / credential
    else:
        return None
    try:
        value = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return value or None


def read_authorization(
    auth: str,
    username: str,
    secret_file: Path | None,
    credential: str,
    *,
    where: str,
    env: Mapping[str, str] | None = None,
) -> str | None:
    """The `Authorization` header value for `auth` ("none", "basic", "bearer") with its secret read
    now (Alertmanager, the site Prometheus); a missing or unreadable secret is a ConfigError
    naming `where` and the key, never the secret."""
    if auth == "none":
        return None
    key = "secret_file" if secret_file is not None else "secret_credential"
    try:
        secret = read_secret(secret_file, credential, env)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigError([f"{where} {key}: cannot read the secret: {reason}"]) from None
    if secret is None:
        raise ConfigError([f"{where} {key}: the secret is missing or empty"])
    if not secret.isascii() or not secret.isprintable():
        # It goes into an HTTP header; the value itself is never echoed.
        raise ConfigError([f"{where} {key}: the secret has characters an HTTP header cannot carry"])
    if auth == "bearer":
        return f"Bearer {secret}"
    # RFC 7617 by hand: aiohttp's BasicAuth is deprecated in 3.14, its successor absent before.
    pair = f"{username}:{secret}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


def build_alertmanager(
    cfg: AlertmanagerNotifierConfig, *, source: str = "<config>", env: Mapping[str, str] | None = None
) -> AlertmanagerNotifier:
    """The notifier with its secret read now; a missing or unreadable secret is a ConfigError."""
    authorization = read_authorization(
        cfg.auth,
        cfg.username,
        cfg.secret_file,
        cfg.secret_credential,
        where=f"{source}: [notifiers.alertmanager]",
        env=env,
    )
    options = AlertOptions(
        cluster=cfg.cluster,
        instance=cfg.instance or socket.gethostname(),
        resend_interval=cfg.resend_interval_seconds,
        runbook_url=cfg.runbook_url,
        generator_url=cfg.generator_url,
        watchdog=cfg.watchdog_alert,
    )
    return AlertmanagerNotifier(cfg.urls, options, timeout=cfg.timeout_seconds, authorization=authorization)
