"""The recovery tables of the state store: intents (the recovery outbox), runs, and the action log.

An intent is written in the caller's store transaction (rule REC-13): the post-judging stage that
opens an incident and decides to act writes the incident, its notification and the intent in one
commit, so a crash either loses all three (and the next tick decides again) or keeps all three.
An intent then moves `scheduled` -> `running` -> `done` | `failed`, or to `cancelled` (Keep the
job, an ack); `suggested` waits for a Restart press, `dry-run` and `refused` are records only.
Its `progress` (JSON) holds what each executed step learned — the job's settings and batch script
taken before the cancel, the new job's id — so a restarted daemon resumes it, never redoes it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from jobdiagd.alerts.store import AlertStore
from jobdiagd.recovery.policy import Plan, RunInfo

Status = Literal["suggested", "scheduled", "running", "done", "cancelled", "failed", "dry-run", "refused"]
OPEN_STATUSES: tuple[Status, ...] = ("suggested", "scheduled", "running")


def intent_id(job_id: str, attempt: int) -> str:
    """One intent per run: the job and the attempt its restart starts (a requeued job keeps its id)."""
    return f"rec:{job_id}:{attempt}"


@dataclass(frozen=True, slots=True)
class Intent:
    id: str
    job_id: str
    incident_id: str | None
    status: Status
    due_at: float | None
    created_at: float
    updated_at: float
    plan: Plan
    progress: dict[str, Any] = field(default_factory=dict)
    new_job_id: str | None = None
    result: str | None = None


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One action taken or declined (rule REC-15): who or what, why (rule id), the exact command."""

    at: float
    job_id: str
    actor: str
    rule: str
    action: str
    argv: tuple[str, ...]
    outcome: str
    intent_id: str | None = None

    @property
    def command(self) -> str:
        return shlex.join(self.argv) if self.argv else ""


class RecoveryBook:
    """Reads and writes the recovery tables; every write joins the caller's transaction if any."""

    def __init__(self, store: AlertStore) -> None:
        self.store = store

    # -- intents ---------------------------------------------------------

    def add_intent(self, intent: Intent) -> bool:
        """Store a new intent; False when one with its id exists (a repeat after a restart)."""
        with self.store.transaction() as conn:
            cur = conn.execute(
                "INSERT OR IGNORE INTO recovery_intents (id, job_id, incident_id, status, due_at, created_at,"
                " updated_at, plan, progress, new_job_id, result) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    intent.id,
                    intent.job_id,
                    intent.incident_id,
                    intent.status,
                    intent.due_at,
                    intent.created_at,
                    intent.updated_at,
                    intent.plan.to_json(),
                    json.dumps(intent.progress, sort_keys=True),
                    intent.new_job_id,
                    intent.result,
                ),
            )
        return cur.rowcount == 1

    def intent(self, iid: str) -> Intent | None:
        row = self.store.conn.execute("SELECT * FROM recovery_intents WHERE id = ?", (iid,)).fetchone()
        return None if row is None else _intent(row)

    def intents_for_job(self, job_id: str) -> list[Intent]:
        rows = self.store.conn.execute(
            "SELECT * FROM recovery_intents WHERE job_id = ? ORDER BY created_at, rowid", (job_id,)
        )
        return [_intent(r) for r in rows]

    def open_intents(self) -> list[Intent]:
        rows = self.store.conn.execute(
            "SELECT * FROM recovery_intents WHERE status IN ('suggested', 'scheduled', 'running')"
            " ORDER BY created_at, rowid"
        )
        return [_intent(r) for r in rows]

    def due(self, now: float) -> list[Intent]:
        """Intents to execute now: scheduled ones past their countdown, and running ones (a crash
        interrupted them: they resume)."""
        rows = self.store.conn.execute(
            "SELECT * FROM recovery_intents WHERE status = 'running'"
            " OR (status = 'scheduled' AND due_at <= ?) ORDER BY due_at, rowid",
            (now,),
        )
        return [_intent(r) for r in rows]

    def update(self, intent: Intent, now: float, **changes: Any) -> Intent:
        new, _ = self._write(intent, now, (), changes)
        return new

    def update_if(self, intent: Intent, now: float, expect: Sequence[Status], **changes: Any) -> Intent | None:
        """`update`, only while the stored intent's status is one of `expect` (None: it moved on).

        Two parts of a daemon act on one intent — the event loop (Keep the job, an ack, Restart)
        and the worker thread that runs due intents — each with its own store connection; the
        condition is checked in the UPDATE itself, so exactly one of them moves it."""
        new, moved = self._write(intent, now, expect, changes)
        return new if moved else None

    def _write(
        self, intent: Intent, now: float, expect: Sequence[Status], changes: dict[str, Any]
    ) -> tuple[Intent, bool]:
        """The intent with `changes`, and whether the stored row was updated (only while its
        status is one of `expect`, when given)."""
        new = replace(intent, updated_at=now, **changes)
        sql = (
            "UPDATE recovery_intents SET status = ?, due_at = ?, updated_at = ?, progress = ?,"
            " new_job_id = ?, result = ? WHERE id = ?"
        )
        if expect:
            sql += f" AND status IN ({', '.join('?' for _ in expect)})"
        values = (
            new.status,
            new.due_at,
            new.updated_at,
            json.dumps(new.progress, sort_keys=True),
            new.new_job_id,
            new.result,
            new.id,
            *expect,
        )
        with self.store.transaction() as conn:
            cur = conn.execute(sql, values)
        return new, cur.rowcount == 1

    def started_since(self, since: float) -> int:
        """Restarts begun since `since` (rule REC-10): intents that left `scheduled` for execution."""
        row = self.store.conn.execute(
            "SELECT COUNT(*) FROM recovery_log WHERE action = 'restart' AND at >= ?", (since,)
        ).fetchone()
        return int(row[0])

    # -- runs ------------------------------------------------------------

    def add_run(self, run: RunInfo) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO recovery_runs (job_id, attempt, chain, parent, parent_last_step,"
                " no_progress, family, excluded, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run.job_id,
                    run.attempt,
                    run.chain,
                    run.parent,
                    run.parent_last_step,
                    run.no_progress,
                    run.family,
                    ",".join(run.excluded),
                    run.started_at,
                ),
            )

    def run_of(self, job_id: str) -> RunInfo | None:
        """The newest run of `job_id` a restart started (None: an original job)."""
        row = self.store.conn.execute(
            "SELECT * FROM recovery_runs WHERE job_id = ? ORDER BY attempt DESC LIMIT 1", (job_id,)
        ).fetchone()
        if row is None:
            return None
        return RunInfo(
            job_id=str(row["job_id"]),
            attempt=int(row["attempt"]),
            chain=str(row["chain"]),
            parent=str(row["parent"]),
            parent_last_step=None if row["parent_last_step"] is None else int(row["parent_last_step"]),
            no_progress=int(row["no_progress"]),
            family=str(row["family"]),
            excluded=tuple(x for x in str(row["excluded"]).split(",") if x),
            started_at=float(row["started_at"]),
        )

    def continuation_of(self, job_id: str) -> str | None:
        """The job a restarted job replaces (for the daemon's "same incident thread")."""
        run = self.run_of(job_id)
        return None if run is None or run.parent == job_id else run.parent

    # -- log -------------------------------------------------------------

    def log(self, entry: LogEntry) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO recovery_log (at, intent_id, job_id, actor, rule, action, argv, outcome)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    entry.at,
                    entry.intent_id,
                    entry.job_id,
                    entry.actor,
                    entry.rule,
                    entry.action,
                    json.dumps(list(entry.argv)),
                    entry.outcome,
                ),
            )

    def entries(self, job_id: str | None = None, limit: int = 200) -> list[LogEntry]:
        sql = "SELECT * FROM recovery_log" + (" WHERE job_id = ?" if job_id else "") + " ORDER BY at, rowid"  # noqa: S608 (constant fragments)
        rows = self.store.conn.execute(sql, (job_id,) if job_id else ()).fetchall()[-limit:]
        return [
            LogEntry(
                at=float(r["at"]),
                job_id=str(r["job_id"]),
                actor=str(r["actor"]),
                rule=str(r["rule"]),
                action=str(r["action"]),
                argv=tuple(json.loads(r["argv"])),
                outcome=str(r["outcome"]),
                intent_id=r["intent_id"],
            )
            for r in rows
        ]


def _intent(row: Any) -> Intent:
    progress = json.loads(row["progress"] or "{}")
    return Intent(
        id=str(row["id"]),
        job_id=str(row["job_id"]),
        incident_id=row["incident_id"],
        status=row["status"],
        due_at=None if row["due_at"] is None else float(row["due_at"]),
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
        plan=Plan.from_json(row["plan"]),
        progress=progress if isinstance(progress, dict) else {},
        new_job_id=row["new_job_id"],
        result=row["result"],
    )


def argv_text(argv: Sequence[str]) -> str:
    return shlex.join(argv)
