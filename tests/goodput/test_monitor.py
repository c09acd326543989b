"""The 30-min log-mtime monitor, modelled, and what faster detection saved (rule GP-7)."""

from __future__ import annotations

import pytest

from jobdiagd.goodput.facts import RunFacts
from jobdiagd.goodput.ledger import Run
from jobdiagd.goodput.monitor import monitor_fire_at, saving, summarize

T = 1_000_000.0


def test_chatter_keeps_the_monitor_quiet_until_the_job_ends() -> None:
    writes = [T + 45 * i for i in range(1, 200)]  # a line every 45 s for 2.5 h
    assert monitor_fire_at(writes, after=T, until=T + 9000) is None


def test_the_first_long_silence_fires_it_half_a_poll_after_1800_s() -> None:
    writes = [T + 100, T + 200, T + 5000]
    assert monitor_fire_at(writes, after=T, until=T + 9000) == T + 200 + 1800 + 30


def test_lines_before_the_stall_do_not_count_and_a_silence_past_the_end_never_fires() -> None:
    assert monitor_fire_at([T - 50, T + 10], after=T, until=T + 9000) == T + 10 + 1830
    assert monitor_fire_at([T + 10], after=T, until=T + 1500) is None


def _hang(**kw: object) -> Run:
    f = RunFacts(key="a#0", job_id="1", nnodes=2, gpus_per_node=8, hang=True, last_step_at=T, **kw)  # type: ignore[arg-type]
    return Run(facts=f, submit=None, start=T - 3600, end=T + 7200, detected_at=T + 150)


def test_saved_hours_against_the_monitor_and_the_lower_bound_when_it_never_fires() -> None:
    caught = saving(_hang(monitor_at=T + 1830))
    assert caught is not None and caught.saved_s == pytest.approx(1680) and not caught.lower_bound
    assert caught.saved_gpu_hours == pytest.approx(1680 * 16 / 3600)
    missed = saving(_hang())
    assert missed is not None and missed.lower_bound and missed.saved_s == pytest.approx(7050)
    late_page = Run(
        facts=_hang(monitor_at=T + 100).facts, submit=None, start=T - 10, end=T + 7200, detected_at=T + 150
    )
    assert saving(late_page) is not None and saving(late_page).saved_s == 0  # type: ignore[union-attr]


def test_the_summary_counts_hangs_pages_and_misses() -> None:
    healthy = Run(facts=RunFacts(key="b#0", job_id="2"), submit=None, start=T, end=T + 10)
    unpaged = Run(facts=_hang().facts, submit=None, start=T - 10, end=T + 100)
    d = summarize([_hang(monitor_at=T + 1830), _hang(), healthy, unpaged])
    assert (d.hangs, d.with_page, d.monitor_missed) == (3, 2, 1)
    assert d.latencies_s == (150.0, 150.0) and d.monitor_latencies_s == (1830.0,)
    assert d.saved_is_lower_bound and d.saved_gpu_hours == pytest.approx((1680 + 7050) * 16 / 3600)
