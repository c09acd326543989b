"""Outputs-root discovery: which entries of a root are jobs, in name order, each found once."""

from __future__ import annotations

import time
from pathlib import Path

from jobdiagd.service.discovery import OutputsDiscovery


def job_dir(root: Path, name: str, *, linked: bool = True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    log = root / f"{name}.log"
    log.write_text("JOB_ID=1\n")
    if linked:
        (d / "log").symlink_to(f"../{log.name}")
    return d


async def test_only_linked_job_dirs_are_found_in_name_order_and_once(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "outputs", tmp_path / "elsewhere"
    job_dir(root, "9402-JAX-b")
    job_dir(root, "9401-JAX-a")
    job_dir(root, ".9403-JAX-hidden")
    pending = job_dir(root, "9404-JAX-not-linked-yet", linked=False)
    job_dir(elsewhere, "9405-JAX-through-a-link")
    (root / "9405-JAX-through-a-link").symlink_to(elsewhere / "9405-JAX-through-a-link")
    (root / "9406-JAX-a-file").write_text("not a dir\n")
    disc = OutputsDiscovery([root])
    now = time.time()
    first = await disc.poll(now, set())
    assert [n.key for n in first.new] == ["9401", "9402", "9405"]
    assert [n.ref.log for n in first.new] == [
        root / "9401-JAX-a" / "log",
        root / "9402-JAX-b" / "log",
        root / "9405-JAX-through-a-link" / "log",
    ]
    (pending / "log").symlink_to("../9404-JAX-not-linked-yet.log")
    second = await disc.poll(now + 15, {"9401", "9402", "9405"})
    assert [n.key for n in second.new] == ["9404"]  # linked since: found now, the others not again
