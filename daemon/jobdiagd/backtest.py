"""`jobdiagd backtest`: replay finished jobs through the daemon's detectors on a clock built from the log itself.

Virtual clock (per file, then merged by time): a line with a printed timestamp (absl, Ray,
NCCL, ISO) is at that time; a `completed step:` line without one is at the previous line's
time plus its `seconds:`; any other line without one inherits the previous time; the clock
never runs backwards. A file with no timestamps at all runs on summed step seconds from 0.
`at_s` is seconds since the first `completed step:` line on that clock (negative before it).

Replay: lines are fed to fresh `LogState`s (the one parser, with the daemon's `TAIL` step
retention) in clock order; the step arrival time is the line's own time (what a daemon
tailing it live would have seen); full ticks run every `tick` seconds of virtual time
through the same detectors, the same resolution rule and the same incident book as the
daemon. The job ends at its last line (JOB SUMMARY state, or
UNKNOWN) and the job-end report runs on a fresh `load_job` of its files, like the daemon's.
Files are opened as `jobdiagd triage` opens them (`triage.resolve.job_access`): one that is no
regular file, leaves the job's outputs root or belongs to another user is left out.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobdiagd import clock, jsonsafe
from jobdiagd.alerts.incidents import IncidentBook
from jobdiagd.config import Config, ConfigError, default_config, load
from jobdiagd.detectors import Detector, NoData, Report, keep_resolution
from jobdiagd.detectors import build as build_detectors
from jobdiagd.detectors.hang import policy_from_config
from jobdiagd.logs.job import load_job
from jobdiagd.logs.prefixes import strip
from jobdiagd.logs.reader import MAX_LINE
from jobdiagd.logs.safeopen import ANYWHERE, LogAccess
from jobdiagd.logs.state import LogState
from jobdiagd.logs.steps import TAIL
from jobdiagd.model.alerts import Finding
from jobdiagd.model.jobview import JobView
from jobdiagd.triage.engine import analyze
from jobdiagd.triage.hostlist import expand_hostlist
from jobdiagd.triage.resolve import JobRef, ResolveError, job_access, list_jobs, resolve

MAX_TICKS = 200_000  # a guard against a log whose clock jumps by years


@dataclass(frozen=True, slots=True)
class Line:
    t: float
    order: int  # file index: ties keep the main log first
    lineno: int
    offset: int
    text: str


@dataclass
class Alert:
    kind: str
    event: str
    at_step: int | None
    at_s: float
    cls: str | None
    summary: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "event": self.event,
            "at_step": self.at_step,
            "at_s": round(self.at_s, 1),
            "class": self.cls,
            "summary": self.summary,
        }


@dataclass
class JobReplay:
    job: str
    log: str | None
    alerts: list[Alert] = field(default_factory=list)
    first_step_at: float | None = None
    last_step: int | None = None
    last_step_at_s: float | None = None
    step_time_s: float | None = None
    end_at_s: float | None = None
    barrier_at_s: float | None = None  # when the pre-training barrier line was read
    final_status: str | None = None
    final_primary: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "log": self.log,
            "alerts": [a.to_dict() for a in self.alerts],
            "last_step": self.last_step,
            "last_step_at_s": None if self.last_step_at_s is None else round(self.last_step_at_s, 1),
            "step_time_s": self.step_time_s,
            "end_at_s": None if self.end_at_s is None else round(self.end_at_s, 1),
            "barrier_at_s": None if self.barrier_at_s is None else round(self.barrier_at_s, 1),
            "final_status": self.final_status,
            "final_primary": self.final_primary,
        }


def timeline(
    path: Path, order: int, ref_time: float, anchor: float | None = None, access: LogAccess = ANYWHERE
) -> list[Line]:
    """Every line of one file with its virtual time (see the module docstring).

    `anchor`: where a file without any timestamp starts (the job's other files' first stamp).
    The file is opened through `access` (regular files only: a FIFO never blocks the replay).
    """
    scratch = LogState(str(path), ref_time=ref_time)
    raw_lines: list[tuple[int, str, float | None, float | None]] = []  # offset, text, stamp, step seconds
    offset = 0
    with os.fdopen(access.open(path), "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            text = raw[:MAX_LINE].rstrip(b"\r\n").decode("utf-8", errors="replace")
            stamp = strip(text).stamp
            when = scratch.clock.epoch(stamp) if stamp is not None else None
            before = scratch.step_lines
            scratch.feed(text, lineno, offset)
            secs: float | None = None
            if scratch.step_lines != before and scratch.steps:
                rec = scratch.steps.get(max(scratch.steps))
                secs = rec.seconds if rec is not None else None
            raw_lines.append((offset, text, when, secs))
            offset += len(raw)
    first_stamp = next((w for _, _, w, _ in raw_lines if w is not None), None)
    cur = first_stamp if first_stamp is not None else (anchor or 0.0)
    out: list[Line] = []
    for i, (off, text, when, secs) in enumerate(raw_lines):
        if when is not None:
            cur = max(cur, when)
        elif secs is not None:
            cur += secs
        out.append(Line(cur, order, i + 1, off, text))
    return out


def _readable(path: Path, access: LogAccess) -> bool:
    try:
        os.close(access.open(path))
    except OSError:
        return False
    return True


def _files(ref: JobRef, ref_time: float, access: LogAccess) -> tuple[list[Path], str | None]:
    """Main log plus, for RAY=1, the head node's worker logs (what the daemon tails); files that
    `access` refuses (not regular, outside the job's root, another user's) are left out."""
    files: list[Path] = [ref.log] if ref.log is not None and _readable(ref.log, access) else []
    head: str | None = None
    d = ref.job_dir
    if files and d is not None and (d / "ray_logs").is_dir():
        probe = load_job(
            JobRef(ref.job_id, ref.name, None, ref.log, ref.platform), ref_time=ref_time, access=access
        ).main
        if probe is not None:
            head = probe.ray_head or probe.tunnel_host
            if head is None and probe.header.get("JOB_NODELIST"):
                nodes = expand_hostlist(probe.header["JOB_NODELIST"])
                head = nodes[0] if nodes else None
        if head is not None and (d / "ray_logs" / head).is_dir():
            hd = d / "ray_logs" / head
            workers = sorted(hd.glob("worker-*.out")) + sorted(hd.glob("worker-*.err"))
            files += [f for f in workers if _readable(f, access)]
        else:
            head = None
    return files, head


def replay(ref: JobRef, cfg: Config, *, tick: float, ref_time: float) -> JobReplay:
    key = ref.job_id or ref.name or str(ref.log)
    result = JobReplay(job=key, log=str(ref.log) if ref.log else None)
    access = job_access(ref)
    files, head = _files(ref, ref_time, access)
    if not files:
        return result
    per_file = [timeline(f, i, ref_time, access=access) for i, f in enumerate(files)]
    stamped = [tl[0].t for tl in per_file if tl and tl[0].t > 0]
    anchor = min(stamped) if stamped else None
    lines: list[Line] = []
    for i, tl in enumerate(per_file):
        if anchor is not None and tl and tl[0].t == 0.0:
            tl = timeline(files[i], i, ref_time, anchor, access)  # no stamps at all: start with the job
        lines += tl
    lines.sort(key=lambda ln: (ln.t, ln.order, ln.lineno))
    states = [LogState(str(f), ref_time=ref_time, retention=TAIL) for f in files]  # as the daemon tails
    policy = policy_from_config(cfg)
    view = JobView(key=key, ref=ref, first_seen=lines[0].t, policy=policy)
    view.main = states[0]
    if head is not None and len(states) > 1:
        view.head_host = head
        view.workers = {head: states[1:]}
    detectors = build_detectors(cfg)
    book = IncidentBook.from_config(cfg.incidents)
    t0: float | None = None
    next_tick = lines[0].t + tick
    ticks = 0
    for ln in lines:
        while next_tick <= ln.t and ticks < MAX_TICKS:
            _tick(view, detectors, book, next_tick, result, t0)
            next_tick += tick
            ticks += 1
        st = states[ln.order]
        before = (st.step_lines, st.barrier_passed is not None)
        st.feed(ln.text, ln.lineno, ln.offset)
        if (st.step_lines, st.barrier_passed is not None) != before:
            view.note_read(ln.t)
            if t0 is None and view.last_step is not None:
                t0 = ln.t
                result.first_step_at = ln.t
    end = lines[-1].t
    view.note_read(end)
    view.ended = True
    s = view.main.summary if view.main is not None else None
    view.end_state = "UNKNOWN"
    if s is not None and s.exit_code is not None:
        view.end_state = (
            "COMPLETED" if s.exit_code == 0 else "CANCELLED" if s.exit_code in (130, 143) else "FAILED"
        )
    final_ref = ref
    view.final = analyze(load_job(final_ref, ref_time=ref_time, access=access), now=end, policy=policy)
    _tick(view, detectors, book, end, result, t0)
    base = t0 if t0 is not None else lines[0].t
    result.end_at_s = end - base
    result.last_step = view.last_step
    if view.last_step_at is not None:
        result.last_step_at_s = view.last_step_at - base
    if view.marker_at is not None:
        result.barrier_at_s = view.marker_at - base
    st_time = view.step_time()
    result.step_time_s = round(st_time, 3) if st_time else None
    result.final_status = view.final.status
    result.final_primary = view.final.primary
    return result


def _tick(
    view: JobView,
    detectors: Sequence[Detector],
    book: IncidentBook,
    now: float,
    out: JobReplay,
    t0: float | None,
) -> None:
    findings: list[Finding] = []
    reports: list[Report] = []
    for det in detectors:
        res = det.check(view, now)
        if isinstance(res, NoData):
            continue
        for item in res:
            (reports if isinstance(item, Report) else findings).append(item)  # type: ignore[arg-type]
    findings = [f for f in findings if keep_resolution(book, f)]
    by_kind = {f.kind: f for f in findings}
    base = t0 if t0 is not None else view.first_seen
    for n in book.observe_all(findings, now):
        if n.event != "open":
            continue
        f = by_kind.get(n.kind)
        inc = book.get(n.job_id, n.kind)
        cls = _alert_class(f)
        out.alerts.append(
            Alert(
                n.kind, "open", inc.first_step if inc else None, now - base, cls, f.summary if f else n.title
            )
        )
    for r in reports:
        final = view.final
        out.alerts.append(
            Alert(
                r.kind,
                "report",
                view.last_step,
                now - base,
                (final.primary or final.status) if final is not None else None,
                r.title,
            )
        )


def _alert_class(f: Finding | None) -> str | None:
    if f is None:
        return None
    if f.kind == "failure":
        return str(f.details.get("root cause", "failure"))
    if f.kind == "tgs-degradation":
        return "tgs-degradation"
    return f.kind


def refs_for(paths: Sequence[str]) -> list[JobRef]:
    refs: list[JobRef] = []
    for p in paths:
        path = Path(p)
        # is_symlink first: a `log` link to a name longer than the filesystem allows cannot be
        # stat()ed (ENAMETOOLONG); resolve() reports such a job.
        if path.is_dir() and not (path / "log").is_symlink() and not (path / "log").exists():
            refs += [r for r in list_jobs(path) if r.log is not None]
            continue
        refs.append(resolve(p, []))
    return refs


def main(args: argparse.Namespace) -> int:
    try:
        cfg = load(args.config) if args.config else default_config()
    except ConfigError as exc:
        print(f"jobdiagd backtest: {exc}", file=sys.stderr)
        return 2
    tick = args.tick or cfg.daemon.tick_seconds
    try:
        refs = refs_for(args.paths)
    except ResolveError as exc:
        print(f"jobdiagd backtest: {exc}", file=sys.stderr)
        return 2
    now = clock.wall()
    results = [replay(r, cfg, tick=tick, ref_time=now) for r in refs]
    if args.json:
        print(jsonsafe.dumps({"jobs": [r.to_dict() for r in results]}, indent=1))
        return 0
    for r in results:
        print(
            f"job {r.job}  ({r.log})  final: {r.final_status}/{r.final_primary or '-'}  last step {r.last_step}"
        )
        if not r.alerts:
            print("    no alerts")
        for a in r.alerts:
            step = f"step {a.at_step}" if a.at_step is not None else "no step"
            print(f"    +{a.at_s:9.1f}s  {step:<10} {a.event.upper():<7} {a.kind:<16} [{a.cls}] {a.summary}")
    return 0
