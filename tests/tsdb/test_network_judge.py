"""The network playbook's pure judges (`judge_network_health`, `judge_correlation`) on in-memory
counters: no Prometheus. One hour, six hosts with two RDMA devices each; each test sets a few
counters and checks the verdict and evidence at the thresholds of rules PB-NET-2..5 and PB-HW-2.
"""

from __future__ import annotations

from jobdiagd.tsdb.align import StepPoint, Timeline
from jobdiagd.tsdb.playbooks.base import Verdict
from jobdiagd.tsdb.playbooks.network import (
    NetworkHealthJudgement,
    NetworkSeries,
    judge_correlation,
    judge_network_health,
)
from jobdiagd.tsdb.settings import Thresholds

TH = Thresholds()
HOSTS = tuple(f"node{i:03d}" for i in range(1, 7))
DEVS = [(h, f"mlx5_{d}:1") for h in HOSTS for d in (0, 1)]
W = 3600.0


def judge(**kw: dict[tuple[str, str], float] | dict[str, float]) -> NetworkHealthJudgement:
    """Background everywhere (100 retransmits per device, 1000 TCP retransmits per host, links up)."""
    base: dict[str, object] = {
        "retx": dict.fromkeys(DEVS, 100.0),
        "ports": dict.fromkeys(DEVS, 1.0),
        "tcp": dict.fromkeys(HOSTS, 1000.0),
        "tcp_total": dict.fromkeys(HOSTS, 1e4),
    }
    for k, v in kw.items():
        base[k] = {**base.get(k, {}), **v}  # type: ignore[dict-item]
    return judge_network_health(NetworkSeries(start=0.0, end=W, **base), HOSTS, TH)  # type: ignore[arg-type]


def test_background_counters_are_healthy() -> None:
    j = judge()
    assert j.verdict == Verdict.HEALTHY and j.anomalous == [] and j.rdma_clean


def test_port_down_is_a_hardware_fault() -> None:
    """Rule PB-HW-2: port state 0 is the physical layer, whatever else is seen."""
    j = judge(ports={("node004", "mlx5_1:1"): 0.0}, excd={("node002", "mlx5_0:1"): 3.0})
    assert j.verdict == Verdict.HARDWARE_FAULT and j.down == ["node004|mlx5_1:1"]
    assert j.anomalous == ["node002", "node004"] and not j.rdma_clean


def test_retransmit_outlier_needs_the_factor_and_the_floor() -> None:
    """Rule PB-NET-2: strictly above rate_outlier_factor x the other devices' median and the
    absolute floor rdma_retx_min_per_s x window."""
    floor = TH.rdma_retx_min_per_s * W
    top = max(TH.rate_outlier_factor * 100.0, floor)
    j = judge(retx={("node003", "mlx5_0:1"): top + 1})
    assert (j.verdict, j.bad_dev, j.anomalous) == (
        Verdict.RDMA_DEGRADATION,
        ["node003|mlx5_0:1"],
        ["node003"],
    )
    assert judge(retx={("node003", "mlx5_0:1"): top}).bad_dev == []


def test_ack_timeouts_above_one_percent_of_the_window_in_seconds() -> None:
    """Rule PB-NET-2: ACK timeouts count above max(1, 1 % of the window in seconds): 36 in an hour."""
    assert judge(ack={("node005", "mlx5_1:1"): 36.0}).verdict == Verdict.HEALTHY
    j = judge(ack={("node005", "mlx5_1:1"): 37.0})
    assert j.verdict == Verdict.RDMA_DEGRADATION and j.bad_dev == ["node005|mlx5_1:1"]


def test_any_retry_exhaustion_is_degradation() -> None:
    """Rule PB-NET-2: retry exhaustion is a hard link failure, one is enough."""
    j = judge(excd={("node001", "mlx5_0:1"): 1.0, ("node002", "mlx5_0:1"): 0.0})
    assert (j.verdict, j.excd_dev, j.anomalous) == (
        Verdict.RDMA_DEGRADATION,
        ["node001|mlx5_0:1"],
        ["node001"],
    )


def test_tcp_only_outlier_is_the_ip_path() -> None:
    """Rule PB-NET-3: TCP outliers with a clean RDMA fabric -> rdma-degradation, hosts anomalous."""
    j = judge(tcp={"node006": 1000.0 * TH.rate_outlier_factor + 1})
    assert (j.verdict, j.tcp_out, j.anomalous) == (Verdict.RDMA_DEGRADATION, ["node006"], ["node006"])
    assert j.rdma_clean
    assert judge(tcp={"node006": 1000.0 * TH.rate_outlier_factor}).tcp_out == []


def test_congestion_on_half_the_hosts_names_no_host() -> None:
    """Rule PB-NET-4: CNP above the floor on at least half the hosts (and at least 2)."""
    above = TH.rdma_retx_min_per_s * W + 1
    j = judge(cnp={(h, "mlx5_0:1"): above for h in HOSTS[:3]})
    assert j.congestion and j.verdict == Verdict.RDMA_DEGRADATION and j.anomalous == []
    two = judge(cnp={(h, "mlx5_0:1"): above for h in HOSTS[:2]})
    assert not two.congestion and two.verdict == Verdict.HEALTHY
    at_floor = judge(cnp={(h, "mlx5_0:1"): above - 1 for h in HOSTS[:3]})
    assert at_floor.cnp_hosts == [] and not at_floor.congestion


def test_tcp_lifetime_outliers_are_reported_not_anomalous() -> None:
    """Rule PB-HANG-6 (as in the hang playbook): >= 100 x peers' lifetime total, finding only."""
    j = judge(tcp_total={"node002": 1e4 * TH.tcp_outlier_factor + 1})
    assert j.tcp_life_out == ["node002"] and j.verdict == Verdict.HEALTHY and j.anomalous == []


def test_correlation_of_retransmits_and_step_time() -> None:
    """Rule PB-NET-5: a steady rate (spread < 20 % of the mean) is constant degradation (no r)."""
    tl = Timeline(tuple(StepPoint(i, 60.0 * i, step_time=6.0 + (i % 5)) for i in range(60)), "tsdb")
    steady = [(60.0 * i, 10.0 + (i % 2)) for i in range(60)]
    c = judge_correlation(steady, tl, 0.0, W)
    assert c.rho is None and round(c.mean_rate, 1) == 10.5
    bursts = [(60.0 * i, 10.0 * (i % 5)) for i in range(60)]
    c = judge_correlation(bursts, tl, 0.0, W)
    assert c.rho is not None and c.rho > 0.99
