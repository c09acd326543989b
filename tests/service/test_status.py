"""Status socket round trip on a real Unix socket, its permissions, and `jobdiagd status`."""

from __future__ import annotations

import argparse
import asyncio
import grp
import json
import os
import socket
import stat
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.service.health import assess
from jobdiagd.service.status_cli import (
    EXIT_DEGRADED,
    EXIT_NOT_RUNNING,
    EXIT_OK,
    EXIT_UNHEALTHY,
    PHONE_COLUMNS,
    format_status,
    register,
    run_status,
)
from jobdiagd.service.status_socket import StatusServer, StatusUnavailable, request

NOW = 1_800_000_000.0


def snapshot(last_tick_at: float | None = NOW - 5, **extra: Any) -> dict[str, Any]:
    return {
        "version": "0.1.0",
        "pid": 4321,
        "started_at": NOW - 3600,
        "tick_seconds": 15,
        "last_tick_at": last_tick_at,
        "jobs": [
            {
                "job_id": "123",
                "state": "RUNNING",
                "name": "llama3-8b",
                "last_step": 316,
                "last_step_at": NOW - 840,
            }
        ],
        "open_incidents": [
            {
                "job_id": "123",
                "kind": "hang",
                "severity": "critical",
                "opened_at": NOW - 720,
                "announced_at": NOW - 720,
                "acked_at": NOW - 60,
                "acked_by": "alice",
                "summary": "no step since step 316",
            }
        ],
        "sources": {
            "squeue": {"failing": False},
            "prometheus": {
                "failing": True,
                "failing_since": NOW - 120,
                "failures": 8,
                "last_error": "ConnectionRefused",
            },
        },
        "notifiers": {"console": {"sent": 3, "failing": False}},
        "deliveries": {"console": {"sent": 3}},
        **extra,
    }


@pytest.fixture
async def server(short_tmp: Path) -> AsyncIterator[tuple[StatusServer, dict[str, Any]]]:
    state: dict[str, Any] = {"snap": snapshot()}
    srv = StatusServer(
        short_tmp / "s.sock",
        lambda: state["snap"],
        now=lambda: NOW,
        commands={"echo": lambda req: {"echo": req.get("text")}},
    )
    await srv.start()
    try:
        yield srv, state
    finally:
        await srv.stop()


async def test_round_trip_and_mode(server: tuple[StatusServer, dict[str, Any]]) -> None:
    srv, _ = server
    assert stat.S_ISSOCK(srv.path.stat().st_mode)
    assert stat.S_IMODE(srv.path.stat().st_mode) == 0o600
    reply = await asyncio.to_thread(request, srv.path, "status")
    assert reply["ok"] is True and reply["now"] == NOW
    assert reply["result"]["jobs"][0]["job_id"] == "123"
    assert (await asyncio.to_thread(request, srv.path, "echo", text="hi"))["result"] == {"echo": "hi"}
    bad = await asyncio.to_thread(request, srv.path, "rm -rf")
    assert bad["ok"] is False and "unknown command" in bad["error"]


async def test_garbage_and_broken_snapshot_get_errors_not_crashes(short_tmp: Path) -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("engine not ready")

    srv = StatusServer(short_tmp / "b.sock", broken)
    await srv.start()
    try:
        reader, writer = await asyncio.open_unix_connection(str(srv.path))
        writer.write(b"not json\n")
        await writer.drain()
        assert json.loads(await reader.readline()) == {"ok": False, "error": "request is not JSON"}
        writer.close()
        reply = await asyncio.to_thread(request, srv.path)
        assert reply == {"ok": False, "error": "RuntimeError: engine not ready"}
    finally:
        await srv.stop()
    assert not srv.path.exists()


async def test_group_mode(short_tmp: Path) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    srv = StatusServer(short_tmp / "g.sock", snapshot, group=group)
    await srv.start()
    try:
        st = srv.path.stat()
        assert stat.S_IMODE(st.st_mode) == 0o660
        assert st.st_gid == os.getgid()
    finally:
        await srv.stop()


async def test_the_socket_is_owner_only_from_bind_whatever_the_umask(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No window where the umask decides: with umask 000 and the chmod after bind suppressed, the
    # file bind created is already 0600 (the socket inode's mode, set before bind).
    monkeypatch.setattr("jobdiagd.service.status_socket.os.chmod", lambda *_a, **_k: None)
    old = os.umask(0)
    try:
        srv = StatusServer(short_tmp / "u.sock", lambda: {"ok": True})
        await srv.start()
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(srv.path.stat().st_mode) == 0o600
        assert (await asyncio.to_thread(request, srv.path, "ping"))["result"] == {"pong": True}
    finally:
        await srv.stop()


async def test_stale_socket_is_replaced_but_a_live_one_is_not(short_tmp: Path) -> None:
    path = short_tmp / "x.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # file left behind, nobody listening
    first = StatusServer(path, snapshot)
    await first.start()
    try:
        second = StatusServer(path, snapshot)
        with pytest.raises(RuntimeError, match="another daemon"):
            await second.start()
    finally:
        await first.stop()
    regular = short_tmp / "file"
    regular.write_text("x")
    with pytest.raises(RuntimeError, match="not a socket"):
        await StatusServer(regular, snapshot).start()


def test_client_reports_absent_daemon(short_tmp: Path) -> None:
    with pytest.raises(StatusUnavailable, match="not running"):
        request(short_tmp / "none.sock")


def args(**kw: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    ns = parser.parse_args(["status", *kw.pop("argv", [])])
    return ns


async def test_status_command_exit_codes(
    server: tuple[StatusServer, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    srv, state = server
    # A failing source: still ticking, but degraded (exit 1), and the header names it.
    assert await asyncio.to_thread(run_status, args(argv=["--socket", str(srv.path)])) == EXIT_DEGRADED
    out = capsys.readouterr().out
    assert "last tick: 5 s ago (every 15 s)  DEGRADED: source prometheus failing for 2 min\n" in out
    assert "job 123  hang [critical]  open 12 min  acked by alice" in out
    assert "prometheus: FAILING since 2 min ago (8 failures): ConnectionRefused" in out

    state["snap"] = snapshot(sources={"squeue": {"failing": False}})
    assert await asyncio.to_thread(run_status, args(argv=["--socket", str(srv.path)])) == EXIT_OK
    assert "last tick: 5 s ago (every 15 s)  OK\n" in capsys.readouterr().out

    state["snap"] = snapshot(last_tick_at=NOW - 46)  # > 3 x 15 s
    assert (
        await asyncio.to_thread(run_status, args(argv=["--socket", str(srv.path), "--json"]))
        == EXIT_UNHEALTHY
        == 3
    )
    data = json.loads(capsys.readouterr().out)
    assert data["healthy"] is False and data["running"] is True and data["state"] == "unhealthy"
    assert data["problems"] == ["last tick 46 s ago (limit 45 s)"]
    assert data["degraded"] == ["source prometheus failing for 2 min"]

    await srv.stop()
    assert await asyncio.to_thread(run_status, args(argv=["--socket", str(srv.path)])) == EXIT_NOT_RUNNING
    assert "not running" in capsys.readouterr().err


def test_status_reads_socket_path_from_config(short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = short_tmp / "c.toml"
    cfg.write_text(f'[daemon]\nsocket_path = "{short_tmp}/nothing.sock"\n')
    assert run_status(args(argv=["--config", str(cfg)])) == EXIT_NOT_RUNNING
    assert f"{short_tmp}/nothing.sock" in capsys.readouterr().err
    cfg.write_text("[daemon]\ntick_seconds = 0\n")
    assert run_status(args(argv=["--config", str(cfg)])) == 2


@pytest.mark.parametrize(
    ("snap", "ok"),
    [
        (snapshot(last_tick_at=NOW - 44), True),
        (snapshot(last_tick_at=NOW - 46), False),
        (snapshot(last_tick_at=None, started_at=NOW - 10), True),  # just started
        (snapshot(last_tick_at=None, started_at=NOW - 100), False),  # never ticked
        (snapshot(last_tick_ok=False), False),
        ({"last_tick_at": NOW}, False),  # no tick_seconds: cannot judge
    ],
)
def test_assess(snap: dict[str, Any], ok: bool) -> None:
    assert assess(snap, NOW).ok is ok


def test_degraded_names_failing_sources_notifiers_and_blind_jobs() -> None:
    snap = snapshot(
        sources={"squeue": {"failing": True, "failing_since": NOW - 30, "last_error": "exit 1"}},
        notifiers={"slack": {"failing": True, "failing_since": NOW - 600}, "console": {"failing": False}},
        jobs=[{"job_id": "77", "blind": ["/o/77.log"]}, {"job_id": "78", "blind": []}],
    )
    verdict = assess(snap, NOW)
    assert verdict.ok and verdict.state == "degraded"
    assert verdict.degraded == [
        "source squeue failing for 30 s",
        "notifier slack failing for 10 min",
        "job 77 blind",
    ]
    header = format_status(snap, NOW).splitlines()[1]
    assert header.endswith(
        "DEGRADED: source squeue failing for 30 s; notifier slack failing for 10 min; job 77 blind"
    )
    assert assess(snapshot(sources={}), NOW).state == "ok"


def test_format_minimal_snapshot() -> None:
    text = format_status({"tick_seconds": 15, "last_tick_at": NOW - 1, "started_at": NOW - 2}, NOW)
    assert text.splitlines() == [
        "jobdiagd ?, up 2 s",
        "last tick: 1 s ago (every 15 s)  OK",
        "jobs watched: 0",
        "open incidents: 0",
    ]


def test_format_status_shows_progress_tgs_and_incidents_per_job() -> None:
    job = {
        "job_id": "4242",
        "state": "RUNNING",
        "name": "JAX-llama",
        "last_step": 317,
        "last_step_at": NOW - 900,
        "total_steps": 2000,
        "step_time_s": 5.0,
        "expected_step": 497,
        "phase": "steady",
        "tgs": {"degraded": True, "pattern": "constant-drop", "change_pct": -23.4},
        "open_incidents": ["hang"],
    }
    text = format_status(
        {"tick_seconds": 15, "last_tick_at": NOW - 1, "started_at": NOW - 2, "jobs": [job]}, NOW
    )
    line = next(ln for ln in text.splitlines() if "4242" in ln)
    for part in (
        "step 317/2000",
        "5.0 s/step",
        "expected ≈497",
        "TGS -23% DEGRADED (constant-drop)",
        "open: hang",
    ):
        assert part in line, (part, line)


def test_status_for_a_phone_fits_its_width_and_keeps_every_fact() -> None:
    job = {
        "job_id": "4242",
        "state": "RUNNING",
        "name": "JAX-llama3-70b-pretrain-v5e-256",
        "last_step": 317,
        "last_step_at": NOW - 900,
        "total_steps": 2000,
        "step_time_s": 5.0,
        "expected_step": 497,
        "phase": "steady",
        "tgs": {"degraded": True, "pattern": "constant-drop", "change_pct": -23.4},
        "open_incidents": ["hang"],
        "blind": ["/lustre/outputs/4242-JAX-llama3-70b-pretrain-v5e-256/log"],
    }
    snap = snapshot(
        version="1.2.3",
        pid=123456,
        started_at=NOW - 7300,
        jobs=[job, {"job_id": "99", "state": "PENDING"}],
        open_incidents=[
            {
                "job_id": "4242",
                "kind": "hang",
                "severity": "critical",
                "opened_at": NOW - 600,
                "announced_at": NOW - 600,
                "acked_at": NOW - 60,
                "acked_by": "alice",
                "summary": "no training step for 15m 0s since step 317 was read; expected ≈ step 497 by now",
            }
        ],
        sources={
            "squeue": {"failing": True, "failing_since": NOW - 30, "failures": 3, "last_error": "x " * 60}
        },
        notifiers={"telegram": {"sent": 3}},
        deliveries={"telegram": {"sent": 3, "pending": 0}},
    )
    wide = format_status(snap, NOW)
    assert max(len(line) for line in wide.splitlines()) > 120  # the terminal's table, unchanged
    narrow = format_status(snap, NOW, width=PHONE_COLUMNS)
    assert max(len(line) for line in narrow.splitlines()) <= PHONE_COLUMNS == 40
    lines = narrow.splitlines()
    assert lines[:3] == ["jobdiagd 1.2.3 (pid 123456),", "  up 2 h 02 min", "last tick: 5 s ago (every 15 s)"]
    assert lines[3:6] == ["DEGRADED:", "  source squeue failing for 30 s", "  job 4242 blind"]
    assert "  4242 RUNNING" in lines and "  99 PENDING" in lines

    # Nothing is lost: every word of the wide view is in the narrow one (a long path is cut in two).
    def words(text: str) -> Counter[str]:
        return Counter(
            w.strip(";,") for w in text.split() if w != "·" and "/lustre" not in w and "-v5e" not in w
        )

    assert words(wide) == words(narrow)
    assert "".join(narrow.split()).count("/lustre/outputs/4242-JAX-llama3-70b-pretrain-v5e-256/log") == 1
