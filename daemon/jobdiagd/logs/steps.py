"""Bounded store of a job's step records: exact aggregates, every early and recent step,
and a summarised middle, so a million-step log costs the same memory as a thousand-step one.

Two retention policies (`Retention`), one store:

- `TRIAGE` (`jobdiagd triage`, the job-end re-read): the first 64 steps, the last 1024 and
  an evenly down-sampled middle of at most 2048 records (every 2^k-th step) for the TGS
  pattern shape. Unchanged, so triage reports stay byte for byte what they were.
- `TAIL` (the daemon's tailed logs, one per watched file, for weeks): sized by what the
  detectors and the per-tick triage read, each exactly:
  - first/last step, step count, summed seconds (runbook: "actually compute the sum"):
    running aggregates over every step;
  - the first 64 records (warmup, the steps 5–15 TGS baseline, the TGS detector's early
    window) and the last 512 (the TGS detector's late window, the last 50 steady steps of
    the step time, the recent TGS, progress since the last checkpoint);
  - the checkpoint cost the hang budget learns (the slowest checkpoint step of the whole
    run): the 32 slowest steps ever evicted from the recent window, each with the step
    before it (its cost counts the time between the two lines), and the step just before
    the recent window;
  - "seconds since step X" for progress lost: exact inside the recent window, and at the
    last 64 checkpoint steps (a save line, or a multiple of the configured period) through
    prefix sums taken when they left the window;
  - 256 down-sampled middle records for the live triage's whole-run TGS shape (an
    approximation there, as in `TRIAGE`; the TGS detector itself reads only the two
    exact windows, and the job-end report re-reads the files in full);
  - `history()`: the whole run as at most ~1600 buckets of equal width (step range, mean
    and max seconds, mean and min tokens/s, checkpoint/eval/profiler marks), with exact
    per-bucket aggregates, for plots.
  Per job that is under 1,000 records and a few arrays, whatever the length of the run.
  Where `TAIL` is not exact (decided here; each needs a pathological run): the learned
  checkpoint cost, when more than 32 evicted steps that no save/eval slowed were slower
  than the slowest one that was; progress-lost seconds since a checkpoint more than 512
  steps back that was neither a logged save nor on a configured period's grid (the kept
  records are summed, as before); the steady step time when fewer than 50 of the last 512
  steps are clean (checkpoint/eval periods of 1-2 steps); steps arriving more than 512 out
  of order, and re-runs of evicted steps (the anchors are dropped then).
- `None`: keep every record (tests compare the bounded stores against it).

Steps are expected in increasing order (a step's first copy; re-runs replace records).
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from jobdiagd.model.records import StepRecord

EARLY_KEEP = 64
RECENT_KEEP = 1024
SAMPLED_MAX = 2048


@dataclass(frozen=True, slots=True)
class Retention:
    """How much of a step series a `StepSeries` keeps (see the module docstring)."""

    early: int  # first records kept
    recent: int  # last records kept
    sampled: int  # down-sampled middle records, at most
    # The early window is the first `early` records (True), or the steps below first + `early`.
    early_by_count: bool = False
    pinned: int = 0  # slowest evicted steps kept, each with its predecessor
    history: int = 0  # whole-run history buckets, at most (0: none)
    anchors: int = 0  # prefix sums kept at checkpoint steps (0: `seconds_after` answers None)
    # `LogState` also caps its line-driven lists and per-task maps (see logs.state).
    events: bool = False


TRIAGE = Retention(early=EARLY_KEEP, recent=RECENT_KEEP, sampled=SAMPLED_MAX)
TAIL = Retention(
    early=64,
    recent=512,
    sampled=256,
    early_by_count=True,
    pinned=32,
    history=1024,
    anchors=64,
    events=True,
)
HISTORY_POINTS = 1024  # buckets of `history()` for a store without a history of its own
_INF = float("inf")
# A step time above this (~32 years) is garbage in the log, not a slow step: it is read as
# missing, like an unparsable one, so it cannot make the summed training time infinite.
MAX_STEP_SECONDS = 1e9


def plausible_seconds(value: float | None) -> float | None:
    """A step line's `seconds`, or None when it is not a finite time up to MAX_STEP_SECONDS."""
    return value if value is not None and math.isfinite(value) and abs(value) <= MAX_STEP_SECONDS else None


def finite(value: float | None) -> float | None:
    """A rate (tokens/s, TFLOP/s) or None: `1e400` reads as inf, which no average survives."""
    return value if value is not None and math.isfinite(value) else None


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
        seconds=plausible_seconds(f.get("seconds")),
        tgs=finite(f.get("Tokens/s/device")),
        tflops=finite(f.get("TFLOP/s/device", f.get("TFLOP/s"))),
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
    rec.tgs = finite(f.get("Tokens/s/device"))
    rec.tflops = finite(f.get("TFLOP/s/device", f.get("TFLOP/s")))
    rec.loss = f.get("loss")
    if rec.seconds is None:
        rec.seconds = plausible_seconds(f.get("seconds"))


def tgs_of(rec: StepRecord) -> float | None:
    """The record's Tokens/s/device without parsing its other fields (history, many records)."""
    raw = rec.pending
    if raw is None:
        return rec.tgs
    i = raw.find(b"Tokens/s/device: ")
    if i == -1:
        return None
    j = raw.find(b",", i + 17)
    tok = raw[i + 17 : j] if j != -1 else raw[i + 17 :]
    try:
        return finite(float(tok))
    except ValueError:
        try:
            return finite(float(tok.rstrip(b"% ")))
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """One bucket of consecutive steps of the whole-run history (a plot point)."""

    first_step: int
    last_step: int
    steps: int  # step records in the bucket
    seconds_mean: float | None
    seconds_max: float | None
    tgs_mean: float | None  # Tokens/s/device
    tgs_min: float | None
    marks: tuple[str, ...] = ()  # "checkpoint", "eval", "profiler": such a step is in the bucket


class StepHistory:
    """The whole run in at most `max_buckets` buckets of `width` consecutive step records.

    Exact per-bucket aggregates (count, sum and max of seconds, sum and min of tokens/s): the
    bucket being filled in plain attributes (one add is a few additions), closed ones in flat
    arrays (~60 bytes a bucket); when the arrays are full, neighbouring buckets merge and the
    width doubles, so any run fits."""

    def __init__(self, max_buckets: int) -> None:
        self.max_buckets = max(2, max_buckets)
        self.width = 1
        self.first = array("q")
        self.last = array("q")
        self.n = array("L")
        self.sec_n = array("L")
        self.sec_sum = array("d")
        self.sec_max = array("d")
        self.tgs_n = array("L")
        self.tgs_sum = array("d")
        self.tgs_min = array("d")
        self._reset()

    def _reset(self) -> None:
        self._first = self._last = self._n = self._sec_n = self._tgs_n = 0
        self._sec_sum = self._tgs_sum = 0.0
        self._sec_max, self._tgs_min = -_INF, _INF

    def __len__(self) -> int:
        return len(self.first) + (1 if self._n else 0)

    def add(self, step: int, seconds: float | None, tgs: float | None) -> None:
        if not self._n:
            self._first = step
        self._last = step
        self._n += 1
        if seconds is not None:
            self._sec_n += 1
            self._sec_sum += seconds
            if seconds > self._sec_max:
                self._sec_max = seconds
        if tgs is not None:
            self._tgs_n += 1
            self._tgs_sum += tgs
            if tgs < self._tgs_min:
                self._tgs_min = tgs
        if self._n >= self.width:
            self._close()

    def _close(self) -> None:
        self.first.append(self._first)
        self.last.append(self._last)
        self.n.append(self._n)
        self.sec_n.append(self._sec_n)
        self.sec_sum.append(self._sec_sum)
        self.sec_max.append(self._sec_max)
        self.tgs_n.append(self._tgs_n)
        self.tgs_sum.append(self._tgs_sum)
        self.tgs_min.append(self._tgs_min)
        self._reset()
        if len(self.first) >= self.max_buckets:
            self._merge()

    def _merge(self) -> None:
        """Pairs of buckets become one: the width doubles."""
        k = len(self.n)
        pairs = [(i, min(i + 1, k - 1)) for i in range(0, k, 2)]

        def both(col: array[float], op: Callable[[float, float], float]) -> None:
            col[:] = array(col.typecode, [op(col[a], col[b]) if a != b else col[a] for a, b in pairs])

        def add(x: float, y: float) -> float:
            return x + y

        self.first[:] = array("q", [self.first[a] for a, _ in pairs])
        self.last[:] = array("q", [self.last[b] for _, b in pairs])
        for col in (self.n, self.sec_n, self.tgs_n, self.sec_sum, self.tgs_sum):
            both(col, add)  # type: ignore[arg-type]
        both(self.sec_max, max)
        both(self.tgs_min, min)
        self.width *= 2

    def points(self) -> list[HistoryPoint]:
        rows = [
            (
                self.first[i],
                self.last[i],
                self.n[i],
                self.sec_n[i],
                self.sec_sum[i],
                self.sec_max[i],
                self.tgs_n[i],
                self.tgs_sum[i],
                self.tgs_min[i],
            )
            for i in range(len(self.first))
        ]
        if self._n:
            rows.append(
                (
                    self._first,
                    self._last,
                    self._n,
                    self._sec_n,
                    self._sec_sum,
                    self._sec_max,
                    self._tgs_n,
                    self._tgs_sum,
                    self._tgs_min,
                )
            )
        return [
            HistoryPoint(
                first,
                last,
                n,
                sec_sum / sn if sn else None,
                sec_max if sn else None,
                tgs_sum / tn if tn else None,
                tgs_min if tn else None,
            )
            for first, last, n, sn, sec_sum, sec_max, tn, tgs_sum, tgs_min in rows
        ]


def _fold(records: list[StepRecord], width: int) -> list[HistoryPoint]:
    """Records as history points of `width` records each (the same aggregates as StepHistory)."""
    h = StepHistory(len(records) // max(1, width) + 2)
    h.width = max(1, width)
    for rec in records:
        h.add(rec.step, rec.seconds, tgs_of(rec))
    return h.points()


class StepSeries:
    """One log's step records as `retention` keeps them (None: every one), with exact aggregates."""

    def __init__(self, retention: Retention | None = TRIAGE) -> None:
        self.retention = retention
        self._early_keep = retention.early if retention is not None else 0
        self._recent_keep = retention.recent if retention is not None else None
        self._sampled_max = retention.sampled if retention is not None else 0
        self._by_count = retention is not None and retention.early_by_count
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
        # Summaries of what left the recent window (TAIL; see the module docstring).
        self._summarise = retention is not None and bool(
            retention.pinned or retention.history or retention.anchors
        )
        self._last_evicted: StepRecord | None = None
        self._pin_heap: list[tuple[float, int]] = []  # (cost, step): the slowest evicted steps
        self._pins: dict[int, tuple[StepRecord, StepRecord | None]] = {}  # step -> (record, predecessor)
        self._pinned: dict[int, StepRecord] = {}  # the pinned records and their predecessors
        self._history: StepHistory | None = None  # made at the first eviction: most jobs are short
        self._history_max = retention.history if retention is not None else 0
        self._early_sum = 0.0
        self._evicted_sum = 0.0
        self._anchors: dict[int, float] = {}  # step -> summed seconds of every step up to it
        self._anchor_wanted: set[int] = set()
        self.anchor_periods: set[int] = set()
        self._pin_keep = retention.pinned if retention is not None else 0
        self._anchor_keep = retention.anchors if retention is not None else 0

    # -- dict-like read access over the kept records ---------------------------------------
    def get(self, step: int) -> StepRecord | None:
        rec = self._recent.get(step) or self._early.get(step) or self._sampled.get(step)
        if rec is None and self._summarise:
            rec = self._pinned.get(step)
            if rec is None and self._last_evicted is not None and self._last_evicted.step == step:
                rec = self._last_evicted
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
        keys = {*self._early, *self._sampled, *self._recent}
        if self._summarise:
            keys.update(self._pinned)
            if self._last_evicted is not None:
                keys.add(self._last_evicted.step)
        return iter(sorted(keys))

    def values(self) -> list[StepRecord]:
        return [self[k] for k in self]

    @property
    def kept(self) -> int:
        """How many step records are held (the rest is summarised)."""
        return sum(1 for _ in self)

    def seen(self, step: int) -> bool:
        """Was this step recorded (also when its record has since been down-sampled away)?"""
        return (
            step in self._recent
            or step in self._early
            or step in self._sampled
            or (self._recent_floor is not None and step < self._recent_floor)
        )

    def seconds_after(self, step: int) -> float | None:
        """The summed seconds of every step after `step`, when this store knows it exactly
        (always without a bound; inside the recent window, before the first step or at an
        anchored checkpoint step with `TAIL`); None otherwise, and always with `TRIAGE`."""
        if self.retention is not None and not self.retention.anchors:
            return None
        if self._recent_floor is None or step >= self._recent_floor - 1:
            return sum(r.seconds or 0.0 for r in self.values() if r.step > step)
        if self._early_first is not None and step < self._early_first:
            return self.sum_seconds
        prefix = self._anchors.get(step)
        return None if prefix is None else self.sum_seconds - prefix

    def want_anchor(self, step: int) -> None:
        """A checkpoint was saved at `step`: remember the seconds up to it when it leaves the window."""
        if not self.retention or not self.retention.anchors:
            return
        if self._recent_floor is not None and step < self._recent_floor:
            return  # already gone: too late for an exact prefix
        self._anchor_wanted.add(step)
        if len(self._anchor_wanted) > self.retention.anchors:
            self._anchor_wanted.discard(min(self._anchor_wanted))

    def history(self, marks: Callable[[int, int], tuple[str, ...]] | None = None) -> list[HistoryPoint]:
        """The whole run as buckets of consecutive steps (a plot of step time and tokens/s).

        `marks(first, last)` names what slows steps in that range (`CheckpointConfig.marks`).
        With `TAIL` the buckets carry exact aggregates of every step; otherwise they are folded
        from the kept records (a down-sampled middle for long logs)."""
        h = self._history
        if h is None:
            records = self.values()
            width = -(-len(records) // HISTORY_POINTS) if records else 1
            points = _fold(records, width)
        else:
            early = [self[k] for k in sorted(self._early)]
            recent = [self[k] for k in sorted(self._recent)]
            points = _fold(early, h.width) + h.points() + _fold(recent, h.width)
        if marks is None:
            return points
        return [
            HistoryPoint(
                p.first_step,
                p.last_step,
                p.steps,
                p.seconds_mean,
                p.seconds_max,
                p.tgs_mean,
                p.tgs_min,
                marks(p.first_step, p.last_step),
            )
            for p in points
        ]

    # -- writing ----------------------------------------------------------------------------
    def add(self, rec: StepRecord) -> None:
        self.count += 1
        if rec.seconds is not None:
            self.sum_seconds += rec.seconds
        if rec.step > self.max_step:
            self.max_step = rec.step
        if self._early_first is None:
            self._early_first = rec.step
        if len(self._early) < self._early_keep and (
            self._by_count or rec.step < self._early_first + self._early_keep
        ):
            self._early[rec.step] = rec
            if self._summarise and rec.seconds is not None:
                self._early_sum += rec.seconds
            return
        self._recent[rec.step] = rec
        if self._recent_keep is not None and len(self._recent) > self._recent_keep:
            # Steps arrive in increasing order, so insertion order is step order.
            oldest, old = self._recent.popitem(last=False)
            self._recent_floor = next(iter(self._recent))
            self._evicted += 1
            if self._summarise:
                self._summarise_evicted(old)
            if self._evicted % self._stride == 0:
                self._sampled[oldest] = old
                if len(self._sampled) > self._sampled_max:
                    self._stride *= 2
                    keep = sorted(self._sampled)[::2]
                    self._sampled = {k: self._sampled[k] for k in keep}

    @property
    def takes_runs(self) -> bool:
        """Can `add_run` fold steps in bulk here? (Not with summaries: `TAIL` sees every record.)"""
        return not self._summarise

    def _early_takes(self, step: int) -> bool:
        """Would `add` put this (new, largest) step in the early window?"""
        first = self._early_first if self._early_first is not None else step
        return len(self._early) < self._early_keep and (self._by_count or step < first + self._early_keep)

    def add_run(
        self,
        steps: Sequence[int],
        seconds: Sequence[float | None],
        lo: int,
        hi: int,
        make: Callable[[int], StepRecord],
    ) -> None:
        """`add(make(i))` for i in [lo, hi) in order, where `steps[lo:hi]` strictly increase from
        above `max_step` (none seen yet) and `seconds[i - lo]` is record i's seconds — without
        making the records the recent window would drop at once: a million-step log makes a few
        thousand records, not a million. Only when `takes_runs`.

        The result is `add`'s to the last bit: the same sums in the same order, the same
        evictions, the same down-sampled middle (tested against `add`)."""
        if not self.takes_runs:
            raise ValueError("add_run needs a store without summaries")
        i = lo
        while i < hi and self._early_takes(steps[i]):
            self.add(make(i))
            i += 1
        if i == hi:
            return
        total = self.sum_seconds
        for x in seconds[i - lo : hi - lo]:
            if x is not None:
                total += x  # one by one, as `add` sums (sum() may round differently)
        self.sum_seconds = total
        self.count += hi - i
        self.max_step = steps[hi - 1]
        if self._early_first is None:
            self._early_first = steps[i]
        recent = self._recent
        keep = self._recent_keep
        evict = 0 if keep is None else len(recent) + (hi - i) - keep
        if evict <= 0:
            for k in range(i, hi):
                recent[steps[k]] = make(k)
            return
        # The records leaving the window, in order: the oldest kept ones, then the run's first.
        old_gone = min(evict, len(recent))
        gone = [recent.popitem(last=False) for _ in range(old_gone)]
        first_new = i + evict - old_gone  # the run's first record still in the window at the end
        ev0 = self._evicted
        stride = self._stride
        sampled = self._sampled
        t = (ev0 // stride + 1) * stride  # the eviction counts `add` samples at
        while t <= ev0 + evict:
            p = t - ev0 - 1
            if p < old_gone:
                step, rec = gone[p]
            else:
                k = i + p - old_gone
                step, rec = steps[k], make(k)
            sampled[step] = rec
            if len(sampled) > self._sampled_max:
                stride *= 2
                sampled = {s: sampled[s] for s in sorted(sampled)[::2]}
            t = (t // stride + 1) * stride
        self._sampled = sampled
        self._stride = stride
        self._evicted = ev0 + evict
        for k in range(first_new, hi):
            recent[steps[k]] = make(k)
        self._recent_floor = next(iter(recent))

    def _summarise_evicted(self, old: StepRecord) -> None:
        """Fold a record leaving the recent window into the summaries (TAIL). Runs for every
        step of a long log read at start-up, so it stays a handful of operations."""
        seconds = old.seconds
        if seconds is None and old.pending is not None:
            materialize(old)  # an unusual line: `seconds` only in the general parse
            seconds = old.seconds
        pred = self._last_evicted
        self._last_evicted = old
        # The cost the hang budget learns (triage.stall._cost): the step's seconds, or the
        # time since the previous step's line when that is longer.
        cost = seconds
        t = old.time
        if pred is not None and t is not None and pred.step == old.step - 1 and pred.time is not None:
            gap = t - pred.time
            if gap > 0 and (cost is None or gap > cost):
                cost = gap
        heap = self._pin_heap
        if cost is not None and self._pin_keep and (len(heap) < self._pin_keep or cost > heap[0][0]):
            self._pin(cost, old, pred, self._pin_keep)
        if self._history_max:
            if self._history is None:
                self._history = StepHistory(self._history_max)
            self._history.add(old.step, seconds, old.tgs if old.pending is None else tgs_of(old))
        if self._anchor_keep:
            self._evicted_sum += seconds or 0.0
            step = old.step
            anchor = step in self._anchor_wanted
            if not anchor:
                for p in self.anchor_periods:
                    if step % p == 0:
                        anchor = True
                        break
            if anchor:
                self._anchor_wanted.discard(step)
                self._anchors[step] = self._early_sum + self._evicted_sum
                if len(self._anchors) > self._anchor_keep:
                    del self._anchors[next(iter(self._anchors))]

    def _pin(self, cost: float, rec: StepRecord, pred: StepRecord | None, keep: int) -> None:
        """Keep `rec` (and its predecessor) among the `keep` slowest steps evicted so far."""
        heap = self._pin_heap
        if len(heap) < keep:
            heapq.heappush(heap, (cost, rec.step))
        else:
            _, gone = heapq.heapreplace(heap, (cost, rec.step))
            del self._pins[gone]
        self._pins[rec.step] = (rec, pred if pred is not None and pred.step == rec.step - 1 else None)
        pinned: dict[int, StepRecord] = {}
        for r, p in self._pins.values():
            pinned[r.step] = r
            if p is not None:
                pinned[p.step] = p
        self._pinned = pinned

    def replace(self, rec: StepRecord) -> None:
        """Swap the kept record of a step (task 0's copy preferred) without recounting it."""
        if not self._summarise:
            for store in (self._early, self._recent, self._sampled):
                old = store.get(rec.step)
                if old is not None:
                    if old.seconds is not None:
                        self.sum_seconds -= old.seconds
                    if rec.seconds is not None:
                        self.sum_seconds += rec.seconds
                    store[rec.step] = rec
                    return
            return
        # A record may sit in several stores here (sampled, pinned, just evicted): swap it in all.
        old_rec = self.get(rec.step)
        if old_rec is None:
            return
        delta = (rec.seconds or 0.0) - (old_rec.seconds or 0.0)
        self.sum_seconds += delta
        for store in (self._early, self._recent, self._sampled, self._pinned):
            if rec.step in store:
                store[rec.step] = rec
        if self._early.get(rec.step) is rec:
            self._early_sum += delta
        if self._last_evicted is not None and self._last_evicted.step == rec.step:
            self._last_evicted = rec
        for step, (r, p) in list(self._pins.items()):
            if r.step == rec.step or (p is not None and p.step == rec.step):
                self._pins[step] = (
                    rec if r.step == rec.step else r,
                    rec if p is not None and p.step == rec.step else p,
                )
        if self._recent_floor is not None and rec.step < self._recent_floor:
            self._evicted_sum += delta
            self._anchors.clear()  # prefix sums taken before the swap no longer add up
