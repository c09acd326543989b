"""Cross-host patterns (majority, rates that stand out) and the sweep's network-counter rule, on literal series."""

from __future__ import annotations

import pytest

from jobdiagd.tsdb.anomaly import AnomalyReport, Deviation, judge_network_deviations
from jobdiagd.tsdb.client import Series
from jobdiagd.tsdb.engine import adopt_earliest_root
from jobdiagd.tsdb.patterns import (
    RateWindow,
    StandOutRule,
    burst_onset,
    counter_rate,
    minority_hosts,
    robust_center,
    standouts,
)
from jobdiagd.tsdb.playbooks.base import PlaybookResult, Verdict
from jobdiagd.tsdb.settings import Thresholds
from tests.helpers.tsdb import counter, sparse

TH = Thresholds()
HOSTS = [f"node{i:03d}" for i in range(1, 7)]
RULE = StandOutRule(min_rate=0.05, baseline_factor=5.0, peer_factor=5.0, mad_k=5.0)


# --- patterns ---------------------------------------------------------------------------------------------


def test_robust_center_and_counter_rate() -> None:
    assert robust_center([]) == (0.0, 0.0)
    med, mad = robust_center([1.0, 2.0, 3.0, 100.0])
    assert med == 2.5 and mad == pytest.approx(1.0 * 1.4826)
    pts = [(0.0, 10.0), (10.0, 20.0), (20.0, 5.0), (30.0, 15.0)]  # a reset at t=20
    assert counter_rate(pts, 0, 30) == pytest.approx(20 / 30)
    assert counter_rate(pts, 25, 30) is None


def test_minority_hosts() -> None:
    assert minority_hosts(dict.fromkeys(HOSTS, "busy")) == []
    assert minority_hosts({**dict.fromkeys(HOSTS, "busy"), "node004": "idle"}) == ["node004"]
    # A tie goes to the healthy category when it is among the tied ones ...
    assert minority_hosts({"a": "silent", "b": "reporting"}, "reporting") == ["a"]
    # ... else to the first host's (the init-hang pattern: 2 x {4,7}, 2 x {1,7}).
    sets = {"node001": "47", "node002": "17", "node003": "47", "node004": "17"}
    assert minority_hosts(sets) == ["node002", "node004"]
    assert minority_hosts({"only": "x"}) == []


def test_standouts_need_own_baseline_peers_and_minimum_rate() -> None:
    background = {h: RateWindow(0.004, 0.006) for h in HOSTS}  # single digits in ten minutes
    assert standouts(background, RULE) == []
    burst = {**background, "node005": RateWindow(0.004, 2.0)}
    assert standouts(burst, RULE) == ["node005"]
    # Always at that rate (its own baseline): not a new event.
    chronic = {**background, "node005": RateWindow(1.9, 2.0)}
    assert standouts(chronic, RULE) == []
    # Everyone alike: not one host's anomaly.
    assert standouts({h: RateWindow(0.0, 2.0) for h in HOSTS}, RULE) == []
    # Below the minimum rate even when alone and new.
    assert standouts({**background, "node005": RateWindow(0.0, 0.03)}, RULE) == []
    # No pre-incident data: only the peers and the minimum count.
    assert standouts({**background, "node005": RateWindow(None, 2.0)}, RULE) == ["node005"]
    # A single-host job: own baseline and minimum rate only.
    assert standouts({"solo": RateWindow(0.0, 2.0)}, RULE) == ["solo"]


def test_burst_onset_skips_background_ticks() -> None:
    pts = sparse(0, 600, 10, 9, 2.0)  # a tick of 2 every 90 s
    burst = [(t, v + (3.0 * (t - 400) if t >= 400 else 0.0)) for t, v in pts]
    assert burst_onset(burst, 0, 0.5) == 410  # a lone tick of 0.2/s is below the floor
    # A rare single event (retry exhaustion) is its own onset.
    single = [(0.0, 0.0), (10.0, 0.0), (20.0, 1.0), (30.0, 1.0), (40.0, 1.0)]
    assert burst_onset(single, 0, 1e-9) == 20
    assert burst_onset([(0.0, 0.0), (10.0, 0.0)], 0, 1e-9) is None


# --- the earliest-anomaly sweep: background network counters --------------------------------------------------


def test_sweep_drops_background_and_marks_cluster_wide_network_rises() -> None:
    fam = "hw_rdma_tx_ack_timeout_total"
    series = [
        Series({"__name__": fam, "host": h}, tuple(sparse(0, 1800, 20, 12, 1.0, phase=i)))
        for i, h in enumerate(HOSTS)
    ]
    devs = [Deviation(fam, h, 1500.0, 0.0, 1.0, "up", 0.5, True) for h in HOSTS]
    assert judge_network_deviations(devs, series, 1200.0, 0.0, 1800.0, TH) == []
    # Everyone at 2/s from 1300: kept (a cluster-wide event), but never one host's trigger.
    alike = [
        Series({"__name__": fam, "host": h}, tuple(counter(0, 1800, 20, 0.0, burst_from=1300, burst=2.0)))
        for h in HOSTS
    ]
    kept = judge_network_deviations(devs, alike, 1200.0, 0.0, 1800.0, TH)
    assert len(kept) == len(HOSTS) and all(d.peers_alike for d in kept)
    assert all(1300 <= d.onset <= 1340 for d in kept)
    # One host alone: kept, not alike; other families pass through untouched.
    one = [*series[:4], alike[4], series[5]]
    other = Deviation("hw_gpu_temperature_celsius", "node002", 1400.0, 60.0, 95.0, "up")
    got = judge_network_deviations([*devs, other], one, 1200.0, 0.0, 1800.0, TH)
    assert [(d.family, d.host, d.peers_alike) for d in got] == [
        (fam, "node005", False),
        ("hw_gpu_temperature_celsius", "node002", False),
    ]


def test_cluster_wide_rise_is_not_adopted_as_the_hang_trigger() -> None:
    alike = Deviation(
        "hw_rdma_tx_retx_pkts_total", "node002", 590.0, 0.0, 40.0, "up", counter=True, peers_alike=True
    )
    res = PlaybookResult(
        playbook="hang",
        analysis_type="hang",
        verdict=Verdict.RCCL_BUSY_WAIT_HANG,
        window=(0.0, 1.0),
        root_cause="x",
        chain=["c"],
    )
    res = adopt_earliest_root(res, AnomalyReport(600.0, (0.0, 700.0), [alike]))
    assert res.anomalous_hosts == [] and res.root_cause == "x"
    alone = Deviation("hw_rdma_tx_retx_pkts_total", "node002", 590.0, 0.0, 40.0, "up", counter=True)
    res = PlaybookResult(
        playbook="hang",
        analysis_type="hang",
        verdict=Verdict.RCCL_BUSY_WAIT_HANG,
        window=(0.0, 1.0),
        root_cause="y",
        chain=["c"],
    )
    res = adopt_earliest_root(res, AnomalyReport(600.0, (0.0, 700.0), [alone]))
    assert res.anomalous_hosts == ["node002"] and res.root_cause.startswith("Trigger (earliest anomaly)")
