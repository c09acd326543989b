"""The simulated archive: chains of runs with their truth, reproducible by seed."""

from __future__ import annotations

import json
from pathlib import Path

from jobdiagd_sim.archive import build_archive


def test_the_truth_matches_the_files_and_the_seed_repeats(tmp_path: Path) -> None:
    chains = build_archive(tmp_path / "a", chains=6, seed=3, small=True, days=5)
    doc = json.loads((tmp_path / "a" / "archive.json").read_text())
    assert len(doc["chains"]) == 6 and [c["chain"] for c in doc["chains"]] == [c.chain for c in chains]
    for c in chains:
        assert c.runs[0].link is None and all(r.link is not None for r in c.runs[1:])
        assert c.runs[-1].outcome in ("completed", "python-exception") or len(c.runs) == 4
        for r in c.runs:
            log = tmp_path / "a" / r.log
            assert log.is_file() and (log.with_suffix("") / "log").is_symlink()
            assert r.end > r.start and r.last_step >= r.first_step
            text = log.read_text(errors="replace")  # NCCL lines may carry raw bytes
            assert sum(ln.startswith("JOB_ID=") for ln in text.splitlines()) == 1 + max(
                x.run_index for x in c.runs if x.log == r.log
            )
            assert f"SLURM_JOB_USER={c.user}" in text
    again = build_archive(tmp_path / "b", chains=6, seed=3, small=True, days=5)
    assert [c.runs for c in again] == [c.runs for c in chains]
