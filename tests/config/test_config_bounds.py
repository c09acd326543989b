"""Numeric keys have sane bounds (finite, min/max with a reason); secrets are never echoed in errors."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.config import Bounded, Config, ConfigError, loads

TELEGRAM_TOKEN = "7345123456:AAHk3vQe9xZ1-abcdefghijklmnopqrstuv"
SLACK_TOKEN = "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx"


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        loads(text, source="c.toml", base_dir=Path("/etc/jobdiagd"))
    return info.value.errors


def numeric_keys(
    cls: type[Any] = Config, prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], dataclasses.Field[Any]]]:
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if f.name == "tsdb":
            continue  # its own schema (tsdb/settings.py), checked below
        if dataclasses.is_dataclass(tp):
            out += numeric_keys(typing.cast(type[Any], tp), (*prefix, f.name))
        elif tp in (int, float):
            out.append(((*prefix, f.name), f))
    return out


def test_every_numeric_key_has_bounds_and_its_default_is_within_them() -> None:
    keys = numeric_keys()
    assert len(keys) >= 18
    for where, f in keys:
        bounds = [v for v in f.metadata.get("validators", ()) if isinstance(v, Bounded)]
        assert bounds, f"{'.'.join(where)} has no bounds"
        (b,) = bounds
        assert b.low <= f.default <= b.high and b.why, where


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("1e309", "must be a finite number, got inf"),  # TOML float overflow: infinity
        ("inf", "must be a finite number, got inf"),
        ("nan", "must be a finite number, got nan"),
        ("0.000001", "must be between 0.05 and 3600 (shorter only burns CPU"),
        ("86400", "must be between 0.05 and 3600"),
    ],
)
def test_tick_seconds_out_of_range_is_refused_with_the_reason(value: str, fragment: str) -> None:
    (err,) = errors_of(f"[daemon]\ntick_seconds = {value}\n")
    assert err.startswith("c.toml: [daemon] tick_seconds: ") and fragment in err


def test_bounds_are_inclusive() -> None:
    cfg = loads("[daemon]\ntick_seconds = 0.05\nsqueue_interval_seconds = 3600\n", source="c.toml")
    assert (cfg.daemon.tick_seconds, cfg.daemon.squeue_interval_seconds) == (0.05, 3600)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("slurm", "command_timeout_seconds", "1e-9"),
        ("detectors.hang", "min_stall_seconds", "1e12"),
        ("detectors.hang", "checkpoint_budget_seconds", "-1"),
        ("detectors.tgs", "recent_steps", "100000000"),
        ("incidents", "max_reminders", "-3"),
        ("delivery", "send_timeout_seconds", "1e309"),
        ("tsdb", "query_timeout_s", "1e309"),
        ("tsdb.thresholds", "busy_util_pct", "250"),
        ("tsdb.ssh", "max_attempts", "0"),
        ("tsdb.gpu_profiles.H100", "train_power_min_w", "-5"),
    ],
)
def test_other_numeric_keys_are_bounded_too(section: str, key: str, value: str) -> None:
    (err,) = errors_of(f"[{section}]\n{key} = {value}\n")
    assert f"[{section}] {key}: must be" in err


@pytest.mark.parametrize("table", ["telegram", "slack"])
@pytest.mark.parametrize("token", [TELEGRAM_TOKEN, SLACK_TOKEN, "s3cr3t/value+with=odd/chars!"])
@pytest.mark.parametrize("key", ["token_credential", "token_file"])
def test_a_token_pasted_into_a_token_key_is_refused_without_echoing_it(
    table: str, token: str, key: str
) -> None:
    # Slack without commands: no app-level token is needed for a valid section.
    targets = "chat_ids = [1]" if table == "telegram" else "channel_ids = ['C01']\ncommands = false"
    text = f"[notifiers.{table}]\nenabled = true\n{key} = '{token}'\n{targets}\n"
    if key == "token_file" and token.startswith("s3cr3t"):
        # Any string can be a file name: only token-shaped values are refused here.
        loads(text, source="c.toml", base_dir=Path("/etc/jobdiagd"))
        return
    (err,) = errors_of(text)
    assert err.startswith(f"c.toml: [notifiers.{table}] {key}: ")
    assert token not in err and token[:12] not in err and token[-8:] not in err
    assert "not shown" in err
    if not token.startswith("s3cr3t"):
        assert "looks like a" in err


def test_a_mistyped_token_key_is_not_echoed_either() -> None:
    (err,) = errors_of("[notifiers.telegram]\ntoken_credential = 12345\n")
    assert "12345" not in err and "not shown" in err


@pytest.mark.daemon  # `jobdiagd run` itself (refusing the config before it starts)
def test_the_daemon_prints_one_line_without_the_token(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f"[notifiers.telegram]\nenabled = true\ntoken_credential = '{TELEGRAM_TOKEN}'\nchat_ids = [1]\n"
        "[daemon]\ntick_seconds = 1e309\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "jobdiagd.cli", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert TELEGRAM_TOKEN not in done.stderr + done.stdout and "Traceback" not in done.stderr
    assert "[daemon] tick_seconds: must be a finite number" in done.stderr
    assert "[notifiers.telegram] token_credential: looks like a Telegram bot token" in done.stderr
