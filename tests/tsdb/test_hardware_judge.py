"""The hardware playbook's pure judge (`judge_hardware`) on in-memory counters: no Prometheus.

Each test sets the error counters of a few GPUs and checks the verdict, the anomalous hosts and
the evidence per rule (PB-HW-1..5), at the boundary of each threshold.
"""

from __future__ import annotations

from jobdiagd.tsdb.playbooks.base import Verdict
from jobdiagd.tsdb.playbooks.errors import GpuErrors
from jobdiagd.tsdb.playbooks.hardware import HardwareSeries, PortState, judge_hardware
from jobdiagd.tsdb.settings import DEFAULT_PROFILES, Thresholds

TH = Thresholds()
MI300X = DEFAULT_PROFILES["MI300X"]
HOSTS = ("node001", "node002", "node003")
CRASH = 3000.0
GPUS = [(h, str(g)) for h in HOSTS for g in range(8)]


def series(
    *,
    ue: dict[tuple[str, str], float] | None = None,
    ce: dict[tuple[str, str], float] | None = None,
    pcie: dict[str, dict[tuple[str, str], float]] | None = None,
    temp: dict[tuple[str, str], float] | None = None,
    last_seen: dict[str, float] | None = None,
    **kw: object,
) -> HardwareSeries:
    """A clean job (every counter zero, 60 C, every host reporting to the end) plus the given values."""
    err = GpuErrors(
        ue={k: 0.0 for k in GPUS} | (ue or {}),
        ce={k: 0.0 for k in GPUS} | (ce or {}),
        pcie={
            kind: {k: 0.0 for k in GPUS} | (pcie or {}).get(kind, {})
            for kind in ("correctable", "nonfatal", "fatal")
        },
    )
    return HardwareSeries(
        lo=0.0,
        hi=3600.0,
        crash=CRASH,
        errors=err,
        last_seen={h: 3600.0 for h in HOSTS} | (last_seen or {}),
        temp_pre={k: 60.0 for k in GPUS} | (temp or {}),
        **kw,  # type: ignore[arg-type]
    )


def judge(data: HardwareSeries) -> tuple[Verdict, list[str]]:
    j = judge_hardware(data, HOSTS, MI300X, TH)
    return j.verdict, j.anomalous


def test_clean_counters_are_healthy() -> None:
    j = judge_hardware(series(), HOSTS, MI300X, TH)
    assert j.verdict == Verdict.HEALTHY and j.anomalous == [] and j.early_stop == []


def test_any_uncorrectable_pcie_fatal_or_dmesg_error_is_a_hardware_fault() -> None:
    """Rule PB-HW-1: one uncorrectable error, one PCIe fatal error or one dmesg GPU error."""
    assert judge(series(ue={("node002", "3"): 1.0})) == (Verdict.HARDWARE_FAULT, ["node002"])
    assert judge(series(pcie={"fatal": {("node003", "0"): 1.0}})) == (Verdict.HARDWARE_FAULT, ["node003"])
    assert judge(series(dmesg={"node001": 1.0, "node002": 0.0})) == (Verdict.HARDWARE_FAULT, ["node001"])
    j = judge_hardware(series(ue={("node002", "3"): 1.0}), HOSTS, MI300X, TH)
    assert j.ue_gpus == [("node002", "3")] and not j.degrading


def test_rdma_port_down_is_a_hardware_fault() -> None:
    """Rule PB-HW-2: a port state below 1; a port that stayed up is no evidence."""
    ports = [PortState("node001", "mlx5_0", "1", 1.0), PortState("node003", "mlx5_1", "1", 0.0)]
    j = judge_hardware(series(ports=ports), HOSTS, MI300X, TH)
    assert j.verdict == Verdict.HARDWARE_FAULT and j.down == [("node003", "mlx5_1", "1")]
    assert j.anomalous == ["node003"]


def test_a_single_correctable_error_is_degrading_hardware() -> None:
    """Rule PB-HW-3: healthy GPUs show zero, so one CE makes the host anomalous (degrading);
    ce_warn_count (100) only grades it "high"."""
    j = judge_hardware(series(ce={("node002", "5"): 1.0}), HOSTS, MI300X, TH)
    assert (j.verdict, j.anomalous, j.degrading) == (Verdict.HARDWARE_FAULT, ["node002"], True)
    assert j.ce_any == [("node002", "5")] and j.ce_high == []
    below = judge_hardware(series(ce={("node002", "5"): TH.ce_warn_count - 1}), HOSTS, MI300X, TH)
    assert below.ce_high == []
    high = judge_hardware(series(ce={("node002", "5"): TH.ce_warn_count}), HOSTS, MI300X, TH)
    assert high.ce_high == [("node002", "5")]


def test_correctable_errors_beside_a_fatal_one_are_not_degrading() -> None:
    j = judge_hardware(
        series(ue={("node001", "0"): 2.0}, pcie={"correctable": {("node002", "1"): 3.0}}), HOSTS, MI300X, TH
    )
    assert j.verdict == Verdict.HARDWARE_FAULT and not j.degrading
    assert j.anomalous == ["node001", "node002"] and j.pcie_soft == [("node002", "1")]


def test_temperature_at_the_limit_is_thermal_throttle_when_nothing_else() -> None:
    """Rule PB-HW-4: at or above the limit (90 C on MI300X) before the crash; a fault outranks it."""
    at_limit = {("node003", "7"): MI300X.temp_limit_c}
    assert judge(series(temp=at_limit)) == (Verdict.THERMAL_THROTTLE, ["node003"])
    assert judge(series(temp={("node003", "7"): MI300X.temp_limit_c - 0.5}))[0] == Verdict.HEALTHY
    assert judge(series(temp=at_limit, ue={("node001", "0"): 1.0})) == (Verdict.HARDWARE_FAULT, ["node001"])


def test_host_silent_before_the_crash_is_dead_node() -> None:
    """Rule PB-HW-5: newest scrape more than 60 s before the crash, no counter moving."""
    j = judge_hardware(series(last_seen={"node002": CRASH - 61}), HOSTS, MI300X, TH)
    assert (j.verdict, j.anomalous, j.early_stop) == (Verdict.DEAD_NODE, ["node002"], ["node002"])
    at = judge_hardware(series(last_seen={"node002": CRASH - 60}), HOSTS, MI300X, TH)
    assert at.verdict == Verdict.HEALTHY and at.early_stop == []
    # A host missing from the liveness query entirely stopped early too.
    gone = series(last_seen={"node001": 3600.0})
    data = HardwareSeries(
        lo=gone.lo, hi=gone.hi, crash=CRASH, errors=gone.errors, last_seen={"node001": 3600.0}
    )
    assert judge(data) == (Verdict.DEAD_NODE, ["node002", "node003"])
