"""The daemon's edge to the alert pictures: plot inputs from a job view as bounded JSON, and rendering them
off the event loop at send time (`chat.renderer`'s worker process).

A hang/TGS `open` notification carries the picture's inputs rather than PNG bytes: the outbox
row stays small, a restart re-renders the same picture, and the renderer (matplotlib, in a
spawned worker) runs only when the message is sent. The inputs are `StepChart` as JSON, the
step history reduced to at most `MAX_POINTS` points (every step of the newest part, then
evenly thinned older ones), so a week-long job does not put megabytes into SQLite.
Without matplotlib (the `chat`/`plots` extras) the notification carries no inputs and pages
as text; the renderer's worker imports matplotlib, the daemon never does.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from typing import Any

from jobdiagd.chat.plot_inputs import chart_for_view
from jobdiagd.chat.renderer import PlotRenderer
from jobdiagd.model.jobview import JobView
from jobdiagd.model.plotdata import IncidentMarks, StepChart, StepPoint
from jobdiagd.service.logging import get_logger

MAX_POINTS = 1500
KEEP_RECENT = 600
PAYLOAD = "step_chart/1"


def available() -> bool:
    """True when the renderer's worker can import matplotlib."""
    return importlib.util.find_spec("matplotlib") is not None


def _thin(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(points) <= MAX_POINTS:
        return points
    old, recent = points[:-KEEP_RECENT], points[-KEEP_RECENT:]
    stride = -(-len(old) // (MAX_POINTS - KEEP_RECENT))
    return old[::stride] + recent


def chart_payload(
    view: JobView,
    kind: str,
    now: float,
    *,
    tgs_threshold_pct: float = 10.0,
    baseline_steps: tuple[int, int] = (5, 15),
) -> dict[str, Any] | None:
    """The step chart of a watched job for an incident kind, as bounded JSON (None: not plottable)."""
    if kind not in ("hang", "tgs", "tgs-degradation"):
        return None
    chart = chart_for_view(
        view, kind, now, tgs_threshold_pct=tgs_threshold_pct, baseline_steps=baseline_steps
    )
    spec = dataclasses.asdict(chart)
    spec["points"] = _thin(spec["points"])
    return {"type": PAYLOAD, "spec": spec}


def chart_from_payload(payload: Mapping[str, Any]) -> StepChart:
    """Rebuild the `StepChart` (tuples, nested dataclasses) from its JSON form."""
    if payload.get("type") != PAYLOAD:
        raise ValueError(f"unknown plot payload {payload.get('type')!r}")
    spec = dict(payload["spec"])
    spec["points"] = tuple(StepPoint(**p) for p in spec.get("points") or ())
    marks = spec.get("marks")
    if marks is not None:
        marks = dict(marks)
        if marks.get("baseline_steps") is not None:
            marks["baseline_steps"] = tuple(marks["baseline_steps"])
        spec["marks"] = IncidentMarks(**marks)
    spec["checkpoints"] = tuple(spec.get("checkpoints") or ())
    spec["evals"] = tuple(spec.get("evals") or ())
    return StepChart(**spec)


class PlotBridge:
    """Renders payloads to PNG in the plots helper's off-loop renderer; None when a picture fails."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self._renderer = PlotRenderer(timeout_s=timeout_s)
        self._log = get_logger(component="plots")

    async def render(self, payload: Mapping[str, Any]) -> bytes | None:
        try:
            png = await self._renderer.render(chart_from_payload(payload))
        except Exception as exc:  # RenderError, a bad payload: the message goes without its picture
            self._log.warning("plot_render_failed", error=f"{type(exc).__name__}: {exc}")
            return None
        return png

    async def close(self) -> None:
        await self._renderer.close()
