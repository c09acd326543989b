"""Which watched job's existing log to catch up with next: the jobs closest to a page first.

When the daemon starts (or many jobs appear at once) every log already written must be read
once before its job can be judged. The first tick reads what fits a byte budget and the rest
is read in the background (`service.reading`), in this order:

1. Jobs whose log cannot even be stat'ed: reading them costs nothing and is what tells
   people the job is unmonitored ("monitoring blind") or that its log is not there yet.
2. Then the job quiet for longest: the one whose hang budget runs out first, and the one a
   crash has silenced (a crashed or hung job stops writing; a healthy one writes every step).
   Quiet since = the saved arrival of its last step when the daemon had read it before a
   restart (the hang clock restored from the offsets table), else its log's mtime. The mtime
   only orders the reading; it never judges a hang (the detectors use the daemon's clock).
3. Among equals, the smaller log first: more jobs judged sooner.

Pure: plain data in, an order out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Pending:
    """A job whose existing log has not been read yet."""

    key: str
    quiet_since: float | None  # saved arrival of the last step, else the log's mtime; None: no stat
    size: int  # bytes to read (0 when unknown)


def catch_up_order(pending: Iterable[Pending]) -> list[str]:
    """The keys in the order their logs should be read (see the module docstring)."""
    ranked = sorted(
        pending,
        key=lambda p: (
            p.quiet_since is not None,
            p.quiet_since if p.quiet_since is not None else 0.0,
            p.size,
            p.key,
        ),
    )
    return [p.key for p in ranked]
