"""`compare`: config diff, step alignment, steady-state sweep, the uniform hw_procs_running delta of a restore leak."""

from __future__ import annotations

from pathlib import Path

from jobdiagd.tsdb.compare import compare, config_diff, to_json, to_markdown
from jobdiagd.tsdb.settings import TsdbSettings
from tests.helpers.tsdb import Fixtures, make_ctx

NOW = 1_800_000_000.0


async def test_restore_leak_detected(fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings) -> None:
    a = fixtures.copy("restore-fresh", tmp_path / "a")
    b = fixtures.copy("restore-leak", tmp_path / "b")
    c = await compare(make_ctx(a), make_ctx(b), settings, now=NOW)
    assert c.overlap == (205, 399)  # later job's first step (200) + 5 warmup .. earlier job's last step
    assert ("steps", "400", "600") in c.config_diff
    assert c.verdict == "restore-resource-leak"
    assert c.procs["uniform"] is True and 4.5 <= c.procs["delta_median"] <= 5.5
    assert set(c.procs["per_host_delta"]) == {"node001", "node002", "node003", "node004"}
    assert c.tgs["loss_identical_steps"] == "193/193"  # 195 overlapping steps minus checkpoint steps 300, 301
    assert -1.5 < c.tgs["delta_pct"] < -0.3
    rows = {r[0]: r for r in c.rows}
    assert rows["hw_procs_running"][4].startswith("CPU contention")
    assert rows["hw_gpu_power_watts"][4] == "same"
    doc = to_json(c)
    assert doc["verdict"] == "restore-resource-leak" and doc["start"] == {
        "a": "fresh",
        "b": "restored from step 200",
    }
    assert c.waves == (2, 3) and doc["log_evidence"]["nccl_init_waves"] == {"a": 2, "b": 3}
    md = to_markdown(c)
    assert "extra communicator wave" in md
    assert "## Multi-Job Comparison: 5001 vs 5002" in md and "| steps | 400 | 600 |" in md
    assert "### Overlapping step range: 205 to 399" in md


async def test_same_job_twice_is_not_a_leak(
    fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings
) -> None:
    a = fixtures.copy("restore-fresh", tmp_path / "a")
    b = fixtures.copy("restore-fresh", tmp_path / "b")
    c = await compare(make_ctx(a), make_ctx(b), settings, now=NOW)
    assert c.verdict == "healthy"
    assert all(r[4] == "same" for r in c.rows)
    assert abs(c.tgs["delta_pct"]) < 0.01


def test_config_diff_includes_nnodes(fixtures: Fixtures) -> None:
    a = make_ctx(fixtures.get("healthy"), config={"remat_policy": "full", "steps": "10"})
    b = make_ctx(fixtures.get("healthy"), config={"remat_policy": "minimal", "steps": "10"}, nnodes=8)
    assert config_diff(a, b) == [("remat_policy", "full", "minimal"), ("NNODES", "4", "8")]


def test_nccl_init_waves() -> None:
    from jobdiagd.tsdb.logevidence import nccl_init_waves

    line = (
        "[2026-06-01 00:{m:02d}:{s:02d}] node001:1:2 [0] init.cc:2095 NCCL WARN MSCCL++: Feature not enabled."
    )
    two = [
        line.format(m=0, s=30),
        line.format(m=0, s=31),
        "I0601 00:01:00.0 1 x.py:1] compiling",
        line.format(m=3, s=40),
    ]
    assert nccl_init_waves(two) == 2
    assert nccl_init_waves([*two, line.format(m=9, s=0)]) == 3
    untimed = [
        "node001:1:2 [0] init.cc:2095 NCCL WARN MSCCL++",
        "other",
        "node001:1:2 [1] init.cc:2095 NCCL WARN MSCCL++",
    ]
    assert nccl_init_waves(untimed) == 2
    assert nccl_init_waves(["nothing here"]) == 0


async def test_compare_with_a_ray0_job_uses_log_data(
    fixtures: Fixtures, tmp_path: Path, settings: TsdbSettings
) -> None:
    a = fixtures.copy("restore-fresh", tmp_path / "a")
    b = fixtures.copy("restore-fresh", tmp_path / "b")
    c = await compare(make_ctx(a), make_ctx(b, ray=False), settings, now=NOW)
    assert "no TSDB" in c.b.note and c.a.note.startswith("local-readonly")
    assert c.overlap == (5, 399) and abs(c.tgs["delta_pct"]) < 0.01  # TGS from the log steps of job B
    assert all(r[2] == "n/a" for r in c.rows)  # no system metrics for B
    assert c.verdict == "healthy"
