"""Edge-triggered failure tracking: log when something starts failing and when it recovers, never every tick."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobdiagd.logsetup import get_logger


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
