"""Playbook verdicts on finished jobs: small variants of a simulated job, each built with promtool.

The variants subclass the simulator (jobdiagd_sim.metrics.JobSim) and override only the series that make
the case; the job files, the TSDB blocks and the log come from the same write_job machinery as conftest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.tsdb.access import LocalPrometheus, open_tsdb
from jobdiagd.tsdb.anomaly import AnomalyReport, Deviation
from jobdiagd.tsdb.compare import compare
from jobdiagd.tsdb.compare import to_json as cmp_json
from jobdiagd.tsdb.compare import to_markdown as cmp_md
from jobdiagd.tsdb.context import DiagnosisContext, HeartbeatInfo, context_from_triage
from jobdiagd.tsdb.discovery import discover
from jobdiagd.tsdb.engine import adopt_earliest_root, diagnose
from jobdiagd.tsdb.playbooks.base import VERDICTS, PlaybookEnv, PlaybookResult, Verdict
from jobdiagd.tsdb.playbooks.registry import PLAYBOOKS
from jobdiagd.tsdb.report import to_json, to_markdown
from jobdiagd.tsdb.settings import TsdbSettings
from jobdiagd_sim.metrics import GIB, JobSim, scenario
from tests.helpers.tsdb import (
    NOW,
    Built,
    Fixtures,
    Series,
    build,
    empty_dir,
    make_ctx,
    private_copy,
    relabel,
    triage_doc,
    unrelated_blocks,
)

# --- variants ----------------------------------------------------------------------------------------


class FqdnDeathSim(JobSim):
    """Host labels carry a domain suffix; node004 dies 2 s after the last step while the others busy-wait."""

    def alive(self, host: str, t: float) -> bool:
        return not (host == "node004" and t > self.train_end + 2) and super().alive(host, t)

    def hw_series(self) -> Series:
        for name, lab, host, fn in super().hw_series():
            yield name, lab.replace(f'host="{host}"', f'host="{host}.cluster.local"'), host, fn

    def ray_series(self) -> Series:
        for name, lab, host, fn in super().ray_series():
            yield name, lab.replace(f'host="{host}"', f'host="{host}.cluster.local"'), host, fn


class RdmaTriggerSim(JobSim):
    """node002 mlx5_0: retransmits, ACK timeouts and retry exhaustion rise from 20 s before the last step."""

    def hw_series(self) -> Series:
        rates = {
            "hw_rdma_tx_retx_pkts_total": 5000.0,
            "hw_rdma_tx_ack_timeout_total": 50.0,
            "hw_rdma_req_tx_retry_excd_err_total": 2.0,
        }
        t0 = self.train_end - 20

        def over(name: str, lab: str, host: str, fn: Any) -> Any:
            if name in rates and host == "node002" and 'device="mlx5_0"' in lab:
                r = rates[name]
                return lambda t, fn=fn, r=r: fn(t) + r * max(0.0, t - t0)
            return fn

        return relabel(super().hw_series(), over)


class MoeSim(JobSim):
    """MoE load-balance loss jumps 8x where steps get 20% slower; odd GPUs drop to 60% utilization."""

    def __init__(self, sc: Any) -> None:
        super().__init__(sc)
        k = sc.first_step + sc.extra["degrade_from"] * (sc.steps - sc.first_step)
        first = next(s for s in self.steps if s.step >= k)
        self.shift_step, self.shift_t = first.step, first.t - first.seconds

    def _uneven(self, g: int, t: float) -> bool:
        return g % 2 == 1 and self.shift_t + 20 <= t <= self.train_end

    def gpu_util(self, host: str, g: int, t: float) -> float:
        return 60.0 if self._uneven(g, t) else super().gpu_util(host, g, t)

    def gpu_power(self, host: str, g: int, t: float) -> float:
        return 450.0 if self._uneven(g, t) else super().gpu_power(host, g, t)

    def tb_samples(self) -> list[tuple[str, float, float]]:
        out = super().tb_samples()
        by_t = {s.t: s for s in self.steps}
        extra = []
        for name, t, _ in out:
            if name == "tb_step":
                s = by_t.get(t)
                lb = 0.085 if s is not None and s.step >= self.shift_step else 0.010
                extra.append(("tb_learning_moe_lb_loss", t, lb))
        return out + extra


class OomCeSim(JobSim):
    """All nodes' host memory spikes together at a non-checkpoint step and every node is OOM-killed;
    independently node002 GPU 7 accumulates correctable UMC errors (no UE)."""

    def mem_used(self, host: str, t: float) -> float:
        return 1020 * GIB if t >= self.train_end - 15 else super().mem_used(host, t)

    def oom_kills(self, host: str, t: float) -> float:
        return 1.0 if t >= self.train_end else 0.0

    def ras(self, host: str, g: int, block: str, kind: str, t: float) -> float:
        if host == "node002" and g == 7 and block == "umc" and kind == "ce":
            return float(int(max(0.0, t - self.train_start) / 5.0))
        return 0.0


class PerNodeProcsSim(JobSim):
    """node003 runs 6 extra runnable processes (a background process), all other hosts as the baseline."""

    def procs_running(self, host: str, t: float) -> float:
        extra = 6.0 if host == "node003" and self.phase(host, t) in ("train", "ckpt") else 0.0
        return super().procs_running(host, t) + extra


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("finished-jobs")


# --- 1: relative job path, and blocks without job metrics ------------------------------------------


async def test_relative_job_dir_reads_the_real_tsdb(
    fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = fixtures.copy("dead-node", tmp_path)
    monkeypatch.chdir(tmp_path)
    rel = Path(b.files.job_dir.name)
    assert not rel.is_absolute()
    d = await diagnose(make_ctx(b, job_dir=rel, log_path=None), settings, now=NOW, with_anomaly=False)
    assert d.no_tsdb is None and d.result is not None and d.discovery is not None
    assert d.discovery.hosts == ("node001", "node002", "node003", "node004")
    assert d.result.verdict == "dead-node" and d.result.anomalous_hosts == ["node003"]
    # Prometheus runs with cwd=<its temp dir>: the path it is given must not be relative.
    assert LocalPrometheus(rel / "prometheus", settings).tsdb_dir.is_absolute()
    # The triage adapter makes the job directory absolute too.
    doc = triage_doc(b)
    doc["job"]["job_dir"] = str(rel)
    assert context_from_triage(doc).job_dir == tmp_path / rel


async def test_blocks_without_job_metrics_are_no_tsdb_not_healthy(
    fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings
) -> None:
    b = fixtures.copy("healthy", tmp_path)
    empty_dir(b.files.prometheus)
    unrelated_blocks(b.files.prometheus, tmp_path / "other.om", b.sim.sc.start)
    d = await diagnose(make_ctx(b, primary_class=None), settings, now=NOW)
    assert d.result is None and d.no_tsdb is not None and "no TSDB data" in d.no_tsdb
    assert "block" in d.no_tsdb
    doc = to_json(d)
    assert doc["verdict"] is None and doc["tsdb"] == "no TSDB"
    assert "RAY=1" in doc["root_cause"] and "re-run with RAY=1" not in doc["root_cause"].lower()


# --- 2 + 8: heartbeat real death, FQDN labels ------------------------------------------------------


@pytest.fixture(scope="module")
def fqdn_death(root: Path) -> Built:
    sim = FqdnDeathSim(scenario("healthy", hang_after_steps=150, hang_s=130.0, tail_s=20.0, job_id="6101"))
    return build(sim, root / "fqdn-death")


def hb_ctx(b: Built, crash: float, task: int, *, fqdn_nodes: bool = False) -> DiagnosisContext:
    nodes = b.sim.sc.nodes
    return make_ctx(
        b,
        primary_class="heartbeat-timeout",
        heartbeat=HeartbeatInfo(crash, 100.0, (task,), ()),
        incident_time=crash,
        nodes=tuple(f"{n}.cluster.local" for n in nodes) if fqdn_nodes else nodes,
    )


@pytest.mark.parametrize(
    ("crash_after_end", "expect"),
    [
        (127.0, "dead-node"),  # died 25 s before crash - timeout (hb-real-death2)
        (97.0, "dead-node"),  # died 5 s after crash - timeout (hb-real-death)
    ],
)
@pytest.mark.prometheus
async def test_heartbeat_real_death_is_not_a_false_positive(
    fqdn_death: Built, tmp_path: Path, settings: TsdbSettings, crash_after_end: float, expect: str
) -> None:
    b = private_copy(fqdn_death, tmp_path)
    crash = b.sim.train_end + crash_after_end
    d = await diagnose(hb_ctx(b, crash, 3), settings, now=NOW, with_anomaly=False)
    assert d.result is not None and d.discovery is not None
    # Domain-suffixed labels match the log's short node names: nothing missing, nothing extra.
    assert d.discovery.hosts == ("node001", "node002", "node003", "node004")
    assert d.discovery.missing_hosts == () and d.discovery.extra_hosts == ()
    assert d.result.verdict == expect
    assert d.result.anomalous_hosts == ["node004"]
    assert "metrics stop" in d.result.root_cause and "true positive" in d.result.root_cause
    assert d.result.chain[0].startswith("node004 died")


@pytest.mark.prometheus
async def test_heartbeat_false_positive_with_fqdn_labels_and_nodes(
    fqdn_death: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    b = private_copy(fqdn_death, tmp_path)
    crash = b.sim.train_end - 300.0  # everyone still training
    for fqdn_nodes in (False, True):
        d = await diagnose(hb_ctx(b, crash, 1, fqdn_nodes=fqdn_nodes), settings, now=NOW, with_anomaly=False)
        assert d.result is not None and d.discovery is not None
        assert d.discovery.missing_hosts == () and d.discovery.extra_hosts == ()
        assert d.result.verdict == "heartbeat-false-positive", d.result.root_cause
        assert d.result.anomalous_hosts == []
        assert "(node002)" in d.result.root_cause
        table = d.result.findings[0].evidence[0]
        assert [r[0] for r in table.rows] == ["node001", "node002", "node003", "node004"]
        assert [r[1] for r in table.rows] == ["", "yes", "", ""]


# --- 3: hang triggered by one host's RDMA link --------------------------------------------------------


@pytest.mark.prometheus
async def test_hang_names_the_rdma_trigger(root: Path, tmp_path: Path, settings: TsdbSettings) -> None:
    b = build(RdmaTriggerSim(scenario("rccl-hang", job_id="6102")), root / "rdma-trigger")
    d = await diagnose(make_ctx(b), settings, now=NOW, with_anomaly=False)
    r = d.result
    assert r is not None
    assert r.verdict == "rccl-busy-wait-hang"
    assert r.anomalous_hosts == ["node002"]
    assert r.root_cause.startswith("Trigger: RDMA link errors on node002")
    assert "retry exhaustion" in r.root_cause and "hard link failure" in r.root_cause
    assert "mlx5_0" in r.root_cause and "mlx5_1" not in r.root_cause
    assert r.chain[0].startswith("RDMA link failure on node002")
    assert "collective deadlock (RCCL/NCCL)" in r.chain
    assert any("node002" in s for s in r.next_steps)
    assert not any("scancel" in s for s in r.next_steps)  # a finished job


async def test_plain_hang_has_no_trigger(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("rccl-hang", tmp_path)
    d = await diagnose(make_ctx(b), settings, now=NOW, with_anomaly=False)
    assert d.result is not None and d.result.verdict == "rccl-busy-wait-hang"
    assert d.result.anomalous_hosts == [] and not d.result.root_cause.startswith("Trigger")


# --- 4: MoE routing shift ----------------------------------------------------------------------------


@pytest.mark.prometheus
async def test_moe_routing_shift_is_the_root_cause(root: Path, settings: TsdbSettings) -> None:
    sim = MoeSim(scenario("healthy", job_id="6103", extra={"degrade_from": 0.6}))
    b = build(sim, root / "moe")
    d = await diagnose(make_ctx(b, primary_class="tgs-degradation"), settings, now=NOW)
    r = d.result
    assert r is not None and d.playbook == "training-stability"
    assert r.verdict == "healthy"  # no system mechanism from the fixed set; the root cause says what it is
    assert r.root_cause.startswith("Training-level root cause: MoE load-balance loss spike")
    assert f"step {sim.shift_step}" in r.root_cause
    assert "16/32 GPUs dropped to ~60%" in r.root_cause
    assert len(r.chain) >= 4 and r.chain[0].startswith("MoE load-balance loss spike")
    assert r.chain[-1].startswith("TGS down")
    assert d.anomaly is not None and d.anomaly.root is not None
    assert d.anomaly.root.family == "tb_learning_moe_lb_loss"


# --- 5 + 6: all-node OOM spike off checkpoint steps; correctable errors only --------------------------


@pytest.mark.prometheus
async def test_all_node_oom_spike_and_ce_only(root: Path, settings: TsdbSettings) -> None:
    sim = OomCeSim(scenario("healthy", job_id="6104", hang_after_steps=157, hang_s=0.0, tail_s=20.0))
    b = build(sim, root / "oom-ce")
    ctx = make_ctx(b, primary_class="oom-host")
    async with open_tsdb(ctx, settings, now=NOW) as handle:
        disc = await discover(handle, ctx, settings)
        env = PlaybookEnv(handle.client, ctx, disc, settings, NOW)
        oom = await PLAYBOOKS["oom"].run(env)
        hw = await PLAYBOOKS["hardware"].run(env)
    assert oom.verdict == "host-oom-ramp"  # not checkpoint-oom: step 157, checkpoint_period 100
    assert oom.anomalous_hosts == ["node001", "node002", "node003", "node004"]
    assert oom.root_cause.startswith("All 4 nodes")
    assert "not a checkpoint step" in oom.root_cause and "XLA recompilation" in oom.root_cause
    assert "checkpoint save" in oom.root_cause  # "... not a checkpoint save"
    assert hw.verdict == "hardware-fault"
    assert hw.anomalous_hosts == ["node002"]
    assert "degrading" in hw.root_cause and "node002:gpu7" in hw.root_cause
    assert "all RAS/PCIe counters zero" not in json.dumps([f.summary for f in hw.findings])


@pytest.mark.prometheus
async def test_checkpoint_oom_still_needs_checkpoint_alignment(root: Path, settings: TsdbSettings) -> None:
    """The replica-0 save spike at step 200 pushes node001/node002 over the limit: checkpoint-oom."""

    class CkptOom(JobSim):
        def mem_used(self, host: str, t: float) -> float:
            v = super().mem_used(host, t)
            return v + 500 * GIB if self.phase(host, t) == "ckpt" and t > self.train_end - 60 else v

        def oom_kills(self, host: str, t: float) -> float:
            return 1.0 if host in self.replica0 and t >= self.train_end else 0.0

    sim = CkptOom(scenario("healthy", job_id="6105", hang_after_steps=201, hang_s=0.0, tail_s=20.0))
    b = build(sim, root / "oom-ckpt")
    d = await diagnose(make_ctx(b, primary_class="oom-host"), settings, now=NOW, with_anomaly=False)
    assert d.result is not None
    assert d.result.verdict == "checkpoint-oom", d.result.root_cause
    assert d.result.anomalous_hosts == ["node001", "node002"]


# --- 7: compare, per-node hw_procs_running delta --------------------------------------------------


async def test_compare_per_node_procs_delta(
    fixtures: Fixtures, root: Path, tmp_path: Path, settings: TsdbSettings
) -> None:
    a = fixtures.copy("restore-fresh", tmp_path / "a")
    b = build(PerNodeProcsSim(scenario("restore-fresh", job_id="6106")), root / "pernode")
    c = await compare(make_ctx(a), make_ctx(b), settings, now=NOW)
    assert c.procs["uniform"] is False
    assert c.anomalous_hosts == ["node003"]
    assert c.verdict in VERDICTS and c.verdict != "restore-resource-leak"
    assert "node003 +6.0" in c.root_cause and "background processes" in c.root_cause
    assert cmp_json(c)["anomalous_hosts"] == ["node003"]
    assert "**Anomalous hosts:** node003" in cmp_md(c)


# --- 9: log-only texts ---------------------------------------------------------------------------------


async def test_no_tsdb_texts_fit_a_finished_ray1_job(
    fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings
) -> None:
    b = fixtures.copy("rccl-hang", tmp_path)
    empty_dir(b.files.prometheus)
    triage_steps = (
        "Query Prometheus TSDB at hang time (`jobdiagd diagnose x --playbook hang`).",
        "Kill the job: scancel 4242.",
        "Retry on the same nodes first — init-phase hangs (before step 0) are often transient.",
        "Only if the hang recurs: exclude suspect nodes.",
    )
    ctx = make_ctx(b, status="cancelled", last_step=149, next_steps=triage_steps)
    d = await diagnose(ctx, settings, now=NOW)
    doc = to_json(d)
    assert "re-run with RAY=1" not in doc["root_cause"].lower() and "RAY=1" in doc["root_cause"]
    steps = doc["next_steps"]
    text = " ".join(steps)
    assert "scancel" not in text and "--playbook hang" not in text and "init-phase" not in text
    assert "after step 149" in text and "Only if the hang recurs: exclude suspect nodes." in steps
    assert not any(s.lower().startswith("re-run with ray=1") for s in steps)
    md = to_markdown(d)
    assert "scancel" not in md and "re-run with RAY=1" not in md.lower()
    # RAY=0 keeps the re-run advice.
    d0 = await diagnose(make_ctx(b, ray=False), settings, now=NOW)
    assert "re-run with RAY=1" in to_json(d0)["root_cause"]


# --- the earliest-anomaly root heads the result when the playbook found no cause of that kind -------


def _result(playbook: str, verdict: str, root: str = "r", chain: list[str] | None = None) -> PlaybookResult:
    return PlaybookResult(
        playbook=playbook,
        analysis_type=playbook,
        verdict=Verdict(verdict),
        window=(0.0, 1.0),
        root_cause=root,
        chain=chain or [],
    )


def test_adopt_earliest_root_training_and_hang() -> None:
    tb = Deviation("tb_learning_grad_norm", "rank0", 500.0, 1.0, 9.0, "up")
    power = Deviation("hw_gpu_power_watts", "node001", 520.0, 680.0, 300.0, "down")
    res = _result("training-stability", "healthy", "Throughput dropped 12.0% but no contention source moved")
    res = adopt_earliest_root(res, AnomalyReport(600.0, (0.0, 700.0), [tb, power]))
    assert res.verdict == "healthy"
    assert res.root_cause.startswith("Training-level root cause (earliest anomaly): tb_learning_grad_norm")
    assert res.chain[0].startswith("root cause: tb_learning_grad_norm") and len(res.chain) == 2

    excd = Deviation("hw_rdma_req_tx_retry_excd_err_total", "node002", 590.0, 0.0, 2.0, "up", counter=True)
    hang = _result("hang", "rccl-busy-wait-hang", "RCCL/NCCL busy-wait deadlock", ["collective deadlock"])
    hang = adopt_earliest_root(hang, AnomalyReport(600.0, (0.0, 700.0), [excd, power]))
    assert hang.anomalous_hosts == ["node002"] and hang.verdict == "rccl-busy-wait-hang"
    assert hang.root_cause.startswith("Trigger (earliest anomaly): hw_rdma_req_tx_retry_excd_err_total")
    assert hang.chain[0].startswith("network error on node002") and hang.chain[1] == "collective deadlock"

    # A symptom first, or an error after the incident, changes nothing.
    for devs in ([power, excd], [Deviation(excd.family, "node002", 650.0, 0.0, 2.0, "up", counter=True)]):
        h = _result("hang", "rccl-busy-wait-hang", "x", ["c"])
        h = adopt_earliest_root(h, AnomalyReport(600.0, (0.0, 700.0), devs))
        assert h.anomalous_hosts == [] and h.root_cause == "x" and h.chain == ["c"]
