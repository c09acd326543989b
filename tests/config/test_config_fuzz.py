"""Fuzzing the config loader (config.loads, with the [tsdb] section of tsdb.settings).

Documents are built from the schema's own sections and keys with values of every TOML type
(strings with NULs, `~user` paths and token shapes, 64-bit integers, inf/nan, arrays and
tables where scalars belong), plus unknown keys and raw text. Properties: `loads` returns a
`Config` or raises `ConfigError` (one line per problem, each naming the source), never
anything else; an error never shows a value given to a secret key; a value inside a key's
bounds loads as given, and one outside is refused naming the key.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from jobdiagd.config import Bounded, Config, ConfigError, loads
from jobdiagd.tsdb.settings import SshSettings, Thresholds, TsdbSettings
from tests.helpers.fuzz import fuzz_settings

SOURCE = "/etc/jobdiagd/fuzz.toml"


def _schema(cls: type[Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], list[str]]:
    """Section path -> key names, from the config dataclasses."""
    out: dict[tuple[str, ...], list[str]] = {prefix: []}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) and f.name != "tsdb":
            out.update(_schema(typing.cast(type[Any], tp), (*prefix, f.name)))
        elif f.name != "source":
            out[prefix].append(f.name)
    return out


SCHEMA = _schema(Config)
SCHEMA[("tsdb",)] = [f.name for f in dataclasses.fields(TsdbSettings) if f.name not in ("thresholds", "ssh")]
SCHEMA[("tsdb", "thresholds")] = [f.name for f in dataclasses.fields(Thresholds)]
SCHEMA[("tsdb", "ssh")] = [f.name for f in dataclasses.fields(SshSettings)]
SCHEMA[("tsdb", "gpu_profiles", "H100")] = ["train_power_min_w", "vram_gib", "name", "bogus"]
SECTIONS = sorted(SCHEMA)

# A bot token, a Slack token: what a careless admin pastes into the wrong key.
TG_TOKEN = "123456789:AAEhBP0av28yq-SECRETSECRETSECRETxx"
SLACK_TOKEN = "xoxb-1234-5678-SECRETSECRETSECRET"
SECRET_KEYS = {"token_file", "token_credential", "app_token_file", "app_token_credential", "secret_file",
               "secret_credential"}

_text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)
scalar = st.one_of(
    _text,
    st.sampled_from(
        ["", "~nosuchuser/x", "~/x", "/etc/../root", "a\x00b", "127.0.0.1", "::1", "localhost", "info",
         "22:00-07:00", "Europe/Paris", "Not/AZone", "xoxb-", "http://u:p@h/", "https://h:0/", "http://[::1/",
         "{alertname}", "{0}", "{", "/jobdiagd", "<!here>", "C0123456789", TG_TOKEN, SLACK_TOKEN, "H100",
         "nosuchgroup", "root", "a" * 200]
    ),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, -1, 65535, 65536, 2**31]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)
value = st.recursive(
    scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["a", "chat", "b"]), inner, max_size=3)
    ),
    max_leaves=8,
)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        # JSON's escapes are TOML's; DEL must be escaped in TOML (JSON leaves it raw).
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def render(doc: dict[tuple[str, ...], dict[str, Any]]) -> str:
    out = []
    for section, keys in doc.items():
        if section:
            out.append("[" + ".".join(json.dumps(p) for p in section) + "]")
        out += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in keys.items()]
    return "\n".join(out) + "\n"


@st.composite
def document(draw: st.DrawFn) -> dict[tuple[str, ...], dict[str, Any]]:
    doc: dict[tuple[str, ...], dict[str, Any]] = {}
    for section in draw(st.lists(st.sampled_from(SECTIONS), max_size=6, unique=True)):
        names = SCHEMA[section] + ["unknown_key", "enabled"]
        doc[section] = draw(st.dictionaries(st.sampled_from(names), value, max_size=5))
    return doc


def _check(text: str) -> Config | None:
    try:
        cfg = loads(text, source=SOURCE, base_dir=Path("/etc/jobdiagd"))
    except ConfigError as exc:
        assert exc.errors and all(e.startswith(SOURCE) for e in exc.errors), exc.errors
        assert len(str(exc)) < 20_000  # one line per problem, values shortened
        for token in (TG_TOKEN, SLACK_TOKEN):
            assert token not in str(exc)
        return None
    assert isinstance(cfg, Config)
    return cfg


@fuzz_settings(examples=300)
@given(document())
# Found by this test: `~nosuchuser` made Path.expanduser() raise RuntimeError, a NUL in
# socket_group made grp.getgrnam() raise ValueError, and a [tsdb] sub-table that is not a
# table (or a gpu profile that is not one) raised AttributeError.
@example({("daemon",): {"state_dir": "~nosuchuser/state"}})
@example({("daemon",): {"socket_group": "a\x00b"}})
@example({("tsdb",): {"gpu_profiles": [1]}})
@example({("tsdb",): {"gpu_profiles": {"H100": 1}}})
@example({("tsdb",): {"thresholds": 1}})
# Found by the long profile: a number where a GPU model name belongs raised AttributeError.
@example({("tsdb",): {"gpu_model": 0}})
@example({("tsdb",): {"work_dir": 1}})
@example({("notifiers", "telegram"): {"token_file": TG_TOKEN, "enabled": True}})
@example({("notifiers", "slack"): {"token_credential": SLACK_TOKEN}})
# Found by this test: a token pasted into a key that is not a secret one was echoed.
@example({("chat",): {"quiet_hours": TG_TOKEN}})
@example({("tsdb",): {"gpu_model": SLACK_TOKEN}})
@example({("tsdb", "ssh"): {"config_paths": [1, TG_TOKEN]}})
def test_any_document_loads_or_gives_config_errors(doc: dict[tuple[str, ...], dict[str, Any]]) -> None:
    _check(render(doc))


@fuzz_settings(examples=200)
@given(st.text(max_size=400))
@example("[daemon]\nstate_dir = 1979-05-27T07:32:00Z\n")
@example("[[notifiers.telegram.routes]]\nchat = 1\n[notifiers]\ntelegram = 3\n")
def test_any_text_loads_or_gives_config_errors(text: str) -> None:
    _check(text)


def _bounded_keys() -> list[tuple[tuple[str, ...], str, Bounded, type]]:
    out = []

    def walk(cls: type[Any], prefix: tuple[str, ...]) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp) and f.name != "tsdb":
                walk(typing.cast(type[Any], tp), (*prefix, f.name))
            for check in f.metadata.get("validators", ()):
                if isinstance(check, Bounded):
                    out.append((prefix, f.name, check, tp))

    walk(Config, ())
    return out


BOUNDED = _bounded_keys()


def test_the_bounded_keys_were_found() -> None:
    assert len(BOUNDED) > 20 and any(k == "tick_seconds" for _, k, _, _ in BOUNDED)


@pytest.mark.parametrize(("section", "key", "bound", "tp"), BOUNDED, ids=[f"{'.'.join(s)}.{k}" for s, k, _, _ in BOUNDED])
@fuzz_settings(examples=15)
@given(data=st.data())
def test_a_value_inside_its_bounds_loads_as_given_and_one_outside_is_refused(
    section: tuple[str, ...], key: str, bound: Bounded, tp: type, data: st.DataObject
) -> None:
    low, high = bound.low, bound.high
    if tp is int:
        inside: float = data.draw(st.integers(math.ceil(low) + bound.exclusive, math.floor(high) - bound.exclusive))
        outside: float = data.draw(st.sampled_from([math.ceil(low) - 1, math.floor(high) + 1, -(2**63)]))
    else:
        inside = data.draw(st.floats(low, high, exclude_min=bound.exclusive, exclude_max=bound.exclusive))
        outside = data.draw(st.sampled_from([low - 1, high * 2 + 1, -1e300, 1e300]))
    # Keys other tables must agree with: keep the document valid apart from the key under test.
    base = {("notifiers", "jsonl"): {"enabled": True}}
    cfg = _check(render({**base, section: {key: inside}}))
    if cfg is not None:
        got = cfg
        for part in section:
            got = getattr(got, part)
        assert getattr(got, key) == inside
    else:  # only a cross-check (e.g. baseline_last_step > baseline_first_step) may refuse it
        with pytest.raises(ConfigError) as err:
            loads(render({**base, section: {key: inside}}), source=SOURCE)
        assert "must be between" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        loads(render({**base, section: {key: outside}}), source=SOURCE)
    assert f"{key}: must be between" in str(err.value)
