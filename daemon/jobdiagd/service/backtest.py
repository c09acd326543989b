"""`jobdiagd backtest`: replay finished jobs through the daemon's detectors on a clock built from the log itself.

Virtual clock, one per file (files are then merged by time; ties keep the main log first):
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
  placed as below). `undated_lines` counts the tail lines taken in.
- Before a file's first timestamp the clock is back-dated from it: the file starts at its first
  stamp minus the `seconds:` its series adds before that line, so undated steps followed by dated
  chatter (a hang's NCCL/XLA lines) keep their true spacing. A file with no timestamp at all (a
  RAY=1 worker log of print()-era MaxText) is placed so that its first step line is at the time
  another file of the job shows that step (the Slurm log's forwarded copy); failing that it
  starts with the job's other files (at 0 when none has a timestamp).
`at_s` is seconds since the first `completed step:` line read on that clock (negative before it).

Replay: each file is read twice, streaming (what grows with the log is 25 bytes a step of the
series). A survey finds the series' step lines and the first timestamp; the replay read then
reads the file the way the daemon's tail reader (`PrefilterTailReader`) does -- the head in
full until training starts, then only the lines the pre-filter (`logs.scan`) marks as
candidates -- and feeds them to fresh `LogState`s through `LogState.feed_bytes` (the fast step
path) in clock order; with `workers` > 1 a big file's read runs in a forked process. The other
lines only move the clock: a multi-literal scan finds the lines that may carry a timestamp and
only those are decoded. A step's arrival time is the time of its first line read; the view
takes in the other lines before each tick, as the engine does after every read. Full ticks run
every `tick` seconds of virtual time through the same detectors, the same resolution rule and
the same incident book as the daemon (the states change only where a line is fed, so ticks
between fed lines see what they would between all lines). The job ends at its last line (JOB
SUMMARY state, or UNKNOWN) and the job-end report runs on a fresh `load_job` of its files,
like the daemon's. The states keep the daemon's `TAIL` step retention, as a tailed job's do.
Files are opened as `jobdiagd triage` opens them (`triage.resolve.job_access`): one that is no
regular file, leaves the job's outputs root or belongs to another user is left out.

Early page (`[tsdb] early_page`, RAY=1 jobs with a `prometheus/` holding data): the replay asks
the job's own TSDB what the live daemon asks its Prometheus (`tsdb.gpu_hang.gpu_query`,
evaluated at the virtual time) whenever `HangDetector.early_due_at` says a step is overdue,
once per `early_scrape_interval_s` of virtual time, as `service.early_page` does live, and a
confirmation runs the detectors at that virtual time (the live daemon's immediate partial
tick). The TSDB is served read-only by a local Prometheus over a private copy of the directory
(WAL included, lock excluded), started only when a first query is due: the job's own directory
is never opened for writing and its lock never touched. Without a Prometheus binary, or with
no TSDB data, the replay goes on without the early page and says so in `early_note`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import heapq
import math
import multiprocessing
import os
import re
import sys
import tempfile
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from jobdiagd import clock, jsonsafe
from jobdiagd.alerts.incidents import IncidentBook
from jobdiagd.config import Config, load_for_command
from jobdiagd.detectors import Detector, EarlyMemo, early_memo
from jobdiagd.detectors import build as build_detectors
from jobdiagd.detectors.hang import EARLY_DETAIL, EarlyRule, HangDetector, policy_from_config
from jobdiagd.logs.job import load_job
from jobdiagd.logs.prefixes import strip
from jobdiagd.logs.reader import HEAD_FULL, MAX_LINE, _ReadBuffer, prefilter, set_default_workers
from jobdiagd.logs.safeopen import ANYWHERE, LogAccess
from jobdiagd.logs.scan import LineFinder, LineScanner, default_scanner
from jobdiagd.logs.state import LogState, StampClock, parse_fast_step
from jobdiagd.logs.steps import TAIL
from jobdiagd.model.alerts import Finding
from jobdiagd.model.jobref import JobRef
from jobdiagd.rules.hostlist import expand_hostlist
from jobdiagd.rules.slurm import end_state
from jobdiagd.service.jobs import JobView
from jobdiagd.service.judging import Judged, run_detectors
from jobdiagd.triage.engine import analyze
from jobdiagd.triage.resolve import ResolveError, job_access, list_jobs, resolve
from jobdiagd.tsdb.access import FULL_COPY_EXCLUDES, AccessError, LocalPrometheus, copy_tsdb, tsdb_has_data
from jobdiagd.tsdb.client import PromClient, PromError, Series
from jobdiagd.tsdb.gpu_hang import GpuVerdict, gpu_query, judge, profile_for
from jobdiagd.tsdb.settings import TsdbSettings

MAX_TICKS = 200_000  # a guard against a log whose clock jumps by years
UNDATED = math.inf  # the time of a line of a file's undated tail, until the job's end is known

# What a printed timestamp can look like (a superset: `strip` decides whether the line really
# starts with one). absl `I0612 10:15:22`; NCCL/Ray/ISO `2026-06-12 10:15:22`.
_STAMP_PATTERNS: tuple[bytes, ...] = (
    rb"[IWEF]\d{4} \d\d:\d\d:\d\d",
    rb"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d",
)
_STEP_NEEDLE = b"completed step: "
# As `LogState` reads a step line (the number ends at a comma or the line end).
_STEP_TEXT = re.compile(r"completed step: (\d+)(?=,|\s*$)")
_SECONDS_TEXT = re.compile(r"seconds: (\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")
_NO_TASK = -1  # the task key of lines without an srun prefix
_SRUN_TASK = re.compile(rb"\s*(?:P\d+\s+)?(\d{1,6}): ")

# (time, file order, line number, offset, raw line, in the head, pre-filter candidate)
Event = tuple[float, int, int, int, bytes, bool, bool]


@dataclass(frozen=True, slots=True)
class Line:
    t: float
    order: int  # file index: ties keep the main log first
    lineno: int
    offset: int
    text: str


_finder: LineFinder | None = None
_scan: LineScanner | None = None


def _tools() -> tuple[LineFinder, LineScanner]:
    """The finder of the lines that may carry a printed timestamp, and the pre-filter's scanner."""
    global _finder, _scan
    if _finder is None:
        _finder = LineFinder(_STAMP_PATTERNS)
    if _scan is None:
        _scan = default_scanner()
    return _finder, _scan


# The common shape of a dated line: srun prefix, Ray actor prefix, absl stamp, each a subset of
# what `strip` accepts in that order, so a match gives the stamp `strip` would; other shapes
# (a leading colour code, `\r`, NCCL/ISO dates, other prefix orders) go through `strip` itself.
_FAST_ABSL = re.compile(
    rb"(?:\s*(?:P\d+\s+)?\d{1,6}: )?(?:\([\w.:-]+ pid=\d+(?:, ip=[\w.:]+)?\) )?"
    rb"[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?\s+\d+\s+[^\]\s]+\] "
)


def _stamps(buf: bytes | bytearray, starts: list[int], end: int, clock: StampClock) -> list[float | None]:
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
    if _STEP_NEEDLE not in raw:
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
    finder, _ = _tools()
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
                    when = _stamps(buf, [p], 1 + n, clock)[0]
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
    finder, _ = _tools()
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
        for p, when in zip(reversed(starts), reversed(_stamps(buf, starts, len(buf), clock)), strict=True):
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
        pos = buf.find(_STEP_NEEDLE, 1, 1 + n)
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
            pos = buf.find(_STEP_NEEDLE, nl, 1 + n)

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


def read_timed(fc: FileClock, start: float, ref_time: float, *, every_line: bool = False) -> Iterator[Event]:
    """Pass 2: the lines the daemon's tail reader would feed (every line with `every_line`), each
    with its virtual time; a line of the undated tail (after `fc.tail_from`) with `UNDATED` instead,
    its time unknown. Sets `fc.known_end` when the read reaches the tail (else at its end) and
    `fc.end` once exhausted."""
    for batch in _read_batches(fc, start, ref_time, every_line=every_line):
        yield from batch


def _read_batches(
    fc: FileClock, start: float, ref_time: float, *, every_line: bool = False
) -> Iterator[list[Event]]:
    """`read_timed`, one list per chunk read."""
    finder, scan = _tools()
    clock = StampClock(ref_time)
    steps = _AuthCursor(fc, start)
    order = fc.order
    tail_from = fc.tail_from if fc.tail_from is not None else math.inf
    rb = _ReadBuffer()
    fd = fc.access.open(fc.path)
    lineno = 1
    try:
        size = os.fstat(fd).st_size
        for n, offset in rb.chunks(fd, 0, size):
            buf = rb.buf
            total, cands = prefilter(buf, (), scan, end=1 + n, eq=rb.scratch(1 + n))
            items = _chunk_items(buf, n, offset, cands, every_line)
            found = finder.line_starts(buf, 0, 1 + n)
            stamp_times = _stamps(buf, found, 1 + n, clock)
            stamp_starts = [p - 1 for p in found]
            si, ns = 0, len(stamp_starts)
            batch: list[Event] = []
            for ci, cs, raw, head, cand in items:
                while si < ns and stamp_starts[si] < cs:
                    w = stamp_times[si]
                    if w is not None and w > steps.cur:
                        steps.cur = w
                    si += 1
                own: float | None = None
                if si < ns and stamp_starts[si] == cs:
                    own = stamp_times[si]
                    si += 1
                if own is not None:
                    if own > steps.cur:
                        steps.cur = own
                elif _STEP_NEEDLE in raw:
                    steps.step_line(raw, offset + cs)
                t = steps.cur
                if offset + cs > tail_from:
                    t = UNDATED
                    if fc.known_end is None:
                        fc.known_end = steps.cur
                batch.append((t, order, lineno + ci, offset + cs, raw, head, cand))
            while si < ns:
                w = stamp_times[si]
                if w is not None and w > steps.cur:
                    steps.cur = w
                si += 1
            lineno += total
            yield batch
    finally:
        os.close(fd)
    fc.end = fc.known_end = steps.cur


def _chunk_items(
    buf: bytes | bytearray, n: int, offset: int, cands: list[tuple[int, int, bytes]], every_line: bool
) -> list[tuple[int, int, bytes, bool, bool]]:
    """The lines of a chunk to yield: (index in chunk, start in chunk, raw, in the head, candidate).
    In the head (or with `every_line`) every line, else the pre-filter's candidates."""
    if not every_line and offset >= HEAD_FULL:
        return [(ci, cs, raw, False, True) for ci, cs, raw in cands]
    cand_starts = {c[1] for c in cands}
    region = bytes(buf[1 : 1 + n])
    items: list[tuple[int, int, bytes, bool, bool]] = []
    pos = i = 0
    while pos < n:
        nl = region.find(b"\n", pos)
        stop = n if nl == -1 else nl
        head, cand = offset + pos < HEAD_FULL, pos in cand_starts
        if every_line or head or cand:
            items.append((i, pos, region[pos:stop], head, cand))
        i += 1
        pos = stop + 1
    return items


class _AuthCursor:
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
            k = raw.find(_STEP_NEEDLE) + len(_STEP_NEEDLE)
            if raw.startswith(b"%d," % fc.auth_steps[na], k):
                fact = step_fact(raw)
                if fact is not None and fact[1] != fc.auth_task and fact[0] == fc.auth_steps[na]:
                    self.cur += fc.advance(na)
                    self.early = na


FORK_MIN = 8 << 20  # smaller files are read in-process: a fork costs more than it saves


def read_timed_forked(fc: FileClock, start: float, ref_time: float) -> Iterator[Event]:
    """`read_timed` run in a forked process while this one feeds the states and runs the ticks
    (one-shot CLI only: a process with threads must not fork). The pipe's buffer bounds what is
    in flight to about a chunk."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_read_worker, args=(fc, start, ref_time, send), daemon=True)
    proc.start()
    send.close()
    try:
        while True:
            msg = recv.recv()
            if isinstance(msg, list):
                yield from msg
            elif isinstance(msg, tuple):  # the read reached the undated tail: the file's last known time
                fc.known_end = msg[1]
            elif isinstance(msg, float):
                fc.end = fc.known_end = msg
                return
            else:
                raise OSError(f"reading {fc.path}: {msg}")
    finally:
        recv.close()
        if proc.is_alive():
            proc.terminate()
        proc.join()


def _read_worker(fc: FileClock, start: float, ref_time: float, conn: Connection) -> None:
    try:
        told = False
        for batch in _read_batches(fc, start, ref_time):
            if not told and fc.known_end is not None:  # before the first undated line's batch
                conn.send(("known_end", fc.known_end))
                told = True
            conn.send(batch)
        conn.send(fc.end)
    except BaseException as exc:  # reported by the parent as one error
        conn.send(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def place_unstamped(clocks: Sequence[FileClock], ref_time: float) -> list[float]:
    """Each file's start: a file without any timestamp is placed so that its first step line is
    at the time another file shows that step (a RAY=1 worker log against the Slurm log's
    forwarded copy), else with the job's other files (at 0 when none has a timestamp)."""
    stamped = [fc for fc in clocks if fc.start is not None]
    anchor = min((fc.start for fc in stamped if fc.start is not None), default=0.0)
    out: list[float] = []
    for fc in clocks:
        if fc.start is not None:
            out.append(fc.start)
            continue
        start = anchor
        if fc.auth_steps:
            first = fc.auth_steps[0]
            for other in stamped:
                at = _first_time_of_step(other, first, ref_time)
                if at is not None:
                    start = at - fc.advance(0)
                    break
        out.append(start)
    return out


def _first_time_of_step(fc: FileClock, step: int, ref_time: float) -> float | None:
    """When `step` first shows in a file on its clock (None if it never does before a later step)."""
    probe = dataclasses.replace(fc)  # the read sets `end`: leave the real one alone
    assert probe.start is not None
    for t, _o, _l, _off, raw, _h, _c in read_timed(probe, probe.start, ref_time):
        if _STEP_NEEDLE in raw:
            fact = step_fact(raw)
            if fact is not None and fact[0] >= step:
                return t if fact[0] == step else None
    return None


def timeline(
    path: Path,
    order: int,
    ref_time: float,
    anchor: float | None = None,
    access: LogAccess = ANYWHERE,
    *,
    undated_at: float | None = None,
) -> list[Line]:
    """Every line of one file with its virtual time (see the module docstring).

    `anchor`: where a file without any timestamp starts (the job's other files' start).
    `undated_at`: where the file's undated tail goes (the job's end; default: the file's own last
    known time). The file is opened through `access` (regular files only: a FIFO never blocks the
    replay)."""
    fc = survey(path, order, ref_time, access)
    start = fc.start if fc.start is not None else (anchor or 0.0)
    out: list[Line] = []
    for t, _o, lineno, off, raw, _h, _c in read_timed(fc, start, ref_time, every_line=True):
        if t == UNDATED:
            own = fc.known_end if fc.known_end is not None else start
            t = undated_at if undated_at is not None else own
        out.append(
            Line(t, order, lineno, off, raw[:MAX_LINE].rstrip(b"\r").decode("utf-8", errors="replace"))
        )
    return out


@dataclass
class Alert:
    kind: str
    event: str
    at_step: int | None
    at_s: float
    cls: str | None
    summary: str
    budget_s: float | None = None  # hang alerts: the stall budget the detector applied
    phase: str | None = None  # hang alerts: its phase (startup | warmup | checkpoint | steady)
    at: float | None = None  # the tick's time on the virtual clock (epoch seconds when dated)
    gpu_confirmed: bool = False  # hang alerts: paged early on the GPUs' evidence

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "gpu_confirmed": self.gpu_confirmed,
            "event": self.event,
            "at_step": self.at_step,
            "at_s": round(self.at_s, 1),
            "class": self.cls,
            "summary": self.summary,
            "budget_s": None if self.budget_s is None else round(self.budget_s, 1),
            "phase": self.phase,
        }


@dataclass
class JobReplay:
    job: str
    log: str | None
    alerts: list[Alert] = field(default_factory=list)
    first_step_at: float | None = None
    last_step: int | None = None
    last_step_at_s: float | None = None
    step_time_s: float | None = None
    end_at_s: float | None = None
    barrier_at_s: float | None = None  # when the pre-training barrier line was read
    final_status: str | None = None
    final_primary: str | None = None
    early_queries: int = 0  # early-page queries answered from the job's TSDB
    early_note: str | None = None  # why the early page could not be replayed, if it could not
    early_states: dict[str, int] = field(default_factory=dict)  # early verdicts by state
    undated_lines: int = 0  # lines of an undated tail taken in at the job's end (their time is unknown)
    # What the replay fed, one state per file (main log first): the daemon's view at the end.
    states: list[LogState] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "log": self.log,
            "alerts": [a.to_dict() for a in self.alerts],
            "last_step": self.last_step,
            "last_step_at_s": None if self.last_step_at_s is None else round(self.last_step_at_s, 1),
            "step_time_s": self.step_time_s,
            "end_at_s": None if self.end_at_s is None else round(self.end_at_s, 1),
            "barrier_at_s": None if self.barrier_at_s is None else round(self.barrier_at_s, 1),
            "final_status": self.final_status,
            "final_primary": self.final_primary,
            "early_queries": self.early_queries,
            "early_note": self.early_note,
            "early_states": dict(self.early_states),
            "undated_lines": self.undated_lines,
        }


def _readable(path: Path, access: LogAccess) -> bool:
    try:
        os.close(access.open(path))
    except OSError:
        return False
    return True


def _files(ref: JobRef, ref_time: float, access: LogAccess) -> tuple[list[Path], str | None]:
    """Main log plus, for RAY=1, the head node's worker logs (what the daemon tails); files that
    `access` refuses (not regular, outside the job's root, another user's) are left out."""
    files: list[Path] = [ref.log] if ref.log is not None and _readable(ref.log, access) else []
    head: str | None = None
    d = ref.job_dir
    if files and d is not None and (d / "ray_logs").is_dir():
        probe = load_job(
            JobRef(ref.job_id, ref.name, None, ref.log, ref.platform), ref_time=ref_time, access=access
        ).main
        if probe is not None:
            head = probe.ray_head or probe.tunnel_host
            if head is None and probe.header.get("JOB_NODELIST"):
                nodes = expand_hostlist(probe.header["JOB_NODELIST"])
                head = nodes[0] if nodes else None
        if head is not None and (d / "ray_logs" / head).is_dir():
            hd = d / "ray_logs" / head
            workers = sorted(hd.glob("worker-*.out")) + sorted(hd.glob("worker-*.err"))
            files += [f for f in workers if _readable(f, access)]
        else:
            head = None
    return files, head


def replay(ref: JobRef, cfg: Config, *, tick: float, ref_time: float, workers: int = 1) -> JobReplay:
    """`workers` > 1: files over `FORK_MIN` are read by forked processes (see `read_timed_forked`)."""
    key = ref.job_id or ref.name or str(ref.log)
    result = JobReplay(job=key, log=str(ref.log) if ref.log else None)
    access = job_access(ref)
    files, head = _files(ref, ref_time, access)
    if not files:
        return result
    clocks = [survey(f, i, ref_time, access) for i, f in enumerate(files)]
    starts = place_unstamped(clocks, ref_time)
    reads = [
        read_timed_forked(fc, start, ref_time)
        if workers > 1 and fc.path.stat().st_size >= FORK_MIN
        else read_timed(fc, start, ref_time)
        for fc, start in zip(clocks, starts, strict=True)
    ]
    events: Iterator[Event] = reads[0] if len(reads) == 1 else heapq.merge(*reads)
    first = min(starts)
    states = result.states = [LogState(str(f), ref_time=ref_time, retention=TAIL) for f in files]  # as tailed
    view = JobView(key=key, ref=ref, first_seen=first, policy=policy_from_config(cfg))
    view.main = states[0]
    if head is not None and len(states) > 1:
        view.head_host = head
        view.workers = {head: states[1:]}
    run = _Run(ref, cfg, view, result, first + tick, tick, head, clocks)
    try:
        run.feed(events, states)
        end = max(first, *(fc.end for fc in clocks))
        run.take_in()
        # Trailing lines that only moved the clock (chatter after the last fed line).
        run.until(end, inclusive=False)
    finally:
        if run.early is not None:
            run.early.close()
    run.end(ref, access, ref_time, end)
    base = run.t0 if run.t0 is not None else first
    result.end_at_s = end - base
    result.last_step = view.last_step
    if view.last_step_at is not None:
        result.last_step_at_s = view.last_step_at - base
    if view.marker_at is not None:
        result.barrier_at_s = view.marker_at - base
    st_time = view.step_time()
    result.step_time_s = round(st_time, 3) if st_time else None
    assert view.final is not None
    result.final_status = view.final.status
    result.final_primary = view.final.primary
    return result


class _Run:
    """One job's replay on its virtual clock: lines fed to the states, ticks (and early polls)
    run between them in time order, the job-end tick at the end."""

    def __init__(
        self,
        ref: JobRef,
        cfg: Config,
        view: JobView,
        out: JobReplay,
        next_tick: float,
        tick: float,
        head: str | None,
        clocks: Sequence[FileClock] = (),
    ) -> None:
        self.view, self.out, self.next_tick, self.tick = view, out, next_tick, tick
        self.clocks = clocks
        self.undated_at: float | None = None  # where the files' undated tails go: the job's end
        self.policy = view.policy
        self.detectors = build_detectors(cfg)
        hang = next((d for d in self.detectors if isinstance(d, HangDetector)), None)
        # As the engine wires it (rule VIEW-1): the view's triage knows what the detector knows.
        view.stall_source = hang.knowledge if hang is not None else None
        self.book = IncidentBook.from_config(cfg.incidents)
        self.ticks = 0
        self.t0: float | None = None
        self.fed_at: float | None = None  # the last fed line's time, until the view has taken it in
        self.early = (
            _EarlyReplay.for_job(ref, cfg, out, hang)
            if cfg.tsdb.early_page and head is not None and hang is not None
            else None
        )

    def take_in(self) -> None:
        """The view takes in the lines fed so far (as the engine does after every read)."""
        if self.fed_at is not None:
            self.view.note_read(self.fed_at)
            self.fed_at = None

    def until(self, t: float, *, inclusive: bool) -> None:
        """Ticks (and early polls) due before `t` (at `t` too when `inclusive`), in time order."""
        view, early = self.view, self.early
        while self.ticks < MAX_TICKS:
            poll = early.next_poll(view) if early is not None else None
            if poll is not None and poll < self.next_tick and (poll < t or (inclusive and poll == t)):
                self.take_in()
                if early is not None and early.ask(view, poll):
                    self._tick(poll)  # the live daemon's early partial tick
                continue
            if not (self.next_tick < t or (inclusive and self.next_tick == t)):
                return
            self.take_in()  # before detectors
            self._tick(self.next_tick)
            self.next_tick += self.tick
            self.ticks += 1

    def feed(self, events: Iterator[Event], states: list[LogState]) -> None:
        view = self.view
        for t, order, lineno, offset, raw, head_line, cand in events:
            if t == UNDATED:
                t = self._undated_line()
            self.until(t, inclusive=True)
            st = states[order]
            # What PrefilterTailReader feeds: the head in full until training starts, then candidates.
            if not cand and not (head_line and not st.training_started):
                continue
            before = (len(st.steps), st.barrier_passed is None)
            st.feed_bytes(raw, lineno, offset)
            st.lines, st.bytes = lineno, offset + len(raw) + 1
            self.fed_at = t
            if (len(st.steps), st.barrier_passed is None) != before:
                # A new step or the barrier: its arrival is this line's time. (Other tasks' copies
                # change nothing the view needs before the next tick.)
                view.note_read(t)
                self.fed_at = None
                if self.t0 is None and view.last_step is not None:
                    self.t0 = t
                    self.out.first_step_at = t

    def _undated_line(self) -> float:
        """When a line of an undated tail is taken in: the job's end, the last time any of its files
        shows (the merge yields these lines last, so every file's last known time is in)."""
        if self.undated_at is None:
            known = [fc.known_end for fc in self.clocks if fc.known_end is not None]
            self.undated_at = max(known, default=self.view.first_seen)
        self.out.undated_lines += 1
        return self.undated_at

    def end(self, ref: JobRef, access: LogAccess, ref_time: float, end: float) -> None:
        """The job ends at its last line: the job-end report on a fresh read of its files."""
        view = self.view
        view.note_read(end)
        view.ended = True
        s = view.main.summary if view.main is not None else None
        view.end_state = end_state(s.exit_code if s is not None else None)
        view.final = analyze(load_job(ref, ref_time=ref_time, access=access), now=end, policy=self.policy)
        self._tick(end)

    def _tick(self, now: float) -> None:
        _tick(self.view, self.detectors, self.book, now, self.out, self.t0)


class ReplayTsdb:
    """A read-only Prometheus over a private copy of a finished job's TSDB, queried synchronously.

    The copy holds everything but the lock (WAL included: a job's last samples, its hang, are
    often not compacted yet); the job's own directory is only read."""

    def __init__(self, pdir: Path, settings: TsdbSettings, label: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._tmp = tempfile.TemporaryDirectory(prefix="jobdiagd-backtest-tsdb-", dir=settings.work_dir)
        self._prom: LocalPrometheus | None = None
        self._client: PromClient | None = None
        try:
            copy_tsdb(pdir, Path(self._tmp.name), FULL_COPY_EXCLUDES)
            prom = LocalPrometheus(Path(self._tmp.name), settings, label=label)
            self._loop.run_until_complete(prom.start())
            self._prom = prom
            self._client = PromClient(
                prom.base_url, label=f"read-only copy of {pdir}", timeout_s=settings.query_timeout_s
            )
        except BaseException:
            self.close()
            raise

    def query_matrix(self, promql: str, at: float) -> list[Series]:
        assert self._client is not None
        return self._loop.run_until_complete(self._client.query_matrix(promql, at))

    def close(self) -> None:
        try:
            if self._client is not None:
                self._loop.run_until_complete(self._client.close())
            if self._prom is not None:
                self._loop.run_until_complete(self._prom.stop())
        finally:
            self._client = self._prom = None
            self._loop.close()
            self._tmp.cleanup()


class _EarlyReplay:
    """The live `service.early_page` on the virtual clock: when a step is overdue, one query per
    scrape interval against the job's TSDB, judged by `tsdb.gpu_hang.judge`."""

    def __init__(
        self, pdir: Path, settings: TsdbSettings, label: str, out: JobReplay, hang: HangDetector
    ) -> None:
        self.pdir, self.settings, self.label, self.out = pdir, settings, label, out
        self.hang = hang  # its budget says when a step is overdue
        self.rule = EarlyRule(settings.early_overdue_factor, settings.early_overdue_slack_s)
        self.interval = settings.early_scrape_interval_s
        self.step: int | None = None
        self.next_at = float("-inf")
        self.tsdb: ReplayTsdb | None = None
        self.failed = False
        self.verdicts: list[GpuVerdict] = []

    @classmethod
    def for_job(cls, ref: JobRef, cfg: Config, out: JobReplay, hang: HangDetector) -> _EarlyReplay | None:
        pdir = ref.job_dir / "prometheus" if ref.job_dir is not None else None
        if pdir is None or not tsdb_has_data(pdir):
            out.early_note = "no TSDB data in the job's prometheus/: early page not replayed"
            return None
        return cls(pdir, cfg.tsdb, ref.job_id or ref.name or str(pdir), out, hang)

    def next_poll(self, view: JobView) -> float | None:
        if self.failed:
            return None
        memo = early_memo(view)
        if memo is not None and memo.verdict.confirmed:
            return None
        window = self.hang.early_window(view, self.rule)
        if window is None:
            return None
        due, budget_at = window
        if view.last_step != self.step:
            self.step, self.next_at = view.last_step, due
        at = max(due, self.next_at)
        return at if at <= budget_at else None  # past the step budget, the budget pages

    def ask(self, view: JobView, at: float) -> bool:
        """Query at virtual time `at`; True when the GPUs confirm the hang."""
        self.next_at = at + self.interval
        last = view.last_step
        assert last is not None
        try:
            if self.tsdb is None:
                self.tsdb = ReplayTsdb(self.pdir, self.settings, self.label)
            series = self.tsdb.query_matrix(gpu_query(self.interval), at)
        except (AccessError, PromError, OSError) as exc:
            self.failed = True
            self.out.early_note = f"early page not replayed: {exc}"
            return False
        self.out.early_queries += 1
        main = view.main
        nodes = (
            expand_hostlist(main.header["JOB_NODELIST"])
            if main is not None and main.header.get("JOB_NODELIST")
            else []
        )
        verdict = judge(
            series,
            at=at,
            nodes=nodes,
            profile=profile_for(series, self.settings),
            thresholds=self.settings.thresholds,
            scrape_interval_s=self.interval,
        )
        self.verdicts.append(verdict)
        self.out.early_states[verdict.state] = self.out.early_states.get(verdict.state, 0) + 1
        view.gpu_check = EarlyMemo(last, verdict, view.last_step_at)
        return verdict.confirmed

    def close(self) -> None:
        if self.tsdb is not None:
            self.tsdb.close()
            self.tsdb = None


def _tick(
    view: JobView,
    detectors: Sequence[Detector],
    book: IncidentBook,
    now: float,
    out: JobReplay,
    t0: float | None,
) -> None:
    judged = Judged()
    run_detectors(detectors, view, now, judged)
    findings = judged.kept(book)
    by_kind = {f.kind: f for f in findings}
    base = t0 if t0 is not None else view.first_seen
    for n in book.observe_all(findings, now):
        if n.event != "open":
            continue
        f = by_kind.get(n.kind)
        inc = book.get(n.job_id, n.kind)
        alert = Alert(
            n.kind,
            "open",
            inc.first_step if inc else None,
            now - base,
            _alert_class(f),
            f.summary if f else n.title,
        )
        alert.at = now
        alert.gpu_confirmed = f is not None and EARLY_DETAIL in f.details
        hang = next((d for d in detectors if isinstance(d, HangDetector)), None)
        memo = hang.budget_state(view.key) if hang is not None else None
        if n.kind == "hang" and memo is not None:
            alert.budget_s, alert.phase = memo.budget.seconds, memo.budget.phase
        out.alerts.append(alert)
    for r in judged.reports:
        final = view.final
        out.alerts.append(
            Alert(
                r.kind,
                "report",
                view.last_step,
                now - base,
                (final.primary or final.status) if final is not None else None,
                r.title,
                at=now,
            )
        )


def _alert_class(f: Finding | None) -> str | None:
    if f is None:
        return None
    if f.kind == "failure":
        return f.failure_class or "failure"
    if f.kind == "tgs-degradation":
        return "tgs-degradation"
    return f.kind


def refs_for(paths: Sequence[str]) -> list[JobRef]:
    refs: list[JobRef] = []
    for p in paths:
        path = Path(p)
        # is_symlink first: a `log` link to a name longer than the filesystem allows cannot be
        # stat()ed (ENAMETOOLONG); resolve() reports such a job.
        if path.is_dir() and not (path / "log").is_symlink() and not (path / "log").exists():
            refs += [r for r in list_jobs(path) if r.log is not None]
            continue
        refs.append(resolve(p, []))
    return refs


def main(args: argparse.Namespace) -> int:
    import structlog

    if not structlog.is_configured():
        # The replay prints its report (or JSON) to stdout; the early page's Prometheus logs go to
        # stderr -- whatever sys.stderr is when a line is logged (a caller may swap it, as pytest does).
        structlog.configure(logger_factory=lambda *_args: structlog.PrintLogger(sys.stderr))
    cfg = load_for_command(args.config, "backtest")
    if cfg is None:
        return 2
    tick = args.tick or cfg.daemon.tick_seconds
    workers = getattr(args, "workers", 1)
    if workers < 1:
        print("jobdiagd backtest: --workers must be at least 1", file=sys.stderr)
        return 2
    set_default_workers(workers)  # the job-end report's read of big logs, as in `jobdiagd triage`
    try:
        refs = refs_for(args.paths)
    except ResolveError as exc:
        print(f"jobdiagd backtest: {exc}", file=sys.stderr)
        return 2
    now = clock.wall()
    results: list[JobReplay] = []
    failed = 0
    for ref in refs:
        try:
            results.append(replay(ref, cfg, tick=tick, ref_time=now, workers=workers))
        except Exception as exc:  # one job's bad log must not lose the other jobs' replays
            failed += 1
            who = ref.job_id or ref.name or str(ref.log)
            print(f"jobdiagd backtest: job {who}: {type(exc).__name__}: {exc}", file=sys.stderr)
    if args.json:
        print(jsonsafe.dumps({"jobs": [r.to_dict() for r in results]}, indent=1))
        return 1 if failed else 0
    for r in results:
        print(
            f"job {r.job}  ({r.log})  final: {r.final_status}/{r.final_primary or '-'}  last step {r.last_step}"
        )
        if not r.alerts:
            print("    no alerts")
        for a in r.alerts:
            step = f"step {a.at_step}" if a.at_step is not None else "no step"
            print(f"    +{a.at_s:9.1f}s  {step:<10} {a.event.upper():<7} {a.kind:<16} [{a.cls}] {a.summary}")
        if r.early_queries:
            states = ", ".join(f"{n} {s}" for s, n in sorted(r.early_states.items()))
            print(f"    early page: {r.early_queries} TSDB queries ({states})")
        elif r.early_note:
            print(f"    {r.early_note}")
        if r.undated_lines:
            print(
                f"    {r.undated_lines} undated line(s) after the last dated line of their file: taken in at the "
                "job's end (their time is unknown)"
            )
    return 1 if failed else 0
