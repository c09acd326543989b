"""Incident buttons: one `ButtonSpec` per action (its press handler) in `BUTTONS`, their tokens and the keyboards.

Tokens are short, `<action>:<incident token>` (Telegram callback_data <= 64 bytes, Slack action
values); the state stays server-side, and the keyboard is derived from the incident's state. A
button about a node rather than an incident (Drain, on a suspect-node notice) carries
`<action>:@<node>`, the node name checked as a host name when it comes back.
The router looks a press up in `BUTTONS` and holds no per-button code; a handler reaches the
daemon only through `chat.ports.ChatBackend`. Adding a button: its row and handler here, its
place in `keyboard`, and what it needs of the daemon in `chat.ports` (docs/architecture.md
§ Extension points).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jobdiagd.chat.auth import Authorizer
from jobdiagd.chat.model import Button, ChatMessage
from jobdiagd.chat.ports import ChatBackend, Conversation, PressConversation, TaskError
from jobdiagd.durations import rounded_duration
from jobdiagd.model.alerts import Incident
from jobdiagd.rules.hostlist import valid_host
from jobdiagd.triage.resolve import JOB_ID_RE

MUTE_SECONDS: Mapping[str, float] = {"m1h": 3600.0, "m24h": 86400.0}
# Exactly what `encode` writes: ASCII digits without leading zeros, no final newline.
_TOKEN = re.compile(r"^([a-z_0-9]{1,16}):(0|[1-9][0-9]{0,11})\Z")
# Exactly what `encode_node` writes (46 characters of node at most: "drain_yes:@" + it fit 64 bytes).
_NODE_TOKEN = re.compile(r"^([a-z_0-9]{1,16}):@([A-Za-z0-9][A-Za-z0-9._-]{0,45})\Z")
_SLURM_ID = re.compile(r"^[0-9]{1,12}\Z")


@dataclass(frozen=True, slots=True)
class Press:
    action: str
    incident_token: int = 0
    node: str | None = None  # a node's button: no incident


def encode(action: str, incident_token: int) -> str:
    return f"{action}:{incident_token}"


def encode_node(action: str, node: str) -> str:
    return f"{action}:@{node}"


def decode(data: str) -> Press | None:
    """None for anything not produced by `encode` or `encode_node` (forged or stale callback
    data, an action of the other kind, a node name that is not a host name)."""
    m = _TOKEN.match(data or "")
    if m is not None:
        spec = BUTTONS.get(m.group(1))
        return Press(m.group(1), int(m.group(2))) if spec is not None and spec.on_press is not None else None
    m = _NODE_TOKEN.match(data or "")
    if m is None:
        return None
    spec = BUTTONS.get(m.group(1))
    if spec is None or spec.on_node is None or not valid_host(m.group(2)):
        return None
    return Press(m.group(1), node=m.group(2))


def can_scancel(job_id: str) -> bool:
    """scancel takes Slurm ids only (never a k8s/local id or a directory name)."""
    return bool(_SLURM_ID.match(job_id)) and bool(JOB_ID_RE.match(job_id))


def recovery_status(snapshot: Mapping[str, Any]) -> str | None:
    """The state of the incident's recovery intent (`suggested`, `scheduled`, ...), if it has one."""
    rec = snapshot.get("recovery")
    status = rec.get("status") if isinstance(rec, Mapping) else None
    return status if isinstance(status, str) else None


def _recovery_row(snapshot: Mapping[str, Any], token: int) -> list[tuple[Button, ...]]:
    """Restart (a suggestion waiting for its owner or an operator) or Keep the job (an automatic
    restart counting down, rule REC-14)."""
    status = recovery_status(snapshot)
    if status == "suggested":
        return [(Button("♻ Restart", encode("restart", token), "danger"),)]
    if status == "scheduled":
        return [(Button("✋ Keep the job", encode("keep", token), "primary"),)]
    return []


def keyboard(
    snapshot: Mapping[str, Any], token: int | None, *, now: float, scancel: bool = False
) -> tuple[tuple[Button, ...], ...]:
    """The buttons an incident's message shows in its current state: none once resolved, but
    for a restart still pending (a failed job's incident resolves when the job ends, while its
    restart counts down)."""
    if token is None:
        return ()
    if snapshot.get("resolved_at") is not None:
        return tuple(_recovery_row(snapshot, token))
    rows: list[tuple[Button, ...]] = _recovery_row(snapshot, token)
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


def drain_keyboard(node: str) -> tuple[tuple[Button, ...], ...]:
    """A suspect-node notice's button (rule REC-23): operators only, with a confirmation."""
    return ((Button(f"⛔ Drain {node}…", encode_node("drain", node), "danger"),),)


def drain_confirm_keyboard(node: str) -> tuple[tuple[Button, ...], ...]:
    return (
        (
            Button(f"⛔ Yes, drain {node}", encode_node("drain_yes", node), "danger"),
            Button("Not now", encode_node("drain_no", node)),
        ),
    )


def confirm_keyboard(job_id: str, token: int) -> tuple[tuple[Button, ...], ...]:
    return (
        (
            Button(f"⛔ Yes, scancel {job_id}", encode("scancel_yes", token), "danger"),
            Button("Keep the job", encode("scancel_no", token)),
        ),
    )


# -- press handlers ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pressed:
    """What a button's handler gets: the press on an incident still known, and the router's means."""

    action: str
    incident: Incident
    conv: PressConversation
    backend: ChatBackend
    now: float
    log: Any  # the router's structlog logger, bound to the chat, user, incident and action
    auth: Authorizer
    scancel_enabled: bool
    start_long: Callable[[str, tuple[str, ...], Conversation], Awaitable[None]]

    @property
    def who(self) -> str:
        return self.conv.sender.label


async def _ack(p: Pressed) -> None:
    inc = p.incident
    if inc.acked_at is not None:
        await p.conv.toast(f"Already acked by {inc.acked_by or 'someone'}.")
        return
    p.backend.ack(inc, p.who, p.now)
    p.log.info("chat_button")
    await p.conv.toast(f"✔ Acked by {p.who}")


async def _mute(p: Pressed) -> None:
    secs = MUTE_SECONDS[p.action]
    p.backend.mute(p.incident.job_id, p.incident.kind, p.now + secs, p.who, p.now)
    p.log.info("chat_button", seconds=secs)
    await p.conv.toast(f"🔕 Muted for {rounded_duration(secs)}")


async def _unmute(p: Pressed) -> None:
    p.backend.unmute(p.incident.job_id, p.incident.kind, p.who, p.now)
    p.backend.unmute(p.incident.job_id, "*", p.who, p.now)
    p.log.info("chat_button")
    await p.conv.toast("🔔 Unmuted")


async def _long_command(p: Pressed) -> None:
    """Full triage / Diagnose: the long command of the action's name, on the incident's job."""
    if p.action == "diagnose" and not p.incident.ray:
        await p.conv.toast("Diagnose needs a RAY=1 job (its Prometheus).", alert=True)
        return
    await p.conv.toast("⏳ working…")
    p.log.info("chat_button")
    await p.start_long(p.action, (p.incident.job_id,), p.conv)


async def _scancel_token(p: Pressed) -> int | None:
    """The incident's token when scancel may go on (enabled, a Slurm job, an operator pressing);
    otherwise the presser is told why not and None."""
    token = p.backend.incident_token(p.incident.id)
    if not p.scancel_enabled or token is None or not can_scancel(p.incident.job_id):
        await p.conv.toast("scancel is not enabled here.", alert=True)
        return None
    if not p.auth.is_operator(p.conv.sender):
        p.log.warning("chat_refused", what="scancel", reason="not an operator")
        await p.conv.toast("⛔ Only operators may scancel jobs.", alert=True)
        return None
    return token


def _restored(p: Pressed, token: int) -> tuple[tuple[Button, ...], ...]:
    """The incident's own keyboard, back in place of the confirmation."""
    return keyboard(p.backend.snapshot(p.incident, p.now), token, now=p.now, scancel=True)


async def _scancel_ask(p: Pressed) -> None:
    token = await _scancel_token(p)
    if token is not None:
        await p.conv.set_buttons(confirm_keyboard(p.incident.job_id, token))
        await p.conv.toast(f"Confirm: scancel job {p.incident.job_id}?")


async def _scancel_no(p: Pressed) -> None:
    token = await _scancel_token(p)
    if token is not None:
        await p.conv.set_buttons(_restored(p, token))
        await p.conv.toast("Kept the job.")


async def _scancel_yes(p: Pressed) -> None:
    token = await _scancel_token(p)
    if token is None:
        return
    inc, sender = p.incident, p.conv.sender
    restore = _restored(p, token)
    p.log.warning("scancel_requested", job_id=inc.job_id, by=sender.label)
    try:
        outcome = await p.backend.scancel(inc.job_id, sender.label)
    except TaskError as exc:
        failed = f"scancel {inc.job_id} failed: {exc}"
        p.log.warning("scancel_failed", job_id=inc.job_id, error=str(exc))
        await p.conv.set_buttons(restore)
        await p.conv.toast(failed, alert=True)
        await p.conv.send(ChatMessage(f"⚠ {failed}", f"asked by {sender.label}; the job was not cancelled"))
        return
    p.log.warning("scancel_done", job_id=inc.job_id, outcome=outcome)
    await p.conv.set_buttons(restore)
    await p.conv.toast(outcome, alert=True)
    await p.conv.send(ChatMessage(f"⛔ scancel {inc.job_id} by {sender.label}", outcome))


# -- recovery: Keep the job, Restart (rule REC-14), Drain (rule REC-23) -----------------------


async def _keep(p: Pressed) -> None:
    said = p.backend.keep_recovery(p.incident, p.who, p.now)
    p.log.info("chat_button", kept=bool(said))
    await p.conv.toast(said or "No restart of this job is pending.", alert=not said)


async def _restart(p: Pressed) -> None:
    sender = p.conv.sender
    said, ok = p.backend.approve_recovery(p.incident, sender, operator=p.auth.is_operator(sender), now=p.now)
    if ok:
        p.log.warning("chat_button", approved=True)
    else:
        p.log.warning("chat_refused", what="restart", reason=said)
    await p.conv.toast(said, alert=True)


@dataclass(frozen=True, slots=True)
class NodePressed:
    """What a node button's handler gets: the node named by the token (a checked host name)."""

    action: str
    node: str
    conv: PressConversation
    backend: ChatBackend
    now: float
    log: Any
    auth: Authorizer

    @property
    def who(self) -> str:
        return self.conv.sender.label

    @property
    def operator(self) -> bool:
        """An operator of the transport (`operators`) or of recovery (`[recovery] operators`)."""
        sender = self.conv.sender
        return self.auth.is_operator(sender) or self.backend.recovery_operator(sender)


async def _drain_refused(p: NodePressed) -> None:
    p.log.warning("chat_refused", what="drain", node=p.node, reason="not an operator")
    with contextlib.suppress(TaskError):
        await p.backend.drain(p.node, p.who, operator=False)  # the refusal is logged (rule REC-23)
    await p.conv.toast("⛔ Only operators may drain a node.", alert=True)


async def _drain_ask(p: NodePressed) -> None:
    if not p.operator:
        await _drain_refused(p)
        return
    await p.conv.set_buttons(drain_confirm_keyboard(p.node))
    await p.conv.toast(f"Confirm: drain {p.node}?")


async def _drain_no(p: NodePressed) -> None:
    await p.conv.set_buttons(drain_keyboard(p.node))
    await p.conv.toast("Not drained.")


async def _drain_yes(p: NodePressed) -> None:
    if not p.operator:
        await _drain_refused(p)
        return
    p.log.warning("drain_requested", node=p.node, by=p.who)
    try:
        outcome = await p.backend.drain(p.node, p.who, operator=True)
    except TaskError as exc:
        failed = f"drain {p.node} failed: {exc}"
        p.log.warning("drain_failed", node=p.node, error=str(exc))
        await p.conv.set_buttons(drain_keyboard(p.node))
        await p.conv.toast(failed, alert=True)
        await p.conv.send(ChatMessage(f"⚠ {failed}", f"asked by {p.who}; the node was not drained"))
        return
    p.log.warning("drain_done", node=p.node, outcome=outcome)
    await p.conv.set_buttons(())
    await p.conv.toast(outcome, alert=True)
    await p.conv.send(ChatMessage(f"⛔ drain {p.node} by {p.who}", f"`{outcome}`"))


# -- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ButtonSpec:
    """One button. Exactly one handler: `on_press` (on an incident's message, its token an
    incident's) or `on_node` (about a node, its token `<action>:@<node>`)."""

    action: str  # the token's first part: [a-z_0-9], at most 16 characters
    on_press: Callable[[Pressed], Awaitable[None]] | None = None
    after_resolve: bool = False  # still does something once the incident resolved
    help: str = ""  # how /help names it ("": named with another, or a confirmation)
    only_with_scancel: bool = False  # named in /help only where [chat] scancel_button is on
    only_with_recovery: bool = False  # named in /help only where [recovery] can act
    on_node: Callable[[NodePressed], Awaitable[None]] | None = None

    def __post_init__(self) -> None:
        if (self.on_press is None) == (self.on_node is None):
            raise ValueError(f"button {self.action!r}: give exactly one of on_press and on_node")


BUTTONS: dict[str, ButtonSpec] = {
    b.action: b
    for b in (
        ButtonSpec("ack", _ack, help="Ack"),
        ButtonSpec("m1h", _mute, help="Mute 1 h / 24 h"),
        ButtonSpec("m24h", _mute),
        ButtonSpec("unmute", _unmute),
        ButtonSpec("triage", _long_command, after_resolve=True, help="Full triage"),
        ButtonSpec("diagnose", _long_command, after_resolve=True, help="Diagnose (RAY=1 jobs)"),
        ButtonSpec(
            "scancel",
            _scancel_ask,
            help="⛔ scancel… (operators only, Slurm jobs, asks to confirm)",
            only_with_scancel=True,
        ),
        ButtonSpec("scancel_yes", _scancel_yes),
        ButtonSpec("scancel_no", _scancel_no),
        ButtonSpec(
            "restart",
            _restart,
            after_resolve=True,
            help="♻ Restart (a suggested restart: the job's owner or operators)",
            only_with_recovery=True,
        ),
        ButtonSpec(
            "keep",
            _keep,
            after_resolve=True,
            help="✋ Keep the job (cancels an automatic restart's countdown, as an ack does)",
            only_with_recovery=True,
        ),
        ButtonSpec(
            "drain",
            on_node=_drain_ask,
            help="⛔ Drain… (on a suspect-node notice: operators only, asks to confirm)",
        ),
        ButtonSpec("drain_yes", on_node=_drain_yes),
        ButtonSpec("drain_no", on_node=_drain_no),
    )
}
ACTIONS: tuple[str, ...] = tuple(BUTTONS)


def help_names(*, scancel: bool, recovery: bool = False) -> list[str]:
    """The buttons as /help names them, in the table's order."""
    return [
        b.help
        for b in BUTTONS.values()
        if b.help and (scancel or not b.only_with_scancel) and (recovery or not b.only_with_recovery)
    ]
