"""Each playbook end to end against a promtool-built TSDB served by a real local Prometheus."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd.tsdb.context import HeartbeatInfo
from jobdiagd.tsdb.discovery import WrongDatabase
from jobdiagd.tsdb.engine import diagnose
from jobdiagd.tsdb.playbooks.base import VERDICTS
from jobdiagd.tsdb.settings import TsdbSettings
from tests.helpers.tsdb import Fixtures, make_ctx

NOW = 1_800_000_000.0


def rows(result: object, title_part: str) -> list[tuple[str, ...]]:
    for f in result.findings:  # type: ignore[attr-defined]
        for t in f.evidence:
            if title_part in t.title:
                return list(t.rows)
    raise AssertionError(f"no evidence table containing {title_part!r}")


async def test_rccl_busy_wait_hang(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("rccl-hang", tmp_path)
    d = await diagnose(make_ctx(b), settings, now=NOW)
    assert d.playbook == "hang" and d.result is not None
    assert d.result.verdict == "rccl-busy-wait-hang"
    assert d.result.anomalous_hosts == []
    host_rows = rows(d.result, "Per-host state")
    assert len(host_rows) == 4
    for r in host_rows:
        assert r[1] == "8 busy-wait"
        assert 280 <= float(r[3]) <= 320  # mean power during the hang, from the query
        assert float(r[4]) > 600  # training power before the hang
    # node002 carries a 12M lifetime TCP retransmit total: reported, not excluded.
    life = [f for f in d.result.findings if "lifetime" in f.title]
    assert life and life[0].hosts == ("node002",) and "do not exclude" in life[0].summary
    assert "node002" not in d.result.anomalous_hosts
    assert d.discovery is not None and d.discovery.crosscheck.status == "verified"


async def test_dead_node(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("dead-node", tmp_path)
    d = await diagnose(make_ctx(b), settings, now=NOW)
    assert d.result is not None
    assert d.result.verdict == "dead-node"
    assert d.result.anomalous_hosts == ["node003"]
    r = {row[0]: row for row in rows(d.result, "Per-host state")}
    assert r["node003"][1].startswith("stopped reporting")
    assert r["node001"][1] == "8 busy-wait"
    assert d.anomaly is not None and d.anomaly.root is not None
    assert d.anomaly.root.host == "node003" and d.anomaly.root.kind == "absent"


async def test_init_phase_partial_pattern(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("init-hang", tmp_path)
    d = await diagnose(make_ctx(b), settings, now=NOW)
    assert d.result is not None
    assert d.result.verdict == "rccl-busy-wait-hang"
    # node002 and node004 spin GPUs {1,7}; the majority spins {4,7}.
    assert d.result.anomalous_hosts == ["node002", "node004"]
    assert "{4, 7}" in d.result.root_cause
    gpu_rows = rows(d.result, "Per-GPU")
    busy = {(r[0], r[1]) for r in gpu_rows if r[5] == "busy-wait"}
    assert ("node001", "4") in busy and ("node002", "1") in busy and ("node001", "1") not in busy


async def test_heartbeat_false_positive(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("healthy", tmp_path)
    crash = b.sim.sc.start + 1500
    ctx = make_ctx(b, primary_class="heartbeat-timeout", heartbeat=HeartbeatInfo(crash, 100.0, (2,), ()))
    d = await diagnose(ctx, settings, now=NOW)
    assert d.playbook == "heartbeat" and d.result is not None
    assert d.result.verdict == "heartbeat-false-positive"
    r = {row[0]: row for row in rows(d.result, "heartbeat-stop")}
    assert r["node003"][1] == "yes" and r["node003"][2] == "8 training"
    assert d.result.window[1] == pytest.approx(crash - 100.0)


async def test_hang_then_heartbeat(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("rccl-hang", tmp_path)
    crash = b.sim.train_end + 1100
    ctx = make_ctx(b, primary_class="heartbeat-timeout", heartbeat=HeartbeatInfo(crash, 100.0, (1,), ()))
    d = await diagnose(ctx, settings, now=NOW)
    assert d.result is not None and d.result.verdict == "hang-then-heartbeat"
    assert "stalled" in d.result.root_cause


async def test_host_oom_ramp(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("host-oom-ramp", tmp_path)
    d = await diagnose(make_ctx(b), settings, now=NOW)
    assert d.playbook == "oom" and d.result is not None
    assert d.result.verdict == "host-oom-ramp"
    assert d.result.anomalous_hosts == ["node003"]
    r = {row[0]: row for row in rows(d.result, "memory trajectory")}
    assert r["node003"][4] == "ramp" and r["node003"][6] == "1"
    assert r["node004"][4] == "flat"
    # Replica-0 nodes (node001/2 with dcn_data_parallelism=2) show checkpoint spikes, not a ramp.
    assert r["node001"][4] in ("spike", "periodic")
    assert d.anomaly is not None and d.anomaly.root is not None
    assert d.anomaly.root.family == "ray_node_mem_used" and d.anomaly.root.host == "node003"


async def test_hardware_fault(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("hardware-fault", tmp_path)
    d = await diagnose(make_ctx(b), settings, now=NOW)
    assert d.playbook == "hardware" and d.result is not None
    assert d.result.verdict == "hardware-fault"
    assert d.result.anomalous_hosts == ["node002"]
    bad = [r for r in rows(d.result, "GPU error counters") if r[2] != "0"]
    assert [(r[0], r[1], r[2]) for r in bad] == [("node002", "3", "2")]
    assert d.anomaly is not None and d.anomaly.root is not None
    assert d.anomaly.root.family == "hw_gpu_ras_umc_ue_total"
    chain = d.anomaly.chain()
    assert chain[0].startswith("root cause: hw_gpu_ras_umc_ue_total on node002")
    assert any("hw_dmesg_gpu_errors_total" in c for c in chain[1:])


async def test_gpu_health_healthy(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("healthy", tmp_path)
    d = await diagnose(make_ctx(b), settings, now=NOW, playbook="gpu-health")
    assert d.result is not None and d.result.verdict == "healthy"
    summary = d.result.findings[0].summary
    assert "GPU Health Summary (4 nodes, 32 GPUs" in summary
    assert "0 correctable, 0 uncorrectable" in summary
    assert "Anomalous GPUs: none" in summary


async def test_gpu_health_flags_ue(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("hardware-fault", tmp_path)
    d = await diagnose(make_ctx(b), settings, now=NOW, playbook="gpu-health")
    assert d.result is not None and d.result.verdict == "hardware-fault"
    assert "node002:3" in d.result.findings[0].summary


async def test_network_rdma_degradation(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("rdma-degraded", tmp_path)
    d = await diagnose(make_ctx(b), settings, now=NOW, playbook="network-health")
    assert d.result is not None and d.result.verdict == "rdma-degradation"
    assert d.result.anomalous_hosts == ["node003"]
    bad = [r for r in rows(d.result, "RDMA counters per device") if r[9]]
    assert [(r[0], r[1]) for r in bad] == [("node003", "mlx5_0:1")]
    assert 45 <= float(bad[0][3]) <= 55  # retransmits/s from increase() over the window


async def test_network_healthy(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("healthy", tmp_path)
    d = await diagnose(make_ctx(b), settings, now=NOW, playbook="network-health")
    assert d.result is not None and d.result.verdict == "healthy" and d.result.anomalous_hosts == []


async def test_training_stability(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("healthy", tmp_path)
    d = await diagnose(make_ctx(b), settings, now=NOW)
    assert d.playbook == "training-stability" and d.result is not None
    assert d.result.verdict == "healthy"
    perf = {r[0]: r for r in rows(d.result, "Training and throughput")}
    # steps=300, period 100: steps 100 and 200 spike and are recognised as checkpoint saves.
    assert perf["checkpoint-step spikes"][1] == "2"
    assert perf["non-checkpoint spikes"][1] == "0"
    rd = await diagnose(make_ctx(fixtures.copy("rdma-degraded", tmp_path / "r")), settings, now=NOW)
    assert (
        rd.result is not None
        and rd.result.verdict == "rdma-degradation"
        and rd.result.anomalous_hosts == ["node003"]
    )


async def test_wrong_database_refused(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("healthy", tmp_path)
    other = fixtures.get("rccl-hang")  # same step numbers, different job: losses must not match
    ctx = make_ctx(b, steps=tuple(make_ctx(other).steps[:150]))
    shifted = tuple(type(s)(s.step, s.seconds, (s.loss or 0) + 0.5, s.tgs, s.time) for s in ctx.steps)
    with pytest.raises(WrongDatabase, match="loss differs"):
        await diagnose(make_ctx(b, steps=shifted), settings, now=NOW)


async def test_every_verdict_is_known(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("healthy", tmp_path)
    for name in ("hang", "oom", "hardware"):
        d = await diagnose(make_ctx(b), settings, now=NOW, playbook=name, with_anomaly=False)
        assert d.result is not None and d.result.verdict in VERDICTS
        assert d.queries <= 12


async def test_io_contention(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("io-contention", tmp_path)
    d = await diagnose(make_ctx(b, primary_class="tgs-degradation"), settings, now=NOW)
    assert d.playbook == "training-stability" and d.result is not None
    assert d.result.verdict == "io-contention"
    assert "throughput regression" in d.result.findings[0].summary
    io = next(r for r in rows(d.result, "Contention checklist") if r[0].startswith("Storage: IO pressure"))
    assert float(io[1].rstrip("%")) < 5 and float(io[2].rstrip("%")) > 30


async def test_thermal_throttle(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("thermal-throttle", tmp_path)
    d = await diagnose(make_ctx(b, primary_class="tgs-degradation"), settings, now=NOW)
    assert d.result is not None and d.result.verdict == "thermal-throttle"
    assert d.result.anomalous_hosts == ["node002"]
    assert "2100->1600 MHz" in d.result.root_cause
    temp = next(r for r in rows(d.result, "Contention checklist") if r[0].startswith("GPU thermal"))
    assert temp[3].endswith("(node002)") and float(temp[3].split("C")[0]) >= 90
    assert d.anomaly is not None and d.anomaly.root is not None
    assert (d.anomaly.root.family, d.anomaly.root.host, d.anomaly.root.kind) == (
        "hw_gpu_temperature_celsius",
        "node002",
        "up",
    )


async def test_network_partition(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    b = fixtures.copy("network-partition", tmp_path)
    d = await diagnose(make_ctx(b), settings, now=NOW)
    assert d.result is not None and d.result.verdict == "network-partition"
    assert d.result.anomalous_hosts == ["node004"]
    r = {row[0]: row for row in rows(d.result, "Per-host state")}
    assert r["node004"][1].startswith("scrape gaps")
    assert d.anomaly is not None and d.anomaly.root is not None and d.anomaly.root.host == "node004"


async def test_cancel_without_stall_is_not_diagnosed_as_hang(
    fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings
) -> None:
    b = fixtures.copy("healthy", tmp_path)
    d = await diagnose(make_ctx(b, primary_class="cancelled"), settings, now=NOW)
    assert d.playbook == "training-stability" and any("without a stall" in n for n in d.notes)
    assert d.result is not None and d.result.verdict == "healthy"
    h = fixtures.copy("rccl-hang", tmp_path / "h")
    d2 = await diagnose(make_ctx(h, primary_class="cancelled"), settings, now=NOW)
    assert d2.playbook == "hang" and d2.result is not None and d2.result.verdict == "rccl-busy-wait-hang"
