#!/usr/bin/env python3
"""Regenerate the README's example pages: their pictures in docs/img/ and their text in README.md.

    .venv/bin/python scripts/render_examples.py [--out docs/img] [--only goodput] [--check]

The hang page and the TGS page come from the daemon's own engine, detectors and chat rendering
over two simulated jobs (`jobdiagd_sim.alert_examples`): a RAY=1 job on 8 nodes x 8 MI300X
whose collective hangs after step 737 while node005's process dies (paged GPU-confirmed; its
pictures are the page's step chart and the power strip read from a real Prometheus serving the
job's promtool-built TSDB), and the simulator's I/O-contention job (steps 20 % slower in the
last 40 % of the run). Each page's text, as a phone shows it, replaces the block between its
`<!-- page:NAME -->` markers in README.md; `--check` only says whether the README is current
(exit 1 if not). The goodput picture is `jobdiagd goodput` of the simulated archive
(`jobdiagd_sim.archive`, 30 chains, seed 0) without Slurm, on a fixed clock.
Needs prometheus and promtool (scripts/setup.sh installs them). Prints time and size per picture.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "daemon"), str(ROOT / "sim")]

from jobdiagd.logsetup import configure_logging  # noqa: E402
from jobdiagd_sim.alert_examples import examples, with_pages  # noqa: E402

README = ROOT / "README.md"


def goodput_png(out: Path) -> None:
    from jobdiagd.cli import main as cli
    from jobdiagd_sim.archive import build_archive

    with tempfile.TemporaryDirectory(prefix="jobdiagd-examples-") as tmp:
        root = Path(tmp) / "outputs"
        build_archive(root, chains=30, seed=0)
        t0 = time.perf_counter()
        argv = [
            "goodput",
            str(root),
            "--no-slurm",
            "--no-cache",
            "--now",
            "2026-09-01T00:00:00",
            "--png",
            str(out),
        ]
        with contextlib.redirect_stdout(io.StringIO()):
            rc = cli(argv)
        assert rc == 0, rc
    dt = time.perf_counter() - t0
    print(
        f"{out.name:<22} {dt * 1000:6.0f} ms  {out.stat().st_size / 1024:6.1f} KiB  -> {out} (whole command)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    p.add_argument(
        "--only", choices=("goodput",), default=None, help="render only this picture (no Prometheus)"
    )
    p.add_argument("--check", action="store_true", help="only check that README.md shows the pages as rendered")
    a = p.parse_args(argv)
    out: Path = a.out.resolve()
    if a.only == "goodput":
        out.mkdir(parents=True, exist_ok=True)
        goodput_png(out / "goodput.png")
        return 0
    configure_logging("warning")
    t0 = time.perf_counter()
    pages = asyncio.run(examples())
    print(f"pages: {time.perf_counter() - t0:.1f} s")
    current = README.read_text(encoding="utf-8")
    updated = with_pages(current, pages)
    if a.check:
        print("README.md pages: " + ("current" if updated == current else "out of date"))
        return 0 if updated == current else 1
    out.mkdir(parents=True, exist_ok=True)
    goodput_png(out / "goodput.png")
    for ex in pages:
        for name, png in ex.pictures:
            (out / name).write_bytes(png)
            print(f"{name:<22} {len(png) / 1024:6.1f} KiB  -> {out / name}")
    README.write_text(updated, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
