"""Daemon configuration: TOML -> validated frozen dataclasses; every error names the file and the key."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import grp
import ipaddress
import math
import re
import sys
import tomllib
import types
import typing
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from jobdiagd.quiet_hours import parse_quiet_hours, zone
from jobdiagd.rules.hostlist import valid_host
from jobdiagd.tsdb.settings import TsdbSettings, settings_from_mapping
from jobdiagd.tsdb.site import profiles as site_profiles

DEFAULT_CONFIG_PATH = Path("/etc/jobdiagd/config.toml")

# sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH = 107
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_CREDENTIAL_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_SLACK_ID_RE = re.compile(r"^[A-Z0-9]{2,32}$")
_SLASH_RE = re.compile(r"^/[a-z0-9_-]{1,31}$")
_MENTION_RE = re.compile(r"^<(!here|!channel|!everyone|!subteam\^[A-Z0-9]{2,32}|@[A-Z0-9]{2,32})>$")
_LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
# Placeholders an Alertmanager runbook/generator URL may use (filled per alert).
_URL_PLACEHOLDERS = ("alertname", "cluster", "job_id", "kind")


class ConfigError(ValueError):
    """Invalid configuration; `errors` holds one line per problem, each naming the file and key."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


Validator = Callable[[Any], str | None]


def _v(*validators: Validator, under_state_dir: bool = False, secret: bool = False) -> dict[str, Any]:
    # under_state_dir: a relative path is kept relative here and later joined to [daemon] state_dir.
    # secret: the value may be a token pasted in the wrong place; errors never show it.
    return {"validators": validators, "under_state_dir": under_state_dir, "secret": secret}


def _fmt(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, str) else str(value)


class Bounded:
    """Validator of a numeric key: `low <= value <= high`; the error says why the bound exists."""

    def __init__(self, low: float, high: float, why: str, *, exclusive: bool = False) -> None:
        self.low, self.high, self.why, self.exclusive = low, high, why, exclusive

    def __call__(self, value: Any) -> str | None:
        inside = self.low < value < self.high if self.exclusive else self.low <= value <= self.high
        if inside:
            return None
        how = "exclusive; " if self.exclusive else ""
        return f"must be between {_fmt(self.low)} and {_fmt(self.high)} ({how}{self.why}), got {_fmt(value)}"


_DAY = 86400.0
_WEEK = 7 * _DAY
_MONTH = 30 * _DAY


def _names(value: Any) -> str | None:
    bad = [v for v in value if not _NAME_RE.match(v)]
    return f"not valid names: {bad!r}" if bad else None


def _group_exists(value: Any) -> str | None:
    if not value:
        return None
    try:
        grp.getgrnam(value)
    except KeyError:
        return f"no such group {value!r}"
    return None


def _loopback(value: Any) -> str | None:
    if value == "localhost":
        return None
    try:
        if ipaddress.ip_address(value).is_loopback:
            return None
    except ValueError:
        pass
    return f"must be a loopback address (127.0.0.1, ::1 or localhost), got {value!r}"


def _socket_path(value: Any) -> str | None:
    n = len(str(value).encode())
    return None if n <= _MAX_SOCKET_PATH else f"too long for a Unix socket ({n} > {_MAX_SOCKET_PATH} bytes)"


# Shapes of chat tokens: pasted where a path or a credential name belongs, they must not be
# accepted (they would be looked up as a file name) nor echoed in the error.
_TOKEN_RES = (
    ("a Telegram bot token", re.compile(r"^\d{5,}:[A-Za-z0-9_-]{20,}$")),
    ("a Slack token", re.compile(r"^(xox[a-z]|xapp)-[A-Za-z0-9-]{8,}$")),
)
_NOT_SHOWN = "the value is not shown: it may be a secret"


def _token_kind(text: str) -> str | None:
    return next((kind for kind, rx in _TOKEN_RES if rx.match(text.strip())), None)


def _hide_tokens(msg: str, value: Any) -> str:
    """`msg` with every token-shaped string of `value` blanked: a token pasted into any key (not
    only the secret ones) must not reach the error, hence the journal."""
    if isinstance(value, str):
        return msg.replace(value, "<not shown: looks like a token>") if _token_kind(value) else msg
    if isinstance(value, list | tuple):
        for item in value:
            msg = _hide_tokens(msg, item)
    elif isinstance(value, dict):
        for item in value.values():
            msg = _hide_tokens(msg, item)
    return msg


def _credential(value: Any) -> str | None:
    if not value:
        return None
    kind = _token_kind(value)
    if kind is not None:
        return (
            f"looks like {kind}, not a credential name: put the token in a file and name it in "
            f"LoadCredential= ({_NOT_SHOWN})"
        )
    if _CREDENTIAL_RE.match(value):
        return None
    return (
        "must be a systemd credential name (LoadCredential=NAME:...): up to 64 letters, digits, "
        f"'_', '.' or '-', not starting with '.' or '-' ({_NOT_SHOWN})"
    )


def _token_file(value: Any) -> str | None:
    kind = None if value is None else _token_kind(Path(value).name)
    if kind is None:
        return None
    return (
        f"looks like {kind}, not a path: put the token in a file (mode 0600) and give its path ({_NOT_SHOWN})"
    )


def _slack_ids(value: Any) -> str | None:
    bad = [v for v in value if not _SLACK_ID_RE.match(v)]
    return f"not Slack ids (upper-case letters and digits): {bad!r}" if bad else None


def _slack_id(value: Any) -> str | None:
    return (
        None
        if not value or _SLACK_ID_RE.match(value)
        else f"not a Slack id (upper-case letters and digits): {value!r}"
    )


def _slash_command(value: Any) -> str | None:
    return None if _SLASH_RE.match(value) else f"not a slash command like '/jobdiagd': {value!r}"


def _slack_mention(value: Any) -> str | None:
    if not value or all(_MENTION_RE.match(m) for m in value.split()):
        return None
    return f"not Slack mentions (<!here>, <!channel>, <!subteam^ID>, <@USERID>): {value!r}"


def _severities(value: Any) -> str | None:
    bad = [v for v in value if v not in ("info", "warning", "critical")]
    return f"not severities (info, warning, critical): {bad!r}" if bad else None


def _http_url(value: Any) -> str | None:
    if re.match(r"^https?://[A-Za-z0-9.\-\[\]:]+(/[^\s?#]*)?$", value):
        return None
    return f"must be an http(s) URL without query, got {value!r}"


def _quiet_hours(value: Any) -> str | None:
    try:
        parse_quiet_hours(value)
    except ValueError as exc:
        return str(exc)
    return None


def _timezone(value: Any) -> str | None:
    try:
        zone(value)
    except ValueError as exc:
        return str(exc)
    return None
def _http_url_problem(url: str, *, links: bool = False) -> str | None:
    # The URL itself is never echoed: a pasted one may carry credentials.
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a valid URL"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (use secret_file or secret_credential)"
    if not parts.hostname:
        return "has no host"
    if port == 0:
        return "has port 0"
    if (parts.query or parts.fragment) and not links:
        return "must not have a query or fragment"
    return None


def bot_api_root(url: str) -> str:
    """A Bot API server's base URL as the Telegram transport uses it: without a final "/" or
    "/bot" (both are common ways to write it; the transport appends "/bot<token>/<method>")."""
    root = url.strip().rstrip("/")
    if root.endswith("/bot"):
        root = root[: -len("/bot")].rstrip("/")
    return root


def _bot_api_url(value: Any) -> str | None:
    """[notifiers.telegram] api_base_url: "https://host", "https://host/" and "https://host/bot"
    all name the server at https://host; a token in the URL, white space or a query is refused."""
    if re.search(r"\s", value):
        return "must be a URL without white space, e.g. 'https://api.telegram.org'"
    problem = _http_url_problem(value)
    if problem:
        return f"{problem}; give the Bot API server's base URL, e.g. 'https://api.telegram.org'"
    if re.search(r"/bot[^/]*:", urllib.parse.urlsplit(value).path):
        return f"must not contain the bot token: give the server's base URL, not a method URL ({_NOT_SHOWN})"
    return None


def _http_urls(value: Any) -> str | None:
    for i, url in enumerate(value):
        problem = _http_url_problem(url)
        if problem:
            return f"item {i}: {problem}"
    if len(set(value)) != len(value):
        return "lists the same URL twice"
    return None


def _url_template(value: Any) -> str | None:
    if not value:
        return None
    try:
        filled = value.format(**{name: "x" for name in _URL_PLACEHOLDERS})
    except (KeyError, IndexError, ValueError):
        known = ", ".join("{" + n + "}" for n in _URL_PLACEHOLDERS)
        return f"has an unknown or malformed placeholder (known: {known})"
    return _http_url_problem(filled, links=True)


def _site_url(value: Any) -> str | None:
    return _http_url_problem(value) if value else None


def _ssh_host(value: Any) -> str | None:
    if not value or valid_host(value):
        return None
    return f"must be a host name, got {value!r}"


def _host_regex(value: Any) -> str | None:
    if not value:
        return None
    if len(value) != 2:
        return f'must be ["pattern", "replacement"], got {len(value)} item(s)'
    try:
        re.compile(value[0])
    except re.error as exc:
        return f"pattern is not a regular expression: {exc}"
    return None


def _label_value(value: Any) -> str | None:
    if not value or _LABEL_VALUE_RE.match(value):
        return None
    return f"must be 1-128 letters, digits, '_', '.', ':' or '-', got {value!r}"


def _basic_auth_user(value: Any) -> str | None:
    return (
        f"must not contain ':' or control characters, got {value!r}"
        if re.search(r"[:\x00-\x1f]", value)
        else None
    )


# ---------------------------------------------------------------- sections


@dataclass(frozen=True)
class DaemonConfig:
    state_dir: Path = field(default=Path("/var/lib/jobdiagd"))
    tick_seconds: float = field(
        default=15.0,
        metadata=_v(Bounded(0.05, 3600, "shorter only burns CPU; a hang is paged up to one tick late")),
    )
    squeue_interval_seconds: float = field(
        default=30.0,
        metadata=_v(Bounded(1, 3600, "squeue is shared by every user; a job's end is noticed this late")),
    )
    socket_path: Path = field(default=Path("/run/jobdiagd/jobdiagd.sock"), metadata=_v(_socket_path))
    # Empty: the socket is 0600 (owner only); a group name: chgrp + 0660.
    socket_group: str = field(default="", metadata=_v(_group_exists))
    metrics_host: str = field(default="127.0.0.1", metadata=_v(_loopback))
    metrics_port: int = field(
        default=0, metadata=_v(Bounded(0, 65535, "a TCP port; 0 turns the endpoint off"))
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"


@dataclass(frozen=True)
class SlurmConfig:
    backend: Literal["cli", "pyslurm", "auto"] = "auto"
    users: tuple[str, ...] = field(default=(), metadata=_v(_names))  # empty: every user
    partitions: tuple[str, ...] = field(default=(), metadata=_v(_names))  # empty: every partition
    outputs_roots: tuple[Path, ...] = ()
    # squeue/scontrol are killed after this long (a dead slurmctld makes them block for minutes).
    command_timeout_seconds: float = field(
        default=20.0, metadata=_v(Bounded(0.1, 600, "a tick waits this long for a stuck slurmctld"))
    )
    # Exported as SLURM_CONF for the commands; unset: Slurm's own default lookup.
    slurm_conf: Path | None = None


@dataclass(frozen=True)
class HangConfig:
    enabled: bool = True
    min_stall_seconds: float = field(
        default=120.0,
        metadata=_v(Bounded(1, _WEEK, "a stall is a page within a week (7 days) or not at all")),
    )
    # A job is stalled when no step completed for stall_factor x its typical step time.
    stall_factor: float = field(
        default=3.0, metadata=_v(Bounded(1, 100, "below 1 every normal step would be a stall"))
    )
    # Before the first step (compilation, restore, barrier) allow this long.
    startup_grace_seconds: float = field(
        default=1800.0,
        metadata=_v(Bounded(0, _WEEK, "a job that has not started in a week (7 days) is hung")),
    )
    # Extra allowance for the step that overlaps a periodic checkpoint write.
    checkpoint_budget_seconds: float = field(
        default=900.0, metadata=_v(Bounded(0, _DAY, "a checkpoint write of over a day (86400 s) is a hang"))
    )


@dataclass(frozen=True)
class TgsConfig:
    enabled: bool = True
    drop_pct: float = field(default=10.0, metadata=_v(Bounded(0, 100, "a percentage", exclusive=True)))
    # Steady-state baseline: steps baseline_first_step..baseline_last_step (runbook: steps 5-15).
    baseline_first_step: int = field(
        default=5, metadata=_v(Bounded(0, 1_000_000, "a step number of a real training run"))
    )
    baseline_last_step: int = field(
        default=15, metadata=_v(Bounded(0, 1_000_000, "a step number of a real training run"))
    )
    recent_steps: int = field(
        default=10, metadata=_v(Bounded(1, 10_000, "the window is kept in memory for every job"))
    )


@dataclass(frozen=True)
class ToggleConfig:
    enabled: bool = True


@dataclass(frozen=True)
class DetectorsConfig:
    hang: HangConfig = field(default_factory=HangConfig)
    tgs: TgsConfig = field(default_factory=TgsConfig)
    failure_signature: ToggleConfig = field(default_factory=ToggleConfig)
    job_end: ToggleConfig = field(default_factory=ToggleConfig)

    def enabled(self) -> dict[str, bool]:
        """Detector name (as in [detectors.<name>]) -> enabled."""
        return {f.name: bool(getattr(self, f.name).enabled) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class IncidentsConfig:
    reminder_interval_seconds: float = field(
        default=3600.0, metadata=_v(Bounded(10, _MONTH, "more often is spam; over 30 days is silence"))
    )
    max_reminders: int = field(
        default=0, metadata=_v(Bounded(0, 10_000, "0 means no limit"))
    )  # 0 = unlimited
    notify_resolve: bool = True
    default_mute_seconds: float = field(
        default=3600.0, metadata=_v(Bounded(60, _MONTH, "a mute should end on its own, within 30 days"))
    )


@dataclass(frozen=True)
class DeliveryConfig:
    retry_initial_seconds: float = field(
        default=5.0, metadata=_v(Bounded(0.1, 3600, "shorter hammers a failing destination"))
    )
    retry_max_seconds: float = field(
        default=300.0,
        metadata=_v(Bounded(0.1, _DAY, "a page waits up to this long after a fault; at most a day")),
    )
    give_up_after_seconds: float = field(
        default=86400.0, metadata=_v(Bounded(60, _MONTH, "a page older than 30 days is no longer news"))
    )
    send_timeout_seconds: float = field(
        default=10.0, metadata=_v(Bounded(0.1, 600, "a stuck send holds its notifier's queue this long"))
    )
    # Delivered notifications and the chat-message links of resolved incidents are history once
    # nobody will press their buttons; kept this long, then pruned hourly so the store stays small.
    keep_history_seconds: float = field(
        default=30 * _DAY,
        metadata=_v(
            Bounded(_DAY, 365 * _DAY, "under a day loses buttons of fresh pages; over a year is a leak")
        ),
    )


@dataclass(frozen=True)
class ConsoleNotifierConfig:
    enabled: bool = True
    color: Literal["auto", "always", "never"] = "auto"
    stream: Literal["stdout", "stderr"] = "stderr"


@dataclass(frozen=True)
class JsonlNotifierConfig:
    enabled: bool = False
    path: Path = field(default=Path("notifications.jsonl"), metadata=_v(under_state_dir=True))


@dataclass(frozen=True)
class TelegramRouteConfig:
    """[[notifiers.telegram.routes]]: notifications matching every listed field go to `chat`."""

    chat: int = 0
    kinds: tuple[str, ...] = ()  # incident kinds (hang, tgs-degradation, job-end, notice, ...)
    severities: tuple[str, ...] = field(default=(), metadata=_v(_severities))
    owners: tuple[str, ...] = field(default=(), metadata=_v(_names))  # Slurm users owning the job


@dataclass(frozen=True)
class TelegramNotifierConfig:
    enabled: bool = False
    token_file: Path | None = field(default=None, metadata=_v(_token_file, secret=True))
    # Name passed to systemd LoadCredential=; read from $CREDENTIALS_DIRECTORY/<name>.
    token_credential: str = field(default="", metadata=_v(_credential, secret=True))
    # Chats the bot posts to and takes commands from (a group's id is negative).
    chat_ids: tuple[int, ...] = ()
    # Users whose commands and button presses are obeyed (in the chats above); empty: nobody's.
    allowed_users: tuple[int, ...] = ()
    # Users allowed to press "scancel" (also needs [chat] scancel_button = true).
    operators: tuple[int, ...] = ()
    # Where notifications go when no route matches (default: the first of chat_ids).
    default_chat: int | None = None
    routes: tuple[TelegramRouteConfig, ...] = ()
    # Bot API server: a site's own `telegram-bot-api`, or a test emulator.
    # "https://host", "https://host/" and "https://host/bot" mean the same (config.bot_api_root).
    api_base_url: str = field(default="https://api.telegram.org", metadata=_v(_bot_api_url))
    # Long polling for commands and buttons; false: send-only.
    commands: bool = True
    poll_timeout_seconds: float = field(
        default=30.0, metadata=_v(Bounded(1, 300, "one long-poll request; Telegram holds it at most this long"))
    )


@dataclass(frozen=True)
class ChatConfig:
    """[chat]: settings every chat transport shares."""

    # "22:00-07:00": only critical alerts ring in this window (others arrive silently).
    quiet_hours: str = field(default="", metadata=_v(_quiet_hours))
    timezone: str = field(default="", metadata=_v(_timezone))  # IANA name; empty: host local time
    command_timeout_seconds: float = field(
        default=120.0, metadata=_v(Bounded(5, 3600, "a chat command is killed after this long"))
    )
    max_running_commands: int = field(
        default=2, metadata=_v(Bounded(1, 64, "each runs a triage process; the login node is shared"))
    )
    max_queued_commands: int = field(
        default=8, metadata=_v(Bounded(0, 1000, "commands beyond it are refused as busy"))
    )
    # A "scancel" button on incident messages, for the transports' operators only, with confirmation.
    scancel_button: bool = False


_RECOVERY_MODES = ("off", "suggest", "auto", "dry-run")
RecoveryMode = Literal["off", "suggest", "auto", "dry-run"]
_ENV_ASSIGN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}=[^\x00\n]{0,1024}$")


def _owners(value: Any) -> str | None:
    return _names([v for v in value if v != "*"])


_CHAT_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}=[A-Za-z0-9_-]{1,64}$")


def _chat_users(value: Any) -> str | None:
    bad = [v for v in value if not _CHAT_USER_RE.match(v)]
    return f"not SLURM_USER=CHAT_USER_ID pairs: {bad!r}" if bad else None


def _env_assignments(value: Any) -> str | None:
    bad = [v for v in value if not _ENV_ASSIGN_RE.match(v)]
    return f"not KEY=VALUE assignments: {bad!r}" if bad else None


@dataclass(frozen=True)
class RecoveryOverrideConfig:
    """[[recovery.overrides]]: a job whose owner is in `users` (or any owner, when empty) and whose
    partition is in `partitions` (or any) gets `mode`; the first matching override wins."""

    users: tuple[str, ...] = field(default=(), metadata=_v(_names))
    partitions: tuple[str, ...] = field(default=(), metadata=_v(_names))
    mode: RecoveryMode = "off"


@dataclass(frozen=True)
class RecoveryConfig:
    """[recovery]: restart hung or failed jobs under guardrails (docs/recovery.md). Off by default.

    A job is acted on only when its owner opted in: listed in `users`, or matched by an override
    naming them (rule REC-3). `mode` is the site's mode for opted-in owners on `partitions` (empty:
    any partition); `dry_run = true` turns every `auto` into `dry-run` (log and post, never act)."""

    mode: RecoveryMode = "off"
    users: tuple[str, ...] = field(default=(), metadata=_v(_owners))  # "*": every owner
    partitions: tuple[str, ...] = field(default=(), metadata=_v(_names))
    overrides: tuple[RecoveryOverrideConfig, ...] = ()
    dry_run: bool = False
    # How a job is restarted: a new job from its own batch script (default), or `scontrol requeue`.
    method: Literal["resubmit", "requeue"] = "resubmit"
    countdown_seconds: float = field(
        default=300.0, metadata=_v(Bounded(0, _DAY, "people need time to press Keep the job; at most a day"))
    )
    # A hang within this long of the chain's previous hang restart is a recurrence (rule REC-5).
    recurrence_window_seconds: float = field(
        default=6 * 3600.0, metadata=_v(Bounded(60, _WEEK, "a recurrence is within a week"))
    )
    max_no_progress_restarts: int = field(
        default=3, metadata=_v(Bounded(1, 100, "restarts of a chain that gained no step (NVRx: 3)"))
    )
    min_progress_steps: int = field(
        default=1, metadata=_v(Bounded(1, 10_000_000, "steps a restart must gain to count as progress"))
    )
    max_actions_per_hour: int = field(
        default=10, metadata=_v(Bounded(1, 10_000, "site-wide restarts per rolling hour"))
    )
    # The first retry of a hang asks for the same nodes (minus suspects) with --nodelist.
    retry_same_nodes: bool = True
    # Added to every resubmitted job's environment (site-specific, e.g. a container image).
    resubmit_env: tuple[str, ...] = field(default=(), metadata=_v(_env_assignments))
    # Suspect-node memory (rule REC-20 to REC-23).
    # Defaults: three hang suspicions within two days (0.63 + 0.79 + 1 = 2.42) or a node-fail and a
    # hang reach the notice; two hang suspicions or one node-fail exclude the node from retries.
    node_half_life_days: float = field(
        default=3.0, metadata=_v(Bounded(0.01, 365, "how fast a node's record fades"))
    )
    node_notice_score: float = field(
        default=2.4, metadata=_v(Bounded(0.1, 1000, "score at which operators are told about a node"))
    )
    node_exclude_score: float = field(
        default=1.5, metadata=_v(Bounded(0.1, 1000, "score at which a node is excluded from retries"))
    )
    # Who may press Drain and Restart as an operator (chat user ids/names, as the transports give them).
    operators: tuple[str, ...] = ()
    # Which chat account is which job owner, for Restart: "SLURM_USER=CHAT_USER_ID" (a Telegram
    # user id, a Slack member id). A chat name is never taken for an owner (anyone can choose one).
    chat_users: tuple[str, ...] = field(default=(), metadata=_v(_chat_users))


@dataclass(frozen=True)
class SlackRouteConfig:
    """[[notifiers.slack.routes]]: notifications matching every listed field go to `channel`."""

    channel: str = field(default="", metadata=_v(_slack_id))
    kinds: tuple[str, ...] = ()
    severities: tuple[str, ...] = field(default=(), metadata=_v(_severities))
    owners: tuple[str, ...] = field(default=(), metadata=_v(_names))


@dataclass(frozen=True)
class SlackNotifierConfig:
    enabled: bool = False
    # The bot token (xoxb-...): a file, or a systemd credential name.
    token_file: Path | None = field(default=None, metadata=_v(_token_file, secret=True))
    token_credential: str = field(default="", metadata=_v(_credential, secret=True))
    # The app-level token (xapp-..., scope connections:write) for Socket Mode; needed when commands = true.
    app_token_file: Path | None = field(default=None, metadata=_v(_token_file, secret=True))
    app_token_credential: str = field(default="", metadata=_v(_credential, secret=True))
    # Channels the app posts to and takes commands from (ids, e.g. C0123456789).
    channel_ids: tuple[str, ...] = field(default=(), metadata=_v(_slack_ids))
    # Users whose commands and button presses are obeyed (in the channels above); empty: nobody's.
    allowed_users: tuple[str, ...] = field(default=(), metadata=_v(_slack_ids))
    # Users allowed to press "scancel" (also needs [chat] scancel_button = true).
    operators: tuple[str, ...] = field(default=(), metadata=_v(_slack_ids))
    # Where notifications go when no route matches (default: the first of channel_ids).
    default_channel: str = field(default="", metadata=_v(_slack_id))
    routes: tuple[SlackRouteConfig, ...] = ()
    # Web API base URL: GovSlack / an enterprise gateway, or a test emulator.
    api_base_url: str = field(default="https://slack.com/api/", metadata=_v(_http_url))
    # Socket Mode intake of the slash command, @mentions and buttons; false: send-only.
    commands: bool = True
    slash_command: str = field(default="/jobdiagd", metadata=_v(_slash_command))
    # Prepended to pages that ring (not info, not below critical in quiet hours): "<!here>",
    # "<!channel>", a user group "<!subteam^S0123>" or users "<@U0123>"; empty: none.
    page_mention: str = field(default="", metadata=_v(_slack_mention))


@dataclass(frozen=True)
class AlertmanagerNotifierConfig:
    enabled: bool = False
    # Every instance of one Alertmanager cluster: HA peers do not share alerts, each must get them.
    urls: tuple[str, ...] = field(default=(), metadata=_v(_http_urls))
    # `cluster` label on every alert (required when enabled); two daemons of an HA pair use the same.
    cluster: str = field(default="", metadata=_v(_label_value))
    # `instance` label on alerts about the daemon itself ("": this host's name).
    instance: str = field(default="", metadata=_v(_label_value))
    # Firing alerts expire 4 intervals after their last post: a long one leaves them firing that
    # long after the daemon died, and a short one floods Alertmanager.
    resend_interval_seconds: float = field(
        default=60.0, metadata=_v(Bounded(1, 900, "alerts expire 4 intervals after the daemon dies"))
    )
    timeout_seconds: float = field(
        default=4.0, metadata=_v(Bounded(0.1, 300, "a hung instance holds the queue this long"))
    )
    runbook_url: str = field(default="", metadata=_v(_url_template))
    generator_url: str = field(default="", metadata=_v(_url_template))
    watchdog_alert: bool = False
    auth: Literal["none", "basic", "bearer"] = "none"
    username: str = field(default="", metadata=_v(_basic_auth_user))
    secret_file: Path | None = field(default=None, metadata=_v(_token_file, secret=True))
    secret_credential: str = field(default="", metadata=_v(_credential, secret=True))


def _site_metric(role: str) -> Callable[[Any], Any]:
    """The parser of one `[site_prometheus.metrics.<role>]` table (the keys a role may override)."""
    return functools.partial(site_profiles.check_override, role)


def _site_metric_field(role: str) -> Any:
    """A `[site_prometheus.metrics.<role>]` table: empty unless the site overrides the role."""
    return field(default_factory=dict, metadata={"table_parser": _site_metric(role)})


@dataclass(frozen=True)
class SiteMetricsConfig:
    """[site_prometheus.metrics.<role>]: overrides of the profile's map, per role (all optional):
    name (a metric, a list of them summed, or "" to leave the role unmapped), host_label,
    gpu_label, job_label, model_label, scale (to watts, percent, bytes, per second), counter."""

    power: Mapping[str, Any] = _site_metric_field("power")
    util: Mapping[str, Any] = _site_metric_field("util")
    mem_activity: Mapping[str, Any] = _site_metric_field("mem_activity")
    vram_used: Mapping[str, Any] = _site_metric_field("vram_used")
    processes: Mapping[str, Any] = _site_metric_field("processes")
    io_pressure: Mapping[str, Any] = _site_metric_field("io_pressure")
    mem_pressure: Mapping[str, Any] = _site_metric_field("mem_pressure")
    tcp_retrans: Mapping[str, Any] = _site_metric_field("tcp_retrans")
    rdma_retrans: Mapping[str, Any] = _site_metric_field("rdma_retrans")

    def overrides(self) -> dict[str, Mapping[str, Any]]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name)}


@dataclass(frozen=True)
class SitePrometheusConfig:
    """[site_prometheus]: the site's central Prometheus as a source for every job (tsdb/site/)."""

    enabled: bool = False
    url: str = field(default="", metadata=_v(_site_url))
    # Reach the URL through this host (the ssh tunnel pool of [tsdb.ssh]); "": directly.
    ssh_host: str = field(default="", metadata=_v(_ssh_host))
    profile: Literal["dcgm", "amd", "generic"] = "dcgm"
    host_rewrite: Literal["exact", "short", "regex"] = "short"
    # ["pattern", "replacement"] turning a Slurm node name into the exporter's host label (regex).
    host_regex: tuple[str, ...] = field(default=(), metadata=_v(_host_regex))
    # Every job holds its nodes whole (partitions with OverSubscribe=EXCLUSIVE): no shared nodes.
    exclusive_nodes: bool = False
    scrape_interval_seconds: float = field(
        default=15.0, metadata=_v(Bounded(1, 600, "the site's slowest scrape interval of these exporters"))
    )
    max_in_flight: int = field(
        default=4, metadata=_v(Bounded(1, 64, "queries at once on a Prometheus every job shares"))
    )
    timeout_seconds: float = field(
        default=5.0, metadata=_v(Bounded(0.1, 120, "an unanswered query is an unknown verdict"))
    )
    # A GPU holding less framebuffer than this has no training process (the dead-node stand-in).
    idle_vram_gib: float = field(default=2.0, metadata=_v(Bounded(0, 1024, "GiB of GPU memory")))
    auth: Literal["none", "basic", "bearer"] = "none"
    username: str = field(default="", metadata=_v(_basic_auth_user))
    secret_file: Path | None = field(default=None, metadata=_v(_token_file, secret=True))
    secret_credential: str = field(default="", metadata=_v(_credential, secret=True))
    metrics: SiteMetricsConfig = field(default_factory=SiteMetricsConfig)


WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


@dataclass(frozen=True)
class DigestConfig:
    """[goodput.digest]: the weekly goodput digest, a silent report to a chat or channel (rules
    GP-13, GP-14). Where it goes is a route like any notification's: kind "goodput-digest"."""

    enabled: bool = False
    # When it is sent: this day and hour, local time of `timezone` (empty: [chat] timezone, else
    # the host's); a daemon down then sends it when back within a day, else skips that week.
    weekday: Literal["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"] = "monday"
    hour: int = field(default=9, metadata=_v(Bounded(0, 23, "an hour of the day")))
    timezone: str = field(default="", metadata=_v(_timezone))
    # The archive it accounts: these outputs roots; empty: [slurm] outputs_roots.
    outputs_roots: tuple[Path, ...] = ()
    # The ledger's cache (what `jobdiagd goodput --config` shares); unset: <state_dir>/goodput-cache.
    cache_dir: Path | None = None
    # Ask Slurm's accounting (sacct) when each run was submitted, started and ended.
    accounting: bool = True
    # Hangs this daemon did not page: replay their logs to find when it would have (cached per log).
    replay: bool = True
    timeout_seconds: float = field(
        default=3600.0,
        metadata=_v(Bounded(60, _DAY, "a first run reads every log of the archive; later ones use the cache")),
    )


@dataclass(frozen=True)
class GoodputConfig:
    digest: DigestConfig = field(default_factory=DigestConfig)


@dataclass(frozen=True)
class NotifiersConfig:
    console: ConsoleNotifierConfig = field(default_factory=ConsoleNotifierConfig)
    jsonl: JsonlNotifierConfig = field(default_factory=JsonlNotifierConfig)
    telegram: TelegramNotifierConfig = field(default_factory=TelegramNotifierConfig)
    slack: SlackNotifierConfig = field(default_factory=SlackNotifierConfig)
    alertmanager: AlertmanagerNotifierConfig = field(default_factory=AlertmanagerNotifierConfig)


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    detectors: DetectorsConfig = field(default_factory=DetectorsConfig)
    incidents: IncidentsConfig = field(default_factory=IncidentsConfig)
    delivery: DeliveryConfig = field(default_factory=DeliveryConfig)
    notifiers: NotifiersConfig = field(default_factory=NotifiersConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    # One schema for [tsdb], shared with `jobdiagd diagnose --config` (jobdiagd.tsdb.settings).
    tsdb: TsdbSettings = field(default_factory=TsdbSettings, metadata={"table_parser": settings_from_mapping})
    site_prometheus: SitePrometheusConfig = field(default_factory=SitePrometheusConfig)
    goodput: GoodputConfig = field(default_factory=GoodputConfig)
    source: str = field(default="<defaults>", compare=False)


# ---------------------------------------------------------------- loading


def load(path: str | Path) -> Config:
    """Read and validate a TOML file; raises ConfigError naming the file and every bad key."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read: {exc.strerror or exc}"]) from exc
    return loads(text, source=str(p), base_dir=p.resolve().parent)


def loads(text: str, *, source: str = "<string>", base_dir: Path | None = None) -> Config:
    """Validate TOML text; relative paths resolve against `base_dir` (the config file's folder)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{source}: invalid TOML: {exc}"]) from exc
    ctx = _Ctx(source=source, base_dir=base_dir or Path.cwd())
    values = ctx.build(Config, raw, section=(), skip={"source"})
    if ctx.errors:
        raise ConfigError(ctx.errors)
    cfg = typing.cast(Config, values)
    cfg = dataclasses.replace(cfg, source=source)
    _cross_check(cfg, ctx)
    if ctx.errors:
        raise ConfigError(ctx.errors)
    return _resolve_state_paths(cfg)


# Keys the running daemon cannot apply on SIGHUP: they need a restart.
RESTART_KEYS: tuple[tuple[str, str], ...] = (
    ("daemon", "state_dir"),
    ("daemon", "socket_path"),
    ("daemon", "socket_group"),
    ("daemon", "metrics_host"),
    ("daemon", "metrics_port"),
    ("slurm", "backend"),
    ("notifiers", "telegram"),
    ("notifiers", "slack"),
    ("chat", "quiet_hours"),
    ("chat", "timezone"),
    ("chat", "scancel_button"),
    ("chat", "command_timeout_seconds"),
    ("chat", "max_running_commands"),
    ("chat", "max_queued_commands"),
    # The early page's confirmer (service.early_page) is built once, with the TSDB enricher.
    ("tsdb", "early_page"),
    ("tsdb", "early_overdue_factor"),
    ("tsdb", "early_overdue_slack_s"),
    ("tsdb", "early_scrape_interval_s"),
    ("tsdb", "early_max_concurrent"),
    # The site source (tsdb/site) is built once, its map checked at start-up.
    *(("site_prometheus", f.name) for f in dataclasses.fields(SitePrometheusConfig)),
)


def restart_required(old: Config, new: Config) -> list[str]:
    """'[section] key' for every changed key that a reload cannot apply (for the SIGHUP handler's log)."""
    return [
        f"[{section}] {key}"
        for section, key in RESTART_KEYS
        if getattr(getattr(old, section), key) != getattr(getattr(new, section), key)
    ]


def default_config() -> Config:
    return _resolve_state_paths(Config())


def load_for_command(path: str | Path | None, command: str) -> Config | None:
    """The config `jobdiagd COMMAND` runs with: the file at `path`, else the built-in defaults.

    A config that does not load is reported as one line, `jobdiagd COMMAND: <every problem>`, on
    stderr, and None is returned: the command then exits 2 (a usage error, as argparse's)."""
    try:
        return load(path) if path else default_config()
    except ConfigError as exc:
        print(f"jobdiagd {command}: {exc}", file=sys.stderr)
        return None


# What a field builder returns when the key's problem was reported: the field keeps its default.
_REPORTED = object()


@dataclass
class _Ctx:
    source: str
    base_dir: Path
    errors: list[str] = field(default_factory=list)

    def error(self, section: tuple[str, ...], key: str | None, msg: str) -> None:
        where = f"[{'.'.join(section)}] " if section else ""
        self.errors.append(f"{self.source}: {where}{key + ': ' if key else ''}{msg}")

    def build(self, cls: type[Any], raw: Mapping[str, Any], section: tuple[str, ...], skip: set[str]) -> Any:
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
        self._report_unknown(raw, list(fields), section)
        kwargs: dict[str, Any] = {}
        for name, f in fields.items():
            if name in raw:
                value = self._build_field(f, hints[name], raw[name], section)
                if value is not _REPORTED:
                    kwargs[name] = value
        try:
            return cls(**kwargs)
        except TypeError as exc:  # only reachable through a bug in this module
            self.error(section, None, str(exc))
            return cls()

    def _report_unknown(self, raw: Mapping[str, Any], known: list[str], section: tuple[str, ...]) -> None:
        for key in raw:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                if isinstance(raw[key], dict):
                    where = ".".join((*section, key))
                    self.errors.append(f"{self.source}: [{where}]: unknown section{hint}")
                else:
                    self.error(section, key, f"unknown key{hint}")

    def _build_field(self, f: dataclasses.Field[Any], tp: Any, value: Any, section: tuple[str, ...]) -> Any:
        """The field's value from the file, or _REPORTED once its problem is in `errors`."""
        name = f.name
        parser = f.metadata.get("table_parser")
        if parser is not None:
            return self._parse_table(parser, name, value, section)
        item_tp = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else None
        if item_tp is not None and dataclasses.is_dataclass(item_tp):
            return self._build_table_list(typing.cast(type[Any], item_tp), name, value, section)
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                self.error(section, name, f"must be a table [{'.'.join((*section, name))}]")
                return _REPORTED
            return self.build(typing.cast(type[Any], tp), value, (*section, name), set())
        return self._build_value(f, tp, value, section)

    def _parse_table(
        self, parser: Callable[[Any], Any], name: str, value: Any, section: tuple[str, ...]
    ) -> Any:
        if not isinstance(value, dict):
            self.error(section, name, f"must be a table [{'.'.join((*section, name))}]")
            return _REPORTED
        try:
            return parser(value)
        except (ValueError, TypeError) as exc:  # the parser's message names the table and key
            self.errors.append(f"{self.source}: {_hide_tokens(str(exc), value)}")
            return _REPORTED

    def _build_table_list(self, item_tp: type[Any], name: str, value: Any, section: tuple[str, ...]) -> Any:
        """[[section.name]]: a list of tables, each built and checked like a section."""
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.error(section, name, f"must be a list of tables [[{'.'.join((*section, name))}]]")
            return _REPORTED
        return tuple(self.build(item_tp, v, (*section, f"{name}[{i}]"), set()) for i, v in enumerate(value))

    def _build_value(self, f: dataclasses.Field[Any], tp: Any, value: Any, section: tuple[str, ...]) -> Any:
        """A plain key: converted to the field's type, then checked by its validators (first problem wins)."""
        ok, converted, msg = self.convert(tp, value, keep_relative=bool(f.metadata.get("under_state_dir")))
        if not ok:
            if f.metadata.get("secret"):
                msg = f"must be {_expected(tp)} ({_NOT_SHOWN})"
            self.error(section, f.name, _hide_tokens(msg, value))
            return _REPORTED
        for check in f.metadata.get("validators", ()):
            problem = check(converted)
            if problem:
                self.error(section, f.name, _hide_tokens(problem, value))
                return _REPORTED
        return converted

    def convert(self, tp: Any, value: Any, keep_relative: bool = False) -> tuple[bool, Any, str]:
        origin = typing.get_origin(tp)
        if origin is Literal:
            return _convert_literal(typing.get_args(tp), value)
        if origin in (types.UnionType, typing.Union):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if value == "":
                return True, None, ""
            return self.convert(args[0], value, keep_relative)
        if origin is tuple:
            return self._convert_list(typing.get_args(tp)[0], value)
        scalar = _SCALARS.get(tp)
        if scalar is not None:
            return scalar(value)
        if tp is Path:
            return self._convert_path(value, keep_relative)
        raise TypeError(f"config type not supported: {tp!r}")

    def _convert_list(self, item: Any, value: Any) -> tuple[bool, Any, str]:
        if not isinstance(value, list):
            return False, None, f"must be a list, got {_tname(value)}"
        out = []
        for i, v in enumerate(value):
            ok, c, msg = self.convert(item, v)
            if not ok:
                return False, None, f"item {i}: {msg}"
            out.append(c)
        return True, tuple(out), ""

    def _convert_path(self, value: Any, keep_relative: bool) -> tuple[bool, Any, str]:
        if not isinstance(value, str) or not value:
            return False, None, f"must be a non-empty path string, got {value!r}"
        if "\x00" in value:
            return False, None, "must not contain a NUL character"
        try:
            p = Path(value).expanduser()
        except RuntimeError:  # `~name` of a user this host does not know
            return False, None, f"cannot expand {value.split('/')[0]!r}: no such user's home directory"
        return True, p if p.is_absolute() or keep_relative else self.base_dir / p, ""


def _convert_literal(allowed: tuple[Any, ...], value: Any) -> tuple[bool, Any, str]:
    if value in allowed:
        return True, value, ""
    return False, None, f"must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}"


def _convert_bool(value: Any) -> tuple[bool, Any, str]:
    if isinstance(value, bool):
        return True, value, ""
    return False, None, f"must be true or false, got {value!r}"


def _convert_int(value: Any) -> tuple[bool, Any, str]:
    if isinstance(value, int) and not isinstance(value, bool):
        return True, value, ""
    return False, None, f"must be an integer, got {value!r}"


def _convert_float(value: Any) -> tuple[bool, Any, str]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            return False, None, f"must be a finite number, got {value!r}"
        return True, float(value), ""
    return False, None, f"must be a number, got {value!r}"


def _convert_str(value: Any) -> tuple[bool, Any, str]:
    # A NUL is never part of a name, id, URL or path (the OS refuses it in paths).
    if isinstance(value, str) and "\x00" not in value:
        return True, value, ""
    if isinstance(value, str):
        return False, None, "must not contain a NUL character"
    return False, None, f"must be a string, got {_tname(value)}"


_SCALARS: dict[Any, Callable[[Any], tuple[bool, Any, str]]] = {
    bool: _convert_bool,
    int: _convert_int,
    float: _convert_float,
    str: _convert_str,
}


def _expected(tp: Any) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if args else tp
    return "a path string" if base is Path else "a string"


def _tname(value: Any) -> str:
    names: dict[type, str] = {dict: "a table", list: "a list", str: "a string"}
    return names.get(type(value), type(value).__name__)


def _cross_check(cfg: Config, ctx: _Ctx) -> None:
    tgs = cfg.detectors.tgs
    if tgs.baseline_last_step <= tgs.baseline_first_step:
        ctx.error(
            ("detectors", "tgs"),
            "baseline_last_step",
            f"must be > baseline_first_step ({tgs.baseline_first_step}), got {tgs.baseline_last_step}",
        )
    d = cfg.delivery
    if d.retry_max_seconds < d.retry_initial_seconds:
        ctx.error(
            ("delivery",),
            "retry_max_seconds",
            f"must be >= retry_initial_seconds ({d.retry_initial_seconds})",
        )
    n = cfg.notifiers
    notifier_names = [f.name for f in dataclasses.fields(n)]
    if not any(getattr(n, name).enabled for name in notifier_names):
        ctx.error(("notifiers",), None, f"enable at least one notifier ({', '.join(notifier_names)})")
    for name, sec in (("telegram", n.telegram), ("slack", n.slack)):
        if not sec.enabled:
            continue
        where = ("notifiers", name)
        if (sec.token_file is None) == (not sec.token_credential):
            ctx.error(where, "token_file", "set exactly one of token_file or token_credential")
        targets = "chat_ids" if name == "telegram" else "channel_ids"
        if not getattr(sec, targets):
            ctx.error(where, targets, "must list at least one allowed destination when enabled")
    sl = n.slack
    if sl.enabled and sl.commands and (sl.app_token_file is None) == (not sl.app_token_credential):
        ctx.error(
            ("notifiers", "slack"),
            "app_token_file",
            "set exactly one of app_token_file or app_token_credential (the xapp- token Socket Mode"
            " needs), or commands = false",
        )
    if sl.default_channel and sl.default_channel not in sl.channel_ids:
        ctx.error(("notifiers", "slack"), "default_channel", f"{sl.default_channel} is not in channel_ids")
    for i, sr in enumerate(sl.routes):
        if sr.channel not in sl.channel_ids:
            ctx.error(
                ("notifiers", "slack", f"routes[{i}]"), "channel", f"{sr.channel!r} is not in channel_ids"
            )
    tg = n.telegram
    if tg.default_chat is not None and tg.default_chat not in tg.chat_ids:
        ctx.error(("notifiers", "telegram"), "default_chat", f"{tg.default_chat} is not in chat_ids")
    for i, r in enumerate(tg.routes):
        if r.chat not in tg.chat_ids:
            ctx.error(("notifiers", "telegram", f"routes[{i}]"), "chat", f"{r.chat} is not in chat_ids")
    _check_alertmanager(cfg, ctx)
    _check_site_prometheus(cfg, ctx)


def _check_alertmanager(cfg: Config, ctx: _Ctx) -> None:
    am = cfg.notifiers.alertmanager
    if not am.enabled:
        return
    where = ("notifiers", "alertmanager")
    if not am.urls:
        ctx.error(where, "urls", "must list every Alertmanager instance when enabled")
    if not am.cluster:
        ctx.error(where, "cluster", "must name the cluster when enabled (it is a label on every alert)")
    has_secret = am.secret_file is not None or bool(am.secret_credential)
    if am.auth == "none":
        if has_secret or am.username:
            ctx.error(where, "auth", 'is "none" but username/secret_file/secret_credential is set')
    elif (am.secret_file is None) == (not am.secret_credential):
        ctx.error(
            where, "secret_file", f'set exactly one of secret_file or secret_credential (auth = "{am.auth}")'
        )
    if am.auth == "basic" and not am.username:
        ctx.error(where, "username", 'must be set for auth = "basic"')
    if am.auth == "bearer" and am.username:
        ctx.error(where, "username", 'is only used with auth = "basic"')
    send = cfg.delivery.send_timeout_seconds
    if 2 * am.timeout_seconds > send:
        # A send may wait for a re-post round in flight before its own request.
        ctx.error(
            where,
            "timeout_seconds",
            f"must be at most half of [delivery] send_timeout_seconds ({_fmt(send)}), got {_fmt(am.timeout_seconds)}",
        )


def _check_site_prometheus(cfg: Config, ctx: _Ctx) -> None:
    sp = cfg.site_prometheus
    where = ("site_prometheus",)
    if sp.host_rewrite == "regex" and len(sp.host_regex) != 2:
        ctx.error(where, "host_regex", 'must be ["pattern", "replacement"] for host_rewrite = "regex"')
    if sp.host_regex and sp.host_rewrite != "regex":
        ctx.error(where, "host_regex", 'is only used with host_rewrite = "regex"')
    try:
        site_profiles.resolve(sp.profile, sp.metrics.overrides())
    except ValueError as exc:
        ctx.errors.append(f"{ctx.source}: {exc}")
    if sp.timeout_seconds > sp.scrape_interval_seconds:
        ctx.error(
            where,
            "timeout_seconds",
            f"must be at most scrape_interval_seconds ({_fmt(sp.scrape_interval_seconds)}): one query per "
            f"job per interval, got {_fmt(sp.timeout_seconds)}",
        )
    if not sp.enabled:
        return
    if not sp.url:
        ctx.error(where, "url", "must name the site Prometheus when enabled")
    elif sp.ssh_host and not sp.url.startswith("http://"):
        ctx.error(where, "url", "must be an http:// URL with ssh_host (the tunnel is the encryption)")
    has_secret = sp.secret_file is not None or bool(sp.secret_credential)
    if sp.auth == "none":
        if has_secret or sp.username:
            ctx.error(where, "auth", 'is "none" but username/secret_file/secret_credential is set')
    elif (sp.secret_file is None) == (not sp.secret_credential):
        ctx.error(where, "secret_file", f'set exactly one of secret_file or secret_credential (auth = "{sp.auth}")')
    if sp.auth == "basic" and not sp.username:
        ctx.error(where, "username", 'must be set for auth = "basic"')


def _resolve_state_paths(cfg: Config) -> Config:
    jsonl = cfg.notifiers.jsonl
    path = jsonl.path
    if not path.is_absolute():
        path = cfg.daemon.state_dir / path
        cfg = dataclasses.replace(
            cfg, notifiers=dataclasses.replace(cfg.notifiers, jsonl=dataclasses.replace(jsonl, path=path))
        )
    return cfg
