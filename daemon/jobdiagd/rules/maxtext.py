"""MaxText's settings as triage reads them (rule PRJ-5): boolean syntax and the defaults a job inherits."""

from __future__ import annotations

import math

# MaxText's default `checkpoint_period` when `enable_checkpointing=true` names none.
DEFAULT_CHECKPOINT_PERIOD = 200


# An integer setting beyond this (steps, periods) is garbage in the log, not a configuration.
MAX_INT_SETTING = 10**18


def truthy(value: str | None) -> bool:
    return value is not None and value.strip().strip("\"'").lower() in ("true", "1", "yes", "on")


def int_setting(value: str | None) -> int | None:
    """An integer setting as a log prints it (`200`, `"200"`, `1_000`, `2e3`, `200.0`); None for
    anything else, including what is not finite (`1e400`, `inf`) or beyond MAX_INT_SETTING."""
    if value is None:
        return None
    try:
        number = float(value.strip().strip("\"'").replace("_", ""))
    except ValueError:
        return None
    if not math.isfinite(number) or abs(number) > MAX_INT_SETTING:
        return None
    return int(number)
