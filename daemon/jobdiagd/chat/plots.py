"""Alert pictures as PNG bytes: the step chart (hang / TGS slide) and the RAY=1 GPU power strip, pure.

Built on `matplotlib.figure.Figure` with the Agg canvas and no pyplot, no rcParams changes:
no global state, so rendering is safe in threads and worker processes. Inputs are the plain
dataclasses of `jobdiagd.model.plotdata` (re-exported here).

Decisions where the issue is silent:
- Size 1280x960 px (4:3): Telegram keeps photos up to 1280 px on the long side, and 4:3 shows
  two stacked panels larger than 16:9 in a phone's portrait chat. Fonts are 14-22 px so the
  preview stays readable; PNG without metadata stamps, so a re-render gives the same bytes.
- Step chart: throughput on top (taller: it is what TGS means), step time below, sharing the
  step axis. Legends sit above the panels, never on the data. Y limits come from the 2nd-98th
  percentiles of the steps that are not slow by design (warm-up, checkpoint, eval), plus the
  marked levels, so a 36 s compile step or checkpoint spikes do not flatten the steady state;
  points beyond are drawn as triangles on the edge and the extreme value is written in the
  corner.
- Hang: the stall (last step -> projected step) is shaded and takes at least ~1/4 of the
  width: the view starts 2.5 stall-lengths (at least 60 steps) before the last step, and says
  which earlier steps it leaves out. TGS: the whole history, baseline and current level drawn
  as lines with the change in percent between them.
- More than 40 checkpoints/evals in view are drawn as a rug along the top edge, not lines.
- More than `MAX_POINTS` steps are reduced to the min and max step time of equal step buckets
  (spikes survive, rendering time stays bounded whatever the history length).
- Power strip: hosts that agree are one median line with the min-max band of all their GPUs;
  a host deviates when it stopped reporting in the last 10 % of the window, or its median over
  the last quarter differs from the hosts' median by more than max(15 %, 60 W) / 25 points of
  utilization. Deviating hosts with the same reason ("silent since -10 min", "95 W") are one
  group; up to 5 groups are drawn as their own lines (same colour in both panels), the other
  hosts are named. Time runs in minutes before the window's end (UTC in the label).
- No data: the picture still renders, with a placeholder sentence saying what is missing.
"""

from __future__ import annotations

import datetime as _dt
import io
import math
import textwrap
import warnings
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.gridspec import GridSpec
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator
from PIL import Image

from jobdiagd.durations import rounded_duration
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

__all__ = [
    "HEIGHT_PX",
    "MAX_POINTS",
    "WIDTH_PX",
    "HostSeries",
    "HostStrip",
    "IncidentMarks",
    "MarkKind",
    "PowerBands",
    "PowerStrip",
    "StepChart",
    "StepPoint",
    "StripPanel",
    "describe_strip",
    "downsample",
    "host_strip_figure",
    "render",
    "render_host_strip",
    "render_power_strip",
    "render_step_chart",
    "odd_groups",
    "split_hosts",
    "step_figure",
    "strip_figure",
]

WIDTH_PX, HEIGHT_PX, DPI = 1280, 960, 100
MAX_POINTS = 3000
MAX_MARK_LINES = 40
MIN_CONTEXT_STEPS = 60
WARMUP_STEPS = 5  # the first steps compile and warm up (triage.progress)
MAX_DEVIATING_DRAWN = 5  # groups of deviating hosts drawn as their own line
SUBTITLE_CHARS = 125
LEGEND_CHARS = 42

# Font sizes in points at 100 dpi (= px): the preview on a phone shrinks the picture ~3x.
F_TITLE, F_SUB, F_LABEL, F_TICK, F_LEGEND, F_NOTE = 22, 15, 16, 14, 13, 14

C_TPS = "#1f77b4"
C_SECS = "#ff7f0e"
C_CKPT = "#555555"
C_EVAL = "#8c564b"
C_BAD = "#d62728"
C_GOOD = "#2ca02c"
C_SLIDE = "#e377c2"
C_TYPICAL = "#1f77b4"
# Deviating hosts: distinct from the typical blue and from the band colours.
HOST_COLORS = ("#d62728", "#9467bd", "#8c564b", "#17becf", "#000000", "#bcbd22")
BAND_TRAIN = "#2ca02c"
BAND_BUSY = "#ff7f0e"
BAND_IDLE = "#7f7f7f"


# --- step chart -----------------------------------------------------------------------------------


def downsample(
    points: Sequence[StepPoint], limit: int = MAX_POINTS, keep: Collection[int] = ()
) -> tuple[StepPoint, ...]:
    """At most ~`limit` points, sorted by step: per equal-width bucket of the list, the slowest and
    fastest step (spikes survive); the first and last point and the steps in `keep` always stay."""
    ordered = sorted(points, key=lambda p: p.step)
    n = len(ordered)
    if n <= limit:
        return tuple(ordered)
    secs = np.array([_num(p.seconds) for p in ordered], dtype=float)
    tps = np.array([_num(p.tokens_per_s) for p in ordered], dtype=float)
    # Rank steps by slowness: seconds, else 1/throughput; lines with neither sort last.
    key = np.where(np.isfinite(secs), secs, np.where(tps > 0, 1.0 / np.where(tps > 0, tps, 1.0), np.nan))
    buckets = max(1, limit // 2)
    bucket = np.arange(n) * buckets // n
    order = np.lexsort((np.nan_to_num(key, nan=np.inf), bucket))
    sorted_bucket = bucket[order]
    firsts = np.flatnonzero(np.r_[True, sorted_bucket[1:] != sorted_bucket[:-1]])
    lasts = np.r_[firsts[1:] - 1, n - 1]
    chosen = set(order[firsts].tolist()) | set(order[lasts].tolist()) | {0, n - 1}
    wanted = set(keep)
    if wanted:
        chosen |= {i for i, p in enumerate(ordered) if p.step in wanted}
    return tuple(ordered[i] for i in sorted(chosen))


def _num(v: float | None) -> float:
    return float("nan") if v is None else float(v)


def _finite(vals: Iterable[float]) -> list[float]:
    return [v for v in vals if math.isfinite(v)]


def _view(chart: StepChart, first: int, last: int) -> tuple[float, float, int]:
    """(x_lo, x_hi, first step shown)."""
    m = chart.marks
    lo, hi = first, last
    if m is not None and m.kind == MarkKind.HANG and m.start_step is not None:
        end = max(m.projected_step or m.start_step, m.start_step)
        gap = end - m.start_step
        lo = max(first, m.start_step - max(int(2.5 * gap), MIN_CONTEXT_STEPS))
        hi = max(last, end)
    span = max(hi - lo, 1)
    return lo - 0.01 * span, hi + 0.03 * span, lo


def _robust_limits(
    vals: Sequence[float], refs: Iterable[float | None] = (), *, floor_zero: bool = True
) -> tuple[float, float]:
    arr = np.array(_finite(vals), dtype=float)
    levels = [r for r in refs if r is not None and math.isfinite(r)]
    if arr.size == 0 and not levels:
        return 0.0, 1.0
    pool = np.concatenate([arr, np.array(levels, dtype=float)]) if levels else arr
    if arr.size:
        q_lo, q_hi = (float(x) for x in np.percentile(arr, [2, 98]))
        med = float(np.median(arr))
    else:
        q_lo, q_hi, med = float(pool.min()), float(pool.max()), float(np.median(pool))
    # A floor of 20 % of the median: 1 % noise stays a flat line, a 10 % slide stays visible.
    span = max(q_hi - q_lo, 0.20 * abs(med), 1e-9)
    lo, hi = q_lo - 0.35 * span, q_hi + 0.35 * span
    for r in levels:
        lo, hi = min(lo, r - 0.15 * span), max(hi, r + 0.15 * span)
    if floor_zero and float(pool.min()) >= 0:
        lo = max(lo, 0.0)
    return lo, hi


def _fmt_num(v: float) -> str:
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def _new_figure() -> Figure:
    fig = Figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, facecolor="white")
    FigureCanvasAgg(fig)
    return fig


def _header(fig: Figure, title: str, subtitle: str | None) -> float:
    """Title and up to two subtitle lines; returns the pixels they take from the top."""
    fig.text(
        0.02, 1 - 12 / HEIGHT_PX, _cut(title, 70), fontsize=F_TITLE, fontweight="bold", ha="left", va="top"
    )
    y = 52.0
    lines = textwrap.wrap(subtitle, SUBTITLE_CHARS)[:2] if subtitle else []
    if subtitle and len(textwrap.wrap(subtitle, SUBTITLE_CHARS)) > 2:
        lines[-1] = _cut(lines[-1] + " …", SUBTITLE_CHARS)
    for line in lines:
        fig.text(0.02, 1 - y / HEIGHT_PX, line, fontsize=F_SUB, color="#333333", ha="left", va="top")
        y += 22
    return y + 6


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _legend_and_top(
    fig: Figure, gs: GridSpec, handles: Sequence[Line2D | Patch], header_px: float, left: float
) -> None:
    """The legend in its own band between the header and the panels (never on the data), and the
    panels' top moved down to make room for exactly its rows."""
    for h in handles:
        h.set_label(_cut(str(h.get_label()), LEGEND_CHARS))
    # Three columns fit 1280 px up to ~34 characters a label, two up to LEGEND_CHARS.
    ncol = 3 if max((len(str(h.get_label())) for h in handles), default=0) <= 34 else 2
    rows = math.ceil(len(handles) / ncol) if handles else 0
    if handles:
        fig.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(left - 0.01, 1 - header_px / HEIGHT_PX),
            ncol=ncol,
            frameon=False,
            fontsize=F_LEGEND,
            borderaxespad=0.0,
            columnspacing=2.0,
            handlelength=2.2,
        )
    gs.update(top=1 - (header_px + rows * 25 + 16) / HEIGHT_PX)
    # GridSpec.update only moves the axes of pyplot-managed figures: move ours by hand.
    for ax in fig.axes:
        spec = ax.get_subplotspec()
        if spec is not None and spec.get_gridspec() is gs:
            ax.set_position(spec.get_position(fig))


def _png(fig: Figure) -> bytes:
    """128-colour palette PNG: a third of the RGB size, no visible loss on flat-colour charts;
    no "Software"/date stamps, so the same input gives the same bytes. Median cut, although
    the fast octree takes 15 ms instead of ~120: the octree merges the pale shadings (stall,
    slide) into the white background."""
    raw = io.BytesIO()
    fig.savefig(raw, format="rgba", dpi=DPI)
    image = Image.frombuffer("RGBA", (WIDTH_PX, HEIGHT_PX), raw.getvalue(), "raw", "RGBA", 0, 1)
    palette = image.convert("RGB").quantize(
        colors=128, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
    )
    buf = io.BytesIO()
    palette.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def _placeholder(fig: Figure, message: str) -> None:
    ax = fig.add_axes((0.06, 0.08, 0.88, 0.78))
    ax.set_axis_off()
    ax.text(
        0.5,
        0.5,
        message,
        ha="center",
        va="center",
        fontsize=F_LABEL + 4,
        color="#555555",
        wrap=True,
        transform=ax.transAxes,
    )


def _two_panels(fig: Figure, *, hspace: float, left: float, right: float) -> tuple[GridSpec, Axes, Axes]:
    """A taller panel over a shorter one sharing its x axis, below the header (step chart, power strip)."""
    gs = fig.add_gridspec(
        2, 1, height_ratios=(3, 2), hspace=hspace, left=left, right=right, top=0.80, bottom=0.08
    )
    top = fig.add_subplot(gs[0])
    bottom = fig.add_subplot(gs[1], sharex=top)
    for ax in (top, bottom):
        _style(ax)
    return gs, top, bottom


def _style(ax: Axes) -> None:
    ax.tick_params(labelsize=F_TICK)
    ax.grid(True, color="#dddddd", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _thousands(ax: Axes, axis: str) -> None:
    fmt = FuncFormatter(lambda v, _pos: _fmt_num(v) if abs(v) >= 100 else f"{v:g}")
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_formatter(fmt)


def _plot_clipped(
    ax: Axes, xs: Sequence[float], ys: Sequence[float], lim: tuple[float, float], color: str, unit: str
) -> None:
    """Points outside the limits as triangles on the edge, and the extreme value named in the corner."""
    lo, hi = lim
    above = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y) and y > hi]
    below = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y) and y < lo]
    notes = []
    if above:
        ax.scatter(
            [x for x, _ in above], [hi] * len(above), marker="^", s=60, color=color, clip_on=False, zorder=5
        )
        notes.append(f"▲ off scale, up to {_fmt_num(max(y for _, y in above))} {unit}")
    if below:
        ax.scatter(
            [x for x, _ in below], [lo] * len(below), marker="v", s=60, color=color, clip_on=False, zorder=5
        )
        notes.append(f"▼ off scale, down to {_fmt_num(min(y for _, y in below))} {unit}")
    if notes:
        ax.text(
            0.995,
            0.97,
            "\n".join(notes),
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=F_NOTE - 2,
            color="#444444",
            bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 2},
        )


def _marks(axes: Sequence[Axes], steps: Sequence[int], lo: float, hi: float, color: str, style: str) -> bool:
    """Vertical lines at these steps (a rug along the top edge when there are too many); True if any."""
    shown = sorted({s for s in steps if lo <= s <= hi})
    if not shown:
        return False
    dense = len(shown) > MAX_MARK_LINES
    for ax in axes:
        for s in shown:
            if dense:
                ax.axvline(s, ymin=0.95, ymax=1.0, color=color, linewidth=1.0, alpha=0.8)
            else:
                ax.axvline(s, color=color, linestyle=style, linewidth=1.3, alpha=0.7, zorder=1)
    return True


def step_figure(chart: StepChart) -> Figure:
    """The step chart as a Figure (tests inspect its artists; `render_step_chart` encodes it)."""
    fig = _new_figure()
    header_px = _header(fig, chart.title, chart.subtitle)
    m = chart.marks
    keep = [s for s in ((m.start_step, m.projected_step) if m else ()) if s is not None]
    have = [p.step for p in chart.points if _finite([_num(p.seconds), _num(p.tokens_per_s)])]
    if not have:
        msg = "no training step with step time or throughput yet"
        if m is not None and m.kind == MarkKind.HANG and m.stalled_s is not None:
            msg += f"\n(no step for {rounded_duration(m.stalled_s)})"
        _placeholder(fig, msg)
        return fig
    first, last = min(have), max(have)
    x_lo, x_hi, shown_from = _view(chart, first, last)
    # Cut to the view first, then thin: a long history must not thin away the steps in view.
    vis = list(downsample([p for p in chart.points if x_lo <= p.step <= x_hi], MAX_POINTS, keep))
    xs = [float(p.step) for p in vis]
    tps = [_num(p.tokens_per_s) for p in vis]
    secs = [_num(p.seconds) for p in vis]

    gs, ax_t, ax_s = _two_panels(fig, hspace=0.08, left=0.10, right=0.97)
    marker = "o" if len(vis) <= 150 else None
    ax_t.plot(xs, tps, color=C_TPS, linewidth=1.8, marker=marker, markersize=3.5, zorder=3)
    ax_s.plot(xs, secs, color=C_SECS, linewidth=1.6, marker=marker, markersize=3.5, zorder=3)
    # Limits from the steps that are not slow by design (warm-up, checkpoint and eval steps and the
    # step after each), so frequent checkpoints do not flatten the steady state either.
    slow = {s + d for s in (*chart.checkpoints, *chart.evals) for d in (0, 1, 2)}
    clean = [i for i, p in enumerate(vis) if p.step not in slow and p.step - first >= WARMUP_STEPS]
    if len(clean) < 5:
        clean = list(range(len(vis)))
    t_lim = _robust_limits([tps[i] for i in clean], (m.baseline, m.degraded) if m else ())
    s_lim = _robust_limits([secs[i] for i in clean])
    ax_t.set_ylim(*t_lim)
    ax_s.set_ylim(*s_lim)
    _plot_clipped(ax_t, xs, tps, t_lim, C_TPS, chart.throughput_unit)
    _plot_clipped(ax_s, xs, secs, s_lim, C_SECS, "s")
    ax_t.set_xlim(x_lo, x_hi)
    ax_t.set_ylabel(chart.throughput_unit, fontsize=F_LABEL, color=C_TPS)
    ax_s.set_ylabel("step time (s)", fontsize=F_LABEL, color=C_SECS)
    ax_s.set_xlabel("training step", fontsize=F_LABEL)
    ax_t.tick_params(labelbottom=False)
    _thousands(ax_s, "x")
    if t_lim[1] >= 1000:
        _thousands(ax_t, "y")
    ax_s.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True, steps=[1, 2, 2.5, 5, 10]))
    ax_t.yaxis.set_major_locator(MaxNLocator(nbins=6))
    ax_s.yaxis.set_major_locator(MaxNLocator(nbins=5))

    legend: list[Line2D | Patch] = []
    if _marks((ax_t, ax_s), chart.checkpoints, x_lo, x_hi, C_CKPT, ":"):
        legend.append(
            Line2D([], [], color=C_CKPT, linestyle=":", linewidth=1.6, label=chart.checkpoint_label)
        )
    if _marks((ax_t, ax_s), chart.evals, x_lo, x_hi, C_EVAL, "--"):
        legend.append(Line2D([], [], color=C_EVAL, linestyle="--", linewidth=1.4, label=chart.eval_label))
    if m is not None and m.kind == MarkKind.HANG:
        legend += _hang_marks(ax_t, ax_s, m, x_lo, x_hi)
    elif m is not None and m.kind == MarkKind.TGS:
        legend += _tgs_marks(ax_t, ax_s, m, last, x_lo, x_hi, chart.throughput_unit)
    if shown_from > first:
        ax_t.text(
            0.005,
            0.02,
            f"◀ steps {first:,}–{shown_from - 1:,} not shown",
            transform=ax_t.transAxes,
            fontsize=F_NOTE - 2,
            color="#555555",
            ha="left",
            va="bottom",
            zorder=6,
            bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 2},
        )
    _legend_and_top(fig, gs, legend, header_px, 0.10)
    return fig


def render_step_chart(chart: StepChart) -> bytes:
    return _png(step_figure(chart))


def _hang_marks(ax_t: Axes, ax_s: Axes, m: IncidentMarks, x_lo: float, x_hi: float) -> list[Line2D | Patch]:
    out: list[Line2D | Patch] = []
    if m.start_step is None:
        return out
    start = m.start_step
    for ax in (ax_t, ax_s):
        ax.axvline(start, color=C_BAD, linewidth=2.2, zorder=4)
    out.append(Line2D([], [], color=C_BAD, linewidth=2.2, label=f"last step {start:,}"))
    proj = m.projected_step
    if proj is None or proj <= start:
        return out
    for ax in (ax_t, ax_s):
        ax.axvspan(start, proj, color=C_BAD, alpha=0.10, linewidth=0, zorder=0)
        ax.axvline(proj, color=C_BAD, linestyle="--", linewidth=2.2, zorder=4)
    out.append(
        Line2D([], [], color=C_BAD, linestyle="--", linewidth=2.2, label=f"expected ≈ step {proj:,} by now")
    )
    out.append(Patch(color=C_BAD, alpha=0.15, label="no steps (stalled)"))
    lines = [f"stalled {rounded_duration(m.stalled_s)}" if m.stalled_s is not None else "stalled"]
    lines.append(f"≈ {proj - start:,} steps behind")
    text = ax_t.text(
        (start + proj) / 2,
        0.5,
        "\n".join(lines),
        transform=ax_t.get_xaxis_transform(),
        ha="center",
        va="center",
        fontsize=F_LABEL + 2,
        color=C_BAD,
        fontweight="bold",
        zorder=6,
        bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": C_BAD, "boxstyle": "round,pad=0.4"},
    )
    # Only inside the shaded stall: spilling over the data would hide the last steps (the subtitle
    # and the legend carry the same facts).
    box = text.get_window_extent()
    gap_px = abs(float(ax_t.transData.transform((proj, 0))[0] - ax_t.transData.transform((start, 0))[0]))
    if box.width + 16 > gap_px:
        text.remove()
    return out


def _tgs_marks(
    ax_t: Axes, ax_s: Axes, m: IncidentMarks, last: int, x_lo: float, x_hi: float, unit: str
) -> list[Line2D | Patch]:
    out: list[Line2D | Patch] = []
    if m.baseline_steps is not None:
        a, b = m.baseline_steps
        for ax in (ax_t, ax_s):
            ax.axvspan(a, b, color=C_GOOD, alpha=0.12, linewidth=0, zorder=0)
        out.append(Patch(color=C_GOOD, alpha=0.25, label=f"baseline window (steps {a:,}–{b:,})"))
    if m.baseline is not None:
        ax_t.axhline(m.baseline, color=C_GOOD, linestyle="--", linewidth=2.0, zorder=4)
        out.append(
            Line2D(
                [], [], color=C_GOOD, linestyle="--", linewidth=2.0, label=f"baseline {_fmt_num(m.baseline)}"
            )
        )
    start = m.start_step
    if start is not None:
        for ax in (ax_t, ax_s):
            ax.axvspan(start, last, color=C_SLIDE, alpha=0.10, linewidth=0, zorder=0)
            ax.axvline(start, color=C_BAD, linewidth=2.0, zorder=4)
        out.append(Line2D([], [], color=C_BAD, linewidth=2.0, label=f"slide began ≈ step {start:,}"))
    if m.degraded is not None:
        x0 = start if start is not None else x_lo
        ax_t.plot([x0, last], [m.degraded, m.degraded], color=C_BAD, linestyle="--", linewidth=2.2, zorder=4)
        label = f"now {_fmt_num(m.degraded)}"
        if m.change_pct is not None:
            label += f" ({m.change_pct:+.0f} %)".replace("-", "−")
        out.append(Line2D([], [], color=C_BAD, linestyle="--", linewidth=2.2, label=label))
    if m.baseline is not None and m.degraded is not None:
        pct = m.change_pct if m.change_pct is not None else (m.degraded - m.baseline) / m.baseline * 100
        x_arrow = last + 0.012 * (x_hi - x_lo)
        ax_t.annotate(
            "",
            xy=(x_arrow, m.degraded),
            xytext=(x_arrow, m.baseline),
            zorder=6,
            arrowprops={"arrowstyle": "-|>", "color": C_BAD, "linewidth": 2.5, "mutation_scale": 22},
        )
        text = f"{pct:+.0f} %".replace("-", "−")
        if m.pattern:
            text += f"\n{m.pattern}"
        ax_t.text(
            last - 0.01 * (x_hi - x_lo),
            (m.baseline + m.degraded) / 2,
            text,
            ha="right",
            va="center",
            fontsize=F_LABEL + 6,
            fontweight="bold",
            color=C_BAD,
            zorder=6,
            bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 3},
        )
    return out


# --- power strip ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostGroups:
    """`typical`: hosts that agree; `deviating`: host -> why (for the legend)."""

    typical: tuple[HostSeries, ...]
    deviating: dict[str, str]


def _arr(vals: Sequence[float]) -> np.ndarray:
    return np.array(vals, dtype=float) if vals else np.zeros(0)


def split_hosts(
    series: Sequence[HostSeries],
    start: float,
    end: float,
    *,
    tolerance: float,
    relative: float = 0.0,
    unit: str = "",
) -> HostGroups:
    """Hosts that agree vs hosts that deviate: silent in the last 10 % of the window while others
    report, or a median over the last quarter off the hosts' median by more than
    max(tolerance, relative x that median)."""
    span = max(end - start, 1.0)
    tail_from, recent_from = end - 0.10 * span, end - 0.25 * span
    recent_med: dict[str, float] = {}
    reporting: dict[str, bool] = {}
    for hs in series:
        t, v = _arr(hs.times), _arr(hs.mean)
        ok = np.isfinite(v)
        reporting[hs.host] = bool(np.any(ok & (t >= tail_from)))
        sel = ok & (t >= recent_from)
        if np.any(sel):
            recent_med[hs.host] = float(np.median(v[sel]))
    deviating: dict[str, str] = {}
    anyone = any(reporting.values())
    for hs in series:
        if anyone and not reporting[hs.host]:
            t, v = _arr(hs.times), _arr(hs.mean)
            ok = np.isfinite(v)
            if np.any(ok):
                last_t = float(t[ok].max())
                deviating[hs.host] = f"silent since {_ago(last_t, end)}"
            else:
                deviating[hs.host] = "no data"
    if recent_med:
        med = float(np.median(list(recent_med.values())))
        tol = max(tolerance, relative * abs(med))
        for host, level in recent_med.items():
            if host not in deviating and abs(level - med) > tol:
                deviating[host] = f"{level:.0f}{unit}"
    typical = tuple(hs for hs in series if hs.host not in deviating)
    return HostGroups(typical, deviating)


def _ago(t: float, end: float) -> str:
    return f"−{rounded_duration(end - t)}" if end - t >= 1 else "the end"


def _typical_band(group: Sequence[HostSeries], grid: np.ndarray) -> tuple[np.ndarray, ...]:
    """(median of host means, min of lows, max of highs) on a common time grid."""
    rows_mean, rows_lo, rows_hi = [], [], []
    for hs in group:
        t = _arr(hs.times)
        if t.size == 0:
            continue
        rows_mean.append(_on_grid(t, _arr(hs.mean), grid))
        rows_lo.append(_on_grid(t, _arr(hs.low) if hs.low else _arr(hs.mean), grid))
        rows_hi.append(_on_grid(t, _arr(hs.high) if hs.high else _arr(hs.mean), grid))
    if not rows_mean:
        nan = np.full(grid.size, np.nan)
        return nan, nan, nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns are times nobody reported
        return (
            np.nanmedian(np.vstack(rows_mean), axis=0),
            np.nanmin(np.vstack(rows_lo), axis=0),
            np.nanmax(np.vstack(rows_hi), axis=0),
        )


def _on_grid(t: np.ndarray, v: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Values at grid times (nearest sample within half a grid step, else NaN)."""
    out = np.full(grid.size, np.nan)
    if t.size == 0:
        return out
    order = np.argsort(t)
    t, v = t[order], v[order]
    step = float(np.median(np.diff(grid))) if grid.size > 1 else 1.0
    idx = np.clip(np.searchsorted(t, grid), 1, max(t.size - 1, 1))
    left = np.clip(idx - 1, 0, t.size - 1)
    right = np.clip(idx, 0, t.size - 1)
    pick = np.where(np.abs(t[left] - grid) <= np.abs(t[right] - grid), left, right)
    near = np.abs(t[pick] - grid) <= step / 2 + 1e-6
    out[near] = v[pick][near]
    return out


def _grid(series: Sequence[HostSeries]) -> np.ndarray:
    ts = sorted({float(x) for hs in series for x in hs.times})
    return np.array(ts, dtype=float)


def _strip_panel(
    ax: Axes,
    series: Sequence[HostSeries],
    strip: PowerStrip,
    odd: Sequence[tuple[str, tuple[str, ...]]],
    groups: HostGroups,
    what: str,
) -> list[Line2D | Patch]:
    """Draw one panel (the first `len(HOST_COLORS)` deviating groups in their colours); returns the
    legend entries of its typical group."""
    end = strip.end
    legend: list[Line2D | Patch] = []
    grid = _grid(series)
    if grid.size == 0 or not any(_finite(hs.mean) for hs in series):
        ax.text(
            0.5,
            0.5,
            f"no {what} samples in this window",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=F_LABEL,
            color="#555555",
        )
        return legend
    x = (grid - end) / 60.0
    med, lo, hi = _typical_band(groups.typical, grid)
    if groups.typical:
        n = len(groups.typical)
        gpus = sum(hs.gpus or 0 for hs in groups.typical)
        ax.fill_between(x, lo, hi, color=C_TYPICAL, alpha=0.22, linewidth=0, zorder=2)
        # Above the deviating hosts: where a host agreed until it died, the agreement shows.
        ax.plot(x, med, color=C_TYPICAL, linewidth=2.2, zorder=4)
        who = f"{n} host{'s' if n != 1 else ''}" + (f" ({gpus} GPUs)" if gpus else "")
        legend.append(Line2D([], [], color=C_TYPICAL, linewidth=2.2, label=f"{who}: median"))
        legend.append(Patch(color=C_TYPICAL, alpha=0.3, label="min–max of their GPUs"))
    for (_why, hosts), c in zip(odd, HOST_COLORS, strict=False):
        members = [hs for hs in series if hs.host in hosts and hs.host in groups.deviating]
        if not members:
            continue
        if len(members) == 1:
            t, v = _arr(members[0].times), _arr(members[0].mean)
        else:
            t, v = grid, _typical_band(members, grid)[0]
        xs = (t - end) / 60.0
        ax.plot(xs, v, color=c, linewidth=2.4, zorder=3)
        ok = np.isfinite(v)
        if np.any(ok) and float(t[ok].max()) < end - 0.10 * (end - strip.start):
            # Where a host fell silent: a cross at its last sample.
            ax.scatter(
                [float(xs[ok][-1])],
                [float(v[ok][-1])],
                marker="X",
                s=160,
                color=c,
                zorder=6,
                edgecolors="white",
                linewidths=1.0,
            )
    return legend


def odd_groups(power: HostGroups, util: HostGroups) -> list[tuple[str, tuple[str, ...]]]:
    """Deviating hosts grouped by what is wrong with them, biggest group first: a rack of hosts
    at the same wrong level is one line and one legend entry, not six."""
    by_reason: dict[str, list[str]] = {}
    for host in sorted(set(power.deviating) | set(util.deviating)):
        why = [r for r in (power.deviating.get(host), util.deviating.get(host)) if r is not None]
        text = why[0] if len(set(why)) == 1 else " · ".join(why)
        by_reason.setdefault(text, []).append(host)
    return sorted(((r, tuple(h)) for r, h in by_reason.items()), key=lambda g: (-len(g[1]), g[1][0]))


def _strip_time_axis(ax: Axes, start: float, end: float, min_minutes: float = 1.0) -> None:
    span_min = max((end - start) / 60.0, min_minutes)
    ax.set_xlim(-span_min, span_min * 0.01)
    stamp = _dt.datetime.fromtimestamp(end, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    ax.set_xlabel(f"minutes before {stamp}", fontsize=F_LABEL)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 5, 10]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}".replace("-", "−")))


def _band_label(ax: Axes, y: float, text: str, color: str) -> None:
    ax.text(
        1.005,
        y,
        text,
        transform=ax.get_yaxis_transform(),
        ha="left",
        va="center",
        fontsize=F_NOTE - 1,
        color=color,
        fontweight="bold",
        clip_on=False,
    )


def strip_figure(strip: PowerStrip) -> Figure:
    """The power strip as a Figure (tests inspect its artists; `render_power_strip` encodes it)."""
    fig = _new_figure()
    subtitle = strip.subtitle if strip.subtitle is not None else describe_strip(strip)
    header_px = _header(fig, strip.title, subtitle)
    if not any(_finite(hs.mean) for hs in (*strip.power, *strip.util)):
        notes = "\n".join(strip.notes)
        _placeholder(
            fig, "no GPU power or utilization samples in this window" + (f"\n{notes}" if notes else "")
        )
        return fig
    b = strip.bands
    gs, ax_p, ax_u = _two_panels(fig, hspace=0.10, left=0.09, right=0.86)
    p_groups = split_hosts(strip.power, strip.start, strip.end, tolerance=60.0, relative=0.15, unit=" W")
    u_groups = split_hosts(strip.util, strip.start, strip.end, tolerance=25.0, unit=" %")
    odd = odd_groups(p_groups, u_groups)

    # Bands first, under the data: training, busy-wait, idle, each named on the right edge.
    ax_p.axhspan(b.train_w[0], b.train_w[1], color=BAND_TRAIN, alpha=0.12, linewidth=0, zorder=0)
    ax_p.axhspan(
        b.busy_wait_w[0],
        b.busy_wait_w[1],
        facecolor=BAND_BUSY,
        alpha=0.22,
        linewidth=0,
        zorder=0,
        hatch="//",
        edgecolor=BAND_BUSY,
    )
    ax_p.axhspan(0, b.idle_max_w, color=BAND_IDLE, alpha=0.12, linewidth=0, zorder=0)
    _band_label(ax_p, sum(b.train_w) / 2, f"training\n{b.train_w[0]:.0f}–{b.train_w[1]:.0f} W", BAND_TRAIN)
    _band_label(
        ax_p, sum(b.busy_wait_w) / 2, f"busy-wait\n{b.busy_wait_w[0]:.0f}–{b.busy_wait_w[1]:.0f} W", "#c55a00"
    )
    _band_label(ax_p, b.idle_max_w / 2, f"idle\n< {b.idle_max_w:.0f} W", "#555555")
    ax_u.axhspan(b.busy_util_pct, 100, color=BAND_BUSY, alpha=0.12, linewidth=0, zorder=0)
    _band_label(ax_u, (b.busy_util_pct + 100) / 2, f"busy\n≥ {b.busy_util_pct:.0f} %", "#c55a00")

    drawn = odd[:MAX_DEVIATING_DRAWN]
    legend = _strip_panel(ax_p, strip.power, strip, drawn, p_groups, "GPU power")
    u_legend = _strip_panel(ax_u, strip.util, strip, drawn, u_groups, "GPU utilization")
    if not legend:
        legend = u_legend
    for (why, hosts), color in zip(drawn, HOST_COLORS, strict=False):
        who = hosts[0] if len(hosts) == 1 else f"{len(hosts)} hosts ({hosts[0]} …)"
        legend.append(Line2D([], [], color=color, linewidth=2.4, label=f"{who}: {why}"))
    rest = [h for _why, hosts in odd[MAX_DEVIATING_DRAWN:] for h in hosts]
    if rest:
        legend.append(Line2D([], [], color="none", label=f"+{len(rest)} more deviating: {', '.join(rest)}"))
    p_max = max([b.train_w[1] * 1.08, *(_finite(v for hs in strip.power for v in (hs.high or hs.mean)))])
    ax_p.set_ylim(0, p_max * 1.02)
    ax_u.set_ylim(-3, 108)
    ax_p.set_ylabel("GPU power (W)", fontsize=F_LABEL)
    ax_u.set_ylabel("GPU utilization (%)", fontsize=F_LABEL)
    ax_p.tick_params(labelbottom=False)
    ax_u.yaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
    _strip_time_axis(ax_u, strip.start, strip.end)
    if strip.since is not None and strip.start <= strip.since <= strip.end:
        xs = (strip.since - strip.end) / 60.0
        for ax in (ax_p, ax_u):
            ax.axvline(xs, color="black", linestyle="--", linewidth=1.8, zorder=5)
        legend.append(
            Line2D(
                [],
                [],
                color="black",
                linestyle="--",
                linewidth=1.8,
                label=f"{strip.since_label} ({_ago(strip.since, strip.end)})",
            )
        )
    if strip.notes:
        ax_u.text(
            0.005,
            0.97,
            "\n".join(strip.notes),
            transform=ax_u.transAxes,
            ha="left",
            va="top",
            fontsize=F_NOTE - 3,
            color="#555555",
        )
    _legend_and_top(fig, gs, legend, header_px, 0.09)
    return fig


def render_power_strip(strip: PowerStrip) -> bytes:
    return _png(strip_figure(strip))


def describe_strip(strip: PowerStrip) -> str | None:
    """One line on the last 10 % of the window: what the GPUs are doing, judged by the power bands."""
    b = strip.bands
    span = max(strip.end - strip.start, 1.0)
    tail = strip.end - 0.10 * span

    def recent(series: Sequence[HostSeries]) -> float | None:
        vals = [
            v
            for hs in series
            for t, v in zip(hs.times, hs.mean, strict=False)
            if t >= tail and math.isfinite(v)
        ]
        return float(np.median(vals)) if vals else None

    p, u = recent(strip.power), recent(strip.util)
    if p is None and u is None:
        return None
    level = " at ".join(
        x for x in (f"{u:.0f} % util" if u is not None else "", f"{p:.0f} W" if p is not None else "") if x
    )
    head = f"last {rounded_duration(0.10 * span)}: {level}"
    if p is not None and u is not None and u >= b.busy_util_pct and p <= b.busy_wait_w[1] * 1.15:
        verdict = f"{b.gpu_model} busy-wait power, spinning, not computing"
    elif p is not None and p >= b.train_w[0] * 0.9:
        verdict = f"{b.gpu_model} training power"
    elif p is not None and p <= b.idle_max_w:
        verdict = "idle power"
    else:
        verdict = "between the power bands"
    silent = [
        hs.host
        for hs in strip.power
        if not any(math.isfinite(v) for t, v in zip(hs.times, hs.mean, strict=False) if t >= tail)
    ]
    note = ""
    if silent and len(silent) < len(strip.power):
        names = ", ".join(silent[:3]) + (" …" if len(silent) > 3 else "")
        note = f" · {len(silent)} silent: {names}"
    return f"{head} — {verdict}{note}"


# --- host strip (the slow host of a TGS slide) -------------------------------------------------------


def _host_panel(ax: Axes, panel: StripPanel, strip: HostStrip) -> list[Line2D | Patch]:
    """One metric: the peers' median and band, each named host in its colour; returns the legend
    entries (the first panel's are the figure's legend)."""
    legend: list[Line2D | Patch] = []
    grid = _grid(panel.series)
    if grid.size == 0 or not any(_finite(hs.mean) for hs in panel.series):
        ax.text(0.5, 0.5, f"no {panel.label} samples", transform=ax.transAxes, ha="center", va="center")
        return legend
    peers = [hs for hs in panel.series if hs.host not in strip.named]
    if peers:
        med, lo, hi = _typical_band(peers, grid)
        x = (grid - strip.end) / 60.0
        ax.fill_between(x, lo, hi, color=C_TYPICAL, alpha=0.22, linewidth=0, zorder=2)
        ax.plot(x, med, color=C_TYPICAL, linewidth=2.2, zorder=4)
        n = len(peers)
        who = "the other host" if n == 1 and strip.named else f"{n} host{'s' if n != 1 else ''}"
        legend.append(Line2D([], [], color=C_TYPICAL, linewidth=2.2, label=f"{who}: median"))
        legend.append(Patch(color=C_TYPICAL, alpha=0.3, label="their min–max"))
    for host, color in zip(strip.named, HOST_COLORS, strict=False):
        for hs in panel.series:
            if hs.host == host:
                ax.plot(
                    (_arr(hs.times) - strip.end) / 60.0, _arr(hs.mean), color=color, linewidth=2.6, zorder=5
                )
        legend.append(Line2D([], [], color=color, linewidth=2.6, label=f"{host} (stands out)"))
    ax.set_ylabel(f"{panel.label} ({panel.unit})", fontsize=F_LABEL - 2)
    ax.set_ylim(*_robust_limits([v for hs in panel.series for v in (*hs.mean, *hs.high)]))
    return legend


def host_strip_figure(strip: HostStrip) -> Figure:
    """The slow-host strip as a Figure (tests inspect its artists; `render_host_strip` encodes it)."""
    fig = _new_figure()
    header_px = _header(fig, strip.title, strip.subtitle)
    if not strip.panels:
        _placeholder(fig, "no per-host samples in this window")
        return fig
    n = len(strip.panels)
    gs = fig.add_gridspec(n, 1, hspace=0.12, left=0.10, right=0.97, top=0.80, bottom=0.08)
    axes: list[Axes] = []
    for i in range(n):
        ax = fig.add_subplot(gs[i], sharex=axes[0] if axes else None)
        _style(ax)
        axes.append(ax)
    legend: list[Line2D | Patch] = []
    for ax, panel in zip(axes, strip.panels, strict=True):
        entries = _host_panel(ax, panel, strip)
        legend = legend or entries
        if ax is not axes[-1]:
            ax.tick_params(labelbottom=False)
    _strip_time_axis(axes[-1], strip.start, strip.end, min_minutes=0.1)
    if strip.notes:
        axes[-1].text(
            0.005,
            0.97,
            "\n".join(_cut(note, 110) for note in strip.notes[:4]),
            transform=axes[-1].transAxes,
            ha="left",
            va="top",
            fontsize=F_NOTE - 3,
            color="#555555",
        )
    _legend_and_top(fig, gs, legend, header_px, 0.10)
    return fig


def render_host_strip(strip: HostStrip) -> bytes:
    return _png(host_strip_figure(strip))


def render(spec: StepChart | PowerStrip | HostStrip) -> bytes:
    """PNG bytes of any picture (what the worker process runs)."""
    if isinstance(spec, StepChart):
        return render_step_chart(spec)
    if isinstance(spec, PowerStrip):
        return render_power_strip(spec)
    if isinstance(spec, HostStrip):
        return render_host_strip(spec)
    raise TypeError(f"cannot render {type(spec).__name__}")
