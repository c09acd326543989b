"""The hang playbook's pure judge (`judge_hang`) on in-memory series: no Prometheus.

Each test builds the hang window's values in Python (six hosts of eight MI300X GPUs) and checks
the verdict, the mechanism and the evidence, at the boundary of each threshold (rules PB-GPU-2,
PB-HANG-2, -3, -4, -6, -7, -8).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from jobdiagd.tsdb.playbooks.base import Verdict, gpu_state
from jobdiagd.tsdb.playbooks.hang import (
    HangFacts,
    HangMechanism,
    HangSeries,
    NetworkWindows,
    hang_mechanism,
    judge_hang,
    power_band,
)
from jobdiagd.tsdb.settings import DEFAULT_PROFILES, Thresholds

TH = Thresholds()
MI300X = DEFAULT_PROFILES["MI300X"]
HOSTS = tuple(f"node{i:03d}" for i in range(1, 7))
GPUS = tuple(str(g) for g in range(8))
LAST, START, END = 1000.0, 1120.0, 2000.0
FACTS = HangFacts(hosts=HOSTS, gpus_per_host=8, last_step=40, step_source="tsdb")
BUSY_WAIT = (100.0, 300.0)  # (util %, power W): 100 % util at busy-wait power
TRAINING = (98.0, 680.0)
IDLE = (0.0, 80.0)
PARTIAL = (50.0, 500.0)  # neither band: "partial"


def series(
    gpu: Mapping[str, tuple[float, float]] | None = None,
    per_gpu: Mapping[tuple[str, str], tuple[float, float]] | None = None,
    **kw: object,
) -> HangSeries:
    """Every GPU busy-waiting and every host reporting (60 samples in the pre-hang 600 s: 10 s interval),
    unless `gpu` (host -> state of all its GPUs) or `per_gpu` says otherwise."""
    util: dict[tuple[str, str], float] = {}
    power: dict[tuple[str, str], float] = {}
    for h in HOSTS:
        for g in GPUS:
            u, p = (per_gpu or {}).get((h, g)) or (gpu or {}).get(h) or BUSY_WAIT
            util[(h, g)], power[(h, g)] = u, p
    base: dict[str, object] = {
        "last": LAST,
        "start": START,
        "end": END,
        "before": 600.0,
        "net_windows": NetworkWindows(lo=0.0, lead=700.0, last=LAST, grace=6.0, hi=END),
        "util": util,
        "power": power,
        "power_before": {k: 680.0 for k in power},
        "samples": {h: 88.0 for h in HOSTS},
        "samples_before": {h: 60.0 for h in HOSTS},
        "last_seen": {h: END for h in HOSTS},
        "gpu_procs": {h: 8.0 for h in HOSTS},
        "gpu_procs_before": {h: 8.0 for h in HOSTS},
        "tcp_total": {h: 1e4 for h in HOSTS},
        "port_min": {h: 1.0 for h in HOSTS},
    }
    base.update(kw)
    return HangSeries(**base)  # type: ignore[arg-type]


def test_every_gpu_busy_waiting_is_a_busy_wait_hang_naming_no_host() -> None:
    j = judge_hang(series(), FACTS, MI300X, TH)
    assert (j.verdict, j.mechanism) == (Verdict.RCCL_BUSY_WAIT_HANG, HangMechanism.BUSY_WAIT)
    assert j.anomalous == [] and j.dead == [] and j.gone == [] and not j.partial
    assert j.counts == {"busy-wait": 48} and j.busy_frac == 1.0


def test_busy_wait_share_boundary_is_half_the_gpus() -> None:
    """Rule PB-HANG-4: at least half the GPUs busy-waiting is a hang; one GPU fewer is not."""
    half = {h: (BUSY_WAIT if i < 3 else PARTIAL) for i, h in enumerate(HOSTS)}
    j = judge_hang(series(half), FACTS, MI300X, TH)
    assert j.busy_frac == 0.5 and j.verdict == Verdict.RCCL_BUSY_WAIT_HANG
    one_less = series(half, per_gpu={("node003", "7"): PARTIAL})
    j = judge_hang(one_less, FACTS, MI300X, TH)
    assert j.busy_frac == 23 / 48 and not j.partial
    assert (j.verdict, j.mechanism) == (Verdict.HEALTHY, HangMechanism.NONE)


def test_partial_gpu_set_is_a_hang_and_names_the_host_with_another_set() -> None:
    """Rule PB-HANG-4: GPUs 0-3 spin on most hosts (a partial pattern); node006 spins 0-5."""
    per_gpu = {(h, g): PARTIAL for h in HOSTS for g in "4567"}
    per_gpu |= {("node006", "4"): BUSY_WAIT, ("node006", "5"): BUSY_WAIT}
    j = judge_hang(series(per_gpu=per_gpu), FACTS, MI300X, TH)
    assert j.partial and j.majority == frozenset("0123")
    assert j.verdict == Verdict.RCCL_BUSY_WAIT_HANG and j.outlier_hosts == ["node006"]
    assert "node006" in j.anomalous and j.deviating["GPU activity"] == ["node006"]


def test_silent_host_while_peers_spin_is_dead_node() -> None:
    """Rule PB-HANG-2: a host whose newest scrape is older than max(3 intervals, 30 s) stopped reporting."""
    silent = series(last_seen={**{h: END for h in HOSTS}, "node004": END - 31})
    j = judge_hang(silent, FACTS, MI300X, TH)
    assert (j.verdict, j.mechanism) == (Verdict.DEAD_NODE, HangMechanism.SILENT_HOSTS)
    assert j.dead == ["node004"] and j.anomalous == ["node004"]
    at_limit = series(last_seen={**{h: END for h in HOSTS}, "node004": END - 30})
    j = judge_hang(at_limit, FACTS, MI300X, TH)
    assert j.dead == [] and j.verdict == Verdict.RCCL_BUSY_WAIT_HANG


def test_process_gone_while_peers_busy_wait_is_dead_node() -> None:
    """Rule PB-HANG-2: no GPU user process and no GPU spinning on node002 while the others spin."""
    data = series({"node002": IDLE}, gpu_procs={**{h: 8.0 for h in HOSTS}, "node002": 0.0})
    j = judge_hang(data, FACTS, MI300X, TH)
    assert (j.verdict, j.mechanism) == (Verdict.DEAD_NODE, HangMechanism.PROCESS_GONE)
    assert j.gone == ["node002"] and j.still_listed == [] and j.procs["node002"] == "gone"
    assert j.anomalous == ["node002"]


def test_idle_gpus_with_a_listed_process_still_left_the_collective() -> None:
    """Rule PB-HANG-2: all GPUs idle counts as gone even while the process is listed (defunct/host stall)."""
    j = judge_hang(series({"node005": IDLE}), FACTS, MI300X, TH)
    assert j.verdict == Verdict.DEAD_NODE and j.gone == ["node005"] and j.still_listed == ["node005"]


def test_scrape_gaps_boundary_is_seventy_percent_of_the_best_peer() -> None:
    """Rule PB-HANG-3: fewer than 0.7 x the best host's samples is a partition; exactly 0.7 x is not."""
    gaps = series(samples={**{h: 100.0 for h in HOSTS}, "node003": 69.0})
    j = judge_hang(gaps, FACTS, MI300X, TH)
    assert (j.verdict, j.mechanism) == (Verdict.NETWORK_PARTITION, HangMechanism.PARTITION)
    assert j.partitioned == ["node003"] and j.expected == 100.0
    at_limit = series(samples={**{h: 100.0 for h in HOSTS}, "node003": 70.0})
    assert judge_hang(at_limit, FACTS, MI300X, TH).partitioned == []


def test_rdma_port_down_is_network_partition() -> None:
    """Rule PB-HANG-3: an RDMA port state below 1 in the window."""
    j = judge_hang(series(port_min={**{h: 1.0 for h in HOSTS}, "node006": 0.0}), FACTS, MI300X, TH)
    assert j.verdict == Verdict.NETWORK_PARTITION and j.port_down == ["node006"]
    assert j.deviating["RDMA ports"] == ["node006"]


def test_training_power_or_all_idle() -> None:
    """Rule PB-HANG-7: most GPUs at training power -> healthy; every GPU idle -> dead-node."""
    j = judge_hang(series(dict.fromkeys(HOSTS, TRAINING)), FACTS, MI300X, TH)
    assert (j.verdict, j.mechanism) == (Verdict.HEALTHY, HangMechanism.TRAINING)
    j = judge_hang(series(dict.fromkeys(HOSTS, IDLE)), FACTS, MI300X, TH)
    assert (j.verdict, j.mechanism) == (Verdict.DEAD_NODE, HangMechanism.ALL_IDLE)


def test_mechanism_order_and_shares() -> None:
    """The decision order of PB-HANG-2/3/4/7 on counts alone."""
    none: list[str] = []

    def mech(counts: dict[str, int], **kw: list[str] | bool) -> HangMechanism:
        args: dict[str, object] = {
            "dead": none,
            "active_hosts": ["a"],
            "gone": none,
            "partitioned": none,
            "port_down": none,
            "partial": False,
        }
        args.update(kw)
        return hang_mechanism(counts=counts, total=sum(counts.values()), **args)  # type: ignore[arg-type]

    assert mech({"busy-wait": 5, "idle": 5}) == HangMechanism.BUSY_WAIT
    assert mech({"busy-wait": 4, "idle": 6}) == HangMechanism.NONE
    assert mech({"busy-wait": 1, "partial": 9}, partial=True) == HangMechanism.BUSY_WAIT
    assert mech({"training": 5, "idle": 5}) == HangMechanism.TRAINING
    assert mech({"training": 4, "partial": 6}) == HangMechanism.NONE
    # A silent host outranks everything, a gone process needs someone spinning.
    assert mech({"busy-wait": 10}, dead=["b"], partitioned=["c"]) == HangMechanism.SILENT_HOSTS
    assert mech({"idle": 10}, gone=["b"]) == HangMechanism.ALL_IDLE
    assert mech({"busy-wait": 1, "idle": 9}, gone=["b"]) == HangMechanism.PROCESS_GONE


def test_heartbeat_error_after_a_long_stall_is_hang_then_heartbeat() -> None:
    """Rule PB-HANG-8: a heartbeat error >= stall_min_s after the last step, GPUs busy-waiting."""
    at_limit = replace(FACTS, heartbeat_crash=LAST + TH.stall_min_s)
    j = judge_hang(series(), at_limit, MI300X, TH)
    assert j.verdict == Verdict.HANG_THEN_HEARTBEAT
    assert j.kill is not None and j.kill.crash == LAST + TH.stall_min_s
    assert j.kill.stall.stall_s == TH.stall_min_s and j.kill.stall.last_step == 40
    short = replace(FACTS, heartbeat_crash=LAST + TH.stall_min_s - 1)
    j = judge_hang(series(), short, MI300X, TH)
    assert j.verdict == Verdict.RCCL_BUSY_WAIT_HANG and j.kill is None
    # A dead node stays dead-node even when the heartbeat killed the job.
    j = judge_hang(series(last_seen={**{h: END for h in HOSTS}, "node001": 10.0}), at_limit, MI300X, TH)
    assert j.verdict == Verdict.DEAD_NODE and j.kill is None


def test_tcp_lifetime_outlier_needs_a_hundred_times_the_peers() -> None:
    """Rule PB-HANG-6: reported for awareness (strictly above 100 x the peers' median), never anomalous."""
    over = series(tcp_total={**{h: 1e4 for h in HOSTS}, "node002": 1e6 + 1})
    j = judge_hang(over, FACTS, MI300X, TH)
    assert j.tcp_lifetime_outliers == ["node002"] and j.anomalous == []
    at = series(tcp_total={**{h: 1e4 for h in HOSTS}, "node002": 1e6})
    assert judge_hang(at, FACTS, MI300X, TH).tcp_lifetime_outliers == []


def test_gpu_state_and_power_band_boundaries() -> None:
    """Rule PB-GPU-2: training at >= 0.9 x training power; busy-wait at >= 90 % util and
    <= 1.15 x the busy-wait maximum; idle at idle power and <= 10 % util."""
    train_min = MI300X.train_power_min_w * 0.9
    assert gpu_state(50.0, train_min, MI300X, TH) == "training"
    assert gpu_state(50.0, train_min - 1, MI300X, TH) == "partial"
    bw_max = MI300X.busy_wait_power_max_w * 1.15
    assert gpu_state(TH.busy_util_pct, bw_max, MI300X, TH) == "busy-wait"
    assert gpu_state(TH.busy_util_pct, bw_max + 1, MI300X, TH) == "busy"
    assert gpu_state(TH.busy_util_pct - 1, 300.0, MI300X, TH) == "low-util"
    assert gpu_state(TH.idle_util_pct, MI300X.idle_power_max_w, MI300X, TH) == "idle"
    assert gpu_state(TH.idle_util_pct + 1, MI300X.idle_power_max_w, MI300X, TH) == "partial"
    assert gpu_state(None, None, MI300X, TH) == "absent"
    assert power_band(train_min, MI300X) == "training"
    assert power_band(MI300X.busy_wait_power_min_w * 0.85, MI300X) == "busy-wait"
    assert power_band(bw_max + 1, MI300X) == "between"
    assert power_band(MI300X.idle_power_max_w, MI300X) == "idle"
    assert power_band(MI300X.idle_power_max_w + 1, MI300X) == "below busy-wait"
    assert power_band(None, MI300X) == "no data"
