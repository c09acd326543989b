"""The weekly goodput digest's content, pure: its Markdown and its picture's data, from the ledgers.

Delivery (to a chosen chat or channel, off by default) belongs to the daemon; this is what it
sends. The week is the 7 days before `now`: runs that ended in it (live runs: so far). The
digest says the goodput, the top causes of lost GPU-hours, the suspect nodes (named by the
evidence of interruptions: rule GP-8), the slowest detections, and the checkpoint advice.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass

from jobdiagd.durations import rounded_duration
from jobdiagd.goodput.advice import Advice
from jobdiagd.goodput.facts import is_interruption
from jobdiagd.goodput.ledger import LOST, Chain, total
from jobdiagd.goodput.report import GoodputChart, chart, group, lost_by_class

WEEK_S = 7 * 86400.0
TOP = 5


@dataclass(frozen=True, slots=True)
class Digest:
    title: str
    markdown: str
    chart: GoodputChart


def _in_week(chains: Sequence[Chain], now: float) -> list[Chain]:
    """The chains cut to their runs that ended within the week (their ledgers kept)."""
    out: list[Chain] = []
    for ch in chains:
        keep = [i for i, r in enumerate(ch.runs) if now - WEEK_S <= r.end <= now]
        if keep:
            out.append(
                Chain(
                    runs=[ch.runs[i] for i in keep],
                    links=[],
                    ledgers=[ch.ledgers[i] for i in keep],
                )
            )
    return out


def suspect_nodes(chains: Sequence[Chain]) -> list[tuple[str, int, float]]:
    """(host, interruptions naming it, lost GPU-hours of those runs), most named first."""
    named: dict[str, tuple[int, float]] = {}
    for ch in chains:
        for run, led in zip(ch.runs, ch.ledgers, strict=True):
            if not is_interruption(run.facts):
                continue
            lost = sum(led.gpu_seconds[b] for b in LOST) / 3600.0
            for h in run.facts.blamed_hosts:
                n, hrs = named.get(h, (0, 0.0))
                named[h] = (n + 1, hrs + lost)
    return sorted(((h, n, hrs) for h, (n, hrs) in named.items()), key=lambda x: (-x[1], -x[2], x[0]))


def slowest_detections(chains: Sequence[Chain]) -> list[tuple[str, float, str]]:
    """(job, last step -> page seconds, who paged) of the hangs, slowest first."""
    out: list[tuple[str, float, str]] = []
    for ch in chains:
        for run in ch.runs:
            f = run.facts
            if not f.hang or run.detected_at is None:
                continue
            origin = f.last_step_at if f.last_step_at is not None else (f.stall_origin or run.start)
            out.append((f.job_id or f.key, run.detected_at - origin, run.detected_by or "?"))
    return sorted(out, key=lambda x: -x[1])


def weekly_digest(chains: Sequence[Chain], *, now: float, advice: Sequence[Advice] = ()) -> Digest:
    week = _in_week(chains, now)
    day = _dt.datetime.fromtimestamp(now, _dt.UTC).strftime("%Y-%m-%d")
    led = total(led for ch in week for led in ch.ledgers)
    good = f"{led.goodput * 100:.1f} %" if led.goodput is not None else "n/a"
    alloc = led.allocated_gpu_s / 3600.0
    title = f"Goodput, week to {day}: {good} of {alloc:,.0f} GPU-hours"
    lines = [f"**{title}**", ""]
    lines += ["**Where the lost GPU-hours went**"]
    causes = lost_by_class(week)[:TOP]
    lines += [f"- {c}: {h:,.1f} GPU-h" for c, h in causes] or ["- nothing lost"]
    lines += ["", "**Suspect nodes** (named by interruptions' evidence)"]
    nodes = suspect_nodes(week)[:TOP]
    lines += [f"- {h}: {n} interruption(s), {hrs:,.1f} GPU-h lost" for h, n, hrs in nodes] or ["- none"]
    lines += ["", "**Slowest hang detections** (last step -> page)"]
    slow = slowest_detections(week)[:TOP]
    lines += [f"- job {j}: {rounded_duration(s)} ({by})" for j, s, by in slow] or ["- no hang"]
    if advice:
        lines += ["", "**Checkpoint interval**"]
        lines += [f"- {a.config}: {a.sentence()}" for a in advice[:TOP]]
    rows = group(week, "user")
    spec = chart(rows, week, "user", title, "GPU-hours per user by bucket; lost GPU-hours by class")
    return Digest(title=title, markdown="\n".join(lines) + "\n", chart=spec)
