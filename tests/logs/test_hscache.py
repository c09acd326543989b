"""Compiled hyperscan databases cached on disk: reused, never trusted blindly."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import hyperscan
import pytest

from jobdiagd.logs import hscache
from jobdiagd.logs.scan import HyperscanScanner, PythonScanner, candidates

PATTERNS = [b"NCCL WARN", b"completed step", rb"\n 0: [^\n]{0,40}x"]


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """The cache in a fresh directory; the list grows by one per real compilation."""
    monkeypatch.setenv("JOBDIAGD_CACHE_DIR", str(tmp_path / "cache"))
    made: list[int] = []
    real = hscache._compile

    def counting(*args: Any) -> Any:
        made.append(1)
        return real(*args)

    monkeypatch.setattr(hscache, "_compile", counting)
    return made


def _hits(db: Any, data: bytes) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    db.scan(
        data, match_event_handler=lambda i, f, t, fl, c: out.append((i, t)), scratch=hyperscan.Scratch(db)
    )
    return out


def test_second_use_loads_instead_of_compiling(compiles: list[int]) -> None:
    data = b"a\n 0: yyx NCCL WARN completed step\n"
    first = hscache.block_database(hyperscan, PATTERNS)
    second = hscache.block_database(hyperscan, PATTERNS)
    assert len(compiles) == 1
    assert _hits(second, data) == _hits(first, data) != []
    files = list(Path(os.environ["JOBDIAGD_CACHE_DIR"]).iterdir())
    assert len(files) == 1 and (files[0].stat().st_mode & 0o777) == 0o600
    assert (files[0].parent.stat().st_mode & 0o777) == 0o700
    hscache.block_database(hyperscan, [*PATTERNS, b"other"])  # other patterns: another file
    assert len(compiles) == 2


def test_corrupt_or_foreign_files_are_compiled_again(compiles: list[int]) -> None:
    hscache.block_database(hyperscan, PATTERNS)
    (path,) = Path(os.environ["JOBDIAGD_CACHE_DIR"]).iterdir()
    path.write_bytes(b"garbage" * 100)
    db = hscache.block_database(hyperscan, PATTERNS)
    assert len(compiles) == 2 and _hits(db, b"NCCL WARN") == [(0, 9)]
    good = path.read_bytes()
    assert good != b"garbage" * 100  # replaced by a good one
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)  # planted by another user: never loaded
        hscache.block_database(hyperscan, PATTERNS)
        assert len(compiles) == 3
        path.unlink()
    path.write_bytes(good)
    path.chmod(0o666)  # writable by others: never loaded
    hscache.block_database(hyperscan, PATTERNS)
    assert len(compiles) == 4


def test_no_cache_dir_means_compiling(
    compiles: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ("JOBDIAGD_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(var, raising=False)
    hscache.block_database(hyperscan, PATTERNS)
    hscache.block_database(hyperscan, PATTERNS)
    assert len(compiles) == 2
    unwritable = tmp_path / "ro"
    unwritable.mkdir(mode=0o500)
    monkeypatch.setenv("JOBDIAGD_CACHE_DIR", str(unwritable / "x"))
    if os.geteuid() != 0:  # root writes anyway
        hscache.block_database(hyperscan, PATTERNS)
        assert len(compiles) == 3


def test_scanner_from_the_cache_finds_the_same_lines(compiles: list[int]) -> None:
    buf = b"x\n 0: completed step: 1\n 3: completed step: 1\nNCCL WARN y\nJOB SUMMARY\n"
    want = candidates(PythonScanner(), buf, (b" 0: ",))
    assert candidates(HyperscanScanner(), buf, (b" 0: ",)) == want
    assert candidates(HyperscanScanner(), buf, (b" 0: ",)) == want  # loaded this time
    assert len(compiles) == 1
