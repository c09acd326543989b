"""The post-judging path: one ordered list, and what a failing stage does to the rest of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.config import IncidentsConfig
from jobdiagd.model.alerts import Finding
from jobdiagd.service.stages import STAGES, Batch, Stage, StageContext, run_stages

T0 = 1_780_000_000.0


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[StageContext]:
    pipeline = AlertPipeline.open(tmp_path, IncidentsConfig(), ["jsonl"])
    left: list[str] = []
    yield StageContext(T0, {}, pipeline, lambda key, why, now: left.append(key))
    pipeline.close()


def hang(job: str) -> Finding:
    return Finding("hang", job, "hang", "critical", "no step since step 3", at_step=3)


def test_the_stages_run_in_the_documented_order() -> None:
    assert [s.name for s in STAGES] == [
        "keep resolution",
        "stamp",
        "enrich or hold",
        "slow host",
        "recovery",
        "observe",
        "end jobs",
        "enqueue",
    ]
    assert [s.name for s in STAGES if s.stores] == ["observe", "end jobs", "enqueue"]


def test_the_findings_reach_the_outbox_through_the_stages(ctx: StageContext) -> None:
    batch = run_stages(Batch([hang("7001")], []), ctx)
    assert batch.ok
    assert [(n.event, n.job_id) for n in batch.queued] == [("open", "7001")]


def test_a_stage_that_stores_and_fails_stops_the_path(ctx: StageContext) -> None:
    ran: list[str] = []

    def record(name: str) -> Stage:
        def run(batch: Batch, _: StageContext) -> Batch:
            ran.append(name)
            return batch

        return Stage(name, run, stores=True)

    def broken(batch: Batch, _: StageContext) -> Batch:
        raise RuntimeError("boom")

    stages = [record("first"), Stage("broken", broken, stores=True), record("after")]
    batch = run_stages(Batch([hang("7001")], []), ctx, stages)
    assert not batch.ok and ran == ["first"]


def test_an_error_in_a_stage_that_does_not_store_fails_the_tick(ctx: StageContext) -> None:
    def broken(batch: Batch, _: StageContext) -> Batch:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_stages(Batch([], []), ctx, [Stage("broken", broken)])
