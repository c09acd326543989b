"""Fast pre-filter: find the lines of a buffer that contain any trigger literal.

The log reader only parses lines that can carry an event or a failure signature;
on multi-GB logs that are mostly NCCL INFO noise this is what keeps triage near
grep speed. Hyperscan (SIMD multi-literal matching) is used when importable, and a
pure-Python fallback gives the same answer (one `bytes.find` pass per literal).
Both return the sorted start offsets of matching lines; tests check they agree.

Step lines are most of a big RAY=0 log (one copy per node per step) and only one copy
per step is needed. When the caller knows the log's `srun -l` task-0 prefixes (e.g.
b" 0: " for 10-99 tasks), step lines are taken only from lines that start with one of
them — a `bytes.find` walk over task 0's lines — and the other tasks' copies are never
touched. Without prefixes every line with "completed step" is a candidate.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from jobdiagd.rules.signatures import SIGNATURE_NEEDLES

# Literals of the events the parser extracts (see logs/events.py). Keep them specific:
# every extra short literal costs matching time on every byte of a multi-GB log.
EVENT_NEEDLES: tuple[str, ...] = (
    "Config param ",
    "restoring from this run",
    "not restoring checkpoint",
    "aved a checkpoint at step",
    "asynchronous checkpoint save",
    "Finished saving checkpoint",
    "BARRIER",
    "== Preflight",
    "== Docker pull",
    "== ECC check",
    "== Training",
    " FAILED (exit=",
    " TIMEOUT (",
    "JOB SUMMARY",
    "Job:",
    "Model:",
    "Nodes:",
    "Wall:",
    "Status:",
    "=========",
    "NODE_EXIT",
    "srun: ",
    "slurmstepd",
    "CANCELLED",
    "[Ray]",
    "[Prometheus]",
    "ssh -J",
    "jax_worker/replica",
    "Polled an error",
    "Terminating process because",
    "pending_event_logger",
    "Error: ",
    "Exception: ",
    '", line ',  # a traceback frame: an exception after it ends a traceback (header lost or not)
    "_FRACTION=",
    "JOB_ID=",
    "JOB_NAME=",
    "NNODES=",
    "JOB_NODELIST=",
    "NODELIST_EXPANDED=",
    "PASSTHROUGH_ARGS=",
    "MODEL_NAME=",
    "RAY_PORT=",
    "JAX_COORDINATOR_PORT=",
    "MODEL_NAME_ALIAS=",
    "RAY=",
    "EXP_TAG=",
    "heartbeat_timeout",
    "Training subprocess",
    "falling back to non-Ray",
)


def _minimal(literals: Iterable[str]) -> tuple[str, ...]:
    """The literals no other literal of the set is a substring of: a line containing a longer
    one contains the shorter, so the candidate lines are the same with a smaller automaton."""
    kept: list[str] = []
    for lit in sorted(set(literals), key=len):
        if not any(k in lit for k in kept):
            kept.append(lit)
    return tuple(sorted(kept))


TRIGGERS: tuple[str, ...] = _minimal((*EVENT_NEEDLES, *SIGNATURE_NEEDLES))
STEP_NEEDLES: tuple[str, ...] = ("completed step", "completed profiler")
# Lines that are harmless whatever else they contain (runbook's known-harmless table); the
# reader drops them after the scan. (Scanning for them too would cost a callback on every
# harmless line, most of which carry no trigger at all.)
HARMLESS_ONLY: tuple[bytes, ...] = (
    b"MSCCL++: Feature not enabled",
    b"Failed call to cuInit",
    b"Cannot read CPU core",
    b"Token indices sequence length is longer",
)

# A trigger literal and the known-harmless text that follows it on most of a big log's lines
# that carry it (a big RCCL log's NCCL WARN lines are mostly `NCCL WARN MSCCL++: Feature not
# enabled`). An occurrence followed by that text is no trigger: scanners look for the literal
# *not* followed by it, so those lines cost hyperscan no match callback at all (the reader drops
# them anyway). Decision: an other task's step line whose only trigger is such an occurrence is
# no candidate either, like any other task's step line without a trigger.
HARMLESS_AFTER: dict[str, bytes] = {"NCCL WARN": b" MSCCL++: Feature not enabled"}

Buffer = bytes | bytearray


def not_followed_by(literal: str, tail: bytes) -> bytes:
    """A hyperscan pattern for `literal` where the text after it (to the line's end or the
    buffer's) is not `tail`: it matches up to the first byte that leaves `tail`, which may be the
    newline ending the line (so a match's last byte is in the literal's line, `to - 1`)."""
    alternatives = b""
    for ch in reversed(tail):
        alternatives = rb"(?:[^" + re.escape(bytes([ch])) + rb"]|\z" + (
            (b"|" + re.escape(bytes([ch])) + alternatives) if alternatives else b""
        ) + b")"
    return re.escape(literal).encode() + alternatives


def hs_line_starts(db: Any, scratch: Any, buf: Buffer, start: int, end: int) -> list[int]:
    """Sorted start offsets of the lines of `buf[start+1:end]` that hold a match of the hyperscan
    database `db` (`buf[start]` is the newline before the region): one SIMD pass, one callback per
    match until its line is taken, none after.

    A line is found from its match's last byte, `to - 1` (hyperscan's `to` is one past the match):
    that byte is in the match's line even when the match ends with the newline closing it (a
    `not_followed_by` pattern stops there), where `to` would already be in the next line."""
    starts: list[int] = []
    rfind, find = buf.rfind, buf.find
    # Hits arrive in order of their end offset; once a line is taken, skip to its end.
    line_end = -1

    def on_match(_id: int, _frm: int, to: int, _flags: int, _ctx: object) -> int | None:
        nonlocal line_end
        last = start + to - 1  # the match's last byte: in its line
        if last <= line_end:
            return None
        starts.append(rfind(b"\n", start, last) + 1)
        nl = find(b"\n", last, end)
        line_end = end if nl == -1 else nl
        return None

    with memoryview(buf) as view, view[start:end] as region:
        db.scan(region, match_event_handler=on_match, scratch=scratch)
    return starts


class LineFinder:
    """Start offsets of the lines that match any of a few regexes (a printed timestamp's shapes,
    say), without decoding the rest: `hs_line_starts` over a database from `logs.hscache` when
    hyperscan is importable, else one `re` search per matching line. Both give the same answer
    for patterns that match within a line (no newline in a match); tests check it against a
    plain regex over each line."""

    def __init__(self, patterns: Sequence[bytes], *, allow_hyperscan: bool = True) -> None:
        self._re = re.compile(b"|".join(patterns))
        self._hs: tuple[Any, Any] | None = None
        self.name = "re"
        if allow_hyperscan:
            try:
                import hyperscan

                from jobdiagd.logs.hscache import block_database

                db = block_database(hyperscan, list(patterns))
                self._hs = (db, hyperscan.Scratch(db))
                self.name = "hyperscan"
            except Exception:  # ImportError, or a CPU without the SIMD hyperscan needs
                self._hs = None

    def line_starts(self, buf: Buffer, start: int, end: int) -> list[int]:
        """Sorted starts of the matching lines in `buf[start+1:end]`; `buf[start]` is a newline."""
        if self._hs is not None:
            db, scratch = self._hs
            return hs_line_starts(db, scratch, buf, start, end)
        starts: list[int] = []
        rfind, find, search = buf.rfind, buf.find, self._re.search
        pos = start + 1
        while pos < end:
            m = search(buf, pos, end)
            if m is None:
                break
            starts.append(rfind(b"\n", start, m.start()) + 1)
            nl = find(b"\n", m.end(), end)
            if nl == -1:
                break
            pos = nl + 1
        return starts


class LineScanner(Protocol):
    name: str

    def scan_lines(
        self, buf: Buffer, task0_prefixes: tuple[bytes, ...] = (), start: int = 0, end: int | None = None
    ) -> list[int]:
        """Sorted start offsets (indices into `buf`) of the lines worth parsing in `buf[start+1:end]`.

        `buf[start]` must be the newline before the region (or a sentinel newline), so a
        reused read buffer is scanned in place. A line is worth parsing when it contains a
        trigger or is a step line; with `task0_prefixes`, step lines count only when the line
        starts with one of those prefixes."""
        ...


def candidates(scan: LineScanner, buf: bytes, task0_prefixes: tuple[bytes, ...] = ()) -> list[int]:
    """`scan_lines` for a plain buffer that starts at a line start: offsets into `buf`."""
    return [i - 1 for i in scan.scan_lines(b"\n" + buf, task0_prefixes)]


def task0_step_patterns(prefixes: tuple[bytes, ...]) -> list[bytes]:
    """Regexes for task 0's step lines; they match from the newline before the line, so
    scanners run them over the buffer with one newline prepended. A bounded repeat keeps
    hyperscan at literal speed (an unbounded `[^\\n]*` costs ~2x)."""
    return [b"\n" + re.escape(p) + rb"[^\n]{0,400}completed (?:step|profiler)" for p in prefixes]


def _line_starts(nbuf: bytes, hits: Iterable[int]) -> set[int]:
    """Start offsets (relative to nbuf[1:]) of the lines containing the hit offsets."""
    rfind = nbuf.rfind
    return {rfind(b"\n", 0, i + 1) for i in hits}


def _find_all(nbuf: bytes, needle: bytes, tail: bytes | None = None) -> Iterable[int]:
    """Occurrences of `needle`, at most the first one per line; with `tail`, only those not
    followed by it (HARMLESS_AFTER)."""
    i = nbuf.find(needle)
    while i != -1:
        if tail is not None and nbuf.startswith(tail, i + len(needle)):
            i = nbuf.find(needle, i + 1)
            continue
        yield i
        end = nbuf.find(b"\n", i)
        if end == -1:
            return
        i = nbuf.find(needle, end)


class PythonScanner:
    """One `bytes.find` pass per literal; C-speed per pass, no dependencies."""

    name = "python"

    def __init__(self, triggers: Iterable[str] = TRIGGERS) -> None:
        self._needles = [t.encode() for t in triggers]
        self._harmless_after = {k.encode(): v for k, v in HARMLESS_AFTER.items()}
        self._steps = [t.encode() for t in STEP_NEEDLES]

    def scan_lines(
        self, buf: Buffer, task0_prefixes: tuple[bytes, ...] = (), start: int = 0, end: int | None = None
    ) -> list[int]:
        data = bytes(buf[start:end])
        steps: set[int] = set()
        if task0_prefixes:
            for pat in task0_step_patterns(task0_prefixes):
                steps.update(m.start() for m in re.finditer(pat, data))
        else:
            for needle in self._steps:
                steps |= _line_starts(data, _find_all(data, needle))
        triggered: set[int] = set()
        for needle in self._needles:
            hits = _find_all(data, needle, self._harmless_after.get(needle))
            triggered |= _line_starts(data, hits)
        # `data` starts with the newline before the region: a line starting at data[i] starts
        # at buf[start + i].
        return [start + i + 1 for i in sorted(steps | triggered)]


class HyperscanScanner:
    """All literals in one SIMD pass (hyperscan); the callback maps a hit to its line start."""

    name = "hyperscan"

    def __init__(self, triggers: Iterable[str] = TRIGGERS) -> None:
        import hyperscan

        self._hs = hyperscan
        self._literals = [
            not_followed_by(t, HARMLESS_AFTER[t]) if t in HARMLESS_AFTER else re.escape(t).encode()
            for t in triggers
        ]
        self._dbs: dict[tuple[bytes, ...], tuple[Any, Any]] = {}
        # Fail early (ImportError / unsupported CPU) so default_scanner can fall back; the real
        # databases are made on first use, per set of task-0 prefixes.
        probe = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        probe.compile(expressions=[b"probe"], ids=[0], elements=1)

    def _db(self, prefixes: tuple[bytes, ...]) -> tuple[Any, Any]:
        got = self._dbs.get(prefixes)
        if got is None:
            from jobdiagd.logs.hscache import block_database

            if prefixes:
                pats = self._literals + task0_step_patterns(prefixes)
            else:
                pats = self._literals + [re.escape(t).encode() for t in STEP_NEEDLES]
            db = block_database(self._hs, pats)
            got = self._dbs[prefixes] = (db, self._hs.Scratch(db))
        return got

    def scan_lines(
        self, buf: Buffer, task0_prefixes: tuple[bytes, ...] = (), start: int = 0, end: int | None = None
    ) -> list[int]:
        db, scratch = self._db(task0_prefixes)
        return hs_line_starts(db, scratch, buf, start, len(buf) if end is None else end)

    def scan_spans(
        self, buf: Buffer, task0_prefixes: tuple[bytes, ...], end: int
    ) -> tuple[list[int], list[int]]:
        """`scan_lines(buf, task0_prefixes, 0, end)` with each line's end (its newline, or
        `end`), less lines a reader drops anyway: a trigger followed by a known-harmless literal
        in a line without `completed step: ` (a big RCCL log's NCCL WARN lines are mostly
        `NCCL WARN MSCCL++: Feature not enabled`, which the database does not even match:
        HARMLESS_AFTER)."""
        db, scratch = self._db(task0_prefixes)
        starts: list[int] = []
        ends: list[int] = []
        rfind, find, startswith = buf.rfind, buf.find, buf.startswith
        harmless = tuple(b" " + h for h in HARMLESS_ONLY)
        line_end = -1

        def on_match(_id: int, _frm: int, to: int, _flags: int, _ctx: object) -> None:
            nonlocal line_end
            # The match's last byte, `to - 1`, is in its line (it is the newline ending the line
            # when a HARMLESS_AFTER pattern stopped there).
            last = to - 1
            if last <= line_end:
                return
            s = rfind(b"\n", 0, last) + 1
            nl = find(b"\n", last, end)
            line_end = e = end if nl == -1 else nl
            if startswith(harmless, to) and find(b"completed step: ", s, e) == -1:
                return
            starts.append(s)
            ends.append(e)

        with memoryview(buf) as view, view[:end] as region:
            db.scan(region, match_event_handler=on_match, scratch=scratch)
        return starts, ends


class NeedleGate:
    """`any(n in text for n in needles)` for one decoded line at a time, fast: the gate in front
    of `signatures.match_line` (a 128-literal `re` alternation costs ~15 us a line; the head and
    tail of every log, and every line of a small one, are parsed in full).

    Hyperscan once a log has given it `WARM_UP` lines (compiling its database costs more than a
    short log's lines), the same `re` alternation before that and without hyperscan. The answer
    is the same: a literal occurs in a string exactly when its UTF-8 bytes occur in the string's
    UTF-8 bytes (lone surrogates pass through as bytes no literal contains)."""

    WARM_UP = 256

    def __init__(self, needles: Iterable[str]) -> None:
        # Longest first, as signatures.py writes the same alternation: `re` then reuses it.
        self._needles = tuple(sorted(dict.fromkeys(needles), key=len, reverse=True))
        self._regex = re.compile("|".join(re.escape(n) for n in self._needles))
        self._calls = 0
        self._hs: tuple[Any, Any, list[int]] | None = None

    def __call__(self, text: str) -> bool:
        hs = self._hs
        if hs is None:
            self._calls += 1
            if self._calls <= self.WARM_UP or not self._compile():
                return self._regex.search(text) is not None
            hs = self._hs
            assert hs is not None
        db, scratch, found = hs
        found.clear()
        db.scan(text.encode("utf-8", "surrogatepass"), match_event_handler=self._on_match, scratch=scratch)
        return bool(found)

    def _on_match(self, _id: int, _frm: int, _to: int, _flags: int, _ctx: object) -> None:
        assert self._hs is not None
        self._hs[2].append(_id)

    def _compile(self) -> bool:
        try:
            import hyperscan

            from jobdiagd.logs.hscache import block_database

            pats = [re.escape(n).encode() for n in self._needles]
            db = block_database(hyperscan, pats, [hyperscan.HS_FLAG_SINGLEMATCH] * len(pats))
            self._hs = (db, hyperscan.Scratch(db), [])
        except Exception:  # no hyperscan (or a CPU it does not support): the regex answers
            self._calls = -(1 << 62)
            return False
        return True


def default_scanner() -> LineScanner:
    try:
        return HyperscanScanner()
    except Exception:  # ImportError, or a CPU without the SIMD hyperscan needs
        return PythonScanner()
