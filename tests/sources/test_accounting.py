"""Slurm accounting for the goodput ledger: sacct's records, the completion-file fallback, comments (rule GP-2)."""

from __future__ import annotations

import os
import stat
from datetime import UTC
from pathlib import Path

import pytest

from jobdiagd.sources.accounting import (
    FIELDS,
    SEP,
    accounting_argv,
    parse_accounting,
    parse_scontrol_comments,
    query_accounting,
)


def line(*values: str) -> str:
    assert len(values) == len(FIELDS)
    return SEP.join(values)


DBD = line(
    "4711", "JAX-llama", "alice", "FAILED", "gpu", "node[001-002]", "2",
    "2026-06-12T07:00:00", "2026-06-12T08:00:00", "2026-06-12T08:10:00", "2026-06-12T09:00:00", "1:0",
    "nightly; jobdiagd:restart-of=4700",
)  # fmt: skip
# `sacct -c` (Slurm 22.05): Submit printed equal to Start, Eligible right.
JOBCOMP = line(
    "12", "watched", "root(0)", "COMPLETED", "debug", "node001", "1",
    "2026-12-05T04:24:06", "2026-12-05T04:24:03", "2026-12-05T04:24:06", "2026-12-05T04:24:08", "0:0", "",
)  # fmt: skip


def test_slurmdbd_records_with_a_comment() -> None:
    [r] = parse_accounting(DBD, UTC)
    assert (r.job_id, r.user, r.state, r.partition, r.nodes, r.nnodes) == (
        "4711", "alice", "FAILED", "gpu", ("node001", "node002"), 2,
    )  # fmt: skip
    assert r.end is not None and r.start is not None and r.submit is not None
    assert (r.start - r.submit, r.end - r.start) == (600.0, 3000.0)
    assert r.exit_code == 1 and r.comment == "nightly; jobdiagd:restart-of=4700"


def test_the_queue_wait_counts_from_eligible() -> None:
    [r] = parse_accounting(JOBCOMP, UTC)
    assert r.user == "root" and r.comment is None and r.start is not None and r.submit is not None
    assert r.start - r.submit == 3.0


def test_steps_bad_ids_and_short_lines_are_skipped() -> None:
    step = DBD.replace("4711", "4711.batch", 1)
    bad = DBD.replace("4711", "-rf", 1)
    assert parse_accounting("\n".join([step, bad, "4711|x", ""]), UTC) == []


def test_a_comment_holding_the_separator_does_not_shift_the_fields() -> None:
    [r] = parse_accounting(DBD[: -len("nightly; jobdiagd:restart-of=4700")] + f"a{SEP}b", UTC)
    assert r.comment == f"a{SEP}b" and r.state == "FAILED"


def test_only_job_ids_reach_the_command() -> None:
    argv = accounting_argv(["1", "2_3"], jobcomp=True)
    assert argv[:2] == ["sacct", "-c"] and argv[-1] == "1,2_3" and "--delimiter=\x1f" in argv
    with pytest.raises(ValueError):
        accounting_argv(["1", "--help"], jobcomp=False)


def _fake(tmp_path: Path, name: str, body: str) -> dict[str, str]:
    exe = tmp_path / name
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ.get('PATH', '')}"}


def test_accounting_storage_off_falls_back_to_the_completion_file(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    body = (
        f'echo "$@" >> {calls}\n'
        'if [ "$1" != "-c" ]; then echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1; fi\n'
        f"printf '%s\\n' '{JOBCOMP}'\n"
    )
    env = _fake(tmp_path, "sacct", body)
    answer = query_accounting(["12", "13", "bad id"], env=env, tz=UTC)
    assert answer.source == "jobcomp" and list(answer.records) == ["12"]
    assert any("no comments" in n for n in answer.notes)
    made = calls.read_text().splitlines()
    assert len(made) == 2 and made[1].startswith("-c ") and made[1].endswith("-j 12,13")
    assert answer.notes  # and the fake ran, by its path, not /usr/bin's sacct


def test_many_jobs_are_asked_in_chunks_and_a_failing_sacct_is_a_note(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    env = _fake(tmp_path, "sacct", f'echo "$@" >> {calls}\n')
    answer = query_accounting([str(i) for i in range(1, 1201)], env=env)
    assert answer.source == "slurmdbd" and len(calls.read_text().splitlines()) == 3
    env = _fake(tmp_path, "sacct", 'echo "sacct: error: Problem talking to the database" >&2; exit 1\n')
    broken = query_accounting(["1"], env=env)
    assert broken.source is None and broken.records == {} and "exited 1" in broken.notes[0]
    none = query_accounting(["1"], env={"PATH": str(tmp_path / "empty")})
    assert none.source is None and "not found" in none.notes[0]


def test_scontrol_comments() -> None:
    text = (
        "JobId=7 JobName=a UserId=root(0) Comment=jobdiagd:restart-of=6 Priority=1\n"
        "JobId=8 JobName=b Comment=(null) Priority=1\n"
        "JobId=9 JobName=c Priority=1\n"
    )
    assert parse_scontrol_comments(text) == {"7": "jobdiagd:restart-of=6"}
