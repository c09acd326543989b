"""Alert pictures from literal data: PNG size and budget, what each picture marks, many hosts, empty data."""

from __future__ import annotations

import io
import math
import random

import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from PIL import Image

from jobdiagd.chat.plots import (
    HEIGHT_PX,
    MAX_MARK_LINES,
    MAX_POINTS,
    WIDTH_PX,
    HostSeries,
    HostStrip,
    IncidentMarks,
    PowerBands,
    PowerStrip,
    StepChart,
    StepPoint,
    StripPanel,
    describe_strip,
    downsample,
    host_strip_figure,
    odd_groups,
    render,
    split_hosts,
    step_figure,
    strip_figure,
)

BUDGET = 200 * 1024
BANDS = PowerBands("MI300X", 100.0, (250.0, 350.0), (600.0, 750.0))
END = 1_780_280_000.0
START = END - 3600.0
NAN = float("nan")


def steady(n: int, *, first: int = 0, seed: int = 1, ckpt: int = 100) -> tuple[StepPoint, ...]:
    rng = random.Random(seed)
    out = []
    for k in range(first, first + n):
        secs = 6.0 * (1 + rng.uniform(-0.01, 0.01)) + (20.0 if k and k % ckpt == 0 else 0.0)
        secs += 30.0 if k == first else 0.0  # the first step compiles
        out.append(StepPoint(k, secs, 8671.8 * 6.0 / secs))
    return tuple(out)


def decode(png: bytes) -> Image.Image:
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    img = Image.open(io.BytesIO(png))
    img.load()
    return img


def legend_labels(fig: Figure) -> list[str]:
    return [t.get_text() for leg in fig.legends for t in leg.get_texts()]


def texts(fig: Figure) -> str:
    parts = [t.get_text() for t in fig.texts]
    for ax in fig.axes:
        parts += [t.get_text() for t in ax.texts]
    return "\n".join(parts)


def vlines(ax: object) -> list[float]:
    """x of every full-height vertical line (axvline) in an axes."""
    out = []
    for ln in ax.get_lines():  # type: ignore[attr-defined]
        xs = list(ln.get_xdata())
        ys = list(ln.get_ydata())
        if len(xs) == 2 and xs[0] == xs[1] and list(ys) == [0, 1]:
            out.append(float(xs[0]))
    return out


def hang(points: tuple[StepPoint, ...], last: int, projected: int, **kw: object) -> StepChart:
    return StepChart(
        "Hang · job 4242",
        points,
        IncidentMarks("hang", last, projected_step=projected, stalled_s=600.0, step_time_s=6.0),
        **kw,  # type: ignore[arg-type]
    )


# --- PNG -------------------------------------------------------------------------------------------


def test_hang_png_decodes_at_the_chosen_size_under_the_budget_and_is_reproducible() -> None:
    pts = steady(737)
    chart = hang(pts, 736, 836, checkpoints=(100, 200, 300, 400, 500, 600, 700, 800))
    png = render(chart)
    img = decode(png)
    assert img.size == (WIDTH_PX, HEIGHT_PX) == (1280, 960)
    assert len(png) < BUDGET
    assert render(chart) == png  # no time stamps in the file: the docs examples do not churn


def test_every_picture_kind_fits_the_budget() -> None:
    tgs = StepChart(
        "TGS slide · job 1",
        steady(400),
        IncidentMarks("tgs", 240, baseline=8681.0, degraded=7214.0, change_pct=-17.0, baseline_steps=(5, 15)),
    )
    host = [_host(f"node{i:03d}", lambda t: 300.0) for i in range(8)]
    strip = PowerStrip("GPU power · job 1", tuple(host), tuple(host), BANDS, START, END)
    for spec in (tgs, strip):
        png = render(spec)
        assert decode(png).size == (WIDTH_PX, HEIGHT_PX)
        assert len(png) < BUDGET


def test_render_refuses_what_is_not_a_picture() -> None:
    with pytest.raises(TypeError, match="cannot render str"):
        render("a chart")  # type: ignore[arg-type]


# --- step chart ------------------------------------------------------------------------------------


def test_hang_marks_last_step_projection_and_the_stall_between_them() -> None:
    fig = step_figure(hang(steady(737), 736, 836, checkpoints=(500, 600, 700, 800)))
    ax_t, ax_s = fig.axes
    for ax in (ax_t, ax_s):
        xs = vlines(ax)
        assert 736.0 in xs and 836.0 in xs  # the last step and where training should be
        assert {500.0, 600.0, 700.0, 800.0} <= set(xs)  # checkpoints, one in the stall
        spans = [p for p in ax.patches if p.get_x() == 736.0]  # the shaded stall
        assert spans and math.isclose(spans[0].get_width(), 100.0)
    labels = legend_labels(fig)
    assert "last step 736" in labels and "expected ≈ step 836 by now" in labels
    assert any(lbl.startswith("checkpoint") for lbl in labels)
    assert "stalled 10 min" in texts(fig) and "100 steps behind" in texts(fig)
    # The stall takes a fifth of the view or more; earlier steps are said to be left out.
    lo, hi = ax_t.get_xlim()
    assert (836 - 736) / (hi - lo) >= 0.2
    assert lo > 0 and "steps 0–" in texts(fig) and "not shown" in texts(fig)


def test_a_short_history_is_shown_whole() -> None:
    fig = step_figure(hang(steady(40), 39, 60))
    lo, _hi = fig.axes[0].get_xlim()
    assert lo < 0 and "not shown" not in texts(fig)


def test_spikes_do_not_flatten_the_steady_state_and_are_flagged_off_scale() -> None:
    fig = step_figure(hang(steady(50, ckpt=10), 49, 55, checkpoints=(10, 20, 30, 40)))
    ax_t, ax_s = fig.axes
    s_lo, s_hi = ax_s.get_ylim()
    assert s_hi < 10.0 and s_lo > 2.0  # 6 s steps readable despite the 36 s first step
    t_lo, _ = ax_t.get_ylim()
    assert t_lo > 5000  # checkpoint dips to ~2000 tokens/s do not pull the axis down
    notes = texts(fig)
    assert "off scale, up to 36" in notes and "off scale, down to" in notes


def test_tgs_marks_baseline_level_slide_start_and_change() -> None:
    pts = tuple(StepPoint(k, 6.0 if k < 240 else 7.2, 8681.0 if k < 240 else 7234.0) for k in range(400))
    m = IncidentMarks(
        "tgs",
        240,
        baseline=8681.0,
        degraded=7234.0,
        change_pct=-16.7,
        baseline_steps=(5, 15),
        pattern="one-time",
    )
    fig = step_figure(StepChart("TGS", pts, m, checkpoints=(100, 200, 300)))
    ax_t, _ = fig.axes
    horizontal = {round(float(ln.get_ydata()[0])) for ln in ax_t.get_lines() if len(set(ln.get_ydata())) == 1}
    assert {8681, 7234} <= horizontal
    assert 240.0 in vlines(ax_t)
    labels = legend_labels(fig)
    assert "baseline 8,681" in labels and "now 7,234 (−17 %)" in labels
    assert "slide began ≈ step 240" in labels and "baseline window (steps 5–15)" in labels
    assert "−17 %" in texts(fig) and "one-time" in texts(fig)
    lo, hi = ax_t.get_xlim()
    assert lo <= 0 and hi >= 399  # the whole history: the trend is the point


def test_many_marks_become_a_rug_not_a_forest() -> None:
    pts = steady(2000, ckpt=10)
    fig = step_figure(StepChart("x", pts, None, checkpoints=tuple(range(10, 2000, 10)), evals=(500, 1000)))
    ax_t = fig.axes[0]
    rug = [ln for ln in ax_t.get_lines() if list(ln.get_ydata()) == [0.95, 1.0]]
    assert len(rug) == 199
    assert len(vlines(ax_t)) == 2 and MAX_MARK_LINES < 199  # the two evals stay lines


def test_missing_values_and_empty_histories_give_a_placeholder() -> None:
    empty = step_figure(StepChart("Hang · job 1", (), IncidentMarks("hang", None, stalled_s=900.0)))
    assert "no training step" in texts(empty) and "15 min" in texts(empty)
    nan = step_figure(StepChart("x", (StepPoint(1, None, None), StepPoint(2, NAN, NAN)), None))
    assert "no training step" in texts(nan)
    # Gaps in one series do not stop the other from being drawn.
    half = tuple(StepPoint(k, 6.0, None if k % 2 else 8000.0) for k in range(50))
    fig = step_figure(StepChart("x", half, None))
    assert len(fig.axes) == 2
    assert decode(render(StepChart("x", (), None))).size == (WIDTH_PX, HEIGHT_PX)


def test_downsample_bounds_points_and_keeps_spikes_ends_and_marks() -> None:
    rng = random.Random(3)
    pts = [StepPoint(k, 6.0 + rng.uniform(-0.1, 0.1), 8600.0) for k in range(200_000)]
    pts[123_457] = StepPoint(123_457, 95.0, 500.0)  # one lone slow step
    rng.shuffle(pts)
    out = downsample(pts, MAX_POINTS, keep=(77_777,))
    assert len(out) <= MAX_POINTS + 3
    steps = [p.step for p in out]
    assert steps == sorted(steps)
    assert {0, 199_999, 123_457, 77_777} <= set(steps)
    assert downsample(pts[:10]) == tuple(sorted(pts[:10], key=lambda p: p.step))


def test_a_huge_history_is_thinned_inside_the_view_only() -> None:
    pts = tuple(StepPoint(k, 6.0, 8600.0) for k in range(300_000))
    fig = step_figure(hang(pts, 299_999, 300_100))
    (line,) = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata()) > 2]
    xs = list(line.get_xdata())
    # Every step of the view is drawn (the view holds ~250 steps), not a sample of the history.
    assert len(xs) >= 240 and min(xs) >= 299_999 - 260


# --- power strip -----------------------------------------------------------------------------------


def _host(name: str, f: object, *, silent_after: float | None = None, gpus: int = 8) -> HostSeries:
    times = tuple(START + 20.0 * i for i in range(181))
    mean = tuple(NAN if silent_after is not None and t > silent_after else f(t) for t in times)  # type: ignore[operator]
    return HostSeries(name, times, mean, tuple(v - 5 for v in mean), tuple(v + 5 for v in mean), gpus)


STALL = END - 1200.0


def _power(t: float) -> float:
    return 680.0 if t < STALL else 300.0


def test_split_hosts_flags_silent_and_off_level_hosts_only() -> None:
    series = [_host(f"node{i:03d}", _power) for i in range(1, 9)]
    series[2] = _host("node003", _power, silent_after=STALL + 5)
    series[5] = _host("node006", lambda t: 680.0 if t < STALL else 95.0)
    series[6] = _host("node007", lambda t: 680.0 if t < STALL else 320.0)  # within tolerance: agrees
    series.append(HostSeries("node009", (), ()))  # listed in the job, never reported
    g = split_hosts(series, START, END, tolerance=60.0, relative=0.15, unit=" W")
    assert set(g.deviating) == {"node003", "node006", "node009"}
    assert g.deviating["node009"] == "no data"
    assert g.deviating["node003"].startswith("silent since −")
    assert g.deviating["node006"] == "95 W"
    assert len(g.typical) == 6


def test_hosts_at_the_same_wrong_level_are_one_group() -> None:
    series = [_host(f"node{i:03d}", _power) for i in range(1, 17)]
    for i in (9, 10, 11):
        series[i] = _host(f"node{i + 1:03d}", lambda t: 120.0)
    p = split_hosts(series, START, END, tolerance=60.0, relative=0.15, unit=" W")
    u = split_hosts([], START, END, tolerance=25.0)
    assert odd_groups(p, u) == [("120 W", ("node010", "node011", "node012"))]


def test_sixty_four_hosts_stay_a_handful_of_lines_and_the_odd_ones_are_named() -> None:
    power = [_host(f"node{i:03d}", _power) for i in range(1, 65)]
    util = [_host(f"node{i:03d}", lambda t: 100.0) for i in range(1, 65)]
    power[4] = _host("node005", _power, silent_after=STALL + 3)
    util[4] = _host("node005", lambda t: 100.0, silent_after=STALL + 3)
    power[9] = _host("node010", lambda t: 680.0 if t < STALL else 95.0)
    util[9] = _host("node010", lambda t: 100.0 if t < STALL else 0.0)
    strip = PowerStrip(
        "GPU power",
        tuple(power),
        tuple(util),
        BANDS,
        START,
        END,
        since=STALL,
        since_label="last step 736 read",
    )
    fig = strip_figure(strip)
    ax_p, ax_u = fig.axes
    data_lines = [ln for ln in ax_p.get_lines() if len(ln.get_xdata()) > 2]
    assert len(data_lines) == 3  # typical median + two deviating hosts, not 64 (or 512) lines
    labels = legend_labels(fig)
    assert "62 hosts (496 GPUs): median" in labels
    assert "node005: silent since −20 min" in labels
    assert "node010: 95 W · 0 %" in labels
    assert "last step 736 read (−20 min)" in labels
    # The busy-wait band is shaded on the power panel and named on the right edge.
    bands = [
        p for p in ax_p.patches if math.isclose(p.get_y(), 250.0) and math.isclose(p.get_height(), 100.0)
    ]
    assert bands
    assert "busy-wait\n250–350 W" in texts(fig)
    # A silent host ends in a cross where it fell silent.
    crosses = [c for c in ax_p.collections if not isinstance(c, PolyCollection)]
    assert len(crosses) == 1
    assert ax_u.get_ylim() == (-3.0, 108.0)
    assert "spinning, not computing" in texts(fig) and "1 silent: node005" in texts(fig)


def test_describe_strip_names_the_band_the_gpus_are_in() -> None:
    def strip(p: float, u: float) -> PowerStrip:
        return PowerStrip("x", (_host("n1", lambda t: p),), (_host("n1", lambda t: u),), BANDS, START, END)

    assert "busy-wait power, spinning, not computing" in (describe_strip(strip(300.0, 100.0)) or "")
    assert "training power" in (describe_strip(strip(690.0, 100.0)) or "")
    assert "idle power" in (describe_strip(strip(80.0, 0.0)) or "")
    assert describe_strip(PowerStrip("x", (), (), BANDS, START, END)) is None


def test_strip_without_samples_is_a_placeholder_with_the_reason() -> None:
    silent = (HostSeries("node001", (START, END), (NAN, NAN)),)
    fig = strip_figure(
        PowerStrip(
            "GPU power", silent, (), BANDS, START, END, notes=("no ray_node_gpus_utilization samples",)
        )
    )
    assert "no GPU power or utilization samples" in texts(fig)
    assert "no ray_node_gpus_utilization samples" in texts(fig)
    # One panel without data says so; the other is still drawn.
    power = (_host("node001", lambda t: 300.0),)
    fig = strip_figure(PowerStrip("GPU power", power, (), BANDS, START, END))
    assert "no GPU utilization samples in this window" in texts(fig)
    assert decode(render(PowerStrip("x", (), (), BANDS, START, END))).size == (WIDTH_PX, HEIGHT_PX)


def test_pictures_pickle_for_the_worker_process() -> None:
    import pickle

    chart = hang(steady(20), 19, 30)
    assert pickle.loads(pickle.dumps(chart)) == chart
    strip = PowerStrip("x", (_host("n1", lambda t: 1.0),), (), BANDS, START, END)
    assert pickle.loads(pickle.dumps(strip)).power[0].host == "n1"


def test_rendering_loads_no_pyplot_global_state() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from jobdiagd.chat.plots import render, StepChart, StepPoint; "
        "render(StepChart('x', (StepPoint(1, 6.0, 8000.0), StepPoint(2, 6.1, 7990.0)))); "
        "print('matplotlib.pyplot' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"


def test_pale_shadings_survive_the_palette() -> None:
    """The stall and slide shadings are pale: the PNG palette must not merge them into white."""
    chart = hang(steady(737), 736, 836)
    fig = step_figure(chart)
    _, ax_s = fig.axes
    lo, hi = ax_s.get_ylim()
    x, y = ax_s.transData.transform((786.0, lo + 0.05 * (hi - lo)))  # inside the stall, below the data
    img = decode(render(chart)).convert("RGB")
    stall = img.getpixel((round(x), HEIGHT_PX - round(y)))
    background = img.getpixel((5, HEIGHT_PX // 2))
    assert background == (255, 255, 255)
    assert stall != background and stall[0] > stall[1]  # a visible red tint


# --- host strip (a TGS slide's slow host) ------------------------------------------------------------


def _host_strip(named: tuple[str, ...]) -> HostStrip:
    power = tuple(_host(f"r{i:03d}", lambda t: 560.0) for i in range(1, 6))
    rdma = tuple(
        HostSeries(h.host, h.times, tuple(25.0 if h.host == "r003" else 0.05 for _ in h.times)) for h in power
    )
    panels = (StripPanel("GPU power", "W", power), StripPanel("RDMA retransmits", "/s", rdma))
    return HostStrip("Hosts during the slide · job 1", panels, named, START, END, subtitle="r003 stands out")


def test_the_host_strip_draws_the_named_host_apart_from_its_peers() -> None:
    fig = host_strip_figure(_host_strip(("r003",)))
    power, rdma = fig.axes
    assert rdma.get_ylabel() == "RDMA retransmits (/s)" and power.get_ylabel() == "GPU power (W)"
    lines = {round(float(max(line.get_ydata())), 2): line.get_color() for line in rdma.get_lines()}
    assert (
        lines[25.0] == "#d62728" and lines[0.05] == "#1f77b4"
    )  # r003 in red, the four peers' median in blue
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["4 hosts: median", "their min–max", "r003 (stands out)"]
    png = render(_host_strip(()))
    assert decode(png).size == (WIDTH_PX, HEIGHT_PX) and len(png) < BUDGET
    empty = host_strip_figure(HostStrip("t", (), (), START, END))
    assert any("no per-host samples" in t.get_text() for ax in empty.axes for t in ax.texts)
