"""Ray worker-log evidence for the TSDB report: NCCL/RCCL communicator-init waves (runbook "Log evidence")."""

from __future__ import annotations

from pathlib import Path

from jobdiagd.logs.prefixes import strip

INIT_MARKERS = ("init.cc:2095", "MSCCL++")


def nccl_init_waves(worker_logs: list[str], gap_s: float = 30.0) -> int:
    """Clusters of communicator-init lines: a fresh start shows 2, a single-replica restore 3.

    Lines with timestamps split on time gaps > gap_s; without timestamps (NCCL <= 2.25 prints none)
    a run of other lines between init lines separates waves.
    """
    waves = 0
    last_key: float | None = None
    other_since_last = True
    for raw in worker_logs:
        if not any(m in raw for m in INIT_MARKERS):
            other_since_last = True
            continue
        st = strip(raw).stamp
        key = None if st is None else ((st.year or 0) * 400 + st.month * 32 + st.day) * 86400.0 + st.seconds
        if key is not None and last_key is not None:
            new = key - last_key > gap_s
        else:
            new = last_key is None and waves == 0 or (key is None and other_since_last)
        if new or waves == 0:
            waves += 1
        last_key = key if key is not None else last_key
        other_since_last = False
    return waves


def head_worker_waves(job_dir: Path | None, head: str | None) -> int | None:
    """Init waves in the head node's worker .out logs (task 0 has the most informative logs)."""
    if job_dir is None:
        return None
    base = job_dir / "ray_logs"
    dirs = (
        [base / head]
        if head and (base / head).is_dir()
        else sorted(p for p in base.glob("*") if p.is_dir())[:1]
    )
    best: int | None = None
    for d in dirs:
        for f in sorted(d.glob("worker-*.out")):
            try:
                with f.open(errors="replace") as fh:
                    lines = [ln for ln in fh if any(m in ln for m in INIT_MARKERS) or ln.strip()]
            except OSError:
                continue
            w = nccl_init_waves(lines)
            best = w if best is None else max(best, w)
    return best
