"""Structured JSON logs (structlog): one JSON object per line, loggers bound to a component.

structlog is imported when a logger is first made, not when this module is: the one-shot
commands (`jobdiagd status`, `triage`) import modules that log but mostly never do, and
structlog's import costs more than the rest of their start-up.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """One JSON object per line on stdout (journald keeps it); contextvars carry e.g. job_id."""
    import structlog

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.WriteLoggerFactory(file=stream if stream is not None else sys.stdout),
        cache_logger_on_first_use=False,
    )


def get_logger(**bind: Any) -> Any:
    """A lazy logger: modules make theirs at import, before `configure_logging` has run.

    The values go in as the proxy's initial values, not through `.bind()`, which would build
    the logger at once with structlog's default (console) configuration, and a daemon's log
    would mix console lines into its JSON.
    """
    import structlog

    return structlog.get_logger("jobdiagd", **bind)
