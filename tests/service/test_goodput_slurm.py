"""`jobdiagd goodput` against the real Slurm test cluster: two real jobs, real sacct (the completion
file), the restart marker read back from scontrol, queue wait from Slurm (rules GP-2, GP-3)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from jobdiagd.cli import main
from jobdiagd.rules.recovery import restart_marker
from jobdiagd.sources.accounting import query_accounting
from tests.helpers.slurm_cluster import SlurmCluster

# A tiny job in MaxText's formats, dated with the node's clock: header, steps with saves every 4,
# then a user's Python error (FAIL=1) or a clean end, and the JOB SUMMARY the EXIT trap writes.
JOB = textwrap.dedent(
    r"""
    #!/bin/bash
    ts() { date +"I%m%d %H:%M:%S.%6N"; }
    START=$(date +%s)
    echo "JOB_ID=$SLURM_JOB_ID"
    echo "JOB_NAME=$SLURM_JOB_NAME"
    echo "NNODES=1"
    echo "JOB_NODELIST=$SLURM_JOB_NODELIST"
    echo 'PASSTHROUGH_ARGS="steps=100 enable_checkpointing=true checkpoint_period=4"'
    echo "MODEL_NAME=tiny"
    echo "0: $(ts) 11 pyconfig.py:1012] Config param checkpoint_period: 4"
    echo "0: $(ts) 11 checkpointing.py:227] No existing checkpoints found, not restoring checkpoint."
    for i in $(seq 0 $LAST); do
      sleep 0.4
      echo "0: $(ts) 11 metric_logger.py:232] completed step: $i, seconds: 0.400, TFLOP/s/device: 100.0, Tokens/s/device: 1000.0, total_weights: 1000, loss: 2.000"
      if [ $((i % 4)) -eq 0 ]; then echo "0: $(ts) 11 train.py:1040] Saved a checkpoint at step $i."; fi
    done
    RC=0
    if [ "$FAIL" = 1 ]; then
      echo "0: Traceback (most recent call last):"
      echo '0:   File "/workspace/maxtext/MaxText/train.py", line 900, in train_loop'
      echo "0: ValueError: grain: record 18213 has length 0"
      RC=1
    fi
    WALL=$(( $(date +%s) - START ))
    echo "========================== JOB SUMMARY =========================="
    echo "  Job:    $SLURM_JOB_ID ($SLURM_JOB_NAME)"
    echo "  Wall:   ${WALL}s"
    if [ $RC = 0 ]; then echo "  Status: SUCCESS (exit 0)"; else echo "  Status: FAILED (exit 1) — Training FAILED (exit=1)"; fi
    echo "================================================================="
    exit $RC
    """
).lstrip()


def _submit(cluster: SlurmCluster, outputs: Path, script: Path, *extra: str) -> str:
    job_id = cluster.sbatch("-J", "JAX-tiny", "-n", "1", f"--output={outputs}/%j-%x.log", *extra, str(script))
    d = outputs / f"{job_id}-JAX-tiny"
    d.mkdir()
    (d / "log").symlink_to(f"../{job_id}-JAX-tiny.log")
    return job_id


def test_goodput_on_real_slurm_jobs_linked_by_the_restart_marker(
    slurm_conf_env: SlurmCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = slurm_conf_env
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    script = tmp_path / "job.sh"
    script.write_text(JOB)
    first = _submit(cluster, outputs, script, "--export=ALL,LAST=9,FAIL=1")
    # Submitted at once, eligible when the first ends (its dependency).
    second = _submit(
        cluster, outputs, script, "--export=ALL,LAST=7,FAIL=0", f"--dependency=afterany:{first}",
        f"--comment={restart_marker(first)}",
    )  # fmt: skip
    try:
        assert cluster.wait_state(first, ("FAILED",), timeout=90) == "FAILED"
        assert cluster.wait_state(second, ("COMPLETED",), timeout=90) == "COMPLETED"

        acct = query_accounting([first, second], env=cluster.env)
        assert acct.source == "jobcomp" and set(acct.records) == {first, second}
        a, b = acct.records[first], acct.records[second]
        assert a.start is not None and a.end is not None and b.start is not None and b.submit is not None
        assert a.end <= b.submit <= b.start  # eligible once the first ended: it never waits twice

        assert main(["goodput", str(outputs), "--json", "--no-png", "--no-cache", "--no-replay"]) == 0
        doc = json.loads(capsys.readouterr().out)
        [chain] = doc["chains"]
        assert [r["job_id"] for r in chain["runs"]] == [first, second]
        assert chain["links"] == ["marker"]  # a fresh start after a user error: only the marker links them
        ra, rb = chain["runs"]
        assert ra["times_from"] == rb["times_from"] == "slurm"
        assert (ra["start"], ra["end"], rb["start"], rb["end"]) == (a.start, a.end, b.start, b.end)
        assert ra["primary"] == "python-exception" and rb["status"] == "completed"
        assert rb["ledger"]["seconds"]["queue"] == pytest.approx(b.start - b.submit)
        for r in chain["runs"]:
            wall = r["end"] - r["submit"]
            assert sum(r["ledger"]["seconds"].values()) == pytest.approx(wall, abs=0.01)
        # The restart started from step 0: everything the first run trained was done again.
        assert ra["ledger"]["seconds"]["redone"] > 1.0 and ra["ledger"]["seconds"]["productive"] == 0
        assert rb["ledger"]["seconds"]["productive"] > 1.0 and rb["ledger"]["seconds"]["redone"] == 0
        assert any("completion file" in n for n in doc["notes"])
    finally:
        cluster.scancel(first, second)
