"""The slow-host judge (tsdb/slow_host.py): each host against its peers over a slide's window."""

from __future__ import annotations

import random

from jobdiagd.model.plotdata import HostSeries
from jobdiagd.tsdb.slow_host import SlowHostPolicy, host_means, judge_slow_hosts

T0, T1 = 0.0, 600.0
HOSTS = tuple(f"node{i:03d}" for i in range(1, 9))


def flat(values: dict[str, float], *, noise: float = 0.0, seed: int = 1) -> tuple[HostSeries, ...]:
    rng = random.Random(seed)
    times = tuple(float(t) for t in range(0, 601, 30))
    return tuple(
        HostSeries(h, times, tuple(v + rng.uniform(-noise, noise) for _ in times)) for h, v in values.items()
    )


def uniform(v: float) -> dict[str, float]:
    return {h: v for h in HOSTS}


def test_one_host_retransmitting_over_rdma_is_named_with_its_evidence() -> None:
    rdma = uniform(0.05) | {"node005": 40.0}
    series = {
        "rdma_retrans": flat(rdma),
        "power": flat(uniform(560.0), noise=8.0),
        "util": flat(uniform(100.0)),
        "tcp_retrans": flat(uniform(0.3)),
    }
    v = judge_slow_hosts(series, start=T0, end=T1)
    assert v.hosts == ("node005",)
    assert "RDMA retransmits 40/s" in v.evidence["node005"][0]
    assert "higher" in v.evidence["node005"][0]
    assert "node005" in v.summary


def test_a_uniform_slide_names_no_host() -> None:
    series = {
        "power": flat(uniform(520.0), noise=12.0),
        "util": flat(uniform(97.0), noise=2.0),
        "rdma_retrans": flat(uniform(3.0), noise=0.5),
        "tcp_retrans": flat(uniform(20.0), noise=3.0),
        "mem_pressure": flat(uniform(2.0), noise=0.5),
    }
    v = judge_slow_hosts(series, start=T0, end=T1)
    assert v.hosts == ()
    assert "not one host" in v.summary
    assert set(v.compared) == set(series)


def test_noise_alone_never_names_a_host() -> None:
    for seed in range(30):
        rng = random.Random(seed)
        series = {
            "power": flat({h: 600.0 + rng.uniform(-20, 20) for h in HOSTS}, noise=15.0, seed=seed),
            "util": flat({h: 95.0 + rng.uniform(-5, 5) for h in HOSTS}, noise=3.0, seed=seed),
            "rdma_retrans": flat({h: rng.uniform(0, 0.8) for h in HOSTS}, noise=0.1, seed=seed),
            "tcp_retrans": flat({h: rng.uniform(0, 4) for h in HOSTS}, noise=0.5, seed=seed),
        }
        assert judge_slow_hosts(series, start=T0, end=T1).hosts == (), seed


def test_power_counts_both_ways_rates_only_upwards() -> None:
    low = judge_slow_hosts({"power": flat(uniform(650.0) | {"node002": 480.0})}, start=T0, end=T1)
    assert low.hosts == ("node002",) and "lower" in low.evidence["node002"][0]
    high = judge_slow_hosts({"power": flat(uniform(420.0) | {"node003": 640.0})}, start=T0, end=T1)
    assert high.hosts == ("node003",)
    quiet = judge_slow_hosts({"rdma_retrans": flat(uniform(30.0) | {"node004": 0.0})}, start=T0, end=T1)
    assert quiet.hosts == ()


def test_small_differences_and_rates_near_the_floor_are_not_named() -> None:
    # 30 W below identical peers: many noise units, but under the 50 W minimum.
    assert (
        judge_slow_hosts({"power": flat(uniform(600.0) | {"node001": 570.0})}, start=T0, end=T1).hosts == ()
    )
    # 0.8/s of RDMA retransmits against zero: under the 1/s floor of a real rate.
    assert (
        judge_slow_hosts({"rdma_retrans": flat(uniform(0.0) | {"node001": 0.8})}, start=T0, end=T1).hosts
        == ()
    )
    # 12/s of TCP against peers at 4/s: under 5 x the median.
    assert (
        judge_slow_hosts({"tcp_retrans": flat(uniform(4.0) | {"node001": 12.0})}, start=T0, end=T1).hosts
        == ()
    )


def test_more_than_a_quarter_of_the_hosts_differing_is_the_jobs_slide() -> None:
    rdma = uniform(0.0) | {"node001": 50.0, "node002": 45.0, "node003": 60.0}
    v = judge_slow_hosts({"rdma_retrans": flat(rdma)}, start=T0, end=T1)
    assert v.hosts == ()
    assert any("3 of 8 hosts differ" in n for n in v.notes)
    two = judge_slow_hosts(
        {"rdma_retrans": flat(uniform(0.0) | {"node001": 50.0, "node002": 45.0})}, start=T0, end=T1
    )
    assert two.hosts == ("node001", "node002")  # 2 of 8 is still a quarter


def test_two_hosts_are_not_compared() -> None:
    v = judge_slow_hosts({"rdma_retrans": flat({"a": 0.0, "b": 50.0})}, start=T0, end=T1)
    assert v.hosts == () and v.compared == ()
    assert "fewer than 3" in v.notes[0]


def test_a_baseline_keeps_a_host_that_was_always_different_unnamed() -> None:
    series = {"power": flat(uniform(650.0) | {"node002": 480.0})}
    always = {"power": uniform(650.0) | {"node002": 482.0}}
    assert judge_slow_hosts(series, start=T0, end=T1, baseline=always).hosts == ()
    before = {"power": uniform(690.0)}
    v = judge_slow_hosts(series, start=T0, end=T1, baseline=before)
    assert v.hosts == ("node002",) and "before the slide" in v.evidence["node002"][0]


def test_the_host_with_most_metrics_comes_first_and_the_window_is_respected() -> None:
    series = {
        "rdma_retrans": flat(uniform(0.0) | {"node007": 20.0, "node003": 30.0}),
        "power": flat(uniform(600.0) | {"node007": 450.0}),
    }
    v = judge_slow_hosts(series, start=T0, end=T1)
    assert v.hosts == ("node007", "node003")
    # Outside the window nothing counts; a host with too few samples inside it is left out.
    assert host_means(flat({"x": 1.0}), 1000.0, 2000.0, 2) == {}
    assert judge_slow_hosts(series, start=1000.0, end=2000.0, policy=SlowHostPolicy()).hosts == ()


def test_the_live_window_is_the_detectors_recent_steps_within_bounds() -> None:
    from jobdiagd.tsdb.slow_host import MAX_WINDOW_S, slide_window

    arrivals = {k: 1000.0 + 6.0 * k for k in range(100)}  # 6 s steps
    # The last 10 steps (the TGS detector's recent window) were read from step 89 on.
    assert slide_window(arrivals, 99, 1600.0, recent_steps=10, scrape_interval_s=15.0) == (1534.0, 1600.0)
    # Read all at once (a catch-up): at least four scrape intervals.
    same = dict.fromkeys(range(100), 1590.0)
    assert slide_window(same, 99, 1600.0, recent_steps=10, scrape_interval_s=15.0) == (1540.0, 1600.0)
    # A slow job's ten steps: cut to MAX_WINDOW_S.
    slow = {k: 1000.0 + 600.0 * k for k in range(20)}
    assert slide_window(slow, 19, 12_400.0, recent_steps=10, scrape_interval_s=15.0) == (
        12_400.0 - MAX_WINDOW_S,
        12_400.0,
    )
    assert slide_window({}, None, 100.0, recent_steps=10, scrape_interval_s=15.0) == (40.0, 100.0)
