"""Which playbook reads which signal (TCP bursts, CNPs, contention, CEs, port down): simulator variants built with promtool.

Several findings share one build: each simulated job carries independent signals (a TCP burst, CNPs, a
lifetime TCP outlier, correctable errors) and every test runs only the playbook that reads its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from jobdiagd.tsdb.compare import compare
from jobdiagd.tsdb.compare import to_json as cmp_json
from jobdiagd.tsdb.compare import to_markdown as cmp_md
from jobdiagd.tsdb.engine import diagnose, incident_time
from jobdiagd.tsdb.report import to_json
from jobdiagd.tsdb.settings import TsdbSettings
from jobdiagd_sim.metrics import JobSim, scenario
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
    run_playbooks,
)

REQUIRED = {"analysis_type", "time_window", "nodes", "verdict", "anomalous_hosts", "findings", "root_cause"}


def override(names: dict[str, Callable[[str, str, Any], Any]]) -> Callable[[str, str, str, Any], Any]:
    def fn(name: str, lab: str, host: str, val: Any) -> Any:
        return names[name](lab, host, val) if name in names else val

    return fn


# --- variants ----------------------------------------------------------------------------------------


class NetBurstSim(JobSim):
    """A completed job: steps 150-194 are 30% slower during a 6-minute TCP retransmit burst on node002;
    CNPs at 2000/s on every node; node004 carries a huge lifetime TCP total; node003 GPU 5 accumulates
    correctable UMC errors only."""

    def __init__(self, sc: Any) -> None:
        super().__init__(sc)
        t = self.train_start
        steps = []
        for s in self.steps:
            secs = round(s.seconds * 1.3, 3) if 150 <= s.step < 195 else s.seconds
            t += secs
            steps.append(
                replace(s, t=round(t, 3), seconds=secs, tgs=round(self.BASE_TGS * sc.step_time / secs, 3))
            )
        self.steps = steps
        self.train_end = steps[-1].t
        self.end = self.train_end + sc.tail_s
        self.ckpt_windows = [
            (s.t - s.seconds, s.t) for s in steps if s.step > 0 and s.step % sc.checkpoint_period == 0
        ]
        self.burst_t = next(s.t - s.seconds for s in steps if s.step == 150)

    def tcp_retx(self, host: str, t: float) -> float:
        v = super().tcp_retx(host, t)
        if host == "node002" and t >= self.burst_t:
            v += 400.0 * (min(t, self.burst_t + 360) - self.burst_t)
        return v

    def ras(self, host: str, g: int, block: str, kind: str, t: float) -> float:
        if host == "node003" and g == 5 and block == "umc" and kind == "ce":
            return float(int(max(0.0, t - self.train_start) / 10.0))
        return 0.0

    def hw_series(self) -> Series:
        def cnp(lab: str, host: str, fn: Any) -> Any:
            return lambda t: 2000.0 * max(0.0, min(t, self.train_end) - self.train_start)

        return relabel(
            super().hw_series(),
            override({"hw_rdma_rx_cnp_pkts_total": cnp, "hw_rdma_tx_cnp_pkts_total": cnp}),
        )


class IoOneHostSim(JobSim):
    """The last 40% of the run is 20% slower; only node004 sits at 50% IO pressure with 15 blocked procs."""

    def io_full(self, host: str, t: float) -> float:
        return 50.0 if host == "node004" and self.degraded(t) else super().io_full(host, t)

    def hw_series(self) -> Series:
        def blocked(lab: str, host: str, fn: Any) -> Any:
            return lambda t: 15.0 if host == "node004" and self.degraded(t) else fn(t)

        return relabel(super().hw_series(), override({"hw_procs_blocked": blocked}))


class CpuOneHostPortSim(JobSim):
    """The last 40% of the run is 20% slower with 12 extra runnable procs on node003 only; node001 mlx5_1
    goes down after the last step (in the data the old steady-training window did not cover)."""

    def procs_running(self, host: str, t: float) -> float:
        extra = 12.0 if host == "node003" and self.degraded(t) else 0.0
        return super().procs_running(host, t) + extra

    def hw_series(self) -> Series:
        def port(lab: str, host: str, fn: Any) -> Any:
            if host == "node001" and 'device="mlx5_1"' in lab:
                return lambda t: 0.0 if t > self.train_end + 5 else 1.0
            return fn

        return relabel(super().hw_series(), override({"hw_rdma_port_state": port}))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("playbook-signals")


@pytest.fixture(scope="module")
def net_burst(root: Path) -> Built:
    sc = scenario("healthy", job_id="6201", extra={"tcp_lifetime_outlier": "node004"})
    return build(NetBurstSim(sc), root / "net-burst")


# --- 1 + 2: a completed job has no hang and no heartbeat kill -----------------------------------------


@pytest.mark.prometheus
async def test_completed_job_hang_and_heartbeat_do_not_apply(
    net_burst: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    res = await run_playbooks(net_burst, tmp_path, settings, ["hang", "heartbeat"])
    hang, env = res["hang"]
    assert env.ctx.status == "completed" and env.ctx.primary_class is None
    assert hang.verdict == "healthy" and hang.anomalous_hosts == []
    assert hang.root_cause.startswith("No hang: the job completed successfully")
    assert "dead" not in hang.root_cause.replace("dead node", "")
    assert incident_time(env, hang) is None  # no post-finish idle time swept as an incident
    hb, _ = res["heartbeat"]
    assert hb.verdict == "healthy" and hb.anomalous_hosts == []
    assert "does not apply" in hb.root_cause and "no heartbeat error in the log" in hb.root_cause
    assert "false positive" not in hb.root_cause.replace("false or true positive", "")
    assert incident_time(env, hb) is None


@pytest.mark.prometheus
async def test_final_step_or_no_stall_is_not_a_hang(
    net_burst: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    """Status unknown: the configured final step, or no failure and no stall, is still no hang."""
    b = private_copy(net_burst, tmp_path / "x")
    for ctx, why in (
        (make_ctx(b, status=None), "configured final step"),
        (make_ctx(b, status=None, config={"steps": "1000"}), "stall budget"),
    ):
        r = (await run_playbooks(b, tmp_path / why.replace(" ", "-"), settings, ["hang"], ctx))["hang"][0]
        assert r.verdict == "healthy" and why in r.root_cause, r.root_cause


# --- 3: correctable errors only make the GPU anomalous ------------------------------------------------


@pytest.mark.prometheus
async def test_gpu_health_ce_only_is_degrading_hardware(
    net_burst: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    r = (await run_playbooks(net_burst, tmp_path, settings, ["gpu-health"]))["gpu-health"][0]
    assert r.verdict == "hardware-fault"
    assert r.anomalous_hosts == ["node003"]
    assert (
        "node003:gpu5" in r.root_cause
        and "Degrading" in r.root_cause
        and "not immediately fatal" in r.root_cause
    )
    summary = r.findings[0].summary
    assert "Anomalous GPUs: node003:5" in summary and "Anomalous GPUs: none" not in summary


# --- 5: a transient slowdown during a TCP burst ------------------------------------------------------


@pytest.mark.prometheus
async def test_tcp_burst_slowdown_is_attributed(
    net_burst: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    r = (await run_playbooks(net_burst, tmp_path, settings, ["training-stability"]))["training-stability"][0]
    assert "step time consistent" not in r.root_cause
    assert r.verdict == "rdma-degradation"  # closest network verdict; the text says TCP path
    assert r.anomalous_hosts == ["node002"]
    assert r.root_cause.startswith("Network event on node002: TCP retransmits")
    assert "steps 150-194" in r.root_cause and "+30%" in r.root_cause
    assert "No RDMA retransmit increase" in r.root_cause
    assert r.chain[0] == "TCP retransmit burst on node002"
    sim = net_burst.sim
    assert isinstance(sim, NetBurstSim)
    assert r.incident is not None and abs(r.incident - sim.burst_t) < 30


# --- 6: network-health reports TCP outliers, CNPs and lifetime totals -----------------------------------


@pytest.mark.prometheus
async def test_network_health_tcp_cnp_and_lifetime(
    net_burst: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    r = (await run_playbooks(net_burst, tmp_path, settings, ["network-health"]))["network-health"][0]
    assert "Network healthy" not in r.root_cause
    assert r.verdict == "rdma-degradation"
    assert r.anomalous_hosts == ["node002"]  # TCP outlier; CNP is switch-level, lifetime is not excluded
    assert "TCP retransmit outliers on node002" in r.root_cause and "IP/TCP path issue" in r.root_cause
    assert "(CNP) on 4/4 nodes: switch-level congestion" in r.root_cause
    life = [f for f in r.findings if f.title.startswith("TCP retransmit lifetime-total outliers")]
    assert len(life) == 1 and life[0].hosts == ("node004",) and "reported, not excluded" in life[0].summary
    assert "node004" not in r.anomalous_hosts


# --- 4: contention on a single host ---------------------------------------------------------------------


@pytest.mark.prometheus
async def test_io_contention_on_one_host(root: Path, tmp_path: Path, settings: TsdbSettings) -> None:
    b = build(IoOneHostSim(scenario("healthy", job_id="6202", extra={"degrade_from": 0.6})), root / "io1")
    r = (await run_playbooks(b, tmp_path, settings, ["training-stability"]))["training-stability"][0]
    assert r.verdict == "io-contention"
    assert r.anomalous_hosts == ["node004"]
    assert r.root_cause.startswith("Per-node storage contention on node004")
    assert "blocked processes node004" in r.root_cause


@pytest.fixture(scope="module")
def cpu_port(root: Path) -> Built:
    sim = CpuOneHostPortSim(scenario("healthy", job_id="6203", extra={"degrade_from": 0.6}))
    return build(sim, root / "cpu1")


@pytest.mark.prometheus
async def test_cpu_contention_on_one_host(cpu_port: Built, tmp_path: Path, settings: TsdbSettings) -> None:
    r = (await run_playbooks(cpu_port, tmp_path, settings, ["training-stability"]))["training-stability"][0]
    assert r.verdict == "healthy"  # no CPU-contention verdict in the fixed set (documented)
    assert r.anomalous_hosts == ["node003"]
    assert r.root_cause.startswith("Per-node CPU contention on node003")
    assert "background processes" in r.root_cause
    assert "no contention source moved" not in r.root_cause


# --- 7: network-health ranges over the full job ----------------------------------------------------------


@pytest.mark.prometheus
async def test_network_health_sees_port_down_after_last_step(
    cpu_port: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    r, env = (await run_playbooks(cpu_port, tmp_path, settings, ["network-health"]))["network-health"]
    assert r.window == (env.disc.min_time, env.disc.max_time)
    assert r.verdict == "hardware-fault" and r.anomalous_hosts == ["node001"]
    assert "RDMA link down on node001 mlx5_1:1" in r.root_cause


# --- 10: partial-GPU hang after completed steps is not init-phase ----------------------------------------


@pytest.mark.prometheus
async def test_partial_gpu_hang_after_steps_is_not_init_phase(
    root: Path, tmp_path: Path, settings: TsdbSettings
) -> None:
    b = build(JobSim(scenario("init-hang", hang_after_steps=150, job_id="6204")), root / "half")
    r = (await run_playbooks(b, tmp_path, settings, ["hang"]))["hang"][0]
    assert r.verdict == "rccl-busy-wait-hang"
    assert "Init-phase" not in r.root_cause and "init-phase" not in " ".join(r.next_steps)
    assert r.root_cause.startswith("Mid-training RCCL deadlock after step 149")


# --- 8 + 9 + 11: compare ---------------------------------------------------------------------------------


async def test_compare_accounts_for_config_and_has_report_keys(
    fixtures: Fixtures, root: Path, tmp_path: Path, settings: TsdbSettings
) -> None:
    a = fixtures.copy("restore-fresh", tmp_path / "a")
    b = build(JobSim(scenario("restore-fresh", job_id="6205", tgs_factor=0.5)), root / "cfg")
    cfg_a = {"steps": "400", "per_device_batch_size": "2", "max_target_length": "4096"}
    cfg_b = {**cfg_a, "per_device_batch_size": "4", "max_target_length": "8192", "remat_policy": "full"}
    c = await compare(make_ctx(a, config=cfg_a), make_ctx(b, config=cfg_b), settings, now=NOW)
    assert c.tgs["delta_pct"] < -40
    assert c.verdict == "healthy"
    assert c.root_cause.startswith("Config change explains TGS gap -50")
    for part in (
        "per_device_batch_size 2 -> 4",
        "max_target_length 4096 -> 8192",
        "remat_policy (unset) -> full",
    ):
        assert part in c.root_cause
    doc = cmp_json(c)
    assert set(doc) >= REQUIRED
    assert doc["time_window"]["overlap_steps"] == [5, 399]
    assert doc["time_window"]["a"]["duration_s"] > 0 and doc["time_window"]["b"]["duration_s"] > 0
    assert doc["nodes"]["count"] == 4 and doc["nodes"]["hosts"] == [
        "node001",
        "node002",
        "node003",
        "node004",
    ]
    titles = [f["title"] for f in doc["findings"]]
    assert titles[0] == "Config differences" and "Metric comparison" in titles
    assert "remat_policy" in doc["findings"][0]["summary"]


async def test_compare_without_overlap_and_restore_flag(
    fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings
) -> None:
    a = fixtures.copy("restore-fresh", tmp_path / "a")
    b = fixtures.copy("restore-leak", tmp_path / "b")
    late = make_ctx(b, ray=False)
    late = replace(late, steps=tuple(s for s in late.steps if s.step >= 450))
    c = await compare(make_ctx(a), late, settings, now=NOW)
    assert c.overlap is None and c.verdict is None
    assert c.root_cause.startswith("The jobs cannot be compared by step: no overlapping steps")
    doc = cmp_json(c)
    assert set(doc) >= REQUIRED and doc["verdict"] is None and doc["time_window"] is None
    md = cmp_md(c)
    assert "**Verdict:** n/a (not comparable by step)" in md and "n/a\n" not in md.split("### Root cause")[1]
    # Without enable_single_replica_ckpt_restoring=true the extra wave confirms nothing.
    assert "extra communicator wave" in md and "confirming the leaked communicators" not in md
    flag = {"enable_single_replica_ckpt_restoring": "true"}
    c2 = await compare(make_ctx(a), replace(late, config={**late.config, **flag}), settings, now=NOW)
    assert "confirming the leaked communicators" in cmp_md(c2)


async def test_log_only_json_keeps_report_keys(
    fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings
) -> None:
    b = fixtures.copy("rccl-hang", tmp_path)
    empty_dir(b.files.prometheus)
    d = await diagnose(make_ctx(b, status="cancelled"), settings, now=NOW)
    doc = to_json(d)
    assert set(doc) >= REQUIRED and doc["verdict"] is None
    tw = doc["time_window"]
    assert tw is not None and tw["source"] == "log" and tw["end_ts"] == b.sim.train_end
