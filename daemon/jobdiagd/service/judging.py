"""One tick of judging, shared by the daemon's engine and the backtest replay: each detector's check of a job."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from jobdiagd.alerts.incidents import IncidentBook
from jobdiagd.detectors import Detector, NoData, Report, WatchedJob, keep_resolution
from jobdiagd.model.alerts import Finding


class CheckWatch(Protocol):
    """How the engine hears about each check (the backtest passes none: a failing check raises)."""

    def failed(self, det: Detector, key: str, exc: Exception) -> None: ...
    def passed(self, det: Detector, key: str) -> None: ...
    def spent(self, det: Detector, seconds: float) -> None: ...


@dataclass
class Judged:
    """What the detectors said about the jobs of one tick."""

    findings: list[Finding] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)

    def kept(self, book: IncidentBook) -> list[Finding]:
        """The findings the incident book should see (`keep_resolution`)."""
        return [f for f in self.findings if keep_resolution(book, f)]


def run_detectors(
    detectors: Sequence[Detector],
    view: WatchedJob,
    now: float,
    into: Judged,
    *,
    runs: Callable[[Detector], bool] | None = None,
    watch: CheckWatch | None = None,
) -> None:
    """Each detector `runs` selects checks the job; its findings and reports are added to `into`.

    With a `watch`, a check that raises is reported to it and the others go on; without, it raises."""
    for det in detectors:
        if runs is not None and not runs(det):
            continue
        out = _check(det, view, now, watch)
        if out is None or isinstance(out, NoData):
            continue
        _sort(out, into)


def _check(
    det: Detector, view: WatchedJob, now: float, watch: CheckWatch | None
) -> Iterable[Finding | Report] | NoData | None:
    if watch is None:
        return det.check(view, now)
    t0 = time.perf_counter()
    try:
        out = det.check(view, now)
    except Exception as exc:
        watch.failed(det, view.key, exc)
        return None
    finally:
        watch.spent(det, time.perf_counter() - t0)
    watch.passed(det, view.key)
    return out


def _sort(out: Iterable[Finding | Report], into: Judged) -> None:
    for item in out:
        if isinstance(item, Report):
            into.reports.append(item)
        else:
            into.findings.append(item)
