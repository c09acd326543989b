"""Bounded store of a job's step records: exact aggregates, every early and recent step,
and an evenly down-sampled middle, so a million-step log costs the same memory as a
thousand-step one.

What the analyses need and get exactly: first/last step, step count, summed seconds
(runbook: "actually compute the sum"), the baseline window (steps 5–15 after the first),
the last ~1000 steps (steady-state step time, recent TGS, checkpoint budget, progress
lost). The middle is only used for the TGS pattern shape, where every 2^k-th step is
plenty.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from jobdiagd.model.records import StepRecord

EARLY_KEEP = 64
RECENT_KEEP = 1024
SAMPLED_MAX = 2048


def parse_step_fields(rest: str) -> dict[str, float]:
    """`seconds: 5.668, TFLOP/s/device: 134.9, MFU: 16.08%, ..., loss 10.4` -> {key: value}."""
    out: dict[str, float] = {}
    for chunk in rest.split(","):
        key, sep, val = chunk.rpartition(":")
        if not sep:
            key, sep, val = chunk.strip().rpartition(" ")
            if not sep:
                continue
        try:
            out[key.strip()] = float(val.strip().rstrip("%"))
        except ValueError:
            continue
    return out


def step_record(
    step: int, rest: str, *, time: float | None, line: int, task: int | None, source: str
) -> StepRecord:
    """A step record with its fields parsed from the text after `completed step: N,`."""
    f = parse_step_fields(rest)
    return StepRecord(
        step=step,
        seconds=f.get("seconds"),
        tgs=f.get("Tokens/s/device"),
        tflops=f.get("TFLOP/s/device", f.get("TFLOP/s")),
        loss=f.get("loss"),
        time=time,
        line=line,
        task=task,
        source=source,
    )


def materialize(rec: StepRecord) -> None:
    """Parse the deferred fields of a fast-path step record (most records are never read)."""
    raw = rec.pending
    rec.pending = None
    if raw is None:
        return
    f = parse_step_fields(raw.decode("utf-8", errors="replace"))
    rec.tgs = f.get("Tokens/s/device")
    rec.tflops = f.get("TFLOP/s/device", f.get("TFLOP/s"))
    rec.loss = f.get("loss")
    if rec.seconds is None:
        rec.seconds = f.get("seconds")


class StepSeries:
    def __init__(self) -> None:
        self._early: dict[int, StepRecord] = {}
        self._sampled: dict[int, StepRecord] = {}
        # OrderedDict: evicting the oldest entry of a plain dict is O(n) (it skips deleted slots).
        self._recent: OrderedDict[int, StepRecord] = OrderedDict()
        self._stride = 1
        self._evicted = 0
        self._early_first: int | None = None
        self._recent_floor: int | None = None  # smallest step still in _recent, once eviction began
        self.count = 0
        self.sum_seconds = 0.0
        self.max_step = -1
        self.max_checkpoint_like_s = 0.0

    # -- dict-like read access over the kept records ---------------------------------------
    def get(self, step: int) -> StepRecord | None:
        rec = self._recent.get(step) or self._early.get(step) or self._sampled.get(step)
        if rec is not None and rec.pending is not None:
            materialize(rec)
        return rec

    def __getitem__(self, step: int) -> StepRecord:
        rec = self.get(step)
        if rec is None:
            raise KeyError(step)
        return rec

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and self.get(step) is not None

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self) -> Iterator[int]:
        return iter(sorted({*self._early, *self._sampled, *self._recent}))

    def values(self) -> list[StepRecord]:
        return [self[k] for k in self]

    def seen(self, step: int) -> bool:
        """Was this step recorded (also when its record has since been down-sampled away)?"""
        return (
            step in self._recent
            or step in self._early
            or step in self._sampled
            or (self._recent_floor is not None and step < self._recent_floor)
        )

    # -- writing ----------------------------------------------------------------------------
    def add(self, rec: StepRecord) -> None:
        self.count += 1
        if rec.seconds is not None:
            self.sum_seconds += rec.seconds
        if rec.step > self.max_step:
            self.max_step = rec.step
        if self._early_first is None:
            self._early_first = rec.step
        if len(self._early) < EARLY_KEEP and rec.step < self._early_first + EARLY_KEEP:
            self._early[rec.step] = rec
            return
        self._recent[rec.step] = rec
        if len(self._recent) > RECENT_KEEP:
            # Steps arrive in increasing order, so insertion order is step order.
            oldest, old = self._recent.popitem(last=False)
            self._recent_floor = next(iter(self._recent))
            self._evicted += 1
            if self._evicted % self._stride == 0:
                self._sampled[oldest] = old
                if len(self._sampled) > SAMPLED_MAX:
                    self._stride *= 2
                    keep = sorted(self._sampled)[::2]
                    self._sampled = {k: self._sampled[k] for k in keep}

    def replace(self, rec: StepRecord) -> None:
        """Swap the kept record of a step (task 0's copy preferred) without recounting it."""
        for store in (self._early, self._recent, self._sampled):
            old = store.get(rec.step)
            if old is not None:
                if old.seconds is not None:
                    self.sum_seconds -= old.seconds
                if rec.seconds is not None:
                    self.sum_seconds += rec.seconds
                store[rec.step] = rec
                return
