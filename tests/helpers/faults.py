"""Fault-injection records: each fault test prints one `FAULT <name>: ...` line and, when
JOBDIAGD_FAULT_REPORT_DIR is set, writes it as JSON for `scripts/reliability_report.py`.

    from tests.helpers.faults import record_fault

    record_fault(
        "squeue hangs",
        injected="every squeue call sleeps 600 s",
        daemon="killed each call at the 2 s timeout; ticks went on; one degraded notice",
        delivered="hang page 1, degraded notice 1, recovered notice 1",
        figures={"squeue calls timed out": 3},
    )

The record is written at the end of a test that passed its assertions (call it last), so the
report lists only what was proven in that run.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ENV = "JOBDIAGD_FAULT_REPORT_DIR"


def record_fault(
    name: str,
    *,
    injected: str,
    daemon: str,
    delivered: str,
    figures: Mapping[str, object] | None = None,
    test: str | None = None,
) -> dict[str, object]:
    """Print the FAULT line (pytest -s shows it; the report reads the JSON) and return the record."""
    record: dict[str, object] = {
        "name": name,
        "injected": injected,
        "daemon": daemon,
        "delivered": delivered,
        "figures": dict(figures or {}),
        "test": test or os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
        "at": time.time(),
    }
    figs = " ".join(f"{k}={v}" for k, v in record["figures"].items())  # type: ignore[attr-defined]
    print(f"FAULT {name}: injected={injected!r} daemon={daemon!r} delivered={delivered!r} {figs}".rstrip())
    out = os.environ.get(ENV)
    if out:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or "fault"
        (d / f"{slug}-{os.getpid()}-{time.monotonic_ns()}.json").write_text(json.dumps(record, indent=1))
    return record


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private temp dir with a short path (Unix socket paths must stay under 108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="jdf-", dir="/tmp") as d:
        yield Path(d)
