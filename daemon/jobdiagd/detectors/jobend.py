"""Job-end detector: when a watched job ends, the full triage report (the same one `jobdiagd triage` prints).

A job ends when it leaves the Slurm queue (final state from scontrol/sacct) or, without Slurm,
when its log gets a JOB SUMMARY. The engine re-reads the job's files once at that moment
(`load_job`, all worker logs: exact parity with `jobdiagd triage`) and stores the result on
the view as `final`; without it the tailed states are analysed.

The report's key carries Slurm's end time when there is one (`end:<epoch>`), so the id of a
real end never collides with an earlier report for the same job id (a requeued job, or an end
reported from a wrong squeue answer by an older daemon); without an end time it is `end`.

A job none of whose logs was ever read (unreadable or refused: a monitoring-blind notice went
out) gets a report saying so, not a triage of nothing (which would read as a prolog kill).

When `jobdiagd goodput --config` has written the fleet's rates into the state dir
(`goodput.fleet`), the report ends with the checkpoint-interval advice for the job (rule
GP-9): its own save cost and step time against the fleet's MTBF and latencies. The small file
is read at a job's end only, and again only when it changed.
"""

from __future__ import annotations

import os
from pathlib import Path

from jobdiagd.config import Config
from jobdiagd.detectors.base import DetectorSpec, NoData, Outcome, Report, StatusPart, WatchedJob
from jobdiagd.goodput.fleet import FLEET_NAME, Fleet, advice_section, job_advice, read_fleet
from jobdiagd.model.kinds import IncidentKind
from jobdiagd.model.triage import TriageResult
from jobdiagd.triage.report import render_markdown

NAME = "job_end"
KIND = IncidentKind.JOB_END


def untriaged_report(view: WatchedJob) -> Report:
    """The job's log was never read (unreadable or refused all along): say so instead of
    triaging nothing, which would read as a prolog kill."""
    title = f"job {view.key} ended: not triaged (its log could not be read)"
    if view.slurm is not None:
        title += f" [Slurm {view.end_state or view.slurm.state}]"
    files = "\n".join(f"- `{path}`: {error}" for path, error in sorted(view.blind.items()))
    body = (
        "## Job triage\n\nNo triage: no log of this job was ever read (a monitoring-blind notice "
        f"was sent for each file).\n\n{files}\n"
    )
    return Report(view.key, KIND, report_key(view), title, body)


class JobEndDetector:
    """Stateless but for the fleet file it last read: every answer comes from the view."""

    name = NAME
    on_data = True
    on_gpu_check = False

    def __init__(self, fleet_path: Path | None = None) -> None:
        self.fleet_path = fleet_path
        self._fleet: tuple[tuple[int, int], Fleet | None] | None = None

    def _current_fleet(self) -> Fleet | None:
        if self.fleet_path is None:
            return None
        try:
            st = os.stat(self.fleet_path)
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if self._fleet is None or self._fleet[0] != stamp:
            self._fleet = (stamp, read_fleet(self.fleet_path))
        return self._fleet[1]

    def _advice(self, res: TriageResult) -> str:
        fleet = self._current_fleet()
        a = job_advice(res, fleet) if fleet is not None else None
        return "\n" + advice_section(a, fleet) if a is not None and fleet is not None else ""

    def forget(self, key: str) -> None:
        pass

    def status(self, view: WatchedJob, now: float) -> StatusPart | None:
        return None

    def check(self, view: WatchedJob, now: float) -> Outcome:
        if not view.ended:
            return NoData("job still running")
        if view.final is None and view.main is None and view.blind:
            return [untriaged_report(view)]
        res = view.final if view.final is not None else view.analysis(now)
        primary = res.primary
        state = view.end_state or res.status
        title = f"job {view.key} ended: {res.status}"
        if primary and str(primary) != res.status:
            title += f" (primary {primary})"
        if view.slurm is not None:
            title += f" [Slurm {state}]"
        return [Report(view.key, KIND, report_key(view), title, render_markdown(res) + self._advice(res))]


def report_key(view: WatchedJob) -> str:
    """Stable per end (a restart re-sending it is deduplicated), distinct between two ends."""
    end = view.slurm.end_time if view.slurm is not None and view.slurm.is_finished else None
    return f"end:{int(end)}" if end else "end"


def _factory(cfg: Config) -> JobEndDetector:
    return JobEndDetector(cfg.daemon.state_dir / FLEET_NAME)


SPEC = DetectorSpec(NAME, True, _factory, "when a watched job ends: the full triage report")
