"""Score the triage classifier on the real-world corpus: build every case, triage it, compare.

Usage (from the repository root):
    .venv/bin/python -m tests.triage.realworld.score [--group dev|heldout] [--only ID ...] [--keep DIR]
                                                     [--json] [-v]

The development corpus (corpus.toml) and the held-out group (heldout.toml, gathered before the
signature families were written and never used to tune them) are scored and printed separately.

For every excerpt the job is built by builder.py, then triaged in-process by the same code path
as `jobdiagd triage DIR --json --now T --slurm-state S` (resolve -> read -> classify -> report).
A case passes when status and primary failure are those docs/rules.md gives (corpus `expect`) and no class
listed in `absent` is reported. Reported separately: whether the markdown report's Evidence
section quotes the excerpt's key line, and whether its "What happened" avoids the phrases in
`report_must_not` (e.g. a non-timeout NCCL error described as a "collective timeout").
Not a test: it prints today's score; the corpus test only checks the corpus is well formed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from jobdiagd.triage.engine import triage
from jobdiagd.triage.report import render_markdown
from tests.triage.realworld.builder import GROUPS, BuiltCase, build_case, load_all


@dataclass
class CaseResult:
    id: str
    group: str
    family: str
    expect_status: str
    expect_primary: str | None
    got_status: str
    got_primary: str | None
    classes: list[str]
    class_ok: bool
    absent_hit: list[str]
    evidence_ok: bool | None  # None: the case has no key line (healthy job)
    desc_ok: bool | None  # None: nothing to check
    matched: str  # the evidence the primary came from (what matched instead, on a miss)
    reason: str

    @property
    def passed(self) -> bool:
        return self.class_ok and not self.absent_hit


def _section(md: str, title: str) -> str:
    start = md.find(f"### {title}")
    if start < 0:
        return ""
    end = md.find("\n### ", start + 4)
    return md[start : end if end >= 0 else len(md)]


def evaluate(case: BuiltCase) -> CaseResult:
    ex = case.excerpt
    r = triage(case.job_dir, now=case.now, slurm_state=case.slurm_state, outputs_root=case.outputs_root)
    d = r.to_dict()
    md = render_markdown(r)
    got_status = str(d["status"])
    got_primary = d["primary_failure"]
    classes = [str(c) for c in d["classes"]]  # type: ignore[attr-defined]
    failures = d["failures"]
    matched = ""
    if isinstance(failures, list) and failures:
        prim = [f for f in failures if f.get("class") == got_primary] or failures
        f0 = prim[0]
        matched = f"{f0.get('class')}: {str(f0.get('text'))[:140]}"
    evidence_ok: bool | None = None
    if ex.key:
        evidence_ok = ex.key in _section(md, "Evidence")
    desc_ok: bool | None = None
    if ex.expect.report_must_not:
        what = _section(md, "What happened").lower()
        desc_ok = not any(p.lower() in what for p in ex.expect.report_must_not)
    class_ok = got_status == ex.expect.status and got_primary == ex.expect.primary
    return CaseResult(
        id=ex.id,
        group=ex.group,
        family=ex.family,
        expect_status=ex.expect.status,
        expect_primary=ex.expect.primary,
        got_status=got_status,
        got_primary=str(got_primary) if got_primary is not None else None,
        classes=classes,
        class_ok=class_ok,
        absent_hit=[c for c in ex.expect.absent if c in classes],
        evidence_ok=evidence_ok,
        desc_ok=desc_ok,
        matched=matched,
        reason=ex.expect.reason,
    )


def run(
    root: Path, ids: Sequence[str] | None = None, seed: int = 0, group: str | None = None
) -> list[CaseResult]:
    corpus = load_all()
    chosen = list(ids) if ids else [i for i, e in corpus.items() if group is None or e.group == group]
    results = []
    for eid in chosen:
        case = build_case(corpus[eid], corpus, root / eid / "outputs", seed=seed)
        results.append(evaluate(case))
    return results


def _pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100.0 * n / d:.0f}%)" if d else "-"


def report(results: Sequence[CaseResult], *, verbose: bool = False) -> str:
    """One table per group (development corpus, held-out), each with its own misses."""
    out: list[str] = []
    for group in GROUPS:
        part = [c for c in results if c.group == group]
        if part:
            if out:
                out.append("")
            out.append(f"=== {group} ({GROUPS[group].name}) ===")
            out.append(_report_group(part, verbose=verbose))
    return "\n".join(out)


def _report_group(results: Sequence[CaseResult], *, verbose: bool = False) -> str:
    fam: dict[str, list[CaseResult]] = defaultdict(list)
    for c in results:
        fam[c.family].append(c)
    out = [f"{'family':24} {'cases':>5} {'class ok':>12} {'evidence quoted':>16} {'description ok':>15}"]
    for name in sorted(fam):
        cs = fam[name]
        ev = [c for c in cs if c.evidence_ok is not None]
        de = [c for c in cs if c.desc_ok is not None]
        out.append(
            f"{name:24} {len(cs):>5} {_pct(sum(c.passed for c in cs), len(cs)):>12} "
            f"{_pct(sum(bool(c.evidence_ok) for c in ev), len(ev)):>16} "
            f"{_pct(sum(bool(c.desc_ok) for c in de), len(de)):>15}"
        )
    ev_all = [c for c in results if c.evidence_ok is not None]
    de_all = [c for c in results if c.desc_ok is not None]
    out.append(
        f"{'OVERALL':24} {len(results):>5} {_pct(sum(c.passed for c in results), len(results)):>12} "
        f"{_pct(sum(bool(c.evidence_ok) for c in ev_all), len(ev_all)):>16} "
        f"{_pct(sum(bool(c.desc_ok) for c in de_all), len(de_all)):>15}"
    )
    misses = [c for c in results if not c.passed or verbose]
    if misses:
        out.append("")
        out.append("case                                         expected                          got")
        for c in misses:
            mark = "ok " if c.passed else "MISS"
            exp = f"{c.expect_status}/{c.expect_primary or '-'}"
            got = f"{c.got_status}/{c.got_primary or '-'}"
            extra = f" absent-but-reported={c.absent_hit}" if c.absent_hit else ""
            out.append(f"{mark} {c.id:40} {exp:33} {got}{extra}")
            if not c.passed and c.matched:
                out.append(f"       matched: {c.matched}")
    causes = Counter(
        f"{c.got_primary or 'none'} <- {c.matched.split(':', 1)[0] or 'no evidence'}"
        for c in results
        if not c.class_ok
    )
    if causes:
        out.append("")
        out.append("misclassifications by the class given and the evidence it came from:")
        out.extend(f"  {n:3}  {cause}" for cause, n in causes.most_common())
    no_ev = [c.id for c in results if c.evidence_ok is False]
    if no_ev:
        out.append("")
        out.append(f"key line not quoted in the Evidence section ({len(no_ev)}): {', '.join(no_ev)}")
    bad_desc = [c.id for c in results if c.desc_ok is False]
    if bad_desc:
        out.append(f"description uses a phrase it must not ({len(bad_desc)}): {', '.join(bad_desc)}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.triage.realworld.score", description=__doc__)
    p.add_argument("--only", action="append", metavar="ID", help="score only these excerpts (repeatable)")
    p.add_argument("--group", choices=sorted(GROUPS), help="score only this group")
    p.add_argument("--keep", type=Path, metavar="DIR", help="build the jobs here and keep them")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.add_argument("-v", "--verbose", action="store_true", help="list every case, not only the misses")
    args = p.parse_args(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        results = run(args.keep, args.only, args.seed, args.group)
    else:
        with tempfile.TemporaryDirectory(prefix="realworld-") as tmp:
            results = run(Path(tmp), args.only, args.seed, args.group)
    if args.json:
        doc = {
            "cases": [{**asdict(c), "passed": c.passed} for c in results],
            "groups": {
                g: {
                    "passed": sum(c.passed for c in results if c.group == g),
                    "total": sum(1 for c in results if c.group == g),
                }
                for g in GROUPS
            },
        }
        print(json.dumps(doc, indent=1))
    else:
        print(report(results, verbose=args.verbose))
    return 0


if __name__ == "__main__":
    sys.exit(main())
