"""Command parsing and validation, routes, quiet hours, button tokens and keyboards (pure)."""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobdiagd.chat import commands as C
from jobdiagd.chat.auth import Authorizer, Sender
from jobdiagd.chat.buttons import decode, encode, keyboard
from jobdiagd.chat.routes import Route, destination_for, is_silent, parse_quiet_hours
from jobdiagd.model.alerts import Notification


def test_parse_commands() -> None:
    assert C.parse("/triage@jobdiagd_bot 123") == C.Parsed("triage", ("123",))
    assert C.parse("  /MUTE 123 2h ") == C.Parsed("mute", ("123", "2h"))
    assert C.parse("status") == C.Parsed("status", ())  # Slack: `/jobdiagd status`
    for bad, why in [
        ("/frobnicate", "unknown command"),
        ("/triage", "usage: /triage"),
        ("/compare 1", "usage: /compare"),
        ("/job 1 2", "usage: /job"),
        ("", "empty"),
        ("/status " + "x" * 600, "too long"),
        ("/job 1\x00", "NUL"),
    ]:
        with pytest.raises(C.UsageError, match=why):
            C.parse(bad)


def test_argument_validation() -> None:
    assert C.job_id("123456") == "123456"
    assert C.job_id("48104-JAX-llama3.1-70b") == "48104-JAX-llama3.1-70b"  # a dir-name key
    for bad in ["../etc", "a/b", ".hidden", "-rf", "x" * 200, "1;rm", "$(id)"]:
        with pytest.raises(C.UsageError):
            C.job_id(bad)
    assert C.duration("30m") == 1800 and C.duration("2h") == 7200 and C.duration("1d") == 86400
    assert C.duration("90") == 5400  # bare number: minutes
    for bad in ["0m", "8d", "30s", "1y", "-1h", "2 hours"]:
        with pytest.raises(C.UsageError):
            C.duration(bad)
    assert C.playbook("hang", ["hang", "oom"]) == "hang"
    with pytest.raises(C.UsageError, match="known: hang, oom"):
        C.playbook("hang;ls", ["hang", "oom"])


def test_paths_only_under_the_outputs_roots_after_resolving_links(tmp_path: Path) -> None:
    root = tmp_path / "outputs"
    job = root / "123-x"
    job.mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    os.symlink(tmp_path / "secret", root / "escape")  # a link inside the root pointing out
    assert C.path_under_roots(str(job), [root]) == job.resolve()
    assert C.target(str(job) + "/../123-x", [root]) == str(job.resolve())
    for bad, why in [
        (str(root / "escape"), "outside"),
        (str(root / ".." / "secret"), "outside"),
        ("/etc/passwd", "outside"),
        ("outputs/123-x", "absolute"),
        (str(root / "nope"), "no such"),
    ]:
        with pytest.raises(C.UsageError, match=why):
            C.target(bad, [root])


def note(kind: str = "hang", severity: str = "critical", owner: str | None = None) -> Notification:
    return Notification("n", "1", kind, "open", "t", "b", 0.0, severity, "1:hang:1", owner)  # type: ignore[arg-type]


def test_routes_first_match_else_default() -> None:
    routes = [
        Route("alice-chat", owners=frozenset({"alice"})),
        Route("pager", kinds=frozenset({"hang"}), severities=frozenset({"critical"})),
    ]
    assert destination_for(note(owner="alice"), routes, "default") == "alice-chat"
    assert destination_for(note(owner="bob"), routes, "default") == "pager"
    assert (
        destination_for(note(kind="tgs-degradation", severity="warning", owner="bob"), routes, "default")
        == "default"
    )
    assert (
        destination_for(note(owner=None), [routes[0]], "default") == "default"
    )  # an owner route needs an owner


def test_quiet_hours_and_silence() -> None:
    q = parse_quiet_hours("22:00-07:00", "UTC")
    assert q is not None
    at = lambda h, m=0: datetime(2026, 3, 1, h, m, tzinfo=UTC).timestamp()  # noqa: E731
    assert q.active(at(23)) and q.active(at(3)) and not q.active(at(7)) and not q.active(at(12))
    assert not is_silent(note(severity="critical"), q, at(3))  # critical always rings
    assert is_silent(note(severity="warning"), q, at(3)) and not is_silent(
        note(severity="warning"), q, at(12)
    )
    assert is_silent(note(severity="info"), None, at(12))  # info never rings
    # Only pages and reminders ring: a warning notice, a resolution or a report never do.
    for event in ("notice", "resolve", "update", "report"):
        assert is_silent(replace(note(severity="critical"), event=event), None, at(12)), event
    assert not is_silent(replace(note(severity="warning"), event="remind"), None, at(12))
    for bad in ["22-07", "25:00-07:00", "07:00-07:00"]:
        with pytest.raises(ValueError):
            parse_quiet_hours(bad)


def test_authorization_needs_chat_and_user() -> None:
    auth = Authorizer.of([-1], [10, 11], operators=[11])
    assert auth.refusal(Sender("-1", "10")) is None
    assert "chat" in (auth.refusal(Sender("-2", "10")) or "")  # allowed user, foreign chat
    assert "users" in (auth.refusal(Sender("-1", "99")) or "")  # allowed chat, stranger
    assert auth.is_operator(Sender("-1", "11")) and not auth.is_operator(Sender("-1", "10"))
    assert not auth.is_operator(Sender("-2", "11"))  # an operator in a foreign chat is not one
    assert Authorizer.of([-1], []).refusal(Sender("-1", "10")) is not None  # empty list: nobody


def test_button_tokens_and_keyboards() -> None:
    assert decode(encode("m24h", 42)) is not None and len(encode("scancel_yes", 10**12 - 1).encode()) <= 64
    for forged in ["", "ack", "ack:", "ack:x", "drop:1", "ack:1:2", "ack:1234567890123"]:
        assert decode(forged) is None
    snap = {"job_id": "123", "resolved_at": None, "acked_at": None, "muted_until": None, "ray": False}

    def labels(**kw: object) -> list[str]:
        return [
            b.label
            for row in keyboard({**snap, **kw}, 7, now=100.0, scancel=bool(kw.pop("sc", False)))
            for b in row
        ]

    assert labels() == ["✔ Ack", "🔕 Mute 1 h", "🔕 Mute 24 h", "📋 Full triage"]
    assert labels(ray=True)[-1] == "🩺 Diagnose"
    assert labels(acked_at=50.0)[0] == "🔕 Mute 1 h"
    assert "🔔 Unmute" in labels(muted_until=200.0) and "🔕 Mute 1 h" not in labels(muted_until=200.0)
    assert "🔕 Mute 1 h" in labels(muted_until=50.0)  # an expired mute
    assert keyboard({**snap, "resolved_at": 90.0}, 7, now=100.0) == ()
    with_scancel = keyboard(snap, 7, now=100.0, scancel=True)
    assert with_scancel[-1][0].token == "scancel:7"
    assert (
        keyboard({**snap, "job_id": "k8s_20260101_000000_ab"}, 7, now=100.0, scancel=True)[-1][0].token
        != "scancel:7"
    )
