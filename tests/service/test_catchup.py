"""The order in which existing logs are caught up with: the jobs closest to a page first."""

from __future__ import annotations

from jobdiagd.service.catchup import Pending, catch_up_order

T0 = 1_780_000_000.0


def test_unstattable_first_then_quiet_longest_then_smaller() -> None:
    pending = [
        Pending("fresh-big", T0 - 5, 50 << 20),
        Pending("fresh-small", T0 - 5, 4096),
        Pending("quiet-hour", T0 - 3600, 10 << 20),
        Pending("missing", None, 0),
        Pending("quiet-minute", T0 - 60, 1 << 20),
    ]
    assert catch_up_order(pending) == ["missing", "quiet-hour", "quiet-minute", "fresh-small", "fresh-big"]


def test_a_restored_hang_clock_outranks_a_recent_write() -> None:
    # A job whose last step was read an hour before a restart (the saved arrival) is closer to a
    # hang page than one written a minute ago, whatever the size of its log.
    pending = [Pending("recent", T0 - 60, 1000), Pending("restored", T0 - 3600, 1 << 30)]
    assert catch_up_order(pending) == ["restored", "recent"]


def test_equal_ranks_are_ordered_by_key_so_the_order_is_stable() -> None:
    pending = [Pending(k, T0, 10) for k in ("9003", "9001", "9002")]
    assert catch_up_order(pending) == ["9001", "9002", "9003"]
