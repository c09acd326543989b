"""The per-job series of `/metrics`, read at scrape time from the watched jobs (rules GP-11, GP-12).

`JobMetrics.samples(now)` makes one `service.metrics.JobSample` per watched job from what the
daemon already holds, the objects `jobdiagd status` reads (`Engine.snapshot_jobs`):

- step, and when it was read: the job view (`last_step`, `last_step_at`);
- step time and the stall budget: the hang detector's budget memo (the budget it applies to the
  current step; none before its first check of the job, and none for a job it does not judge:
  ended, not running, unreadable, past its final step); the expected step from them as
  `jobdiagd status` projects it (rule PRJ-4);
- stall seconds: since the last step was read (before the first: since the pre-training barrier
  or since the job was first seen), as the hang detector counts it (`hang.stall_since`);
- TGS: the tokens/s/device of the last step's record;
- ETA: the remaining steps at the steady step time (`triage.progress.eta_seconds`, as triage);
- open incidents by kind: the incident book;
- goodput so far: `goodput.live.live_numbers` over the job's triage (rule GP-12).

Everything but goodput costs a few dictionary reads per job. Goodput needs the job's triage (the
view's `analysis`, a pass over its parsed logs when lines were read since the last one) and a
pass over its kept step records, so it is kept per job and refreshed at scrape time at most every
`GOODPUT_REFRESH_S`, and at most `MAX_GOODPUT_PER_SCRAPE` jobs a scrape (the stalest first; a
job's first refresh back-dated by a per-job offset, so many jobs' refreshes spread out): a
scrape's cost stays bounded whatever the jobs (bench/bench_daemon.py measures it at 1000).
Nothing is computed when nobody scrapes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.detectors.base import staggered
from jobdiagd.detectors.hang import HangDetector, stall_since
from jobdiagd.goodput.live import LiveNumbers, live_numbers
from jobdiagd.logsetup import get_logger
from jobdiagd.service.engine import Engine
from jobdiagd.service.jobs import JobView
from jobdiagd.service.metrics import JobSample
from jobdiagd.triage.progress import eta_seconds

GOODPUT_REFRESH_S = 300.0
MAX_GOODPUT_PER_SCRAPE = 10


@dataclass(frozen=True, slots=True)
class _Goodput:
    at: float  # when it was computed (a first one back-dated: `staggered`)
    numbers: LiveNumbers


def labels(view: JobView) -> tuple[str, str]:
    """(user, partition): Slurm's record, else the job's environment dump, else empty."""
    if view.slurm is not None:
        return view.slurm.user, view.slurm.partition
    env = view.main.env if view.main is not None else {}
    return env.get("SLURM_JOB_USER", ""), env.get("SLURM_JOB_PARTITION", "")


def last_tgs(view: JobView) -> float | None:
    """Tokens/s/device of the job's last step (its record in the authoritative log)."""
    last = view.last_step
    auth = view.authoritative() if last is not None else None
    if auth is None or last is None:
        return None
    rec = auth.steps.get(last)
    return rec.tgs if rec is not None else None


class JobMetrics:
    """Builds the per-job samples of a scrape; keeps each job's goodput between refreshes."""

    def __init__(
        self,
        engine: Engine,
        pipeline: AlertPipeline,
        *,
        refresh_s: float = GOODPUT_REFRESH_S,
        per_scrape: int = MAX_GOODPUT_PER_SCRAPE,
    ) -> None:
        self.engine = engine
        self.pipeline = pipeline
        self.refresh_s = refresh_s
        self.per_scrape = per_scrape
        self._goodput: dict[str, _Goodput] = {}
        self._log = get_logger(component="metrics")

    def samples(self, now: float) -> list[JobSample]:
        jobs = {key: w.view for key, w in self.engine.jobs.items()}
        for gone in self._goodput.keys() - jobs.keys():
            del self._goodput[gone]  # left the watch: its series go, and so does its memo
        self._refresh_goodput(jobs, now)
        hang = next((d for d in self.engine.detectors if isinstance(d, HangDetector)), None)
        open_by_job: dict[str, Counter[str]] = {}
        for inc in self.pipeline.book.open_incidents():
            open_by_job.setdefault(inc.job_id, Counter())[inc.kind] += 1
        return [self._sample(v, hang, open_by_job.get(k, {}), now) for k, v in sorted(jobs.items())]

    def _sample(
        self, view: JobView, hang: HangDetector | None, incidents: Mapping[str, int], now: float
    ) -> JobSample:
        user, partition = labels(view)
        memo = hang.budget_state(view.key) if hang is not None else None
        since = stall_since(view) if hang is not None else None
        step_time = memo.step_time if memo is not None else None
        last, at = view.last_step, view.last_step_at
        expected = None
        if last is not None and at is not None and step_time:
            expected = last + int(max(0.0, now - at) // step_time)  # as `jobdiagd status` (hang._status)
        good = self._goodput.get(view.key)
        g = good.numbers if good is not None else None
        return JobSample(
            job_id=view.key,
            user=user,
            partition=partition,
            step=last,
            step_time_s=step_time,
            tokens_per_s_device=last_tgs(view),
            expected_step=expected,
            stall_s=max(0.0, now - since) if since is not None else None,
            stall_budget_s=memo.budget.seconds if memo is not None and since is not None else None,
            eta_s=eta_seconds(view.total_steps(), last, step_time),
            goodput=g.goodput if g is not None else None,
            productive_gpu_s=g.productive_gpu_s if g is not None and g.goodput is not None else None,
            allocated_gpu_s=g.allocated_gpu_s if g is not None and g.goodput is not None else None,
            open_incidents=dict(incidents),
        )

    def _refresh_goodput(self, jobs: Mapping[str, JobView], now: float) -> None:
        """Refresh the stalest goodputs due (never computed first), at most `per_scrape` of them."""
        due = [
            (self._goodput[k].at if k in self._goodput else float("-inf"), k)
            for k, v in jobs.items()
            if v.main is not None and (k not in self._goodput or now - self._goodput[k].at >= self.refresh_s)
        ]
        for _, key in sorted(due)[: self.per_scrape]:
            view = jobs[key]
            try:
                numbers = job_goodput(view, now)
            except Exception as exc:  # one job's odd log must not cost the scrape
                self._log.warning("job_goodput_failed", job_id=key, error=f"{type(exc).__name__}: {exc}")
                continue
            at = now if key in self._goodput else staggered(now, key, self.refresh_s)
            self._goodput[key] = _Goodput(at, numbers)


def job_goodput(view: JobView, now: float) -> LiveNumbers:
    """The live numbers of a watched job from its triage (the final one once it ended): its run
    from Slurm's start (else its first dated step, rule GP-12) to now."""
    res = view.final if view.final is not None else view.analysis(now)
    start = view.slurm.start_time if view.slurm is not None else None
    return live_numbers(res, now=now, start=start, key=view.key)
