"""Report format (markdown + JSON keys), the no-TSDB path, and the CLI end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobdiagd.tsdb.context import context_from_triage
from jobdiagd.tsdb.engine import diagnose
from jobdiagd.tsdb.playbooks.base import VERDICTS
from jobdiagd.tsdb.report import to_json, to_markdown
from jobdiagd.tsdb.settings import TsdbSettings
from tests.helpers.tsdb import Fixtures, make_ctx, triage_doc

NOW = 1_800_000_000.0
REQUIRED = {"analysis_type", "time_window", "nodes", "verdict", "anomalous_hosts", "findings", "root_cause"}


async def test_json_and_markdown(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("hardware-fault", tmp_path)
    d = await diagnose(make_ctx(b), settings, now=NOW)
    doc = to_json(d)
    assert set(doc) >= REQUIRED
    assert doc["verdict"] in VERDICTS and doc["verdict"] == "hardware-fault"
    assert doc["anomalous_hosts"] == ["node002"]
    assert doc["nodes"]["count"] == 4 and doc["time_window"]["duration_s"] > 0
    ev = doc["findings"][0]["evidence"][0]
    assert ev["columns"][:3] == ["Host", "GPU", "RAS UE"] and any(
        r[:3] == ["node002", "3", "2"] for r in ev["rows"]
    )
    assert doc["earliest_anomaly"]["first"][0]["family"] == "hw_gpu_ras_umc_ue_total"
    assert doc["chain"] and doc["queries"] > 0
    json.dumps(doc)
    md = to_markdown(d)
    for heading in (
        "## TSDB Diagnosis:",
        "**Analysis type:** hardware",
        "**Time window:**",
        "**Nodes:** 4",
        "### Findings",
        "### Metric evidence",
        "### Anomalies detected",
        "### Recommended next steps",
    ):
        assert heading in md
    assert "| node002 | 3 | 2 |" in md


async def test_no_tsdb_gives_log_only(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("healthy", tmp_path)
    d = await diagnose(
        make_ctx(b, ray=False, primary_class="hang", status="running", next_steps=("scancel",)),
        settings,
        now=NOW,
    )
    doc = to_json(d)
    assert doc["tsdb"] == "no TSDB" and doc["analysis_type"] == "log-only" and doc["verdict"] is None
    assert set(doc) >= REQUIRED
    md = to_markdown(d)
    assert "no TSDB" in md and "RAY=1" in md and "1. scancel" in md  # a live job: triage's scancel stands


def test_context_from_triage(fixtures: Fixtures) -> None:
    b = fixtures.get("rccl-hang")
    doc = triage_doc(
        b,
        heartbeat={"time": 123.0, "timeout_s": 100, "accused_tasks": [3], "accused_hosts": []},
        primary_failure="heartbeat-timeout",
    )
    ctx = context_from_triage(doc)
    assert (
        ctx.nodes == b.sim.sc.nodes
        and ctx.checkpoint_period == 100
        and ctx.head_node == "node001"
        and ctx.port == 9190
    )
    assert ctx.heartbeat is not None and ctx.heartbeat.accused_tasks == (3,) and ctx.incident_time == 123.0
    assert len(ctx.steps) == len(b.sim.steps) and ctx.steps[-1].loss == b.sim.steps[-1].loss
    assert not ctx.live and ctx.prometheus_dir == b.files.job_dir / "prometheus"


def _cli(*args: str, module: str = "jobdiagd.tsdb.cli") -> subprocess.CompletedProcess[str]:
    # jobdiagd.tsdb.cli carries only diagnose/compare, so other subsystems' import errors stay theirs;
    # one test goes through the full `jobdiagd` entry point.
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120)


def test_cli_diagnose_json(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("rccl-hang", tmp_path)
    tj = tmp_path / "triage.json"
    tj.write_text(json.dumps(triage_doc(b)))
    p = _cli("diagnose", str(b.files.log), "--triage-json", str(tj), "--json", module="jobdiagd.cli")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "rccl-busy-wait-hang" and doc["analysis_type"] == "hang"
    p2 = _cli("diagnose", str(b.files.log), "--triage-json", str(tj), "--playbook", "gpu-health")
    assert p2.returncode == 0 and "GPU Health Summary" in p2.stdout


def test_cli_wrong_database_exit_code(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("healthy", tmp_path)
    doc = triage_doc(b)
    for s in doc["steps"]:
        s["loss"] += 1.0
    tj = tmp_path / "triage.json"
    tj.write_text(json.dumps(doc))
    p = _cli("diagnose", str(b.files.log), "--triage-json", str(tj))
    assert p.returncode == 3 and "wrong database" in p.stderr


def test_cli_compare(fixtures: Fixtures, tmp_path: Path) -> None:
    a = fixtures.copy("restore-fresh", tmp_path / "a")
    b = fixtures.copy("restore-leak", tmp_path / "b")
    ja, jb = tmp_path / "a.json", tmp_path / "b.json"
    ja.write_text(json.dumps(triage_doc(a)))
    jb.write_text(json.dumps(triage_doc(b)))
    p = _cli("compare", str(a.files.log), str(b.files.log), "--triage-json", str(ja), str(jb), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["verdict"] == "restore-resource-leak"


def test_cli_with_real_triage_engine(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("hardware-fault", tmp_path)
    p = _cli("diagnose", str(b.files.log), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "hardware-fault" and doc["anomalous_hosts"] == ["node002"]


@pytest.mark.parametrize(
    ("name", "playbook", "verdict", "hosts"),
    [
        ("rccl-hang", "hang", "rccl-busy-wait-hang", []),
        ("dead-node", "hang", "dead-node", ["node003"]),
        ("host-oom-ramp", "oom", "host-oom-ramp", ["node003"]),
        ("healthy", "training-stability", "healthy", []),
        ("rdma-degraded", "training-stability", "rdma-degradation", ["node003"]),
    ],
)
def test_cli_real_triage_chooses_playbook(
    fixtures: Fixtures, tmp_path: Path, name: str, playbook: str, verdict: str, hosts: list[str]
) -> None:
    b = fixtures.copy(name, tmp_path)
    p = _cli("diagnose", str(b.files.log), "--json", "--no-anomaly")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert (doc["playbook"], doc["verdict"], doc["anomalous_hosts"]) == (playbook, verdict, hosts)
    assert doc["discovery"]["crosscheck"]["status"] == "verified"


def test_cli_real_triage_ray0_no_tsdb(tmp_path: Path) -> None:
    from jobdiagd_sim.metrics import JobSim, scenario, write_job

    files = write_job(JobSim(scenario("healthy", steps=20)), tmp_path, ray=False)
    p = _cli("diagnose", str(files.log))
    assert p.returncode == 0, p.stderr
    assert "no TSDB" in p.stdout and "RAY=1" in p.stdout


def test_real_triage_auto_incremented_port(tmp_path: Path) -> None:
    from jobdiagd.triage.engine import triage
    from jobdiagd_sim.metrics import JobSim, scenario, write_job

    files = write_job(
        JobSim(scenario("healthy", steps=20)), tmp_path, port=9192, finished=False, with_tsdb=False
    )
    ctx = context_from_triage(triage(files.log, now=1_780_272_600.0, slurm_state="RUNNING").to_dict())
    assert (ctx.head_node, ctx.port, ctx.live) == ("node001", 9192, True)
