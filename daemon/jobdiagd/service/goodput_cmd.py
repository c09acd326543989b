"""`jobdiagd goodput`: the goodput ledger of an archive of jobs (docs/rules.md §GP).

The command composes the floors below: it reads each job's runs (`goodput.collect`, cached by
`goodput.cache`), asks Slurm's accounting when each was submitted, started and ended
(`sources.accounting`), finds when jobdiagd paged each hang (the daemon's incident store in the
state dir when it watched the job, else a replay of the log through the detectors,
`service.backtest`), models the old log-mtime monitor on the same log (`goodput.monitor`),
links restarts (`goodput.chains`), accounts every second (`goodput.ledger`), and prints the
table, the detection comparison and the checkpoint advice, or the JSON document, and renders
the picture (`chat.goodput_plot`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from jobdiagd import clock, jsonsafe
from jobdiagd.config import Config, load_for_command
from jobdiagd.durations import rounded_duration
from jobdiagd.goodput import monitor
from jobdiagd.goodput.advice import Advice, advise_chains
from jobdiagd.goodput.cache import FactsCache, fingerprint
from jobdiagd.goodput.chains import link
from jobdiagd.goodput.collect import ProgressLine, collect_job, job_refs
from jobdiagd.goodput.digest import weekly_digest
from jobdiagd.goodput.facts import RunFacts
from jobdiagd.goodput.ledger import Chain, Run, SlurmFacts, ledger_chain, resolve_run
from jobdiagd.goodput.report import LEGEND, chart, document, group, render_table
from jobdiagd.logs.safeopen import LogAccess
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.kinds import IncidentKind
from jobdiagd.sources.accounting import query_accounting, scontrol_comments
from jobdiagd.triage.resolve import job_access

INCIDENT_SLACK_S = 120.0


def default_cache_dir(cfg: Config, explicit_config: bool) -> Path:
    """The state dir's `goodput-cache` when a config names one, else the user's cache dir."""
    if explicit_config:
        return cfg.daemon.state_dir / "goodput-cache"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jobdiagd"


def roots(paths: Sequence[str]) -> list[str]:
    if paths:
        return list(paths)
    env = os.environ.get("JOBDIAGD_OUTPUTS")
    return [p for p in env.split(os.pathsep) if p] if env else ["outputs"]


def archive_refs(paths: Sequence[str], command: str) -> list[JobRef] | None:
    """The job logs under the given outputs roots (else $JOBDIAGD_OUTPUTS, else ./outputs); what
    cannot be read is said on stderr, and None (after saying so) when no job is found."""
    refs, errors = job_refs(roots(paths))
    for e in errors:
        print(f"jobdiagd {command}: {e}", file=sys.stderr)
    if not refs:
        print(f"jobdiagd {command}: no job with a log under the given outputs", file=sys.stderr)
        return None
    return refs


# --- Slurm --------------------------------------------------------------------------------------


def slurm_facts(refs: Iterable[JobRef], *, enabled: bool, notes: list[str]) -> dict[str, SlurmFacts]:
    """Accounting (and scontrol's comments) by job id; {} without Slurm."""
    if not enabled:
        return {}
    ids = [r.job_id for r in refs if r.platform == "slurm" and r.job_id]
    if not ids:
        return {}
    answer = query_accounting(ids)
    notes.extend(answer.notes)
    comments = scontrol_comments() if answer.records or answer.source else {}
    out: dict[str, SlurmFacts] = {}
    for job_id, rec in answer.records.items():
        out[job_id] = SlurmFacts(
            submit=rec.submit,
            start=rec.start,
            end=rec.end,
            state=rec.state,
            user=rec.user or None,
            partition=rec.partition or None,
            nodes=rec.nodes,
            nnodes=rec.nnodes,
            comment=rec.comment or comments.get(job_id),
        )
    for job_id, comment in comments.items():
        if job_id not in out and job_id in ids:
            out[job_id] = SlurmFacts(comment=comment)
    return out


def _wall(s: SlurmFacts | None, now: float) -> float | None:
    if s is None or s.start is None:
        return None
    return max(0.0, (s.end if s.end is not None else now) - s.start)


# --- hang pages: the incident store, else a replay -------------------------------------------------


def incident_pages(cfg: Config, explicit_config: bool, notes: list[str]) -> dict[str, list[float]]:
    """Job id -> when each hang incident opened, from the daemon's store (when there is one)."""
    from jobdiagd.alerts.store import DB_NAME, AlertStore, StoreError
    from jobdiagd.privatefs import UnsafePathError

    path = cfg.daemon.state_dir / DB_NAME
    if not path.exists():
        if explicit_config:
            notes.append(f"no incident store at {path}: hang pages come from replays")
        return {}
    try:
        store = AlertStore(path)
    except (StoreError, UnsafePathError, OSError) as exc:
        notes.append(f"incident store not read: {exc}")
        return {}
    try:
        out: dict[str, list[float]] = {}
        for inc in store.load_incidents(open_only=False):
            if inc.kind == IncidentKind.HANG:
                out.setdefault(inc.job_id, []).append(inc.opened_at)
        return out
    finally:
        store.close()


def _policy_key(cfg: Config, tick: float) -> str:
    h = cfg.detectors.hang
    return f"{h.stall_factor:g}/{h.min_stall_seconds:g}/{h.startup_grace_seconds:g}/{h.checkpoint_budget_seconds:g}/{tick:g}"


def replay_pages(ref: JobRef, cfg: Config, *, now: float) -> list[float]:
    """When a replay of the job's log pages hangs (virtual clock: the log's own time)."""
    from jobdiagd.service.backtest import replay

    tick = cfg.daemon.tick_seconds
    rep = replay(ref, cfg, tick=tick, ref_time=now)
    return [a.at for a in rep.alerts if a.kind == IncidentKind.HANG and a.event == "open" and a.at is not None]


def log_writes(ref: JobRef, access: LogAccess, now: float) -> list[float]:
    """The time of every line of the main log on the replay's clock (what the mtime monitor sees)."""
    from jobdiagd.logs.file_clock import survey
    from jobdiagd.logs.replay_read import read_timed

    assert ref.log is not None
    fc = survey(ref.log, 0, now, access)
    start = fc.start if fc.start is not None else 0.0
    return [t for t, *_rest in read_timed(fc, start, now, every_line=True)]


def _window_pick(pages: Sequence[float], f: RunFacts) -> float | None:
    """The first page inside the run (after its last step, or its start)."""
    lo = f.last_step_at if f.last_step_at is not None else (f.stall_origin or f.first_stamp)
    hi = f.last_stamp
    for t in sorted(pages):
        if (lo is None or t >= lo - INCIDENT_SLACK_S) and (hi is None or t <= hi + INCIDENT_SLACK_S):
            return t
    return None


def _hang_extras(
    ref: JobRef, facts: list[RunFacts], cfg: Config, access: LogAccess, now: float, replay_ok: bool
) -> list[RunFacts]:
    """Stalled runs: the replay's page (replay_ok); hangs: when the mtime monitor would have fired."""
    hangs = [f for f in facts if f.hang or f.stalled]
    if not hangs or ref.log is None:
        return facts
    key = _policy_key(cfg, cfg.daemon.tick_seconds)
    try:
        writes = log_writes(ref, access, now) if any(f.hang for f in facts) else []
        pages = replay_pages(ref, cfg, now=now) if replay_ok else []
    except Exception as exc:  # one job's odd log must not lose the others' ledger (as backtest does)
        print(f"jobdiagd goodput: {ref.log}: replay failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return facts
    out: list[RunFacts] = []
    for f in facts:
        if f.hang or f.stalled:
            after = f.last_step_at if f.last_step_at is not None else (f.stall_origin or f.first_stamp)
            until = f.last_stamp
            fire = None
            if f.hang and after is not None and until is not None:
                fire = monitor.monitor_fire_at((t for t in writes if t <= until), after=after, until=until)
            f = dataclasses.replace(
                f,
                monitor_at=fire,
                replay_detected_at=_window_pick(pages, f) if replay_ok else None,
                replay_policy=key if replay_ok else None,
            )
        out.append(f)
    return out


# --- the archive ---------------------------------------------------------------------------------


@dataclass
class Collected:
    facts: list[RunFacts]
    failed: int
    cache: FactsCache


def collect(
    refs: Sequence[JobRef],
    slurm: dict[str, SlurmFacts],
    cfg: Config,
    cache: FactsCache,
    *,
    now: float,
    replay_ok: bool,
) -> Collected:
    progress = ProgressLine(len(refs))
    facts: list[RunFacts] = []
    failed = 0
    policy = _policy_key(cfg, cfg.daemon.tick_seconds) if replay_ok else ""
    for i, ref in enumerate(refs, 1):
        s = slurm.get(ref.job_id or "")
        state = s.state if s is not None else None
        fp = fingerprint(ref, f"{state}|{policy}")
        key = str(ref.log)
        got = cache.get(key, fp)
        if got is None:
            access = job_access(ref, (), s.user if s is not None else None)
            try:
                got = collect_job(ref, now=now, access=access, slurm_state=state, slurm_wall_s=_wall(s, now))
                got = _hang_extras(ref, got, cfg, access, now, replay_ok)
            except OSError as exc:
                print(f"jobdiagd goodput: {ref.log}: {exc.strerror or exc}", file=sys.stderr)
                failed += 1
                progress.update(i, cache.hits)
                continue
            cache.put(key, fp, got)
        facts.extend(got)
        progress.update(i, cache.hits)
    progress.close()
    return Collected(facts, failed, cache)


def place(
    facts: Iterable[RunFacts], slurm: dict[str, SlurmFacts], pages: dict[str, list[float]], *, now: float
) -> tuple[list[Run], int]:
    """Runs placed in time, jobdiagd's page from the incident store where it has one."""
    runs: list[Run] = []
    unplaced = 0
    for f in facts:
        det: dict[str, tuple[float, str]] = {}
        if (f.hang or f.stalled) and f.job_id and (t := _window_pick(pages.get(f.job_id, []), f)) is not None:
            det[f.key] = (t, "incident")
        run = resolve_run(f, slurm.get(f.job_id or ""), now=now, detection=det)
        if run is None:
            unplaced += 1
        else:
            runs.append(run)
    return runs, unplaced


def ledger(runs: Sequence[Run], *, window_s: float) -> list[Chain]:
    return [ledger_chain(ch) for ch in link(runs, window_s=window_s)]


@dataclass
class Archive:
    """Every chain of an archive with its ledgers (`archive_ledger`), and what reading it noted."""

    chains: list[Chain]
    jobs: int
    cached: int
    failed: int
    notes: list[str]


def archive_ledger(
    refs: Sequence[JobRef],
    cfg: Config,
    cache: FactsCache,
    *,
    now: float,
    accounting: bool,
    replay_ok: bool,
    pages: dict[str, list[float]],
    window_s: float,
) -> Archive:
    """The archive's chains: Slurm's accounting (when `accounting`), each job's runs (cached;
    closes `cache`), jobdiagd's hang pages (`pages`: the incident store's, else replays when
    `replay_ok`), restarts linked within `window_s`, every second accounted. What
    `jobdiagd goodput` prints and the daemon's weekly digest sends."""
    notes: list[str] = []
    slurm = slurm_facts(refs, enabled=accounting, notes=notes)
    got = collect(refs, slurm, cfg, cache, now=now, replay_ok=replay_ok)
    cache.close()
    if cache.note:
        notes.append(cache.note)
    runs, unplaced = place(got.facts, slurm, pages, now=now)
    if unplaced:
        notes.append(
            f"{unplaced} run(s) left out: nothing dates them (no timestamp, no Wall, no Slurm record)"
        )
    return Archive(ledger(runs, window_s=window_s), len(refs), got.cache.hits, got.failed, notes)


def _since(chains: Sequence[Chain], since_s: float | None, now: float) -> list[Chain]:
    """Chains cut to the runs that ended (or run) within the span; ledgers kept as computed."""
    if since_s is None:
        return list(chains)
    out: list[Chain] = []
    for ch in chains:
        keep = [i for i, r in enumerate(ch.runs) if r.end >= now - since_s]
        if keep:
            out.append(Chain([ch.runs[i] for i in keep], ch.links, [ch.ledgers[i] for i in keep]))
    return out


# --- output --------------------------------------------------------------------------------------


def detection_lines(d: monitor.DetectionSummary) -> list[str]:
    if not d.hangs:
        return ["Hangs: none in this period."]
    lines = [f"Hangs: {d.hangs}; jobdiagd's page time known for {d.with_page} (incident store or replay)."]
    if d.latencies_s:
        med = sorted(d.latencies_s)[len(d.latencies_s) // 2]
        lines.append(
            f"  jobdiagd paged a median {rounded_duration(med)} after the last step (worst {rounded_duration(max(d.latencies_s))})."
        )
    caught = len(d.monitor_latencies_s)
    if d.with_page:
        if caught:
            mon = rounded_duration(sorted(d.monitor_latencies_s)[caught // 2])
            fired = f"would have fired on {caught} of them (a median {mon} after the last step)"
        else:
            fired = "would have fired on none of them"
        lines.append(
            f"  The 30-min log-mtime monitor {fired}; on {d.monitor_missed} the log was written to "
            "too often, or the job ended first."
        )
        bound = "at least " if d.saved_is_lower_bound else ""
        lines.append(f"  Faster detection saved {bound}{d.saved_gpu_hours:,.1f} GPU-hours on these jobs.")
    return lines


MAX_ADVICE_LINES = 10


def advice_lines(advice: Sequence[Advice]) -> list[str]:
    if not advice:
        return ["Checkpoint advice: none (no configuration with measured saves and interruptions)."]
    out = ["Checkpoint advice (per model and node count):"]
    for a in advice[:MAX_ADVICE_LINES]:
        out.append(f"  {a.config}: {a.sentence()}.")
        out.append(f"    {a.formula()}; MTBF: {a.mtbf_basis}.")
    if len(advice) > MAX_ADVICE_LINES:
        out.append(f"  ... and {len(advice) - MAX_ADVICE_LINES} more configurations (--json lists them all).")
    return out


def wrapped(lines: Sequence[str], width: int = 100) -> str:
    """Lines wrapped to the table's width, continuations indented under their line's text."""
    out: list[str] = []
    for line in lines:
        lead = " " * (len(line) - len(line.lstrip()))
        out.extend(textwrap.wrap(line, width, initial_indent="", subsequent_indent=lead + "  ") or [""])
    return "\n".join(out)


def render_png(path: Path, spec: object, notes: list[str]) -> bool:
    try:
        from jobdiagd.chat.goodput_plot import render_goodput
    except ImportError as exc:
        notes.append(f"no picture: {exc.name or exc} is not installed (the `plots` extra)")
        return False
    from jobdiagd.goodput.report import GoodputChart

    assert isinstance(spec, GoodputChart)
    data = render_goodput(spec)
    try:
        path.write_bytes(data)
    except OSError as exc:
        notes.append(f"picture not written: {path}: {exc.strerror or exc}")
        return False
    return True


def save_fleet(cfg: Config, chains: Sequence[Chain], now: float) -> str:
    """The fleet's rates for the daemon's job-end advice, into the config's state dir."""
    from jobdiagd.goodput.fleet import fleet_of, write_fleet
    from jobdiagd.privatefs import UnsafePathError, ensure_private_dir

    try:
        path = write_fleet(ensure_private_dir(cfg.daemon.state_dir), fleet_of(chains, now=now))
    except (OSError, UnsafePathError) as exc:
        return f"fleet figures for the job-end advice not written: {exc}"
    return f"fleet figures for the daemon's job-end advice written to {path}"


def print_digest(
    chains: Sequence[Chain], now: float, png: Path | None, notes: list[str], *, as_json: bool = False
) -> int:
    """`--digest`: the weekly digest the daemon would send now, as Markdown (and its picture)."""
    digest = weekly_digest(chains, now=now, advice=advise_chains(chains))
    drawn = png is not None and render_png(png, digest.chart, notes)
    if as_json:
        doc = {"title": digest.title, "markdown": digest.markdown, "png": str(png) if drawn else None}
        print(jsonsafe.dumps({**doc, "notes": notes}, indent=1))
        return 0
    print(digest.markdown, end="")
    if drawn:
        print(f"\nPicture: {png}")
    for n in notes:
        print(wrapped([f"Note: {n}"]))
    return 0


def _cache(args: argparse.Namespace, cfg: Config) -> FactsCache:
    if args.no_cache:
        return FactsCache(None)
    return FactsCache(args.cache or default_cache_dir(cfg, bool(args.config)))


def main(args: argparse.Namespace) -> int:
    cfg = load_for_command(args.config, "goodput")
    if cfg is None:
        return 2
    now = args.now if args.now is not None else clock.wall()
    refs = archive_refs(args.paths, "goodput")
    if refs is None:
        return 2
    notes: list[str] = []
    pages = incident_pages(cfg, bool(args.config), notes)
    got = archive_ledger(
        refs,
        cfg,
        _cache(args, cfg),
        now=now,
        accounting=not args.no_slurm,
        replay_ok=not args.no_replay,
        pages=pages,
        window_s=args.link_window,
    )
    notes += got.notes
    every = got.chains
    if args.config:
        notes.append(save_fleet(cfg, every, now))
    if args.digest:
        return print_digest(every, now, None if args.no_png else args.png, notes, as_json=args.json)
    chains = _since(every, args.since, now)
    rows = group(chains, args.by)
    kept = [r for ch in chains for r in ch.runs]
    detection = monitor.summarize(kept)
    advice = advise_chains(chains)
    title = f"Goodput: {len(kept)} runs in {len(chains)} chains"
    spec = chart(
        rows,
        chains,
        args.by,
        title,
        f"GPU-hours per {args.by} by bucket, goodput above each bar; not productive, by how the run ended",
    )
    png = None if args.no_png else args.png
    if png is not None and not render_png(png, spec, notes):
        png = None
    if args.json:
        doc = document(
            chains,
            rows,
            args.by,
            {
                "detection": detection.to_dict(),
                "advice": [a.to_dict() for a in advice],
                "png": str(png) if png else None,
                "notes": notes,
                "jobs": {"read": len(refs), "cached": got.cached, "failed": got.failed},
            },
        )
        print(jsonsafe.dumps(doc, indent=1, default=str))
    else:
        print(f"{title}; cache: {got.cached} of {len(refs)} jobs")
        print(render_table(rows, args.by))
        print(wrapped([LEGEND]))
        print()
        print(wrapped(detection_lines(detection)))
        print(wrapped(advice_lines(advice)))
        if png is not None:
            print(f"Picture: {png}")
        for n in notes:
            print(wrapped([f"Note: {n}"]))
    return 1 if got.failed else 0
