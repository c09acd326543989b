"""The body of a big log in one pass: its candidate lines, and its new step lines as columns.

`read_fd` reads the middle of a log (between the fully parsed head and tail) through here. For
each buffer of complete lines the pre-filter (`logs.scan`) gives the lines worth parsing;
`scan_buffer` numbers them (one `bytes.count` per gap: no per-line work, no numpy) and sorts
them into two kinds:

- step lines in the common shapes (`parse_fast_step` would parse them): their facts go into
  `StepColumns`, flat arrays that pickle as plain bytes out of a worker process, and that
  `LogState.add_fast_steps` folds in bulk — the per-line Python work of a multi-GB log was
  once most of its triage time;
- every other candidate: its raw bytes, exactly as `reader.prefilter` hands them to
  `LogState.feed_bytes` (known-harmless lines dropped the same way).

The fast parse is a narrower form of `parse_fast_step` (one regex from the line start, for
task 0's srun prefixes and the absl stamp); whatever it does not take goes through
`parse_fast_step` itself, so the two never disagree (tested on generated messy lines).
"""

from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass, field
from functools import lru_cache

from jobdiagd.logs.scan import HARMLESS_ONLY, LineScanner
from jobdiagd.logs.state import FastStep, parse_fast_step

STEP_NEEDLE = b"completed step: "
FAST_LINE_MAX = 4096  # `parse_fast_step` leaves longer lines to the general parser
NO_TASK = -1  # the task column of a line without an srun prefix
NO_SECONDS = math.nan  # the seconds column of a step line without a `seconds:` field


def _ints() -> array[int]:
    return array("q")


def _floats() -> array[float]:
    return array("d")


@dataclass(slots=True)
class StepColumns:
    """Step lines in file order, one entry per line: what `parse_fast_step` returns, plus where
    the line is (its field text is read back from the file only for the records kept)."""

    line: array[int] = field(default_factory=_ints)  # line index (absolute once folded)
    offset: array[int] = field(default_factory=_ints)  # file offset of the line
    length: array[int] = field(default_factory=_ints)  # bytes, without the newline
    step: array[int] = field(default_factory=_ints)
    task: array[int] = field(default_factory=_ints)  # NO_TASK: no srun prefix
    month: array[int] = field(default_factory=_ints)  # 0: no absl stamp
    day: array[int] = field(default_factory=_ints)
    secs: array[float] = field(default_factory=_floats)  # seconds since midnight of the stamp
    seconds: array[float] = field(default_factory=_floats)  # NO_SECONDS: no `seconds:` field
    rest: array[int] = field(default_factory=_ints)  # where the field text starts in the line

    def __len__(self) -> int:
        return len(self.step)

    def extend(self, other: StepColumns, line_base: int, lo: int, hi: int) -> None:
        """Append entries [lo, hi) of `other`, their line indexes shifted by `line_base`."""
        self.line.extend(array("q", map(line_base.__add__, other.line[lo:hi])))
        for name in ("offset", "length", "step", "task", "month", "day", "secs", "seconds", "rest"):
            getattr(self, name).extend(getattr(other, name)[lo:hi])

    def clear(self) -> None:
        for name in self.__slots__:
            del getattr(self, name)[:]

    def fast(self, j: int, raw: bytes) -> FastStep:
        """Entry `j` as `parse_fast_step(raw)` returns it (`raw`: the line's bytes)."""
        task = self.task[j]
        seconds = self.seconds[j]
        return (
            self.step[j],
            None if task == NO_TASK else task,
            self.month[j],
            self.day[j],
            self.secs[j],
            None if seconds != seconds else seconds,  # NaN: no field
            raw[self.rest[j] :],
        )


@dataclass(slots=True)
class BodyPiece:
    """What one buffer (or a worker's piece) of the body holds for the parser."""

    lines: int = 0  # lines in the piece (a last line without newline counts)
    # (line index, file offset, raw line): candidates that are not fast step lines, in order
    others: list[tuple[int, int, bytes]] = field(default_factory=list)
    steps: StepColumns = field(default_factory=StepColumns)


@lru_cache(maxsize=8)
def fast_step_line(prefixes: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """A step line from its start, in the shapes big logs print: task 0's srun prefix (when the
    log has them), an optional Ray actor, an optional absl stamp, then `completed step: N,
    seconds: X` with X ending at a comma or the line end.

    Every line it matches, `parse_fast_step` parses the same (its prefix regex accepts all of
    these and splits them the same way) once the caller checks what the regex does not: the
    match is at the line's first `completed step: `, the line is short enough and its field
    text has no `\\r` or escape (two `find`s cost less than a character class to the end)."""
    lead = b"(?:" + b"|".join(re.escape(p) for p in prefixes) + b")" if prefixes else b""
    return re.compile(
        lead + rb"(?:\([\w.:-]+ pid=\d+[^)]*\) )?"
        rb"(?:([IWEF])(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,6}) +\d+ [^\]\s]+\] )?"
        rb"(?:\[Rampup Batch Size Phase\], )?"
        # Bounded digits: a longer number is garbage the full parser drops (MAX_DIGITS, and
        # plausible_seconds' 1e9 s), so such a line must take that path, not this one.
        rb"completed step: (\d{1,18}), seconds: (\d{1,9}\.\d+)(?=,|$)"
    )


def scan_buffer(
    buf: bytes | bytearray,
    n: int,
    offset: int,
    prefixes: tuple[bytes, ...],
    scan: LineScanner,
    out: BodyPiece,
) -> None:
    """Add the lines of `buf[1 : 1 + n]` (complete lines; `buf[0]` a sentinel newline) at file
    `offset` to `out`, their indexes counted from `out.lines`."""
    end = 1 + n
    count, find = buf.count, buf.find
    spans = getattr(scan, "scan_spans", None)
    if spans is not None:
        starts, ends = spans(buf, prefixes, end)
    else:
        starts = scan.scan_lines(buf, prefixes, 0, end)
        ends = [end if (nl := find(b"\n", s, end)) == -1 else nl for s in starts]
    match = fast_step_line(prefixes).match
    cols = out.steps
    others = out.others
    base = offset - 1  # file offset of buf[0]
    task0 = 0 if prefixes else NO_TASK
    # Lines the regex took: (line index, start, end, match), converted in bulk below (before the
    # buffer is reused: a match refers to it).
    fast: list[tuple[int, int, int, re.Match[bytes]]] = []
    index = out.lines
    prev = 1
    for s, e in zip(starts, ends, strict=True):
        index += count(b"\n", prev, s)
        prev = s
        k = find(STEP_NEEDLE, s, e)
        if k == -1:
            if any(find(h, s, e) != -1 for h in HARMLESS_ONLY):
                continue  # LogState.feed_bytes would drop it too
            others.append((index, base + s, bytes(buf[s:e])))
            continue
        m = match(buf, s, e) if e - s < FAST_LINE_MAX else None
        if m is not None and m.start(8) - 16 == k:
            rest = m.end(8) + 1
            if find(b"\r", rest, e) == -1 and find(b"\x1b", rest, e) == -1:
                fast.append((index, s, e, m))
                continue
        raw = bytes(buf[s:e])
        parsed = parse_fast_step(raw)
        if parsed is None:
            others.append((index, base + s, raw))
            continue
        _add_fast(cols, fast, base, task0)
        fast.clear()
        step, task, month, day, secs, seconds, fields = parsed
        cols.line.append(index)
        cols.offset.append(base + s)
        cols.length.append(e - s)
        cols.step.append(step)
        cols.task.append(NO_TASK if task is None else task)
        cols.month.append(month)
        cols.day.append(day)
        cols.secs.append(secs)
        cols.seconds.append(NO_SECONDS if seconds is None else seconds)
        cols.rest.append(len(raw) - len(fields))
    _add_fast(cols, fast, base, task0)
    out.lines = index + count(b"\n", prev, end) + (1 if n and buf[n] != 10 else 0)


def _add_fast(
    cols: StepColumns, fast: list[tuple[int, int, int, re.Match[bytes]]], base: int, task0: int
) -> None:
    """Append the lines `fast_step_line` matched: C-level loops over columns, not one Python
    statement per field per line (this is the inner loop of a multi-GB triage)."""
    if not fast:
        return
    index, starts, ends, matches = zip(*fast, strict=True)
    level, month, day, hh, mm, ss, us, num, seconds = zip(*[m.groups() for m in matches], strict=True)
    cols.line.extend(index)
    cols.offset.extend(map(base.__add__, starts))
    cols.length.extend(map(int.__sub__, ends, starts))
    cols.step.extend(map(int, num))
    cols.task.extend([task0] * len(fast))
    cols.seconds.extend(map(float, seconds))
    cols.rest.extend([m.end(8) + 1 - s for m, s in zip(matches, starts, strict=True)])
    if None not in level:
        cols.month.extend(map(int, month))
        cols.day.extend(map(int, day))
        # As parse_fast_step computes it (int / int: the same rounding).
        cols.secs.extend(
            [
                h * 3600 + m * 60 + s + u / 10 ** len(ub)
                for h, m, s, u, ub in zip(
                    map(int, hh), map(int, mm), map(int, ss), map(int, us), us, strict=True
                )
            ]
        )
        return
    for lv, mo, d, h, mi, sec, u in zip(level, month, day, hh, mm, ss, us, strict=True):
        if lv is None:
            cols.month.append(0)
            cols.day.append(0)
            cols.secs.append(0.0)
        else:
            cols.month.append(int(mo))
            cols.day.append(int(d))
            cols.secs.append(int(h) * 3600 + int(mi) * 60 + int(sec) + int(u) / 10 ** len(u))
