"""Builds the configured notifiers (console, JSONL, Telegram, Slack, Alertmanager) with their secrets read from files or credentials."""

from __future__ import annotations

import base64
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from jobdiagd.config import AlertmanagerNotifierConfig, Config, ConfigError
from jobdiagd.notifiers.alertmanager import AlertmanagerNotifier, AlertOptions
from jobdiagd.notifiers.base import Notifier
from jobdiagd.notifiers.console import ConsoleNotifier
from jobdiagd.notifiers.jsonl import JsonlNotifier


def build_notifiers(cfg: Config, env: Mapping[str, str] | None = None) -> tuple[list[Notifier], list[str]]:
    """(notifiers to use, "name: why" for those enabled in config but not usable)."""
    out: list[Notifier] = []
    skipped: list[str] = []
    n = cfg.notifiers
    if n.console.enabled:
        stream = sys.stdout if n.console.stream == "stdout" else sys.stderr
        out.append(ConsoleNotifier(stream, color=n.console.color))
    if n.jsonl.enabled:
        out.append(JsonlNotifier(n.jsonl.path))
    if n.telegram.enabled:
        token = read_secret(n.telegram.token_file, n.telegram.token_credential, env)
        if token is None:
            where = n.telegram.token_file or f"credential {n.telegram.token_credential!r}"
            skipped.append(f"telegram: no token ({where} missing or empty)")
        else:
            from jobdiagd.notifiers.telegram import TelegramTransport, settings_from_config

            out.append(TelegramTransport(settings_from_config(n.telegram, cfg.chat, token)))
    if n.slack.enabled:
        sl = n.slack
        bot = read_secret(sl.token_file, sl.token_credential, env)
        app = read_secret(sl.app_token_file, sl.app_token_credential, env) if sl.commands else None
        if bot is None:
            where = sl.token_file or f"credential {sl.token_credential!r}"
            skipped.append(f"slack: no bot token ({where} missing or empty)")
        elif sl.commands and app is None:
            where = sl.app_token_file or f"credential {sl.app_token_credential!r}"
            skipped.append(f"slack: no app-level token ({where} missing or empty; or set commands = false)")
        else:
            from jobdiagd.notifiers.slack import SlackTransport
            from jobdiagd.notifiers.slack import settings_from_config as slack_settings

            out.append(SlackTransport(slack_settings(sl, cfg.chat, bot, app)))
    if n.alertmanager.enabled:
        out.append(build_alertmanager(n.alertmanager, source=cfg.source))
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
