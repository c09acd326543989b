"""The goodput ledger for people: grouped rows, the table (fits 100 columns), the JSON document and the
picture's data, pure.

Groups (`--by`): the week a run ended (ISO week, UTC), its user, partition, failure class (the
primary failure, else the status: `completed`, `running`), or node. A run counts whole in its
week; by node, each of its nodes gets that node's share (GPU-hours × 1/nodes), so the nodes'
rows add up to the total like every other grouping.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobdiagd.goodput.ledger import BUCKETS, LOST, Chain, Ledger, Run, chain_dict, total

GROUPINGS = ("week", "user", "partition", "class", "node")
TABLE_WIDTH = 100
_HEADS = {
    "productive": "prod",
    "queue": "queue",
    "startup": "start",
    "checkpoint": "ckpt",
    "stall_to_detection": "stall",
    "detection_to_kill": "kill",
    "redone": "redo",
    "rest": "rest",
}
LEGEND = (
    "GPU-hours. alloc: allocated (all but queue); good%: productive / alloc; start: start-up and "
    "compile; ckpt: saves; stall: last step -> page; kill: page -> end; redo: progress redone "
    "after restarts; rest: evals, teardown, unattributed; queue: submit -> start (not in alloc)."
)


def run_class(run: Run) -> str:
    f = run.facts
    if f.hang:
        return "hang"
    return f.primary or f.status


def week_of(t: float) -> str:
    y, w, _ = _dt.datetime.fromtimestamp(t, _dt.UTC).isocalendar()
    return f"{y}-W{w:02d}"


def _keys(run: Run, by: str) -> list[tuple[str, float]]:
    if by == "week":
        return [(week_of(run.end), 1.0)]
    if by == "user":
        return [(run.user, 1.0)]
    if by == "partition":
        return [(run.partition, 1.0)]
    if by == "class":
        return [(run_class(run), 1.0)]
    nodes = run.nodes or ("?",)
    return [(n, 1.0 / len(nodes)) for n in nodes]


@dataclass
class Row:
    key: str
    runs: int = 0
    ledger: Ledger = field(default_factory=Ledger)


def _scaled(led: Ledger, w: float) -> Ledger:
    out = Ledger()
    for b in BUCKETS:
        out.seconds[b] = led.seconds[b] * w
        out.gpu_seconds[b] = led.gpu_seconds[b] * w
    return out


def group(chains: Iterable[Chain], by: str) -> list[Row]:
    """Rows of the ledger per group, sorted by key (weeks in time order)."""
    if by not in GROUPINGS:
        raise ValueError(f"--by must be one of {', '.join(GROUPINGS)}, got {by!r}")
    rows: dict[str, Row] = {}
    for ch in chains:
        for run, led in zip(ch.runs, ch.ledgers, strict=True):
            for key, w in _keys(run, by):
                row = rows.setdefault(key, Row(key))
                row.runs += 1
                row.ledger.add(_scaled(led, w) if w != 1.0 else led)
    return [rows[k] for k in sorted(rows)]


def lost_by_class(chains: Iterable[Chain]) -> list[tuple[str, float]]:
    """Lost GPU-hours (every bucket but productive and queue) per failure class, largest first."""
    out: dict[str, float] = {}
    for ch in chains:
        for run, led in zip(ch.runs, ch.ledgers, strict=True):
            lost = sum(led.gpu_seconds[b] for b in LOST) / 3600.0
            if lost > 0:
                out[run_class(run)] = out.get(run_class(run), 0.0) + lost
    return sorted(out.items(), key=lambda kv: (-kv[1], kv[0]))


def fmt_hours(v: float) -> str:
    """GPU-hours in at most 6 characters."""
    if v >= 999_950:
        return f"{v / 1e6:.1f}M"
    if v >= 99_950:
        return f"{v / 1000:.0f}k"
    if v >= 9_999.5:
        return f"{v / 1000:.1f}k"
    if v >= 99.95:
        return f"{v:.0f}"
    return f"{v:.1f}"


def _line(key: str, runs: str, alloc: str, good: str, cells: Sequence[str]) -> str:
    key = key if len(key) <= 16 else key[:15] + "…"
    return f"{key:<16} {runs:>5} {alloc:>7} {good:>6}" + "".join(f" {c:>6}" for c in cells)


def render_table(rows: Sequence[Row], by: str) -> str:
    heads = [_HEADS[b] for b in BUCKETS]
    label = "week (UTC)" if by == "week" else by
    out = [_line(label, "runs", "alloc", "good%", heads), "-" * len(_line("", "", "", "", heads))]
    for row in [*rows, Row("total", sum(r.runs for r in rows), total(r.ledger for r in rows))]:
        led = row.ledger
        good = f"{led.goodput * 100:.1f}%" if led.goodput is not None else "-"
        cells = [fmt_hours(led.gpu_hours(b)) for b in BUCKETS]
        if row.key == "total":
            out.append("-" * len(out[1]))
        out.append(_line(row.key, str(row.runs), fmt_hours(led.allocated_gpu_s / 3600.0), good, cells))
    return "\n".join(out)


@dataclass(frozen=True, slots=True)
class GoodputChart:
    """The picture's data: GPU-hours per bucket for each group (stacked bars) and the lost
    GPU-hours per failure class (horizontal bars)."""

    title: str
    subtitle: str
    by: str
    groups: tuple[str, ...]
    buckets: tuple[str, ...]
    hours: tuple[tuple[float, ...], ...]  # hours[g][b]
    lost_by_class: tuple[tuple[str, float], ...]


def chart(rows: Sequence[Row], chains: Sequence[Chain], by: str, title: str, subtitle: str) -> GoodputChart:
    shown = [b for b in BUCKETS if b != "queue"]  # the bars show the allocation: what was paid for
    return GoodputChart(
        title=title,
        subtitle=subtitle,
        by=by,
        groups=tuple(r.key for r in rows),
        buckets=tuple(shown),
        hours=tuple(tuple(r.ledger.gpu_hours(b) for b in shown) for r in rows),
        lost_by_class=tuple(lost_by_class(chains)),
    )


def document(
    chains: Sequence[Chain], rows: Sequence[Row], by: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON document of `jobdiagd goodput --json`."""
    tot = total(r.ledger for r in rows)
    return {
        "by": by,
        "buckets": list(BUCKETS),
        "total": tot.to_dict(),
        "groups": [{"key": r.key, "runs": r.runs, "ledger": r.ledger.to_dict()} for r in rows],
        "lost_by_class": [{"class": c, "gpu_hours": round(h, 4)} for c, h in lost_by_class(chains)],
        "chains": [chain_dict(ch) for ch in chains],
        **(extra or {}),
    }
