"""Single-job restore-leak suspicion in the training-stability playbook (runbook "Checkpointing interference").

The simulated restore-leak job has single-replica restore enabled, restores from step 200 and its head
node's Ray worker log shows three NCCL communicator-init waves; its TSDB is built with promtool.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.triage.engine import triage
from jobdiagd.tsdb.context import DiagnosisContext, context_from_triage
from jobdiagd.tsdb.engine import diagnose
from jobdiagd.tsdb.playbooks.training import restore_leak_suspicion
from jobdiagd.tsdb.settings import Thresholds, TsdbSettings
from jobdiagd_sim.metrics import JobSim, scenario
from tests.helpers.tsdb import NOW, Built, build, make_ctx, private_copy, rows, run_playbooks

TH = Thresholds()
HOSTS = [f"node{i:03d}" for i in range(1, 5)]


def test_restore_leak_suspicion() -> None:
    procs = {h: 17.0 + 0.2 * i for i, h in enumerate(HOSTS[:4])}
    s = restore_leak_suspicion(True, 200, 3, procs, TH)
    assert s is not None and s.suspected
    assert s.summary.startswith("Suspected restore resource leak") and "3 NCCL/RCCL" in s.summary
    assert (
        "median 17.3" in s.summary and "cannot be measured" in s.summary and "jobdiagd compare" in s.summary
    )
    assert (
        dict((r[0], r[2]) for r in s.rows)["hw_procs_running after the restore (per host)"]
        == "uniform across hosts"
    )
    two = restore_leak_suspicion(True, 200, 2, procs, TH)
    assert two is not None and not two.suspected and "no sign of the restore leak" in two.summary
    unknown = restore_leak_suspicion(True, 200, None, {}, TH)
    assert (
        unknown is not None
        and not unknown.suspected
        and "neither be suspected nor ruled out" in unknown.summary
    )
    assert restore_leak_suspicion(False, 200, 3, procs, TH) is None  # no single-replica path
    assert restore_leak_suspicion(True, None, 3, procs, TH) is None  # fresh start: no restore ran
    uneven = restore_leak_suspicion(True, 200, 3, {**procs, "node004": 25.0}, TH)
    assert uneven is not None and "uneven across hosts" in uneven.summary


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("restore9")


# --- scenarios ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def restored(root: Path) -> Built:
    return build(JobSim(scenario("restore-leak")), root / "restore-leak")


def restore_ctx(b: Built) -> DiagnosisContext:
    """What triage reads from the log: PASSTHROUGH_ARGS and the restore line."""
    doc = triage(b.files.log, now=NOW).to_dict()
    ctx = context_from_triage(doc)
    assert ctx.config.get("enable_single_replica_ckpt_restoring") == "true" and ctx.restored_from_step == 200
    return replace(ctx, job_dir=b.files.job_dir)


@pytest.mark.prometheus
async def test_single_replica_restore_with_extra_wave_is_suspected_leak(
    restored: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    b = private_copy(restored, tmp_path)
    d = await diagnose(restore_ctx(b), settings, now=NOW)
    r = d.result
    assert r is not None and d.playbook == "training-stability"
    assert r.verdict == "restore-resource-leak", r.root_cause
    assert r.root_cause.startswith("Suspected restore resource leak")
    assert "restored from step 200" in r.root_cause and "3 NCCL/RCCL communicator-init waves" in r.root_cause
    assert "hw_procs_running after the restore: median 17.0" in r.root_cause
    assert "cannot be measured" in r.root_cause
    assert any("jobdiagd compare" in s for s in r.next_steps)
    assert not any("clear_caches() releases" in s for s in r.next_steps)
    ev = rows(r, "Restore-leak evidence")
    assert ev["NCCL/RCCL init waves (head worker logs)"][1] == "3"
    assert ev["hw_procs_running after the restore (per host)"][2] == "uniform across hosts"


async def test_restore_without_extra_wave_or_without_restore_is_not_suspected(
    root: Path, fixtures: Any, tmp_path: Path, settings: TsdbSettings
) -> None:
    sc = scenario("restore-leak", job_id="5003", procs_extra=0.0, extra={"restore_extra_wave": False})
    b = build(JobSim(sc), root / "restore-dispatcher")
    r = (await run_playbooks(b, tmp_path / "a", settings, ["training-stability"], restore_ctx(b)))[
        "training-stability"
    ][0]
    assert r.verdict == "healthy"
    leak = next(f for f in r.findings if f.title == "Single-replica checkpoint restore")
    assert leak.severity == "info" and "no sign of the restore leak" in leak.summary
    # A fresh start with the flag set: no restore ran, nothing to say.
    fresh = fixtures.copy("restore-fresh", tmp_path / "f")
    ctx = make_ctx(fresh, config={"enable_single_replica_ckpt_restoring": "true", "steps": "400"})
    r2 = (await diagnose(ctx, settings, now=NOW, with_anomaly=False)).result
    assert r2 is not None and r2.verdict == "healthy"
    assert not any(f.title == "Single-replica checkpoint restore" for f in r2.findings)
