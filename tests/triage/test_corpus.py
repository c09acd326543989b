"""Every simulated scenario triaged end to end against the generator's ground truth."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd.triage.engine import triage
from jobdiagd.triage.resolve import ResolveError
from jobdiagd_sim import scenarios

JOB_SCENARIOS = [n for n in scenarios.SCENARIOS if n != "shared-checkpoint-dir"]


def _run(
    corpus: tuple[Path, dict[str, dict[str, object]]], name: str
) -> tuple[dict[str, object], dict[str, object]]:
    root, exps = corpus
    e = exps[name]
    target = e.get("job_dir") or e.get("log")
    r = triage(str(target), now=float(e["now"]), slurm_state=e.get("slurm_state"), outputs_root=root)  # type: ignore[arg-type]
    return r.to_dict(), e


@pytest.mark.parametrize("name", JOB_SCENARIOS)
def test_status_and_primary(corpus: tuple[Path, dict[str, dict[str, object]]], name: str) -> None:
    d, e = _run(corpus, name)
    assert d["status"] == e["status"]
    assert d["primary_failure"] == e["primary_failure"]
    classes = set(d["classes"])  # type: ignore[arg-type]
    assert set(e.get("expected_classes") or []) <= classes  # type: ignore[arg-type]
    assert not (set(e.get("absent_classes") or []) & classes)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", JOB_SCENARIOS)
def test_progress(corpus: tuple[Path, dict[str, dict[str, object]]], name: str) -> None:
    d, e = _run(corpus, name)
    p = d["progress"]
    assert isinstance(p, dict)
    if e["first_step"] is not None or e["last_step"] is not None:
        assert p["first_step"] == e["first_step"]
        assert p["last_step"] == e["last_step"]
    if e.get("restored_from_step") is not None:
        assert p["start"] == "restored"
        assert p["restored_from_step"] == e["restored_from_step"]
    if p["last_step"] is not None:
        assert p["total_steps"] == e["total_steps"]
        assert p["checkpoint_period"] == e["checkpoint_period"]
        assert p["last_checkpoint_step"] == e["last_checkpoint_step"]
        if e.get("start") is not None:
            assert p["start"] == e["start"]


@pytest.mark.parametrize("name", JOB_SCENARIOS)
def test_tgs_and_live(corpus: tuple[Path, dict[str, dict[str, object]]], name: str) -> None:
    d, e = _run(corpus, name)
    t = d["tgs"]
    assert isinstance(t, dict)
    assert t["degraded"] == bool(e["tgs_degraded"])
    if e.get("tgs_pattern") is not None:
        assert t["pattern"] == e["tgs_pattern"]
    job = d["job"]
    assert isinstance(job, dict)
    assert job["ray"] == e["ray"]
    assert job["platform"] == e["platform"]
    live = d["live"]
    assert isinstance(live, dict)
    assert live["head_node"] == e["head_node"]
    assert live["prometheus_port"] == e["prometheus_port"]


def test_shared_checkpoint_dir_is_not_a_job(corpus: tuple[Path, dict[str, dict[str, object]]]) -> None:
    root, exps = corpus
    target = exps["shared-checkpoint-dir"]["job_dir"]
    with pytest.raises(ResolveError, match="not a job directory"):
        triage(str(target), now=0.0, outputs_root=root)


def test_resolution_by_id_and_log(corpus: tuple[Path, dict[str, dict[str, object]]]) -> None:
    root, exps = corpus
    e = exps["completed-ray0"]
    by_id = triage(str(e["job_id"]), now=float(e["now"]), outputs_root=root)  # type: ignore[arg-type]
    by_log = triage(str(e["log"]), now=float(e["now"]), outputs_root=root)  # type: ignore[arg-type]
    assert by_id.ref.job_dir == by_log.ref.job_dir == Path(str(e["job_dir"]))
    assert by_id.status == by_log.status == "completed"
