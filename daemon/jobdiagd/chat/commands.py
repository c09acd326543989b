"""The chat commands: one `CommandSpec` per command (its arguments, their validators, its handler) in `COMMANDS`, and the parser.

The router looks a command up here and holds no per-command code: it checks the arguments
with the spec's validators, then answers at once with `answer` (a short command) or runs
`work` as a long command ("working…", then the result edited in), which the daemon's backend
also looks up here (`run_long`). Handlers reach the daemon only through `chat.ports`
(`ChatBackend` for answers, `Worker` for long work). Adding a command: docs/architecture.md
§ Extension points.

Validation is strict and names the problem in one line: job ids are Slurm/k8s/local ids or the
safe job-directory names the daemon uses as keys (no `/`, no leading dot); PATH must resolve
(symlinks followed) to an existing file or directory under one of the configured outputs roots;
playbooks come from the known set; durations look like 30m, 2h, 1d and are bounded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobdiagd.chat.auth import Sender
from jobdiagd.chat.buttons import help_names
from jobdiagd.chat.model import ChatMessage
from jobdiagd.chat.ports import ChatBackend, TaskError, TaskResult, Worker
from jobdiagd.durations import rounded_duration
from jobdiagd.triage.resolve import JOB_ID_RE

MAX_TEXT = 512
MAX_PATH = 1024
MIN_MUTE_S = 60.0
MAX_MUTE_S = 7 * 86400.0
# ASCII (`\d` and `\w` are Unicode otherwise) and `\Z` (`$` also matches before a final newline).
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}\Z", re.ASCII)
_KIND = re.compile(r"^[a-z][a-z0-9_-]{0,31}\Z", re.ASCII)
_DURATION = re.compile(r"^(\d{1,5})\s*(s|sec|m|min|h|d)?\Z", re.ASCII)
_COMMAND = re.compile(r"^/?([A-Za-z_]{1,32})(?:@[A-Za-z0-9_]{1,64})?\Z", re.ASCII)
_UNIT_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, None: 60}


class UsageError(ValueError):
    """A command the router cannot run as given; the message is shown to the user."""


def job_id(text: str) -> str:
    """A job id or job-directory name as the daemon keys jobs; never a path."""
    if JOB_ID_RE.match(text) or _SAFE_NAME.match(text):
        return text
    raise UsageError(f"not a job id: {text[:64]!r} (expected e.g. 123456, or a job directory name)")


def kind(text: str) -> str:
    if _KIND.match(text):
        return text
    raise UsageError(f"not an incident kind: {text[:40]!r} (e.g. hang, tgs-degradation)")


def duration(text: str) -> float:
    """'30m', '2h', '1d', '90' (minutes); between 1 min and 7 days."""
    m = _DURATION.match(text.strip().lower())
    if m is None:
        raise UsageError(f"not a duration: {text[:20]!r} (e.g. 30m, 2h, 1d)")
    seconds = float(int(m.group(1)) * _UNIT_S[m.group(2)])
    if not MIN_MUTE_S <= seconds <= MAX_MUTE_S:
        raise UsageError("duration must be between 1 min and 7 d")
    return seconds


def playbook(text: str, known: Sequence[str]) -> str:
    if text in known:
        return text
    raise UsageError(f"unknown playbook {text[:40]!r}; known: {', '.join(sorted(known))}")


def is_path(text: str) -> bool:
    return "/" in text


def path_under_roots(text: str, roots: Sequence[Path]) -> Path:
    """The real path of `text` when it is an existing file/dir under an outputs root (symlinks
    resolved first, so a link pointing outside is refused)."""
    if len(text) > MAX_PATH or "\x00" in text:
        raise UsageError("path too long or contains a NUL character")
    if not os.path.isabs(text):
        raise UsageError("give an absolute path (or a job id)")
    real = Path(os.path.realpath(text))
    for root in roots:
        real_root = Path(os.path.realpath(root))
        if real == real_root or real.is_relative_to(real_root):
            try:
                real.stat()
            except FileNotFoundError:
                raise UsageError(f"no such file or directory: {text}") from None
            except OSError as exc:  # a name too long, a loop, a directory it may not enter
                raise UsageError(f"cannot use {text[:200]}: {exc.strerror or exc}") from None
            return real
    raise UsageError("path is outside the configured outputs roots")


def target(text: str, roots: Sequence[Path]) -> str:
    """/triage and /compare argument: a job id, or a path under the outputs roots."""
    return str(path_under_roots(text, roots)) if is_path(text) else job_id(text)


# -- arguments: each a validator over the word typed, giving the word passed on ---------------

Args = tuple[str, ...]  # validated arguments, in order; optional ones absent when not given
Check = Callable[[str, ChatBackend], str]


@dataclass(frozen=True, slots=True)
class Arg:
    """One argument: its name in the usage line ("" for a word accepted and ignored) and its
    validator, which raises `UsageError` or returns the word to pass on."""

    metavar: str
    check: Check
    optional: bool = False


def _seconds(text: str, b: ChatBackend) -> str:
    return str(int(duration(text)))  # whole seconds (units are whole), as a word


JOB = Arg("ID", lambda t, b: job_id(t))
KIND = Arg("KIND", lambda t, b: kind(t), optional=True)
IGNORED = Arg("", lambda t, b: t, optional=True)


def _target(metavar: str) -> Arg:
    return Arg(metavar, lambda t, b: target(t, b.outputs_roots))


# -- handlers -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """What a short command's handler gets: the daemon, who asked and when, the router's settings."""

    backend: ChatBackend
    sender: Sender
    now: float
    log: Any  # the router's structlog logger
    long_timeout_s: float
    scancel: bool
    recovery: bool = False  # [recovery] can act here: /help names its buttons


Answer = Callable[[Call, Args], ChatMessage]
Work = Callable[[Worker, Args], Awaitable[TaskResult]]


def _help(c: Call, a: Args) -> ChatMessage:
    return ChatMessage("jobdiagd", help_text(c.long_timeout_s, scancel=c.scancel, recovery=c.recovery))


def _status(c: Call, a: Args) -> ChatMessage:
    return c.backend.status(c.now)


def _jobs(c: Call, a: Args) -> ChatMessage:
    return c.backend.jobs(c.now)


def _nodes(c: Call, a: Args) -> ChatMessage:
    return c.backend.nodes(c.now)


def _job(c: Call, a: Args) -> ChatMessage:
    got = c.backend.job(a[0], c.now)
    return got if got is not None else ChatMessage(f"job {a[0]} is not being watched")


def _ack(c: Call, a: Args) -> ChatMessage:
    jid, kind = a[0], a[1] if len(a) > 1 else None
    incs = c.backend.open_incidents(jid, kind)
    if not incs:
        return ChatMessage(f"no open incident for job {jid}" + (f" ({kind})" if kind else ""))
    who = c.sender.label
    for inc in incs:
        c.backend.ack(inc, who, c.now)
    c.log.info("chat_ack", user=c.sender.user_id, incidents=[i.id for i in incs])
    return ChatMessage(f"✔ acked by {who}: " + ", ".join(i.id for i in incs))


def _mute(c: Call, a: Args) -> ChatMessage:
    jid, secs, kind = a[0], float(a[1]), a[2] if len(a) > 2 else "*"
    who = c.sender.label
    c.backend.mute(jid, kind, c.now + secs, who, c.now)
    c.log.info("chat_mute", user=c.sender.user_id, job_id=jid, kind=kind, seconds=secs)
    what = "every alert" if kind == "*" else f"{kind} alerts"
    return ChatMessage(f"🔕 {what} of job {jid} muted for {rounded_duration(secs)} by {who}")


def _unmute(c: Call, a: Args) -> ChatMessage:
    jid, kind = a[0], a[1] if len(a) > 1 else "*"
    removed = c.backend.unmute(jid, kind, c.sender.label, c.now)
    return ChatMessage(f"🔔 job {jid} unmuted" if removed else f"job {jid} was not muted ({kind})")


async def _triage(w: Worker, a: Args) -> TaskResult:
    return TaskResult(f"📋 triage: {a[0]}", await w.triage(a[0]))


async def _diagnose(w: Worker, a: Args) -> TaskResult:
    return TaskResult(f"🩺 diagnose: {a[0]}", await w.diagnose(a[0], a[1] if len(a) > 1 else None))


async def _compare(w: Worker, a: Args) -> TaskResult:
    return TaskResult(f"⚖ compare: {a[0]} vs {a[1]}", await w.compare(a[0], a[1]))


async def _plot(w: Worker, a: Args) -> TaskResult:
    return TaskResult(f"📈 job {a[0]}", png=await w.plot(a[0]))


# -- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """One command. Exactly one handler: `answer` (short: on the event loop, at once) or `work`
    (long: "working…" first, then run by the daemon off the event loop, the result edited in)."""

    name: str
    help: str
    args: tuple[Arg, ...] = ()
    answer: Answer | None = None
    work: Work | None = None
    listed: bool = True  # in /help and the transport's command menu

    def __post_init__(self) -> None:
        if (self.answer is None) == (self.work is None):
            raise ValueError(f"command {self.name!r}: give exactly one of answer and work")
        if any(a.optional and not b.optional for a, b in zip(self.args, self.args[1:], strict=False)):
            raise ValueError(f"command {self.name!r}: an optional argument before a required one")

    @property
    def long(self) -> bool:
        return self.work is not None

    @property
    def min_args(self) -> int:
        return sum(not a.optional for a in self.args)

    @property
    def max_args(self) -> int:
        return len(self.args)

    @property
    def usage(self) -> str:
        words = [f"[{a.metavar}]" if a.optional else a.metavar for a in self.args if a.metavar]
        return " ".join([f"/{self.name}", *words])


COMMANDS: dict[str, CommandSpec] = {
    c.name: c
    for c in (
        CommandSpec("status", "daemon health, jobs watched, open incidents", answer=_status),
        CommandSpec("jobs", "the jobs being watched: step, speed, phase, incidents", answer=_jobs),
        CommandSpec("job", "one job: progress, step time, TGS, open incidents", (JOB,), answer=_job),
        CommandSpec(
            "triage",
            "full triage report of a job (as `jobdiagd triage`)",
            (_target("ID|PATH"),),
            work=_triage,
        ),
        CommandSpec(
            "diagnose",
            "TSDB diagnosis of a RAY=1 job (as `jobdiagd diagnose`)",
            (_target("ID"), Arg("PLAYBOOK", lambda t, b: playbook(t, b.playbooks), optional=True)),
            work=_diagnose,
        ),
        CommandSpec(
            "compare", "compare two jobs by training step", (_target("A"), _target("B")), work=_compare
        ),
        CommandSpec(
            "plot", "step time and tokens/s/device of a watched job, as a picture", (JOB,), work=_plot
        ),
        CommandSpec("nodes", "suspect nodes: the failures each was named in, across jobs", answer=_nodes),
        CommandSpec("ack", "acknowledge a job's open incidents (stops reminders)", (JOB, KIND), answer=_ack),
        CommandSpec(
            "mute",
            "silence a job's alerts, e.g. /mute 123 2h",
            (JOB, Arg("DURATION", _seconds), KIND),
            answer=_mute,
        ),
        CommandSpec("unmute", "end a mute", (JOB, KIND), answer=_unmute),
        CommandSpec("help", "this list", (IGNORED,), answer=_help),
        CommandSpec("start", "same as /help", (IGNORED,), answer=_help, listed=False),
    )
}


# -- parsing and running ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Parsed:
    name: str
    args: tuple[str, ...]

    @property
    def spec(self) -> CommandSpec:
        return COMMANDS[self.name]


def parse(text: str) -> Parsed:
    """`/triage@jobdiagd_bot 123` -> Parsed("triage", ("123",)); a leading slash is optional
    (Slack's `/jobdiagd triage 123` arrives as `triage 123`)."""
    if len(text) > MAX_TEXT:
        raise UsageError(f"command too long ({len(text)} > {MAX_TEXT} characters)")
    if "\x00" in text:
        raise UsageError("command contains a NUL character")
    words = text.strip().split()
    if not words:
        raise UsageError("empty command; /help lists the commands")
    m = _COMMAND.match(words[0])
    name = m.group(1).lower() if m else ""
    spec = COMMANDS.get(name)
    if spec is None:
        shown = words[0][:40]
        raise UsageError(f"unknown command {shown!r}; /help lists the commands")
    args = tuple(words[1:])
    if not spec.min_args <= len(args) <= spec.max_args:
        raise UsageError(f"usage: {spec.usage}")
    return Parsed(name, args)


def checked(p: Parsed, backend: ChatBackend) -> Args:
    """The arguments through their validators, in order (the first bad one raises `UsageError`)."""
    return tuple(arg.check(word, backend) for arg, word in zip(p.spec.args, p.args, strict=False))


async def run_long(worker: Worker, name: str, args: Args) -> TaskResult:
    """Run long command `name` (the daemon's backend calls this for `ChatBackend.run_task`)."""
    spec = COMMANDS.get(name)
    if spec is None or spec.work is None:
        raise TaskError(f"unknown command {name}")
    return await spec.work(worker, args)


def help_text(long_timeout_s: float, *, scancel: bool = False, recovery: bool = False) -> str:
    """/help: the commands and buttons of their tables (recovery's buttons where it can act)."""
    lines = ["**Commands**"]
    lines += [f"- `{spec.usage}` — {spec.help}" for spec in COMMANDS.values() if spec.listed]
    lines += [
        "",
        f"Long commands answer “working…” at once and edit in the result (at most {long_timeout_s:g} s).",
        f"Buttons on alerts: {', '.join(help_names(scancel=scancel, recovery=recovery))}.",
    ]
    return "\n".join(lines)
