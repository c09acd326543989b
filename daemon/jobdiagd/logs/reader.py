"""Read log files into `LogState` as a stream: bounded memory, any size, any bytes.

The head (header, env dump) and the tail (summary, last words) of a file are parsed
line by line; the body only where the pre-filter (`logs.scan`) finds a trigger
literal, which is what makes multi-GB logs cheap. `TailReader` is the incremental
form the daemon uses: it remembers its offset and feeds only new complete lines.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from jobdiagd.logs.scan import LineScanner, default_scanner
from jobdiagd.logs.state import LogState

CHUNK = 8 << 20
HEAD_FULL = 512 << 10
TAIL_FULL = 128 << 10
MAX_LINE = 64 << 10  # longer lines are cut: a runaway line must not blow memory

_scanner: LineScanner | None = None


def scanner() -> LineScanner:
    global _scanner
    if _scanner is None:
        _scanner = default_scanner()
    return _scanner


_SRUN_PREFIX = re.compile(rb"(?m)^( *(?:P\d+ +)?)(\d{1,6}): ")
_NNODES = re.compile(rb"(?m)^NNODES=(\d{1,6})")


def task0_prefixes(head: bytes) -> tuple[bytes, ...]:
    """The `srun -l` prefixes task 0 uses in this log, from its first megabytes.

    Empty when the log has no multi-task srun prefixes (then every step line is read).
    The width srun pads to follows from the task count, so the NNODES width is added
    in case the training step's srun is not in the head yet."""
    tasks: set[bytes] = set()
    zero: set[bytes] = set()
    for m in _SRUN_PREFIX.finditer(head):
        tasks.add(m.group(2))
        if m.group(2) == b"0":
            zero.add(m.group(1) + b"0: ")
        if len(tasks) > 1 and len(zero) >= 2:
            break
    if len(tasks) < 2 or not zero:
        return ()
    n = _NNODES.search(head)
    if n is not None:
        width = len(str(max(int(n.group(1)) - 1, 0)))
        zero.add(b" " * (width - 1) + b"0: ")
    return tuple(sorted(zero))


def feed_buffer(
    state: LogState,
    buf: bytes,
    *,
    base_offset: int,
    first_lineno: int,
    full: bool,
    scan: LineScanner | None = None,
    prefixes: tuple[bytes, ...] = (),
) -> int:
    """Feed the complete lines of `buf` (which must end at a line boundary). Returns lines seen."""
    if full:
        lineno = first_lineno
        pos = 0
        n = len(buf)
        while pos < n:
            end = buf.find(b"\n", pos)
            if end == -1:
                end = n
            state.feed_bytes(buf[pos:end], lineno, base_offset + pos)
            lineno += 1
            pos = end + 1
        return lineno - first_lineno
    sc = scan or scanner()
    count = buf.count
    lineno = first_lineno
    prev = 0
    for start in sc.candidates(buf, prefixes):
        lineno += count(b"\n", prev, start)
        end = buf.find(b"\n", start)
        if end == -1:
            end = len(buf)
        state.feed_bytes(buf[start:end], lineno, base_offset + start)
        prev = start
    total = count(b"\n")
    if buf and not buf.endswith(b"\n"):
        total += 1
    return total


def read_file(
    path: Path, state: LogState, *, scan: LineScanner | None = None, full: bool = False
) -> LogState:
    """Parse a whole file into `state` (head and tail fully, body through the pre-filter)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        tail_start = max(0, size - TAIL_FULL)
        offset = 0
        lineno = 1
        carry = b""
        prefixes: tuple[bytes, ...] | None = None
        while True:
            data = fh.read(CHUNK)
            if not data:
                break
            if prefixes is None:
                prefixes = task0_prefixes(data[: 2 << 20])
            buf = carry + data if carry else data
            cut = buf.rfind(b"\n") + 1
            if cut == 0:
                if len(buf) > MAX_LINE * 4:
                    cut = len(buf)  # a gigantic line without newline: treat as complete
                else:
                    carry = buf
                    continue
            body, carry = buf[:cut], buf[cut:]
            lineno, offset = _feed_region(state, body, offset, lineno, tail_start, full, scan, prefixes or ())
        if carry:
            state.ends_with_newline = False
            lineno, offset = _feed_region(state, carry, offset, lineno, tail_start, True, scan, ())
        else:
            state.ends_with_newline = True
        state.lines = lineno - 1
        state.bytes = size
    return state


def _feed_region(
    state: LogState,
    body: bytes,
    offset: int,
    lineno: int,
    tail_start: int,
    full: bool,
    scan: LineScanner | None,
    prefixes: tuple[bytes, ...] = (),
) -> tuple[int, int]:
    """Split a chunk into full-parse head/tail parts and a pre-filtered middle."""
    end = offset + len(body)
    pieces: list[tuple[int, int, bool]] = []
    head_end = HEAD_FULL
    if full or end <= head_end or offset >= tail_start:
        pieces.append((0, len(body), True))
    else:
        a = 0
        if offset < head_end:
            cut = body.find(b"\n", head_end - offset)
            a = len(body) if cut == -1 else cut + 1
            pieces.append((0, a, True))
        b = len(body)
        if end > tail_start:
            cut = body.rfind(b"\n", a, max(a, tail_start - offset))
            b = a if cut == -1 else cut + 1
        if b > a:
            pieces.append((a, b, False))
        if b < len(body):
            pieces.append((b, len(body), True))
    for a, b, is_full in pieces:
        if b <= a:
            continue
        lineno += feed_buffer(
            state,
            body[a:b],
            base_offset=offset + a,
            first_lineno=lineno,
            full=is_full,
            scan=scan,
            prefixes=prefixes,
        )
    return lineno, end


@dataclass
class TailReader:
    """Incremental reader for a growing file; survives truncation and replacement."""

    path: Path
    state: LogState
    offset: int = 0
    lineno: int = 1
    inode: int | None = None
    head: bytes = b""  # the file's first bytes: a new file reusing the inode differs here
    _carry: bytes = b""

    def poll(self, max_bytes: int = 64 << 20) -> int:
        """Feed whatever complete lines were appended since the last call. Returns bytes consumed.

        Raises OSError when the file cannot be read (the caller reports "monitoring blind").
        """
        st = os.stat(self.path)
        if self.inode is not None and st.st_ino != self.inode:
            self.reset()  # rotated / replaced: the new file starts from zero
        if st.st_size < self.offset:
            self.reset()  # truncated in place
        self.inode = st.st_ino
        with open(self.path, "rb") as fh:
            first = fh.read(len(self.head) or 64)
            if self.head and not first.startswith(self.head):
                self.reset()  # replaced by a new file that happens to reuse the inode
            if not self.head:
                self.head = first
            if st.st_size == self.offset:
                return 0
            fh.seek(self.offset)
            data = fh.read(min(max_bytes, st.st_size - self.offset))
        body_start = self.offset - len(self._carry)
        buf = self._carry + data
        cut = buf.rfind(b"\n") + 1
        body, self._carry = buf[:cut], buf[cut:]
        if body:
            self.lineno += feed_buffer(
                self.state,
                body,
                base_offset=body_start,
                first_lineno=self.lineno,
                full=self.read_fully(body_start),
            )
        self.offset += len(data)
        self.state.lines = self.lineno - 1
        self.state.bytes = self.offset
        self.state.ends_with_newline = not self._carry
        return len(data)

    def read_fully(self, body_start: int) -> bool:
        """Parse every line of this chunk (True), or only the pre-filter's candidates (False)."""
        return True

    def reset(self) -> None:
        self.state = LogState(self.state.source, ref_time=self.state.clock.ref_time)
        self.offset = 0
        self.lineno = 1
        self.inode = None
        self.head = b""
        self._carry = b""
