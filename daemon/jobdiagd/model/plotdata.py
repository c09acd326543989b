"""Plain inputs of the alert pictures (step chart, GPU power strip), shared by the daemon, chat and tsdb fetchers.

They live on the bottom floor, not next to the renderer in `chat/plots.py`, because the tsdb
layer (`tsdb/gpu_strip.py`) builds `HostSeries` and may not import upward into chat/.
`chat.plots` re-exports every name, so callers import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class MarkKind(StrEnum):
    """The incident a step chart marks, in the chart's own words (not `kinds.IncidentKind`: "tgs" is
    the TGS slide). Stored in the outbox with the picture inputs, so the values stay as they are."""

    HANG = "hang"
    TGS = "tgs"


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One training step: its `seconds:` and `Tokens/s/device:` (None when the line lacked it)."""

    step: int
    seconds: float | None
    tokens_per_s: float | None


@dataclass(frozen=True, slots=True)
class IncidentMarks:
    """What the picture must make obvious about the incident.

    hang: `start_step` is the last step read, `projected_step` where training should be by now
    (the gap between them is the stall), `stalled_s` how long no step came.
    tgs: `start_step` is where the slide began, `baseline`/`degraded` the two levels of the
    throughput metric and `change_pct` the change between them; `baseline_steps` the window
    the baseline was measured on.
    """

    kind: MarkKind
    start_step: int | None
    projected_step: int | None = None
    stalled_s: float | None = None
    step_time_s: float | None = None
    baseline: float | None = None
    degraded: float | None = None
    change_pct: float | None = None
    baseline_steps: tuple[int, int] | None = None
    pattern: str | None = None


@dataclass(frozen=True, slots=True)
class StepChart:
    """Step time and throughput over steps, with checkpoints, evals and the incident marked.

    `throughput_unit` is "tokens/s/device", or "steps/s" for logs without Tokens/s/device
    (then `StepPoint.tokens_per_s` carries 1/seconds, as triage's TGS analysis does).
    """

    title: str
    points: tuple[StepPoint, ...]
    marks: IncidentMarks | None = None
    checkpoints: tuple[int, ...] = ()
    evals: tuple[int, ...] = ()
    subtitle: str | None = None
    throughput_unit: str = "tokens/s/device"
    checkpoint_label: str = "checkpoint"
    eval_label: str = "eval"


@dataclass(frozen=True, slots=True)
class HostSeries:
    """One host's GPU metric over time: the mean over its GPUs and, when known, their min and max.

    `times` are epoch seconds; NaN in `mean` is a time without a sample (host silent).
    `low`/`high` are empty or as long as `times`.
    """

    host: str
    times: tuple[float, ...]
    mean: tuple[float, ...]
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()
    gpus: int | None = None


@dataclass(frozen=True, slots=True)
class PowerBands:
    """Per-GPU power bands of one GPU model (tsdb settings' `GpuProfile`), in watts."""

    gpu_model: str
    idle_max_w: float
    busy_wait_w: tuple[float, float]
    train_w: tuple[float, float]
    busy_util_pct: float = 90.0


@dataclass(frozen=True, slots=True)
class PowerStrip:
    """Per-host GPU power and utilization over a window (RAY=1 jobs), power bands shaded.

    `power` and `util` may name hosts differently (old Ray exporters label utilization by IP
    only), so each panel has its own list. `since` marks when the incident began (the last
    step read), `start`/`end` the window (epoch seconds).
    """

    title: str
    power: tuple[HostSeries, ...]
    util: tuple[HostSeries, ...]
    bands: PowerBands
    start: float
    end: float
    since: float | None = None
    since_label: str = "last step"
    subtitle: str | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StripPanel:
    """One metric of a host strip: its name, unit and one series per host."""

    label: str
    unit: str
    series: tuple[HostSeries, ...]


@dataclass(frozen=True, slots=True)
class HostStrip:
    """Each host of a job over a TGS slide's window, one panel per metric (the slow-host judge's
    evidence, `tsdb.slow_host`): the `named` hosts drawn on their own, their peers as one median
    line with their min-max band. `start`/`end` are the window (epoch seconds)."""

    title: str
    panels: tuple[StripPanel, ...]
    named: tuple[str, ...]
    start: float
    end: float
    subtitle: str | None = None
    notes: tuple[str, ...] = ()
