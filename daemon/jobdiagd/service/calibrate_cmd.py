"""`jobdiagd calibrate`: replay the archive through the hang detector with a grid of budgets and propose
the tightest one that caught every past hang with no false page (docs/rules.md rule GP-10).

Each job is replayed by the backtest (`service.backtest.replay`, its public API only) once per
policy; the truth is the simulator's manifest (`--truth`) or the job's own triage (rule GP-6:
any run of its log hung). The judgement (`goodput.calibrate`) is pure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from jobdiagd import clock, jsonsafe
from jobdiagd.config import Config, load_for_command
from jobdiagd.goodput import calibrate as cal
from jobdiagd.goodput.cache import FactsCache
from jobdiagd.goodput.collect import ProgressLine
from jobdiagd.goodput.facts import RunFacts
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.kinds import FailureClass, IncidentKind
from jobdiagd.service.goodput_cmd import archive_refs, collect, default_cache_dir, roots, slurm_facts

EARLY_SLACK_S = 1.0  # a page this much before the last step's line is still at the stall


def with_policy(cfg: Config, p: cal.Policy) -> Config:
    hang = dataclasses.replace(
        cfg.detectors.hang,
        stall_factor=p.stall_factor,
        min_stall_seconds=p.min_stall_s,
        checkpoint_budget_seconds=p.checkpoint_s,
    )
    return dataclasses.replace(cfg, detectors=dataclasses.replace(cfg.detectors, hang=hang))


def load_truth(path: Path) -> dict[str, bool]:
    """Job id -> hung, from `{"jobs": [{"job_id", "primary_failure"}]}` (the simulator's manifest)."""
    doc = json.loads(path.read_text())
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        raise ValueError(f'{path}: expected {{"jobs": [...]}}')
    out: dict[str, bool] = {}
    for j in jobs:
        if isinstance(j, dict) and j.get("job_id") is not None and j.get("is_job", True):
            out[str(j["job_id"])] = j.get("primary_failure") == FailureClass.HANG
    return out


def outcome(ref: JobRef, cfg: Config, *, tick: float, now: float, group: str, hang: bool) -> cal.Outcome:
    """What one replay under one policy did about one job."""
    from jobdiagd.service.backtest import replay

    rep = replay(ref, cfg, tick=tick, ref_time=now)
    onset = rep.last_step_at_s if rep.last_step_at_s is not None else (rep.barrier_at_s or 0.0)
    pages = [a for a in rep.alerts if a.kind == IncidentKind.HANG and a.event == "open"]
    at_stall = [a for a in pages if a.at_s >= onset - EARLY_SLACK_S]
    early = [a for a in pages if a.at_s < onset - EARLY_SLACK_S]  # steps went on: a false page
    failures = [a.at_s for a in rep.alerts if a.kind == IncidentKind.FAILURE and a.event == "open"]
    false = bool(early)
    if not hang:
        # A stall paged before the failure that ended the job was a real stall, not a false page.
        false = false or any(not any(f >= a.at_s for f in failures) for a in at_stall)
    first = min((a.at_s for a in at_stall), default=None)
    return cal.Outcome(
        job=ref.job_id or str(ref.log),
        group=group,
        hang=hang,
        paged=first is not None,
        latency_s=None if first is None else first - onset,
        false_page=false,
    )


def _groups(facts: Sequence[RunFacts]) -> tuple[dict[str, str], dict[str, bool]]:
    """Per log: its configuration group (the last run's) and whether any of its runs hung."""
    group: dict[str, str] = {}
    hung: dict[str, bool] = {}
    for f in facts:
        key = f.log or f.key
        group[key] = cal.group_key(f.model or f.job_name, f.nnodes, f.step_time_s)
        hung[key] = hung.get(key, False) or f.hang
    return group, hung


def main(args: argparse.Namespace) -> int:
    cfg = load_for_command(args.config, "calibrate")
    if cfg is None:
        return 2
    now = args.now if args.now is not None else clock.wall()
    refs = archive_refs(args.paths, "calibrate")
    if refs is None:
        return 2
    try:
        truth = load_truth(args.truth) if args.truth else None
    except (OSError, ValueError) as exc:
        print(f"jobdiagd calibrate: --truth: {exc}", file=sys.stderr)
        return 2
    notes: list[str] = []
    slurm = slurm_facts(refs, enabled=not args.no_slurm, notes=notes)
    cache = FactsCache(None if args.no_cache else (args.cache or default_cache_dir(cfg, bool(args.config))))
    got = collect(refs, slurm, cfg, cache, now=now, replay_ok=False)
    cache.close()
    group, hung = _groups(got.facts)
    tick = args.tick or cfg.daemon.tick_seconds
    policies = cal.grid(
        args.factors or cal.DEFAULT_FACTORS,
        args.min_stalls or cal.DEFAULT_MIN_STALLS,
        args.checkpoint_budgets or cal.DEFAULT_CHECKPOINTS,
    )
    started = time.monotonic()
    results: dict[cal.Policy, list[cal.Outcome]] = {}
    progress = ProgressLine(len(policies) * len(refs))
    done = 0
    for p in policies:
        pcfg = with_policy(cfg, p)
        outs: list[cal.Outcome] = []
        for ref in refs:
            key = str(ref.log)
            hang = (
                truth.get(ref.job_id or "", hung.get(key, False))
                if truth is not None
                else hung.get(key, False)
            )
            try:
                outs.append(outcome(ref, pcfg, tick=tick, now=now, group=group.get(key, "?"), hang=hang))
            except (OSError, ValueError) as exc:
                notes.append(f"{ref.log}: replay failed: {exc}")
            done += 1
            progress.update(done, 0)
        results[p] = outs
    progress.close()
    elapsed = time.monotonic() - started
    proposal = cal.propose(results)
    source = (
        f"{len(refs)} jobs under {', '.join(roots(args.paths))}, {len(policies)} policies, tick {tick:g} s"
    )
    snippet = cal.toml_snippet(proposal, source)
    if args.write is not None:
        try:
            args.write.write_text(snippet)
        except OSError as exc:
            notes.append(f"snippet not written: {args.write}: {exc.strerror or exc}")
    if args.json:
        doc = {
            "jobs": len(refs),
            "hangs": proposal.overall.hangs,
            "policies": len(policies),
            "elapsed_s": round(elapsed, 1),
            "table": [s.to_dict() for s in proposal.table],
            "proposal": {**proposal.overall.to_dict(), "clean": proposal.overall_clean},
            "groups": {g: {**s.to_dict(), "clean": c} for g, (s, c) in proposal.groups.items()},
            "snippet": snippet,
            "notes": notes,
        }
        print(jsonsafe.dumps(doc, indent=1))
        return 0
    print(
        f"Calibrate: {len(refs)} jobs ({proposal.overall.hangs} hung), {len(policies)} policies replayed "
        f"in {elapsed:.0f} s (tick {tick:g} s)"
    )
    print(cal.render_table(proposal))
    print("\nPer configuration (model, nodes, step time):")
    print(cal.render_groups(proposal))
    where = f" (written to {args.write})" if args.write is not None else ""
    print(f"\nProposed config{where}:")
    print(snippet, end="")
    for n in notes:
        print(f"Note: {n}")
    return 0
