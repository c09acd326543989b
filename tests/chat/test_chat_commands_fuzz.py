"""Fuzzing the chat command parser (chat.commands), button data (chat.buttons) and the router on top.

Properties: every text is a `Parsed` command or one `UsageError`; what the validators accept
is what the daemon may pass on (a job id of safe ASCII characters that no shell, glob or
argument parser reads as syntax; a path whose real location is inside an outputs root);
button data decodes only when it is exactly what `encode` writes; and the router, given any
text or button data, never raises, answers once, and lets neither a stranger nor an invalid
argument reach the daemon.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from jobdiagd.chat import commands as C
from jobdiagd.chat.auth import Authorizer, Sender
from jobdiagd.chat.buttons import ACTIONS, BUTTONS, can_scancel, decode, encode, encode_node
from jobdiagd.chat.model import Button, ChatMessage
from jobdiagd.chat.ports import TaskResult
from jobdiagd.chat.router import ChatRouter
from jobdiagd.model.alerts import Incident
from jobdiagd.rules.hostlist import valid_host
from tests.helpers.fuzz import fuzz_settings

NOW = 1_000_000.0
# What an accepted id may contain: it becomes a glob pattern, an argv word and a file name.
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}", re.ASCII)

_chars = st.characters(blacklist_categories=["Cs"])
_word = st.one_of(
    st.text(_chars, max_size=20),
    st.sampled_from(
        ["123", "k8s-20250101-120000-ab12", "-rf", "--config=/x", "../etc", "a/b", ".hidden", "$(id)", "`id`",
         "1;rm", "x" * 200, "١٢٣", "123\n", "ack:1", "30m", "7d", "8d", "99999h", "hang", "HANG", "*", "/outputs/1",
         "/outputs/../etc/passwd", "/outputs/link_out", "/outputs/j1/log", "\x00", "\u2028", "up{job=\"x\"}",
         'sum(rate(x[5m])) or vector(1)']
    ),
)
command = st.one_of(
    st.text(_chars, max_size=600),
    st.tuples(
        st.sampled_from([*C.COMMANDS, "nope", "TRIAGE", "triage@bot", "/mute@jobdiagd_bot"]),
        st.lists(_word, max_size=4),
        st.sampled_from(["/", "", " /"]),
    ).map(lambda t: t[2] + t[0] + " " + " ".join(t[1])),
)


@fuzz_settings(examples=400)
@given(command)
@example("/triage 123\n")
@example("/job ١٢٣")
def test_any_text_is_a_command_or_one_usage_error(text: str) -> None:
    try:
        parsed = C.parse(text)
    except C.UsageError as exc:
        assert 0 < len(str(exc)) < 200
        return
    spec = parsed.spec
    assert spec.min_args <= len(parsed.args) <= spec.max_args
    assert all(a and not any(c.isspace() for c in a) for a in parsed.args)


@fuzz_settings(examples=400)
@given(_word)
# Found by this test: `$` matched before a final newline and `\d` any Unicode digit, so
# "123\n" and "١٢٣" (Arabic-Indic digits) were accepted as job ids.
@example("123\n")
@example("١٢٣")
@example("abc\n")
def test_an_accepted_job_id_is_safe_ascii(text: str) -> None:
    try:
        jid = C.job_id(text)
    except C.UsageError:
        return
    assert jid == text and SAFE_ID.fullmatch(jid), repr(jid)
    if can_scancel(jid):
        assert jid.isascii() and jid.isdigit()


@fuzz_settings(examples=300)
@given(_word)
@example("30m\n")
@example("١h")
def test_an_accepted_duration_is_within_bounds(text: str) -> None:
    try:
        seconds = C.duration(text)
    except C.UsageError:
        return
    assert C.MIN_MUTE_S <= seconds <= C.MAX_MUTE_S
    assert text.strip().isascii()


_node = st.one_of(
    st.text(_chars, max_size=50),
    st.sampled_from(["node017", "gpu-a1.cluster", "-rf", "a b", "node;id", "n" * 46, "n" * 47, "node017\n", "..", "x/y"]),
)


@fuzz_settings(examples=300)
@given(
    st.one_of(
        st.text(_chars, max_size=40),
        st.tuples(st.sampled_from(ACTIONS), st.integers(0, 10**12)).map(lambda t: encode(t[0], t[1])),
        st.tuples(st.sampled_from(ACTIONS), _node).map(lambda t: encode_node(t[0], t[1])),
    )
)
@example("ack:12\n")
@example("ack:١٢")
@example("ack:0012")
@example("drain:@node017\n")
@example("drain:@-rf")
@example("ack:@node017")
@example("drain:17")
def test_button_data_decodes_only_when_it_is_what_encode_writes(data: str) -> None:
    press = decode(data)
    if press is None:
        return
    if press.node is not None:
        assert encode_node(press.action, press.node) == data and valid_host(press.node)
        assert BUTTONS[press.action].on_node is not None and len(data.encode()) <= 64
    else:
        assert encode(press.action, press.incident_token) == data and BUTTONS[press.action].on_press is not None


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("roots")
    outputs, secret = base / "outputs", base / "secret"
    (outputs / "j1").mkdir(parents=True)
    (outputs / "j1.log").write_text("x\n")
    secret.mkdir()
    (secret / "key").write_text("SECRET\n")
    (outputs / "link_out").symlink_to(secret)
    (outputs / "j1" / "log").symlink_to("../j1.log")
    (outputs / "j1" / "up").symlink_to("../..")
    (outputs / "loop").symlink_to("loop")
    return outputs, secret


_part = st.sampled_from(["..", ".", "j1", "j1.log", "log", "up", "link_out", "key", "loop", "", "secret", "x" * 300])


@fuzz_settings(examples=300)
@given(st.lists(_part, max_size=6), st.booleans())
def test_a_path_is_accepted_only_inside_an_outputs_root(roots: tuple[Path, Path], parts: list[str], absolute: bool) -> None:
    outputs, secret = roots
    text = (str(outputs) + "/" if absolute else "") + "/".join(parts)
    try:
        got = C.path_under_roots(text, [outputs])
    except C.UsageError as exc:
        assert "SECRET" not in str(exc)
        return
    real = Path(os.path.realpath(got))
    assert real.exists() and real.is_relative_to(os.path.realpath(outputs))
    assert not real.is_relative_to(os.path.realpath(secret))


# -- the router ------------------------------------------------------------------------------


class RecordingBackend:
    """The daemon side of the router, recording what reaches it."""

    def __init__(self, roots: Sequence[Path]) -> None:
        self.outputs_roots = list(roots)
        self.playbooks = ("hang", "oom")
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        inc = Incident("123:hang:1", "123", "hang", 1, "hang", "critical", "stalled", NOW - 600, NOW)
        self.incidents = {1: inc}

    def status(self, now: float) -> ChatMessage:
        return ChatMessage("status")

    def jobs(self, now: float) -> ChatMessage:
        return ChatMessage("jobs")

    def job(self, job_id: str, now: float) -> ChatMessage | None:
        self.calls.append(("job", (job_id,)))
        return None

    def open_incidents(self, job_id: str, kind: str | None) -> list[Incident]:
        self.calls.append(("open_incidents", (job_id, kind)))
        return [i for i in self.incidents.values() if i.job_id == job_id]

    def incident(self, token: int) -> Incident | None:
        return self.incidents.get(token)

    def incident_token(self, incident_id: str) -> int | None:
        return 1 if incident_id == "123:hang:1" else None

    def snapshot(self, incident: Incident, now: float) -> Mapping[str, Any]:
        return {"job_id": incident.job_id, "acked_at": None, "muted_until": None, "resolved_at": None}

    def ack(self, incident: Incident, by: str, now: float) -> None:
        self.calls.append(("ack", (incident.id, by)))

    def mute(self, job_id: str, kind: str, until: float, by: str, now: float) -> None:
        self.calls.append(("mute", (job_id, kind, until - now)))

    def unmute(self, job_id: str, kind: str, by: str, now: float) -> bool:
        self.calls.append(("unmute", (job_id, kind)))
        return True

    async def run_task(self, name: str, args: tuple[str, ...]) -> TaskResult:
        self.calls.append(("run_task", (name, *args)))
        return TaskResult(name, "done")

    async def scancel(self, job_id: str, by: str) -> str:
        self.calls.append(("scancel", (job_id,)))
        return "cancelled"

    def nodes(self, now: float) -> ChatMessage:
        return ChatMessage("no suspect nodes")

    def recovery_operator(self, sender: Sender) -> bool:
        return False

    def keep_recovery(self, incident: Incident, by: str, now: float) -> str:
        self.calls.append(("keep", (incident.job_id,)))
        return "kept"

    def approve_recovery(self, incident: Incident, sender: Sender, *, operator: bool, now: float) -> tuple[str, bool]:
        self.calls.append(("approve", (incident.job_id, operator)))
        return "approved", True

    async def drain(self, node: str, by: str, *, operator: bool) -> str:
        self.calls.append(("drain", (node, operator)))
        return f"drained {node}"


class Conv:
    def __init__(self, sender: Sender) -> None:
        self.sender = sender
        self.out: list[object] = []

    async def send(self, msg: ChatMessage) -> object:
        self.out.append(msg)
        return len(self.out)

    async def edit(self, handle: object, msg: ChatMessage) -> None:
        self.out.append(("edit", msg))

    async def toast(self, text: str, *, alert: bool = False) -> None:
        self.out.append(("toast", text))

    async def set_buttons(self, rows: tuple[tuple[Button, ...], ...]) -> None:
        self.out.append(("buttons", rows))


ALLOWED = Sender("-1", "10", "alice")
OPERATOR = Sender("-1", "11", "olga")
STRANGERS = (Sender("-1", "99", "mallory"), Sender("-9", "10", "alice"), Sender("-9", "11", "olga"))


def _valid_target(arg: str, roots: Sequence[Path]) -> bool:
    if arg.startswith("/"):
        real = os.path.realpath(arg)
        return any(Path(real).is_relative_to(os.path.realpath(r)) for r in roots) and os.path.exists(real)
    return bool(SAFE_ID.fullmatch(arg))


async def _drive(backend: RecordingBackend, sender: Sender, texts: list[str], presses: list[str]) -> list[Conv]:
    router = ChatRouter(
        backend,
        Authorizer.of(["-1"], ["10", "11"], operators=["11"]),
        transport="fuzz",
        scancel_enabled=True,
        now=lambda: NOW,
    )
    convs = []
    try:
        for text in texts:
            conv = Conv(sender)
            await router.on_command(text, conv)
            convs.append(conv)
        for data in presses:
            conv = Conv(sender)
            await router.on_press(data, conv)
            convs.append(conv)
        for _ in range(5):
            await asyncio.sleep(0)
    finally:
        await router.close()
    return convs


_press = st.one_of(
    st.text(_chars, max_size=30),
    st.tuples(st.sampled_from(ACTIONS), st.sampled_from([1, 2, 99999999])).map(lambda t: encode(t[0], t[1])),
    st.tuples(st.sampled_from(ACTIONS), _node).map(lambda t: encode_node(t[0], t[1])),
)


@fuzz_settings(examples=150)
@given(st.lists(command, max_size=4), st.lists(_press, max_size=4), st.sampled_from([ALLOWED, OPERATOR, *STRANGERS]))
@example(["/triage /outputs/link_out", "/diagnose 1 $(id)", "/compare ../x 1"], ["scancel_yes:1"], ALLOWED)
@example(["/ack 123", "/mute 123 1h"], ["ack:1", "m24h:1", "scancel_yes:1"], STRANGERS[1])
@example(["/nodes"], ["drain_yes:@node017", "drain:@node017", "drain_yes:@-rf", "restart:1", "keep:1"], ALLOWED)
@example([], ["drain_yes:@node017", "restart:1"], OPERATOR)
@example([], ["drain_yes:@node017", "keep:1"], STRANGERS[0])
def test_the_router_answers_everything_and_only_valid_requests_reach_the_daemon(
    roots: tuple[Path, Path], texts: list[str], presses: list[str], sender: Sender
) -> None:
    outputs, _ = roots
    backend = RecordingBackend([outputs])
    convs = asyncio.run(_drive(backend, sender, texts, presses))
    if sender.chat_id == "-1":
        assert all(conv.out for conv in convs)  # every command and press got an answer
    else:  # a chat off the list hears nothing (a press's spinner is stopped without a word)
        assert all(o == ("toast", "") for conv in convs for o in conv.out), [c.out for c in convs]
    if sender in STRANGERS:
        assert backend.calls == [], backend.calls
        return
    for name, args in backend.calls:
        if name == "run_task":
            task, *targets = args
            if task == "diagnose" and len(targets) == 2:
                assert targets[1] in backend.playbooks
                targets = targets[:1]
            assert all(_valid_target(t, [outputs]) for t in targets), args
        elif name in ("job", "open_incidents", "mute", "unmute"):
            assert SAFE_ID.fullmatch(args[0]), args
        elif name == "scancel":
            assert sender is OPERATOR and args == ("123",)
        elif name == "drain":
            node, operator = args
            assert valid_host(node) and operator == (sender is OPERATOR), args
        elif name == "approve":
            assert args == ("123", sender is OPERATOR), args
