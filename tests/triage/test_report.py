"""Golden Markdown reports and the CLI contract (exit codes, JSON keys, --all table)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobdiagd.cli import main
from jobdiagd.triage.engine import triage
from jobdiagd.triage.report import render_markdown

GOLDEN = Path(__file__).parent / "golden"
GOLDEN_CASES = [
    "completed-ray0",
    "completed-ray1-truncated",
    "hanging",
    "heartbeat-after-stall",
    "heartbeat-mid-training",
    "oom-cascade",
    "soft-success-b",
    "checkpoint-fs-error",
    "tgs-constant-drop",
    "cancelled-after-hang",
    "unknown-death",
    "prolog-kill-no-log",
]


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_golden_markdown(corpus: tuple[Path, dict[str, dict[str, object]]], name: str) -> None:
    root, exps = corpus
    e = exps[name]
    r = triage(
        str(e["job_dir"] or e["log"]),
        now=float(e["now"]),
        slurm_state=e.get("slurm_state"),
        outputs_root=root,
    )  # type: ignore[arg-type]
    text = render_markdown(r).replace(str(root), "outputs")
    golden = GOLDEN / f"{name}.md"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text)  # only on request: a golden is reviewed, never written by the test itself
    assert golden.exists(), f"{golden} is missing: write it with UPDATE_GOLDEN=1 and review it"
    assert text == golden.read_text()
    for section in (
        "### What happened",
        "### Evidence",
        "### Training progress projection",
        "### TGS analysis",
        "### Additional findings",
        "### Recommended next steps",
    ):
        assert section in text


def test_cli_json_document(
    corpus: tuple[Path, dict[str, dict[str, object]]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, exps = corpus
    e = exps["heartbeat-after-stall"]
    rc = main(["triage", str(e["job_dir"]), "--json", "--now", str(e["now"]), "--no-slurm"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) >= {
        "job",
        "status",
        "primary_failure",
        "failures",
        "progress",
        "tgs",
        "live",
        "next_steps",
    }
    assert set(doc["job"]) >= {"id", "name", "log", "job_dir", "ray", "platform"}
    assert set(doc["progress"]) >= {
        "start",
        "restored_from_step",
        "first_step",
        "last_step",
        "total_steps",
        "step_time_s",
        "expected_step_now",
        "checkpoint_period",
        "last_checkpoint_step",
        "progress_lost_steps",
        "eta_s",
        "train_time_s",
        "wall_time_s",
        "unaccounted_s",
    }
    assert set(doc["tgs"]) >= {"baseline", "recent", "change_pct", "degraded", "pattern", "range"}
    assert set(doc["live"]) == {"head_node", "prometheus_port", "tunnel"}
    assert doc["primary_failure"] == "hang"
    assert any(f["class"] == "heartbeat-timeout" for f in doc["failures"])
    assert all(set(f) >= {"class", "line", "source", "task", "host", "text"} for f in doc["failures"])


def test_cli_all_table(
    corpus: tuple[Path, dict[str, dict[str, object]]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, exps = corpus
    rc = main(["triage", "--all", "--outputs", str(root), "--now", "2000000000", "--no-slurm"])
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("JOB")
    jobs = [e for e in exps.values() if e.get("is_job", True) and e["job_dir"]]
    assert len(out) - 1 == len(
        [
            e
            for e in jobs
            if (Path(str(e["job_dir"])) / "log").is_symlink() or e["primary_failure"] == "prolog-kill-no-log"
        ]
    )


def test_cli_unusable_input_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["triage", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope" in err
    shared = tmp_path / "llama2-70b"
    (shared / "checkpoints").mkdir(parents=True)
    assert main(["triage", str(shared)]) == 2
    assert "not a job directory" in capsys.readouterr().err
    assert main(["triage", "12345", "--outputs", str(tmp_path)]) == 2
