"""Config loading: defaults, the shipped examples, and errors that name the file and the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from jobdiagd.config import (
    Config,
    ConfigError,
    bot_api_root,
    default_config,
    load,
    load_for_command,
    loads,
    restart_required,
)

REPO = Path(__file__).resolve().parents[2]


def errors_of(text: str, source: str = "config.toml") -> list[str]:
    with pytest.raises(ConfigError) as info:
        loads(text, source=source, base_dir=Path("/etc/jobdiagd"))
    return info.value.errors


def test_example_config_loads_and_documents_the_defaults() -> None:
    cfg = load(REPO / "config" / "jobdiagd.example.toml")
    # The example claims every key shows its default: hold it to that.
    assert dataclasses.replace(cfg, source="") == dataclasses.replace(default_config(), source="")
    assert cfg.source.endswith("jobdiagd.example.toml")


def test_example_config_mentions_every_key() -> None:
    text = (REPO / "config" / "jobdiagd.example.toml").read_text()

    def keys(obj: object, prefix: str) -> list[str]:
        out = []
        for f in dataclasses.fields(obj):  # type: ignore[arg-type]
            if f.name == "source":
                continue
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                out += keys(value, f"{prefix}{f.name}.")
            else:
                out.append(f"{prefix}{f.name}")
        return out

    missing = []
    section = ""
    present = set()
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1] + "."
        elif "=" in line and not line.startswith("#"):
            present.add(section + line.split("=", 1)[0].strip())
    missing = [k for k in keys(Config(), "") if k not in present]
    assert missing == []


def test_demo_config_loads() -> None:
    cfg = load(REPO / "config" / "demo.toml")
    assert cfg.daemon.tick_seconds == 5
    assert cfg.notifiers.jsonl.enabled
    # A relative jsonl path lives in the state dir, not next to the config file.
    assert cfg.notifiers.jsonl.path == Path("/tmp/jobdiagd-demo/notifications.jsonl")


def test_empty_file_gives_defaults() -> None:
    cfg = loads("", source="empty.toml")
    assert cfg.daemon.tick_seconds == 15.0
    assert cfg.detectors.hang.min_stall_seconds == 120
    assert cfg.detectors.hang.stall_factor == 3.0
    assert cfg.detectors.tgs.drop_pct == 10
    assert (cfg.detectors.tgs.baseline_first_step, cfg.detectors.tgs.baseline_last_step) == (5, 15)
    assert cfg.detectors.tgs.recent_steps == 10
    assert cfg.daemon.metrics_port == 0
    assert cfg.tsdb.confirm_hang_with_power is False
    assert cfg.detectors.enabled() == {"hang": True, "tgs": True, "failure_signature": True, "job_end": True}


def test_error_names_file_section_and_key() -> None:
    assert errors_of("[daemon]\ntick_seconds = -1\n") == [
        "config.toml: [daemon] tick_seconds: must be between 0.05 and 3600 (shorter only burns CPU; "
        "a hang is paged up to one tick late), got -1"
    ]


def test_nested_section_error() -> None:
    assert errors_of("[detectors.hang]\nstall_factor = 0.5\n") == [
        "config.toml: [detectors.hang] stall_factor: must be between 1 and 100 "
        "(below 1 every normal step would be a stall), got 0.5"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[daemon]\ntick_second = 3\n",
            "config.toml: [daemon] tick_second: unknown key (did you mean 'tick_seconds'?)",
        ),
        (
            "[slurm]\nbackend = 'cli'\nuserz = []\n",
            "config.toml: [slurm] userz: unknown key (did you mean 'users'?)",
        ),
        ("[detectors.hang]\nmin_stall = 3\n", "config.toml: [detectors.hang] min_stall: unknown key"),
        ("[tsdb.ssh]\nhostt = 'x'\n", "config.toml: [tsdb.ssh] hostt: unknown key"),
        ("[tsdb.thresholds]\nwarmup = 3\n", "config.toml: [tsdb.thresholds] warmup: unknown key"),
        ("[deamon]\n", "config.toml: [deamon]: unknown section (did you mean 'daemon'?)"),
        ("[detectors.hangs]\n", "config.toml: [detectors.hangs]: unknown section (did you mean 'hang'?)"),
        ("[notifiers.email]\nenabled = true\n", "config.toml: [notifiers.email]: unknown section"),
        ("top_level = 1\n", "config.toml: top_level: unknown key"),
    ],
)
def test_unknown_keys_rejected_at_every_level(text: str, expected: str) -> None:
    errs = errors_of(text)
    assert len(errs) == 1
    assert errs[0].startswith(expected)


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ("[daemon]\ntick_seconds = 'fast'\n", "[daemon] tick_seconds", "must be a number"),
        ("[daemon]\ntick_seconds = true\n", "[daemon] tick_seconds", "must be a number"),
        ("[daemon]\nmetrics_port = 70000\n", "[daemon] metrics_port", "TCP port"),
        ("[daemon]\nmetrics_port = 9.5\n", "[daemon] metrics_port", "must be an integer"),
        ("[daemon]\nmetrics_host = '0.0.0.0'\n", "[daemon] metrics_host", "loopback"),
        ("[daemon]\nlog_level = 'loud'\n", "[daemon] log_level", "must be one of"),
        ("[daemon]\nsocket_group = 'no-such-group-xyz'\n", "[daemon] socket_group", "no such group"),
        ("[daemon]\nsocket_path = '/" + "a" * 120 + "'\n", "[daemon] socket_path", "too long"),
        ("[daemon]\nsqueue_interval_seconds = 0\n", "[daemon] squeue_interval_seconds", "between 1 and"),
        ("[daemon]\n state_dir = ''\n", "[daemon] state_dir", "non-empty path"),
        ("[slurm]\nbackend = 'rest'\n", "[slurm] backend", "'cli', 'pyslurm', 'auto'"),
        ("[slurm]\nusers = 'alice'\n", "[slurm] users", "must be a list"),
        ("[slurm]\nusers = ['alice', 'bad name;rm']\n", "[slurm] users", "not valid names"),
        ("[slurm]\npartitions = [1]\n", "[slurm] partitions", "item 0: must be a string"),
        ("[slurm]\noutputs_roots = ['']\n", "[slurm] outputs_roots", "non-empty path"),
        ("[detectors.tgs]\ndrop_pct = 100\n", "[detectors.tgs] drop_pct", "between 0 and 100"),
        (
            "[detectors.tgs]\nbaseline_first_step = 15\nbaseline_last_step = 5\n",
            "[detectors.tgs] baseline_last_step",
            "must be >",
        ),
        ("[detectors.tgs]\nrecent_steps = 0\n", "[detectors.tgs] recent_steps", "between 1 and"),
        ("[detectors.hang]\nenabled = 'yes'\n", "[detectors.hang] enabled", "true or false"),
        (
            "[incidents]\nreminder_interval_seconds = 0\n",
            "[incidents] reminder_interval_seconds",
            "between 10 and",
        ),
        (
            "[delivery]\nretry_initial_seconds = 10\nretry_max_seconds = 5\n",
            "[delivery] retry_max_seconds",
            ">=",
        ),
        ("[notifiers.console]\ncolor = 'rainbow'\n", "[notifiers.console] color", "must be one of"),
        ("[notifiers.console]\nenabled = false\n", "[notifiers]", "at least one notifier"),
        (
            "[notifiers.telegram]\nenabled = true\nchat_ids = [1]\n",
            "[notifiers.telegram] token_file",
            "exactly one",
        ),
        (
            "[notifiers.telegram]\nenabled = true\ntoken_credential = 'tg'\n",
            "[notifiers.telegram] chat_ids",
            "at least one",
        ),
        (
            "[notifiers.telegram]\nchat_ids = ['@chan']\n",
            "[notifiers.telegram] chat_ids",
            "must be an integer",
        ),
        (
            "[notifiers.telegram]\ntoken_credential = '../../etc/shadow'\n",
            "[notifiers.telegram] token_credential",
            "credential",
        ),
        ("[notifiers.slack]\nchannel_ids = ['general']\n", "[notifiers.slack] channel_ids", "Slack ids"),
        (
            "[notifiers.slack]\nenabled = true\ntoken_credential = 'sl'\nchannel_ids = ['C1']\n",
            "[notifiers.slack] app_token_file",
            "xapp- token",
        ),
        ("[notifiers.slack]\npage_mention = '@here'\n", "[notifiers.slack] page_mention", "<!here>"),
        ("[notifiers.slack]\nslash_command = 'jobdiagd'\n", "[notifiers.slack] slash_command", "slash command"),
        (
            "[notifiers.slack]\nchannel_ids = ['C1']\n[[notifiers.slack.routes]]\nchannel = 'C2'\n",
            "[notifiers.slack.routes[0]] channel",
            "not in channel_ids",
        ),
        ("[tsdb]\ngpu_model = 'MI 300'\n", "[tsdb] gpu_model", "unknown GPU model"),
        ("[tsdb]\nconfirm_hang_with_power = 'yes'\n", "[tsdb] confirm_hang_with_power", "true or false"),
        ("[tsdb.ssh]\nconnect_timeout_s = 'soon'\n", "[tsdb.ssh] connect_timeout_s", "a number"),
        ("[tsdb]\nssh = 3\n", "[tsdb.ssh]", "must be a table"),
    ],
)
def test_every_error_names_file_and_key(text: str, key: str, fragment: str | None) -> None:
    errs = errors_of(text, source="/etc/jobdiagd/config.toml")
    assert len(errs) == 1, errs
    assert errs[0].startswith(f"/etc/jobdiagd/config.toml: {key}")
    if fragment:
        assert fragment in errs[0]


def test_all_errors_reported_at_once() -> None:
    errs = errors_of("[daemon]\ntick_seconds = 0\nlog_level = 'x'\n[slurm]\nbackend = 'y'\n")
    assert [e.split(":")[1].strip() for e in errs] == [
        "[daemon] tick_seconds",
        "[daemon] log_level",
        "[slurm] backend",
    ]


def test_invalid_toml_names_file() -> None:
    errs = errors_of("[daemon\n")
    assert errs[0].startswith("config.toml: invalid TOML")


def test_missing_file_names_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: cannot read"):
        load(tmp_path / "nope.toml")


def test_relative_paths_resolve_against_config_folder(tmp_path: Path) -> None:
    p = tmp_path / "cfg" / "c.toml"
    p.parent.mkdir()
    p.write_text('[daemon]\nstate_dir = "state"\nsocket_path = "s.sock"\n[notifiers.jsonl]\nenabled = true\n')
    cfg = load(p)
    assert cfg.daemon.state_dir == tmp_path / "cfg" / "state"
    assert cfg.daemon.socket_path == tmp_path / "cfg" / "s.sock"
    assert cfg.notifiers.jsonl.path == tmp_path / "cfg" / "state" / "notifications.jsonl"


def test_config_is_frozen() -> None:
    cfg = default_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.daemon.tick_seconds = 1  # type: ignore[misc]


def test_valid_chat_placeholders_accepted() -> None:
    cfg = loads(
        "[notifiers.telegram]\nenabled = true\ntoken_credential = 'telegram-token'\nchat_ids = [-1001234]\n"
        "allowed_users = [42]\n[notifiers.slack]\nenabled = true\ntoken_file = '/etc/jobdiagd/slack'\n"
        "app_token_credential = 'slack-app'\nchannel_ids = ['C012AB']\n",
        source="c.toml",
    )
    assert cfg.notifiers.telegram.chat_ids == (-1001234,)
    assert cfg.notifiers.slack.token_file == Path("/etc/jobdiagd/slack")
    assert cfg.notifiers.slack.app_token_credential == "slack-app"
    send_only = loads(
        "[notifiers.slack]\nenabled = true\ntoken_credential = 'sl'\nchannel_ids = ['C1']\ncommands = false\n"
        "page_mention = '<!subteam^S0ONCALL> <@U0ALICE>'\n",
        source="c.toml",
    )
    assert send_only.notifiers.slack.app_token_file is None and not send_only.notifiers.slack.commands


def test_restart_required_lists_keys_a_reload_cannot_apply() -> None:
    old = loads("", source="a.toml")
    new = loads(
        "[daemon]\ntick_seconds = 5\nmetrics_port = 9100\n[slurm]\nbackend = 'cli'\n", source="a.toml"
    )
    assert restart_required(old, new) == ["[daemon] metrics_port", "[slurm] backend"]
    assert restart_required(old, old) == []


def test_load_for_command_reports_a_bad_config_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon]\ntick_secondz = 3\n")
    assert load_for_command(bad, "detectors") is None
    err = capsys.readouterr().err
    assert err.startswith(f"jobdiagd detectors: {bad}") and "tick_secondz" in err
    assert err.count("\n") == 1


def test_load_for_command_without_a_path_gives_the_defaults() -> None:
    assert load_for_command(None, "backtest") == default_config()


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("api.telegram.org", "must be an http:// or https:// URL"),
        ("https://", "has no host"),
        ("https://api.telegram.org/bot?x=1", "must not have a query"),
        ("https://api.telegram.org /bot", "without white space"),
        ("https://api.telegram.org/bot123456:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA/getMe", "must not contain the bot token"),
    ],
)
def test_a_bot_api_url_that_is_garbage_is_refused_naming_the_key(url: str, fragment: str) -> None:
    (err,) = errors_of(f"[notifiers.telegram]\napi_base_url = '{url}'\n")
    assert err.startswith("config.toml: [notifiers.telegram] api_base_url: ") and fragment in err, err
    assert "AAAAAAAA" not in err  # a token pasted in the URL is not echoed


def test_a_bot_api_url_with_or_without_a_final_bot_names_the_same_server() -> None:
    for url in ("https://tg.example.org", "https://tg.example.org/", "https://tg.example.org/bot", "https://tg.example.org/bot/"):
        cfg = loads(f"[notifiers.telegram]\napi_base_url = '{url}'\n")
        assert bot_api_root(cfg.notifiers.telegram.api_base_url) == "https://tg.example.org", url
    assert bot_api_root("http://127.0.0.1:8081/tg/bot") == "http://127.0.0.1:8081/tg"  # a path prefix stays
    assert bot_api_root("https://robot.example.org/abbot") == "https://robot.example.org/abbot"
