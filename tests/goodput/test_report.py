"""Grouped rows, the 100-column table, the digest's content (goodput.report, goodput.digest)."""

from __future__ import annotations

import dataclasses

import pytest

from jobdiagd.goodput.digest import suspect_nodes, weekly_digest
from jobdiagd.goodput.facts import RunFacts
from jobdiagd.goodput.ledger import BUCKETS, Chain, Run, ledger_chain, total
from jobdiagd.goodput.report import TABLE_WIDTH, chart, fmt_hours, group, lost_by_class, render_table, week_of

T0 = 1_781_251_200.0  # 2026-06-12, ISO week 24
DAY = 86400.0


def _run(i: int, start: float, *, user: str, nodes: tuple[str, ...], **kw: object) -> Run:
    base: dict[str, object] = {
        "key": f"{i}.log#0",
        "job_id": str(i),
        "nnodes": len(nodes),
        "gpus_per_node": 8,
        "first_step": 0,
        "last_step": 99,
        "first_step_at": start + 300,
        "first_step_s": 60.0,
        "last_step_at": start + 300 + 990,
        "step_time_s": 10.0,
        "train_s": 1050.0,
    }
    base.update(kw)
    f = RunFacts(**base)  # type: ignore[arg-type]
    return Run(
        facts=f, submit=start - 100, start=start, end=start + 2000, user=user, partition="gpu", nodes=nodes
    )


def chains() -> list[Chain]:
    runs = [
        _run(1, T0, user="alice", nodes=("n1", "n2"), status="completed"),
        _run(2, T0 + DAY, user="bob", nodes=("n3",), hang=True, primary="hang", blamed_hosts=("n3",)),
        _run(3, T0 + 8 * DAY, user="alice", nodes=("n1", "n4"), primary="node-fail", blamed_hosts=("n4",)),
    ]
    return [ledger_chain(Chain(runs=[r], links=[])) for r in runs]


def test_every_grouping_adds_up_to_the_total() -> None:
    cs = chains()
    everything = total(led for ch in cs for led in ch.ledgers)
    for by in ("week", "user", "partition", "class", "node"):
        rows = group(cs, by)
        summed = total(r.ledger for r in rows)
        for b in BUCKETS:
            assert summed.gpu_seconds[b] == pytest.approx(everything.gpu_seconds[b]), (by, b)
    assert [r.key for r in group(cs, "week")] == ["2026-W24", "2026-W25"]
    assert [(r.key, r.runs) for r in group(cs, "user")] == [("alice", 2), ("bob", 1)]
    assert [r.key for r in group(cs, "class")] == ["completed", "hang", "node-fail"]
    with pytest.raises(ValueError):
        group(cs, "moon")


def test_the_table_fits_100_columns_and_ends_with_the_total() -> None:
    text = render_table(group(chains(), "node"), "node")
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= TABLE_WIDTH
    assert lines[0].split()[:4] == ["node", "runs", "alloc", "good%"] and lines[-1].startswith("total")


def test_hours_fit_six_characters() -> None:
    assert [fmt_hours(v) for v in (0.04, 12.34, 123.4, 12_345.0, 123_456.0, 12_345_678.0)] == [
        "0.0", "12.3", "123", "12.3k", "123k", "12.3M",
    ]  # fmt: skip
    assert all(len(fmt_hours(v)) <= 6 for v in (9.99, 99.96, 9_999.6, 99_960.0, 999_960.0, 9.9e8))


def test_lost_hours_by_class_and_the_picture_data() -> None:
    cs = chains()
    lost = dict(lost_by_class(cs))
    assert set(lost) == {"completed", "hang", "node-fail"}
    assert list(lost) == sorted(lost, key=lambda c: -lost[c])  # largest first
    spec = chart(group(cs, "week"), cs, "week", "t", "s")
    assert "queue" not in spec.buckets and len(spec.hours) == 2 and len(spec.hours[0]) == len(spec.buckets)


def test_the_digest_names_goodput_causes_nodes_and_slow_pages() -> None:
    cs = chains()
    hung = cs[1].runs[0]
    paged = dataclasses.replace(hung, detected_at=T0 + DAY + 1290 + 400, detected_by="replay")
    cs[1] = ledger_chain(Chain(runs=[paged], links=[]))
    d = weekly_digest(cs, now=T0 + 7 * DAY)
    assert d.title.startswith("Goodput, week to 2026-06-19: ") and "GPU-hours" in d.title
    assert "- hang:" in d.markdown and "- n3: 1 interruption(s)" in d.markdown
    assert "- job 2: 7 min (replay)" in d.markdown
    assert "node-fail" not in d.markdown  # run 3 ended after the week
    assert d.chart.by == "user" and d.chart.groups == ("alice", "bob")
    assert [(h, n) for h, n, _ in suspect_nodes(cs)] == [("n4", 1), ("n3", 1)]  # n4 cost 2 nodes
    assert week_of(T0) == "2026-W24"
