"""The daemon's edge to the alert pictures: plot inputs from a job view as bounded JSON, and rendering them
off the event loop at send time (through `chat.plots`/`chat.renderer` when this build has them).

A hang/TGS `open` notification carries the picture's inputs rather than PNG bytes: the outbox
row stays small, a restart re-renders the same picture, and the renderer (matplotlib, in a
spawned worker) runs only when the message is sent. The inputs are `StepChart` as JSON, the
step history reduced to at most `MAX_POINTS` points (every step of the newest part, then
evenly thinned older ones), so a week-long job does not put megabytes into SQLite.
Without the plotting modules the notification carries no inputs and pages as text.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

from jobdiagd.model.jobview import JobView
from jobdiagd.service.logging import get_logger

MAX_POINTS = 1500
KEEP_RECENT = 600
PAYLOAD = "step_chart/1"


def available() -> bool:
    try:
        importlib.import_module("jobdiagd.chat.plot_inputs")
        importlib.import_module("jobdiagd.chat.renderer")
    except ImportError:
        return False
    return True


def _thin(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(points) <= MAX_POINTS:
        return points
    old, recent = points[:-KEEP_RECENT], points[-KEEP_RECENT:]
    stride = -(-len(old) // (MAX_POINTS - KEEP_RECENT))
    return old[::stride] + recent


def chart_payload(view: JobView, kind: str, now: float) -> dict[str, Any] | None:
    """The step chart of a watched job for an incident kind, as bounded JSON (None: not plottable)."""
    plot_inputs: Any = importlib.import_module("jobdiagd.chat.plot_inputs")
    chart = plot_inputs.chart_for_view(view, kind, now)
    spec = dataclasses.asdict(chart)
    spec["points"] = _thin(spec["points"])
    return {"type": PAYLOAD, "spec": spec}


def chart_from_payload(payload: Mapping[str, Any]) -> Any:
    """Rebuild the `StepChart` (tuples, nested dataclasses) from its JSON form."""
    if payload.get("type") != PAYLOAD:
        raise ValueError(f"unknown plot payload {payload.get('type')!r}")
    data: Any = importlib.import_module("jobdiagd.model.plotdata")
    spec = dict(payload["spec"])
    spec["points"] = tuple(data.StepPoint(**p) for p in spec.get("points") or ())
    marks = spec.get("marks")
    if marks is not None:
        marks = dict(marks)
        if marks.get("baseline_steps") is not None:
            marks["baseline_steps"] = tuple(marks["baseline_steps"])
        spec["marks"] = data.IncidentMarks(**marks)
    spec["checkpoints"] = tuple(spec.get("checkpoints") or ())
    spec["evals"] = tuple(spec.get("evals") or ())
    return data.StepChart(**spec)


class PlotBridge:
    """Renders payloads to PNG in the plots helper's off-loop renderer; None when a picture fails."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        renderer: Any = importlib.import_module("jobdiagd.chat.renderer")
        self._renderer = renderer.PlotRenderer(timeout_s=timeout_s)
        self._log = get_logger(component="plots")

    async def render(self, payload: Mapping[str, Any]) -> bytes | None:
        try:
            png = await self._renderer.render(chart_from_payload(payload))
        except Exception as exc:  # RenderError, a bad payload: the message goes without its picture
            self._log.warning("plot_render_failed", error=f"{type(exc).__name__}: {exc}")
            return None
        return bytes(png)

    async def close(self) -> None:
        await self._renderer.close()
