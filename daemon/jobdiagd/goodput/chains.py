"""Link a job's restarts into chains, pure (docs/rules.md rule GP-3).

Run R continues an earlier run P when, in this order of precedence:

a. requeue: R is the next run in the same log (Slurm requeued the job, which appended to it);
b. marker: R's Slurm comment carries `jobdiagd:restart-of=<P's job id>` (rule REC-11, what
   jobdiagd's recovery puts on the job it resubmits); P is that job's last run;
c. manual resubmit: R restored from checkpoint step C (its restore line, or a first step C+1)
   that P reached — a save P showed, a multiple of P's checkpoint period, or the step P itself
   restored from — with the same job name and node count, the same user when both are known,
   and R started within `window_s` (default 24 h) after P ended;
d. retry from scratch (decision): R started afresh (step 0, no restore) under the same
   conditions as c — the user known on both sides: without a restore step nothing else ties
   them — after P was interrupted (rule GP-8) before it saved any checkpoint past step 0;
   nothing to restore, so everything P trained is redone. A fresh run after a
   completed run, a user error or a run that had checkpoints is a new training, never linked.

P may have one successor only: the earliest-starting R that claims it (markers before the
heuristic); among several P for one R, the latest-ending wins. A run started before P ended
(by more than `SLACK_S`) never continues it. Two trainings of one job name, node count and
user at the same time can be mixed up by c and d (nothing in the log says which checkpoint
directory was restored): they are told apart by their job names (MaxText's `EXP_TAG`) or by
the restart marker.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from jobdiagd.goodput.facts import is_interruption
from jobdiagd.goodput.ledger import Chain, Run

DEFAULT_WINDOW_S = 24 * 3600.0
SLACK_S = 120.0  # clocks and Slurm's whole seconds: a restart may appear to start a bit early


def _reached(p: Run, step: int) -> bool:
    """Did P make (or restore) a checkpoint at `step`?"""
    f = p.facts
    if f.last_step is None or f.first_step is None:
        return f.restored_from == step
    if step == f.restored_from:
        return True
    if not f.first_step - 1 <= step <= f.last_step:
        return False
    if any(s == step for s, _ in f.tails) or step == f.last_step:
        return True
    return bool(f.checkpoint_period) and step % (f.checkpoint_period or 1) == 0


def _config(r: Run) -> tuple[str, int]:
    return (r.facts.job_name or r.facts.model or "", r.facts.nnodes)


def _same_config(p: Run, r: Run, *, user_known: bool = False) -> bool:
    """Same job name and node count, and the same user (`user_known`: both known and equal;
    else an unknown user matches any)."""
    a, b = p.facts, r.facts
    if (a.job_name or a.model) != (b.job_name or b.model) or a.nnodes != b.nnodes:
        return False
    if user_known:
        return "?" not in (p.user, r.user) and p.user == r.user
    return "?" in (p.user, r.user) or p.user == r.user


def _after(p: Run, r: Run, window_s: float | None) -> bool:
    gap = r.start - p.end
    return gap >= -SLACK_S and (window_s is None or gap <= window_s)


class _Linker:
    """The claims of rule GP-3, rule by rule, over runs in start order: every link points from a
    run to one earlier in that order, so chains never loop."""

    def __init__(self, runs: Sequence[Run], window_s: float) -> None:
        self.order = sorted(runs, key=lambda r: (r.start, r.facts.log or "", r.facts.run_index, r.facts.key))
        self.rank = {r.key: i for i, r in enumerate(self.order)}
        self.window_s = window_s
        self.pred: dict[str, tuple[Run, str]] = {}  # run key -> (predecessor, why)
        self.has_succ: set[str] = set()
        # Candidates by configuration, sorted by end: a run looks only at the runs of its own
        # job name and node count that ended within the window before it (not the whole archive).
        self.by_config: dict[tuple[str, int], tuple[list[float], list[Run]]] = {}
        for r in sorted(self.order, key=lambda r: r.end):
            ends, members = self.by_config.setdefault(_config(r), ([], []))
            ends.append(r.end)
            members.append(r)
        self.by_job: dict[str, list[Run]] = {}
        for r in self.order:
            if r.facts.job_id:
                self.by_job.setdefault(r.facts.job_id, []).append(r)

    def claim(self, r: Run, cands: Sequence[Run], why: str) -> None:
        """R continues the latest-ending candidate, if any."""
        if cands:
            p = max(cands, key=lambda p: (p.end, p.facts.run_index, p.facts.key))
            self.pred[r.key] = (p, why)
            self.has_succ.add(p.key)

    def free_before(self, r: Run) -> list[Run]:
        """Earlier runs of R's configuration nobody continues yet, that ended before R started
        (within the window)."""
        ends, members = self.by_config.get(_config(r), ([], []))
        lo = bisect.bisect_left(ends, r.start - self.window_s)
        hi = bisect.bisect_right(ends, r.start + SLACK_S)
        mine = self.rank[r.key]
        return [
            p
            for p in members[lo:hi]
            if self.rank[p.key] < mine and p.key not in self.has_succ and _after(p, r, self.window_s)
        ]

    def requeues(self) -> None:
        by_log: dict[tuple[str, int], Run] = {(r.facts.log or "", r.facts.run_index): r for r in self.order}
        for r in self.order:
            prev = by_log.get((r.facts.log or "", r.facts.run_index - 1))
            if r.facts.log and prev is not None and self.rank[prev.key] < self.rank[r.key]:
                self.claim(r, [prev], "requeue")

    def markers(self) -> None:
        for r in self.order:
            if r.key in self.pred or r.restart_of is None or r.facts.run_index > 0:
                continue
            olds = [
                p
                for p in self.by_job.get(r.restart_of, [])
                if self.rank[p.key] < self.rank[r.key] and p.key not in self.has_succ and _after(p, r, None)
            ]
            self.claim(r, olds, "marker")

    def restores(self) -> None:
        for r in self.order:
            c = r.facts.restored_from
            if r.key not in self.pred and c is not None:
                self.claim(
                    r, [p for p in self.free_before(r) if _same_config(p, r) and _reached(p, c)], "restore"
                )

    def retries(self) -> None:
        for r in self.order:
            if r.key in self.pred or not r.facts.fresh:
                continue
            cands = [
                p
                for p in self.free_before(r)
                if _same_config(p, r, user_known=True)
                and is_interruption(p.facts)
                and not _saved_past_zero(p)
            ]
            self.claim(r, cands, "retry")


def link(runs: Sequence[Run], *, window_s: float = DEFAULT_WINDOW_S) -> list[Chain]:
    """The chains the runs form, each in run order; chains ordered by their first run's start."""
    linker = _Linker(runs, window_s)
    linker.requeues()  # a.
    linker.markers()  # b.
    linker.restores()  # c.
    linker.retries()  # d.
    return _build(linker.order, linker.pred)


def _saved_past_zero(p: Run) -> bool:
    """Did P save a checkpoint a restart could have restored (any save after step 0)?"""
    f = p.facts
    if any(s > 0 for s, _ in f.tails):
        return True
    period = f.checkpoint_period
    return bool(period) and f.last_step is not None and f.last_step >= (period or 0)


def _build(order: Sequence[Run], pred: dict[str, tuple[Run, str]]) -> list[Chain]:
    succ: dict[str, tuple[Run, str]] = {}
    for r in order:
        if r.key in pred:
            p, why = pred[r.key]
            succ[p.key] = (r, why)
    chains: list[Chain] = []
    for r in order:
        if r.key in pred:
            continue
        runs, links = [r], []
        while runs[-1].key in succ:
            nxt, why = succ[runs[-1].key]
            runs.append(nxt)
            links.append(why)
        chains.append(Chain(runs=runs, links=links))
    return chains
