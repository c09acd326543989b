"""A log file's virtual clock, built from the log itself: the clock `jobdiagd backtest` replays a
finished job on (`service.backtest`; the read that stamps each line with it is `logs.replay_read`).

One clock per file (the replay merges files by time; ties keep the main log first):
- A line with a printed timestamp (absl, Ray, NCCL, ISO) is at that time, unless the clock is
  already later: the clock never runs backwards, so mixed dated/undated logs stay monotone.
- One step series drives it: the file's authoritative task -- task 0, else the first task that
  prints a `completed step:` line (lines without an `srun -l` prefix count as one task: a Ray
  worker log, a k8s rank log, a single-task log). For RAY=1 jobs the step record is the head
  node's worker log, as in the daemon; each file's clock runs on its own series.
- An undated step line of that series moves the clock on by its `seconds:`; the same step
  number repeated back-to-back in the series (copies without task prefixes) moves it once.
- Other tasks' undated step lines never move it by their own `seconds:`. A copy printed before
  the authoritative copy of the same step (the series' next step line is that step) takes that
  copy's time -- the clock moves on by the authoritative `seconds:` at the first copy, since the
  step completed for every rank at once -- and the authoritative copy then takes the same time;
  any other copy takes the current time. So a replay runs at the job's pace whatever the number
  of tasks, and a step arrives when its first copy is printed, as a daemon tailing the log sees it.
- Any other undated line takes the current time -- except in a file's undated tail.
- The undated tail: the lines after a file's last line whose time the replay knows (its last
  dated line or step line) were written at an unknown time between that line and the job's end.
  Stamped with the last known time they could arrive long before they were written: a RAY=1 job
  log whose Ray forwarding stopped at the last step ends with the job script's undated
  "Training subprocess exited" lines and JOB SUMMARY, written when the heartbeat killed the job
  45 min later, and placed at the last step they opened a failure incident that held a
  GPU-confirmed hang page back. They are taken in at the job's end instead -- the last time any
  of the job's files shows (the merge yields them after every other line) -- so nothing reaches
  the detectors before it could have been written; the price is that an undated error written
  early (one node's process exited while the others hang) shows in the replay at the end, late,
  never early. The JOB SUMMARY's Wall would date the end only against the job's start, which no
  line dates: not used. A file with neither a dated line nor a step line has no tail (it is
  placed as below). The replay's `undated_lines` counts the tail lines taken in.
- Before a file's first timestamp the clock is back-dated from it: the file starts at its first
  stamp minus the `seconds:` its series adds before that line, so undated steps followed by dated
  chatter (a hang's NCCL/XLA lines) keep their true spacing. A file with no timestamp at all (a
  RAY=1 worker log of print()-era MaxText) is placed so that its first step line is at the time
  another file of the job shows that step (the Slurm log's forwarded copy); failing that it
  starts with the job's other files (at 0 when none has a timestamp).

What is here: the survey (`survey`: the series' step lines and the first timestamp, read before the
replay; a `FileClock` holds what it found, 25 bytes a step of the series), the clock as the replay
read moves it (`AuthCursor`), and which lines carry a printed timestamp (`stamp_finder`: a
`logs.scan.LineFinder`, so only those lines are decoded; `line_stamps`: their times).
"""

from __future__ import annotations

import math
import os
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from jobdiagd.logs.prefixes import strip
from jobdiagd.logs.reader import MAX_LINE, _ReadBuffer
from jobdiagd.logs.safeopen import ANYWHERE, LogAccess
from jobdiagd.logs.scan import LineFinder
from jobdiagd.logs.state import StampClock, parse_fast_step

# What a printed timestamp can look like (a superset: `strip` decides whether the line really
# starts with one). absl `I0612 10:15:22`; NCCL/Ray/ISO `2026-06-12 10:15:22`.
_STAMP_PATTERNS: tuple[bytes, ...] = (
    rb"[IWEF]\d{4} \d\d:\d\d:\d\d",
    rb"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d",
)
STEP_NEEDLE = b"completed step: "
# As `LogState` reads a step line (the number ends at a comma or the line end).
_STEP_TEXT = re.compile(r"completed step: (\d+)(?=,|\s*$)")
_SECONDS_TEXT = re.compile(r"seconds: (\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")
_NO_TASK = -1  # the task key of lines without an srun prefix
_SRUN_TASK = re.compile(rb"\s*(?:P\d+\s+)?(\d{1,6}): ")

_finder: LineFinder | None = None


def stamp_finder() -> LineFinder:
    """The finder of the lines that may carry a printed timestamp (made once a process)."""
    global _finder
    if _finder is None:
        _finder = LineFinder(_STAMP_PATTERNS)
    return _finder


# The common shape of a dated line: srun prefix, Ray actor prefix, absl stamp, each a subset of
# what `strip` accepts in that order, so a match gives the stamp `strip` would; other shapes
# (a leading colour code, `\r`, NCCL/ISO dates, other prefix orders) go through `strip` itself.
_FAST_ABSL = re.compile(
    rb"(?:\s*(?:P\d+\s+)?\d{1,6}: )?(?:\([\w.:-]+ pid=\d+(?:, ip=[\w.:]+)?\) )?"
    rb"[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?\s+\d+\s+[^\]\s]+\] "
)


def line_stamps(buf: bytes | bytearray, starts: list[int], end: int, clock: StampClock) -> list[float | None]:
    """The epochs of the printed timestamps of the lines starting at `starts` in `buf[:end]`, as
    `LogState` would read them (None: no timestamp), without copying the lines."""
    out: list[float | None] = []
    match, find, undated = _FAST_ABSL.match, buf.find, clock.epoch_undated
    for p in starts:
        nl = find(b"\n", p, end)
        le = end if nl == -1 else nl
        m = match(buf, p, le)
        # Colour codes after the prefix do not change it; a `\r` does (a terminal shows its last part).
        if m is not None and find(b"\r", p, le) == -1:
            month, day, hh, mm, ss, us = m.groups()
            secs = int(hh) * 3600 + int(mm) * 60 + int(ss) + (int(us) / 10 ** len(us) if us else 0.0)
            out.append(undated(int(month), int(day), secs))  # `epoch` with the midnight cached
            continue
        text = bytes(buf[p : min(le, p + MAX_LINE)]).decode("utf-8", errors="replace")
        stamp = strip(text).stamp
        out.append(clock.epoch(stamp) if stamp is not None else None)
    return out


def step_fact(raw: bytes) -> tuple[int, int, float | None, bool] | None:
    """(step, task key, `seconds:`, dated) of a `completed step:` line, else None."""
    fast = parse_fast_step(raw)
    if fast is not None:
        step, task, month, _day, _secs, seconds, _rest = fast
        return step, _NO_TASK if task is None else task, seconds, month != 0
    if STEP_NEEDLE not in raw:
        return None
    s = strip(raw[:MAX_LINE].decode("utf-8", errors="replace"))
    m = _STEP_TEXT.search(s.text)
    if m is None:
        return None
    sm = _SECONDS_TEXT.search(s.text, m.end())
    return (
        int(m.group(1)),
        _NO_TASK if s.task is None else s.task,
        float(sm.group(1)) if sm else None,
        s.stamp is not None,
    )


@dataclass
class FileClock:
    """What one file's virtual clock needs before the replay reads it (the survey), and its end."""

    path: Path
    order: int
    access: LogAccess = ANYWHERE  # how the file may be opened (regular files inside the job's root)
    first_stamp: float | None = None
    start: float | None = None  # back-dated start; None: the file has no timestamp
    auth_task: int | None = None  # the task whose step lines drive the clock (-1: no prefix)
    # The authoritative step lines in file order: offset, step, `seconds:` (NaN: none), dated.
    # Arrays: 25 bytes a step, the only part of a replay that grows with the log.
    auth_offsets: array[int] = field(default_factory=lambda: array("q"))
    auth_steps: array[int] = field(default_factory=lambda: array("q"))
    auth_seconds: array[float] = field(default_factory=lambda: array("d"))
    auth_dated: array[int] = field(default_factory=lambda: array("b"))
    end: float = 0.0  # the file's last line on the clock (set once the read is exhausted)
    # The undated tail: lines starting after this offset (the last line whose time the file
    # shows: a dated line or a step line) have no time of their own. None: no such line at all.
    tail_from: int | None = None
    known_end: float | None = None  # the file's last known time, once the read reached its tail or end

    def advance(self, j: int) -> float:
        """How far authoritative step line j moves the clock (0 if dated or a repeat)."""
        if self.auth_dated[j] or (j > 0 and self.auth_steps[j - 1] == self.auth_steps[j]):
            return 0.0
        secs = self.auth_seconds[j]
        return secs if math.isfinite(secs) and secs > 0 else 0.0  # NaN (none), inf, < 0: no move


def survey(path: Path, order: int, ref_time: float, access: LogAccess = ANYWHERE) -> FileClock:
    """Pass 1: the authoritative step series and the first timestamp (see the module docstring)."""
    finder = stamp_finder()
    fc = FileClock(path, order, access)
    clock = StampClock(ref_time)
    stamp_at: int | None = None
    series = _SeriesScan(path, order)
    rb = _ReadBuffer()
    fd = access.open(path)
    try:
        size = os.fstat(fd).st_size
        for n, offset in rb.chunks(fd, 0, size):
            buf = rb.buf
            if stamp_at is None:
                for p in finder.line_starts(buf, 0, 1 + n):
                    when = line_stamps(buf, [p], 1 + n, clock)[0]
                    if when is not None:
                        fc.first_stamp, stamp_at = when, offset + p - 1
                        break
            series.scan(buf, n, offset)
        # Where the undated tail starts: after the last dated line or step line (searched from the
        # end back to the last step line only; none before the first stamp can be dated).
        floor = max(series.last_step_line or 0, stamp_at or 0)
        last_stamp = _last_stamp_line(fd, size, floor, clock) if stamp_at is not None else None
        fc.tail_from = max(
            (o for o in (last_stamp, series.last_step_line, stamp_at) if o is not None), default=None
        )
    finally:
        os.close(fd)
    fc.auth_task = 0 if 0 in series.series else series.first_task
    chosen = series.series.get(fc.auth_task) if fc.auth_task is not None else None
    if chosen is not None:
        fc.auth_offsets, fc.auth_steps = chosen.auth_offsets, chosen.auth_steps
        fc.auth_seconds, fc.auth_dated = chosen.auth_seconds, chosen.auth_dated
    if fc.first_stamp is not None and stamp_at is not None:
        before = sum(fc.advance(j) for j, off in enumerate(fc.auth_offsets) if off < stamp_at)
        fc.start = fc.first_stamp - before
    return fc


TAIL_BLOCK = 1 << 20  # the backward search for the last dated line reads this much at a time


def _last_stamp_line(fd: int, size: int, floor: int, clock: StampClock) -> int | None:
    """File offset of the last line starting at or after `floor` (a line start) that carries a
    printed timestamp, read backwards from the end; None when there is none."""
    finder = stamp_finder()
    end, block = size, TAIL_BLOCK  # `end` is always a line start (or the file's end)
    while end > floor:
        start = max(floor, end - block)
        data = os.pread(fd, end - start, start)
        head = 0
        if start > floor:  # begin at the first whole line of the block
            nl = data.find(b"\n")
            if nl == -1 or start + nl + 1 >= end:  # no line starts inside: read further back
                block *= 2
                continue
            head = nl + 1
        buf = b"\n" + data[head:]
        starts = finder.line_starts(buf, 0, len(buf))
        for p, when in zip(
            reversed(starts), reversed(line_stamps(buf, starts, len(buf), clock)), strict=True
        ):
            if when is not None:
                return start + head + p - 1
        end, block = start + head, TAIL_BLOCK
    return None


class _SeriesScan:
    """The survey's step lines: those of task 0, of lines without a prefix and of the first task
    printing steps (needed when task 0 prints none); other tasks' copies are not parsed."""

    def __init__(self, path: Path, order: int) -> None:
        self.path, self.order = path, order
        self.series: dict[int, FileClock] = {}
        self.first_task: int | None = None
        self._first_task_b = b""
        self.last_step_line: int | None = None  # file offset of the last line holding a step needle

    def scan(self, buf: bytes | bytearray, n: int, offset: int) -> None:
        """The step lines of one chunk (`buf[1:1+n]`, read at `offset`)."""
        pos = buf.find(STEP_NEEDLE, 1, 1 + n)
        while pos != -1:
            ls = buf.rfind(b"\n", 0, pos) + 1
            nl = buf.find(b"\n", pos, 1 + n)
            le = 1 + n if nl == -1 else nl
            self.last_step_line = offset + ls - 1
            m = _SRUN_TASK.match(buf, ls, le)
            # Other tasks' copies (most step lines of a multi-node log) are not parsed.
            if m is None or self.first_task is None or m.group(1) in (b"0", self._first_task_b):
                fact = step_fact(bytes(buf[ls:le]))
                if fact is not None:
                    self._add(fact, offset + ls - 1)
            if nl == -1:
                break
            pos = buf.find(STEP_NEEDLE, nl, 1 + n)

    def _add(self, fact: tuple[int, int, float | None, bool], at: int) -> None:
        step, task, secs, dated = fact
        if self.first_task is None:
            self.first_task, self._first_task_b = task, str(task).encode()
        if task not in (0, _NO_TASK, self.first_task) or (task != 0 and 0 in self.series):
            return
        into = self.series.get(task)
        if into is None:
            into = self.series[task] = FileClock(self.path, self.order)
        into.auth_offsets.append(at)
        into.auth_steps.append(step)
        into.auth_seconds.append(math.nan if secs is None else secs)
        into.auth_dated.append(dated)
        if task == 0:  # task 0 prints steps: the others are not needed
            for other in [k for k in self.series if k != 0]:
                del self.series[other]


class AuthCursor:
    """A file's virtual clock (`cur`) as its undated step lines move it (see the module docstring)."""

    def __init__(self, fc: FileClock, start: float) -> None:
        self.fc = fc
        self.cur = start
        self.na = 0  # next authoritative step line not passed yet
        self.early = -1  # the authoritative line whose time an earlier copy already took

    def step_line(self, raw: bytes, off: int) -> None:
        """An undated line holding a step needle, at file offset `off`."""
        fc = self.fc
        offsets, n_auth = fc.auth_offsets, len(fc.auth_offsets)
        na = self.na
        while na < n_auth and offsets[na] < off:
            na += 1
        if na < n_auth and offsets[na] == off:
            if na != self.early:
                self.cur += fc.advance(na)
            self.na = na + 1
            return
        self.na = na
        if na < n_auth and na != self.early and not fc.auth_dated[na]:
            # The first copy of the series' next step, printed by another task?
            # (Checked on the number first: most copies are of other steps.)
            k = raw.find(STEP_NEEDLE) + len(STEP_NEEDLE)
            if raw.startswith(b"%d," % fc.auth_steps[na], k):
                fact = step_fact(raw)
                if fact is not None and fact[1] != fc.auth_task and fact[0] == fc.auth_steps[na]:
                    self.cur += fc.advance(na)
                    self.early = na
