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
"""

from __future__ import annotations

from jobdiagd.config import Config
from jobdiagd.detectors.base import DetectorSpec, NoData, Outcome, Report, StatusPart, WatchedJob
from jobdiagd.triage.report import render_markdown

NAME = "job_end"
KIND = "job-end"


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
    """Stateless: every answer comes from the view."""

    name = NAME
    on_data = True
    on_gpu_check = False

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
        return [Report(view.key, KIND, report_key(view), title, render_markdown(res))]


def report_key(view: WatchedJob) -> str:
    """Stable per end (a restart re-sending it is deduplicated), distinct between two ends."""
    end = view.slurm.end_time if view.slurm is not None and view.slurm.is_finished else None
    return f"end:{int(end)}" if end else "end"


def _factory(cfg: Config) -> JobEndDetector:
    return JobEndDetector()


SPEC = DetectorSpec(NAME, True, _factory, "when a watched job ends: the full triage report")
