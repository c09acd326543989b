"""The daemon's edge to the alert pictures: plot inputs from a job view as bounded JSON, and rendering them
off the event loop at send time (`chat.renderer`'s worker process). The weekly goodput digest's
picture travels the same way (`goodput_payload`).

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
from collections.abc import Mapping, Sequence
from typing import Any

from jobdiagd.chat.plot_inputs import (
    HistoryItem,
    chart_title,
    hang_chart,
    host_strip,
    power_bands,
    power_strip,
    projected_step,
    tgs_chart,
)
from jobdiagd.chat.renderer import PlotRenderer
from jobdiagd.goodput.report import GoodputChart
from jobdiagd.logsetup import get_logger
from jobdiagd.model.kinds import IncidentKind
from jobdiagd.model.plotdata import (
    HostSeries,
    HostStrip,
    IncidentMarks,
    MarkKind,
    PowerBands,
    PowerStrip,
    StepChart,
    StepPoint,
    StripPanel,
)
from jobdiagd.service.jobs import JobView
from jobdiagd.triage.tgs import BASELINE_FROM, BASELINE_TO, analyze_tgs
from jobdiagd.tsdb.gpu_strip import GpuStrip
from jobdiagd.tsdb.settings import TsdbSettings
from jobdiagd.tsdb.site import SlideAnswer
from jobdiagd.tsdb.slow_host import SlowHostVerdict

MAX_POINTS = 1500
KEEP_RECENT = 600
PAYLOAD = "step_chart/1"
STRIP = "power_strip/1"
GOODPUT = "goodput_chart/1"
HOST_STRIP = "host_strip/1"


def available() -> bool:
    """True when the renderer's worker can import matplotlib."""
    return importlib.util.find_spec("matplotlib") is not None


def _thin(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(points) <= MAX_POINTS:
        return points
    old, recent = points[:-KEEP_RECENT], points[-KEEP_RECENT:]
    stride = -(-len(old) // (MAX_POINTS - KEEP_RECENT))
    return old[::stride] + recent


def _job_name(view: JobView) -> str | None:
    if view.main is not None:
        name = view.main.header.get("JOB_NAME")
        if name:
            return name
    return None


def chart_for_view(
    view: JobView,
    kind: str,
    now: float,
    *,
    incident_id: str | None = None,
    tgs_threshold_pct: float = 10.0,
    baseline_steps: tuple[int, int] = (BASELINE_FROM, BASELINE_TO),
) -> StepChart:
    """The step chart of a watched job for an incident kind ("hang" or "tgs-degradation") at `now`."""
    steps = view.sorted_steps()
    ckpt = view.checkpoint()
    name = _job_name(view)
    if kind == IncidentKind.HANG:
        last, at = view.last_step, view.last_step_at
        step_time = view.step_time()
        since = at if at is not None else (view.marker_at if view.marker_at is not None else view.first_seen)
        return hang_chart(
            steps,
            ckpt,
            title=chart_title(view.key, name, "Hang"),
            last_step=last,
            projected=projected_step(last, at, now, step_time),
            stalled_s=max(0.0, now - since),
            step_time_s=step_time,
            incident_id=incident_id,
        )
    if kind == IncidentKind.TGS_DEGRADATION:
        analysis = analyze_tgs(steps, ckpt, threshold_pct=tgs_threshold_pct, baseline_steps=baseline_steps)
        # The whole run: a tailed job keeps only some step records (the detectors' windows), so the
        # line is drawn from its bounded history (bucket means) when that covers more of the run.
        history = view.step_history()
        drawn: Sequence[HistoryItem] = steps
        if history and sum(p.steps for p in history) > len(steps):
            drawn = [(p.first_step, p.seconds_mean, p.tgs_mean) for p in history]
        return tgs_chart(
            drawn,
            ckpt,
            analysis,
            title=chart_title(view.key, name, "TGS slide"),
            baseline_steps=baseline_steps,
            incident_id=incident_id,
        )
    raise ValueError(f"no step chart for incident kind {kind!r} (hang, tgs-degradation)")


def chart_payload(
    view: JobView,
    kind: str,
    now: float,
    *,
    tgs_threshold_pct: float = 10.0,
    baseline_steps: tuple[int, int] = (5, 15),
) -> dict[str, Any] | None:
    """The step chart of a watched job for an incident kind, as bounded JSON (None: not plottable)."""
    if kind not in (IncidentKind.HANG, IncidentKind.TGS_DEGRADATION):
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
        marks["kind"] = MarkKind(marks["kind"])
        if marks.get("baseline_steps") is not None:
            marks["baseline_steps"] = tuple(marks["baseline_steps"])
        spec["marks"] = IncidentMarks(**marks)
    spec["checkpoints"] = tuple(spec.get("checkpoints") or ())
    spec["evals"] = tuple(spec.get("evals") or ())
    return StepChart(**spec)


def strip_payload(
    strip: GpuStrip, view: JobView, settings: TsdbSettings, gpu_model: str | None
) -> dict[str, Any]:
    """A RAY=1 hang's power strip (per-host GPU power/utilization, bands of the GPU model) as JSON."""
    name = view.main.header.get("JOB_NAME") if view.main is not None else None
    ps = power_strip(
        strip.power,
        strip.util,
        power_bands(settings.profile(gpu_model), settings.thresholds),
        title=chart_title(view.key, name, "GPU power"),
        start=strip.start,
        end=strip.end,
        last_step=view.last_step,
        last_step_at=view.last_step_at,
        notes=strip.notes,
    )
    spec = dataclasses.asdict(ps)
    for arm in ("power", "util"):
        _nulls(spec[arm])
    return {"type": STRIP, "spec": spec}


def _nulls(hosts: list[dict[str, Any]]) -> None:
    """NaN (no sample) -> null, in place: strict JSON has no NaN literal."""
    for h in hosts:
        for key in ("mean", "low", "high"):
            h[key] = [None if x != x else x for x in h[key]]


def _series(items: Any) -> tuple[HostSeries, ...]:
    return tuple(
        HostSeries(
            host=str(h["host"]),
            times=tuple(h["times"]),
            # JSON has no NaN literal in strict mode: a silent sample travels as null.
            mean=tuple(float("nan") if x is None else x for x in h["mean"]),
            low=tuple(float("nan") if x is None else x for x in h.get("low") or ()),
            high=tuple(float("nan") if x is None else x for x in h.get("high") or ()),
            gpus=h.get("gpus"),
        )
        for h in items or ()
    )


def host_strip_payload(slide: SlideAnswer, verdict: SlowHostVerdict, view: JobView) -> dict[str, Any]:
    """A TGS slide's per-host strip (the slow-host judge's evidence, `chat.plot_inputs.host_strip`)
    as JSON."""
    name = view.main.header.get("JOB_NAME") if view.main is not None else None
    hs = host_strip(
        slide.series,
        verdict,
        title=chart_title(view.key, name, "Hosts during the slide"),
        start=slide.start,
        end=slide.end,
    )
    spec = dataclasses.asdict(hs)
    for panel in spec["panels"]:
        _nulls(panel["series"])
    return {"type": HOST_STRIP, "spec": spec}


def host_strip_from_payload(payload: Mapping[str, Any]) -> HostStrip:
    if payload.get("type") != HOST_STRIP:
        raise ValueError(f"unknown plot payload {payload.get('type')!r}")
    spec = dict(payload["spec"])
    spec["panels"] = tuple(
        StripPanel(str(p["label"]), str(p["unit"]), _series(p.get("series")))
        for p in spec.get("panels") or ()
    )
    spec["named"] = tuple(spec.get("named") or ())
    spec["notes"] = tuple(spec.get("notes") or ())
    return HostStrip(**spec)


def picture_from_payload(payload: Mapping[str, Any]) -> PowerStrip | HostStrip:
    """The second picture of a page: a hang's power strip or a TGS slide's host strip."""
    if payload.get("type") == HOST_STRIP:
        return host_strip_from_payload(payload)
    return strip_from_payload(payload)


def strip_from_payload(payload: Mapping[str, Any]) -> PowerStrip:
    if payload.get("type") != STRIP:
        raise ValueError(f"unknown plot payload {payload.get('type')!r}")
    spec = dict(payload["spec"])
    spec["power"] = _series(spec.get("power"))
    spec["util"] = _series(spec.get("util"))
    bands = dict(spec["bands"])
    bands["busy_wait_w"] = tuple(bands["busy_wait_w"])
    bands["train_w"] = tuple(bands["train_w"])
    spec["bands"] = PowerBands(**bands)
    spec["notes"] = tuple(spec.get("notes") or ())
    return PowerStrip(**spec)


def goodput_payload(chart: GoodputChart) -> dict[str, Any]:
    """The weekly digest's picture (`goodput.report.GoodputChart`) as JSON: a few groups x buckets."""
    return {"type": GOODPUT, "spec": dataclasses.asdict(chart)}


def goodput_from_payload(payload: Mapping[str, Any]) -> GoodputChart:
    if payload.get("type") != GOODPUT:
        raise ValueError(f"unknown plot payload {payload.get('type')!r}")
    spec = dict(payload["spec"])
    return GoodputChart(
        title=str(spec["title"]),
        subtitle=str(spec["subtitle"]),
        by=str(spec["by"]),
        groups=tuple(str(g) for g in spec["groups"]),
        buckets=tuple(str(b) for b in spec["buckets"]),
        hours=tuple(tuple(float(h) for h in row) for row in spec["hours"]),
        lost_by_class=tuple((str(c), float(h)) for c, h in spec["lost_by_class"]),
    )


class PlotBridge:
    """Renders payloads to PNG in the plots helper's off-loop renderer; None when a picture fails."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self._renderer = PlotRenderer(timeout_s=timeout_s)
        self._log = get_logger(component="plots")

    async def render(self, payload: Mapping[str, Any]) -> list[bytes]:
        """The step chart, then the second picture (a hang's power strip, a TGS slide's host
        strip), or the goodput digest's picture; a picture that fails is left out."""
        specs: list[StepChart | PowerStrip | HostStrip | GoodputChart] = []
        try:
            if payload.get("type") == GOODPUT:
                specs.append(goodput_from_payload(payload))
            else:
                specs.append(chart_from_payload(payload))
            if isinstance(payload.get("strip"), Mapping):
                specs.append(picture_from_payload(payload["strip"]))
        except (KeyError, TypeError, ValueError) as exc:
            self._log.warning("plot_payload_bad", error=f"{type(exc).__name__}: {exc}")
        out: list[bytes] = []
        for spec in specs:
            try:
                out.append(await self._renderer.render(spec))
            except Exception as exc:  # RenderError: the message goes without this picture
                self._log.warning("plot_render_failed", error=f"{type(exc).__name__}: {exc}")
        return out

    async def close(self) -> None:
        await self._renderer.close()
