"""The notifier table: one spec per `[notifiers.*]` section, each building a notifier of its name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jobdiagd.config import NotifiersConfig, loads
from jobdiagd.notifiers.registry import NOTIFIERS, build_notifiers


def test_every_notifiers_section_has_one_spec_in_the_config_s_order() -> None:
    assert [s.name for s in NOTIFIERS] == [f.name for f in dataclasses.fields(NotifiersConfig)]


def test_each_spec_builds_the_notifier_of_its_name_and_only_when_enabled(tmp_path: Path) -> None:
    (tmp_path / "tg").write_text("123:abc\n")
    (tmp_path / "bot").write_text("xoxb-1\n")
    text = (
        f'[daemon]\nstate_dir = "{tmp_path}"\n[notifiers.console]\nenabled = false\n'
        "[notifiers.jsonl]\nenabled = true\n"
        f'[notifiers.telegram]\nenabled = true\ntoken_file = "{tmp_path / "tg"}"\nchat_ids = [1]\n'
        f'[notifiers.slack]\nenabled = true\ntoken_file = "{tmp_path / "bot"}"\ncommands = false\n'
        "channel_ids = ['C1']\n"
        '[notifiers.alertmanager]\nenabled = true\nurls = ["http://am1:9093"]\ncluster = "c1"\n'
    )
    notifiers, skipped = build_notifiers(loads(text, source="t.toml"), env={})
    assert skipped == []
    assert [n.name for n in notifiers] == ["jsonl", "telegram", "slack", "alertmanager"]
