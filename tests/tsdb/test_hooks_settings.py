"""The daemon's TSDB calls (power verdict, class -> playbook), settings loading, anomaly detection on plain data."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobdiagd.model.kinds import GpuHangState
from jobdiagd.tsdb.anomaly import detect
from jobdiagd.tsdb.gpu_hang import GpuVerdict
from jobdiagd.tsdb.hang_verdict import hang_power_verdict, should_page
from jobdiagd.tsdb.job_end import playbook_for_class
from jobdiagd.tsdb.playbooks.base import gpu_state
from jobdiagd.tsdb.settings import (
    DEFAULT_PROFILES,
    Thresholds,
    TsdbSettings,
    load_settings,
    settings_from_mapping,
)
from tests.helpers.tsdb import Fixtures, make_ctx


@pytest.mark.parametrize(
    ("cls", "name"),
    [
        ("hang", "hang"),
        ("heartbeat-timeout", "heartbeat"),
        ("oom-host", "oom"),
        ("node-fail", "hardware"),
        ("signal-kill", "hardware"),
        ("unknown-death", "hardware"),
        ("tgs-degradation", "training-stability"),
        ("nccl-timeout", "network-health"),
        (None, "training-stability"),
    ],
)
async def test_playbook_for_class(cls: str | None, name: str) -> None:
    assert await playbook_for_class(cls) == name


async def test_power_verdict_on_finished_hang(fixtures: Fixtures, tmp_path: Path) -> None:
    """The hang page's verdict is the GPU-hang judge over the newest samples (here: the end of a
    finished job's data), the same judge the early page asks."""
    b = fixtures.copy("rccl-hang", tmp_path)
    v = await hang_power_verdict(make_ctx(b), time.time(), settings=TsdbSettings(work_dir=str(tmp_path)))
    assert (
        v.state is GpuHangState.BUSY_WAIT
        and v.confirmed
        and v.mean_power_w is not None
        and 280 < v.mean_power_w < 320
    )
    assert v.at is not None and b.sim.end - 10 <= v.at <= b.sim.end and v.gpu_model == "MI300X"  # the data's end
    # After a healthy run the GPUs sit idle with their (simulated) processes alive: no hang, denied.
    # (The 5-minute average this verdict used to read said "training" here, from the run's last minutes.)
    h = fixtures.copy("healthy", tmp_path / "h")
    v2 = await hang_power_verdict(make_ctx(h), time.time(), settings=TsdbSettings(work_dir=str(tmp_path)))
    assert v2.state is GpuHangState.NOT_A_HANG and v2.denies and not v2.confirmed
    nt = await hang_power_verdict(make_ctx(h, ray=False), time.time())
    assert nt.state is GpuHangState.NO_DATA and "RAY=0" in nt.summary


async def test_power_verdict_names_a_dead_node_and_a_silent_one(fixtures: Fixtures, tmp_path: Path) -> None:
    """The page's verdict follows the early page's rule: a host idle with no GPU process under
    busy-waiting peers is a dead node; a host that stopped reporting is no data, never a confirmation."""
    gone = fixtures.copy("dead-process", tmp_path / "p")
    v = await hang_power_verdict(make_ctx(gone), time.time(), settings=TsdbSettings(work_dir=str(tmp_path)))
    assert v.state is GpuHangState.DEAD_NODE and v.suspects == ("node004",)
    silent = fixtures.copy("dead-node", tmp_path / "s")
    v2 = await hang_power_verdict(
        make_ctx(silent), time.time(), settings=TsdbSettings(work_dir=str(tmp_path))
    )
    assert v2.state is GpuHangState.NO_DATA and "node003" in v2.summary and not v2.confirmed


@pytest.mark.parametrize(
    ("state", "pages_when_confirming"),
    [
        (GpuHangState.BUSY_WAIT, True),
        (GpuHangState.DEAD_NODE, True),
        (GpuHangState.TRAINING, False),  # the GPUs work: the log lags
        (GpuHangState.NOT_A_HANG, False),  # a save, a compilation, an eval
        (GpuHangState.MIXED, True),  # cannot tell: the step budget decides
        (GpuHangState.NO_PROCESS, True),  # the processes are gone, the allocation may be held
        (GpuHangState.NO_DATA, True),  # lack of data is not evidence of health
    ],
)
def test_should_page_switch(state: GpuHangState, pages_when_confirming: bool) -> None:
    v = GpuVerdict(state, "x")
    assert should_page(v, TsdbSettings())
    assert should_page(v, TsdbSettings(confirm_hang_with_power=True)) is pages_when_confirming


def test_gpu_state_per_model() -> None:
    th = Thresholds()
    mi300, mi355 = DEFAULT_PROFILES["MI300X"], DEFAULT_PROFILES["MI355X"]
    assert gpu_state(100, 300, mi300, th) == "busy-wait"
    assert gpu_state(100, 680, mi300, th) == "training"
    assert gpu_state(0, 60, mi300, th) == "idle"
    assert gpu_state(100, 700, mi355, th) == "busy"  # below MI355X training band, above busy-wait
    assert gpu_state(100, 900, mi355, th) == "training"
    assert gpu_state(None, None, mi300, th) == "absent"


def test_settings_from_toml(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text(
        '[tsdb]\nprometheus_binary = "/opt/prom"\ngpu_model = "H100"\n[tsdb.thresholds]\nwarmup_steps = 8\n[tsdb.gpu_profiles.H100]\ntrain_power_min_w = 500\n'
    )
    s = load_settings(f)
    assert s.prometheus_binary == "/opt/prom" and s.thresholds.warmup_steps == 8
    assert s.profile(None).name == "H100" and s.profile(None).train_power_min_w == 500
    assert s.profile("MI355X").train_power_min_w == 800
    with pytest.raises(ValueError, match=r"\[tsdb.thresholds\] warmup: unknown key"):
        settings_from_mapping({"thresholds": {"warmup": 1}})
    with pytest.raises(ValueError, match=r"\[tsdb\] nope: unknown key"):
        settings_from_mapping({"nope": 1})


def test_detect_on_plain_series() -> None:
    flat = [(float(t), 10.0) for t in range(0, 100, 10)]
    jump = flat + [(100.0, 30.0), (110.0, 31.0), (120.0, 30.0)]
    assert detect(jump, 90.0, k=6, counter=False) is not None
    assert detect(jump, 90.0, k=6, counter=False)[0] == 100.0  # type: ignore[index]
    blip = flat + [(100.0, 30.0), (110.0, 10.0), (120.0, 10.0)]
    assert detect(blip, 90.0, k=6, counter=False) is None  # one-sample blip is not persistent
    ue = [(float(t), 0.0) for t in range(0, 100, 10)] + [(100.0, 2.0), (110.0, 2.0)]
    assert detect(ue, 90.0, k=6, counter=True, rare=True) is not None  # a single UE increment counts
    assert detect(ue, 90.0, k=6, counter=True, rare=False) is None
    # Checkpoint windows are masked.
    assert detect(jump, 90.0, k=6, counter=False, ignore=lambda t: t >= 100.0) is None


def test_host_of_label_variants() -> None:
    from jobdiagd.tsdb.playbooks.base import host_of

    assert host_of({"host": "node001", "ip": "10.0.0.1"}) == "node001"
    assert host_of({"ip": "10.0.0.2", "instance": "node002:55080"}) == "node002"
    assert host_of({"ip": "10.0.0.3", "instance": "10.0.0.3:55080"}) == "10.0.0.3"


async def test_power_verdict_fetches_the_alerts_power_strip_in_the_same_session(
    fixtures: Fixtures, tmp_path: Path
) -> None:
    b = fixtures.copy("rccl-hang", tmp_path)
    ctx = make_ctx(b)
    v = await hang_power_verdict(
        ctx, time.time(), settings=TsdbSettings(work_dir=str(tmp_path)), strip_s=3600
    )
    assert v.state is GpuHangState.BUSY_WAIT and v.strip is not None and v.gpu_model
    assert v.at is not None and v.strip.end == v.at and v.strip.start == v.at - 3600
    hosts = {s.host for s in v.strip.power}
    assert hosts and all(len(s.mean) == len(s.times) for s in v.strip.power)
    busy = [x for s in v.strip.power for x in s.mean[-5:] if x == x]  # NaN: no sample
    assert busy and 250 < sum(busy) / len(busy) < 350  # the busy-wait band the verdict saw
    plain = await hang_power_verdict(ctx, time.time(), settings=TsdbSettings(work_dir=str(tmp_path)))
    assert plain.strip is None  # only when asked for
