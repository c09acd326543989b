"""The line finder of `logs.scan` (hyperscan through `logs.hscache`, or `re`) against a plain regex per line."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobdiagd.logs.scan import LineFinder, hs_line_starts

# A printed timestamp's shapes (what the backtest's file clock looks for) and a literal.
PATTERNS = (rb"[IWEF]\d{4} \d\d:\d\d:\d\d", rb"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d", rb"completed step: ")
PLAIN = re.compile(b"|".join(PATTERNS))

_HS, _RE = LineFinder(PATTERNS), LineFinder(PATTERNS, allow_hyperscan=False)

_piece = st.one_of(
    st.sampled_from(
        [
            "I0612 10:15:22",
            "W1231 23:59:59.123456",
            "2026-06-12 10:15:22",
            "2026-06-12T10:15:22",
            "completed step: 7",
            "I0612 10:15",  # cut short: no match
            "2026-06-12  10:15:22",  # two spaces: no match
            " 0: ",
            "\r",
            "\x1b[0m",
        ]
    ),
    st.text(alphabet="IWEF0123456789 :-T\r", max_size=20),
    st.text(max_size=20),
)
_line = st.lists(_piece, max_size=5).map(lambda ps: "".join(ps).replace("\n", " ").encode("utf-8", "replace"))


def _expected(lines: list[bytes], base: int) -> list[int]:
    """Starts of the lines a plain regex finds in, one line at a time, as offsets from `base`."""
    out, pos = [], base
    for line in lines:
        if PLAIN.search(line):
            out.append(pos)
        pos += len(line) + 1
    return out


def test_hyperscan_is_there() -> None:
    assert _HS.name == "hyperscan" and _RE.name == "re"


@pytest.mark.parametrize("finder", [_HS, _RE], ids=["hyperscan", "re"])
@settings(max_examples=300, deadline=None)
@given(
    before=st.lists(_line, max_size=3),
    lines=st.lists(_line, max_size=30),
    after=st.lists(_line, max_size=3),
    newline_at_end=st.booleans(),
)
def test_the_finder_agrees_with_a_plain_regex_per_line(
    finder: LineFinder, before: list[bytes], lines: list[bytes], after: list[bytes], newline_at_end: bool
) -> None:
    """A region inside a bigger buffer: lines before it and after its end are never reported."""
    head = b"".join(line + b"\n" for line in before)
    region = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    buf = bytearray(b"\n" + head + region + b"\n" + b"\n".join(after))
    start = len(head)  # buf[start] is the newline before the region
    end = start + 1 + len(region)
    assert buf[start] == ord("\n")
    assert finder.line_starts(buf, start, end) == _expected(lines, start + 1)


def test_a_match_that_closes_its_line_names_that_line() -> None:
    """Hyperscan's `to` is one past a match: a match ending with the newline that closes its line
    (as a `not_followed_by` pattern can) is found from its last byte, `to - 1`, not from `to`,
    which is already in the next line."""
    import hyperscan

    from jobdiagd.logs.hscache import block_database

    db = block_database(hyperscan, [rb"end\n"])
    buf = b"\nx end\nno match\ny end\nlast end"
    found = hs_line_starts(db, hyperscan.Scratch(db), buf, 0, len(buf))
    assert [buf[p:].split(b"\n", 1)[0] for p in found] == [b"x end", b"y end"]
