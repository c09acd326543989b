"""The goodput picture as PNG bytes, pure: where the allocated GPU-hours went per week (or per user, ...)
as stacked bars, and the lost GPU-hours by failure class beside them.

Same canvas, fonts and palette PNG as the alert pictures (`chat.plots`): 1280x960, no pyplot,
no global state, the same input gives the same bytes. Decisions: productive hours sit at the
bottom of each bar in green, the losses above it in warm colours, so the bar's green share *is*
its goodput (written above it); at most `MAX_GROUPS` bars (the latest weeks, or the largest
groups) and `MAX_CLASSES` classes, the rest summed into "other".
"""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes

from jobdiagd.chat.plots import (
    F_LABEL,
    F_LEGEND,
    F_NOTE,
    HEIGHT_PX,
    _header,
    _new_figure,
    _placeholder,
    _png,
    _style,
)
from jobdiagd.goodput.report import GoodputChart

MAX_GROUPS = 16
MAX_CLASSES = 10
COLORS = {
    "productive": "#2ca02c",
    "startup": "#1f77b4",
    "checkpoint": "#9467bd",
    "stall_to_detection": "#d62728",
    "detection_to_kill": "#ff7f0e",
    "redone": "#8c564b",
    "rest": "#bbbbbb",
    "queue": "#e0e0e0",
}
LABELS = {
    "productive": "productive",
    "startup": "start-up",
    "checkpoint": "checkpoint saves",
    "stall_to_detection": "stalled: last step -> page",
    "detection_to_kill": "stalled: page -> kill",
    "redone": "progress redone",
    "rest": "rest (evals, teardown)",
    "queue": "queue",
}


def _trim(spec: GoodputChart) -> tuple[list[str], np.ndarray]:
    groups = list(spec.groups)
    hours = np.array(spec.hours, dtype=float).reshape(len(groups), len(spec.buckets))
    if len(groups) <= MAX_GROUPS:
        return groups, hours
    if spec.by == "week":  # the latest weeks
        return groups[-MAX_GROUPS:], hours[-MAX_GROUPS:]
    order = np.argsort(-hours.sum(axis=1), kind="stable")
    keep, rest = order[: MAX_GROUPS - 1], order[MAX_GROUPS - 1 :]
    return [groups[i] for i in keep] + [f"{len(rest)} others"], np.vstack(
        [hours[keep], hours[rest].sum(axis=0, keepdims=True)]
    )


def _classes(spec: GoodputChart) -> list[tuple[str, float]]:
    items = list(spec.lost_by_class)
    if len(items) > MAX_CLASSES:
        items = [*items[: MAX_CLASSES - 1], ("other", sum(h for _, h in items[MAX_CLASSES - 1 :]))]
    return items


def render_goodput(spec: GoodputChart) -> bytes:
    fig = _new_figure()
    top_px = _header(fig, spec.title, spec.subtitle)
    groups, hours = _trim(spec)
    if not groups or not np.isfinite(hours).all() or hours.sum() <= 0:
        _placeholder(fig, "No GPU-hours in this period: no job ran, or none could be placed in time.")
        return _png(fig)
    rows = -(-len(spec.buckets) // 4)
    top = 1 - (top_px + rows * 25 + 70) / HEIGHT_PX
    bottom_y = 0.16 if len(groups) > 6 else 0.09
    ax = fig.add_axes((0.08, bottom_y, 0.56, top - bottom_y))
    side = fig.add_axes((0.79, bottom_y, 0.19, top - bottom_y))
    for a in (ax, side):
        _style(a)
    x = np.arange(len(groups))
    bottom = np.zeros(len(groups))
    handles = []
    for j, b in enumerate(spec.buckets):
        h = ax.bar(
            x, hours[:, j], bottom=bottom, color=COLORS.get(b, "#999999"), width=0.7, label=LABELS.get(b, b)
        )
        handles.append(h)
        bottom += hours[:, j]
    prod = hours[:, list(spec.buckets).index("productive")] if "productive" in spec.buckets else None
    for i, tot in enumerate(bottom):
        if prod is not None and tot > 0:
            ax.text(i, tot, f"{prod[i] / tot * 100:.0f}%", ha="center", va="bottom", fontsize=F_NOTE - 2)
    ax.set_xticks(
        x, groups, rotation=45 if len(groups) > 6 else 0, ha="right" if len(groups) > 6 else "center"
    )
    ax.set_ylabel("GPU-hours", fontsize=F_LABEL)
    ax.set_ylim(0, float(bottom.max()) * 1.1)
    fig.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(0.06, 1 - (top_px + 4) / HEIGHT_PX),
        ncol=4,
        frameon=False,
        fontsize=F_LEGEND - 1,
    )
    _class_panel(side, _classes(spec))
    return _png(fig)


def _class_panel(ax: Axes, items: list[tuple[str, float]]) -> None:
    ax.set_title("GPU-hours not productive,\nby how the run ended", fontsize=F_LABEL - 1)
    if not items:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "nothing lost", ha="center", va="center", transform=ax.transAxes, fontsize=F_LABEL)
        return
    names = [n for n, _ in items][::-1]
    vals = [v for _, v in items][::-1]
    y = np.arange(len(names))
    ax.barh(y, vals, color="#d62728", height=0.6)
    ax.set_yticks(y, names, fontsize=F_NOTE - 2)
    ax.tick_params(axis="x", labelsize=F_NOTE - 3)
