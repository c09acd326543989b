"""Fast pre-filter: find the lines of a buffer that contain any trigger literal.

The log reader only parses lines that can carry an event or a failure signature;
on multi-GB logs that are mostly NCCL INFO noise this is what keeps triage near
grep speed. Hyperscan (SIMD multi-literal matching) is used when importable, and a
pure-Python fallback gives the same answer (one `bytes.find` pass per literal).
Both return the sorted start offsets of matching lines; tests check they agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Protocol

from jobdiagd.triage.signatures import SIGNATURE_NEEDLES

# Literals of the events the parser extracts (see logs/events.py). Keep them specific:
# every extra short literal costs matching time on every byte of a multi-GB log.
EVENT_NEEDLES: tuple[str, ...] = (
    "completed step",
    "completed profiler",
    "Config param ",
    "restoring from this run",
    "not restoring checkpoint",
    "aved a checkpoint at step",
    "asynchronous checkpoint save",
    "Finished saving checkpoint",
    "BARRIER",
    "== Preflight",
    "== Docker pull",
    "== ECC check",
    "== Training",
    " FAILED (exit=",
    " TIMEOUT (",
    "JOB SUMMARY",
    "Job:",
    "Model:",
    "Nodes:",
    "Wall:",
    "Status:",
    "=========",
    "NODE_EXIT",
    "srun: ",
    "slurmstepd",
    "CANCELLED",
    "[Ray]",
    "[Prometheus]",
    "ssh -J",
    "jax_worker/replica",
    "Polled an error",
    "Terminating process because",
    "pending_event_logger",
    "Error: ",
    "Exception: ",
    "_FRACTION=",
    "JOB_ID=",
    "JOB_NAME=",
    "NNODES=",
    "JOB_NODELIST=",
    "NODELIST_EXPANDED=",
    "PASSTHROUGH_ARGS=",
    "MODEL_NAME=",
    "RAY_PORT=",
    "JAX_COORDINATOR_PORT=",
    "MODEL_NAME_ALIAS=",
    "RAY=",
    "EXP_TAG=",
    "heartbeat_timeout",
    "Training subprocess",
    "falling back to non-Ray",
)

TRIGGERS: tuple[str, ...] = tuple(sorted(set(EVENT_NEEDLES) | set(SIGNATURE_NEEDLES)))


class LineScanner(Protocol):
    name: str

    def candidates(self, buf: bytes) -> list[int]:
        """Sorted, unique start offsets of the lines in `buf` that contain a trigger."""
        ...


class PythonScanner:
    """One `bytes.find` pass per literal; C-speed per pass, no dependencies."""

    name = "python"

    def __init__(self, triggers: Iterable[str] = TRIGGERS) -> None:
        self._needles = [t.encode() for t in triggers]

    def candidates(self, buf: bytes) -> list[int]:
        starts: set[int] = set()
        find = buf.find
        rfind = buf.rfind
        for needle in self._needles:
            i = find(needle)
            while i != -1:
                start = rfind(b"\n", 0, i) + 1
                starts.add(start)
                end = find(b"\n", i)
                if end == -1:
                    break
                i = find(needle, end)
        return sorted(starts)


class HyperscanScanner:
    """All literals in one SIMD pass (hyperscan); the callback maps a hit to its line start."""

    name = "hyperscan"

    def __init__(self, triggers: Iterable[str] = TRIGGERS) -> None:
        import hyperscan

        pats = [re.escape(t).encode() for t in triggers]
        self._hs = hyperscan
        self._db: Any = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._db.compile(expressions=pats, ids=list(range(len(pats))), elements=len(pats))
        self._scratch: Any = hyperscan.Scratch(self._db)

    def candidates(self, buf: bytes) -> list[int]:
        starts: list[int] = []
        rfind = buf.rfind
        find = buf.find
        # Hits arrive in order of their end offset; once a line is taken, skip to its end.
        line_end = -1

        def on_match(_id: int, _frm: int, to: int, _flags: int, _ctx: object) -> int | None:
            nonlocal line_end
            if to <= line_end:
                return None
            start = rfind(b"\n", 0, to) + 1
            if not starts or starts[-1] != start:
                starts.append(start)
            end = find(b"\n", to)
            line_end = len(buf) if end == -1 else end
            return None

        self._db.scan(buf, match_event_handler=on_match, scratch=self._scratch)
        return starts


def default_scanner() -> LineScanner:
    try:
        return HyperscanScanner()
    except Exception:  # ImportError, or a CPU without the SIMD hyperscan needs
        return PythonScanner()
