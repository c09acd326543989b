"""Training progress projection (runbook workflow step 5), pure.

Decisions (rules PRJ-3, PRJ-4, PRJ-5, PRJ-6 of docs/rules.md):
- checkpoint period: `Config param checkpoint_period`, else PASSTHROUGH_ARGS, else 200 when
  `enable_checkpointing=true`, else the spacing of the periodic saves seen in the log; None
  when nothing says checkpointing was on.
- steady-state step time: mean `seconds:` of the last 50 steps that are past warmup
  (first 5 steps of the run) and not checkpoint-adjacent (k·P, k·P+1, and k·P+2 with async
  checkpointing); falls back to every step but the first when that leaves nothing.
- "expected step": uses `at_time` (now for a live job; the end of the job for a finished
  one when the log dates it) and the wall-clock time of the last step line; None when the
  log carries no timestamps.
- progress lost, in seconds: on long runs the step records are a bounded sample, while the
  training time is the exact sum. When the lost steps are the whole run, their time *is* that
  exact sum; otherwise it is summed over the kept records when they cover every lost step, and
  else estimated as their mean times the number of lost steps (marked as an estimate), so it
  can no longer be a fraction of what the run actually lost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from jobdiagd.model.records import RestoreLine, StepRecord
from jobdiagd.model.triage import CheckpointConfig, Progress
from jobdiagd.rules.maxtext import DEFAULT_CHECKPOINT_PERIOD, int_setting, truthy

WARMUP_STEPS = 5
STEADY_WINDOW = 50


def _int_setting(passthrough: dict[str, str], config: dict[str, str], key: str) -> int | None:
    for src in (config, passthrough):
        value = int_setting(src.get(key))
        if value is not None:
            return value
    return None


def period_from_saves(saves: list[int]) -> int | None:
    """The checkpoint period the saves follow: the most common gap between consecutive saves,
    when at least two thirds of the saves are its multiples (a final save at the last step is
    off the grid). None with fewer than two saves."""
    steps = sorted(set(saves))
    if len(steps) < 2:
        return None
    gaps = Counter(b - a for a, b in zip(steps, steps[1:], strict=False) if b > a)
    gap = gaps.most_common(1)[0][0] if gaps else 0
    if gap <= 0 or sum(1 for s in steps if s % gap == 0) * 3 < len(steps) * 2:
        return None
    return gap


def checkpoint_config(
    passthrough: dict[str, str],
    config: dict[str, str],
    saves: list[int],
    *,
    async_seen: bool = False,
    profiler_steps: list[int] | None = None,
) -> CheckpointConfig:
    """`async_seen`: the log showed "Started an asynchronous checkpoint save" lines, so saves
    are asynchronous whatever the flags say. `profiler_steps`: the steps the log printed as
    profiler activation/deactivation steps (runbook: "check if the TGS drop coincides with the
    profiler step range"); they give the profiler window when the flags do not."""
    enabled: bool | None = None
    if "enable_checkpointing" in passthrough:
        enabled = truthy(passthrough["enable_checkpointing"])
    elif "enable_checkpointing" in config:
        enabled = truthy(config["enable_checkpointing"])
    period: int | None = None
    for src in (config, passthrough):
        period = int_setting(src.get("checkpoint_period"))
        if period is not None:
            break
    periodic = [s for s in saves if s > 0]
    if period is None and enabled is not False:
        # *The saves the log shows beat the default of 200 (rule PRJ-5): the period may come from
        # the model's config file without ever being printed.
        period = period_from_saves(periodic)
        if period is not None:
            enabled = True
    if period is None and enabled:
        period = DEFAULT_CHECKPOINT_PERIOD
    if enabled is None and periodic:
        enabled = True
    if enabled is False:
        period = None
    asynchronous = async_seen or truthy(
        passthrough.get("async_checkpointing") or config.get("async_checkpointing")
    )
    eval_period = _int_setting(passthrough, config, "eval_interval")
    # MaxText's profiler: active from skip_first_n_steps_for_profiler (default 1) for
    # profiler_steps (default 5) steps; the trace dump slows the step after it too.
    profile: tuple[int, int] | None = None
    if (passthrough.get("profiler") or config.get("profiler") or "").strip("\"' ") not in (
        "",
        "None",
        "none",
    ):
        first = _int_setting(passthrough, config, "skip_first_n_steps_for_profiler")
        first = 1 if first is None else first
        n = _int_setting(passthrough, config, "profiler_steps")
        profile = (first, first + (5 if n is None else n) + 1)
    if profile is None and profiler_steps:
        # The logged activation..deactivation steps; the trace dump slows the step after too.
        profile = (min(profiler_steps), max(profiler_steps) + 1)
    return CheckpointConfig(
        enabled,
        period if period and period > 0 else None,
        asynchronous,
        frozenset(saves) if enabled is not False else frozenset(),
        eval_period if eval_period and eval_period > 0 else None,
        profile,
    )


def steady_steps(steps: list[StepRecord], ckpt: CheckpointConfig, first_step: int) -> list[StepRecord]:
    return [
        s
        for s in steps
        if s.step - first_step >= WARMUP_STEPS and not ckpt.adjacent(s.step) and s.seconds is not None
    ]


def steady_step_time(steps: list[StepRecord], ckpt: CheckpointConfig) -> float | None:
    if not steps:
        return None
    steady = steady_steps(steps, ckpt, steps[0].step)[-STEADY_WINDOW:]
    if not steady:
        steady = [s for s in steps[1:] if s.seconds is not None] or [
            s for s in steps if s.seconds is not None
        ]
    vals = [s.seconds for s in steady if s.seconds is not None and s.seconds > 0]
    return sum(vals) / len(vals) if vals else None


def configured_total(passthrough: dict[str, str], config: dict[str, str]) -> int | None:
    """The run's total steps (`steps=` in PASSTHROUGH_ARGS, else the config), when given."""
    return int_setting(passthrough.get("steps") or config.get("steps") or None)


def eta_seconds(total: int | None, last: int | None, step_time: float | None) -> float | None:
    """Seconds to the last step (`total - 1`) from step `last` at the steady step time."""
    if total is None or last is None or not step_time:
        return None
    return max(0, total - 1 - last) * step_time


def compute_progress(
    steps: list[StepRecord],
    *,
    passthrough: dict[str, str],
    config: dict[str, str],
    restore: RestoreLine | None,
    saves: list[int],
    wall_s: float | None,
    at_time: float | None,
    completed: bool = False,
    summed_seconds: float | None = None,
    time_base: float | None = None,
    run_seconds: float | None = None,
    seconds_after: Callable[[int], float | None] | None = None,
) -> Progress:
    """`summed_seconds` is the exact sum over every step when `steps` is a bounded sample;
    `run_seconds` the exact sum over this run's steps (None when unknown, e.g. after a restart
    within the log); `time_base`, the dated start of training, dates the last step when step
    lines are undated; `seconds_after(step)`, the exact summed seconds after a step when a
    bounded store knows it (`StepSeries.seconds_after`; None: from the records given)."""
    ckpt = checkpoint_config(passthrough, config, saves)
    total = configured_total(passthrough, config)
    first = steps[0].step if steps else None
    last = steps[-1].step if steps else None
    start, restored_from = _run_start(restore, first)
    step_time = steady_step_time(steps, ckpt)
    last_time, estimated = _last_step_time(steps, time_base, summed_seconds)
    expected: int | None = None
    if last is not None and last_time is not None and at_time is not None and step_time:
        expected = last + max(0, int((at_time - last_time) // step_time))
    last_ckpt = _last_periodic_checkpoint(last, ckpt.period)
    lost: int | None = None
    lost_s: float | None = None
    lost_estimated = False
    if last is not None and first is not None:
        if completed:
            lost = 0
        elif last_ckpt is not None:
            lost = last - last_ckpt
        elif start == "restored" and restored_from is not None:
            lost = last - restored_from
        else:
            lost = last - first + 1
        exact = seconds_after(last - lost) if seconds_after is not None else None
        if exact is not None:
            lost_s, lost_estimated = exact, False
        else:
            lost_s, lost_estimated = _lost_seconds(steps, last - lost + 1, lost, run_seconds)
    eta = eta_seconds(total, last, step_time)
    train = sum(s.seconds for s in steps if s.seconds is not None) if steps else None
    if summed_seconds is not None and steps:
        train = summed_seconds
    unaccounted = wall_s - train if wall_s is not None and train is not None else None
    return Progress(
        start=start,
        restored_from_step=restored_from,
        first_step=first,
        last_step=last,
        total_steps=total,
        step_time_s=round(step_time, 3) if step_time else None,
        expected_step_now=expected,
        checkpoint_period=ckpt.period,
        last_checkpoint_step=last_ckpt,
        progress_lost_steps=lost,
        progress_lost_s=round(lost_s, 1) if lost_s is not None else None,
        eta_s=round(eta, 1) if eta is not None else None,
        train_time_s=round(train, 3) if train is not None else None,
        wall_time_s=wall_s,
        unaccounted_s=round(unaccounted, 1) if unaccounted is not None else None,
        last_step_time=last_time,
        checkpointing=ckpt.enabled,
        last_step_time_estimated=estimated,
        progress_lost_s_estimated=lost_estimated,
    )


def _run_start(restore: RestoreLine | None, first: int | None) -> tuple[str | None, int | None]:
    """Rule PRJ-2: "restored" (from which step) or "fresh": a restore line decides, else a first
    step N > 0 means restored from N-1."""
    if restore is not None and restore.kind == "restored":
        return "restored", restore.step
    if first is not None and first > 0:
        return "restored", first - 1
    if restore is not None or first == 0:
        return "fresh", None
    return None, None


def _last_step_time(
    steps: list[StepRecord], time_base: float | None, summed_seconds: float | None
) -> tuple[float | None, bool]:
    """When the last step completed, and whether that is an estimate (rule PRJ-11)."""
    if not steps:
        return None, False
    last_time = steps[-1].time
    if last_time is None:
        # Duplicated step lines may carry the stamp on another task's copy; take the latest dated step.
        dated = [s for s in steps if s.time is not None]
        if dated and dated[-1].step == steps[-1].step:
            last_time = dated[-1].time
    if last_time is None and time_base is not None:
        # *Undated step lines (print-era MaxText): the last step completed at the dated start of
        # training (BARRIER PASSED) plus the seconds of every step since -- the sum of rule PRJ-7 (rule PRJ-11).
        done = summed_seconds if summed_seconds is not None else sum(s.seconds or 0.0 for s in steps)
        return time_base + done, True
    return last_time, False


def _last_periodic_checkpoint(last: int | None, period: int | None) -> int | None:
    """Rule PRJ-6: the highest multiple of the period <= the last step; none below the period."""
    if last is None or not period:
        return None
    candidate = (last // period) * period
    return candidate if candidate > 0 else None


def _lost_seconds(
    steps: list[StepRecord], lost_from: int, lost_steps: int, run_seconds: float | None
) -> tuple[float | None, bool]:
    """Seconds of the steps from `lost_from` on, and whether that is an estimate."""
    if lost_steps <= 0:
        return 0.0, False
    if run_seconds is not None and steps and lost_from <= steps[0].step:
        return run_seconds, False  # the whole run is lost: its exact summed time
    kept = [s.seconds for s in steps if s.step >= lost_from and s.seconds is not None]
    if len(kept) >= lost_steps:
        return sum(kept), False
    if not kept:
        return None, False
    return sum(kept) / len(kept) * lost_steps, True
