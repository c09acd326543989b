"""Builds the configured notifiers; Slack is validated in config but not built yet."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from jobdiagd.config import Config
from jobdiagd.notifiers.base import Notifier
from jobdiagd.notifiers.console import ConsoleNotifier
from jobdiagd.notifiers.jsonl import JsonlNotifier

NOT_IMPLEMENTED = ("slack",)


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
    skipped += [
        f"{name}: not available in this build" for name in NOT_IMPLEMENTED if getattr(n, name).enabled
    ]
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
