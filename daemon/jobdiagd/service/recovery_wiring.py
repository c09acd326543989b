"""Recovery wired into the daemon (docs/recovery.md; rules REC-1 to REC-30).

- **The stage** (`plan`, "recovery" in `service.stages.STAGES`, before observe): for each hang or
  failure finding of the tick, and each job whose failed end the tick confirms, the facts a
  decision needs (`policy.Case`: owner, partition, nodes, last step, failure class, the nodes the
  diagnosis names). `RecoveryManager.consider` runs inside observe's store transaction, after the
  incident book took the findings: the incident, its page, the intent and the countdown's edit
  commit together or not at all (rule REC-13). A hang finding repeats every tick while the job
  stalls and `consider` is idempotent, so what a failed commit lost is decided again at the next
  tick. The nodes a diagnosis names go to node memory (a TGS slide's slow host too, named by
  the site Prometheus); a node past the notice score becomes a notice that carries a Drain
  button (rule REC-22). A hang that resolves (steps resumed) cancels
  its pending restart; the incidents of a job whose restart is done resolve "restarted as N"
  instead of "job ended"; a restarted job whose restore line (or, without one, first step) is read
  gets "restarted as N, step S restored" in the old job's thread.
- **The countdown** is an annotation of the incident (`IncidentBook.annotate`, key `recovery`):
  the incident's snapshot carries the text and the intent's state, so the incident's message —
  edited in place by an `update` notification — shows it with its button (Keep the job, Restart),
  the way it shows an ack or a mute. Annotations are made again from the store's open intents at
  start.
- **Acting** (`run`, a task of the daemon): what is due — a countdown's end, an approval, a
  retry, a restart a kill -9 interrupted — runs off the event loop in a thread of its own (the
  Slurm commands block), on a store connection opened in that thread (SQLite in WAL mode; each
  state change of an intent is a compare-and-set, so Keep the job and the worker never both
  win). A daemon thread: stopping the daemon does not wait for a Slurm command in flight; the
  intent stays `running` and resumes at the next start. Each outcome is one reply in the
  incident's thread — who or what, the rule, every exact command (rule REC-15) — and an edit of
  the incident's message.
- **People**: Keep the job, an ack or a mute cancel a pending restart (rules REC-9, REC-14);
  Restart approves a suggestion, for the job's owner (`[recovery] chat_users`) or an operator;
  Drain (operators only, rule REC-23) and /nodes. `DaemonChatBackend` calls these.

Node memory records whatever the mode (`jobdiagd nodes`, /nodes, the notices); restarts need a
`mode` (or an override), the owner's opt-in (rules REC-1, REC-3) and, where `[slurm]
outputs_roots` is set, the job's log under one of them (rule REC-25): the daemon lays out the new
job's directory there (rule REC-18), and a job elsewhere is one the site did not point it at —
on a shared cluster, another team's daemon's and jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import queue
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from jobdiagd import clock
from jobdiagd.alerts import notices
from jobdiagd.alerts.incidents import make_notice, make_report
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.alerts.store import AlertStore
from jobdiagd.chat.auth import Sender
from jobdiagd.chat.model import ChatMessage
from jobdiagd.chat.ports import TaskError
from jobdiagd.config import Config
from jobdiagd.detectors import failure, hang
from jobdiagd.edge_trigger import EdgeTrigger
from jobdiagd.logsetup import get_logger
from jobdiagd.model.alerts import Finding, Incident, Notification
from jobdiagd.model.kinds import FailureClass, IncidentKind, JobStatus
from jobdiagd.recovery.book import Intent
from jobdiagd.recovery.manager import Outcome, RecoveryManager
from jobdiagd.recovery.messages import (
    countdown_text,
    outcome_body,
    outcome_title,
    refusal_text,
    restarted_text,
)
from jobdiagd.recovery.nodes import (
    DrainRefused,
    NodeEvidence,
    render_suspects,
    suspects_from,
    suspects_from_diagnosis,
)
from jobdiagd.recovery.policy import Case, Decision
from jobdiagd.recovery.slurm_ops import SlurmOpError, SlurmOps
from jobdiagd.rules.hostlist import valid_host
from jobdiagd.service.jobs import JobView
from jobdiagd.service.stages import Batch, StageContext

# The incidents a restart answers (rules REC-4 to REC-7): a hang, and a failure whose class is one.
RECOVERED_KINDS = frozenset({hang.KIND, failure.KIND})
# What the thread's replies about a restart are (reports of the old job: under its incident message).
REPORT_KIND = IncidentKind.RECOVERY
ANNOTATION = "recovery"  # the incident snapshot's key (`chat.buttons.recovery_status` reads it)
FINAL = ("done", "cancelled", "failed", "dry-run", "refused")
MIN_WAIT_S = 0.2
PRUNE_EVERY_S = 86400.0
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Prep:
    """What a decision about one job needs from the tick (the incident is looked up in observe)."""

    job_id: str
    kind: str | None  # the finding's incident kind; None: a failed end (any open incident of the job)
    owner: str | None
    partition: str | None
    failure_class: str | None
    nodes: tuple[str, ...]
    last_step: int | None
    evidence: tuple[NodeEvidence, ...]
    ours: bool = True  # its log is under an outputs root (rule REC-25)
    decide: bool = True  # False: only what it says of nodes (a TGS slide's slow host)


@dataclass(frozen=True, slots=True)
class _Continued:
    old: str
    new: str
    restored: int | None
    owner: str | None


class _Thread:
    """One daemon thread that runs calls in order: the worker's store connection lives in it."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def call(self, fn: Callable[[], _T]) -> _T:
        self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[_T] = self._loop.create_future()
        if not self._thread.is_alive():
            self._thread.start()
        self._queue.put((fn, fut))
        return await fut

    def stop(self) -> None:
        self._queue.put(None)

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, fut = item
            try:
                result, error = fn(), None
            except BaseException as exc:  # handed to the caller, raised there
                result, error = None, exc
            loop = self._loop
            if loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(_settle, fut, result, error)
                except RuntimeError:
                    return  # the loop closed meanwhile: the daemon is gone


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class RecoveryWiring:
    """Recovery in the running daemon (module docstring); the engine's `recovery` stage."""

    def __init__(
        self,
        cfg: Config,
        pipeline: AlertPipeline,
        *,
        on_action: Callable[[str, str], None] | None = None,
        now: Callable[[], float] = clock.wall,
    ) -> None:
        self.cfg = cfg
        self.pipeline = pipeline
        self.on_action = on_action  # (action, rule): the self-metrics count it
        self._now = now
        env = {"SLURM_CONF": str(cfg.slurm.slurm_conf)} if cfg.slurm.slurm_conf else {}
        self.ops = SlurmOps(env, timeout_s=cfg.slurm.command_timeout_seconds)
        self.manager = self._manager(pipeline.store)  # the event loop's: the pipeline's connection
        self._worker: RecoveryManager | None = None  # the worker thread's, on its own connection
        self._thread = _Thread("jobdiagd-recovery")
        self.wake = asyncio.Event()
        self._log = get_logger(component="recovery")
        self._edge = EdgeTrigger("recovery", kind="recovery", logger=self._log)
        self._annotated: dict[str, set[str]] = {}  # job -> incidents showing its restart
        self._continued: set[str] = set()  # restarted jobs whose "restarted as" line was posted
        self._parents = self._load_parents()  # restarted job -> the job it replaces
        self._pruned_at = 0.0
        self._restore_annotations()

    def _manager(self, store: AlertStore) -> RecoveryManager:
        return RecoveryManager(
            self.cfg.recovery,
            store,
            self.ops,
            work_dir=Path(self.cfg.daemon.state_dir) / "recovery",
            outputs_roots=self.cfg.slurm.outputs_roots,
            now=self._now,
        )

    @property
    def _roots(self) -> Sequence[Path]:
        return self.cfg.slurm.outputs_roots

    @property
    def acts(self) -> bool:
        """Restarts are possible at all (a mode other than off, or an override that may give one)."""
        rc = self.cfg.recovery
        return rc.mode != "off" or any(o.mode != "off" for o in rc.overrides)

    def reconfigure(self, cfg: Config) -> None:
        """SIGHUP: the new [recovery] settings apply to the next decision and action."""
        self.cfg = cfg
        for mgr in (self.manager, self._worker):
            if mgr is not None:
                mgr.cfg = cfg.recovery
                mgr.executor.cfg = cfg.recovery

    # -- start-up ---------------------------------------------------------------------------

    def _load_parents(self) -> dict[str, str]:
        rows = self.pipeline.store.conn.execute("SELECT job_id, parent FROM recovery_runs").fetchall()
        return {str(r["job_id"]): str(r["parent"]) for r in rows if r["job_id"] != r["parent"]}

    def _restore_annotations(self) -> None:
        """The countdowns and suggestions still open show again in their messages' next edits."""
        for intent in self.manager.pending():
            for inc in self._incidents_of(intent):
                self._annotate(inc, _intent_state(intent))

    # -- the stage --------------------------------------------------------------------------

    def plan(self, batch: Batch, ctx: StageContext) -> Batch:
        """The stage (module docstring). A fault here is logged; it never stops the page."""
        try:
            preps, resolved = self._preps(batch, ctx)
            batch.findings += self._restarted_resolutions(batch.ending, ctx.now)
            continued = self._continuations(ctx)
        except Exception as exc:
            self._log.error("recovery_stage_failed", error=f"{type(exc).__name__}: {exc}")
            return batch
        if preps or resolved or continued:
            batch.within.append(lambda now: self._within(now, preps, resolved, continued))
        return batch

    def _preps(self, batch: Batch, ctx: StageContext) -> tuple[list[_Prep], list[str]]:
        preps: list[_Prep] = []
        resolved: list[str] = []
        for f in batch.findings:
            if f.kind == IncidentKind.TGS_DEGRADATION and not f.resolved:
                slow = self._slow_host_prep(ctx.views.get(f.job_id), f)
                preps += [slow] if slow is not None else []
                continue
            if f.kind not in RECOVERED_KINDS:
                continue
            if f.resolved:
                if f.kind == hang.KIND:
                    resolved.append(f.job_id)  # steps resumed: nothing to restart any more
                continue
            view = ctx.views.get(f.job_id)
            if view is not None:
                preps.append(self._finding_prep(view, f, ctx.now))
        for key in batch.ending:
            view = ctx.views.get(key)
            prep = self._end_prep(view, ctx.now) if view is not None else None
            if prep is not None:
                preps.append(prep)
        preps += self._diagnosis_preps(ctx)
        return preps, resolved

    def _diagnosis_preps(self, ctx: StageContext) -> list[_Prep]:
        """The end-of-job playbooks that finished (a failed RAY=1 job's report, released by the
        enricher): the hosts they name go to node memory (rule REC-20). The job has left the
        watch by then; its restart was decided at its end."""
        docs = ctx.enricher.diagnoses if ctx.enricher is not None else {}
        out = []
        while docs:
            job_id, doc = docs.popitem()
            evidence = tuple(suspects_from_diagnosis(doc))
            if evidence:
                out.append(_Prep(job_id, None, None, None, None, (), None, evidence, decide=False))
        return out

    def _finding_prep(self, view: JobView, f: Finding, now: float) -> _Prep:
        """A hang names the GPU verdict's suspects (the page's and the early page's); a failure
        the hosts its triage's NODE_EXIT lines name for a hardware class (rule REC-20)."""
        if f.kind == hang.KIND:
            memo = view.gpu_check
            verdict = memo.verdict if memo is not None and memo.last_step == view.last_step else None
            evidence = suspects_from(finding=f, verdict=verdict)
            return _prep(view, f.kind, FailureClass.HANG, evidence, roots=self._roots, owner=f.owner)
        res = view.final or view.analysis(now)  # the failure detector's, cached on the view
        evidence = suspects_from(finding=f, triage=res)
        return _prep(view, f.kind, f.failure_class, evidence, roots=self._roots, owner=f.owner)

    def _slow_host_prep(self, view: JobView | None, f: Finding) -> _Prep | None:
        """A TGS slide whose slow host the site Prometheus named (its `suspect host`, rule SLOW-5):
        node memory's evidence only; a slowdown is never restarted (rule REC-2)."""
        evidence = suspects_from(finding=f)
        if view is None or not evidence:
            return None
        return dataclasses.replace(_prep(view, f.kind, None, evidence, roots=self._roots), decide=False)

    def _end_prep(self, view: JobView, now: float) -> _Prep | None:
        """A job whose end this tick confirms, failed by a class (not completed, not cancelled)."""
        res = view.final or view.analysis(now)
        if res.status in (JobStatus.COMPLETED, JobStatus.CANCELLED) or res.primary is None:
            return None
        return _prep(view, None, res.primary, suspects_from(triage=res), roots=self._roots)

    def _restarted_resolutions(self, ending: Sequence[str], now: float) -> list[Finding]:
        """The incidents of an ending job whose restart is done resolve "restarted as N"."""
        out: list[Finding] = []
        for key in ending:
            new = next(
                (i.new_job_id for i in self.manager.book.intents_for_job(key) if i.status == "done"), None
            )
            if new is None or new == key:
                continue
            for inc in self.pipeline.book.open_incidents():
                if inc.job_id == key:
                    out.append(
                        Finding(
                            "recovery",
                            key,
                            IncidentKind(inc.kind),
                            inc.severity,
                            f"restarted as {new}",
                            at_step=inc.last_step,
                            resolved=True,
                        )
                    )
        return out

    def _continuations(self, ctx: StageContext) -> list[_Continued]:
        """Restarted jobs watched whose restore line (or first step) was read: said once."""
        out = []
        for key, view in ctx.views.items():
            old = self._parents.get(key)
            if old is None or key in self._continued:
                continue
            auth = view.authoritative()
            restore = auth.restore if auth is not None else None
            if restore is None and view.last_step is None:
                continue  # neither read yet
            restored = restore.step if restore is not None and restore.kind == "restored" else None
            owner = view.slurm.user if view.slurm is not None else None
            out.append(_Continued(old, key, restored, owner))
        return out

    # -- inside observe's transaction -----------------------------------------------------------

    def _within(
        self, now: float, preps: list[_Prep], resolved: list[str], continued: list[_Continued]
    ) -> list[Notification]:
        out: list[Notification] = []
        for job in resolved:
            out += self._guarded(lambda job=job: self._keep_resolved(job, now), job)  # type: ignore[misc]
        for prep in preps:
            out += self._guarded(lambda prep=prep: self._consider(prep, now), prep.job_id)  # type: ignore[misc]
        for c in continued:
            out += self._guarded(lambda c=c: self._continued_line(c, now), c.new)  # type: ignore[misc]
        return out

    def _guarded(self, work: Callable[[], list[Notification]], job_id: str) -> list[Notification]:
        """A store error rolls observe's whole transaction back (raised); anything else is logged
        and leaves the page alone."""
        try:
            return work()
        except sqlite3.Error:
            raise
        except Exception as exc:
            self._log.error("recovery_failed", job_id=job_id, error=f"{type(exc).__name__}: {exc}")
            return []

    def _consider(self, prep: _Prep, now: float) -> list[Notification]:
        book = self.pipeline.book
        inc = self._incident(prep)
        out: list[Notification] = []
        if self.acts and prep.ours and prep.decide:
            case = Case(
                prep.job_id,
                prep.owner,
                prep.partition,
                prep.failure_class,
                nodes=prep.nodes,
                last_step=prep.last_step,
                incident_id=inc.id if inc is not None else None,
                acked=inc is not None and inc.acked_at is not None,
                muted=inc is not None and book.is_muted(inc.job_id, inc.kind, now),
                suspects=tuple(sorted({e.node for e in prep.evidence})),
            )
            decision, intent = self.manager.consider(case, now)
            state = _intent_state(intent) if intent is not None else _refusal_state(prep.job_id, decision)
            if inc is not None and state is not None:
                out += self._show(inc, state, now)
        if prep.evidence:
            for n in self.manager.observe_nodes(prep.job_id, prep.evidence, now):
                notice = notices.suspect_node(n.node, n.text, n.drain_command, now)
                out.append(make_notice(notice.key, notice.title, notice.body, now, severity=notice.severity))
        return out

    def _incident(self, prep: _Prep) -> Incident | None:
        book = self.pipeline.book
        if prep.kind is not None:
            return book.get(prep.job_id, prep.kind)
        mine = {i.kind: i for i in book.open_incidents() if i.job_id == prep.job_id}
        return mine.get(failure.KIND) or mine.get(hang.KIND) or next(iter(mine.values()), None)

    def _keep_resolved(self, job_id: str, now: float) -> list[Notification]:
        kept = self.manager.keep(
            job_id, "jobdiagd", now, rule="REC-14", why="the hang resolved (steps resumed): nothing to restart"
        )
        out: list[Notification] = []
        for intent in kept:
            self._count("keep", "REC-14")
            for inc in self._incidents_of(intent):
                out += self._show(inc, _intent_state(intent), now)
        return out

    def _continued_line(self, c: _Continued, now: float) -> list[Notification]:
        self._continued.add(c.new)
        title = f"♻ {restarted_text(c.old, c.new, c.restored)}"
        body = f"Job {c.new} continues job {c.old}: its alerts follow in this thread."
        return [make_report(c.old, REPORT_KIND, f"continued:{c.new}", title, body, now, c.owner)]

    # -- the incident's message ------------------------------------------------------------------

    def _annotate(self, inc: Incident, state: dict[str, Any]) -> bool:
        """Show `state` in the incident's snapshot; False when it shows it already."""
        book = self.pipeline.book
        if book.snapshot(inc, inc.last_seen_at).get(ANNOTATION) == state:
            return False
        book.annotate(inc.id, ANNOTATION, state)
        self._annotated.setdefault(inc.job_id, set()).add(inc.id)
        return True

    def _show(self, inc: Incident, state: dict[str, Any], now: float) -> list[Notification]:
        """Inside a transaction: the annotation, and the `update` that edits the message in."""
        if not self._annotate(inc, state):
            return []
        return self.pipeline.book.updates([inc], str(state["text"]).split("\n", 1)[0], now)

    def _incidents_of(self, intent: Intent) -> list[Incident]:
        """The incidents showing the intent: its own and any other of the job annotated since,
        as they are now (the book's while open, the store's once resolved)."""
        ids = set(self._annotated.get(intent.job_id, set()))
        if intent.incident_id:
            ids.add(intent.incident_id)
        out = []
        for iid in sorted(ids):
            inc = self.pipeline.store.load_incident(iid)
            if inc is not None and inc.is_open:
                inc = self.pipeline.book.get(inc.job_id, inc.kind) or inc
            if inc is not None:
                out.append(inc)
        return out

    def _refresh(self, intent: Intent, now: float) -> None:
        """Outside a transaction: the incidents' messages show the intent's new state."""
        state = _intent_state(intent)
        for inc in self._incidents_of(intent):
            if self._annotate(inc, state):
                self.pipeline.refresh(inc, str(state["text"]).split("\n", 1)[0], now)
            if not inc.is_open and intent.status in FINAL:
                self.pipeline.book.annotate(inc.id, ANNOTATION, None)  # its last edit is queued

    # -- acting -----------------------------------------------------------------------------

    async def run(self, sleep: Callable[[float], Awaitable[bool]]) -> None:
        """The daemon's "recovery" task: run what is due, post it, wait for the next; never raises."""
        try:
            while True:
                await self.act(self._now())
                self._housekeeping(self._now())
                if await self._pause(sleep, self._wait()):
                    return
        finally:
            await self.close()

    async def act(self, now: float) -> list[Outcome]:
        """Run the intents due at `now` in the worker thread, then post each outcome."""
        try:
            due = self.manager.next_due()
            if due is None or due > now:
                return []
            outcomes = await self._thread.call(lambda: self._worker_manager().run_due(now))
            self._edge.success(now)
            self._publish(outcomes, self._now())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the next pass tries again; the intents wait in the store
            self._edge.failure(exc, now)
            return []
        return outcomes

    def _worker_manager(self) -> RecoveryManager:
        """In the worker thread: its manager on a store connection of its own (opened there)."""
        if self._worker is None:
            self._worker = self._manager(self.pipeline.store.connect_again())
        return self._worker

    def _publish(self, outcomes: Sequence[Outcome], now: float) -> None:
        for o in outcomes:
            intent = o.intent
            for e in o.entries:
                self._count(e.action, e.rule)
            if o.entries:
                self.pipeline.report(
                    intent.job_id,
                    REPORT_KIND,
                    f"{intent.id}:{intent.status}:{int(o.entries[0].at * 1000)}",
                    outcome_title(intent, o.error),
                    outcome_body(o.entries),
                    now,
                    owner=intent.plan.owner,
                )
            if intent.status == "done" and intent.new_job_id and intent.new_job_id != intent.job_id:
                self._parents[intent.new_job_id] = intent.job_id
            self._log.info(
                "recovery_outcome", job_id=intent.job_id, status=intent.status, new_job_id=intent.new_job_id
            )
            self._refresh(intent, now)

    def _wait(self) -> float:
        tick = self.cfg.daemon.tick_seconds
        due = self.manager.next_due()
        if due is None:
            return tick
        return min(tick, max(MIN_WAIT_S, due - self._now()))

    async def _pause(self, sleep: Callable[[float], Awaitable[bool]], seconds: float) -> bool:
        """Sleep `seconds` or until woken (a Restart pressed); True when the daemon stops."""
        self.wake.clear()
        sleeper = asyncio.ensure_future(sleep(seconds))
        waker = asyncio.ensure_future(self.wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sleeper, waker):
                if not t.done():
                    t.cancel()
            await asyncio.gather(sleeper, waker, return_exceptions=True)
        return sleeper.done() and not sleeper.cancelled() and bool(sleeper.result())

    def _housekeeping(self, now: float) -> None:
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        try:
            self.manager.memory.prune(now)
        except sqlite3.Error as exc:
            self._log.warning("node_memory_prune_failed", error=str(exc))

    async def close(self) -> None:
        """Close the worker's store connection in its thread, then end the thread."""
        worker, self._worker = self._worker, None
        if worker is not None:
            # A Slurm command still in flight: the daemon thread ends with the process.
            with contextlib.suppress(TimeoutError, sqlite3.Error):
                await asyncio.wait_for(self._thread.call(worker.store.close), 5.0)
        self._thread.stop()

    def _count(self, action: str, rule: str) -> None:
        if self.on_action is not None:
            self.on_action(action, rule)

    # -- people (the chat backend calls these) -----------------------------------------------------

    def keep(self, job_id: str, by: str, now: float, *, rule: str = "REC-14", why: str | None = None) -> list[Intent]:
        """Keep the job (rule REC-14) or an ack / a mute (rule REC-9, `job_id` "*": every job):
        the pending restarts are cancelled and their messages say so."""
        jobs = {i.job_id for i in self.manager.pending()} if job_id == "*" else {job_id}
        kept: list[Intent] = []
        for job in sorted(jobs):
            kept += self.manager.keep(job, by, now, rule=rule, why=why)
        for intent in kept:
            self._count("keep", rule)
            self._refresh(intent, now)
        return kept

    def is_operator(self, sender: Sender) -> bool:
        ops = self.cfg.recovery.operators
        return sender.user_id in ops or bool(sender.user_name and sender.user_name in ops)

    def is_owner(self, sender: Sender, owner: str | None) -> bool:
        """`[recovery] chat_users` says this chat account is the job's owner (never a chat name)."""
        return owner is not None and f"{owner}={sender.user_id}" in self.cfg.recovery.chat_users

    def approve(self, job_id: str, sender: Sender, *, operator: bool, now: float) -> tuple[str, bool]:
        """Restart pressed on a suggestion: (what to tell the presser, whether it starts)."""
        waiting = [i for i in self.manager.book.intents_for_job(job_id) if i.status == "suggested"]
        if not waiting:
            return f"No suggested restart of job {job_id} is waiting.", False
        allowed = operator or self.is_operator(sender) or self.is_owner(sender, waiting[0].plan.owner)
        approved = self.manager.approve(job_id, sender.label, allowed=allowed, now=now)
        if approved is None:
            if not allowed:
                self._count("approve-refused", "REC-14")
                return "⛔ Only the job's owner or an operator may restart it.", False
            return f"No suggested restart of job {job_id} is waiting.", False
        self._count("approve", approved.plan.rule)
        self._refresh(approved, now)
        self.wake.set()
        return f"♻ Restart of job {job_id} approved by {sender.label}: it starts now.", True

    async def drain(self, node: str, by: str, *, operator: bool) -> str:
        """Drain `node` in the worker thread (rule REC-23); TaskError when refused or failed."""
        if not valid_host(node):
            raise TaskError(f"not a node name: {node[:64]!r}")
        now = self._now()
        try:
            said = await self._thread.call(
                lambda: self._worker_manager().drain(node, by=by, is_operator=operator, now=now)
            )
        except DrainRefused as exc:
            self._count("drain-refused", "REC-23")
            raise TaskError(str(exc)) from None
        except (SlurmOpError, ValueError) as exc:
            raise TaskError(str(exc)) from None
        self._count("drain", "REC-23")
        return said

    def nodes(self, now: float) -> ChatMessage:
        suspects = self.manager.memory.suspects(now, 0.1)
        title = f"{len(suspects)} suspect node(s)" if suspects else "no suspect nodes"
        return ChatMessage(title, render_suspects(suspects, now) if suspects else "", preformatted=True)

    def snapshot(self, now: float) -> dict[str, Any]:
        """For `jobdiagd status`: the mode and every restart not yet finished."""
        return {
            "mode": self.cfg.recovery.mode,
            "acts": self.acts,
            "pending": [
                {
                    "job_id": i.job_id,
                    "status": i.status,
                    "due_at": i.due_at,
                    "action": i.plan.action,
                    "rule": i.plan.rule,
                    "incident_id": i.incident_id,
                }
                for i in self.manager.pending()
            ],
        }

    def pending_counts(self) -> dict[str, int]:
        """Open intents by status (the self-metrics' gauge)."""
        out: dict[str, int] = {}
        for i in self.manager.pending():
            out[i.status] = out.get(i.status, 0) + 1
        return out


def under_outputs_roots(view: JobView, roots: Sequence[Path]) -> bool:
    """Rule REC-25: the job's log (or directory) is under a configured outputs root; any job when
    none is configured. Symlinks resolved on both sides."""
    if not roots:
        return True
    where = view.ref.log or view.ref.job_dir
    if where is None:
        return False
    real = Path(os.path.realpath(where))
    return any(real.is_relative_to(os.path.realpath(r)) for r in roots)


def _prep(
    view: JobView,
    kind: str | None,
    cls: str | None,
    evidence: Sequence[NodeEvidence],
    *,
    roots: Sequence[Path],
    owner: str | None = None,
) -> _Prep:
    slurm = view.slurm
    return _Prep(
        job_id=view.key,
        kind=kind,
        owner=owner or (slurm.user if slurm is not None else None) or None,
        partition=(slurm.partition or None) if slurm is not None else None,
        failure_class=cls,
        nodes=tuple(n for n in slurm.node_list if valid_host(n)) if slurm is not None else (),
        last_step=view.last_step,
        evidence=tuple(evidence),
        ours=under_outputs_roots(view, roots),
    )


def _intent_state(intent: Intent) -> dict[str, Any]:
    """What the incident's snapshot says of its restart (text as of the intent's last change)."""
    counting = intent.status == "scheduled" and not intent.progress.get("approved_by")
    return {
        "status": intent.status,
        "due_at": intent.due_at if counting else None,  # a countdown's end, shown as a clock time
        "text": countdown_text(intent, intent.updated_at),
    }


def _refusal_state(job_id: str, decision: Decision) -> dict[str, Any] | None:
    """Why nothing is done, shown once the owner opted in (a job of others says nothing)."""
    if decision.plan is not None or decision.mode == "off":
        return None
    return {"status": "refused", "due_at": None, "text": refusal_text(job_id, decision)}
