"""Recovery under guardrails: restart a hung or failed job the way the runbook says, and remember
which nodes keep showing up in failures (docs/recovery.md; rules REC-1 to REC-30).

Modules, from judgement to I/O:
- `policy`: who and what may be acted on, and the plan (pure: plain data in, `Decision` out).
- `book`: the recovery tables of the state store (intents = the recovery outbox, runs, log).
- `slurm_ops`: the Slurm commands (validated argv, no shell), each logged.
- `executor`: one intent's steps, each idempotent and re-checkable after a crash.
- `nodes`: suspect-node memory (`suspects_from`, scores that decay, notices, drain).
- `manager`: the seams the daemon calls (`consider`, `keep`, `approve`, `run_due`).
- `messages`: what people read (countdown, action lines, "restarted as ...").
- `cli`: `jobdiagd nodes` and `jobdiagd recovery-log`.
"""
