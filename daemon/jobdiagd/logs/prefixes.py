"""Strip the prefixes real log lines carry (srun -l, Ray actor, absl, NCCL timestamp, colour codes).

A line can carry any mix of them, in any order, so stripping loops until nothing
more matches. Everything here is pure and works on `str` already decoded with
`errors="replace"` so arbitrary bytes can never raise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\([AB0-2]|\x1b[=>]")
# `srun -l` right-aligns the task id; hetjobs prepend `P<n>`.
_SRUN = re.compile(r"^\s*(?:P\d+\s+)?(\d{1,6}): ")
# `(MaxTextTrainerActor pid=2345) `, `(... pid=N, ip=A.B.C.D) `, `(raylet, ip=10.0.0.4) `, `(raylet) `.
_RAY = re.compile(
    r"^\((?P<actor>[\w.:-]+)(?: pid=\d+(?:, ip=[\w.:]+)?|, ip=[\w.:]+|(?<=raylet)|(?<=gcs_server)|(?<=monitor))\) "
)
# Ray's C++ components: `[2026-06-12 16:11:03,141 W 3287 3328] `.
_RAY_CPP = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[,.]\d+ [IWEF] \d+ \d+\] ")
_ABSL = re.compile(
    r"^(?P<lvl>[IWEF])(?P<mon>\d\d)(?P<day>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?:\.(?P<us>\d{1,6}))?"
    r"\s+\d+\s+[^\]\s]+\] "
)
_NCCL_TS = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:\.\d+)?\] ")
# Ray's own driver-side logging and Python logging put a full date in front.
_ISO_TS = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:[.,]\d+)?\s+(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+)?"
)


@dataclass(frozen=True, slots=True)
class Stamp:
    """A timestamp as printed: absl lines have no year, so it is kept as parts."""

    month: int
    day: int
    seconds: float  # seconds since midnight
    year: int | None = None


@dataclass(frozen=True, slots=True)
class Stripped:
    text: str
    task: int | None
    stamp: Stamp | None
    level: str | None  # absl level letter I/W/E/F
    ray_actor: str | None


def strip_ansi(text: str) -> str:
    if "\x1b" not in text:
        return text
    return _ANSI.sub("", text)


def strip(raw: str) -> Stripped:
    """Remove every known prefix; the task id is the first srun prefix seen."""
    text = strip_ansi(raw).rstrip("\r\n")
    if "\r" in text:
        # Progress bars rewrite the line with \r; the last segment is what a terminal shows.
        text = text.rsplit("\r", 1)[-1] or text.replace("\r", "")
    task: int | None = None
    stamp: Stamp | None = None
    level: str | None = None
    actor: str | None = None
    # Cheap first-character dispatch: most lines carry one or two prefixes and the regexes
    # are only tried where their first character can start them.
    for _ in range(6):
        if not text:
            break
        c = text[0]
        m: re.Match[str] | None = None
        if task is None and (c == " " or c.isdigit() or c == "P"):
            m = _SRUN.match(text)
            if m:
                task = int(m.group(1))
                text = text[m.end() :]
                continue
        if c == "(" and actor is None:
            m = _RAY.match(text)
            if m:
                actor = m.group("actor")
                text = text[m.end() :]
                continue
        if stamp is None:
            if c in "IWEF" and text[1:2].isdigit():
                m = _ABSL.match(text)
                if m:
                    us = m.group("us") or "0"
                    secs = (
                        int(m.group("h")) * 3600
                        + int(m.group("m")) * 60
                        + int(m.group("s"))
                        + int(us) / 10 ** len(us)
                    )
                    stamp = Stamp(int(m.group("mon")), int(m.group("day")), secs)
                    level = m.group("lvl")
                    text = text[m.end() :]
                    continue
            elif c == "[":
                m = _NCCL_TS.match(text) or _RAY_CPP.match(text)
            elif c.isdigit():
                m = _ISO_TS.match(text)
            if m:
                stamp = parse_full_stamp(m.group("ts"))
                text = text[m.end() :]
                continue
        break
    return Stripped(text=text, task=task, stamp=stamp, level=level, ray_actor=actor)


def parse_full_stamp(ts: str) -> Stamp | None:
    try:
        # Naive on purpose: only the calendar parts are kept; the zone is applied later.
        dt = datetime.strptime(ts.replace("T", " "), "%Y-%m-%d %H:%M:%S")  # noqa: DTZ007
    except ValueError:
        return None
    return Stamp(dt.month, dt.day, dt.hour * 3600 + dt.minute * 60 + dt.second, dt.year)
