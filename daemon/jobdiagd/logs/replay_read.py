"""The backtest's read of a log file: each line with its time on the file's virtual clock
(`logs.file_clock`), read the way the daemon reads a tailed log.

Each file is read twice, streaming (what grows with the log is 25 bytes a step of the series). A
survey (`file_clock.survey`) finds the series' step lines and the first timestamp; the replay
read (`read_timed`) then reads the file the way the daemon's tail reader (`PrefilterTailReader`)
does -- the head in full until training starts, then only the lines the pre-filter (`logs.scan`,
the reader's scanner) marks as candidates -- and yields them with their virtual times, a chunk at
a time; `read_timed_forked` runs that read in a forked process (a big file, `workers` > 1). The
other lines only move the clock: the stamp finder finds the lines that may carry a timestamp and
only those are decoded. A line of a file's undated tail is yielded at `UNDATED`: the replay takes
it in at the job's end. `place_unstamped` starts a file without any timestamp against the job's
other files; `timeline` is every line of one file with its time.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from jobdiagd.logs.file_clock import (
    STEP_NEEDLE,
    AuthCursor,
    FileClock,
    line_stamps,
    stamp_finder,
    step_fact,
    survey,
)
from jobdiagd.logs.reader import HEAD_FULL, MAX_LINE, _ReadBuffer, prefilter, scanner
from jobdiagd.logs.safeopen import ANYWHERE, LogAccess
from jobdiagd.logs.state import StampClock

UNDATED = math.inf  # the time of a line of a file's undated tail, until the job's end is known

# (time, file order, line number, offset, raw line, in the head, pre-filter candidate)
Event = tuple[float, int, int, int, bytes, bool, bool]


@dataclass(frozen=True, slots=True)
class Line:
    t: float
    order: int  # file index: ties keep the main log first
    lineno: int
    offset: int
    text: str


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
    finder, scan = stamp_finder(), scanner()
    clock = StampClock(ref_time)
    steps = AuthCursor(fc, start)
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
            stamp_times = line_stamps(buf, found, 1 + n, clock)
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
                elif STEP_NEEDLE in raw:
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
        if STEP_NEEDLE in raw:
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
