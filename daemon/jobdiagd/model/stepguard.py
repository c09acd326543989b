"""Which step numbers count as progress: one bogus `completed step:` line must not end hang detection.

A step line is only text in a file others can write to. Appending `completed step: 9999999`
made the daemon believe training had reached its final step (the hang detector treats
last >= total - 1 as "finished training") and silenced it for good. So before a new highest
step counts as progress (an arrival time, the hang clock's restart, `last_step` in status),
it must be plausible. Rules (decided here):

- Past the total: a step greater than the configured total (`steps=` in PASSTHROUGH_ARGS) is
  suspect. Steps run 0..total-1; the last step total-1, and total itself (a final log line some
  versions print), are plausible.
- Too far ahead: a step more than `allowed` beyond the previous plausible one is suspect, where
  allowed = max(JUMP_MIN_STEPS, SLACK x elapsed / step time): `elapsed` is the daemon-clock time
  since the previous plausible step was read, the step time is the job's steady step time
  (median of its own `seconds:` fields; FASTEST_STEP_S when not known yet). MaxText logs every
  step, so consecutive step lines differ by one; the floor of 1000 steps and the tenfold slack
  leave room for lost lines, a faster phase and a daemon that was down or wedged.
- Judged once, when read: a suspect step stays suspect (a hang's growing `elapsed` must not
  make an old bogus line plausible later), until real progress passes it.
- A log read at once (triage; the daemon's first read of a file, e.g. after a restart) has no
  clock: its highest steps are checked against the total and against the step recorded just
  before them (JUMP_MIN_STEPS), from the top down (`implausible_top`). The lowest step of a
  log is plausible: a run that starts at N > 0 was restored. A re-run or requeue that goes
  back to a checkpoint is not a jump at all. (Limit: several bogus lines close together,
  written before the daemon first read the file, within the total, pass this check.)

Suspect steps are kept out of progress (`last_step`, arrival times, the step records the stall
budget reads, and triage's progress, which `triage.engine.analyze` filters the same way and
notes); the hang clock keeps running from the last plausible step. The engine says so once per
job (a warning notice) and logs every suspect step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

SLACK = 10.0
JUMP_MIN_STEPS = 1000
FASTEST_STEP_S = 0.05
MAX_SUSPECTS = 4096  # bounded whatever a writer appends (the step store keeps ~3k records anyway)


def _past_total(step: int, total: int | None) -> str | None:
    if total is not None and step > total:
        return f"step {step} is past the configured total of {total} steps"
    return None


def implausible_top(steps: Sequence[int], total: int | None) -> dict[int, str]:
    """A log read at once, with no earlier step and no clock (triage, the daemon's first
    read): the steps above the highest plausible one, with why. `steps` is sorted ascending.

    Plausible: at most `total`, and at most JUMP_MIN_STEPS after the next lower recorded step
    (or the lowest step of all: a run that starts at N > 0 was restored). Only the top is
    examined, from the highest step down: the down-sampled middle of a long log has gaps
    between its kept records, its newest steps do not."""
    out: dict[int, str] = {}
    for i in range(len(steps) - 1, -1, -1):
        step = steps[i]
        why = _past_total(step, total)
        if why is None and i > 0 and step - steps[i - 1] > JUMP_MIN_STEPS:
            why = f"step {step} is {step - steps[i - 1]} steps after step {steps[i - 1]}, the step before it"
        if why is None:
            break
        out[step] = why
    return out


@dataclass
class StepGuard:
    """Per-job verdicts on step numbers read on the daemon's clock (owned by the job view)."""

    suspects: dict[int, str] = field(default_factory=dict)  # step -> why it does not count
    news: list[tuple[int, str]] = field(default_factory=list)  # judged since the engine last looked

    def newest(
        self,
        top: int,
        keys: Callable[[], Iterable[int]],
        *,
        prev: int,
        prev_at: float | None,
        now: float,
        total: int | None,
        step_time: Callable[[], float | None],
    ) -> int:
        """The highest plausible step, given the highest recorded one (`top`) and the previous
        plausible step (`prev`, read at `prev_at`; -1 when none). `keys` lists every recorded
        step (only called when `top` is in doubt)."""
        if (
            prev >= 0
            and top - prev <= JUMP_MIN_STEPS
            and (total is None or top <= total)
            and top not in self.suspects
        ):
            return top  # the common case, without listing the records
        if prev < 0:
            recorded = sorted(k for k in keys() if k not in self.suspects)
            fresh = implausible_top(recorded, total)
            for step in sorted(fresh):
                self._suspect(step, fresh[step])
            return max((k for k in recorded if k not in fresh), default=-1)
        allowed = float(JUMP_MIN_STEPS)
        if prev_at is not None and now > prev_at:
            per_step = max(step_time() or FASTEST_STEP_S, 1e-3)
            allowed = max(allowed, SLACK * (now - prev_at) / per_step)
        cur = prev
        # Newly read steps, in order: each must follow the previous plausible one closely enough.
        for step in sorted(k for k in keys() if k > prev):
            if step in self.suspects:
                continue
            why = _past_total(step, total)
            if why is None and step - cur > allowed:
                why = (
                    f"step {step} is {step - cur} steps after step {cur}; the job's step rate "
                    f"allows at most {int(allowed)} in that time"
                )
            if why is None:
                cur = step
            else:
                self._suspect(step, why)
        for old in [s for s in self.suspects if s <= cur]:
            del self.suspects[old]  # real progress went past it
        return cur

    def _suspect(self, step: int, why: str) -> None:
        if len(self.suspects) < MAX_SUSPECTS:
            self.suspects[step] = why
            self.news.append((step, why))

    def take_news(self) -> list[tuple[int, str]]:
        out, self.news = self.news, []
        return out

    def clear(self) -> None:
        self.suspects.clear()
        self.news.clear()
