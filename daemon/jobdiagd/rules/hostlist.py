"""Slurm host-list syntax and host-name validation: the strict parser (squeue/scontrol) and the lenient form for logs."""

from __future__ import annotations

import re

# `\Z`, not `$`: "node001\n" is not a host name (`$` matches before a final newline).
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
_MAX_HOSTS = 100_000


def _expand_ranges(body: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"bad host range {part!r}")
        lo_s, hi_s = m.group(1), m.group(2)
        if hi_s is None:
            out.append(lo_s)
            continue
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise ValueError(f"bad host range {part!r}")
        if hi - lo + len(out) > _MAX_HOSTS:
            raise ValueError("host list too large")
        width = len(lo_s) if lo_s.startswith("0") else 0
        out.extend(str(i).zfill(width) for i in range(lo, hi + 1))
    return out


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_hostlist(text: str) -> list[str]:
    """Expand a Slurm host list: `node[001-003,007],gpu-a[1-2]` -> node001 … node007, gpu-a1, gpu-a2.

    Zero padding follows the lower bound (`[08-10]` -> 08, 09, 10); several bracket groups in one
    name expand as a product (`r[1-2]n[1-2]`). Empty / `(null)` / `None assigned` give [].
    Raises ValueError for malformed input.
    """
    s = text.strip()
    if not s or s.lower() in {"(null)", "none assigned", "n/a"}:
        return []
    hosts: list[str] = []
    for item in _split_top_level(s):
        names = [""]
        for chunk in re.split(r"(\[[^\]]*\])", item):
            if not chunk:
                continue
            if chunk.startswith("["):
                values = _expand_ranges(chunk[1:-1])
                names = [n + v for n in names for v in values]
                if len(names) > _MAX_HOSTS:
                    raise ValueError("host list too large")
            else:
                if "[" in chunk or "]" in chunk:
                    raise ValueError(f"bad host list {text!r}")
                names = [n + chunk for n in names]
        hosts.extend(names)
        if len(hosts) > _MAX_HOSTS:
            raise ValueError("host list too large")
    return hosts


def valid_host(name: str) -> bool:
    """Host names from logs/chat must pass this before reaching ssh, a query or a subprocess."""
    return bool(_HOST.match(name))


def expand_hostlist(text: str) -> list[str]:
    """Lenient form for log headers: malformed lists give [] and only valid names are kept."""
    try:
        hosts = parse_hostlist(text.strip().strip("\"'"))
    except ValueError:
        return []
    return [h for h in hosts if valid_host(h)]
