"""Process inspection for tests (Linux /proc): members of a process group, zombie children."""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: str) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name may hold spaces or ')': the fields that matter follow the last ')'.
    return raw[raw.rfind(b")") + 2 :].decode().split()


def live_group_members(pgid: int) -> list[int]:
    """PIDs of the processes of group `pgid` that still run (zombies excluded)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            f = _stat_fields(entry)
            if f is not None and len(f) > 2 and f[2] == str(pgid) and f[0] != "Z":
                out.append(int(entry))
    return out


def children(pid: int) -> list[int]:
    """Direct children of `pid` (all its threads), zombies included."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def zombie_children(pid: int) -> list[int]:
    """Children of `pid` that exited and were not reaped."""
    return [c for c in children(pid) if (_stat_fields(str(c)) or ["?"])[0] == "Z"]


def open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def exists(pid: int) -> bool:
    """Whether `pid` is in the process table (running, or a zombie nobody reaped)."""
    return os.path.exists(f"/proc/{pid}")


def pids_in(path: Path) -> list[int]:
    """PIDs a test's wrapper script appended to `path` (none yet if it does not exist)."""
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    f = _stat_fields(str(pid))
    return f is not None and f[0] != "Z"
