"""`jobdiagd calibrate`'s judgement, pure: which hang budget the archive supports (docs/rules.md rule GP-10).

The archive is replayed through the detectors (`service.backtest`) once per policy of a grid
(stall factor × minimum stall × checkpoint budget). Per job and policy an `Outcome` says
whether the hang detector paged and when. Against the truth (the simulator's manifest, or the
job's own final triage: rule GP-6):
- a miss: a hung job that got no hang page;
- a false page: a hang page on a job that did not hang, unless a failure page followed it
  (the job really stalled before its root cause was logged: the backtest corpus's
  "stall before the root cause", which is a true stall);
- latency: page time minus the last step's line (the barrier's, before the first step).

Jobs are grouped by configuration: model, node count and a step-time band (powers of two
seconds). Per group, the proposal is the policy with no miss and no false page whose worst
latency is smallest (then the smallest median, then the smallest budgets); when none is clean,
the one with fewest misses plus false pages. The one `[detectors.hang]` section the config has
takes the policy that is clean over the whole archive; the groups' own proposals are written
as comments beside it (the config has no per-configuration budgets yet).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

DEFAULT_FACTORS = (2.0, 3.0, 4.0, 6.0)
DEFAULT_MIN_STALLS = (60.0, 120.0, 300.0)
DEFAULT_CHECKPOINTS = (300.0, 900.0, 1800.0)


@dataclass(frozen=True, slots=True, order=True)
class Policy:
    stall_factor: float
    min_stall_s: float
    checkpoint_s: float

    def label(self) -> str:
        return f"x{self.stall_factor:g} min {self.min_stall_s:g}s ckpt {self.checkpoint_s:g}s"


def grid(
    factors: Sequence[float] = DEFAULT_FACTORS,
    min_stalls: Sequence[float] = DEFAULT_MIN_STALLS,
    checkpoints: Sequence[float] = DEFAULT_CHECKPOINTS,
) -> list[Policy]:
    return sorted({Policy(f, m, c) for f in factors for m in min_stalls for c in checkpoints})


def step_band(step_time_s: float | None) -> str:
    """`4-8s`: the power-of-two band of a steady step time ("?" when unknown)."""
    if not step_time_s or step_time_s <= 0 or not math.isfinite(step_time_s):
        return "?"
    k = math.floor(math.log2(step_time_s))
    lo, hi = 2.0**k, 2.0 ** (k + 1)
    return f"{lo:g}-{hi:g}s"


def group_key(model: str | None, nnodes: int, step_time_s: float | None) -> str:
    return f"{model or '?'} x{nnodes} {step_band(step_time_s)}"


@dataclass(frozen=True, slots=True)
class Outcome:
    job: str
    group: str
    hang: bool  # the truth
    paged: bool  # a hang page opened
    latency_s: float | None  # page - stall onset (hang jobs)
    false_page: bool


@dataclass
class Score:
    policy: Policy
    jobs: int = 0
    hangs: int = 0
    misses: int = 0
    false_pages: int = 0
    latencies: list[float] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.misses == 0 and self.false_pages == 0

    @property
    def worst_s(self) -> float:
        return max(self.latencies) if self.latencies else 0.0

    @property
    def median_s(self) -> float:
        return statistics.median(self.latencies) if self.latencies else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "stall_factor": self.policy.stall_factor,
            "min_stall_seconds": self.policy.min_stall_s,
            "checkpoint_budget_seconds": self.policy.checkpoint_s,
            "jobs": self.jobs,
            "hangs": self.hangs,
            "misses": self.misses,
            "false_pages": self.false_pages,
            "median_latency_s": round(self.median_s, 1),
            "worst_latency_s": round(self.worst_s, 1),
        }


def score(policy: Policy, outcomes: Iterable[Outcome]) -> Score:
    s = Score(policy)
    for o in outcomes:
        s.jobs += 1
        if o.hang:
            s.hangs += 1
            if not o.paged:
                s.misses += 1
            elif o.latency_s is not None:
                s.latencies.append(o.latency_s)
        elif o.false_page:
            s.false_pages += 1
    return s


def choose(scores: Sequence[Score]) -> tuple[Score, bool]:
    """The best policy of these scores and whether it is clean (no miss, no false page)."""
    clean = [s for s in scores if s.clean]
    if clean:
        return min(clean, key=lambda s: (s.worst_s, s.median_s, s.policy)), True
    return min(scores, key=lambda s: (s.misses + s.false_pages, s.worst_s, s.policy)), False


@dataclass
class Proposal:
    overall: Score
    overall_clean: bool
    groups: dict[str, tuple[Score, bool]]
    table: list[Score]  # every policy over the whole archive


def propose(results: dict[Policy, list[Outcome]]) -> Proposal:
    if not results:
        raise ValueError("no policy was replayed")
    table = [score(p, outs) for p, outs in sorted(results.items())]
    overall, clean = choose(table)
    names = sorted({o.group for outs in results.values() for o in outs})
    groups: dict[str, tuple[Score, bool]] = {}
    for g in names:
        groups[g] = choose(
            [score(p, [o for o in outs if o.group == g]) for p, outs in sorted(results.items())]
        )
    return Proposal(overall, clean, groups, table)


def render_table(p: Proposal) -> str:
    head = f"{'stall factor':>12} {'min stall':>9} {'ckpt budget':>11} {'false pages':>11} {'misses':>6} {'median':>8} {'worst':>8}"
    out = [head, "-" * len(head)]
    for s in p.table:
        mark = " <- proposed" if s.policy == p.overall.policy else ""
        out.append(
            f"{s.policy.stall_factor:>12g} {s.policy.min_stall_s:>8g}s {s.policy.checkpoint_s:>10g}s "
            f"{s.false_pages:>11} {s.misses:>6} {s.median_s:>7.0f}s {s.worst_s:>7.0f}s{mark}"
        )
    return "\n".join(out)


def render_groups(p: Proposal) -> str:
    out = []
    for g, (s, clean) in sorted(p.groups.items()):
        state = "clean" if clean else f"best available: {s.misses} missed, {s.false_pages} false"
        hangs = f"{s.hangs} hang(s), worst latency {s.worst_s:.0f}s" if s.hangs else "no hang in its history"
        out.append(f"{g:<34} {s.policy.label():<30} {state}; {s.jobs} job(s), {hangs}")
    return "\n".join(out)


def toml_snippet(p: Proposal, source: str) -> str:
    s = p.overall.policy
    lines = [
        f"# jobdiagd calibrate: {source}",
        f"# {p.overall.jobs} jobs, {p.overall.hangs} hangs replayed; this policy: {p.overall.false_pages} false "
        f"page(s), {p.overall.misses} missed hang(s), worst detection latency {p.overall.worst_s:.0f} s.",
    ]
    if not p.overall_clean:
        lines.append("# No policy of the grid caught every hang without a false page: this is the closest.")
    lines += [
        "[detectors.hang]",
        f"stall_factor = {s.stall_factor:g}",
        f"min_stall_seconds = {s.min_stall_s:g}",
        f"checkpoint_budget_seconds = {s.checkpoint_s:g}",
    ]
    other = {g: v for g, v in sorted(p.groups.items()) if v[0].policy != s or not v[1]}
    same = len(p.groups) - len(other)
    lines.append(
        f"# Per configuration (model, nodes, step time): {same} of {len(p.groups)} allow the same"
        + ("." if not other else "; the others alone would allow:")
    )
    for g, (gs, clean) in other.items():
        flag = "" if clean else " (not clean)"
        lines.append(
            f"#   {g}: stall_factor = {gs.policy.stall_factor:g}, min_stall_seconds = {gs.policy.min_stall_s:g}, "
            f"checkpoint_budget_seconds = {gs.policy.checkpoint_s:g}{flag}"
        )
    lines.append("# startup_grace_seconds is not calibrated: a hang before the first step waits it out.")
    return "\n".join(lines) + "\n"
