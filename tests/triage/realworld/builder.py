"""Build realistic job directories around the real-world error excerpts of corpus.toml.

Each excerpt is placed into an otherwise normal MaxText job written with the simulator's line
formatters (`jobdiagd_sim.lines`, `JobSim`): the header and stage markers, per-node env dumps,
Ray start-up for RAY=1, JAX init and compile chatter, the barrier, every task's step lines with
its `srun -l` prefix, checkpoints, healthy noise (including the harmless lines of rule HL-1), and an
ending consistent with what the excerpt implies: NODE_EXIT lines of the wrappers, srun's per-task
exit lines, the Training stage marker and the JOB SUMMARY with its exit status (or no summary at
all, for a job killed outright).

Decisions:
- Excerpt text is never edited. The job is shaped around it instead: its job id and host names
  are the ones the excerpt names (`job.job_id`, `job.hosts`), and the simulated clock is set so
  that the log's own timestamps (absl, dated lines, slurmstepd's CANCELLED AT) agree with the
  first timestamp the excerpt carries (two passes of the same seeded simulation).
- Where a line goes: `train` is the training process (RAY=0: the srun task's output; RAY=1: the
  Ray worker log, forwarded to the Slurm log with the actor prefix), `task` is the srun task's own
  output (the per-node wrapper, the Ray driver), `batch` is the batch script / srun / slurmstepd
  (no task prefix). The kernel's OOM report is the failing task's output: its wrapper prints the
  node's dmesg before it exits. `job.forward_cutoff` reproduces the RAY=1 truncation (rule ST-7): the
  excerpt and everything after it from the actors reach only the worker logs.
- RAY=1 drivers exit with `sys.exit(-signal)` (256 - N) after an actor reports a signal, as the
  job scripts do; a failing stage always ends with `Status: FAILED (exit 1)`.
"""

from __future__ import annotations

import calendar
import random
import re
import tomllib
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jobdiagd_sim import lines as L
from jobdiagd_sim.job import SIM_EPOCH, JobSim, JobSpec

CORPUS_PATH = Path(__file__).with_name("corpus.toml")
# Held-out excerpts: gathered before the signature families were written, never used to
# tune them; scored separately (`score.py --group heldout`).
HELDOUT_PATH = Path(__file__).with_name("heldout.toml")
GROUPS = {"dev": CORPUS_PATH, "heldout": HELDOUT_PATH}

STREAMS = ("train", "task", "batch")
WHERES = ("startup", "first-step", "mid-training", "checkpoint", "end", "healthy")
OUTCOMES = ("fail", "no-summary", "cancel", "complete", "running", "hang-cancel", "hang-running")
# Year given to timestamps that carry none (absl `E0926 17:26:32.075402`).
YEARLESS_YEAR = 2025
STEP_TIME = 5.0


class CorpusError(ValueError):
    """The corpus file does not follow its schema (one message naming the excerpt and field)."""


@dataclass(frozen=True)
class Part:
    stream: str
    tasks: tuple[int, ...] | None  # None: every task ("all"); unused for the batch stream
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Job:
    nnodes: int = 4
    ray: bool = False
    where: str = "mid-training"
    at_step: int = 40
    steps: int = 300
    checkpoint_period: int | None = None
    hosts: tuple[str, ...] = ()
    job_id: str | None = None
    mem_fraction: str = ".85"
    stall_before_s: float = 0.0
    forward_cutoff: bool = False  # RAY=1: the driver stops forwarding worker output before the excerpt
    restore_from: int | None = None  # the run resumes from this checkpoint step (first step after it)


@dataclass(frozen=True)
class Outcome:
    kind: str
    failing: tuple[int, ...] = ()
    exit: int = 1
    others: int = 143
    actor: str | None = None
    node_exit: bool = True
    srun: bool = True
    terminate: bool = True
    silent: tuple[int, ...] = ()
    stall_s: float = 0.0
    slurm_state: str | None = None


@dataclass(frozen=True)
class Expect:
    status: str
    primary: str | None
    reason: str = ""
    absent: tuple[str, ...] = ()
    report_must_not: tuple[str, ...] = ()
    # Held-out only: a measured miss the patterns were not tuned to fix (held-out text is never
    # used to tune them); the test expects it to fail until a development excerpt covers the wording.
    known_miss: str = ""


@dataclass(frozen=True)
class Excerpt:
    id: str
    family: str
    project: str
    source: str
    key: str | None
    note: str
    parts: tuple[Part, ...]
    job: Job
    outcome: Outcome
    expect: Expect
    lines_from: str | None = None
    after: str | None = None
    group: str = "dev"  # dev (corpus.toml) | heldout (heldout.toml)

    @property
    def lines(self) -> list[str]:
        return [ln for p in self.parts for ln in p.lines]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass
class BuiltCase:
    excerpt: Excerpt
    outputs_root: Path
    job_dir: Path
    log: Path
    now: float
    slurm_state: str | None
    first_step: int | None
    last_step: int | None
    wall_seconds: int | None
    summary_exit: int | None
    worker_logs: list[Path] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------


def load_all() -> dict[str, Excerpt]:
    """Both groups (development corpus, then held-out), keyed by id; ids are unique across them."""
    out: dict[str, Excerpt] = {}
    for group, path in GROUPS.items():
        for eid, ex in load_corpus(path, group=group).items():
            if eid in out:
                raise CorpusError(f"{path}: excerpt id {eid!r} is also in {out[eid].group}")
            out[eid] = ex
    return out


def load_corpus(path: Path = CORPUS_PATH, *, group: str = "dev") -> dict[str, Excerpt]:
    """Parse and validate one corpus file; `lines_from` parts are resolved. Keyed by id, file order."""
    with path.open("rb") as fh:
        doc = tomllib.load(fh)
    raw = doc.get("excerpt")
    if not isinstance(raw, list) or not raw:
        raise CorpusError(f"{path}: no [[excerpt]] tables")
    by_id: dict[str, dict[str, Any]] = {}
    for entry in raw:
        eid = entry.get("id")
        if not isinstance(eid, str) or not eid:
            raise CorpusError(f"{path}: an excerpt has no id")
        if eid in by_id:
            raise CorpusError(f"{path}: duplicate excerpt id {eid!r}")
        by_id[eid] = entry
    out: dict[str, Excerpt] = {}
    for eid, entry in by_id.items():
        out[eid] = replace(_excerpt(eid, entry, by_id), group=group)
    for ex in out.values():
        if ex.after is not None and ex.after not in out:
            raise CorpusError(f"{ex.id}: after={ex.after!r} names no excerpt")
    return out


def _excerpt(eid: str, e: Mapping[str, Any], by_id: Mapping[str, Mapping[str, Any]]) -> Excerpt:
    def need(table: Mapping[str, Any], key: str, typ: type) -> Any:
        v = table.get(key)
        if not isinstance(v, typ):
            raise CorpusError(f"{eid}: {key} must be a {typ.__name__}, got {v!r}")
        return v

    src_entry: Mapping[str, Any] = e
    lines_from = e.get("lines_from")
    if lines_from is not None:
        if lines_from not in by_id:
            raise CorpusError(f"{eid}: lines_from={lines_from!r} names no excerpt")
        src_entry = by_id[lines_from]
    raw_parts = src_entry.get("part")
    if not isinstance(raw_parts, list) or not raw_parts:
        raise CorpusError(f"{eid}: no [[excerpt.part]] (and no lines_from)")
    parts = tuple(_part(eid, p) for p in raw_parts)
    job_t = e.get("job", {})
    out_t = e.get("outcome", {})
    exp_t = e.get("expect", {})
    job = Job(
        nnodes=int(job_t.get("nnodes", 4)),
        ray=bool(job_t.get("ray", False)),
        where=str(job_t.get("where", "mid-training")),
        at_step=int(job_t.get("at_step", 40)),
        steps=int(job_t.get("steps", 300)),
        checkpoint_period=job_t.get("checkpoint_period"),
        hosts=tuple(str(h) for h in job_t.get("hosts", ())),
        job_id=job_t.get("job_id"),
        mem_fraction=str(job_t.get("mem_fraction", ".85")),
        stall_before_s=float(job_t.get("stall_before_s", 0.0)),
        forward_cutoff=bool(job_t.get("forward_cutoff", False)),
        restore_from=None if job_t.get("restore_from") is None else int(job_t["restore_from"]),
    )
    outcome = Outcome(
        kind=str(out_t.get("kind", "")),
        failing=tuple(int(t) for t in out_t.get("failing", ())),
        exit=int(out_t.get("exit", 1)),
        others=int(out_t.get("others", 143)),
        actor=out_t.get("actor"),
        node_exit=bool(out_t.get("node_exit", True)),
        srun=bool(out_t.get("srun", True)),
        terminate=bool(out_t.get("terminate", True)),
        silent=tuple(int(t) for t in out_t.get("silent", ())),
        stall_s=float(out_t.get("stall_s", 0.0)),
        slurm_state=out_t.get("slurm_state") or None,
    )
    expect = Expect(
        status=need(exp_t, "status", str),
        primary=exp_t.get("primary") or None,
        reason=str(exp_t.get("reason", "")),
        absent=tuple(exp_t.get("absent", ())),
        report_must_not=tuple(exp_t.get("report_must_not", ())),
        known_miss=str(exp_t.get("known_miss", "")),
    )
    ex = Excerpt(
        id=eid,
        family=need(e, "family", str),
        project=need(e, "project", str),
        source=need(e, "source", str),
        key=e.get("key"),
        note=str(e.get("note", "")),
        parts=parts,
        job=job,
        outcome=outcome,
        expect=expect,
        lines_from=lines_from,
        after=e.get("after"),
    )
    _validate(ex)
    return ex


def _part(eid: str, p: Mapping[str, Any]) -> Part:
    stream = p.get("stream")
    if stream not in STREAMS:
        raise CorpusError(f"{eid}: part stream must be one of {STREAMS}, got {stream!r}")
    text = p.get("lines")
    if not isinstance(text, str) or not text.strip():
        raise CorpusError(f"{eid}: a part has no lines")
    # A TOML multi-line string ends with the newline before its closing quotes.
    lines = tuple(text[:-1].split("\n") if text.endswith("\n") else text.split("\n"))
    tasks_v = p.get("tasks")
    tasks: tuple[int, ...] | None
    if stream == "batch":
        tasks = ()
    elif tasks_v == "all":
        tasks = None
    elif isinstance(tasks_v, list) and tasks_v and all(isinstance(t, int) for t in tasks_v):
        tasks = tuple(tasks_v)
    else:
        raise CorpusError(f'{eid}: a {stream} part needs tasks = [..] or "all", got {tasks_v!r}')
    return Part(stream, tasks, lines)


def _validate(ex: Excerpt) -> None:
    j, o = ex.job, ex.outcome
    if j.where not in WHERES:
        raise CorpusError(f"{ex.id}: job.where must be one of {WHERES}, got {j.where!r}")
    if o.kind not in OUTCOMES:
        raise CorpusError(f"{ex.id}: outcome.kind must be one of {OUTCOMES}, got {o.kind!r}")
    if j.nnodes < 1 or j.steps < 2:
        raise CorpusError(f"{ex.id}: job needs nnodes >= 1 and steps >= 2")
    if j.where in ("mid-training", "checkpoint", "healthy") and not 0 <= j.at_step < j.steps - 1:
        raise CorpusError(f"{ex.id}: at_step {j.at_step} outside 0..steps-2")
    if j.restore_from is not None and not (
        j.checkpoint_period
        and j.restore_from % j.checkpoint_period == 0
        and j.where in ("mid-training", "checkpoint", "healthy")
        and 0 <= j.restore_from < j.at_step
    ):
        raise CorpusError(f"{ex.id}: job.restore_from needs a checkpoint step before at_step")
    if j.where == "checkpoint" and (not j.checkpoint_period or j.at_step % j.checkpoint_period):
        raise CorpusError(f"{ex.id}: a checkpoint placement needs at_step on a checkpoint_period multiple")
    if j.hosts and len(j.hosts) != j.nnodes:
        raise CorpusError(f"{ex.id}: job.hosts names {len(j.hosts)} hosts for nnodes={j.nnodes}")
    for t in (*o.failing, *o.silent, *(t for p in ex.parts for t in (p.tasks or ()))):
        if not 0 <= t < j.nnodes:
            raise CorpusError(f"{ex.id}: task {t} outside 0..{j.nnodes - 1}")
    if o.actor is not None and not (o.actor == "exited" or re.fullmatch(r"killed:SIG[A-Z]+:\d+", o.actor)):
        raise CorpusError(f"{ex.id}: outcome.actor must be 'exited' or 'killed:SIGNAME:N', got {o.actor!r}")
    if (o.actor is not None or j.forward_cutoff) and not j.ray:
        raise CorpusError(f"{ex.id}: outcome.actor and job.forward_cutoff need a RAY=1 job")
    if o.kind == "fail" and not o.failing:
        raise CorpusError(f"{ex.id}: a fail outcome names its failing tasks")


# ------------------------------------------------------------------------------------------------
# Timestamps the excerpt carries
# ------------------------------------------------------------------------------------------------

_ISO = re.compile(r"(?<!\d)(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})")
_ABSL = re.compile(r"(?<![\w@])[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.\d{6,9}\b")
_ABSL_EPOCH = re.compile(r"(?<![\w@])[IWEF]0000 00:00:(\d{10})\.\d+")
_DMESG_T = re.compile(r"\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (\w{3}) +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})\]")
_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}
# Timestamps further than this after the excerpt's first one (a second clock in another zone on
# the same line) do not move the job's clock.
_SPREAD_S = 3600.0


def _utc(y: int, mo: int, d: int, h: int, mi: int, s: int) -> float | None:
    try:
        return float(calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)))
    except (ValueError, OverflowError):
        return None


def line_times(line: str) -> list[float]:
    """Epoch seconds of the timestamps a log line carries (naive times read as UTC)."""
    out: list[float] = []
    for m in _ABSL_EPOCH.finditer(line):
        out.append(float(m.group(1)))
    for m in _ISO.finditer(line):
        t = _utc(*(int(g) for g in m.groups()))
        if t is not None:
            out.append(t)
    for m in _DMESG_T.finditer(line):
        mon = _MONTHS.get(m.group(1))
        if mon:
            t = _utc(int(m.group(6)), mon, int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)))
            if t is not None:
                out.append(t)
    if not out:
        for m in _ABSL.finditer(line):
            mo, d, h, mi, s = (int(g) for g in m.groups())
            if 1 <= mo <= 12:
                t = _utc(YEARLESS_YEAR, mo, d, h, mi, s)
                if t is not None:
                    out.append(t)
    return out


def excerpt_span(lines: Sequence[str]) -> tuple[float, float] | None:
    times = [t for ln in lines for t in line_times(ln)]
    if not times:
        return None
    first = min(times)
    last = max(t for t in times if t <= first + _SPREAD_S)
    return first, last


# ------------------------------------------------------------------------------------------------
# Building
# ------------------------------------------------------------------------------------------------


def default_job_id(eid: str) -> str:
    return str(5_000_000 + zlib.crc32(eid.encode()) % 4_000_000)


def build_case(ex: Excerpt, corpus: Mapping[str, Excerpt], outputs_root: Path, *, seed: int = 0) -> BuiltCase:
    """Write the job for `ex` under `outputs_root` (its own outputs root) and return where it is."""
    before = corpus[ex.after] if ex.after else None
    all_lines = [*(before.lines if before else []), *ex.lines]
    span = excerpt_span(all_lines)
    sim, at = _simulate(ex, before, start=SIM_EPOCH, seed=seed, span=None)
    if span is not None:
        # Second pass, same seed: start the job so the excerpt lands at its own timestamp.
        sim, _ = _simulate(ex, before, start=span[0] - at, seed=seed, span=span)
    job_dir, log = sim.write(outputs_root)
    o = ex.outcome
    if o.kind == "running":
        now = sim.last_t + STEP_TIME * 0.4
    elif o.kind == "hang-running":
        now = sim.last_t + 30.0
    else:
        now = sim.last_t + 600.0
    recs = sim.records
    workers = sorted((job_dir / "ray_logs").rglob("worker-*.out")) if ex.job.ray else []
    summary = next((ln for ln in reversed(sim.slurm) if "Status: " in ln and "exit" in ln), None)
    summary_exit = int(m.group(1)) if summary and (m := re.search(r"\(exit (\d+)\)", summary)) else None
    return BuiltCase(
        excerpt=ex,
        outputs_root=outputs_root,
        job_dir=job_dir,
        log=log,
        now=round(now, 3),
        slurm_state=o.slurm_state,
        first_step=recs[0].step if recs else None,
        last_step=recs[-1].step if recs else None,
        wall_seconds=int(sim.end_t - sim.spec.start) if summary else None,
        summary_exit=summary_exit,
        worker_logs=workers,
    )


def _simulate(
    ex: Excerpt, before: Excerpt | None, *, start: float, seed: int, span: tuple[float, float] | None
) -> tuple[JobSim, float]:
    """One deterministic run of the job; returns the sim and the excerpt's offset from the start."""
    j = ex.job
    rng = random.Random(f"{ex.id}:{seed}")
    model = rng.choice(("llama2-70b", "llama3.1-70b", "llama3.1-8b", "llama3.1-405b", "deepseek3-671b"))
    spec = JobSpec(
        job_id=j.job_id or default_job_id(ex.id),
        model=model,
        tag="rw",
        nnodes=j.nnodes,
        hosts=j.hosts,
        ray=j.ray,
        steps=j.steps,
        checkpointing=j.checkpoint_period is not None,
        checkpoint_period=j.checkpoint_period,
        step_time=STEP_TIME * rng.uniform(0.8, 1.3),
        start=start,
        mem_fraction=j.mem_fraction,
        compile_time=rng.uniform(120.0, 300.0),
    )
    if spec.ray:
        spec.ray_port = spec.jax_port + 1
    sim = JobSim(spec, rng)
    sim.header()
    sim.stages_ok()
    sim.train_begin()
    sim.env_dumps()
    if spec.ray:
        sim.ray_start()
    sim.init_training(restore_from=j.restore_from, barrier=j.where != "startup")

    first = 0 if j.restore_from is None else j.restore_from + 1
    next_step = 0
    if j.where in ("mid-training", "healthy"):
        sim.steps(first, j.at_step)
        next_step = j.at_step + 1
    elif j.where == "checkpoint":
        # The save at at_step is the one that fails: no "Saved a checkpoint" line for it.
        sim.steps(first, j.at_step, skip_save=(j.at_step,))
        next_step = j.at_step + 1
        sim.advance(rng.uniform(20.0, 90.0))
    elif j.where == "end":
        sim.steps(0, j.steps - 1)
        next_step = j.steps
        sim.advance(rng.uniform(5.0, 30.0))
    elif j.where == "first-step":
        sim.advance(rng.uniform(20.0, 60.0))
    if j.stall_before_s:
        sim.quiet_noise(j.stall_before_s, 120.0)
    else:
        sim.advance(rng.uniform(0.5, 4.0))

    at = sim.t - spec.start
    if j.forward_cutoff:
        # RAY=1 truncation: buffered actor output never reaches the Slurm log from here on.
        sim.forward_cutoff = sim.t - rng.uniform(10.0, 60.0)
    for exc in (before, ex):
        if exc is None:
            continue
        for part in exc.parts:
            _place(sim, part)
            sim.advance(rng.uniform(0.2, 1.5))
    if span is not None:
        sim.t = max(sim.t, span[1] + 0.5)
    _finish(sim, ex, next_step, rng)
    return sim, at


def _place(sim: JobSim, part: Part) -> None:
    if part.stream == "batch":
        sim.batch(*part.lines)
        return
    tasks = range(sim.ntasks) if part.tasks is None else part.tasks
    for r in tasks:
        if part.stream == "train":
            sim.train_out(r, *part.lines)
        else:
            sim.task(r, *part.lines)


def _finish(sim: JobSim, ex: Excerpt, next_step: int, rng: random.Random) -> None:
    j, o = ex.job, ex.outcome
    if o.kind == "complete":
        if next_step <= j.steps - 1:
            sim.steps(next_step, j.steps - 1, start_first=0)
        sim.train_end_ok()
        sim.summary(0)
    elif o.kind == "running":
        last = min(j.steps - 2, next_step + 20)
        if next_step <= last:
            sim.steps(next_step, last, start_first=0)
    elif o.kind == "hang-running":
        sim.quiet_noise(o.stall_s, 120.0)
    elif o.kind == "hang-cancel":
        sim.quiet_noise(o.stall_s, 120.0)
        sim.cancel_cascade(slurm="22.05")
    elif o.kind == "cancel":
        _cancelled(sim, o)
    elif o.kind == "fail":
        _failed(sim, o, rng)
    # no-summary: the log simply ends (the batch script was killed with the job).


def _cancelled(sim: JobSim, o: Outcome) -> None:
    """The SIGTERM cascade after Slurm's own cancel line (which the excerpt carries)."""
    sim.advance(1.0)
    for r in range(sim.ntasks):
        sim.task(r, L.node_exit(sim.hosts[r], 143))
    if o.srun:
        for r in range(sim.ntasks):
            sim.batch(L.srun_task_exit(sim.hosts[r], str(r), 143))
            sim.advance(0.2)
    sim.batch(L.srun_step_signal(sim.step_id))
    sim.summary(143, L.CANCELLED_TEXT)


def _failed(sim: JobSim, o: Outcome, rng: random.Random) -> None:
    """The failing tasks exit, srun tears the step down, the Training stage and the job fail."""
    sim.advance(rng.uniform(0.5, 3.0))
    failing = list(o.failing)
    node_rc = o.exit
    if sim.spec.ray and o.actor is not None:
        for r in failing:
            if o.actor == "exited":
                sim.task(r, L.actor_exited(r, sim.hosts[r], o.exit))
            else:
                _, name, num = o.actor.split(":")
                sim.task(r, L.actor_killed(r, sim.hosts[r], name, int(num)))
                node_rc = 256 - int(num)
    for r in failing:
        if o.node_exit:
            sim.task(r, L.node_exit(sim.hosts[r], node_rc))
        if o.srun:
            sim.batch(L.srun_task_exit(sim.hosts[r], str(r), node_rc))
        sim.advance(rng.uniform(0.1, 1.0))
    if o.terminate:
        sim.batch(L.srun_terminating(sim.step_id))
        sim.batch(L.srun_job_step_aborted())
    for r in range(sim.ntasks):
        if r in o.failing or r in o.silent or o.others == 0:
            continue
        sim.task(r, L.node_exit(sim.hosts[r], o.others))
        sim.batch(L.srun_task_exit(sim.hosts[r], str(r), o.others))
        sim.advance(rng.uniform(0.05, 0.4))
    sim.training_failed(node_rc)


def build_all(
    root: Path,
    *,
    ids: Sequence[str] | None = None,
    seed: int = 0,
    corpus: Mapping[str, Excerpt] | None = None,
) -> list[BuiltCase]:
    """Build every case (or `ids`), each under its own outputs root `root/<id>/outputs`."""
    cases = corpus if corpus is not None else load_all()
    chosen = list(ids) if ids else list(cases)
    unknown = [i for i in chosen if i not in cases]
    if unknown:
        raise CorpusError(f"unknown excerpt id(s): {', '.join(unknown)}")
    return [build_case(cases[i], cases, root / i / "outputs", seed=seed) for i in chosen]
