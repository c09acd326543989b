"""The weekly goodput digest from a running daemon to its Telegram chat (the emulator), on a tiny
simulated archive, the schedule forced by an injected clock: the text and the picture, silent,
in the chat its route names, once a week across a restart."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobdiagd.config import WEEKDAYS
from jobdiagd.service import goodput_digest, plots_bridge
from jobdiagd_sim.archive import build_archive
from tests.helpers.chat import CHAT, OTHER_CHAT, daemon_config, start_daemon, until
from tests.helpers.emulators.telegram import StoredMessage, TelegramEmulator

pytestmark = pytest.mark.daemon


def digest_messages(tg: TelegramEmulator, chat: int) -> list[StoredMessage]:
    return [m for m in tg.bot_messages(chat) if "Goodput, week to" in (m.text or m.caption or "")]


async def test_the_weekly_digest_reaches_its_chat_once_with_its_picture(
    short_tmp: Path, tmp_path: Path, tg: TelegramEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "archive"
    chains = build_archive(archive, chains=4, seed=3, small=True, days=2)
    now = max(r.end for c in chains for r in c.runs) + 3600.0
    looked: list[float] = []

    def clock() -> float:  # the digest's clock only: the rest of the daemon runs on real time
        looked.append(now)
        return now

    monkeypatch.setattr(goodput_digest, "wall", clock)
    day = datetime.fromtimestamp(now, UTC)
    outputs = short_tmp / "outputs"
    outputs.mkdir()
    cfg = daemon_config(
        short_tmp,
        tg,
        extra=f"""
[[notifiers.telegram.routes]]
chat = {OTHER_CHAT}
kinds = ["{goodput_digest.DIGEST_KIND}"]

[goodput.digest]
enabled = true
weekday = "{WEEKDAYS[day.weekday()]}"
hour = {day.hour}
timezone = "UTC"
outputs_roots = ["{archive}"]
accounting = false
""",
    )
    pictures = plots_bridge.available()
    d = await start_daemon(cfg, outputs)
    try:
        sent = await until(
            lambda: (m := digest_messages(tg, OTHER_CHAT)) and len(m) == 1 + pictures and m,
            "the digest and its picture",
            within=120,
        )
        text = sent[0]
        week_day = day.strftime("%Y-%m-%d")
        assert text.text is not None and text.text.startswith(f"Goodput, week to {week_day}: ")
        for section in ("Where the lost GPU-hours went", "Suspect nodes", "Slowest hang detections"):
            assert section in text.text
        assert text.silent  # a report: it never rings
        if pictures:
            photo = sent[1]
            assert photo.photo is not None and photo.photo.startswith(b"\x89PNG") and photo.silent
            assert (photo.caption or "").startswith(f"Goodput, week to {week_day}")
        assert digest_messages(tg, CHAT) == []  # its route's chat only
    finally:
        await d.stop()
    notes = [json.loads(x) for x in (short_tmp / "state" / "notifications.jsonl").read_text().splitlines()]
    assert [n["kind"] for n in notes].count(goodput_digest.DIGEST_KIND) == 1

    # A restart in the same week: the store remembers the week, nothing more is sent.
    looked.clear()
    d = await start_daemon(cfg, outputs)
    try:
        await until(lambda: looked, "the digest's first look after the restart")
        # The look and its decision run without a pause in between: it is made by now.
        assert len(digest_messages(tg, OTHER_CHAT)) == 1 + pictures
    finally:
        await d.stop()
    notes = [json.loads(x) for x in (short_tmp / "state" / "notifications.jsonl").read_text().splitlines()]
    assert [n["kind"] for n in notes].count(goodput_digest.DIGEST_KIND) == 1
