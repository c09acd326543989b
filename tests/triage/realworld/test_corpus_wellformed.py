"""The real-world corpus is well formed and its builder writes logs the triage reader understands.

Classification itself is asserted per excerpt in test_corpus_classes.py (and printed as a
per-family score by `python -m tests.triage.realworld.score`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from jobdiagd.rules.signatures import ALL_CLASSES
from jobdiagd.triage.engine import triage
from tests.triage.realworld.builder import (
    CorpusError,
    Excerpt,
    build_all,
    line_times,
    load_all,
    load_corpus,
)

CORPUS = load_all()

# Runbook status labels (status table; "unknown" is the report template's short form).
STATUSES = {"completed", "failed", "cancelled", "running", "hanging", "unknown-death"}

# The error families the corpus covers (and the failure classes of docs/rules.md §3 among them), each of which
# must come with several distinct wordings.
NAMED_FAMILIES = (
    "nccl-error",
    "nccl-timeout",
    "checkpoint-fs",
    "ray-host-oom",
    "compiler-fatal",
    "slurm-time-limit",
    "slurm-oom-event",
    "slurm-task-killed",
    "gpu-oom",
    "gpu-oom-harmless",
    "coordination-heartbeat",
    "python-traceback",
    "signal-kill",
    "kernel-oom",
    # Issue 16's families that still misread.
    "slurm-node-fail",
    "jax-init-timeout",
    "compiler-check-abort",
    "python-traceback-lost-header",
    "checkpoint-async-timeout",
)

# An issue / PR, a doc page, or a file of a public repository pinned to a commit (a training
# logbook, a cluster's documentation).
SOURCE_URL = re.compile(
    r"^https://(github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+|docs\.jax\.dev/\S+"
    r"|github\.com/[\w.-]+/[\w.-]+/blob/[0-9a-f]{40}/\S+)$"
)


def _originals() -> list[Excerpt]:
    """Excerpts with their own text (placement variants reuse another excerpt's lines)."""
    return [e for e in CORPUS.values() if e.lines_from is None]


def test_at_least_sixty_distinct_excerpts_each_with_a_source_url() -> None:
    originals = _originals()
    assert len({e.text for e in originals}) == len(originals), "two excerpts carry the same text"
    assert len(originals) >= 60
    for e in CORPUS.values():
        assert SOURCE_URL.match(e.source), f"{e.id}: source {e.source!r} is not an issue/PR/doc URL"


def test_named_families_have_several_wordings() -> None:
    wordings: dict[str, set[str]] = defaultdict(set)
    for e in _originals():
        wordings[e.family].add(e.text)
    for fam in NAMED_FAMILIES:
        assert len(wordings[fam]) >= 2, f"family {fam} has {len(wordings[fam])} wording(s)"
    # Slurm's preemption and node-failure lines are covered too.
    assert wordings["slurm-preempted"] and wordings["slurm-node-fail"]


def test_expectations_use_runbook_names() -> None:
    for e in CORPUS.values():
        assert e.expect.status in STATUSES, e.id
        assert e.expect.primary is None or e.expect.primary in ALL_CLASSES, e.id
        assert set(e.expect.absent) <= set(ALL_CLASSES), e.id
        # Healthy jobs have no primary failure; failed ones always have one.
        assert (e.expect.primary is None) == (e.expect.status in ("completed", "running")) or (
            e.expect.primary == "soft-success"
        ), e.id


def test_key_lines_are_excerpt_text_and_negatives_have_none() -> None:
    for e in CORPUS.values():
        lines = [*(CORPUS[e.after].lines if e.after else []), *e.lines]
        if e.expect.primary is None:
            assert e.key is None, f"{e.id}: a healthy job has no key line to quote"
        else:
            assert e.key and any(e.key in ln for ln in lines), f"{e.id}: key not in the excerpt"


def test_timestamp_formats_are_read() -> None:
    assert line_times("E0926 17:26:32.075402  157988 coordination_service_agent.cc:332] Polled") == [
        1758907592.0
    ]
    assert line_times("E0000 00:00:1737397209.417337   83920 pjrt_stream_executor_client.cc:3085]") == [
        1737397209.0
    ]
    assert line_times("slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2021-05-11T12:06:17 ***") == [
        1620734777.0
    ]
    assert line_times("[Sun Mar 30 08:24:00 2025] Out of memory: Killed process 7899 (python)") == [
        1743323040.0
    ]
    assert line_times("W external/xla/xla/service/gpu/runtime/support.cc:58] Intercepted") == []


def test_a_malformed_entry_gets_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "corpus.toml"
    bad.write_text(
        '[[excerpt]]\nid = "x"\nfamily = "f"\nproject = "p"\nsource = "https://github.com/a/b/issues/1"\n'
        '[excerpt.outcome]\nkind = "fail"\nfailing = [0]\n[excerpt.expect]\nstatus = "failed"\n'
        '[[excerpt.part]]\nstream = "stdout"\ntasks = [0]\nlines = "boom"\n'
    )
    with pytest.raises(CorpusError, match=r"x: part stream must be one of"):
        load_corpus(bad)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> list[object]:
    return list(build_all(tmp_path_factory.mktemp("realworld")))


def test_every_case_builds_into_a_job_the_reader_parses(built: list[object]) -> None:
    from tests.triage.realworld.builder import BuiltCase

    assert len(built) == len(CORPUS)
    for case in built:
        assert isinstance(case, BuiltCase)
        ex = case.excerpt
        r = triage(case.job_dir, now=case.now, slurm_state=case.slurm_state, outputs_root=case.outputs_root)
        assert r.header is not None, ex.id  # the main log was read
        # The header, the step series (the worker log's for RAY=1) and the JOB SUMMARY are read.
        assert r.header.get("JOB_ID") == case.job_dir.name.split("-", 1)[0], ex.id
        assert len(r.nodes) == ex.job.nnodes, ex.id
        assert r.progress.first_step == case.first_step, ex.id
        if ex.job.restore_from is not None:
            assert case.first_step == ex.job.restore_from + 1, ex.id
        assert r.progress.last_step == case.last_step, ex.id
        assert r.progress.total_steps == ex.job.steps, ex.id
        if case.summary_exit is None:
            assert r.summary is None, ex.id
        else:
            assert r.summary is not None and r.summary.exit_code == case.summary_exit, ex.id
        assert r.ray == ex.job.ray, ex.id
        # The excerpt's lines are in the job verbatim (the Slurm log or, for RAY=1, a worker log).
        text = case.log.read_text(errors="replace")
        workers = "".join(p.read_text(errors="replace") for p in case.worker_logs)
        for ln in ex.lines:
            if ln.strip():
                assert ln in text or ln in workers, f"{ex.id}: {ln[:60]!r} not placed"


def test_excerpt_lands_at_its_own_time(built: list[object]) -> None:
    from tests.triage.realworld.builder import BuiltCase

    case = next(c for c in built if isinstance(c, BuiltCase) and c.excerpt.id == "slurm-time-limit-job")
    text = case.log.read_text(errors="replace")
    # Cancelled at 2021-05-11T12:06:17: the step lines just before carry the same day and hour.
    before = text[: text.index("CANCELLED AT 2021-05-11T12:06:17")]
    last_step = [ln for ln in before.splitlines() if "completed step:" in ln][-1]
    assert re.search(r"I0511 12:0[56]:\d\d\.", last_step), last_step
