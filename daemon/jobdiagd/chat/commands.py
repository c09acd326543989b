"""Chat command syntax: parse `/cmd@bot args` and validate every argument before it reaches files, processes or queries.

Validation is strict and names the problem in one line: job ids are Slurm/k8s/local ids or the
safe job-directory names the daemon uses as keys (no `/`, no leading dot); PATH must resolve
(symlinks followed) to an existing file or directory under one of the configured outputs roots;
playbooks come from the known set; durations look like 30m, 2h, 1d and are bounded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True, slots=True)
class CommandSpec:
    name: str
    usage: str
    help: str
    min_args: int
    max_args: int
    long: bool = False  # runs off the event loop: "working…" first, the result edited in


COMMANDS: dict[str, CommandSpec] = {
    c.name: c
    for c in (
        CommandSpec("status", "/status", "daemon health, jobs watched, open incidents", 0, 0),
        CommandSpec("jobs", "/jobs", "the jobs being watched: step, speed, phase, incidents", 0, 0),
        CommandSpec("job", "/job ID", "one job: progress, step time, TGS, open incidents", 1, 1),
        CommandSpec(
            "triage", "/triage ID|PATH", "full triage report of a job (as `jobdiagd triage`)", 1, 1, True
        ),
        CommandSpec(
            "diagnose",
            "/diagnose ID [PLAYBOOK]",
            "TSDB diagnosis of a RAY=1 job (as `jobdiagd diagnose`)",
            1,
            2,
            True,
        ),
        CommandSpec("compare", "/compare A B", "compare two jobs by training step", 2, 2, True),
        CommandSpec(
            "plot", "/plot ID", "step time and tokens/s/device of a watched job, as a picture", 1, 1, True
        ),
        CommandSpec("ack", "/ack ID [KIND]", "acknowledge a job's open incidents (stops reminders)", 1, 2),
        CommandSpec("mute", "/mute ID DURATION [KIND]", "silence a job's alerts, e.g. /mute 123 2h", 2, 3),
        CommandSpec("unmute", "/unmute ID [KIND]", "end a mute", 1, 2),
        CommandSpec("help", "/help", "this list", 0, 1),
        CommandSpec("start", "/start", "same as /help", 0, 1),
    )
}


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


def help_text(long_timeout_s: float, *, scancel: bool = False) -> str:
    lines = ["**Commands**"]
    for spec in COMMANDS.values():
        if spec.name == "start":
            continue
        lines.append(f"- `{spec.usage}` — {spec.help}")
    buttons = "Ack, Mute 1 h / 24 h, Full triage, Diagnose (RAY=1 jobs)"
    if scancel:
        buttons += ", ⛔ scancel… (operators only, Slurm jobs, asks to confirm)"
    lines += [
        "",
        f"Long commands answer “working…” at once and edit in the result (at most {long_timeout_s:g} s).",
        f"Buttons on alerts: {buttons}.",
    ]
    return "\n".join(lines)
