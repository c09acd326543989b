"""JobLog, one job's outputs layout and log written line by line (the simulator's `jobdiagd_sim.joblog`)."""

from jobdiagd_sim.joblog import JobLog

__all__ = ["JobLog"]
