"""The README's example pages are what the daemon renders today (scripts/render_examples.py writes them).

The hang and TGS pages come from the real engine, detectors and chat rendering over simulated
jobs, the hang's GPU verdict through a real Prometheus on the job's promtool-built TSDB: a change
to a detector's wording, the page layout or the buttons fails here until the README is rendered
again (`.venv/bin/python scripts/render_examples.py`) and the new text reviewed."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobdiagd_sim.alert_examples import examples, with_pages

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = pytest.mark.prometheus


async def test_the_readme_shows_the_pages_the_daemon_renders() -> None:
    pages = await examples()
    assert {p.name for p in pages} == {"hang", "tgs"}
    hang = next(p for p in pages if p.name == "hang")
    # The example is the case it is said to be: a GPU-confirmed hang naming the dead host.
    assert "GPU-confirmed" in hang.text and "Suspect host: node005" in hang.text
    assert [name for name, _ in hang.pictures] == ["hang-alert.png", "ray-power-strip.png"]
    current = README.read_text(encoding="utf-8")
    assert with_pages(current, pages) == current, (
        "README.md's example pages are out of date: run .venv/bin/python scripts/render_examples.py"
    )
