"""MaxText's settings as triage reads them (rule PRJ-5): boolean syntax and the defaults a job inherits."""

from __future__ import annotations

# MaxText's default `checkpoint_period` when `enable_checkpointing=true` names none.
DEFAULT_CHECKPOINT_PERIOD = 200


def truthy(value: str | None) -> bool:
    return value is not None and value.strip().strip("\"'").lower() in ("true", "1", "yes", "on")
