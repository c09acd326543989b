"""Fold log lines into what we know about one log file (pure, incremental, bounded memory).

`LogState.feed(raw_line, lineno, offset)` is the one parser behind `jobdiagd triage`,
the daemon's tailer and `backtest`: feed it lines in order, as many times as new data
arrives. Step records are kept as `logs.steps.StepSeries` retains them (exact aggregates,
early and recent windows); evidence is a fixed number of lines per failure class.

With `retention=TAIL` (the daemon's tailed files, followed for weeks) everything else that
grows with lines is capped too, so a job's memory does not depend on its length: lists of
events (stage markers, NODE_EXIT, srun errors, Prometheus ports tried, in-log restarts)
keep their first and last `EVENTS_KEEP // 2`; per-task maps and sets stop at `MAX_TASKS`
tasks; checkpoint saves keep the first `SAVES_HEAD`, the last `SAVES_TAIL` and those next
to a kept step record (what `CheckpointConfig` reads: the period they follow, whether a
kept step is beside one); config keys stop at `MAX_CONFIG_KEYS`. Triage (`TRIAGE`) keeps
them all, so its reports do not change.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from jobdiagd.logs.prefixes import Stamp, strip, strip_ansi
from jobdiagd.logs.scan import HARMLESS_ONLY, NeedleGate
from jobdiagd.logs.steps import TRIAGE, Retention, StepSeries, plausible_seconds, step_record
from jobdiagd.model.kinds import FailureClass
from jobdiagd.model.records import (
    CancelLine,
    ClassHits,
    Evidence,
    MarkLine,
    NodeExit,
    Restart,
    RestoreLine,
    SrunError,
    StageEvent,
    StepRecord,
    Summary,
)
from jobdiagd.rules.maxtext import DEFAULT_CHECKPOINT_PERIOD, int_setting, truthy
from jobdiagd.rules.signatures import (
    EVIDENCE_CLASSES,
    SIGNATURE_NEEDLES,
    is_exception_line,
    match_line,
)
from jobdiagd.rules.slurm import CANCEL_EXITS, parse_slurm_duration

# Numbers read from a log have at most MAX_DIGITS digits (`\d{1,18}(?!\d)`): a longer one is
# garbage, and past 4300 digits `int()` itself raises. Ports have at most five.
MAX_DIGITS = 18
# The number must end at a comma or the line end: with `srun -u` another task's prefix can
# land right after it (`completed step: 9` + `9: I1128 ...` must not read as step 99).
_STEP = re.compile(r"completed step: (\d{1,18})(?=,|\s*$)")
_PROFILER_STEP = re.compile(r"completed profiler (?:activation|deactivation) step: (\d{1,18})(?=,|\s*$)")
_CONFIG = re.compile(r"Config param (\w+): ?(.*)$")
_RESTORE = re.compile(r"restoring from this run's directory(?: latest)? step\s+(\d{1,18})(?!\d)")
_SAVED = re.compile(r"[Ss]aved a checkpoint at step (\d{1,18})(?!\d)")
_ASYNC_SAVE = re.compile(r"Started an asynchronous checkpoint save for step (\d{1,18})(?!\d)")
_FINISHED_SAVE = re.compile(r"\A(?>.*?Finished saving checkpoint).*/(\d{1,18})`?\.?\s*$")
_STAGE = re.compile(
    r"^== (Preflight|Docker pull|ECC check|Training|[A-Z][\w ]*?) (BEGIN|END|TIMEOUT|FAILED)\b(?: \((.*?)\))? =="
)
_STAGE_EXIT = re.compile(r"exit=(\d{1,18})(?!\d)")
# Tolerant: any case, any text after the exit code ("— reason", "(scancel by user)", a
# mis-decoded dash).
_SUMMARY_STATUS = re.compile(r"Status:\s*([A-Za-z]+)\s*(?:\(exit (\d{1,18})\))?\s*(.*)$")
_REASON_LEAD = re.compile(r"^[\s—–\-â€”\x80-\x9f]+")
_WALL_PART = re.compile(r"(?<!\d)(\d{1,12})\s*([dhms])")
# A Wall written the way Slurm writes elapsed times (read by `rules.slurm.parse_slurm_duration`).
_WALL_CLOCK = re.compile(r"(?:\d{1,9}-)?\d{1,9}(?::\d\d){1,2}")
_NODE_EXIT = re.compile(r"NODE_EXIT host=(\S+) exit=(\d{1,18})(?!\d)")
_SRUN_ERROR = re.compile(r"srun: error: (\S+?): tasks? ([\d,\-\[\] ]+): (.*)$")
_EXIT_CODE = re.compile(r"[Ee]xit(?:ed with exit)? code (\d{1,18})(?!\d)")
# slurmstepd `*** JOB|STEP <id> ON <host> CANCELLED AT <t> [DUE TO ...] ***`; srun's own time-limit
# line and old slurmstepd omit `ON <host>` (`... DUE TO TIME LIMIT on n447 ***`).
# The time and the reason cannot overlap (`[^\s*]+`, then a space): with `(\S+)(.*?)` a long
# token after AT backtracked quadratically.
_STEPD_CANCEL = re.compile(
    r"\*\*\* (?:JOB|STEP) ([\d.]{1,32})(?: ON (\S+))? CANCELLED AT ([^\s*]+)((?:\s[^*]*)?)\*\*\*"
)
_HEADER = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")
_TASK_PATH = re.compile(r"/job:jax_worker/replica:\d+/task:(\d{1,18})(?!\d)")
_TUNNEL = re.compile(r"ssh\s+(?:-\S+\s+)*-J\s+(\S+)\s+(.*)$")
_LFWD = re.compile(r"-L\s*(\d{1,5}):(?:localhost|127\.0\.0\.1):(\d{1,5})(?!\d)")
_PROM_STARTED = re.compile(r"\[Prometheus\] Started on port (\d{1,5})(?!\d)")
_PROM_USING = re.compile(r"\[Prometheus\] WARNING: port (\d{1,5}) was occupied; using (\d{1,5}) instead")
_PROM_TRYING = re.compile(r"\[Prometheus\] Port (\d{1,5}) occupied, trying (\d{1,5})")
_RAY_HEAD = re.compile(r"\[Ray\] Starting HEAD on ([\w.-]+):(\d+)")
_NCCL_HOST = re.compile(r"^([\w.-]+):\d+:\d+ \[\d+\]")
_SRUN_FAIL_HOST = re.compile(r"^([\w.-]+): ")

# A step line as MaxText prints it under `srun -l` / Ray / absl: the fast path of feed_bytes.
# Everything a common step line may carry before `completed step: ` (fullmatch up to there).
_FAST_STEP_PREFIX = re.compile(
    rb"\s*(?:P\d+\s+)?(?:(\d{1,6}): )?(\([\w.:-]+ pid=\d+[^)]*\) )?"
    rb"(?:([IWEF])(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?\s+\d+ [^\]\s]+\] )?"
    rb"(?:\[Rampup Batch Size Phase\], )?"
)
_SECONDS = re.compile(rb"seconds: (\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")
_TASK_BYTES = re.compile(rb"^\s*(?:P\d+\s+)?(\d{1,6}): ")
MAX_LINE_BYTES = 64 << 10
_SRUN_TASK = re.compile(r": task (\d{1,18}): ")
# match_line finds nothing in a line without a signature needle: most fully parsed lines.
_may_match = NeedleGate(SIGNATURE_NEEDLES)
# A Python traceback frame (`  File "x.py", line 44, in <module>`; a line cut at its start keeps
# `", line 44, in f`): rule PY-LOST-HEADER. An exception line within FRAME_WINDOW lines of the same
# task's last frame ends that traceback even when its header was lost.
_FRAME_MARK = '", line '
_FRAME = re.compile(r'", line \d{1,7}, in \S')
FRAME_WINDOW = 40
_T = TypeVar("_T")
_V = TypeVar("_V")

HEADER_KEYS = frozenset(
    {
        "JOB_ID",
        "JOB_NAME",
        "NNODES",
        "JOB_NODELIST",
        "JAX_COORDINATOR_PORT",
        "RAY_PORT",
        "PASSTHROUGH_ARGS",
        "MODEL_NAME",
        "MODEL_NAME_ALIAS",
        "EXP_TAG",
        "RAY",
        "NODELIST_EXPANDED",
    }
)
MAX_ENV_KEYS = 400
MAX_TEXT = 400
# Caps of a TAIL state (see the module docstring): far above any real job, they only stop a
# runaway or hostile log from growing the daemon without end.
EVENTS_KEEP = 2048
MAX_TASKS = 4096
MAX_CONFIG_KEYS = 4096
# Saves beside a kept record are kept anyway (every recent step's): the head and tail only
# give the period they follow (`period_from_saves`) enough regular gaps.
SAVES_HEAD = 16
SAVES_TAIL = 32
SAVES_SLACK = 64  # trim in batches: sorting the saves on every new one would cost
RERUN_KEEP = 4096
# Quoted lines keep their head and tail: XLA's and TensorStore's verdicts ("[OS error: ...]",
# "stopped sending heartbeats") often sit at the end of a line longer than MAX_TEXT.
MAX_QUOTE = 1200
QUOTE_HEAD, QUOTE_TAIL = 700, 400
_WALL_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_MAX_CACHED_DAYS = 1024


def parse_wall(text: str) -> float | None:
    """`1h 1m 2s`, `3m 5s`, `42s` (also `1d 2h`) -> seconds; Slurm's `[D-]HH:MM:SS` and `MM:SS` too."""
    text = text.strip()
    if _WALL_CLOCK.fullmatch(text):
        seconds = parse_slurm_duration(text)
        return float(seconds) if seconds is not None else None
    parts = _WALL_PART.findall(text)
    if not parts:
        return None
    return float(sum(int(n) * _WALL_UNITS[u] for n, u in parts))


def parse_passthrough(value: str) -> dict[str, str]:
    """`"steps=100 enable_checkpointing=true ..."` -> {"steps": "100", ...}; tolerant of quoting."""
    value = value.strip()
    try:
        tokens = shlex.split(value)
    except ValueError:
        tokens = value.strip("\"'").split()
    if len(tokens) == 1 and " " in tokens[0]:
        tokens = tokens[0].split()
    out: dict[str, str] = {}
    for tok in tokens:
        key, sep, val = tok.partition("=")
        if sep and key:
            out[key.lstrip("-")] = val
    return out


# (step, task, month, day, seconds since midnight, step seconds, unparsed field text); month
# is 0 when the line has no absl stamp.
FastStep = tuple[int, int | None, int, int, float, float | None, bytes]


class FastColumns(Protocol):
    """Fast-parsed step lines as columns, entry j per line in file order (`logs.body.StepColumns`
    makes them): what `LogState.add_fast_steps` reads. Declared here, so the parser does not
    import the body reader that feeds it."""

    @property
    def line(self) -> Sequence[int]: ...  # line number
    @property
    def offset(self) -> Sequence[int]: ...  # file offset of the line
    @property
    def step(self) -> Sequence[int]: ...
    @property
    def task(self) -> Sequence[int]: ...  # -1: no srun prefix
    @property
    def month(self) -> Sequence[int]: ...  # 0: no absl stamp
    @property
    def day(self) -> Sequence[int]: ...
    @property
    def secs(self) -> Sequence[float]: ...  # seconds since midnight of the stamp
    @property
    def seconds(self) -> Sequence[float]: ...  # NaN: no `seconds:` field
    @property
    def rest(self) -> Sequence[int]: ...  # where the field text starts in the line

    def fast(self, j: int, raw: bytes) -> FastStep:
        """Entry j as `parse_fast_step(raw)` returns it (`raw`: the line's bytes)."""
        ...


def parse_fast_step(raw: bytes) -> FastStep | None:
    """The facts of a `completed step: N, ...` line in the common shapes, or None.

    Pure (no state), so a worker process can run it; `LogState.feed_bytes` decides what to do
    with the result. Lines in other shapes go through the general parser."""
    i = raw.find(b"completed step: ")
    if i == -1 or len(raw) >= 4096:
        return None
    k = raw.find(b",", i + 16)
    num = raw[i + 16 : k]
    if k == -1 or not num.isdigit() or len(num) > MAX_DIGITS:
        return None
    m = _FAST_STEP_PREFIX.fullmatch(raw, 0, i)
    if m is None:
        return None
    rest = raw[k + 1 :]
    if b"\r" in rest or b"\x1b" in rest:
        return None
    task_s, level, month, day, hh, mm, ss, us = m.group(1, 3, 4, 5, 6, 7, 8, 9)
    secs = 0.0
    if level is not None:
        secs = int(hh) * 3600 + int(mm) * 60 + int(ss) + (int(us) / 10 ** len(us) if us else 0.0)
    seconds: float | None = None
    if rest.startswith(b" seconds: "):
        e = rest.find(b",", 10)
        tok = rest[10:e] if e != -1 else rest[10:]
        if tok.replace(b".", b"", 1).isdigit():
            seconds = plausible_seconds(float(tok))
    if seconds is None:
        sm = _SECONDS.search(rest)
        seconds = plausible_seconds(float(sm.group(1))) if sm else None
    return (
        int(num),
        int(task_s) if task_s is not None else None,
        int(month) if level is not None else 0,
        int(day) if level is not None else 0,
        secs,
        seconds,
        rest,
    )


class StampClock:
    """Turns printed timestamps into epoch seconds (local time; absl omits the year)."""

    def __init__(self, ref_time: float) -> None:
        self.ref_time = ref_time
        self.ref_year = time.localtime(ref_time).tm_year
        self._learned_year = False
        self._midnights: dict[tuple[int, int, int], float] = {}
        # (month, day) -> midnight in ref_year (None: no such day); fixed once the year is learned
        self._undated: dict[tuple[int, int], float | None] = {}
        self._latest: float | None = None  # latest epoch produced, for the New Year rollover

    @property
    def learned_year(self) -> bool:
        """Has a stamp been read yet (the first one may set the log's year)?"""
        return self._learned_year

    def epoch(self, stamp: Stamp) -> float | None:
        if not self._learned_year:
            # If the log's first stamp is dated (NCCL, Ray), it tells the log's year, so an old
            # log's absl stamps are not put in the current year. Only the first stamp may set it:
            # one log must never jump a year mid-way.
            self._learned_year = True
            if stamp.year is not None and 1970 < stamp.year <= self.ref_year:
                self.ref_year = stamp.year
        year = stamp.year if stamp.year is not None else self.ref_year
        value = self._at(year, stamp)
        if value is not None and stamp.year is None and value > self.ref_time + 2 * 86400:
            value = self._at(year - 1, stamp)
        return self._rolled(value, stamp)

    def _rolled(self, value: float | None, stamp: Stamp) -> float | None:
        """An undated stamp half a year before the latest one crossed New Year: next year."""
        if value is None:
            return None
        if stamp.year is None and self._latest is not None and value < self._latest - 180 * 86400:
            value = self._at(self.ref_year + 1, stamp) or value
        if self._latest is None or value > self._latest:
            self._latest = value
        return value

    def epoch_undated(self, month: int, day: int, seconds: float) -> float | None:
        """`epoch(Stamp(month, day, seconds))` for a stamp without a year (absl), with the
        day's midnight cached: the per-step-line form of `epoch`."""
        if not self._learned_year:
            return self.epoch(Stamp(month, day, seconds))
        midnight = self._midnight(month, day)
        if midnight is None:
            return None
        value = midnight + seconds
        if value > self.ref_time + 2 * 86400:
            return self._at(self.ref_year - 1, Stamp(month, day, seconds))
        if self._latest is not None and value < self._latest - 180 * 86400:
            return self._rolled(value, Stamp(month, day, seconds))
        if self._latest is None or value > self._latest:
            self._latest = value
        return value

    def _midnight(self, month: int, day: int) -> float | None:
        """Midnight of (month, day) in the reference year (None: no such day), cached."""
        midnight = self._undated.get((month, day), -1.0)
        if midnight == -1.0:
            if len(self._undated) >= _MAX_CACHED_DAYS:
                self._undated.clear()  # a cache: a log stamped on ever more days costs recomputing
            midnight = self._undated[(month, day)] = self._at(self.ref_year, Stamp(month, day, 0.0))
        return midnight

    def epochs_undated(
        self, months: Sequence[int], days: Sequence[int], secs: Sequence[float], lo: int, hi: int
    ) -> list[float | None] | None:
        """`epoch_undated` of entries [lo, hi) in order (month 0: no stamp, None) — unless the
        year is not learned yet or a stamp is half a year before the latest (New Year): then
        None, nothing changed, and the caller takes them one by one."""
        if not self._learned_year and any(months[lo:hi]):
            return None
        if hi > lo and 0 not in months[lo:hi]:
            got = self._epochs_plain(months, days, secs, lo, hi)
            if got is not None:
                return got
        out: list[float | None] = []
        append = out.append
        latest = self._latest
        future = self.ref_time + 2 * 86400
        key = (-1, -1)
        midnight: float | None = None
        last_year: float | None | bool = False  # False: not looked up for this day yet
        for i in range(lo, hi):
            month = months[i]
            if not month:
                append(None)
                continue
            if (month, days[i]) != key:
                key = (month, days[i])
                midnight = self._midnight(month, days[i])
                last_year = False
            if midnight is None:
                append(None)
                continue
            value = midnight + secs[i]
            if value > future:  # as `epoch_undated`: last year's, and not the latest
                if last_year is False:
                    last_year = self._at(self.ref_year - 1, Stamp(month, days[i], 0.0))
                append(None if last_year is None else last_year + secs[i])
                continue
            if latest is not None and value < latest - 180 * 86400:
                return None
            if latest is None or value > latest:
                latest = value
            append(value)
        self._latest = latest
        return out

    def _epochs_plain(
        self, months: Sequence[int], days: Sequence[int], secs: Sequence[float], lo: int, hi: int
    ) -> list[float | None] | None:
        """`epochs_undated` of dated entries when none is special (no such day, last year's, New
        Year) — the case of nearly every run — in a few C-level passes; None: ask one by one."""
        keys = list(zip(months[lo:hi], days[lo:hi], strict=True))
        midnights = {key: self._midnight(*key) for key in set(keys)}
        if None in midnights.values():
            return None
        values = [midnights[key] + x for key, x in zip(keys, secs[lo:hi], strict=True)]  # type: ignore[operator]
        top = max(values)
        if top > self.ref_time + 2 * 86400:
            return None
        latest = top if self._latest is None else max(self._latest, top)
        # Each value is checked against the latest before it, which is at most `latest`.
        if min(values) < latest - 180 * 86400:
            return None
        self._latest = latest
        return values  # type: ignore[return-value]

    def _at(self, year: int, stamp: Stamp) -> float | None:
        key = (year, stamp.month, stamp.day)
        midnight = self._midnights.get(key)
        if midnight is None:
            if not (1 <= stamp.month <= 12 and 1 <= stamp.day <= 31):
                return None
            try:
                midnight = time.mktime((year, stamp.month, stamp.day, 0, 0, 0, 0, 0, -1))
            except (OverflowError, ValueError):
                return None
            if len(self._midnights) >= _MAX_CACHED_DAYS:
                self._midnights.clear()
            self._midnights[key] = midnight
        return midnight + stamp.seconds


@dataclass
class Heartbeat:
    first: Evidence
    accused_tasks: set[int] = field(default_factory=set)
    self_reported: set[int] = field(default_factory=set)  # tasks that logged their own "death"
    reporters: set[int] = field(default_factory=set)
    count: int = 0


class LogState:
    """Everything learned from one log file so far."""

    def __init__(self, source: str, *, ref_time: float, retention: Retention | None = TRIAGE) -> None:
        self.source = source
        self.retention = retention
        self._capped = retention is not None and retention.events
        self.clock = StampClock(ref_time)
        self.lines = 0
        self.bytes = 0
        self.ends_with_newline = True
        self.header: dict[str, str] = {}
        self.env: dict[str, str] = {}
        self.config: dict[str, str] = {}
        self.steps = StepSeries(retention)
        self.task_last_step: dict[int, int] = {}
        self.step_lines = 0
        self.profiler_steps: set[int] = set()
        self.hits: dict[str, ClassHits] = {}
        self.first_error_by_task: dict[int, Evidence] = {}
        self.restore: RestoreLine | None = None
        self.saves: dict[int, int] = {}  # step -> line of "Saved a checkpoint"
        self.async_saves: set[int] = set()
        self.saves_seen = 0  # distinct save steps ever added (a change counter: saves may be trimmed)
        self.barrier_sync: MarkLine | None = None
        self.barrier_passed: MarkLine | None = None
        self.stages: list[StageEvent] = []
        self.summary: Summary | None = None
        self._in_summary = False
        self.node_exits: list[NodeExit] = []
        self.srun_errors: list[SrunError] = []
        self.cancel: CancelLine | None = None
        self.cancel_evidence: Evidence | None = None  # the cancel line, quoted when the job was cancelled
        # The first dated line after the cancel line: Slurm stamps the cancel in whole seconds,
        # and the cascade it starts is logged right after it, so this bounds the instant above.
        self.after_cancel_stamp: float | None = None
        self.tunnel: str | None = None
        self.tunnel_host: str | None = None
        self.tunnel_ports: list[int] = []
        self.prom_port: int | None = None
        self.prom_port_tried: list[int] = []
        self.ray_head: str | None = None
        self.heartbeat: Heartbeat | None = None
        self._pending_self_report: set[int] = set()
        # Tasks whose last signature line was a Traceback header (its evidence): their next
        # exception-shaped line is the exception that ends the traceback.
        self._tracebacks: dict[int | None, Evidence] = {}
        # The line of each task's last traceback frame (`File "...", line N, in f`): a header lost
        # to interleaved multi-rank output still leaves the frames before the exception line.
        self._frames: dict[int | None, int] = {}
        self.pending_event_logger = False
        self.ray_fallback = False
        self.first_stamp: float | None = None
        self.last_stamp: float | None = None
        self.last_text: str = ""
        self.last_exception: Evidence | None = None
        # Earlier runs of a requeued job in this same log (Slurm --open-mode=append): a new header
        # after a JOB SUMMARY starts the run that triage reports; the earlier ones are counted.
        self.earlier_runs = 0
        self.run_start_line = 1
        self._raw_line = ""  # the line being fed, for evidence quoted verbatim
        # Training restarted inside this log (a restore line after steps were logged): the
        # re-run's step lines replace the first run's records, and the seconds they supersede
        # are kept so the summed training time still covers every step line.
        self.restarts: list[Restart] = []
        self.superseded_seconds = 0.0
        self._rerun: tuple[int, int] | None = None  # steps [a, b] being re-run
        self._rerun_done: set[int] = set()
        self._rerun_floor = -1  # re-run steps below it count as done (TAIL bounds the set)

    # ------------------------------------------------------------------ feeding
    def feed_bytes(
        self, raw: bytes, lineno: int, offset: int = 0, fast: FastStep | None | bool = True
    ) -> None:
        """`feed` for undecoded lines, with cheap exits for the two kinds that dominate big logs:
        other tasks' copies of an already-recorded step, and known-harmless NCCL/XLA chatter.

        `fast` is `parse_fast_step(raw)` when a worker process already computed it (True:
        compute it here if needed)."""
        i = raw.find(b"completed step: ")
        if i != -1:
            j = i + 16
            k = raw.find(b",", j)
            num = raw[j:k] if k != -1 else raw[j:].strip()
            if len(num) > MAX_DIGITS:
                pass  # not a step number: the general parser treats the line as text
            elif num.isdigit() and not self.steps.seen(int(num)) and len(raw) < 4096:
                if fast is True:
                    fast = parse_fast_step(raw)
                if fast:
                    self.fast_step(fast, lineno)
                    return
            elif num.isdigit() and not self._in_rerun(int(num)):
                m = _TASK_BYTES.match(raw)
                if m is None or m.group(1) != b"0":
                    self.step_lines += 1
                    if m is not None:
                        t, step = int(m.group(1)), int(num)
                        known = self.task_last_step
                        if step > known.get(t, -1) and (
                            not self._capped or t in known or len(known) < MAX_TASKS
                        ):
                            known[t] = step
                    return
        elif any(n in raw for n in HARMLESS_ONLY):
            return
        if len(raw) > MAX_LINE_BYTES:
            # Keep both ends: an XLA error's verdict (RESOURCE_EXHAUSTED, ...) is often at the end.
            half = MAX_LINE_BYTES // 2
            raw = raw[:half] + b" [...] " + raw[-half:]
        self.feed(raw.decode("utf-8", errors="replace"), lineno, offset)

    def fast_step(self, fast: FastStep, lineno: int) -> None:
        """A new step line in the common shapes (`parse_fast_step`), without the general
        prefix/event machinery. Call only for a step not `seen` yet.

        Runs once per step of a multi-GB log, so it avoids objects it does not need."""
        step, task, month, day, secs, seconds, rest = fast
        when: float | None = None
        if month:
            when = self.clock.epoch_undated(month, day, secs)
            if when is not None:
                if self.first_stamp is None:
                    self.first_stamp = when
                if self.last_stamp is None or when > self.last_stamp:
                    self.last_stamp = when
        self.last_text = f"completed step: {step}"
        self.step_lines += 1
        known = self.task_last_step
        if (
            task is not None
            and step > known.get(task, -1)
            and (not self._capped or task in known or len(known) < MAX_TASKS)
        ):
            known[task] = step
        self.steps.add(StepRecord(step, seconds, None, None, None, when, lineno, task, self.source, rest))

    def add_fast_steps(self, cols: FastColumns, raw_of: Callable[[int], bytes]) -> None:
        """Fold fast-parsed step lines (`logs.body`; `cols.line`: line numbers) in file order,
        exactly as feeding them one by one would (`reader._feed_parsed`): a run of new steps in
        increasing order at once (`StepSeries.add_run`, the clock over the run at once), any
        other (a step seen before, a step going back, a clock rolling over, a `TAIL` store)
        one by one. `raw_of(j)` is line j's bytes (read back only for the records kept)."""
        steps = cols.step
        n = len(steps)
        bulk = self.steps.takes_runs
        j = 0
        while j < n:
            if bulk and steps[j] > self.steps.max_step:
                if cols.month[j] and not self.clock.learned_year:
                    self._one_fast_step(cols, j, raw_of)  # the first stamp sets the log's year
                    j += 1
                    continue
                r = j + 1
                while r < n and steps[r] > steps[r - 1]:
                    r += 1
                if not self._fast_run(cols, j, r, raw_of):
                    for i in range(j, r):
                        self._one_fast_step(cols, i, raw_of)
                j = r
                continue
            self._one_fast_step(cols, j, raw_of)
            j += 1

    def _one_fast_step(self, cols: FastColumns, j: int, raw_of: Callable[[int], bytes]) -> None:
        raw = raw_of(j)
        fast = cols.fast(j, raw)
        if not self.steps.seen(fast[0]):
            self.fast_step(fast, cols.line[j])
        else:
            self.feed_bytes(raw, cols.line[j], cols.offset[j], fast)

    def _fast_run(self, cols: FastColumns, lo: int, hi: int, raw_of: Callable[[int], bytes]) -> bool:
        """`fast_step` for entries [lo, hi) (new steps, increasing) at once; False (nothing
        done) when the clock needs them one by one."""
        whens = self.clock.epochs_undated(cols.month, cols.day, cols.secs, lo, hi)
        if whens is None:
            return False
        steps = cols.step
        dated = [w for w in whens if w is not None]
        if dated:
            if self.first_stamp is None:
                self.first_stamp = dated[0]
            top = max(dated)
            if self.last_stamp is None or top > self.last_stamp:
                self.last_stamp = top
        last = steps[hi - 1]
        self.last_text = f"completed step: {last}"
        self.step_lines += hi - lo
        known = self.task_last_step
        tasks = cols.task
        for i in (hi - 1,) if tasks[lo:hi].count(tasks[lo]) == hi - lo else range(lo, hi):
            task = tasks[i]
            if (
                task >= 0
                and steps[i] > known.get(task, -1)
                and (not self._capped or task in known or len(known) < MAX_TASKS)
            ):
                known[task] = steps[i]
        secs_field = [None if x != x else x for x in cols.seconds[lo:hi]]  # NaN: no field
        source = self.source

        def make(i: int) -> StepRecord:
            raw = raw_of(i)
            task = tasks[i]
            return StepRecord(
                steps[i],
                secs_field[i - lo],
                None,
                None,
                None,
                whens[i - lo],
                cols.line[i],
                task if task >= 0 else None,
                source,
                raw[cols.rest[i] :],
            )

        self.steps.add_run(steps, secs_field, lo, hi, make)
        return True

    def feed(self, raw: str, lineno: int, offset: int = 0) -> None:
        """Fold one line (without its newline) into the state."""
        self._raw_line = raw
        s = strip(raw)
        text = s.text
        task = s.task
        when: float | None = None
        if s.stamp is not None:
            when = self.clock.epoch(s.stamp)
            if when is not None:
                if self.first_stamp is None:
                    self.first_stamp = when
                if self.last_stamp is None or when > self.last_stamp:
                    self.last_stamp = when
                if self.cancel is not None and self.after_cancel_stamp is None:
                    self.after_cancel_stamp = when
        if text.strip():
            self.last_text = text
        if "completed" in text:
            m = _STEP.search(text)
            if m:
                self._on_step(int(m.group(1)), text[m.end() :], task, when, lineno)
                return
            m = _PROFILER_STEP.search(text)
            if m:
                step = int(m.group(1))
                if not self._capped or len(self.profiler_steps) < EVENTS_KEEP:
                    self.profiler_steps.add(step)
                self._on_step(step, "", task, when, lineno)
                return
        self._on_event(text, task, when, lineno, offset)

    def _new_run(self, lineno: int) -> None:
        """Forget the finished run: its summary, steps and errors describe a job that is over."""
        clock, earlier = self.clock, self.earlier_runs + 1
        self.__init__(self.source, ref_time=clock.ref_time, retention=self.retention)  # type: ignore[misc]
        self.clock, self.earlier_runs, self.run_start_line = clock, earlier, lineno

    def _in_rerun(self, step: int) -> bool:
        r = self._rerun
        return (
            r is not None
            and r[0] <= step <= r[1]
            and step not in self._rerun_done
            and step >= self._rerun_floor
        )

    def _on_rerun_step(self, step: int, rest: str, task: int | None, when: float | None, lineno: int) -> None:
        """The first copy of a re-run step replaces the earlier run's record."""
        self._rerun_done.add(step)
        if self._capped and len(self._rerun_done) > RERUN_KEEP:
            self._rerun_floor = max(self._rerun_done) - RERUN_KEEP // 2
            self._rerun_done = {s for s in self._rerun_done if s >= self._rerun_floor}
        rec = step_record(step, rest, time=when, line=lineno, task=task, source=self.source)
        old = self.steps.get(step)
        if old is not None:
            self.superseded_seconds += old.seconds or 0.0
            self.steps.replace(rec)
        else:  # down-sampled away: the line still counts in the summed time
            self.superseded_seconds += rec.seconds or 0.0

    def _on_step(self, step: int, rest: str, task: int | None, when: float | None, lineno: int) -> None:
        self.step_lines += 1
        if task is not None:
            prev = self.task_last_step.get(task)
            if prev is None or step > prev:
                if self._task_ok(task, self.task_last_step):
                    self.task_last_step[task] = step
            elif task == 0 and step < prev - 1 and self.steps.seen(step) and not self._in_rerun(step):
                # Task 0 went back without a restore line: a new run re-does these steps.
                self._push(self.restarts, Restart(lineno, step))
                self._rerun = (step, self.steps.max_step)
                self._rerun_done = set()
                self._rerun_floor = -1
        if task in (0, None) and self._in_rerun(step):
            self._on_rerun_step(step, rest, task, when, lineno)
            return
        existing = self.steps.get(step)
        if existing is None and self.steps.seen(step):
            return  # a late duplicate of a step whose record was down-sampled away
        if existing is not None and not (task == 0 and existing.task not in (0, None)):
            if existing.time is None and when is not None:
                existing.time = when
            return
        rec = step_record(
            step,
            rest,
            time=when if when is not None else (existing.time if existing else None),
            line=lineno,
            task=task,
            source=self.source,
        )
        if existing is None:
            self.steps.add(rec)
        else:
            self.steps.replace(rec)

    def _add_hit(
        self,
        cls: str,
        text: str,
        task: int | None,
        when: float | None,
        lineno: int,
        offset: int,
        rule: str | None = None,
    ) -> Evidence:
        ev = self._evidence(cls, text, task, when, lineno, offset, rule)
        task = ev.task
        hits = self.hits.get(cls)
        if hits is None:
            hits = self.hits[cls] = ClassHits()
        hits.add(ev)
        if (
            task is not None
            and cls not in (FailureClass.HEARTBEAT_TIMEOUT, FailureClass.NODE_FAIL, FailureClass.STAGE_FAIL)
            and cls not in EVIDENCE_CLASSES
            and task not in self.first_error_by_task
            and self._task_ok(task, self.first_error_by_task)
        ):
            self.first_error_by_task[task] = ev
        return ev

    def _evidence(
        self,
        cls: str,
        text: str,
        task: int | None,
        when: float | None,
        lineno: int,
        offset: int,
        rule: str | None = None,
    ) -> Evidence:
        if task is None and text.startswith("srun: error:"):
            m = _SRUN_TASK.search(text)  # `srun: error: node004: task 3: Killed` is about task 3
            task = int(m.group(1)) if m else None
        raw = _quote(strip_ansi(self._raw_line).rstrip("\r")) if self._raw_line else None
        return Evidence(
            cls, lineno, offset, self.source, task, _host_of(text), text[:MAX_TEXT], when, raw, rule
        )

    @property
    def training_started(self) -> bool:
        return bool(self.steps) or self.barrier_passed is not None

    def _on_event(self, text: str, task: int | None, when: float | None, lineno: int, offset: int) -> None:
        """A line that is not a step: signatures first (a line can be both an event and evidence,
        e.g. NODE_EXIT), then the one event it is, if any. Each handler below is only called when
        its cheap substring guard matches: this runs for every non-step line of multi-GB logs."""
        self._match_signatures(text, task, when, lineno, offset)
        if self._in_summary and self._on_summary_line(text, lineno):
            return
        if "JOB SUMMARY" in text:
            self.summary = Summary(line=lineno)
            self._in_summary = True
            return
        # Before the accused-task paths: a header value may quote one (PASSTHROUGH_ARGS="…").
        if "=" in text and self._on_key_value(text, task, lineno):
            return
        if "jax_worker/replica" in text:
            self._on_accused_paths(text)
            return
        if "Polled an error" in text or "Terminating process because" in text:
            self._on_self_report(task)
            return
        if "Config param" in text:
            self._on_config_param(text)
            return
        if "restoring" in text and self._on_restore(text, lineno):
            return
        if "checkpoint" in text and self._on_checkpoint_save(text, lineno):
            return
        if "BARRIER" in text:
            self._on_barrier(text, when, lineno)
            return
        self._on_job_script_event(text, task, when, lineno, offset)

    def _match_signatures(
        self, text: str, task: int | None, when: float | None, lineno: int, offset: int
    ) -> None:
        """Record the line's failure signatures; a Traceback carries the class of the exception
        that ends it (e.g. a coordination barrier timeout raised as XlaRuntimeError)."""
        if _FRAME_MARK in text and _FRAME.search(text) and self._frame_slot(task):
            self._frames[task] = lineno
        frame = self._frames.get(task)
        in_traceback = task in self._tracebacks or (frame is not None and lineno - frame <= FRAME_WINDOW)
        carried: str | None = None
        hits = (
            match_line(
                text,
                training_started=self.training_started,
                after_traceback=in_traceback,
                first_step_done=bool(self.steps),
            )
            if _may_match(text)
            else ()
        )
        for hit in hits:
            ev = self._add_hit(hit.cls, text, task, when, lineno, offset, hit.rule)
            if hit.cls == FailureClass.HEARTBEAT_TIMEOUT:
                self._on_heartbeat(ev, text, task)
            if hit.rule == "PY-traceback":
                self._tracebacks[task] = ev
            elif hit.cls != FailureClass.PYTHON_EXCEPTION and carried is None:
                carried = hit.cls
        if in_traceback and is_exception_line(text):
            # The traceback ends in this exception: it carries that class, it is not an error of its own.
            self._frames.pop(task, None)
            header = self._tracebacks.pop(task, None)
            if header is not None:
                header.carries = carried
        if "Error: " in text or "Exception: " in text or text.startswith(("Error", "Exception")):
            self.last_exception = Evidence(
                "exception", lineno, offset, self.source, task, None, text[:MAX_TEXT], when
            )

    def _on_accused_paths(self, text: str) -> None:
        """The heartbeat error's list of unhealthy `/job:jax_worker/replica:0/task:N` (rule HB-1)."""
        for m in _TASK_PATH.finditer(text):
            if self.heartbeat is not None and (text.strip().startswith("/job:") or "unhealthy" in text):
                self._add_task(self.heartbeat.accused_tasks, int(m.group(1)))

    def _on_self_report(self, task: int | None) -> None:
        """A task reporting its own death (rule HB-1), before or after the heartbeat error."""
        if task is None:
            return
        if self.heartbeat is not None:
            self._add_task(self.heartbeat.self_reported, task)
        else:
            self._add_task(self._pending_self_report, task)

    def _on_key_value(self, text: str, task: int | None, lineno: int) -> bool:
        """A `KEY=value` header (the job script's, untasked and capitalised) or env line."""
        if task is None and text[:1].isupper():
            m = _HEADER.match(text)
            if m is None:
                return False
            if m.group(1) == "JOB_ID" and self.summary is not None and not self._in_summary:
                self._new_run(lineno)  # a requeued job appending to the same log
            self._on_kv(m.group(1), m.group(2), header=True)
            return True
        m = _HEADER.match(text.strip())
        if m is None:
            return False
        self._on_kv(m.group(1), m.group(2), header=False)
        return True

    def _on_config_param(self, text: str) -> None:
        m = _CONFIG.search(text)
        if m and (not self._capped or len(self.config) < MAX_CONFIG_KEYS or m.group(1) in self.config):
            key, value = m.group(1), m.group(2).strip()
            if key not in self.config:
                self.config[key] = value
                self._checkpoint_hint(key, value)

    def _on_restore(self, text: str, lineno: int) -> bool:
        """A checkpoint restore (rule PRJ-2), which may start a new run inside the log (PRJ-10)."""
        m = _RESTORE.search(text)
        if m:
            at = int(m.group(1))
            if self.steps and at < self.steps.max_step and (self._rerun is None or at + 1 != self._rerun[0]):
                # a new run in the same log, restored from step `at`: it re-does at+1..max
                self._push(self.restarts, Restart(lineno, at + 1))
                self._rerun = (at + 1, self.steps.max_step)
                self._rerun_done = set()
                self._rerun_floor = -1
                self.restore = RestoreLine("restored", at, lineno)
            elif self.restore is None or self.restore.kind != "restored":
                self.restore = RestoreLine("restored", at, lineno)
            return True
        if "not restoring checkpoint" in text and self.restore is None:
            self.restore = RestoreLine("fresh", None, lineno)
            return True
        return False

    def _on_checkpoint_save(self, text: str, lineno: int) -> bool:
        m = _SAVED.search(text) or _FINISHED_SAVE.search(text)
        if m:
            step = int(m.group(1))
            if step not in self.saves:
                self.saves[step] = lineno
                self._on_save(step)
            return True
        m = _ASYNC_SAVE.search(text)
        if m:
            step = int(m.group(1))
            if step not in self.async_saves:
                self.async_saves.add(step)
                self._on_save(step)
            return True
        return False

    def _on_barrier(self, text: str, when: float | None, lineno: int) -> None:
        if "BARRIER PASSED" in text:
            if self.barrier_passed is None:
                self.barrier_passed = MarkLine(lineno, when)
        elif "Synchronizing hosts" in text and self.barrier_sync is None:
            self.barrier_sync = MarkLine(lineno, when)

    def _on_job_script_event(
        self, text: str, task: int | None, when: float | None, lineno: int, offset: int
    ) -> None:
        """Stage lines, node exits, srun errors, Slurm's cancel line and the launch events (ssh
        tunnel, Prometheus port, Ray head and fallback). One function, not two: most lines fall
        through every guard here, and each call on that path costs."""
        if text.startswith("== ") and self._on_stage(text, lineno):
            return
        if "NODE_EXIT" in text:
            m = _NODE_EXIT.search(text)
            if m:
                self._push(self.node_exits, NodeExit(m.group(1), int(m.group(2)), lineno, task))
            return
        if "srun: error:" in text:
            self._on_srun_error(text, lineno)
            return
        if "CANCELLED AT" in text:
            self._on_cancel(text, task, when, lineno, offset)
            return
        if "ssh" in text and "-J" in text and "-L" in text:
            self._on_tunnel(text)
            return
        if "[Prometheus]" in text:
            self._on_prometheus(text)
            return
        if "[Ray] Starting HEAD" in text:
            m = _RAY_HEAD.search(text)
            if m and self.ray_head is None:
                self.ray_head = m.group(1)
            return
        if "pending_event_logger" in text:
            self.pending_event_logger = True
        elif "falling back to non-Ray" in text:
            self.ray_fallback = True

    def _on_stage(self, text: str, lineno: int) -> bool:
        m = _STAGE.match(text)
        if m is None:
            return False
        detail = m.group(3) or ""
        em = _STAGE_EXIT.search(detail)
        self._push(
            self.stages, StageEvent(m.group(1), m.group(2), detail, lineno, int(em.group(1)) if em else None)
        )
        return True

    def _on_srun_error(self, text: str, lineno: int) -> None:
        m = _SRUN_ERROR.search(text)
        if m:
            em = _EXIT_CODE.search(m.group(3))
            what = f"task{'s' if not m.group(2).strip().isdigit() else ''} {m.group(2).strip()}: {m.group(3)}"
            self._push(
                self.srun_errors, SrunError(m.group(1), what, int(em.group(1)) if em else None, lineno)
            )

    def _on_cancel(self, text: str, task: int | None, when: float | None, lineno: int, offset: int) -> None:
        """slurmstepd's `CANCELLED AT` line (rules CAS-5, CAS-8): the first one counts."""
        m = _STEPD_CANCEL.search(text)
        if m and self.cancel is None:
            self.cancel = CancelLine(m.group(2) or "", m.group(3), m.group(4).strip(), lineno)
            self.cancel_evidence = self._evidence(FailureClass.CANCELLED, text, task, when, lineno, offset)

    def _on_tunnel(self, text: str) -> None:
        """The job script's printed `ssh -J ... -L ...` tunnel to the Ray head's dashboards."""
        m = _TUNNEL.search(text)
        if m and self.tunnel is None:
            self.tunnel = text.strip()
            target = m.group(2).split()[-1] if m.group(2).split() else ""
            self.tunnel_host = target.rpartition("@")[2] or None
            self.tunnel_ports = [port for p in _LFWD.finditer(text) if _is_port(port := int(p.group(1)))][
                :EVENTS_KEEP
            ]

    def _on_prometheus(self, text: str) -> None:
        m = _PROM_STARTED.search(text)
        if m:
            if _is_port(int(m.group(1))):
                self.prom_port = int(m.group(1))
            return
        m = _PROM_USING.search(text)
        if m:
            if _is_port(int(m.group(2))):
                self.prom_port = self.prom_port or int(m.group(2))
            return
        m = _PROM_TRYING.search(text)
        if m and _is_port(int(m.group(1))):
            self._push(self.prom_port_tried, int(m.group(1)))

    def _on_heartbeat(self, ev: Evidence, text: str, task: int | None) -> None:
        if self.heartbeat is None:
            self.heartbeat = Heartbeat(first=ev)
            self.heartbeat.self_reported |= self._pending_self_report  # both capped at MAX_TASKS
        hb = self.heartbeat
        hb.count += 1
        if task is not None:
            self._add_task(hb.reporters, task)
            if "Terminating process because" in text:
                self._add_task(hb.self_reported, task)
        for m in _TASK_PATH.finditer(text):
            self._add_task(hb.accused_tasks, int(m.group(1)))
        if "leader task" in text:
            self._add_task(hb.accused_tasks, 0)  # the coordination service runs in process 0, its leader

    def _on_kv(self, key: str, value: str, *, header: bool) -> None:
        value = value.strip()
        if key in HEADER_KEYS and (key == "PASSTHROUGH_ARGS" or key not in self.header):
            self.header.setdefault(key, value.strip("\"'") if key != "PASSTHROUGH_ARGS" else value)
            if key == "PASSTHROUGH_ARGS" and self._capped:
                for k, v in parse_passthrough(value).items():
                    self._checkpoint_hint(k, v)
        if (not header or key not in HEADER_KEYS) and key not in self.env and len(self.env) < MAX_ENV_KEYS:
            self.env[key] = value

    def _on_summary_line(self, text: str, lineno: int = 0) -> bool:
        summ = self.summary
        assert summ is not None
        stripped = text.replace("\x00", "").strip()
        if stripped.startswith("===") and "JOB SUMMARY" not in stripped:
            self._in_summary = False
            if summ.exit_code is None:
                # *No (readable) Status line: the batch script's own stage marker says how it ended.
                failed = [s for s in self.stages if s.kind in ("FAILED", "TIMEOUT")]
                if failed:
                    code = failed[-1].exit_code
                    summ.status = "FAILED"
                    summ.exit_code = code if code in CANCEL_EXITS else 1
            return True
        key, sep, value = stripped.partition(":")
        if not sep:
            return False
        key = key.strip()
        value = value.strip()
        if key == "Status":
            m = _SUMMARY_STATUS.search(stripped)
            summ.status_text = value
            summ.status_line = lineno or None
            if m:
                summ.status = m.group(1).upper()
                summ.exit_code = int(m.group(2)) if m.group(2) else (0 if summ.status == "SUCCESS" else None)
                summ.reason = _REASON_LEAD.sub("", m.group(3) or "").strip() or None
            return True
        if key == "Wall":
            summ.wall_s = parse_wall(value.split("(")[0])
            return True
        if key == "Job":
            summ.job = value
            return True
        if key == "Model":
            summ.model = value
            return True
        if key == "Nodes":
            with contextlib.suppress(ValueError, IndexError):
                summ.nodes = int(value.split()[0][:MAX_DIGITS])
            return True
        return False

    # ------------------------------------------------------------------ bounds (TAIL)
    def _push(self, items: list[_T], item: _T) -> None:
        """Append; a capped state keeps the first and the last half: how it began, how it is now."""
        items.append(item)
        if self._capped and len(items) > EVENTS_KEEP:
            del items[EVENTS_KEEP // 2]

    def _task_ok(self, task: int, known: dict[int, _V]) -> bool:
        """May `task` get an entry in a per-task map? (Always, unless capped and full.)"""
        return not self._capped or task in known or len(known) < MAX_TASKS

    def _frame_slot(self, task: int | None) -> bool:
        """May `task` record its last traceback frame? (Always, unless capped and full.)"""
        return not self._capped or task in self._frames or len(self._frames) < MAX_TASKS

    def _add_task(self, tasks: set[int], task: int) -> None:
        if not self._capped or task in tasks or len(tasks) < MAX_TASKS:
            tasks.add(task)

    def _on_save(self, step: int) -> None:
        self.saves_seen += 1
        self.steps.want_anchor(step)
        if self._capped and len(self.saves) + len(self.async_saves) > SAVES_HEAD + SAVES_TAIL + SAVES_SLACK:
            kept = set(self.steps)
            self.saves = {s: ln for s, ln in self.saves.items() if s in _saves_to_keep(self.saves, kept)}
            self.async_saves = _saves_to_keep(self.async_saves, kept)

    def _checkpoint_hint(self, key: str, value: str) -> None:
        """The checkpoint period as configured: the steps where progress-lost sums may be asked."""
        if key == "checkpoint_period":
            period = int_setting(value)
            if period is not None and period > 0 and len(self.steps.anchor_periods) < 8:
                self.steps.anchor_periods.add(period)
        elif key == "enable_checkpointing" and truthy(value) and len(self.steps.anchor_periods) < 8:
            self.steps.anchor_periods.add(DEFAULT_CHECKPOINT_PERIOD)

    # ------------------------------------------------------------------ views
    def passthrough(self) -> dict[str, str]:
        raw = self.header.get("PASSTHROUGH_ARGS")
        return parse_passthrough(raw) if raw else {}

    def sorted_steps(self) -> list[StepRecord]:
        """The kept step records in step order (every step of a log under ~3,000 steps with
        `TRIAGE` retention, under ~570 with `TAIL`; see logs.steps)."""
        return self.steps.values()


def _saves_to_keep(saves: Iterable[int], kept_steps: set[int]) -> set[int]:
    """The first and last saves, and those beside a kept step record (`CheckpointConfig.adjacent`)."""
    order = sorted(saves)
    keep = set(order[:SAVES_HEAD]) | set(order[-SAVES_TAIL:])
    keep.update(s for s in order if s in kept_steps or s + 1 in kept_steps)
    return keep


def _is_port(n: int) -> bool:
    return 0 < n <= 65535


def _quote(line: str) -> str:
    if len(line) <= MAX_QUOTE:
        return line
    return f"{line[:QUOTE_HEAD]} [...] {line[-QUOTE_TAIL:]}"


def _host_of(text: str) -> str | None:
    m = _NCCL_HOST.match(text)
    if m:
        return m.group(1)
    m = _NODE_EXIT.search(text)
    if m:
        return m.group(1)
    m = _SRUN_ERROR.search(text)
    if m:
        return m.group(1)
    return None
