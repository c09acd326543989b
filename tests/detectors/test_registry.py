"""The detector registry: one list of specs, what a config builds, and the status columns of each detector."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd.config import default_config, loads
from jobdiagd.detectors import CATALOG, DetectorRegistry, NoData, Outcome, WatchedJob, build, failure, hang
from jobdiagd.detectors.base import DetectorSpec, StatusPart
from jobdiagd.model.jobref import JobRef
from jobdiagd.service.jobs import JobView


class Straggler:
    """A fifth detector, as the recipe in `detectors/__init__.py` says to write one."""

    name = "straggler"
    on_data = False
    on_gpu_check = False

    def check(self, view: WatchedJob, now: float) -> Outcome:
        return NoData("nothing to see")

    def forget(self, key: str) -> None:
        pass

    def status(self, view: WatchedJob, now: float) -> StatusPart | None:
        return {"straggler": None}


STRAGGLER = DetectorSpec("straggler", True, lambda cfg: Straggler(), "a slow rank")


def view() -> JobView:
    return JobView(key="7001", ref=JobRef("7001", "JAX-t", None, Path("/x/7001-JAX-t.log"), "slurm"), first_seen=0.0)


def test_the_catalog_lists_every_detector_once_by_name() -> None:
    assert [d.name for d in CATALOG.registered()] == ["failure_signature", "hang", "job_end", "tgs"]
    with pytest.raises(ValueError, match="registered twice"):
        DetectorRegistry([hang.SPEC, failure.SPEC, hang.SPEC])


def test_a_new_detector_is_one_spec_in_the_list() -> None:
    registry = DetectorRegistry([*CATALOG.registered(), STRAGGLER])
    built = registry.build(default_config())
    assert [d.name for d in built] == ["failure_signature", "hang", "job_end", "straggler", "tgs"]
    assert "straggler" in registry.status(built, view(), 0.0)


def test_a_disabled_detector_keeps_its_status_columns() -> None:
    """`jobdiagd status` has the same keys whatever the config enables (idle columns)."""
    cfg = loads("[detectors.hang]\nenabled = false\n[detectors.tgs]\nenabled = false\n")
    running = CATALOG.status(build(default_config()), view(), 0.0)
    idle = CATALOG.status(build(cfg), view(), 0.0)
    assert list(idle) == list(running) == ["step_time_s", "expected_step", "phase", "tgs"]
    assert idle == {"step_time_s": None, "expected_step": None, "phase": "waiting", "tgs": None}
