"""The benchmark log generator streams the requested size and reports the true last step."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from jobdiagd_sim.biglog import write_biglog


def test_biglog_size_and_last_step(tmp_path: Path) -> None:
    out = tmp_path / "big.log"
    res = write_biglog(out, 3_000_000, nodes=24)
    size = out.stat().st_size
    assert size == res.size
    assert 3_000_000 <= size < 3_000_000 * 1.1
    data = out.read_bytes()
    steps = [
        int(x)
        for x in re.findall(
            rb"^ 0: I\d{4} \S+ \d+ metric_logger\.py:232\] completed step: (\d+),", data, re.M
        )
    ]
    assert steps == list(range(res.last_step + 1))
    per_node = re.findall(
        rb"^(\s?\d+): \S+ \S+ \d+ metric_logger\.py:232\] completed step: "
        + str(res.last_step).encode()
        + rb",",
        data,
        re.M,
    )
    assert sorted(int(x) for x in per_node) == list(range(24))
    m = re.search(rb'PASSTHROUGH_ARGS="steps=(\d+)"', data[:2000])
    assert m and int(m.group(1)) == res.last_step + 1
    assert data.rstrip().endswith(b"  Status: SUCCESS (exit 0)\n" + b"=" * 65)
    assert b"23: " in data and b"\n 0: " in data


def test_biglog_cli_prints_expected_last_step(tmp_path: Path) -> None:
    out = tmp_path / "b.log"
    proc = subprocess.run(
        [sys.executable, "-m", "jobdiagd_sim.biglog", str(out), "--size-mb", "1", "--nodes", "8"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert '"last_step": ' in proc.stdout
    last = int(re.search(r'"last_step": (\d+)', proc.stdout).group(1))  # type: ignore[union-attr]
    assert f"completed step: {last},".encode() in out.read_bytes()
    assert f"completed step: {last + 1},".encode() not in out.read_bytes()
    assert out.stat().st_size >= 1 << 20
