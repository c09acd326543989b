"""The daemon's edge to the per-job Prometheus: the GPU-hang judge's verdict on hang alerts
of live RAY=1 jobs (`tsdb.hang_verdict.hang_power_verdict`: the one judge of rule HANG-GPU, the one the
early page asks; with the last hour of per-host GPU power/utilization for the alert's picture,
fetched in the same session), and the class playbook in the job-end report of failed RAY=1 jobs.

Queries run as tasks beside the tick, never inside it. A hang finding of a RAY=1 job is held
until its verdict is in — at most one tick, because the verdict query's timeout is shorter
than a tick — and then goes out carrying it. With `[tsdb] confirm_hang_with_power`, a verdict
that denies the hang (`training`, `not-a-hang`: the GPUs work or pause) keeps it from paging,
and the verdict is asked again on the next tick (a denial is two scrapes' worth of evidence, not
a lasting one); a verdict that cannot tell (`mixed`, `no-process`, `no-data`: no Prometheus, ssh
down, stale metrics) never suppresses a page — lack of evidence is not health (rule HANG-9). A
failed RAY=1 job's end report is likewise held until its playbook ran
(bounded by `report_timeout_s`), then sent as one message.

A hang finding that the early page already confirmed from the GPUs (`Finding.gpu_confirmed`,
evidence from `service.early_page`, which shares this ssh tunnel pool) goes
out at once with the evidence it carries: holding it for a second verdict would undo the
early page.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobdiagd.detectors import Report
from jobdiagd.logsetup import get_logger
from jobdiagd.model.alerts import Finding
from jobdiagd.model.kinds import GpuHangState, IncidentKind, JobStatus
from jobdiagd.service.early_page import EarlyConfirmer, QueryFn
from jobdiagd.service.host_compare import DEFAULT_RECENT_STEPS, SlowHostHold
from jobdiagd.service.jobs import JobView
from jobdiagd.service.plots_bridge import strip_payload
from jobdiagd.service.site_source import SiteJobs
from jobdiagd.tsdb.access import SshTunnelPool
from jobdiagd.tsdb.context import DiagnosisContext, context_from_result
from jobdiagd.tsdb.gpu_hang import GpuVerdict
from jobdiagd.tsdb.hang_verdict import hang_power_verdict, should_page
from jobdiagd.tsdb.job_end import job_end_diagnosis
from jobdiagd.tsdb.settings import TsdbSettings

# The hang alert's power strip: the last hour of per-host GPU power and utilization.
STRIP_S = 3600.0

VerdictFn = Callable[[DiagnosisContext, float], Coroutine[Any, Any, GpuVerdict]]
DiagnosisFn = Callable[[DiagnosisContext, float], Coroutine[Any, Any, dict[str, Any] | None]]


@dataclass
class _Pending:
    at_step: int | None
    task: asyncio.Task[GpuVerdict]


@dataclass
class _HeldReport:
    report: Report
    task: asyncio.Task[dict[str, Any] | None]


class TsdbEnricher:
    def __init__(
        self,
        settings: TsdbSettings,
        *,
        tick_s: float,
        verdict_fn: VerdictFn | None = None,
        diagnosis_fn: DiagnosisFn | None = None,
        report_timeout_s: float = 120.0,
        early_fn: QueryFn | None = None,
        recent_steps: int = DEFAULT_RECENT_STEPS,
    ) -> None:
        self.settings = settings
        self.tunnels = SshTunnelPool(settings.ssh)
        # The early page shares the tunnel pool: one ssh connection per head node for both.
        self.early: EarlyConfirmer | None = (
            EarlyConfirmer(settings, self.tunnels, query_fn=early_fn) if settings.early_page else None
        )
        # The verdict must be back before the next tick, so a held hang alert waits one tick at most.
        timeout = max(1.0, min(20.0, tick_s * 0.8))
        self._verdict_fn: VerdictFn = verdict_fn or (
            lambda ctx, now: hang_power_verdict(
                ctx, now, settings=settings, tunnels=self.tunnels, timeout_s=timeout, strip_s=STRIP_S
            )
        )
        self._diagnosis_fn: DiagnosisFn = diagnosis_fn or (
            lambda ctx, now: job_end_diagnosis(ctx, now, settings=settings, timeout_s=report_timeout_s)
        )
        self._verdicts: dict[str, _Pending] = {}
        self._reports: dict[str, _HeldReport] = {}
        # The end-of-job diagnoses of the reports released (job -> its JSON document), until the
        # recovery stage takes them for node memory (`service.recovery_wiring`).
        self.diagnoses: dict[str, dict[str, Any]] = {}
        # The site Prometheus ([site_prometheus]): the early page's second source, the slow host's
        # first (`service.site_source`); opened and closed by the runner beside this enricher.
        self.site: SiteJobs | None = None
        # The `slow host` stage: a TGS page held for its host comparison, on the site Prometheus
        # or a live RAY=1 job's own (`service.host_compare`, rules SLOW-5, SLOW-6).
        self.slow = SlowHostHold(settings, self.tunnels, tick_s=tick_s, recent_steps=recent_steps)
        self._log = get_logger(component="tsdb")

    def use_site(self, site: SiteJobs | None) -> None:
        """The checked site source (None: not configured, or not usable) for the early page and the
        slow-host stage."""
        self.site = site
        self.slow.site = site
        if self.early is not None:
            self.early.site = site

    # -- hang findings ---------------------------------------------------------------------
    def enrich_findings(
        self, findings: Sequence[Finding], views: Mapping[str, JobView], now: float
    ) -> list[Finding]:
        out: list[Finding] = []
        for f in findings:
            view = views.get(f.job_id)
            if f.kind != IncidentKind.HANG or view is None:
                out.append(f)
                continue
            if f.resolved:
                self._forget(f.job_id)
                out.append(f)
                continue
            if f.gpu_confirmed:
                out.append(f)  # GPU-confirmed already: page now
                continue
            res = view.analysis(now)
            if not (res.ray and res.live.head_node):
                out.append(f)  # no per-job Prometheus to ask
                continue
            pending = self._verdicts.get(f.job_id)
            if pending is None or pending.at_step != f.at_step:
                self._ask(f, context_from_result(res), now)
                continue  # held: goes out with its verdict on the next tick
            if not pending.task.done():
                continue
            verdict = _result(pending.task)
            if not should_page(verdict, self.settings):
                self._log.info("hang_denied_by_gpus", job_id=f.job_id, gpu_state=verdict.state)
                self._ask(f, context_from_result(res), now)  # held; the next tick judges newer samples
                continue
            out.append(self._with_strip(_with_verdict(f, verdict), verdict, view))
        return out

    def _ask(self, f: Finding, ctx: DiagnosisContext, now: float) -> None:
        self._forget(f.job_id)
        task: asyncio.Task[GpuVerdict] = asyncio.get_running_loop().create_task(self._verdict_fn(ctx, now))
        self._verdicts[f.job_id] = _Pending(f.at_step, task)

    # -- job-end reports -------------------------------------------------------------------
    def hold_reports(
        self, reports: Sequence[Report], views: Mapping[str, JobView], now: float
    ) -> list[Report]:
        """Start the playbook for failed RAY=1 jobs' end reports; return the reports to send now."""
        out: list[Report] = []
        for r in reports:
            view = views.get(r.job_id)
            res = (view.final or view.analysis(now)) if view is not None else None
            failed = res is not None and res.status != JobStatus.COMPLETED and res.primary is not None
            if r.kind != IncidentKind.JOB_END or res is None or not failed or not res.ray:
                out.append(r)
                continue
            held: asyncio.Task[dict[str, Any] | None] = asyncio.get_running_loop().create_task(
                self._diagnosis_fn(context_from_result(res), now)
            )
            self._reports[r.job_id] = _HeldReport(r, held)
        return out

    def ready_reports(self) -> list[Report]:
        """Held job-end reports whose playbook finished (or failed), with the diagnosis appended."""
        out: list[Report] = []
        for job_id, held in list(self._reports.items()):
            if not held.task.done():
                continue
            del self._reports[job_id]
            try:
                doc = held.task.result()
            except Exception as exc:  # the report must still go out
                doc = {"error": f"{type(exc).__name__}: {exc}"}
            out.append(dataclasses.replace(held.report, body=held.report.body + _diagnosis_section(doc)))
            if doc is not None:
                self.diagnoses[job_id] = doc  # what the playbook named: the recovery stage takes it
        return out

    def _with_strip(self, f: Finding, verdict: GpuVerdict, view: JobView) -> Finding:
        """A page's picture inputs gain the hour of per-host GPU power/utilization the verdict fetched."""
        if f.plot is None or verdict.strip is None:
            return f
        try:
            strip = strip_payload(verdict.strip, view, self.settings, verdict.gpu_model)
        except Exception as exc:  # the page goes out with its step chart alone
            self._log.warning("power_strip_failed", job_id=f.job_id, error=f"{type(exc).__name__}: {exc}")
            return f
        return dataclasses.replace(f, plot={**f.plot, "strip": strip})

    def _forget(self, job_id: str) -> None:
        pending = self._verdicts.pop(job_id, None)
        if pending is not None:
            pending.task.cancel()

    async def close(self) -> None:
        await self.slow.close()
        if self.early is not None:
            await self.early.close()
        for pending in self._verdicts.values():
            pending.task.cancel()
        for held in self._reports.values():
            held.task.cancel()
        await self.tunnels.close()


def _result(task: asyncio.Task[GpuVerdict]) -> GpuVerdict:
    try:
        return task.result()
    except asyncio.CancelledError:
        return GpuVerdict(GpuHangState.NO_DATA, "verdict query cancelled")
    except Exception as exc:
        return GpuVerdict(GpuHangState.NO_DATA, f"verdict query failed: {type(exc).__name__}: {exc}")


def _with_verdict(f: Finding, v: GpuVerdict) -> Finding:
    details = dict(f.details)
    details["GPU verdict"] = v.summary
    if v.per_host:
        details["GPU state per host"] = "; ".join(f"{h}: {s}" for h, s in sorted(v.per_host.items()))
    return dataclasses.replace(f, details=details)


def _diagnosis_section(doc: dict[str, Any] | None) -> str:
    if doc is None:
        return ""
    if "error" in doc:
        return f"\n### TSDB diagnosis\nThe playbook could not run: {doc['error']}\n"
    lines = ["", f"### TSDB diagnosis ({doc.get('analysis_type', 'playbook')})"]
    lines.append(f"**Verdict:** {doc.get('verdict')}; root cause: {doc.get('root_cause') or 'n/a'}")
    hosts = doc.get("anomalous_hosts") or []
    if hosts:
        lines.append(f"**Anomalous hosts:** {', '.join(map(str, hosts))}")
    for finding in (doc.get("findings") or [])[:6]:
        text = finding.get("summary") if isinstance(finding, dict) else finding
        lines.append(f"- {text if isinstance(text, str) else json.dumps(text, default=str)[:300]}")
    return "\n".join(lines) + "\n"
