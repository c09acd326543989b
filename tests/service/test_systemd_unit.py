"""The shipped systemd unit passes `systemd-analyze verify` and keeps its promised settings."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "jobdiagd.service"
PROD_EXEC = "ExecStart=/opt/jobdiagd/.venv/bin/jobdiagd run --config /etc/jobdiagd/config.toml"


def venv_jobdiagd() -> Path:
    exe = Path(sys.executable).parent / "jobdiagd"
    assert exe.exists(), f"{exe} missing: run scripts/setup.sh"
    return exe


def verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze missing: scripts/setup.sh installs the systemd package"
    unit = tmp_path / "jobdiagd.service"
    unit.write_text(unit_text)
    return subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)


def unit_for_this_machine() -> str:
    text = UNIT.read_text()
    assert PROD_EXEC in text
    # verify requires the ExecStart binary to exist; /opt/jobdiagd is the production path.
    return text.replace("/opt/jobdiagd/.venv/bin/jobdiagd", str(venv_jobdiagd()))


def test_unit_verifies_cleanly(tmp_path: Path) -> None:
    result = verify(unit_for_this_machine(), tmp_path)
    complaints = [line for line in result.stderr.splitlines() if "jobdiagd.service" in line]
    assert result.returncode == 0, result.stderr
    # verify exits 0 on ignored lines ("Invalid syntax, ignoring"): treat any complaint as failure.
    assert complaints == []


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("Type=notify", "Type=notifyy", "Failed to parse service type"),
        ("ProtectSystem=strict", "ProtectSystem=strictest", "protect system"),
        (str(Path(sys.executable).parent / "jobdiagd"), "/nonexistent/jobdiagd", "not executable"),
    ],
)
def test_verify_catches_a_broken_unit(tmp_path: Path, old: str, new: str, complaint: str) -> None:
    result = verify(unit_for_this_machine().replace(old, new), tmp_path)
    assert complaint in result.stderr


def test_unit_has_the_promised_settings() -> None:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    assert settings["Type"] == ["notify"]
    assert settings["Restart"] == ["on-failure"]
    assert settings["NoNewPrivileges"] == ["yes"]
    assert settings["ProtectSystem"] == ["strict"]
    assert settings["StateDirectory"] == ["jobdiagd"]
    assert "/var/lib/jobdiagd" in settings["ReadWritePaths"][0]
    assert int(settings["WatchdogSec"][0]) > 3 * 15  # above 3 x the default tick
    assert any(v.startswith("telegram-token:") for v in settings["LoadCredential"])
    assert settings["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
