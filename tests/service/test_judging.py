"""The one judging pass the engine and the backtest share: which detectors run, what a failing one does."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd.detectors import Detector, Outcome, Report, WatchedJob
from jobdiagd.detectors.base import StatusPart, resolved_finding
from jobdiagd.model.alerts import Finding
from jobdiagd.model.jobref import JobRef
from jobdiagd.service.jobs import JobView
from jobdiagd.service.judging import Judged, run_detectors


class Fixed:
    def __init__(self, name: str, out: list[Finding | Report] | Exception, *, on_data: bool = False) -> None:
        self.name, self.out, self.on_data = name, out, on_data
        self.on_gpu_check = False

    def check(self, view: WatchedJob, now: float) -> Outcome:
        if isinstance(self.out, Exception):
            raise self.out
        return self.out

    def forget(self, key: str) -> None:
        pass

    def status(self, view: WatchedJob, now: float) -> StatusPart | None:
        return None


class Recorder:
    def __init__(self) -> None:
        self.failures: list[tuple[str, str, str]] = []
        self.passes: list[str] = []
        self.spent_on: list[str] = []

    def failed(self, det: Detector, key: str, exc: Exception) -> None:
        self.failures.append((det.name, key, str(exc)))

    def passed(self, det: Detector, key: str) -> None:
        self.passes.append(det.name)

    def spent(self, det: Detector, seconds: float) -> None:
        assert seconds >= 0
        self.spent_on.append(det.name)


VIEW = JobView(key="7001", ref=JobRef("7001", "JAX-t", None, Path("/x/7001.log"), "slurm"), first_seen=0.0)
PAGE = Finding("a", "7001", "hang", "critical", "stalled", at_step=3)
REPORT = Report("7001", "job-end", "end", "ended", "body")


def test_findings_and_reports_are_sorted_and_a_failing_check_is_reported_not_raised() -> None:
    rec = Recorder()
    judged = Judged()
    dets = [Fixed("a", [PAGE]), Fixed("boom", RuntimeError("bug")), Fixed("c", [REPORT])]
    run_detectors(dets, VIEW, 10.0, judged, watch=rec)
    assert judged.findings == [PAGE] and judged.reports == [REPORT]
    assert rec.failures == [("boom", "7001", "bug")] and rec.passes == ["a", "c"]
    assert rec.spent_on == ["a", "boom", "c"]


def test_without_a_watch_a_failing_check_raises() -> None:
    """The backtest: a detector bug must not be silently skipped in a replay."""
    with pytest.raises(RuntimeError):
        run_detectors([Fixed("boom", RuntimeError("bug"))], VIEW, 10.0, Judged())


def test_only_the_selected_detectors_run() -> None:
    judged = Judged()
    dets = [Fixed("a", [PAGE]), Fixed("c", [REPORT], on_data=True)]
    run_detectors(dets, VIEW, 10.0, judged, runs=lambda d: d.on_data)
    assert judged.findings == [] and judged.reports == [REPORT]


def test_a_resolution_reaches_the_book_only_for_a_newer_step_of_an_open_incident() -> None:
    from jobdiagd.alerts.incidents import IncidentBook
    from jobdiagd.config import IncidentsConfig

    book = IncidentBook.from_config(IncidentsConfig())
    judged = Judged([resolved_finding("a", "7001", "hang", "steps resumed at step 4", 4)])
    assert judged.kept(book) == []  # no open incident: nothing to resolve
    book.observe_all([PAGE], 10.0)
    assert judged.kept(book) == judged.findings
    assert Judged([resolved_finding("a", "7001", "hang", "same step", 3)]).kept(book) == []
