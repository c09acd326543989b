"""Host names taken from logs: expansion of Slurm host lists and validation before use."""

from __future__ import annotations

import re

from jobdiagd.sources.slurm_parse import expand_hostlist as _expand

_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def valid_host(name: str) -> bool:
    """Host names from logs/chat must pass this before reaching ssh, a query or a subprocess."""
    return bool(_HOST.match(name))


def expand_hostlist(text: str) -> list[str]:
    """Lenient form for log headers: malformed lists give [] and only valid names are kept."""
    try:
        hosts = _expand(text.strip().strip("\"'"))
    except ValueError:
        return []
    return [h for h in hosts if valid_host(h)]
