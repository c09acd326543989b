"""[notifiers.alertmanager]: validated like every section; its secret read from a file or credential."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd.config import ConfigError, loads
from jobdiagd.notifiers.alertmanager import AlertmanagerNotifier
from jobdiagd.notifiers.registry import build_alertmanager, build_notifiers

GOOD = """
[notifiers.alertmanager]
enabled = true
urls = ["http://am1:9093", "https://am2.example.org/alertmanager/"]
cluster = "frontier"
"""


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        loads(text, source="c.toml", base_dir=Path("/etc/jobdiagd"))
    return info.value.errors


def test_a_minimal_section_builds_a_notifier_posting_to_every_instance() -> None:
    cfg = loads(GOOD, source="c.toml")
    am = cfg.notifiers.alertmanager
    assert (am.resend_interval_seconds, am.timeout_seconds, am.auth) == (60.0, 4.0, "none")
    notifiers, skipped = build_notifiers(cfg)
    assert skipped == [] and [n.name for n in notifiers] == ["console", "alertmanager"]
    built = notifiers[1]
    assert isinstance(built, AlertmanagerNotifier)
    assert built.urls == (
        "http://am1:9093/api/v2/alerts",
        "https://am2.example.org/alertmanager/api/v2/alerts",
    )
    assert built.options.instance  # this host's name when not configured


def test_alertmanager_alone_is_enough_of_a_notifier() -> None:
    loads(GOOD + "[notifiers.console]\nenabled = false\n", source="c.toml")


def section(**keys: str) -> str:
    """The section with TOML values overriding (or adding to) a valid minimal one."""
    merged = {"enabled": "true", "urls": '["http://am1:9093"]', "cluster": '"frontier"', **keys}
    return "[notifiers.alertmanager]\n" + "".join(f"{k} = {v}\n" for k, v in merged.items())


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        ({"urls": '["ftp://am1"]'}, "urls: item 0: must be an http:// or https:// URL"),
        ({"urls": '["http://"]'}, "urls: item 0: has no host"),
        ({"urls": '["http://am1:9093?x=1"]'}, "urls: item 0: must not have a query or fragment"),
        ({"urls": '["http://am1", "http://am1"]'}, "urls: lists the same URL twice"),
        ({"urls": "[]"}, "urls: must list every Alertmanager instance when enabled"),
        ({"cluster": '""'}, "cluster: must name the cluster when enabled"),
        ({"cluster": '"has space"'}, "cluster: must be 1-128 letters"),
        ({"resend_interval_seconds": "0.5"}, "resend_interval_seconds: must be between 1 and 900 (alerts expire 4 intervals after the daemon dies), got 0.5"),
        (
            {"timeout_seconds": "6"},
            "timeout_seconds: must be at most half of [delivery] send_timeout_seconds",
        ),
        ({"runbook_url": '"https://wiki/{host}"'}, "runbook_url: has an unknown or malformed placeholder"),
        ({"auth": '"bearer"'}, "secret_file: set exactly one of secret_file or secret_credential"),
        ({"auth": '"basic"', "secret_credential": '"am"'}, 'username: must be set for auth = "basic"'),
        ({"username": '"bob"'}, 'auth: is "none" but username/secret_file/secret_credential is set'),
        ({"resend_intervall_seconds": "30"}, "unknown key (did you mean 'resend_interval_seconds'?)"),
    ],
)
def test_bad_keys_are_named(keys: dict[str, str], error: str) -> None:
    errs = errors_of(section(**keys))
    assert len(errs) == 1, errs
    assert errs[0].startswith("c.toml: [notifiers.alertmanager] ") and error in errs[0], errs


def test_credentials_in_a_url_are_refused_and_not_echoed() -> None:
    errs = errors_of(GOOD.replace("http://am1:9093", "http://jd:hunter2@am1:9093"))
    assert errs == [
        "c.toml: [notifiers.alertmanager] urls: item 0: must not carry credentials "
        "(use secret_file or secret_credential)"
    ]
    assert "hunter2" not in errs[0]


def test_bearer_token_from_a_systemd_credential(tmp_path: Path) -> None:
    (tmp_path / "am-token").write_text("tok-123\n")
    cfg = loads(GOOD + 'auth = "bearer"\nsecret_credential = "am-token"\n', source="c.toml")
    am = build_alertmanager(cfg.notifiers.alertmanager, env={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert am._authorization == "Bearer tok-123"
    assert "tok-123" not in repr(am)


def test_basic_auth_password_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("s3cret\n")
    cfg = loads(GOOD + f'auth = "basic"\nusername = "jd"\nsecret_file = "{tmp_path}/pw"\n', source="c.toml")
    am = build_alertmanager(cfg.notifiers.alertmanager)
    assert am._authorization == "Basic amQ6czNjcmV0"  # base64("jd:s3cret")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "missing or empty"),
        ("\n", "missing or empty"),
        ("a\x07b", "characters an HTTP header cannot carry"),
    ],
)
def test_a_missing_or_unusable_secret_stops_the_start_without_showing_it(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    secret = tmp_path / "token"
    if content is not None:
        secret.write_text(content)
    cfg = loads(GOOD + f'auth = "bearer"\nsecret_file = "{secret}"\n', source="c.toml")
    with pytest.raises(ConfigError) as info:
        build_notifiers(cfg)
    (err,) = info.value.errors
    assert err.startswith("c.toml: [notifiers.alertmanager] secret_file: ") and problem in err
    assert "a\x07b" not in err
