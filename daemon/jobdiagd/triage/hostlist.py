"""Slurm compact host lists (`node[001-003,007],gpu-a[1-2]`) -> host names, pure."""

from __future__ import annotations

import re

_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
MAX_HOSTS = 100_000


def valid_host(name: str) -> bool:
    """Host names from logs/chat must pass this before reaching ssh, a query or a subprocess."""
    return bool(_HOST.match(name))


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand_hostlist(text: str) -> list[str]:
    out: list[str] = []
    for part in _split_top(text.strip().strip("\"'")):
        m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", part)
        if not m:
            out.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, sep, hi = r.partition("-")
            if not sep:
                out.append(f"{prefix}{lo}{suffix}")
                continue
            if not (lo.isdigit() and hi.isdigit()):
                continue
            width = len(lo)
            a, b = int(lo), int(hi)
            if b < a or b - a > MAX_HOSTS:
                continue
            for i in range(a, b + 1):
                out.append(f"{prefix}{i:0{width}d}{suffix}")
        if len(out) > MAX_HOSTS:
            break
    return [h for h in out if valid_host(h)]
