"""The detectors: judges of watched jobs, and `CATALOG`, the one list of those a runner may build.

Adding a detector (say `straggler`):

1. Write `detectors/straggler.py`: a class with `name`, `on_data` (runs on file-event ticks
   too), `on_gpu_check` (runs on the early page's tick), `check(view, now) -> Outcome` (pure:
   no I/O, no clock; read only the `WatchedJob`), `forget(key)` (drop what it keeps about a job)
   and `status(view, now)` (its columns of `jobdiagd status`, or None). Per-job state lives in
   the detector, keyed by `view.key`; `base.RefreshRation`, `base.staggered` and
   `base.resolved_finding` are the shared pieces for rationed refreshes and resolutions. Its
   findings' `kind` is an `IncidentKind` member (`model/kinds.py`; a new kind, a new member).
2. Export `SPEC = DetectorSpec(NAME, default_enabled, factory, description[, idle_status])`;
   the factory builds the detector from the config.
3. Add `straggler.SPEC` to `CATALOG` below.
4. Tests in `tests/detectors/test_straggler.py`, on a `service.jobs.JobView` fed by hand.

The engine and the backtest run every built detector through `service.judging.run_detectors`;
`jobdiagd status` shows each detector's `status` columns; `jobdiagd detectors` lists the catalog.
"""

from jobdiagd.detectors import failure, hang, jobend, tgs
from jobdiagd.detectors.base import (
    Detector,
    DetectorRegistry,
    DetectorSpec,
    EarlyMemo,
    NoData,
    Outcome,
    Report,
    StatusPart,
    WatchedJob,
    early_memo,
    keep_resolution,
)

CATALOG = DetectorRegistry([failure.SPEC, hang.SPEC, jobend.SPEC, tgs.SPEC])

build = CATALOG.build
enabled_names = CATALOG.enabled_names
registered = CATALOG.registered

__all__ = [
    "CATALOG",
    "Detector",
    "DetectorRegistry",
    "DetectorSpec",
    "EarlyMemo",
    "NoData",
    "Outcome",
    "Report",
    "StatusPart",
    "build",
    "early_memo",
    "enabled_names",
    "keep_resolution",
    "failure",
    "hang",
    "jobend",
    "registered",
    "tgs",
    "WatchedJob",
]
