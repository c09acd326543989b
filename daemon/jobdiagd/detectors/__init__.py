"""Per-tick detectors registered by name; importing the package registers the built-in ones."""

from jobdiagd.detectors import failure, hang, jobend, tgs
from jobdiagd.detectors.base import (
    Detector,
    DetectorInfo,
    NoData,
    Outcome,
    Report,
    WatchedJob,
    build,
    enabled_names,
    keep_resolution,
    register,
    registered,
)

__all__ = [
    "Detector",
    "DetectorInfo",
    "NoData",
    "Outcome",
    "Report",
    "build",
    "enabled_names",
    "keep_resolution",
    "failure",
    "hang",
    "jobend",
    "register",
    "registered",
    "tgs",
    "WatchedJob",
]
