"""The incremental cache: facts kept until a job's files change, private files, never fatal."""

from __future__ import annotations

import os
from pathlib import Path

from jobdiagd.goodput.cache import CACHE_NAME, COMMIT_EVERY, FactsCache, fingerprint
from jobdiagd.goodput.facts import RunFacts
from jobdiagd.model.jobref import JobRef


def _job(tmp_path: Path) -> JobRef:
    d = tmp_path / "1-JAX-x"
    (d / "ray_logs" / "node001").mkdir(parents=True)
    log = tmp_path / "1-JAX-x.log"
    log.write_text("JOB_ID=1\n")
    (d / "ray_logs" / "node001" / "worker-ab-01-7.out").write_text("x\n")
    return JobRef("1", "JAX-x", d, log, "slurm")


def test_a_row_is_used_until_any_file_of_the_job_changes(tmp_path: Path) -> None:
    ref = _job(tmp_path)
    facts = [RunFacts(key="k#0", job_id="1", nodes=("n1",), tails=((10, 5.0),), save_costs=(1.5,))]
    cache = FactsCache(tmp_path / "cache")
    fp = fingerprint(ref, "COMPLETED")
    cache.put(str(ref.log), fp, facts)
    cache.close()
    again = FactsCache(tmp_path / "cache")
    assert again.get(str(ref.log), fp) == facts and again.hits == 1
    assert again.get(str(ref.log), fingerprint(ref, "RUNNING")) is None  # another Slurm state
    worker = next((tmp_path / "1-JAX-x" / "ray_logs" / "node001").iterdir())
    worker.write_text("x\ny\n")
    assert again.get(str(ref.log), fingerprint(ref, "COMPLETED")) is None and again.misses == 2
    assert os.stat(tmp_path / "cache").st_mode & 0o777 == 0o700
    assert os.stat(tmp_path / "cache" / CACHE_NAME).st_mode & 0o777 == 0o600


def test_an_unusable_cache_is_a_note_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / CACHE_NAME).symlink_to(tmp_path / "elsewhere")
    cache = FactsCache(tmp_path / "cache")
    assert cache.note is not None and "symbolic link" in cache.note
    cache.put("k", "fp", [])
    assert cache.get("k", "fp") == []  # kept in memory for this run
    none = FactsCache(None)
    assert none.note is None and none.get("k", "fp") is None


def test_a_run_stopped_midway_keeps_what_it_committed(tmp_path: Path) -> None:
    cache = FactsCache(tmp_path / "cache")
    for i in range(COMMIT_EVERY + 5):
        cache.put(f"log{i}", "fp", [RunFacts(key=f"log{i}#0", job_id=str(i))])
    # Never closed (a digest stopped at its timeout): another reader sees the committed rows.
    other = FactsCache(tmp_path / "cache")
    kept = sum(other.get(f"log{i}", "fp") is not None for i in range(COMMIT_EVERY + 5))
    assert kept == COMMIT_EVERY
    cache.close()
    other.close()
