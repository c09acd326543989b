"""Suspect-node memory (rules REC-20 to REC-23): what names a node, how the score decays, one
notice per node, and `jobdiagd nodes`."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobdiagd.alerts.store import AlertStore
from jobdiagd.model.alerts import Finding
from jobdiagd.model.kinds import GpuHangState, IncidentKind
from jobdiagd.recovery.nodes import (
    NodeEvidence,
    NodeMemory,
    render_suspects,
    suspects_from,
    suspects_from_diagnosis,
)
from jobdiagd.rules.recovery import Evidence
from jobdiagd.triage.engine import triage
from jobdiagd.tsdb.gpu_hang import GpuVerdict
from jobdiagd.tsdb.playbooks.base import Finding as PbFinding
from jobdiagd.tsdb.playbooks.base import PlaybookResult
from jobdiagd_sim import scenarios

T0 = 1_800_000_000.0
DAY = 86400.0


def hang_evidence(node: str) -> list[NodeEvidence]:
    v = GpuVerdict(GpuHangState.DEAD_NODE, f"{node} idle with no GPU process", suspects=(node,))
    return suspects_from(verdict=v)


def test_a_confirmed_gpu_verdict_and_a_hang_page_name_their_suspects() -> None:
    (e,) = hang_evidence("node017")
    assert (e.node, e.kind, e.failure_class, e.weight) == ("node017", "hang-suspect", "hang", 1.0)
    unconfirmed = GpuVerdict(GpuHangState.MIXED, "hosts disagree", suspects=("node017",))
    assert suspects_from(verdict=unconfirmed) == []
    f = Finding("hang", "9", "hang", "critical", "no step", details={"suspect host": "node003, $(id)"})
    assert [x.node for x in suspects_from(finding=f)] == ["node003"]
    none = Finding("hang", "9", "hang", "critical", "no step", details={"suspect host": "none singled out"})
    assert suspects_from(finding=none) == []


def test_node_fail_names_the_failed_host_and_a_user_error_names_nobody(tmp_path: Path) -> None:
    exp = scenarios.build("node-fail", tmp_path)
    res = triage(exp.job_dir, now=T0 + 10 * DAY, outputs_root=tmp_path)
    assert res.cls.primary == "node-fail"
    found = suspects_from(triage=res)
    assert [(e.node, e.kind) for e in found] == [("node006", "node-fail")]
    assert "NODE_EXIT host=node006 exit=137" in found[0].evidence
    # The same job's nodes, were its class a user error, count for nothing (rule REC-20).
    f = Finding("failure_signature", "9", "failure", "critical", "x", failure_class="python-exception",
                details={"suspect host": "node006"})
    assert suspects_from(triage=res, finding=f) == []


def test_playbook_outliers_are_evidence_by_playbook() -> None:
    net = PlaybookResult(
        playbook="network-health", analysis_type="x", verdict="rdma-degradation", window=(0.0, 1.0),
        anomalous_hosts=["node009"], findings=[PbFinding("RDMA retries", "exhausted", "critical", ("node010",))],
        root_cause="RDMA retry exhaustion on node009",
    )
    train = PlaybookResult(playbook="training-stability", analysis_type="x", verdict="rdma-degradation",
                           window=(0.0, 1.0), anomalous_hosts=["node011"])
    healthy = PlaybookResult(playbook="hardware", analysis_type="x", verdict="healthy",
                             window=(0.0, 1.0), anomalous_hosts=["node012"])
    found = suspects_from(playbooks=[net, train, healthy])
    assert [(e.node, e.kind) for e in found] == [("node009", "network-outlier"), ("node010", "network-outlier")]


def test_scores_decay_and_one_notice_per_node_past_the_threshold(tmp_path: Path) -> None:
    store = AlertStore.in_state_dir(tmp_path)
    mem = NodeMemory(store, half_life_days=2.0)
    # node017 in the hangs of three jobs within 48 h; node020 once.
    mem.record("101", hang_evidence("node017"), T0)
    mem.record("101", hang_evidence("node017"), T0 + 60)  # the same finding again: not new
    assert mem.notices(T0 + 60, 3.0) == []
    mem.record("102", hang_evidence("node017") + hang_evidence("node020"), T0 + DAY)
    assert mem.notices(T0 + DAY, 3.0) == []
    mem.record("103", hang_evidence("node017"), T0 + 2 * DAY)
    # With a 2-day half-life the three hangs score 0.5 + 0.71 + 1 = 2.2 at 48 h: not yet 3.
    (s17, s20) = mem.suspects(T0 + 2 * DAY)
    assert s17.node == "node017" and s17.score == pytest.approx(0.5 + 0.5**0.5 + 1, abs=1e-3)
    assert s17.jobs == ["101", "102", "103"] and s20.score == pytest.approx(0.5**0.5, abs=1e-3)
    assert mem.suspected(T0 + 2 * DAY, 2.0) == {"node017"}
    (notice,) = mem.notices(T0 + 2 * DAY, 2.0)
    assert notice.text == "node017 in 3 hangs of 3 job(s) in 2 d 0 h"
    assert notice.drain_command == (
        "scontrol update NodeName=node017 State=DRAIN 'Reason=jobdiagd: in 3 hangs of 3 job(s) in 2 d 0 h'"
    )
    assert mem.notices(T0 + 2 * DAY + 60, 2.0) == []  # an edge, not every tick
    # Four half-lives later the score is under half the threshold: re-armed, noticed again on a new hang.
    later = T0 + 10 * DAY
    assert mem.notices(later, 2.0) == []
    for j in ("104", "105"):
        mem.record(j, hang_evidence("node017"), later)
    assert [n.node for n in mem.notices(later, 2.0)] == ["node017"]
    text = render_suspects(mem.suspects(later), later)
    assert text.splitlines()[0].startswith("node017  score 2.")
    assert "job 105  hang  hang-suspect" in text
    assert mem.prune(later + 100 * DAY) > 0 and mem.suspects(later + 100 * DAY) == []
    store.close()


def test_jobdiagd_nodes_lists_suspects_as_text_and_json(tmp_path: Path) -> None:
    state = tmp_path / "state"
    store = AlertStore.in_state_dir(state)
    mem = NodeMemory(store, half_life_days=2.0)
    now = __import__("time").time()
    for j in ("1", "2", "3"):
        mem.record(j, hang_evidence("node017"), now - 3600)
    store.close()
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{state}"\n')
    env = {**os.environ}
    text = subprocess.run([sys.executable, "-m", "jobdiagd.cli", "nodes", "--config", str(cfg)],
                          capture_output=True, text=True, env=env, check=True).stdout
    assert text.startswith("node017  score 2.") and "in 3 hangs of 3 job(s)" in text
    doc = json.loads(subprocess.run([sys.executable, "-m", "jobdiagd.cli", "nodes", "--json", "--config", str(cfg)],
                                    capture_output=True, text=True, env=env, check=True).stdout)
    (node,) = doc["nodes"]
    assert node["node"] == "node017" and node["jobs"] == ["1", "2", "3"] and len(node["records"]) == 3
    bad = subprocess.run([sys.executable, "-m", "jobdiagd.cli", "nodes", "--config", str(tmp_path / "nope.toml")],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "jobdiagd nodes:" in bad.stderr


def test_the_default_thresholds_notice_three_hangs_in_two_days_and_exclude_after_two(tmp_path: Path) -> None:
    from jobdiagd.config import RecoveryConfig

    cfg = RecoveryConfig()
    store = AlertStore.in_state_dir(tmp_path)
    mem = NodeMemory(store, half_life_days=cfg.node_half_life_days)
    mem.record("1", hang_evidence("node017"), T0)
    mem.record("2", hang_evidence("node017"), T0 + DAY)
    assert mem.suspected(T0 + DAY, cfg.node_exclude_score) == {"node017"}
    assert mem.notices(T0 + DAY, cfg.node_notice_score) == []
    mem.record("3", hang_evidence("node017"), T0 + 2 * DAY)
    (notice,) = mem.notices(T0 + 2 * DAY, cfg.node_notice_score)
    assert notice.text == "node017 in 3 hangs of 3 job(s) in 2 d 0 h"
    store.close()


def test_a_tgs_slide_names_its_slow_host_and_nothing_else_does_for_it() -> None:
    """The site Prometheus's slow host of a TGS slide (rule SLOW-5) is evidence of its own kind."""
    f = Finding(
        "tgs", "7", IncidentKind.TGS_DEGRADATION, "warning", "TGS -20%",
        {"suspect host": "node005", "slow host": "node005: power 40% below the median"},
    )
    (e,) = suspects_from(finding=f)
    assert (e.node, e.kind, e.failure_class, e.weight) == ("node005", Evidence.SLOW_HOST, "tgs-degradation", 1.0)
    assert suspects_from(finding=dataclasses.replace(f, details={"slow host": "none stands out"})) == []


def test_a_job_end_diagnosis_document_names_its_playbooks_hosts() -> None:
    """The daemon keeps a failed RAY=1 job's end-of-job playbook as `jobdiagd diagnose --json`
    writes it; node memory reads the same hosts from it as from the playbook's result."""
    doc = {
        "playbook": "hardware",
        "analysis_type": "hardware",
        "verdict": "hardware-fault",
        "anomalous_hosts": ["node011"],
        "findings": [
            {"title": "XGMI errors", "severity": "critical", "hosts": ["node012"]},
            {"title": "fine", "severity": "info", "hosts": ["node013"]},
        ],
        "root_cause": "XGMI link errors on node011",
    }
    got = suspects_from_diagnosis(doc)
    assert [(e.node, e.kind, e.weight) for e in got] == [("node011", "hardware", 1.5), ("node012", "hardware", 1.5)]
    assert suspects_from_diagnosis({"error": "no Prometheus"}) == []
    assert suspects_from_diagnosis({**doc, "verdict": "no-such-verdict"}) == []
    assert suspects_from_diagnosis(None) == []
