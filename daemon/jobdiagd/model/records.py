"""Plain records extracted from job logs; shared by triage, the daemon and backtest."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StepRecord:
    """One `completed step: N` (the first copy seen; other tasks' copies are only counted)."""

    step: int
    seconds: float | None
    tgs: float | None  # Tokens/s/device
    tflops: float | None
    loss: float | None
    time: float | None  # epoch seconds of the line when it carried a timestamp
    line: int
    task: int | None
    source: str
    # Unparsed field text (`seconds: …, TFLOP/s/device: …`) of a step read on the fast path;
    # `logs.steps.StepSeries` fills tgs/tflops/loss from it when the record is first read.
    pending: bytes | None = None


@dataclass(slots=True)
class Evidence:
    """A line that matched a failure signature (or an event worth quoting)."""

    cls: str
    line: int
    offset: int
    source: str
    task: int | None
    host: str | None
    text: str  # without srun/absl/Ray prefixes: what the rules read
    time: float | None
    raw: str | None = None  # the line as logged (colour codes removed): what reports quote
    rule: str | None = None  # the signature family that matched (rules.signatures), if any
    # A Traceback header whose exception line matched another class carries that class.
    carries: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "class": self.cls,
            "rule": self.rule,
            "line": self.line,
            "source": self.source,
            "task": self.task,
            "host": self.host,
            "text": self.text,
            "raw": self.raw if self.raw is not None else self.text,
            "time": self.time,
        }


@dataclass(slots=True)
class ClassHits:
    """Bounded record of one class's matches: the first and last few, and a count."""

    first: list[Evidence] = field(default_factory=list)
    last: list[Evidence] = field(default_factory=list)
    count: int = 0
    keep: int = 4

    def add(self, ev: Evidence) -> None:
        self.count += 1
        if len(self.first) < self.keep:
            self.first.append(ev)
            return
        self.last.append(ev)
        if len(self.last) > self.keep:
            del self.last[0]

    def all(self) -> list[Evidence]:
        return self.first + self.last

    @property
    def earliest(self) -> Evidence:
        return self.first[0]


@dataclass(slots=True)
class Summary:
    """The JOB SUMMARY block written by the batch script's EXIT trap."""

    line: int
    status: str | None = None  # SUCCESS / FAILED
    exit_code: int | None = None
    reason: str | None = None  # text after the dash, e.g. "CANCELLED (scancel / SIGTERM)"
    wall_s: float | None = None
    job: str | None = None
    model: str | None = None
    nodes: int | None = None
    status_text: str | None = None
    status_line: int | None = None  # line of the Status: entry (quoted for a cancelled job)


@dataclass(slots=True)
class NodeExit:
    host: str
    exit_code: int
    line: int
    task: int | None


@dataclass(slots=True)
class StageEvent:
    stage: str  # Preflight, Docker pull, ECC check, Training
    kind: str  # BEGIN, END, TIMEOUT, FAILED
    detail: str
    line: int
    exit_code: int | None = None


@dataclass(frozen=True, slots=True)
class RestoreLine:
    """MaxText's checkpoint restore line, or its "not restoring checkpoint" (rule PRJ-2)."""

    kind: str  # "restored" | "fresh"
    step: int | None  # the restored step
    line: int


@dataclass(frozen=True, slots=True)
class Restart:
    """Training restarted inside one log (rule PRJ-10): where, and the first step run again."""

    line: int
    step: int


@dataclass(frozen=True, slots=True)
class MarkLine:
    """A one-off line worth placing in time (the pre-training barrier's sync / PASSED lines)."""

    line: int
    time: float | None  # epoch seconds, when the line was dated


@dataclass(frozen=True, slots=True)
class SrunError:
    """`srun: error: HOST: task N: ...` (rules HB-3, SOFT-1)."""

    host: str
    text: str  # from `task N:` on
    exit_code: int | None
    line: int


@dataclass(frozen=True, slots=True)
class CancelLine:
    """slurmstepd's `*** JOB ... CANCELLED AT <at> [DUE TO <reason>] ***` (rules CAS-5, CAS-8)."""

    host: str
    at: str  # Slurm's stamp, `2026-06-12T11:57:00`
    reason: str  # the line's text after the stamp
    line: int
