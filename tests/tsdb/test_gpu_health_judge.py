"""The GPU-health playbook's pure judge (`judge_gpu_health`) on in-memory per-GPU values: no
Prometheus. Two hosts of eight MI300X GPUs; each test sets a few values and checks the verdict and
the anomalous GPUs at the thresholds of rule PB-GH-1.
"""

from __future__ import annotations

from jobdiagd.tsdb.playbooks.base import Verdict
from jobdiagd.tsdb.playbooks.errors import GpuErrors
from jobdiagd.tsdb.playbooks.gpu_health import GpuHealthSeries, judge_gpu_health
from jobdiagd.tsdb.settings import DEFAULT_PROFILES

MI300X = DEFAULT_PROFILES["MI300X"]
GPUS = [(h, str(g)) for h in ("node001", "node002") for g in range(8)]


def series(errors: GpuErrors | None = None, **arms: dict[tuple[str, str], float]) -> GpuHealthSeries:
    """Every GPU at 70 C max, 700 W and 2100 MHz, no error counter, unless `arms` says otherwise."""
    gauges = {
        "temp_avg": dict.fromkeys(GPUS, 65.0),
        "temp_max": dict.fromkeys(GPUS, 70.0),
        "power_avg": dict.fromkeys(GPUS, 700.0),
        "sclk_avg": dict.fromkeys(GPUS, 2100.0),
    }
    for arm, values in arms.items():
        gauges[arm] = {**gauges.get(arm, {}), **values}
    return GpuHealthSeries(start=0.0, end=3600.0, gauges=gauges, errors=errors or GpuErrors())


def test_normal_gpus_are_healthy() -> None:
    j = judge_gpu_health(series(), MI300X)
    assert j.verdict == Verdict.HEALTHY and j.anomalous_gpus == []


def test_uncorrectable_or_fatal_is_a_hardware_fault() -> None:
    j = judge_gpu_health(series(GpuErrors(ue={("node002", "4"): 1.0})), MI300X)
    assert (j.verdict, j.anomalous_gpus, j.anomalous_hosts) == (
        Verdict.HARDWARE_FAULT,
        [("node002", "4")],
        ["node002"],
    )
    j = judge_gpu_health(series(GpuErrors(pcie={"fatal": {("node001", "0"): 1.0}})), MI300X)
    assert j.verdict == Verdict.HARDWARE_FAULT and j.fatal == [("node001", "0")]


def test_correctable_only_is_degrading_hardware() -> None:
    """Rule PB-GH-1: any non-zero correctable counter (RAS CE, PCIe correctable/non-fatal)."""
    j = judge_gpu_health(series(GpuErrors(ce={("node001", "3"): 1.0, ("node001", "4"): 0.0})), MI300X)
    assert (j.verdict, j.ce, j.anomalous_gpus) == (
        Verdict.HARDWARE_FAULT,
        [("node001", "3")],
        [("node001", "3")],
    )
    j = judge_gpu_health(series(GpuErrors(pcie={"nonfatal": {("node002", "1"): 2.0}})), MI300X)
    assert j.verdict == Verdict.HARDWARE_FAULT and j.pcie_soft == [("node002", "1")]


def test_hot_gpu_needs_reduced_clock_or_power_for_thermal_throttle() -> None:
    """Rule PB-GH-1: over the limit with the clock < 90 % (or power < 85 %) of the cluster median."""
    hot = {("node002", "7"): MI300X.temp_limit_c}
    j = judge_gpu_health(series(temp_max=hot, sclk_avg={("node002", "7"): 1889.0}), MI300X)
    assert (
        j.verdict == Verdict.THERMAL_THROTTLE
        and j.hot == [("node002", "7")]
        and j.low_clock == [("node002", "7")]
    )
    # 90 % of the median clock is not reduced; hot alone is an outlier, not a throttle.
    j = judge_gpu_health(series(temp_max=hot, sclk_avg={("node002", "7"): 1890.0}), MI300X)
    assert j.verdict == Verdict.HEALTHY and j.anomalous_gpus == [("node002", "7")] and j.low_clock == []
    j = judge_gpu_health(series(temp_max=hot, power_avg={("node002", "7"): 594.0}), MI300X)
    assert j.verdict == Verdict.THERMAL_THROTTLE and j.low_power == [("node002", "7")]
    cool = judge_gpu_health(series(temp_max={("node002", "7"): MI300X.temp_limit_c - 1}), MI300X)
    assert cool.hot == []
