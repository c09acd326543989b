"""Builds the configured notifiers; Telegram and Slack are validated in config but not built yet."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from jobdiagd.config import Config
from jobdiagd.notifiers.base import Notifier
from jobdiagd.notifiers.console import ConsoleNotifier
from jobdiagd.notifiers.jsonl import JsonlNotifier

NOT_IMPLEMENTED = ("telegram", "slack")


def build_notifiers(cfg: Config) -> tuple[list[Notifier], list[str]]:
    """(notifiers to use, names enabled in config but not available in this build)."""
    out: list[Notifier] = []
    n = cfg.notifiers
    if n.console.enabled:
        stream = sys.stdout if n.console.stream == "stdout" else sys.stderr
        out.append(ConsoleNotifier(stream, color=n.console.color))
    if n.jsonl.enabled:
        out.append(JsonlNotifier(n.jsonl.path))
    skipped = [name for name in NOT_IMPLEMENTED if getattr(n, name).enabled]
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
