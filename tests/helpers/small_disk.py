"""A real small filesystem for disk-full tests: a tmpfs mounted on a test folder, filled by a ballast file.

Mounting needs root (the CI machine and the test machines run the suite as root); without it
the fixture fails with that reason rather than skipping the test.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
    """Mount a tmpfs of `size` on `path` (created 0700: the daemon wants its state dir private)."""
    path.mkdir(mode=0o700, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"disk-full tests need root to mount a tmpfs: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> Path:
    """Write a ballast file until the filesystem refuses another byte; delete it to free the space."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for block in (b"\0" * 65536, b"\0" * 4096, b"\0"):
            try:
                while True:
                    os.write(fd, block)
            except OSError as exc:
                if exc.errno != 28:  # ENOSPC
                    raise
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0
    return ballast
