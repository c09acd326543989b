"""The detector interface and registry: pure per-tick checks `(JobView, now) -> outcome`, registered by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from jobdiagd.alerts.incidents import IncidentBook
from jobdiagd.config import Config
from jobdiagd.model.alerts import Finding
from jobdiagd.model.jobview import JobView


@dataclass(frozen=True, slots=True)
class NoData:
    """The detector had nothing to judge this tick (no steps yet, job pending...). Not an error."""

    reason: str


@dataclass(frozen=True, slots=True)
class Report:
    """A one-off message (the job-end triage report); the engine sends it with `pipeline.report`."""

    job_id: str
    kind: str
    key: str
    title: str
    body: str


Outcome = Sequence[Finding | Report] | NoData


class Detector(Protocol):
    """`check` must not do I/O or read the clock: everything comes from the view and `now`."""

    @property
    def name(self) -> str: ...

    def check(self, view: JobView, now: float) -> Outcome: ...


Factory = Callable[[Config], Detector]


@dataclass(frozen=True, slots=True)
class DetectorInfo:
    name: str  # as in [detectors.<name>]
    default: bool
    factory: Factory
    description: str


_REGISTRY: dict[str, DetectorInfo] = {}


def register(name: str, default: bool, factory: Factory, description: str = "") -> None:
    """node_exporter-style registration; a second registration under one name is a bug."""
    if name in _REGISTRY:
        raise ValueError(f"detector {name!r} registered twice")
    _REGISTRY[name] = DetectorInfo(name, default, factory, description)


def registered() -> list[DetectorInfo]:
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def enabled_names(cfg: Config) -> list[str]:
    """Config decides where it has a section for the detector; otherwise the detector's default."""
    flags = cfg.detectors.enabled()
    return [d.name for d in registered() if flags.get(d.name, d.default)]


def build(cfg: Config) -> list[Detector]:
    names = set(enabled_names(cfg))
    return [d.factory(cfg) for d in registered() if d.name in names]


def keep_resolution(book: IncidentBook, f: Finding) -> bool:
    """Pass a resolution only for an open incident, and only with a step newer than the incident's.

    After a restart (or a lost arrival time) a detector may see "no stall" before it has read a
    new step; that must not close the incident. Shared by the engine and backtest.
    """
    if not f.resolved:
        return True
    inc = book.get(f.job_id, f.kind)
    if inc is None:
        return False
    return f.at_step is None or inc.last_step is None or f.at_step > inc.last_step
