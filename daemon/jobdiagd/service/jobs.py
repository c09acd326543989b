"""JobView: what the daemon knows about one watched job (Slurm record, files, parsed logs, step arrival times).

The engine (and the backtest replay) owns and updates it; detectors read it through
`detectors.base.WatchedJob`, the part of it they may see.

One view of a live job (rules VIEW-1, VIEW-2): the view's triage (`analysis`) is what every
reader of the job gets — the hang and failure detectors, the early page, the TSDB enrichment,
`/job`. It is `analyze()` given the daemon's stall policy (`policy`, set by the engine from the
config) and the daemon's knowledge of the job's progress (`stall_source`: the hang detector's
`knowledge`, wired by the engine), and the cache is keyed by both: a reload with a new policy,
a new budget, or the stall crossing its budget never serves an analysis made before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jobdiagd.detectors.base import EarlyMemo
from jobdiagd.logs.job import JobLogs
from jobdiagd.logs.state import LogState
from jobdiagd.logs.steps import HistoryPoint
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.records import StepRecord
from jobdiagd.model.stepguard import StepGuard
from jobdiagd.model.triage import CheckpointConfig, StallKnowledge, TriageResult
from jobdiagd.rules.maxtext import int_setting
from jobdiagd.sources.slurm_parse import SlurmJob
from jobdiagd.triage.engine import analyze
from jobdiagd.triage.progress import checkpoint_config, steady_step_time
from jobdiagd.triage.stall import StallPolicy

# Arrival times are only needed for the newest steps (the hang projection uses the last one);
# older ones are dropped so a week-long job does not grow the view.
MAX_ARRIVALS = 256
# A cached triage is reused while nothing new was read, but never longer than this.
ANALYSIS_MAX_AGE_S = 300.0


@dataclass
class JobView:
    """Mutable, owned by the engine (or the backtest replay); detectors only read it.

    Times (`first_seen`, `arrivals`, `marker_at`) are on the daemon's clock: when the daemon
    *read* the line, never the log's own timestamps or the file's mtime.
    """

    key: str  # job id as used in incidents (Slurm id, k8s/local id, or the dir name)
    ref: JobRef
    first_seen: float
    slurm: SlurmJob | None = None
    main: LogState | None = None
    workers: dict[str, list[LogState]] = field(default_factory=dict)  # head host -> worker logs
    head_host: str | None = None
    arrivals: dict[int, float] = field(default_factory=dict)  # step -> when first read
    marker_at: float | None = None  # when the pre-training barrier line was read
    ended: bool = False
    end_state: str | None = None  # final Slurm state or "SUMMARY" (static mode)
    blind: dict[str, str] = field(default_factory=dict)  # path -> error, while unreadable
    # Bumped whenever new lines were folded into any state (caches key on it).
    version: int = 0
    policy: StallPolicy | None = None  # the daemon's stall policy (from [detectors.hang])
    # What the daemon knows of the job's progress (the hang detector's `knowledge`), if anyone does.
    stall_source: Callable[[JobView, float], StallKnowledge | None] | None = None
    _seen_step_lines: int = -1
    _seen_max_step: int = -1
    _auth_source: str | None = None
    _analysis: tuple[tuple[Any, ...], float, TriageResult] | None = None
    final: TriageResult | None = None  # full re-read at job end (set by the engine)
    step_guard: StepGuard = field(default_factory=StepGuard)  # implausible steps kept out of progress
    # The early page's GPU verdict (`service.early_page`, or the backtest's); the hang detector reads it.
    gpu_check: EarlyMemo | None = None
    # Caches of values derived from the states, each with the key it was computed for.
    _ckpt: tuple[Any, CheckpointConfig] | None = None
    _steps: tuple[Any, list[StepRecord]] | None = None
    _total: tuple[str | None, int | None] | None = None

    # -- reading -----------------------------------------------------------

    @property
    def job_id(self) -> str:
        return self.key

    @property
    def states(self) -> list[LogState]:
        out = [self.main] if self.main is not None else []
        for sts in self.workers.values():
            out.extend(sts)
        return out

    def logs(self) -> JobLogs:
        return JobLogs(ref=self.ref, main=self.main, workers=self.workers, head_host=self.head_host)

    def is_ray(self) -> bool:
        """RAY=1 as triage reads it (`JobLogs.ray`): the jobs an early page may ask the GPUs about."""
        return self.logs().ray

    def authoritative(self) -> LogState | None:
        if not self.workers:
            return self.main  # what JobLogs.authoritative() answers without worker logs, for free
        return self.logs().authoritative()

    @property
    def slurm_state(self) -> str | None:
        return self.slurm.state if self.slurm is not None else None

    def presumed_state(self) -> str | None:
        """Slurm's state when known; a watched job without Slurm is presumed RUNNING until it ends."""
        if self.slurm is not None:
            return self.slurm.state
        if self.ended:
            return None
        return "RUNNING"

    @property
    def last_step(self) -> int | None:
        return self._seen_max_step if self._seen_max_step >= 0 else None

    @property
    def last_step_at(self) -> float | None:
        s = self.last_step
        return self.arrivals.get(s) if s is not None else None

    def version_steps(self) -> int:
        """Changes whenever a step line was read (caches of step-derived values key on it)."""
        return self._seen_step_lines

    @property
    def summary_seen(self) -> bool:
        return (
            self.main is not None
            and self.main.summary is not None
            and self.main.summary.exit_code is not None
        )

    def checkpoint(self) -> CheckpointConfig:
        """Checkpoint config from the header/config/saves seen so far (cached until they change)."""
        states = self.states
        key = (
            len(states),
            sum(len(st.config) for st in states),
            sum(st.saves_seen for st in states),  # a tailed state trims old saves: count, not size
            sum(len(st.profiler_steps) for st in states),
            self.main.header.get("PASSTHROUGH_ARGS") if self.main is not None else None,
        )
        cached = self._ckpt
        if cached is not None and cached[0] == key:
            return cached[1]
        main = self.main
        passthrough = main.passthrough() if main is not None else {}
        config: dict[str, str] = {}
        saves: set[int] = set()
        profiled: set[int] = set()
        async_seen = False
        for st in states:
            for k, v in st.config.items():
                config.setdefault(k, v)
            saves |= set(st.saves) | st.async_saves
            profiled |= st.profiler_steps
            async_seen = async_seen or bool(st.async_saves)
        ck = checkpoint_config(
            passthrough, config, sorted(saves), async_seen=async_seen, profiler_steps=sorted(profiled)
        )
        self._ckpt = (key, ck)
        return ck

    def sorted_steps(self) -> list[StepRecord]:
        """The authoritative state's `sorted_steps()`, built once per new step line (detectors share it)."""
        cached = self._steps
        suspects = self.step_guard.suspects
        key = (self._auth_source, self._seen_step_lines, len(suspects))
        if cached is not None and cached[0] == key:
            return cached[1]
        auth = self.authoritative()
        steps = auth.sorted_steps() if auth is not None else []
        if suspects:
            steps = [r for r in steps if r.step not in suspects]
        self._steps = (key, steps)
        return steps

    def step_history(self) -> list[HistoryPoint]:
        """The whole run's step time and tokens/s, down-sampled to a few thousand points at most,
        with checkpoint/eval/profiler steps marked (for plots)."""
        auth = self.authoritative()
        return auth.steps.history(self.checkpoint().marks) if auth is not None else []

    def step_time(self) -> float | None:
        steps = self.sorted_steps()
        return steady_step_time(steps, self.checkpoint()) if steps else None

    def total_steps(self) -> int | None:
        main = self.main
        raw = main.header.get("PASSTHROUGH_ARGS") if main is not None else None
        cached = self._total
        if cached is not None and cached[0] == raw:
            return cached[1]
        value = main.passthrough().get("steps") if main is not None and raw else None
        total = int_setting(value) if value else None
        self._total = (raw, total)
        return total

    # -- updating ----------------------------------------------------------

    def note_read(self, now: float) -> bool:
        """Record arrival times of steps read since the last call; True when there were new steps."""
        self.version += 1
        main = self.main
        if self.marker_at is None and main is not None and main.barrier_passed is not None:
            self.marker_at = now
        auth = self.authoritative()
        if auth is None:
            return False
        new_source = auth.source != self._auth_source
        if new_source:
            self._auth_source = auth.source
            self._seen_step_lines = -1
        if auth.step_lines == self._seen_step_lines:
            return False
        self._seen_step_lines = auth.step_lines
        if not auth.steps:
            return False
        top = getattr(auth.steps, "max_step", None)
        if not isinstance(top, int) or top < 0:
            top = max(auth.steps)
        steps = auth.steps
        top = self.step_guard.newest(
            top,
            lambda: steps,
            prev=-1 if new_source else self._seen_max_step,
            prev_at=None if new_source else self.last_step_at,
            now=now,
            total=self.total_steps(),
            step_time=self.step_time,
        )
        if top <= self._seen_max_step:
            return False
        # Every number up to the new top gets this arrival time (a missing one is harmless: only
        # steps that exist are ever looked up), without touching the step records themselves.
        for step in range(max(self._seen_max_step + 1, top - MAX_ARRIVALS), top + 1):
            self.arrivals.setdefault(step, now)
        self._seen_max_step = top
        if len(self.arrivals) > MAX_ARRIVALS:
            for old in sorted(self.arrivals)[: len(self.arrivals) - MAX_ARRIVALS]:
                del self.arrivals[old]
        return True

    def restore_arrival(self, step: int, at: float) -> None:
        """After a restart: the step was already read before (at `at`), keep that time."""
        if step in self.arrivals and at < self.arrivals[step]:
            self.arrivals[step] = at

    def reset_steps(self) -> None:
        """The log was replaced (rotation/truncation): forget what was learned about steps."""
        self._seen_step_lines = -1
        self._seen_max_step = -1
        self._auth_source = None
        self.arrivals.clear()
        self.step_guard.clear()
        self.version += 1

    # -- analysis ----------------------------------------------------------

    def stall_knowledge(self, now: float) -> StallKnowledge | None:
        """What the daemon knows of the job's progress now (None: no hang detector judges it)."""
        return self.stall_source(self, now) if self.stall_source is not None else None

    def analysis(self, now: float, stall: StallKnowledge | None = None) -> TriageResult:
        """`analyze()` on the current states with the daemon's policy and knowledge (`stall`, else
        the view's `stall_source`), cached while nothing it depends on changed (bounded age)."""
        state = self.presumed_state()
        known = stall if stall is not None else self.stall_knowledge(now)
        # The knowledge keys the cache with its verdict now: a stall crossing its budget is news.
        verdict = None if known is None else (known, known.stalled(now))
        key = (self.version, state, self.policy, verdict)
        cached = self._analysis
        if cached is not None and cached[0] == key and now - cached[1] < ANALYSIS_MAX_AGE_S:
            return cached[2]
        result = analyze(
            self.logs(),
            now=now,
            slurm_state=state,
            policy=self.policy,
            ignore_steps=self.step_guard.suspects,
            stall=known,
        )
        self._analysis = (key, now, result)
        return result
