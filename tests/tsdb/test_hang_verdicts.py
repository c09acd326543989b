"""Hang playbook verdicts: dead node by process state, hang then heartbeat, baseline-relative
triggers and anomalous_hosts as the hosts off the majority pattern.

Pure judgements on literal series first, then promtool-built scenarios (jobdiagd_sim.metrics: dead-process,
dead-node, hang-then-heartbeat, rdma-background, rdma-trigger) against a real read-only Prometheus.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from jobdiagd.triage.engine import triage
from jobdiagd.tsdb.context import context_from_triage
from jobdiagd.tsdb.engine import diagnose
from jobdiagd.tsdb.patterns import counter_rate
from jobdiagd.tsdb.playbooks.hang import (
    NetworkJudgement,
    NetworkWindows,
    deviations,
    host_patterns,
    idle_like,
    judge_network,
    left_collective,
    power_band,
    process_states,
)
from jobdiagd.tsdb.report import to_json, to_markdown
from jobdiagd.tsdb.settings import DEFAULT_PROFILES, Thresholds, TsdbSettings
from jobdiagd_sim.metrics import SIX_NODES, JobSim, scenario
from tests.helpers.tsdb import (
    NOW,
    Built,
    build,
    counter,
    hang_hb_job,
    hb_ctx,
    make_ctx,
    private_copy,
    rows,
    sparse,
)

TH = Thresholds()
MI300X = DEFAULT_PROFILES["MI300X"]
HOSTS = [f"node{i:03d}" for i in range(1, 7)]


def net_series(burst_host: str | None) -> dict[tuple[str, str, str], list[tuple[float, float]]]:
    out: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for i, h in enumerate(HOSTS):
        for dev in ("mlx5_0", "mlx5_1"):
            bf = 1900.0 if h == burst_host and dev == "mlx5_0" else None
            ack = sparse(0, 2700, 10, 24, 1.0, phase=i)
            retx = sparse(0, 2700, 10, 9, 4.0, phase=i + 3)
            if bf is not None:
                ack = [(t, v + (2.0 * (t - bf) if t >= bf else 0.0)) for t, v in ack]
                retx = [(t, v + (200.0 * (t - bf) if t >= bf else 0.0)) for t, v in retx]
            out[("hw_rdma_tx_ack_timeout_total", h, dev)] = ack
            out[("hw_rdma_tx_retx_pkts_total", h, dev)] = retx
        out[("hw_tcp_retransmits_total", h, "")] = counter(0, 2700, 10, 0.2)
    return out


WIN = NetworkWindows(lo=0.0, lead=1700.0, last=2000.0, grace=6.0, hi=2600.0)


def judge(
    series: dict[tuple[str, str, str], list[tuple[float, float]]], win: NetworkWindows = WIN
) -> NetworkJudgement:
    """What the playbook passes: the lead-up/hang samples and each key's own pre-incident rate."""
    before = {k: r for k, pts in series.items() if (r := counter_rate(pts, win.lo, win.lead)) is not None}
    return judge_network(
        {k: [p for p in pts if p[0] >= win.lead] for k, pts in series.items()}, before, win, TH
    )


def test_judge_network_background_is_no_trigger() -> None:
    j = judge(net_series(None))
    assert j.triggers == {} and j.standout_hosts == []
    assert j.background["hw_rdma_tx_ack_timeout_total"] == HOSTS
    assert j.background["hw_rdma_tx_retx_pkts_total"] == HOSTS


def test_judge_network_names_the_burst_host_and_device() -> None:
    j = judge(net_series("node005"))
    assert list(j.triggers) == [("node005", "mlx5_0")]
    onset, parts = j.triggers[("node005", "mlx5_0")]
    assert 1900 <= onset <= 1920
    assert parts[0].startswith("ACK timeouts +") and parts[1].startswith("retransmits +")
    assert j.standout_hosts == ["node005"]
    assert "node005" not in j.background.get("hw_rdma_tx_ack_timeout_total", [])


def test_judge_network_burst_after_the_hang_is_no_trigger() -> None:
    late = NetworkWindows(lo=0.0, lead=1500.0, last=1800.0, grace=6.0, hi=2600.0)
    j = judge(net_series("node005"), late)  # burst at 1900 > last step + grace
    assert j.triggers == {} and j.standout_hosts == ["node005"]


def test_process_states_and_idle_like() -> None:
    reporting = dict.fromkeys(HOSTS, "reporting") | {"node006": "silent"}
    procs_now = {h: 8.0 for h in HOSTS[:3]} | {"node004": 0.0}  # node005's series stopped
    before = {h: 8.0 for h in HOSTS}
    got = process_states(HOSTS, procs_now, before, reporting)
    assert got == {
        "node001": "present",
        "node002": "present",
        "node003": "present",
        "node004": "gone",
        "node005": "gone",
        "node006": "unknown",
    }
    assert process_states(HOSTS, {}, {}, reporting) == dict.fromkeys(HOSTS, "unknown")
    assert idle_like({"0": "partial", "1": "idle"}, 110.0, MI300X)  # 0 % util at 110 W: not in the collective
    assert not idle_like({"0": "busy-wait", "1": "idle"}, 200.0, MI300X)
    assert not idle_like({"0": "partial"}, 240.0, MI300X)  # busy-wait band (250 W - 15 %)
    assert not idle_like({}, None, MI300X)
    assert [power_band(w, MI300X) for w in (680.0, 300.0, 150.0, 90.0, None)] == [
        "training",
        "busy-wait",
        "below busy-wait",
        "idle",
        "no data",
    ]


def test_left_collective() -> None:
    spin = {str(g): "busy-wait" for g in range(8)}
    partial = {str(g): "partial" for g in range(8)}  # 0 % util at ~110 W: above the idle bound
    gpus = {"node001": spin, "node002": partial, "node003": partial, "node004": spin, "node005": {}}
    power = {"node001": 300.0, "node002": 110.0, "node003": 110.0, "node004": 300.0}
    procs = {
        "node001": "present",
        "node002": "gone",
        "node003": "present",
        "node004": "gone",
        "node005": "gone",
    }
    left, listed = left_collective(list(gpus), ["node005"], procs, gpus, power, MI300X)
    # node004 lost its process but its GPUs still spin (a counter glitch): not left; node005 is silent.
    assert left == ["node002", "node003"] and listed == ["node003"]


def test_majority_pattern_per_family() -> None:
    spin = {str(g): "busy-wait" for g in range(8)}
    idle = {str(g): "idle" for g in range(8)}
    reporting = dict.fromkeys(HOSTS, "reporting")
    power = dict.fromkeys(HOSTS, 300.0)
    present = dict.fromkeys(HOSTS, "present")

    def devs(gpus: dict[str, dict[str, str]], **kw: object) -> dict[str, list[str]]:
        args: dict[str, object] = {
            "reporting": reporting,
            "host_power": power,
            "procs": present,
            "port_down": [],
            "network_standouts": [],
        } | kw
        return deviations(host_patterns(HOSTS, gpu_states=gpus, prof=MI300X, **args))  # type: ignore[arg-type]

    # A uniform collective hang: no host deviates.
    assert devs(dict.fromkeys(HOSTS, spin)) == {}
    # Only the dead host stands out, in every family that sees it.
    dead = devs(
        {**dict.fromkeys(HOSTS, spin), "node004": idle},
        host_power={**power, "node004": 95.0},
        procs={**present, "node004": "gone"},
    )
    assert dead == {"GPU activity": ["node004"], "power band": ["node004"], "GPU processes": ["node004"]}
    # Network standouts and a down port are families of their own.
    net = devs(dict.fromkeys(HOSTS, spin), network_standouts=["node005"], port_down=["node002"])
    assert net == {"RDMA ports": ["node002"], "network rates": ["node005"]}
    # Without process data the family is left out instead of calling everyone "unknown".
    unknown = host_patterns(
        HOSTS, reporting, dict.fromkeys(HOSTS, spin), power, dict.fromkeys(HOSTS, "unknown"), [], [], MI300X
    )
    assert "GPU processes" not in unknown


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hang9")


@pytest.fixture(scope="module")
def hang_hb(root: Path) -> Built:
    return hang_hb_job(root)


# --- scenarios: dead node -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dead_process(root: Path) -> Built:
    """node004's training process dies after the last step: 0 % utilization, idle power straddling the
    MI300X idle bound (100 W +- 5), hw_gpu_user_processes 0; the host keeps reporting; five hosts busy-wait."""
    return build(JobSim(scenario("dead-process", extra={"gone_power_w": 100.0})), root / "dead-process")


@pytest.mark.prometheus
async def test_process_gone_while_peers_busy_wait_is_dead_node(
    dead_process: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    b = private_copy(dead_process, tmp_path)
    d = await diagnose(make_ctx(b, primary_class="hang"), settings, now=NOW)
    r = d.result
    assert r is not None and d.playbook == "hang"
    assert r.verdict == "dead-node", r.root_cause
    assert r.anomalous_hosts == ["node004"]
    assert "node004" in r.root_cause and "no node died" not in r.root_cause
    state = rows(r, "Per-host state")
    assert state["node004"][1].startswith("process gone (no GPU user process")
    assert state["node004"][6] == "0" and state["node001"][6] == "8"
    assert all(state[h][1] == "8 busy-wait" for h in SIX_NODES if h != "node004")
    # The sweep names the vanished process, not the peers' power drop (a symptom), as the root.
    assert d.anomaly is not None and d.anomaly.root is not None
    assert (d.anomaly.root.family, d.anomaly.root.host) == ("hw_gpu_user_processes", "node004")
    assert "Inspect node004" in r.next_steps[0]


@pytest.mark.prometheus
async def test_process_series_stop_without_idle_power_is_dead_node(
    root: Path, tmp_path: Path, settings: TsdbSettings
) -> None:
    """The process (and the Ray exporter with it) vanishes: its series stop; the freed GPUs idle at 130 W,
    above the idle band but far below busy-wait."""
    sc = scenario(
        "dead-process", job_id="4301", extra={"gone_power_w": 130.0, "gone_stops": ("ray_", "hw_gpu_user")}
    )
    b = build(JobSim(sc), root / "series-stop")
    d = await diagnose(make_ctx(b, primary_class="hang"), settings, now=NOW)
    r = d.result
    assert r is not None and r.verdict == "dead-node", r.root_cause
    assert r.anomalous_hosts == ["node004"]
    assert rows(r, "Per-host state")["node004"][1].startswith("process gone (GPU process series stopped")
    assert d.anomaly is not None and d.anomaly.root is not None
    assert (d.anomaly.root.family, d.anomaly.root.host, d.anomaly.root.kind) == (
        "hw_gpu_user_processes",
        "node004",
        "absent",
    )


@pytest.mark.prometheus
async def test_silent_host_while_peers_busy_wait_is_dead_node(
    root: Path, tmp_path: Path, settings: TsdbSettings
) -> None:
    """node003 goes down (every series stops) and the other five busy-wait for 40 minutes."""
    sc = scenario("dead-node", job_id="4302", nodes=SIX_NODES, hang_s=2400.0, extra={"rdma_background": True})
    b = build(JobSim(sc), root / "node-down")
    d = await diagnose(make_ctx(b, primary_class="hang"), settings, now=NOW)
    r = d.result
    assert r is not None and r.verdict == "dead-node"
    assert r.anomalous_hosts == ["node003"]
    assert r.root_cause.startswith("node003 stopped reporting")


# --- scenarios: hang then heartbeat, seen by the hang playbook ------------------------------------------


@pytest.mark.prometheus
async def test_hang_playbook_on_a_heartbeat_killed_hang(
    hang_hb: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    """Triage calls it a hang (stall >> timeout) with the heartbeat as the kill: the hang playbook runs."""
    b = private_copy(hang_hb, tmp_path)
    ctx = hb_ctx(b, primary_class="hang", last_step_time=b.sim.train_end)
    d = await diagnose(ctx, settings, now=NOW)
    r = d.result
    assert r is not None and d.playbook == "hang"
    assert r.verdict == "hang-then-heartbeat", r.root_cause
    assert "came 40 min after the last step" in r.root_cause and "kill mechanism" in r.root_cause
    assert r.anomalous_hosts == []
    assert (
        r.chain[0] == "collective deadlock (RCCL/NCCL)" and r.chain[-1] == "heartbeat timeout kills the job"
    )
    assert any("only delays the kill" in s for s in r.next_steps)
    assert "TSDB confirms: hang-then-heartbeat" in r.triage_correlation


@pytest.mark.prometheus
async def test_hang_then_heartbeat_from_the_real_triage(
    hang_hb: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    """The whole path: triage of the simulated log -> context -> default diagnose."""
    b = private_copy(hang_hb, tmp_path)
    doc = triage(b.files.log, now=NOW).to_dict()
    ctx = context_from_triage(doc)
    assert ctx.heartbeat is not None and ctx.primary_class in ("hang", "heartbeat-timeout")
    ctx = replace(ctx, job_dir=b.files.job_dir)
    d = await diagnose(ctx, settings, now=NOW)
    assert d.result is not None and d.result.verdict == "hang-then-heartbeat", d.result.root_cause
    assert to_json(d)["verdict"] == "hang-then-heartbeat"


# --- scenarios: baseline-relative triggers and the majority pattern --------------------------------------


@pytest.fixture(scope="module")
def background(root: Path) -> Built:
    return build(JobSim(scenario("rdma-background")), root / "rdma-background")


@pytest.mark.prometheus
async def test_background_rdma_counts_are_no_trigger(
    background: Built, tmp_path: Path, settings: TsdbSettings
) -> None:
    b = private_copy(background, tmp_path)
    d = await diagnose(make_ctx(b, primary_class="hang"), settings, now=NOW)
    r = d.result
    assert r is not None and r.verdict == "rccl-busy-wait-hang"
    assert r.anomalous_hosts == []  # a uniform collective hang: no host deviates
    assert "Trigger" not in r.root_cause
    net = next(f for f in r.findings if f.title == "RDMA/TCP counters around the hang")
    assert net.severity == "info" and "not a trigger" in net.summary and "6/6 hosts" in net.summary
    patterns = rows(r, "Majority pattern")
    assert all(row[2] == "none" for row in patterns.values())
    assert "### Anomalies detected\nNone" in to_markdown(d)


@pytest.mark.prometheus
async def test_rdma_burst_on_one_host_is_the_trigger(
    root: Path, tmp_path: Path, settings: TsdbSettings
) -> None:
    b = build(JobSim(scenario("rdma-trigger")), root / "rdma-trigger")
    d = await diagnose(make_ctx(b, primary_class="hang"), settings, now=NOW)
    r = d.result
    assert r is not None and r.verdict == "rccl-busy-wait-hang"
    assert r.anomalous_hosts == ["node005"]
    assert r.root_cause.startswith("Trigger: RDMA link errors on node005 before the hang")
    assert "node005 mlx5_0" in r.root_cause and "mlx5_1" not in r.root_cause
    assert rows(r, "Majority pattern")["network rates"][2] == "node005"
    # The earliest-anomaly sweep agrees on the host and dates the burst, not a background tick before it.
    assert d.anomaly is not None and d.anomaly.root is not None
    assert d.anomaly.root.host == "node005" and not d.anomaly.root.peers_alike
    lead = float(b.sim.sc.extra["rdma_burst_before_s"])
    assert abs(d.anomaly.root.onset - (b.sim.train_end - lead)) <= 30


@pytest.mark.prometheus
async def test_dead_host_alone_is_anomalous_despite_background(
    root: Path, tmp_path: Path, settings: TsdbSettings
) -> None:
    """Six hosts with background RDMA counts (the dead host's NIC keeps counting too); only the dead one
    stands out -- not the five whose background counts look like a trigger to a zero-tolerance rule."""
    sc = scenario("dead-process", job_id="4303", extra={"rdma_background": True, "gone_power_w": 100.0})
    b = build(JobSim(sc), root / "dead-bg")
    r = (await diagnose(make_ctx(b, primary_class="hang"), settings, now=NOW)).result
    assert r is not None and r.verdict == "dead-node"
    assert r.anomalous_hosts == ["node004"]
    off = {fam: row[2] for fam, row in rows(r, "Majority pattern").items()}
    assert off["GPU processes"] == "node004" and off["GPU activity"] == "node004"
    assert off["network rates"] == "none" and off["reporting"] == "none"
