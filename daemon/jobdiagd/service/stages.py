"""What happens to a tick's findings and reports after judging: one ordered list, `STAGES`.

The whole path of a finding, from the detector that made it to the people who read it:

    judge      service.judging.run_detectors: every detector due checks each job read this tick
    STAGES     (this list, in the tick, in order; each stage `(batch, ctx) -> batch`)
      1. keep resolution  a resolution passes only for an open incident and a newer step
                          (`detectors.keep_resolution`, shared with the backtest)
      2. stamp            the job's owner and RAY flag (routing, buttons) and, on the finding
                          that opens a hang or TGS incident, its picture's inputs
      3. enrich or hold   RAY=1 jobs (`service.tsdb_enrich`): a hang finding is held until the
                          GPU verdict is in, then carries it; a failed job's end report is held
                          until its class playbook ran; reports whose playbook finished join
      4. slow host        (`service.host_compare`) the finding that opens a TGS incident is
                          held one tick while each host of the job is compared with its peers
                          on the site Prometheus, or a live RAY=1 job's own, then carries the
                          slow host (or why none is named) and its strip picture (rules
                          SLOW-5, SLOW-6)
      5. recovery         (`service.recovery_wiring`, docs/recovery.md) the restart each hang or
                          failure finding and each failed end calls for, and the nodes they
                          name, decided inside observe's transaction (rule REC-13); a restarted
                          job's incidents resolve "restarted as N" rather than "job ended"
      6. observe          findings into the incident book (`AlertPipeline.observe`): opens,
                          reminders, resolutions, stored with their notifications in one
                          transaction of the outbox
      7. end jobs         jobs whose end this tick confirms leave the watch; their incidents
                          resolve ("job ended") before their end report is queued
      8. enqueue          the job-end reports into the outbox (`AlertPipeline.report`)
    outbox     alerts.outbox, in the state store: what is queued survives a crash
    dispatch   notifiers.dispatcher, asynchronously and at least once: one queue per
               notifier, in order, retried with backoff; the notifier's id makes a repeat a no-op
    routes     chat.routes: which chat gets it (kind, severity, Slurm owner), quiet hours

Why this order: a resolution the incident book will not take must not cancel a GPU verdict the
enricher holds for that job (keep resolution comes before enrich); a picture is built only for
a finding that is kept (before stamp); the GPU strip and the host strip are added to the
stamped picture (stamp before enrich and slow host); recovery reads the enriched finding (its
GPU verdict's suspects) and gives observe the work to do in its transaction (after enrich and
slow host, before observe); an incident resolves "job ended" before the job's end report is
queued, and the report's owner is read from the job's view as judged (`StageContext.views`,
taken before any job leaves).

Failures: a stage that writes the store (`Stage.stores`) and raises stops the path there; the
tick is marked failed (`incident_update_failed`) and its findings are found again by the next
tick (a store fault itself never raises: the pipeline holds what it could not write). Any other
stage's error fails the tick, as the detectors' own pass does not.

Adding a stage: write a function `(batch: Batch, ctx: StageContext) -> Batch` here (or in the
module that owns the knowledge, imported here), give it what it reads through `StageContext`,
and add it to `STAGES` where it belongs in the order; `stores=True` if it writes the store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from jobdiagd.alerts import notices
from jobdiagd.alerts.pipeline import AlertPipeline, Within
from jobdiagd.detectors import Report, keep_resolution
from jobdiagd.logsetup import get_logger
from jobdiagd.model.alerts import Finding, Notification
from jobdiagd.model.kinds import IncidentKind
from jobdiagd.service.jobs import JobView
from jobdiagd.service.tsdb_enrich import TsdbEnricher

# (view, incident kind, now) -> bounded JSON-ready inputs of the incident's picture, or None.
PlotInputs = Callable[[JobView, str, float], dict[str, Any] | None]
PLOTTED_KINDS = frozenset({IncidentKind.HANG, IncidentKind.TGS_DEGRADATION})

_log = get_logger(component="engine")


@dataclass
class Batch:
    """One tick's findings and reports on their way to the outbox."""

    findings: list[Finding]
    reports: list[Report]
    ending: list[str] = field(default_factory=list)  # jobs whose end this tick confirms
    queued: list[Notification] = field(default_factory=list)  # what the stages queued
    ok: bool = True  # False: a stage that stores failed, and the path stopped there
    # Work a stage before observe gives it, run inside observe's transaction (`pipeline.observe`).
    within: list[Within] = field(default_factory=list)


class RecoveryStage(Protocol):
    """Recovery's part of the path (`service.recovery_wiring.RecoveryWiring`)."""

    def plan(self, batch: Batch, ctx: StageContext) -> Batch: ...


@dataclass
class StageContext:
    """What the stages read and act through, for one tick."""

    now: float
    views: Mapping[str, JobView]  # every watched job's view as judged, ending jobs included
    pipeline: AlertPipeline
    # The job leaves the watch, saying why (a blind job's "monitoring ended" notice).
    leave: Callable[[str, str, float], None]
    enricher: TsdbEnricher | None = None
    plot_inputs: PlotInputs | None = None
    recovery: RecoveryStage | None = None


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Batch, StageContext], Batch]
    stores: bool = False  # it writes the store: a failure stops the path (module docstring)


def keep_resolutions(batch: Batch, ctx: StageContext) -> Batch:
    batch.findings = [f for f in batch.findings if keep_resolution(ctx.pipeline.book, f)]
    return batch


def stamp(batch: Batch, ctx: StageContext) -> Batch:
    batch.findings = [_stamp(f, ctx) for f in batch.findings]
    return batch


def _stamp(f: Finding, ctx: StageContext) -> Finding:
    """The job's owner and RAY flag and, on the finding that opens a hang or TGS incident, the
    picture's inputs (built only then: a stalled job re-emits every tick)."""
    view = ctx.views.get(f.job_id)
    if view is None:
        return f
    owner = (view.slurm.user or None) if view.slurm is not None else None
    ray = view.logs().ray if view.main is not None else False
    plot = None
    if ctx.plot_inputs is not None and not f.resolved and f.kind in PLOTTED_KINDS:
        inc = ctx.pipeline.book.get(f.job_id, f.kind)
        if inc is None or inc.announced_at is None:
            try:
                plot = ctx.plot_inputs(view, f.kind, ctx.now)
            except Exception as exc:  # a picture is optional; the page is not
                _log.warning("plot_inputs_failed", job_id=f.job_id, error=f"{type(exc).__name__}: {exc}")
    if owner == f.owner and ray == f.ray and plot is None:
        return f
    return replace(f, owner=owner, ray=ray, plot=plot)


def enrich_or_hold(batch: Batch, ctx: StageContext) -> Batch:
    e = ctx.enricher
    if e is not None:
        batch.findings = e.enrich_findings(batch.findings, ctx.views, ctx.now)
        batch.reports = e.hold_reports(batch.reports, ctx.views, ctx.now) + e.ready_reports()
    return batch


def slow_host(batch: Batch, ctx: StageContext) -> Batch:
    if ctx.enricher is not None:
        hold = ctx.enricher.slow
        hold.retain(ctx.views)
        batch.findings = hold.hold_tgs(batch.findings, ctx.views, ctx.now, ctx.pipeline.book)
    return batch


def plan_recovery(batch: Batch, ctx: StageContext) -> Batch:
    return ctx.recovery.plan(batch, ctx) if ctx.recovery is not None else batch


def observe(batch: Batch, ctx: StageContext) -> Batch:
    work = list(batch.within)
    within = (lambda now: [n for w in work for n in w(now)]) if work else None
    batch.queued += ctx.pipeline.observe(batch.findings, ctx.now, within)
    return batch


def end_jobs(batch: Batch, ctx: StageContext) -> Batch:
    for key in batch.ending:
        state = ctx.views[key].end_state or "UNKNOWN"
        ctx.leave(key, notices.why_ended(state), ctx.now)
        batch.queued += ctx.pipeline.job_ended(key, state, ctx.now)
        _log.info("job_ended", job_id=key, state=state)
    return batch


def enqueue(batch: Batch, ctx: StageContext) -> Batch:
    for r in batch.reports:
        batch.queued += ctx.pipeline.report(
            r.job_id, r.kind, r.key, r.title, r.body, ctx.now, owner=_owner(ctx.views, r.job_id)
        )
    return batch


def _owner(views: Mapping[str, JobView], job_id: str) -> str | None:
    view = views.get(job_id)
    return view.slurm.user if view is not None and view.slurm is not None else None


STAGES: tuple[Stage, ...] = (
    Stage("keep resolution", keep_resolutions),
    Stage("stamp", stamp),
    Stage("enrich or hold", enrich_or_hold),
    Stage("slow host", slow_host),
    Stage("recovery", plan_recovery),
    Stage("observe", observe, stores=True),
    Stage("end jobs", end_jobs, stores=True),
    Stage("enqueue", enqueue, stores=True),
)


def run_stages(batch: Batch, ctx: StageContext, stages: Sequence[Stage] = STAGES) -> Batch:
    """The batch through every stage, in order (module docstring: failures)."""
    for stage in stages:
        try:
            batch = stage.run(batch, ctx)
        except Exception as exc:
            if not stage.stores:
                raise
            batch.ok = False
            _log.error("incident_update_failed", error=f"{type(exc).__name__}: {exc}")
            break
    return batch
