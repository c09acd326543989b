"""Injection attempts through what others write: host names in a job's log, PromQL and paths in chat.

Hostile values are planted where a user controls the text (the job's own log: the tunnel line,
the Ray head line, JOB_NODELIST; a chat command's arguments) and followed to where they could
do harm: the head node ssh is asked to reach, the `diagnose` command run on the job, a PromQL
matcher (parsed by the real promtool), and the daemon behind the chat router.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from jobdiagd.chat.auth import Authorizer, Sender
from jobdiagd.chat.router import ChatRouter
from jobdiagd.rules.hostlist import expand_hostlist, valid_host
from jobdiagd.triage.engine import triage
from jobdiagd.tsdb.access import AccessError, validate_host
from jobdiagd.tsdb.client import regex_union
from jobdiagd_sim import lines as L
from tests.chat.test_chat_commands_fuzz import NOW, Conv, RecordingBackend
from tests.helpers.fuzz import fuzz_settings

HOSTILE_HOSTS = [
    "$(touch {mark})",
    "`touch {mark}`",
    "node001;touch {mark}",
    "-oProxyCommand=touch {mark}",
    "node001\n",
    "node001 -oProxyCommand=x",
    "../../etc/passwd",
    "node001.evil.example",  # well-formed, but not one of the job's nodes
]


def hostile_job(outputs: Path, mark: Path, host: str) -> Path:
    """A RAY=1 job whose log names `host` as head node in every place a log can."""
    name = "4242-JAX-llama3.1-8b-hostile"
    job_dir = outputs / name
    job_dir.mkdir(parents=True)
    (job_dir / "log").symlink_to(f"../{name}.log")
    bad = host.format(mark=mark)
    lines = L.header_lines(
        job_id="4242", name="JAX-llama3.1-8b-hostile", nnodes=2, nodelist="node[001-002]", jax_port=12321,
        ray_port=6379, passthrough={"steps": 100}, model="llama3.1-8b",
    )
    lines += [
        f"JOB_NODELIST_EXTRA={bad}",
        f"[Ray] Starting HEAD on {bad}:6379 (bind=10.0.0.1)",
        f"  ssh -J me@login01 -L 8265:localhost:8265 -L 9190:localhost:9190 root@{bad}",
        "[Prometheus] Started on port 9190 (ray: 'node001:55080')",
    ]
    for k in range(5):
        f = L.StepFields(step=k, seconds=1.0, tflops=40.0, tokens=3000.0, total_weights=196608, loss=2.5)
        lines.append(L.srun_prefix(0, 2) + L.step_line(f))
    (outputs / f"{name}.log").write_text("\n".join(lines) + "\n")
    return job_dir


@pytest.mark.parametrize("host", HOSTILE_HOSTS)
def test_a_hostile_head_node_in_the_log_never_becomes_the_ssh_target(tmp_path: Path, host: str) -> None:
    outputs, mark = tmp_path / "outputs", tmp_path / "PWNED"
    job_dir = hostile_job(outputs, mark, host)
    bad = host.format(mark=mark)
    result = triage(job_dir, now=1_750_000_000.0, outputs_root=outputs)
    assert result.nodes == ["node001", "node002"]
    assert result.live.head_node in ("node001", "node002"), result.live  # the tunnel/Ray head is not trusted
    if not bad.startswith("node001."):  # a name under a node's own (unknown) domain is its FQDN
        with pytest.raises(AccessError):
            validate_host(bad, result.nodes)
    if "\n" in bad or " " in bad or "$" in bad or "`" in bad or ";" in bad or bad.startswith("-"):
        assert not valid_host(bad)
        assert bad not in expand_hostlist(bad) and all(valid_host(h) for h in expand_hostlist(bad))
    # The diagnosis (as `/diagnose` runs it) of that job: no shell, no ssh to the planted name.
    done = subprocess.run(
        [sys.executable, "-m", "jobdiagd.cli", "diagnose", str(job_dir), "--json", "--no-anomaly"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert not mark.exists()
    assert f"ssh to {bad}" not in done.stdout + done.stderr and f"{bad}:9190" not in done.stdout + done.stderr


# -- PromQL -----------------------------------------------------------------------------------

HOSTILE_LABELS = ['x"} or vector(1) or up{a="', "a|b", ".*", "\\", '\\"', "node[001-002]", "(", "a\tb", "é€𝄞"]


def _go_unquote(literal: str) -> str:
    """A PromQL double-quoted string as Go's strconv.Unquote reads it (the escapes regex_union uses)."""
    return json.loads(literal, strict=False)  # a raw tab is allowed in a PromQL string


@fuzz_settings(examples=300)
@given(st.lists(st.text(st.characters(blacklist_categories=["Cs", "Cc"]), min_size=1, max_size=12), min_size=1, max_size=5))
@example(HOSTILE_LABELS)
def test_regex_union_matches_each_value_literally(values: list[str]) -> None:
    literal = '"' + regex_union(values) + '"'
    pattern = _go_unquote(literal)  # what Prometheus compiles (RE2, anchored)
    for v in values:
        assert re.fullmatch(pattern, v), (pattern, v)
    for other in ("zzz-not-a-value", "", values[0] + "x"):
        if other not in values:
            assert not re.fullmatch(pattern, other), (pattern, other)


@pytest.mark.prometheus  # promtool checks the rules file
def test_hostile_label_values_stay_inside_their_promql_string(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: scripts/setup.sh installs prometheus"
    rules = ["groups:", "  - name: injection", "    rules:"]
    for i, v in enumerate(HOSTILE_LABELS):
        expr = f'up{{host=~"{regex_union([v])}"}}'
        rules += [f"      - record: probe_{i}", f"        expr: {json.dumps(expr, ensure_ascii=False)}"]
    path = tmp_path / "rules.yml"
    path.write_text("\n".join(rules) + "\n")
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and f"SUCCESS: {len(HOSTILE_LABELS)} rules found" in done.stdout, done.stdout + done.stderr
    # Control: the same value not escaped ends the string early, and promtool rejects the rule.
    path.write_text(
        "groups:\n  - name: control\n    rules:\n      - record: probe\n"
        f"        expr: {json.dumps('up{host=~' + chr(34) + 'a' + chr(34) + 'b' + chr(34) + '}')}\n"
    )
    control = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert control.returncode != 0, control.stdout


# -- chat arguments ---------------------------------------------------------------------------

CHAT_ATTEMPTS = [
    '/diagnose 4242 up{job="x"}',
    "/diagnose 4242 sum(rate(x[5m]))or(vector(1))",
    '/diagnose up{job="x"}',
    "/triage ../../etc/passwd",
    "/triage {root}/../secret/key",
    "/triage {root}/link_out/key",
    "/compare 4242 $(id)",
    "/compare 4242 --config=/etc/shadow",
    "/job -h",
    "/mute 4242;id 1h",
    "/plot `id`",
    "/ack 4242 hang;id",
]


def test_chat_arguments_with_promql_paths_or_shell_never_reach_the_daemon(tmp_path: Path) -> None:
    root, secret = tmp_path / "outputs", tmp_path / "secret"
    root.mkdir()
    secret.mkdir()
    (secret / "key").write_text("SECRET\n")
    (root / "link_out").symlink_to(secret)
    backend = RecordingBackend([root])
    router = ChatRouter(backend, Authorizer.of(["-1"], ["10"]), transport="test", now=lambda: NOW)

    async def drive() -> list[Conv]:
        convs = []
        for text in CHAT_ATTEMPTS:
            conv = Conv(Sender("-1", "10", "alice"))
            await router.on_command(text.replace("{root}", str(root)), conv)
            convs.append(conv)
        await router.close()
        return convs

    convs = asyncio.run(drive())
    for text, conv in zip(CHAT_ATTEMPTS, convs, strict=True):
        (answer,) = conv.out
        assert answer.title.startswith("⚠"), (text, answer)  # type: ignore[attr-defined]
        assert "SECRET" not in answer.title + answer.body  # type: ignore[attr-defined]
    assert backend.calls == []  # nothing reached the daemon: no task, no ack, no mute
