"""Slack test helpers: the Slack emulator as a fixture and a daemon config pointing at it (the daemon runner
and the simulated jobs are shared with the Telegram tests, in tests/helpers/chat.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers.daemon import chat_daemon_toml
from tests.helpers.emulators.slack import SlackEmulator

CHAN = "C0OPS0001"
OTHER_CHAN = "C0ELSE001"
FOREIGN_CHAN = "C0FOREIGN"  # the app is a member, but it is not an allowed channel
ALICE = "U0ALICE01"  # allowed user
MALLORY = "U0MALL001"  # not allowed
OPERATOR = "U0OPER001"


@pytest.fixture
async def slack() -> AsyncIterator[SlackEmulator]:
    em = SlackEmulator()
    await em.start()
    em.add_channel(CHAN, "ops")
    em.add_channel(OTHER_CHAN, "elsewhere")
    em.add_channel(FOREIGN_CHAN, "random")
    em.add_user(ALICE, "alice")
    em.add_user(MALLORY, "mallory")
    em.add_user(OPERATOR, "olga")
    try:
        yield em
    finally:
        await em.stop()


def slack_daemon_config(
    work: Path, em: SlackEmulator, *, extra: str = "", min_stall: float = 3.0, section_extra: str = ""
) -> Path:
    bot = work / "slack-bot-token"
    bot.write_text(em.bot_token + "\n")
    app = work / "slack-app-token"
    app.write_text(em.app_token + "\n")
    cfg = work / "cfg.toml"
    cfg.write_text(
        chat_daemon_toml(work, min_stall=min_stall)
        + f"""[notifiers.slack]
enabled = true
token_file = "{bot}"
app_token_file = "{app}"
channel_ids = ["{CHAN}", "{OTHER_CHAN}"]
allowed_users = ["{ALICE}", "{OPERATOR}"]
operators = ["{OPERATOR}"]
api_base_url = "{em.base_url}"
page_mention = "<!here>"
{section_extra}
{extra}
"""
    )
    return cfg
