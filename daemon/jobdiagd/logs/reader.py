"""Read log files into `LogState` as a stream: bounded memory, any size, any bytes.

The head (header, env dump) and the tail (summary, last words) of a file are parsed
line by line; the body only where the pre-filter (`logs.scan`) finds a trigger
literal, which is what makes multi-GB logs cheap. Files are read into one reusable
buffer (no per-chunk allocations), and a big body can be pre-filtered by forked workers
(`set_default_workers`, used by the one-shot CLI) while this process folds their results
into the state in file order. `TailReader` is the incremental form the daemon uses: it
remembers its offset and feeds only new complete lines. Files are opened through a
`safeopen.LogAccess` (regular files only, never blocking; the caller's roots and owner).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobdiagd.logs.body import BodyPiece, StepColumns, scan_buffer
from jobdiagd.logs.safeopen import ANYWHERE, LogAccess
from jobdiagd.logs.scan import HARMLESS_ONLY, HyperscanScanner, LineScanner, default_scanner
from jobdiagd.logs.state import LogState

if TYPE_CHECKING:
    from concurrent.futures import Future

    import numpy as np
    import numpy.typing as npt

CHUNK = 2 << 20
PIECE = 32 << 20  # a worker's unit of work in a parallel read, at most
MIN_PIECE = 4 << 20  # smaller pieces would cost more in start-up than they save in balance
PARALLEL_MIN = 128 << 20  # smaller bodies are read serially: forking costs more than it saves
SMALL_BUFFER = 64 << 10  # below this, `prefilter` does its bookkeeping in plain Python (daemon polls)
FOLD_STEPS = 1 << 16  # fast step lines collected before they are folded into the state at once
HEAD_FULL = 512 << 10
TAIL_FULL = 128 << 10
MAX_LINE = 64 << 10  # longer lines are cut: a runaway line must not blow memory

_scanner: LineScanner | None = None


def scanner() -> LineScanner:
    global _scanner
    if _scanner is None:
        _scanner = default_scanner()
    return _scanner


# Matched from the newline before a line (a `(?m)^` pattern tries every byte of the head).
_SRUN_PREFIX = re.compile(rb"\n( *(?:P\d+ +)?)(\d{1,6}): ")
_SRUN_TASK0 = re.compile(rb"\n( *(?:P\d+ +)?)0: ")  # the lines _SRUN_PREFIX reads as task 0
_NNODES = re.compile(rb"\nNNODES=(\d{1,6})")


def task0_prefixes(head: bytes) -> tuple[bytes, ...]:
    """The `srun -l` prefixes task 0 uses in this log, from its first megabytes.

    Empty when the log has no multi-task srun prefixes (then every step line is read).
    The width srun pads to follows from the task count, so the NNODES width is added
    in case the training step's srun is not in the head yet.

    Reads the prefixed lines in order until it has seen two tasks and two forms of task 0's
    prefix (or the end): without walking every prefixed line in Python (`_task0_reference`
    is that walk, the definition; tested equal)."""
    head = b"\n" + head
    first = _SRUN_PREFIX.search(head)
    if first is None:
        return ()
    # The first line of another task than the first line's.
    other = re.compile(rb"\n( *(?:P\d+ +)?)(?!" + re.escape(first.group(2)) + rb": )(\d{1,6}): ")
    second = other.search(head, first.end())
    if second is None:
        return ()  # one task
    zero: set[bytes] = set()
    if first.group(2) == b"0":  # every prefixed line before `second` is task 0's
        for m in _SRUN_TASK0.finditer(head, first.start(), second.start()):
            zero.add(m.group(1) + b"0: ")
    if second.group(2) == b"0":
        zero.add(second.group(1) + b"0: ")
    if len(zero) < 2:  # two tasks seen: only task 0's lines can change the answer now
        for m in _SRUN_TASK0.finditer(head, second.end()):
            zero.add(m.group(1) + b"0: ")
            if len(zero) >= 2:
                break
    if not zero:
        return ()
    n = _NNODES.search(head)
    if n is not None:
        width = len(str(max(int(n.group(1)) - 1, 0)))
        zero.add(b" " * (width - 1) + b"0: ")
    return tuple(sorted(zero))


def _task0_reference(head: bytes) -> tuple[bytes, ...]:
    """`task0_prefixes` as one walk over every prefixed line (slow on a big head)."""
    head = b"\n" + head
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


def prefilter(
    buf: bytes | bytearray,
    prefixes: tuple[bytes, ...] = (),
    scan: LineScanner | None = None,
    *,
    end: int | None = None,
    eq: npt.NDArray[np.bool_] | None = None,
) -> tuple[int, list[tuple[int, int, bytes]]]:
    """The lines of `buf[1:end]` worth parsing, as (line index, offset, raw line): the
    scanner's candidates less the known-harmless lines.

    `buf[0]` is the newline before the region (a sentinel); index and offset count from
    `buf[1]`. Also returns how many lines the region has (a last line without newline
    counts). A pure function of the bytes, so it can run in a worker process. `eq` is an
    optional reusable scratch array of at least `end - 1` booleans."""
    n = len(buf) if end is None else end
    sc = scan or scanner()
    starts = sc.scan_lines(buf, prefixes, 0, n)
    if n <= SMALL_BUFFER:
        return _prefilter_small(buf, n, starts)
    # Newline positions in one vectorised pass (bytes.count is ~5x slower on GiB logs);
    # a line's index is the number of newlines before it. numpy is imported here, on the
    # first large buffer: a small log (and the CLI's start-up) never pays for it.
    import numpy as np

    region = np.frombuffer(buf, dtype=np.uint8, count=n - 1, offset=1)
    is_nl = np.equal(region, 10, out=eq[: n - 1]) if eq is not None else region == 10
    newlines = np.flatnonzero(is_nl)
    del region, is_nl
    total = int(newlines.size) + (1 if n > 1 and buf[n - 1] != 10 else 0)
    if not starts:
        return total, []
    rel = np.asarray(starts) - 1
    index = np.searchsorted(newlines, rel)
    ends = np.append(newlines, n - 1)[index]
    out: list[tuple[int, int, bytes]] = []
    with memoryview(buf) as view:
        for start, stop, i in zip(rel.tolist(), ends.tolist(), index.tolist(), strict=True):
            raw = view[start + 1 : stop + 1].tobytes()
            if b"completed step: " not in raw and any(h in raw for h in HARMLESS_ONLY):
                continue  # LogState.feed_bytes would drop it too
            out.append((i, start, raw))
    return total, out


def _prefilter_small(
    buf: bytes | bytearray, n: int, starts: list[int]
) -> tuple[int, list[tuple[int, int, bytes]]]:
    """`prefilter` for a few KB (a daemon poll): numpy's fixed costs would dominate."""
    total = buf.count(b"\n", 1, n) + (1 if n > 1 and buf[n - 1] != 10 else 0)
    out: list[tuple[int, int, bytes]] = []
    index = 0
    prev = 1
    for start in starts:
        index += buf.count(b"\n", prev, start)
        prev = start
        stop = buf.find(b"\n", start, n)
        raw = bytes(buf[start : n if stop == -1 else stop])
        if b"completed step: " not in raw and any(h in raw for h in HARMLESS_ONLY):
            continue
        out.append((index, start - 1, raw))
    return total, out


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
        return _feed_all(state, buf, base_offset, first_lineno)
    total, lines = prefilter(b"\n" + buf, prefixes, scan)
    _feed_lines(state, lines, base_offset, first_lineno)
    return total


def _feed_all(state: LogState, buf: bytes, base_offset: int, first_lineno: int) -> int:
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


def _feed_lines(
    state: LogState, lines: list[tuple[int, int, bytes]], base_offset: int, first_lineno: int
) -> None:
    feed = state.feed_bytes
    for i, start, raw in lines:
        feed(raw, first_lineno + i, base_offset + start)


class _ReadBuffer:
    """One reusable read buffer: byte 0 is a sentinel newline, complete lines follow.

    Reading into the same memory (instead of a fresh `bytes` per chunk, plus the copies
    of joining and cutting) is what keeps a GiB log from costing a second of page faults."""

    def __init__(self) -> None:
        self.buf = bytearray(1 + 2 * CHUNK)
        self.buf[0] = 10
        self.view = memoryview(self.buf)
        self._eq: npt.NDArray[np.bool_] | None = None

    def scratch(self, end: int) -> npt.NDArray[np.bool_] | None:
        """`prefilter`'s reusable scratch for a region ending at `end`: None for a small one (which
        needs none), else one array per buffer, made on first need."""
        if end <= SMALL_BUFFER:
            return None
        if self._eq is None:
            import numpy as np

            self._eq = np.empty(2 * CHUNK, dtype=np.bool_)
        return self._eq

    def chunks(self, fd: int, start: int, stop: int) -> Iterator[tuple[int, int]]:
        """Yield (n, file offset): `buf[1:1+n]` holds complete lines read from [start, stop).

        The last piece may end without a newline (end of file); a line longer than
        4 x MAX_LINE with no newline in sight is cut, as a runaway line must not blow memory."""
        buf, view = self.buf, self.view
        have = 0
        pos = offset = start
        while pos < stop:
            k = os.preadv(fd, [view[1 + have : 1 + have + min(CHUNK, stop - pos)]], pos)
            if k <= 0:
                break
            pos += k
            n = have + k
            cut = buf.rfind(b"\n", 1, 1 + n)
            if cut == -1:
                if n <= MAX_LINE * 4 and pos < stop:
                    have = n
                    continue
                m = n
            else:
                m = cut  # buf[1 : cut + 1] ends with that newline
            yield m, offset
            have = n - m
            if have:
                buf[1 : 1 + have] = bytes(view[1 + m : 1 + n])
            offset += m
        if have:
            yield have, offset

    def feed(
        self,
        state: LogState,
        n: int,
        offset: int,
        lineno: int,
        full: bool,
        scan: LineScanner | None,
        prefixes: tuple[bytes, ...],
    ) -> int:
        if full:
            return _feed_all(state, bytes(self.view[1 : 1 + n]), offset, lineno)
        total, lines = prefilter(self.buf, prefixes, scan, end=1 + n, eq=self.scratch(1 + n))
        _feed_lines(state, lines, offset, lineno)
        return total


_worker_buffer: _ReadBuffer | None = None
_worker_scan: LineScanner | None = None
_default_workers = 1


def set_default_workers(n: int) -> None:
    """Let `read_file` pre-filter big logs in `n` forked processes (one-shot CLI commands).

    The default stays 1: a long-running daemon with threads must not fork."""
    global _default_workers
    _default_workers = max(1, n)


def _scan_range(fd: int, start: int, stop: int, prefixes: tuple[bytes, ...]) -> BodyPiece:
    """Worker: the body lines of [start, stop) worth parsing (`logs.body`), line indexes from
    `start`. Its step lines come back as columns: the parent folds them without re-reading them.

    `fd` is the parent's checked descriptor, inherited through the fork: the worker reads the
    very file the parent opened, never a path that may have been swapped since."""
    global _worker_buffer
    if _worker_buffer is None:
        _worker_buffer = _ReadBuffer()
    rb = _worker_buffer
    piece = BodyPiece()
    sc = _worker_scan or scanner()
    for n, offset in rb.chunks(fd, start, stop):
        scan_buffer(rb.buf, n, offset, prefixes, sc, piece)
    return piece


def _line_boundary(fd: int, pos: int, limit: int) -> int:
    """The first line start at or after `pos` (>= 1), or `limit`."""
    while pos < limit:
        data = os.pread(fd, min(64 << 10, limit - pos + 1), pos - 1)
        i = data.find(b"\n")
        if i != -1:
            return min(pos + i, limit)
        if not data:
            break
        pos += len(data)
    return limit


def _regions(fd: int, size: int) -> tuple[int, int]:
    """(head end, tail start): the head and tail are parsed fully, the middle pre-filtered.
    Both are line starts."""
    if size <= HEAD_FULL:
        return size, size
    head_end = _line_boundary(fd, HEAD_FULL + 1, size)
    tail_start = max(head_end, size - TAIL_FULL)
    if tail_start > head_end:
        window = max(head_end, tail_start - (1 << 20))
        data = os.pread(fd, tail_start - window, window)
        i = data.rfind(b"\n")
        tail_start = window + i + 1 if i != -1 else head_end
    return head_end, tail_start


def read_file(
    path: Path,
    state: LogState,
    *,
    scan: LineScanner | None = None,
    full: bool = False,
    workers: int | None = None,
    access: LogAccess = ANYWHERE,
    batched: bool = True,
) -> LogState:
    """Parse a whole file into `state` (head and tail fully, body through the pre-filter).

    With `workers` > 1 (default: `set_default_workers`) a big body is pre-filtered in
    forked processes, in pieces, while this process feeds the results in order: the same
    facts as a serial read, in about half the time on two cores. The file is opened through
    `access` (regular files only; RefusedFile otherwise)."""
    fd = access.open(path)
    try:
        return read_fd(fd, state, scan=scan, full=full, workers=workers, batched=batched)
    finally:
        os.close(fd)


def read_fd(
    fd: int,
    state: LogState,
    *,
    scan: LineScanner | None = None,
    full: bool = False,
    workers: int | None = None,
    batched: bool = True,
) -> LogState:
    """`read_file` on a descriptor already opened (and checked) by the caller.

    `batched=False` reads the body line by line through `prefilter` and `feed_bytes`: the
    reference the batched read (`logs.body`, `LogState.add_fast_steps`) is tested against."""
    size = os.fstat(fd).st_size
    head_end, tail_start = (size, size) if full else _regions(fd, size)
    prefixes = task0_prefixes(os.pread(fd, 2 << 20, 0))
    nworkers = _default_workers if workers is None else workers
    body_read = batched and tail_start > head_end
    with contextlib.ExitStack() as stack:
        pieces: Iterator[BodyPiece] | None = None
        if body_read and nworkers > 1 and tail_start - head_end >= PARALLEL_MIN:
            # The workers start on the body while this process parses the head.
            pieces = stack.enter_context(_parallel_middle(fd, head_end, tail_start, nworkers, scan, prefixes))
        rb = _ReadBuffer()
        lineno = 1
        for n, offset in rb.chunks(fd, 0, head_end):
            lineno += rb.feed(state, n, offset, lineno, True, scan, prefixes)
        if body_read:
            body = _Body(state, fd, lineno)
            if pieces is None:
                sc = scan or scanner()
                for n, offset in rb.chunks(fd, head_end, tail_start):
                    piece = BodyPiece()
                    scan_buffer(rb.buf, n, offset, prefixes, sc, piece)
                    body.fold(piece)
            else:
                for piece in pieces:
                    body.fold(piece)
            lineno = body.finish()
        else:
            for n, offset in rb.chunks(fd, head_end, tail_start):
                lineno += rb.feed(state, n, offset, lineno, False, scan, prefixes)
    for n, offset in rb.chunks(fd, tail_start, size):
        lineno += rb.feed(state, n, offset, lineno, True, scan, prefixes)
    state.ends_with_newline = size == 0 or os.pread(fd, 1, size - 1) == b"\n"
    state.lines = lineno - 1
    state.bytes = size
    return state


class _Body:
    """Folds the body's pieces into the state in file order: the candidate lines one by one
    (`feed_bytes`), the fast step lines between them collected and folded in bulk."""

    def __init__(self, state: LogState, fd: int, lineno: int) -> None:
        self.state = state
        self.lineno = lineno  # the line number of the next piece's first line
        self.steps = StepColumns()  # collected, line numbers absolute
        self._raw_of: Callable[[int], bytes] = self._read_line
        self._fd = fd

    def _read_line(self, j: int) -> bytes:
        """Step line j's bytes, read back from the file (only the few records kept need it)."""
        return os.pread(self._fd, self.steps.length[j], self.steps.offset[j])

    def fold(self, piece: BodyPiece) -> None:
        cols = piece.steps
        done = 0
        for i, offset, raw in piece.others:
            upto = _first_at_or_after(cols.line, i, done)
            if upto > done:
                self.steps.extend(cols, self.lineno, done, upto)
            self._flush()
            done = upto
            self.state.feed_bytes(raw, self.lineno + i, offset, None)
        if len(cols) > done:
            self.steps.extend(cols, self.lineno, done, len(cols))
        if len(self.steps) >= FOLD_STEPS:
            self._flush()
        self.lineno += piece.lines

    def _flush(self) -> None:
        if len(self.steps):
            self.state.add_fast_steps(self.steps, self._raw_of)
            self.steps.clear()

    def finish(self) -> int:
        self._flush()
        return self.lineno


def _first_at_or_after(lines: Any, i: int, lo: int) -> int:
    """The first index >= lo whose line is >= i (`lines` ascending)."""
    hi = len(lines)
    while lo < hi:
        mid = (lo + hi) // 2
        if lines[mid] < i:
            lo = mid + 1
        else:
            hi = mid
    return lo


@contextlib.contextmanager
def _parallel_middle(
    fd: int,
    start: int,
    stop: int,
    workers: int,
    scan: LineScanner | None,
    prefixes: tuple[bytes, ...],
) -> Iterator[Iterator[BodyPiece]]:
    """Scan [start, stop) in forked workers, a piece at a time (about 4 pieces per worker, so
    they finish together; between MIN_PIECE and PIECE bytes); the pieces come out in file
    order, at most 2 per worker in flight, so memory stays bounded. The workers start at once."""
    import multiprocessing  # here, not at import: only a big log forks
    from concurrent.futures import ProcessPoolExecutor

    global _worker_scan
    sc = scan or scanner()
    if isinstance(sc, HyperscanScanner):
        sc.scan_lines(b"\n", prefixes)  # load the database once, before the fork
    _worker_scan = sc
    step = min(PIECE, max((stop - start) // (4 * workers), MIN_PIECE))
    bounds = [start]
    while bounds[-1] < stop:
        bounds.append(_line_boundary(fd, min(bounds[-1] + step, stop), stop))
    pieces = list(zip(bounds, bounds[1:], strict=False))
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        pending: deque[Future[BodyPiece]] = deque()
        it = iter(pieces)
        for a, b in itertools.islice(it, 2 * workers):
            pending.append(pool.submit(_scan_range, fd, a, b, prefixes))

        def results() -> Iterator[BodyPiece]:
            while pending:
                piece = pending.popleft().result()
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(pool.submit(_scan_range, fd, nxt[0], nxt[1], prefixes))
                yield piece

        yield results()


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    """Up to `n` bytes at `offset` (fewer only at the end of the file)."""
    parts: list[bytes] = []
    while n > 0:
        chunk = os.pread(fd, n, offset)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)


@dataclass
class TailReader:
    """Incremental reader for a growing file; survives truncation and replacement."""

    path: Path
    state: LogState
    offset: int = 0
    lineno: int = 1
    inode: int | None = None
    head: bytes = b""  # the file's first bytes: a new file reusing the inode differs here
    _carry: bytes = b""  # the unfinished last line (both ends only, once it is runaway long)
    _dropped: int = 0  # bytes dropped from the middle of `_carry`
    access: LogAccess = ANYWHERE  # which files may be opened (regular files only, at least)

    def poll(self, max_bytes: int = 64 << 20) -> int:
        """Feed whatever complete lines were appended since the last call. Returns bytes consumed.

        Raises OSError when the file cannot be read (the caller reports "monitoring blind"),
        RefusedFile when `access` refuses it.
        """
        fd = self.open_checked()
        try:
            st = os.fstat(fd)
            if self.inode is not None and st.st_ino != self.inode:
                self.reset()  # rotated / replaced: the new file starts from zero
            if st.st_size < self.offset:
                self.reset()  # truncated in place
            self.inode = st.st_ino
            first = os.pread(fd, len(self.head) or 64, 0)
            if self.head and not first.startswith(self.head):
                self.reset()  # replaced by a new file that happens to reuse the inode
            if not self.head:
                self.head = first
            if st.st_size == self.offset:
                return 0
            data = _pread_all(fd, min(max_bytes, st.st_size - self.offset), self.offset)
        finally:
            self.done_with(fd)
        body_start = self.offset - len(self._carry) - self._dropped
        buf = self._carry + data
        cut = buf.rfind(b"\n") + 1
        body, self._carry = buf[:cut], buf[cut:]
        if body and self._dropped:
            # The end of a runaway line whose middle was dropped: alone, so the lines after it
            # keep their real offsets.
            end = body.find(b"\n") + 1
            self._feed(body[:end], body_start)
            body, body_start = body[end:], body_start + end + self._dropped
            self._dropped = 0
        if body:
            self._feed(body, body_start)
        if len(self._carry) > 2 * MAX_LINE:
            # A line that never ends (a progress bar redrawn with \r): keep its two ends, more
            # than the parser reads of a long line (LogState.feed_bytes), not all of it.
            self._dropped += len(self._carry) - 2 * MAX_LINE
            self._carry = self._carry[:MAX_LINE] + self._carry[-MAX_LINE:]
        self.offset += len(data)
        self.state.lines = self.lineno - 1
        self.state.bytes = self.offset
        self.state.ends_with_newline = not self._carry
        return len(data)

    def open_checked(self) -> int:
        """A descriptor of the file at `path`, as `access` allows (a subclass may keep one open)."""
        return self.access.open(self.path, resolved=True)

    def done_with(self, fd: int) -> None:
        """The end of a poll's use of `fd` (from `open_checked`)."""
        os.close(fd)

    def _feed(self, body: bytes, body_start: int) -> None:
        self.lineno += feed_buffer(
            self.state,
            body,
            base_offset=body_start,
            first_lineno=self.lineno,
            full=self.read_fully(body_start),
        )

    def read_fully(self, body_start: int) -> bool:
        """Parse every line of this chunk (True), or only the pre-filter's candidates (False)."""
        return True

    def reset(self) -> None:
        self.state = LogState(
            self.state.source, ref_time=self.state.clock.ref_time, retention=self.state.retention
        )
        self.offset = 0
        self.lineno = 1
        self.inode = None
        self.head = b""
        self._carry = b""
        self._dropped = 0
