"""The goodput picture: a palette PNG of the right size, the same bytes for the same input."""

from __future__ import annotations

import io

from PIL import Image

from jobdiagd.chat.goodput_plot import MAX_GROUPS, render_goodput
from jobdiagd.chat.plots import HEIGHT_PX, WIDTH_PX
from jobdiagd.goodput.report import GoodputChart

BUCKETS = ("productive", "startup", "checkpoint", "stall_to_detection", "detection_to_kill", "redone", "rest")


def spec(groups: int, by: str = "week") -> GoodputChart:
    return GoodputChart(
        title="Goodput: 3 runs",
        subtitle="GPU-hours per week",
        by=by,
        groups=tuple(f"2026-W{20 + i}" for i in range(groups)),
        buckets=BUCKETS,
        hours=tuple(tuple(float(10 * (i + 1) + j) for j in range(len(BUCKETS))) for i in range(groups)),
        lost_by_class=(("hang", 40.0), ("node-fail", 12.5), ("completed", 3.0)),
    )


def _image(data: bytes) -> Image.Image:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return Image.open(io.BytesIO(data))


def test_a_palette_png_of_the_alert_pictures_size_and_deterministic() -> None:
    a = render_goodput(spec(3))
    img = _image(a)
    assert img.size == (WIDTH_PX, HEIGHT_PX) and img.mode == "P"
    assert render_goodput(spec(3)) == a


def test_many_groups_and_no_data_still_render() -> None:
    assert _image(render_goodput(spec(MAX_GROUPS + 9))).size == (WIDTH_PX, HEIGHT_PX)
    assert _image(render_goodput(spec(MAX_GROUPS + 9, by="user"))).size == (WIDTH_PX, HEIGHT_PX)
    empty = GoodputChart("t", "s", "week", (), BUCKETS, (), ())
    assert _image(render_goodput(empty)).size == (WIDTH_PX, HEIGHT_PX)
