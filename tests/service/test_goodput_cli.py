"""`jobdiagd goodput` and `jobdiagd calibrate` on simulated archives, without Slurm (times from the logs)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobdiagd.cli import main
from jobdiagd.goodput.ledger import BUCKETS
from jobdiagd_sim.archive import build_archive
from jobdiagd_sim.job import SIM_EPOCH, JobSim, JobSpec

NOW = "2026-09-01T00:00:00"


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[tuple[str, int], ...]]]:
    root = tmp_path_factory.mktemp("archive") / "outputs"
    chains = build_archive(root, chains=10, seed=1, small=True, days=10)
    runs = [r for c in chains for r in c.runs]
    # The archive must exercise what the ledger links: requeues, restores, retries, hangs.
    assert {"requeue", "restore", "retry"} <= {r.link for r in runs}
    assert any(r.outcome == "hang" for r in runs)
    return root, [tuple((r.job_id, r.run_index) for r in c.runs) for c in chains]


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main(["goodput", *argv, "--json", "--no-slurm", "--now", NOW]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_the_ledger_links_every_chain_and_adds_up_per_run_and_per_chain(
    archive: tuple[Path, list[tuple[tuple[str, int], ...]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, truth = archive
    png = tmp_path / "g.png"
    doc = _json(capsys, str(root), "--png", str(png), "--cache", str(tmp_path / "cache"))
    got = {tuple((r["job_id"], int(r["run"].rsplit("#", 1)[1])) for r in ch["runs"]) for ch in doc["chains"]}
    assert got == set(truth)
    for ch in doc["chains"]:
        chain_wall = 0.0
        for r in ch["runs"]:
            led = r["ledger"]
            wall = r["end"] - (r["submit"] if r["submit"] is not None else r["start"])
            assert set(led["seconds"]) == set(BUCKETS)
            assert sum(led["seconds"].values()) == pytest.approx(wall, abs=0.01)
            assert min(led["seconds"].values()) >= 0
            chain_wall += wall
        assert ch["ledger"]["wall_s"] == pytest.approx(chain_wall, abs=0.01)
        assert sum(ch["ledger"]["seconds"].values()) == pytest.approx(chain_wall, abs=0.05)
    hangs = [r for ch in doc["chains"] for r in ch["runs"] if r["hang"]]
    assert hangs and any(r["detected_by"] == "replay" for r in hangs)
    assert doc["detection"]["hangs"] == len(hangs)
    assert any(r["ledger"]["seconds"]["redone"] > 0 for ch in doc["chains"] for r in ch["runs"])
    assert doc["jobs"]["cached"] == 0 and png.read_bytes()[:4] == b"\x89PNG"
    assert doc["total"]["gpu_hours"]["productive"] > 0


def test_the_table_the_cache_and_the_groupings(
    archive: tuple[Path, list[tuple[tuple[str, int], ...]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, _ = archive
    cache = ["--cache", str(tmp_path / "cache"), "--no-slurm", "--now", NOW, "--no-png"]
    assert main(["goodput", str(root), *cache]) == 0
    first = capsys.readouterr().out
    assert main(["goodput", str(root), *cache]) == 0
    out = capsys.readouterr().out
    jobs = len(list(root.glob("*.log")))
    assert f"cache: {jobs} of {jobs} jobs" in out and "cache: 0 of" in first
    assert out.splitlines()[1:] == first.splitlines()[1:]  # the same ledger, read from the cache
    table = out.splitlines()[1:]
    assert table[0].startswith("week (UTC)") and any(ln.startswith("total") for ln in table)
    assert (
        max(len(ln) for ln in table[: table.index(next(ln for ln in table if ln.startswith("total"))) + 1])
        <= 100
    )
    assert "Hangs:" in out and "Checkpoint advice" in out
    users = _json(capsys, str(root), "--by", "user", "--no-png", "--cache", str(tmp_path / "cache"))
    assert {g["key"] for g in users["groups"]} <= {"alice", "bob", "carol", "dave"}
    recent = _json(capsys, str(root), "--since", "0s", "--no-png", "--no-cache")
    assert recent["chains"] == []  # nothing ended after --now


def test_unusable_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["goodput", str(tmp_path / "nothing"), "--no-slurm", "--no-png", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "nothing" in err and "Traceback" not in err


def _job(root: Path, job_id: str, start: float, *, hang: bool, slow_step: int | None) -> None:
    """A healthy job with one slow step (`slow_step`: 5x the step time), or a job that hangs."""
    sim = JobSim(
        JobSpec(job_id=job_id, model="llama3.1-8b", nnodes=2, steps=400, step_time=30.0, start=start),
        random.Random(job_id),
    )
    sim.header()
    sim.stages_ok()
    sim.train_begin()
    sim.env_dumps()
    sim.init_training()
    sim.steps(0, 40, lambda s: 150.0 if s == slow_step else sim.default_seconds(s, 0), noise_per_step=0.2)
    if hang:
        sim.quiet_noise(2400, 60)
        sim.cancel_cascade()
    else:
        sim.train_end_ok()
        sim.summary(0)
    sim.write(root)


def test_calibrate_proposes_the_tightest_budget_that_catches_the_hang_without_a_false_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "outputs"
    _job(root, "7100", SIM_EPOCH, hang=True, slow_step=None)
    _job(root, "7101", SIM_EPOCH + 7200, hang=False, slow_step=20)  # 150 s: x3 of 30 s would page
    snippet = tmp_path / "hang.toml"
    argv = ["calibrate", str(root), "--no-slurm", "--no-cache", "--factors", "3,6", "--min-stalls", "60"]
    assert main([*argv, "--checkpoint-budgets", "900", "--write", str(snippet), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    table = {s["stall_factor"]: s for s in doc["table"]}
    assert table[3.0]["false_pages"] == 1 and table[3.0]["misses"] == 0
    assert table[6.0]["false_pages"] == 0 and table[6.0]["misses"] == 0
    assert doc["proposal"]["stall_factor"] == 6.0 and doc["proposal"]["clean"]
    assert 180 <= doc["proposal"]["worst_latency_s"] <= 180 + 15 + 30  # 6 x 30 s, a tick, a step
    assert "[detectors.hang]\nstall_factor = 6\n" in snippet.read_text()


def test_with_a_config_the_fleet_figures_go_to_its_state_dir(
    archive: tuple[Path, list[tuple[tuple[str, int], ...]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from jobdiagd.goodput.fleet import FLEET_NAME, read_fleet

    root, _ = archive
    state = tmp_path / "state"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{state}"\n')
    doc = _json(capsys, str(root), "--config", str(cfg), "--no-png")
    fleet = read_fleet(state / FLEET_NAME)
    assert fleet is not None and sum(fleet.events.values()) > 0 and fleet.restart_s > 0
    assert any("job-end advice written" in n for n in doc["notes"])
    assert (state / "goodput-cache").is_dir()  # the cache lives in the state dir too


def test_the_digest_prints_what_the_daemon_would_send(
    archive: tuple[Path, list[tuple[tuple[str, int], ...]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, _ = archive
    ends = [r["end"] for c in json.loads((root / "archive.json").read_text())["chains"] for r in c["runs"]]
    now = max(ends) + 600
    png = tmp_path / "digest.png"
    argv = ["goodput", str(root), "--digest", "--no-slurm", "--now", str(now), "--cache", str(tmp_path / "c")]
    assert main([*argv, "--png", str(png)]) == 0
    out = capsys.readouterr().out
    day = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")
    assert out.startswith(f"**Goodput, week to {day}: ") and " % of " in out.splitlines()[0]
    for section in ("Where the lost GPU-hours went", "Suspect nodes", "Slowest hang detections"):
        assert f"**{section}**" in out
    assert "- hang: " in out  # the archive's hangs lost GPU-hours this week
    assert f"Picture: {png}" in out and png.read_bytes()[:4] == b"\x89PNG"
    assert main([*argv, "--no-png", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["title"] in out.splitlines()[0] and doc["markdown"] == out.split("\nPicture:")[0]
    assert doc["png"] is None
