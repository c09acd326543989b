"""Incident buttons: short tokens `<action>:<incident token>` (Telegram callback_data <= 64 bytes, Slack
action values); the state stays server-side, and the keyboard is derived from the incident's state."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jobdiagd.chat.model import Button
from jobdiagd.triage.resolve import JOB_ID_RE

Action = Literal["ack", "m1h", "m24h", "unmute", "triage", "diagnose", "scancel", "scancel_yes", "scancel_no"]
ACTIONS: tuple[Action, ...] = (
    "ack",
    "m1h",
    "m24h",
    "unmute",
    "triage",
    "diagnose",
    "scancel",
    "scancel_yes",
    "scancel_no",
)
MUTE_SECONDS: Mapping[str, float] = {"m1h": 3600.0, "m24h": 86400.0}
# Exactly what `encode` writes: ASCII digits without leading zeros, no final newline.
_TOKEN = re.compile(r"^([a-z_0-9]{1,16}):(0|[1-9][0-9]{0,11})\Z")
_SLURM_ID = re.compile(r"^[0-9]{1,12}\Z")


@dataclass(frozen=True, slots=True)
class Press:
    action: Action
    incident_token: int


def encode(action: Action, incident_token: int) -> str:
    return f"{action}:{incident_token}"


def decode(data: str) -> Press | None:
    """None for anything not produced by `encode` (forged or stale callback data)."""
    m = _TOKEN.match(data or "")
    if m is None or m.group(1) not in ACTIONS:
        return None
    action: Action = m.group(1)  # type: ignore[assignment]
    return Press(action, int(m.group(2)))


def can_scancel(job_id: str) -> bool:
    """scancel takes Slurm ids only (never a k8s/local id or a directory name)."""
    return bool(_SLURM_ID.match(job_id)) and bool(JOB_ID_RE.match(job_id))


def keyboard(
    snapshot: Mapping[str, Any], token: int | None, *, now: float, scancel: bool = False
) -> tuple[tuple[Button, ...], ...]:
    """The buttons an incident's message shows in its current state (none once resolved)."""
    if token is None or snapshot.get("resolved_at") is not None:
        return ()
    rows: list[tuple[Button, ...]] = []
    first: list[Button] = []
    if snapshot.get("acked_at") is None:
        first.append(Button("✔ Ack", encode("ack", token), "primary"))
    muted_until = snapshot.get("muted_until")
    if isinstance(muted_until, int | float) and muted_until > now:
        first.append(Button("🔔 Unmute", encode("unmute", token)))
    else:
        first += [Button("🔕 Mute 1 h", encode("m1h", token)), Button("🔕 Mute 24 h", encode("m24h", token))]
    rows.append(tuple(first))
    second = [Button("📋 Full triage", encode("triage", token))]
    if snapshot.get("ray"):
        second.append(Button("🩺 Diagnose", encode("diagnose", token)))
    rows.append(tuple(second))
    if scancel and can_scancel(str(snapshot.get("job_id", ""))):
        rows.append((Button("⛔ scancel…", encode("scancel", token), "danger"),))
    return tuple(rows)


def confirm_keyboard(job_id: str, token: int) -> tuple[tuple[Button, ...], ...]:
    return (
        (
            Button(f"⛔ Yes, scancel {job_id}", encode("scancel_yes", token), "danger"),
            Button("Keep the job", encode("scancel_no", token)),
        ),
    )
