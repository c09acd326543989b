"""Hang then heartbeat in the heartbeat playbook: the stall before the heartbeat error and the GPUs during it.

Pure judgement on literal series, then a promtool-built job (steps stop at T, every GPU busy-waits, the
heartbeat kills the job at T + 40 min, no tb_* metrics) against a real read-only Prometheus.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd.tsdb.anomaly import AnomalyReport, Deviation
from jobdiagd.tsdb.context import HeartbeatInfo, LogStep
from jobdiagd.tsdb.engine import adopt_earliest_root, diagnose
from jobdiagd.tsdb.playbooks.base import PlaybookResult, Verdict
from jobdiagd.tsdb.playbooks.heartbeat import judge_stall, training_end_from_power
from jobdiagd.tsdb.settings import DEFAULT_PROFILES, Thresholds, TsdbSettings
from tests.helpers.tsdb import NOW, Built, hang_hb_job, hb_ctx, private_copy, rows

TH = Thresholds()
MI300X = DEFAULT_PROFILES["MI300X"]
HOSTS = [f"node{i:03d}" for i in range(1, 5)]


def gpu_series(
    train_until: float, end: float, busy: bool
) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[tuple[float, float]]]]:
    power: dict[str, list[tuple[float, float]]] = {}
    util: dict[str, list[tuple[float, float]]] = {}
    for h in HOSTS[:4]:
        ts = [float(t) for t in range(0, int(end) + 1, 30)]
        power[h] = [(t, 680.0 if t <= train_until else (300.0 if busy else 90.0)) for t in ts]
        util[h] = [(t, 100.0 if t <= train_until or busy else 0.0) for t in ts]
    return power, util


def test_judge_stall_busy_wait_between_last_step_and_kill() -> None:
    power, util = gpu_series(1200, 1200 + 2400, busy=True)
    j = judge_stall(3600.0, (1200.0, 149, "log"), power, util, MI300X, TH, 6.0)
    assert j.stall_s == 2400 and j.busy_wait_frac == 1.0 and j.hang_first(TH)
    assert j.window == (1260.0, 3600.0) and set(j.per_host) == set(HOSTS[:4])
    # No dated step at all: the power series dates the end of training.
    j2 = judge_stall(3600.0, (None, None, "none"), power, util, MI300X, TH, 6.0)
    assert j2.source == "power" and j2.last_step_t == 1200 and j2.hang_first(TH)
    assert training_end_from_power(power, MI300X, 3600.0) == 1200


def test_hang_then_heartbeat_adopts_a_standing_out_network_trigger() -> None:
    """The earliest-anomaly sweep names a trigger before a hang the heartbeat then killed, as for a hang."""
    alone = Deviation("hw_rdma_tx_retx_pkts_total", "node002", 590.0, 0.0, 40.0, "up", counter=True)
    hb = PlaybookResult(
        playbook="heartbeat",
        analysis_type="heartbeat",
        verdict=Verdict.HANG_THEN_HEARTBEAT,
        window=(0.0, 1.0),
        root_cause="y",
        chain=["c"],
    )
    hb = adopt_earliest_root(hb, AnomalyReport(600.0, (0.0, 700.0), [alone]))
    assert hb.anomalous_hosts == ["node002"] and hb.root_cause.startswith("Trigger (earliest anomaly)")
    fp = PlaybookResult(
        playbook="heartbeat",
        analysis_type="heartbeat",
        verdict=Verdict.HEARTBEAT_FALSE_POSITIVE,
        window=(0.0, 1.0),
        root_cause="z",
    )
    fp = adopt_earliest_root(fp, AnomalyReport(600.0, (0.0, 700.0), [alone]))
    assert fp.anomalous_hosts == [] and fp.root_cause == "z"


def test_judge_stall_training_to_the_end_or_idle_gpus_is_not_a_hang() -> None:
    power, util = gpu_series(3600, 3600, busy=True)
    j = judge_stall(3600.0, (3594.0, 598, "tsdb"), power, util, MI300X, TH, 6.0)
    assert not j.hang_first(TH) and j.stall_s == pytest.approx(6.0)
    idle_power, idle_util = gpu_series(1200, 3600, busy=False)
    j2 = judge_stall(3600.0, (1200.0, 149, "tsdb"), idle_power, idle_util, MI300X, TH, 6.0)
    assert j2.busy_wait_frac == 0.0 and not j2.hang_first(TH)
    # A short stall (under stall_min_s) is not a hang even with busy-wait GPUs.
    j3 = judge_stall(1500.0, (1200.0, 149, "tsdb"), *gpu_series(1200, 1500, busy=True), MI300X, TH, 6.0)
    assert j3.busy_wait_frac == 1.0 and not j3.hang_first(TH)
    assert judge_stall(3600.0, (None, None, "none"), {}, {}, MI300X, TH, 6.0).stall_s is None


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("heartbeat-stall")


@pytest.fixture(scope="module")
def hang_hb(root: Path) -> Built:
    return hang_hb_job(root)


@pytest.mark.prometheus
async def test_heartbeat_kill_after_a_long_hang_undated_log(
    hang_hb: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    """Undated step lines (print-era MaxText): only the power series dates the stall."""
    b = private_copy(hang_hb, tmp_path)
    undated = tuple(LogStep(s.step, s.seconds, s.loss, s.tgs, None) for s in b.sim.steps)
    d = await diagnose(hb_ctx(b, steps=undated, last_step=149), settings, now=NOW)
    r = d.result
    assert r is not None and d.playbook == "heartbeat"
    assert r.verdict == "hang-then-heartbeat", r.root_cause
    assert r.root_cause.startswith("Training had stalled 40 min before the heartbeat error")
    assert "the GPUs left training power at" in r.root_cause and "busy-wait" in r.root_cause
    gpus = rows(r, "GPUs between the last step")
    assert set(gpus) == set(b.sim.sc.nodes) and all(v[4] == "100%" for v in gpus.values())
    assert gpus["node003"][1] == "yes"
    assert r.chain[-1] == "heartbeat timeout kills the job"
    # The incident swept for the earliest anomaly is the hang, not the kill.
    assert r.incident is not None and abs(r.incident - b.sim.train_end) <= 30


@pytest.mark.prometheus
async def test_heartbeat_kill_after_a_long_hang_triage_time(
    hang_hb: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    b = private_copy(hang_hb, tmp_path)
    ctx = hb_ctx(b, steps=(), last_step=149, last_step_time=b.sim.train_end)
    r = (await diagnose(ctx, settings, now=NOW, with_anomaly=False)).result
    assert r is not None and r.verdict == "hang-then-heartbeat"
    assert "last step 149 at" in r.root_cause and "from the triage" in r.root_cause


@pytest.mark.prometheus
async def test_training_until_the_kill_stays_a_false_positive(
    hang_hb: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    """A heartbeat error while the steps still advance: no hang before it."""
    b = private_copy(hang_hb, tmp_path)
    crash = b.sim.train_end - 200
    ctx = hb_ctx(b, heartbeat=HeartbeatInfo(crash, 100.0, (2,), ("node003",)), incident_time=crash)
    r = (await diagnose(ctx, settings, now=NOW, with_anomaly=False)).result
    assert r is not None and r.verdict == "heartbeat-false-positive", r.root_cause
