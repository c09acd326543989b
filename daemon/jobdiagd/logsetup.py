"""Structured JSON logs (structlog) and an edge-triggered error helper that logs transitions, not ticks.

structlog is imported when a logger is first made, not when this module is: the one-shot
commands (`jobdiagd status`, `triage`) import modules that log but mostly never do, and
structlog's import costs more than the rest of their start-up.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

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
    import structlog

    return structlog.get_logger("jobdiagd").bind(**bind)


def job_logger(job_id: str, **bind: Any) -> Any:
    """A logger with job_id bound, for everything logged about one job."""
    return get_logger(job_id=job_id, **bind)


def bound_job(**bind: Any) -> AbstractContextManager[None]:
    """`with bound_job(job_id="123"):` binds job_id to every log line in the block (task-local)."""
    import structlog

    return structlog.contextvars.bound_contextvars(**bind)


@dataclass
class EdgeTrigger:
    """Logs once when `name` starts failing and once when it recovers (Home Assistant style).

    Call `failure(error, now)` or `success(now)` every time the source is used; both return True
    only on a transition, so callers can hang metrics or notices off the same edge.
    """

    name: str
    kind: str = "source"
    logger: Any = None
    failing_since: float | None = None
    failures: int = 0
    last_error: str | None = None
    last_ok_at: float | None = None

    def __post_init__(self) -> None:
        if self.logger is None:
            self.logger = get_logger()

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def failure(self, error: BaseException | str, now: float) -> bool:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self.failures += 1
        self.last_error = text
        if self.failing_since is not None:
            return False
        self.failing_since = now
        self.logger.warning(f"{self.kind}_failing", **{self.kind: self.name}, error=text)
        return True

    def success(self, now: float) -> bool:
        self.last_ok_at = now
        if self.failing_since is None:
            return False
        self.logger.info(
            f"{self.kind}_recovered",
            **{self.kind: self.name},
            failed_for_seconds=round(now - self.failing_since, 3),
            failures=self.failures,
            last_error=self.last_error,
        )
        self.failing_since = None
        self.failures = 0
        return True

    def state(self) -> dict[str, Any]:
        return {
            "failing": self.failing,
            "failing_since": self.failing_since,
            "failures": self.failures,
            "last_error": self.last_error,
            "last_ok_at": self.last_ok_at,
        }
