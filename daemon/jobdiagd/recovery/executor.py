"""One intent's steps, each idempotent and re-checked against Slurm (rules REC-12, REC-13, REC-16 to REC-18).

Resubmit (the default method, rule REC-16):
  1. capture  the job's settings and batch script (`scontrol show job`, `scontrol write
              batch_script`), stored in the intent before anything changes;
  2. look     for a job whose comment carries the restart marker of the old job: one exists when
              another daemon (or this one, before a crash) submitted already — then skip to 5;
  3. cancel   the old job if Slurm still has it active;
  4. submit   the script with the recorded settings, the plan's changes, the marker comment, held;
  5. elect    among the marker jobs not cancelled, the lowest id wins: a daemon whose own job lost
              cancels it; every daemon releases the winner (rule REC-12: Slurm is the lock);
  6. lay out  the new job's directory (`<id>-<name>/` with `log` and `artifact` links), as
              maxtext-slurm's submit.sh does after sbatch (rule REC-18);
  7. record   the new run (chain, attempt, progress baseline) and mark the intent done.
A kill -9 anywhere leaves the intent `running`; on restart it resumes: the marker look finds a job
submitted before the crash, and the cancel is not repeated on a job already ended. So a restart
is never lost and never doubled.

Requeue (`method = "requeue"`): capture (with Slurm's restart count), `scontrol requeue` unless the
count already moved, then `scontrol update ExcNodeList=` while it is pending.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shlex
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobdiagd.config import RecoveryConfig
from jobdiagd.logsetup import get_logger
from jobdiagd.privatefs import ensure_private_dir
from jobdiagd.recovery.book import Intent, LogEntry, RecoveryBook
from jobdiagd.recovery.policy import Plan, RunInfo
from jobdiagd.recovery.slurm_ops import ACTIVE_STATES, JobSpec, SlurmOpError, SlurmOps, check_hosts
from jobdiagd.rules.hostlist import parse_hostlist
from jobdiagd.rules.recovery import restart_marker

_log = get_logger(component="recovery")
# Variables the resubmitted job's environment starts from (rule REC-17); never the daemon's own
# environment, which may hold chat tokens.
BASE_ENV_KEYS = ("PATH", "LANG", "TZ", "SLURM_CONF")
# maxtext-slurm's submit_cmd.txt starts with the variables submit.sh read (JOB_WORKSPACE, RAY).
_SUBMIT_CMD_VARS = ("JOB_WORKSPACE", "RAY")
_MAX_SCRIPT = 4 * 1024 * 1024
MAX_RETRIES = 10
RETRY_DELAY_S = 30.0
_STEP_HOOK = Callable[[str, Intent], None]


class ExecutionError(Exception):
    """The intent cannot be carried out (the message says why, for the log and the chat)."""


@dataclass
class Executor:
    ops: SlurmOps
    book: RecoveryBook
    cfg: RecoveryConfig
    work_dir: Path  # private: the batch scripts handed to sbatch
    outputs_roots: Sequence[Path] = ()
    now: Callable[[], float] = field(default=lambda: 0.0)
    # Called after each step with its name (tests kill the process here).
    hook: _STEP_HOOK | None = None

    def execute(self, intent: Intent, actor: str) -> Intent:
        """Carry the intent to `done`; ExecutionError when it cannot be (now).

        A Slurm command that fails (slurmctld restarting, a timeout) leaves the intent `running`,
        retried after RETRY_DELAY_S, up to MAX_RETRIES times: a cancel that went through must not
        lose its submit to a passing fault (rule REC-13). Anything else — a job Slurm forgot, a
        refusal — marks it `failed` at once.
        """
        if intent.status != "running":
            intent = self.book.update(intent, self.now(), status="running")
        try:
            if intent.plan.method == "requeue":
                return self._requeue(intent, actor)
            return self._resubmit(intent, actor)
        except SlurmOpError as exc:
            current = self.book.intent(intent.id) or intent
            retries = int(current.progress.get("retries", 0)) + 1
            if retries > MAX_RETRIES:
                return self._fail(current, actor, f"{exc} (gave up after {MAX_RETRIES} retries)", exc)
            self._log(current, actor, "retry", exc.argv, f"{exc.detail}: retry {retries} of {MAX_RETRIES}")
            self.book.update(
                current,
                self.now(),
                progress={**current.progress, "retries": retries, "retry_at": self.now() + RETRY_DELAY_S},
                result=str(exc)[:2000],
            )
            raise ExecutionError(str(exc)) from exc
        except (ExecutionError, ValueError, OSError) as exc:
            return self._fail(self.book.intent(intent.id) or intent, actor, str(exc), exc)

    def _fail(self, intent: Intent, actor: str, text: str, exc: Exception) -> Intent:
        self._log(intent, actor, "failed", (), text)
        self.book.update(intent, self.now(), status="failed", result=text[:2000])
        raise ExecutionError(text) from exc

    # -- steps ------------------------------------------------------------

    def _save(self, intent: Intent, step: str, **progress: Any) -> Intent:
        intent = self.book.update(intent, self.now(), progress={**intent.progress, **progress})
        if self.hook is not None:
            self.hook(step, intent)
        return intent

    def _log(self, intent: Intent, actor: str, action: str, argv: Sequence[str], outcome: str) -> None:
        entry = LogEntry(
            at=self.now(),
            job_id=intent.job_id,
            actor=actor,
            rule=intent.plan.rule,
            action=action,
            argv=tuple(argv),
            outcome=outcome,
            intent_id=intent.id,
        )
        self.book.log(entry)
        _log.info(
            "recovery_action",
            job_id=intent.job_id,
            intent=intent.id,
            actor=actor,
            rule=intent.plan.rule,
            action=action,
            command=entry.command,
            outcome=outcome,
        )

    def _capture(self, intent: Intent) -> tuple[Intent, JobSpec]:
        if "spec" in intent.progress:
            saved = intent.progress["spec"]
            return intent, JobSpec(intent.job_id, dict(saved["fields"]), str(saved["command"]))
        spec = self.ops.job(intent.job_id)
        if spec is None:
            raise ExecutionError(f"Slurm no longer knows job {intent.job_id}: nothing to restart from")
        script = self.ops.batch_script(intent.job_id) if intent.plan.method == "resubmit" else ""
        if len(script) > _MAX_SCRIPT:
            raise ExecutionError(f"job {intent.job_id}'s batch script is over {_MAX_SCRIPT >> 20} MiB")
        intent = self._save(
            intent,
            "captured",
            spec={"fields": dict(spec.fields), "command": spec.command},
            script=script,
            restarts=spec.restarts,
        )
        return intent, spec

    def _cancel_old(self, intent: Intent, actor: str) -> Intent:
        if intent.progress.get("cancelled"):
            return intent
        current = self.ops.job(intent.job_id)
        argv = self.ops.cancel_argv(intent.job_id)
        if current is not None and current.state in ACTIVE_STATES:
            # Tell a peer daemon this end is a restart, not a person (rules REC-12, REC-14).
            with contextlib.suppress(SlurmOpError):
                self.ops.run(self.ops.tag_restarting_argv(intent.job_id, current.get("Comment")))
            self.ops.cancel(intent.job_id)
            self._log(intent, actor, "cancel", argv, f"job {intent.job_id} cancelled")
        return self._save(intent, "cancelled", cancelled=True)

    def _resubmit(self, intent: Intent, actor: str) -> Intent:
        intent, spec = self._capture(intent)
        plan = intent.plan
        existing = self._live_marker_jobs(plan.job_id)
        if not existing and "submitted" not in intent.progress:
            intent = self._cancel_old(intent, actor)
            argv, env, script = self._submission(intent, spec)
            new_id = self.ops.submit(argv, env)
            script.unlink(missing_ok=True)
            self._log(intent, actor, "submit", argv, f"submitted job {new_id} (held until elected)")
            intent = self._save(intent, "submitted", submitted=new_id)
        elif not intent.progress.get("cancelled"):
            intent = self._cancel_old(intent, actor)
        winner = self._elect(intent, actor)
        self._lay_out_job_dir(spec, winner)
        return self._finish(intent, actor, winner)

    def _live_marker_jobs(self, old_id: str) -> list[str]:
        return [jid for jid, state in self.ops.marker_jobs(old_id) if not state.startswith("CANCELLED")]

    def _elect(self, intent: Intent, actor: str) -> str:
        """Rule REC-12: the lowest live marker job is the restart; ours is withdrawn if it lost."""
        live = self._live_marker_jobs(intent.job_id)
        mine = intent.progress.get("submitted")
        if not live:
            raise ExecutionError(f"the restart of job {intent.job_id} was cancelled before it was released")
        winner = min(live, key=int)
        if mine and mine != winner and mine in live:
            argv = self.ops.cancel_argv(mine)
            self.ops.cancel(mine)
            self._log(
                intent, actor, "withdraw", argv, f"job {mine} withdrawn: job {winner} restarts it already"
            )
        self.ops.release(winner)
        self._log(intent, actor, "release", ["scontrol", "release", winner], f"job {winner} released")
        return winner

    def _finish(self, intent: Intent, actor: str, new_id: str) -> Intent:
        plan = intent.plan
        self.book.add_run(
            RunInfo(
                job_id=new_id,
                attempt=plan.attempt,
                chain=plan.chain,
                parent=plan.job_id,
                parent_last_step=plan.last_step,
                no_progress=plan.no_progress,
                family=plan.family,
                excluded=plan.exclude,
                started_at=self.now(),
            )
        )
        done = self.book.update(
            intent, self.now(), status="done", new_job_id=new_id, result=f"restarted as {new_id}"
        )
        self._log(done, actor, "done", (), f"job {plan.job_id} restarted as {new_id}")
        return done

    def _requeue(self, intent: Intent, actor: str) -> Intent:
        intent, spec = self._capture(intent)
        if spec.get("Requeue") == "0":
            raise ExecutionError(
                f"job {intent.job_id} is not requeue-able (Requeue=0): use method = resubmit"
            )
        current = self.ops.job(intent.job_id)
        if current is None:
            raise ExecutionError(f"Slurm no longer knows job {intent.job_id}")
        if current.restarts <= int(intent.progress.get("restarts", 0)):
            argv = self.ops.requeue_argv(intent.job_id)
            try:
                self.ops.run(argv)
            except SlurmOpError:
                again = self.ops.job(intent.job_id)
                if again is None or again.restarts <= int(intent.progress.get("restarts", 0)):
                    raise
            self._log(intent, actor, "requeue", argv, f"job {intent.job_id} requeued")
            intent = self._save(intent, "requeued", requeued=True)
        if intent.plan.exclude:
            argv = self.ops.exclude_argv(intent.job_id, _merge(spec.get("ExcNodeList"), intent.plan.exclude))
            self.ops.run(argv)
            self._log(intent, actor, "exclude", argv, "excluded while pending")
        return self._finish(intent, actor, intent.job_id)

    # -- the new job ------------------------------------------------------

    def _submission(self, intent: Intent, spec: JobSpec) -> tuple[list[str], dict[str, str], Path]:
        work = ensure_private_dir(self.work_dir)
        script = work / f"{intent.id.replace(':', '-')}.sbatch"
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(str(intent.progress.get("script", "")))
        owner = spec.user
        argv = sbatch_argv(spec, intent.plan, script, running_as=_me(), owner=owner)
        # The base: this process's PATH/LANG plus the Slurm client settings the daemon uses.
        env = job_env(spec, intent.plan, self.cfg, self.outputs_roots, base=self.ops.env())
        return argv, env, script

    def _lay_out_job_dir(self, spec: JobSpec, new_id: str) -> None:
        try:
            lay_out_job_dir(spec, new_id, self.outputs_roots)
        except OSError as exc:
            _log.warning("recovery_job_dir_failed", job_id=new_id, error=str(exc))


def _me() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _merge(old: str | None, new: Sequence[str]) -> list[str]:
    names = [n for n in (old or "").split(",") if n] + list(new)
    try:
        expanded = [h for part in names for h in parse_hostlist(part)]
    except ValueError:
        expanded = list(new)
    return sorted(set(check_hosts([h for h in expanded if h])))


def _new_output(path: str | None, old_id: str) -> str | None:
    """The old job's expanded output path with its id turned back into `%j` (rule REC-16)."""
    if not path:
        return None
    p = Path(path)
    # `%j-%x.log` (maxtext-slurm, the sim): the id starts the name. Else the first id standing
    # between separators; never inside a word ("llama3.1" for job 1).
    name, n = re.subn(rf"\A{re.escape(old_id)}(?=[-_.]|\Z)", "%j", p.name)
    if not n:
        name = re.sub(rf"(?<=[-_]){re.escape(old_id)}(?=[-_.]|\Z)", "%j", p.name, count=1)
    return str(p.with_name(name))


def sbatch_argv(spec: JobSpec, plan: Plan, script: Path, *, running_as: str, owner: str | None) -> list[str]:
    """sbatch with the job's recorded settings and the plan's changes, held (rule REC-16)."""
    argv = ["sbatch", "--parsable", "--hold", f"--comment={restart_marker(plan.job_id)}"]
    simple = {
        "JobName": "--job-name",
        "Partition": "--partition",
        "Account": "--account",
        "QOS": "--qos",
        "Reservation": "--reservation",
        "Features": "--constraint",
        "WorkDir": "--chdir",
    }
    for key, opt in simple.items():
        value = spec.get(key)
        if value:
            argv.append(f"{opt}={value}")
    limit = spec.get("TimeLimit")
    if limit and limit not in ("UNLIMITED", "Partition_Limit"):
        argv.append(f"--time={limit}")
    nodes = (spec.get("NumNodes") or "").split("-")[0]
    if nodes.isdigit():
        argv.append(f"--nodes={nodes}")
    tasks = spec.get("NumTasks") or ""
    if tasks.isdigit():
        argv.append(f"--ntasks={tasks}")
    cpus = spec.get("CPUs/Task") or ""
    if cpus.isdigit():
        argv.append(f"--cpus-per-task={cpus}")
    if spec.get("OverSubscribe") == "NO":
        argv.append("--exclusive")
    out = _new_output(spec.get("StdOut"), spec.job_id)
    err = _new_output(spec.get("StdErr"), spec.job_id)
    if out:
        argv.append(f"--output={out}")
    if err and err != out:
        argv.append(f"--error={err}")
    exclude = _merge(spec.get("ExcNodeList"), plan.exclude)
    if exclude:
        argv.append(f"--exclude={','.join(exclude)}")
    if plan.nodelist:
        argv.append(f"--nodelist={','.join(check_hosts(plan.nodelist))}")
    argv.append("--export=ALL")
    if owner and owner != running_as:
        if os.geteuid() != 0:
            raise ExecutionError(
                f"job {spec.job_id} belongs to {owner}: resubmitting it as {running_as} needs root "
                "(sbatch --uid), or method = requeue with Slurm operator rights"
            )
        argv.append(f"--uid={owner}")
    argv.append(str(script))
    argv += command_args(spec.command)
    return argv


def command_args(command: str) -> list[str]:
    """The batch script's arguments from Slurm's space-joined Command (rule REC-16): split on single
    spaces, so empty arguments (maxtext-slurm's empty EXP_TAG / alias) stay in place; an argument
    that itself contains a space cannot be told apart (Slurm joined them) and is split."""
    parts = command.split(" ")
    return parts[1:] if len(parts) > 1 else []


def _outputs_root_of(spec: JobSpec, roots: Sequence[Path]) -> Path | None:
    out = spec.get("StdOut")
    if not out:
        return None
    parent = Path(os.path.realpath(Path(out).parent))
    for root in roots:
        if parent == Path(os.path.realpath(root)):
            return parent
    return None


def _submit_cmd_vars(artifact: Path) -> dict[str, str]:
    """JOB_WORKSPACE / RAY from maxtext-slurm's artifact/submit_cmd.txt (`VAR=value ... ./submit.sh ...`)."""
    try:
        text = (artifact / "submit_cmd.txt").read_text(encoding="utf-8", errors="replace")[:65536]
        words = shlex.split(text.splitlines()[0]) if text.strip() else []
    except (OSError, ValueError):
        return {}
    out: dict[str, str] = {}
    for w in words:
        key, sep, value = w.partition("=")
        if not sep or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            break
        if key in _SUBMIT_CMD_VARS:
            out[key] = value
    return out


def job_env(
    spec: JobSpec, plan: Plan, cfg: RecoveryConfig, roots: Sequence[Path], *, base: Mapping[str, str]
) -> dict[str, str]:
    """The resubmitted job's environment (rule REC-17): a clean base, the owner's identity,
    what maxtext-slurm's submit.sh exported (from the job directory's artifact link and its
    submit_cmd.txt), the site's `resubmit_env`, then the plan's changes (NCCL_DEBUG=INFO)."""
    env = {k: base[k] for k in BASE_ENV_KEYS if k in base}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    owner = spec.user
    if owner:
        try:
            pw = pwd.getpwnam(owner)
            env.update(USER=owner, LOGNAME=owner, HOME=pw.pw_dir)
        except KeyError:
            env.update(USER=owner, LOGNAME=owner)
    root = _outputs_root_of(spec, roots)
    name = spec.get("JobName")
    if root is not None and name:
        artifact = root / f"{spec.job_id}-{name}" / "artifact"
        if artifact.is_symlink() or artifact.is_dir():
            real = Path(os.path.realpath(artifact))
            if real.is_relative_to(root) and real.is_dir():
                env["MAXTEXT_SLURM_DIR"] = str(real)
                env["JOB_WORKSPACE"] = str(root)
                recorded = _submit_cmd_vars(real)
                env.update({k: v for k, v in recorded.items() if k == "JOB_WORKSPACE"})
                if recorded.get("RAY") in ("1", "true"):
                    env["USE_RAY"] = "true"
                    env["LOGIN_NODE_HOSTNAME"] = f"{owner or env.get('USER', '')}@{socket.getfqdn()}"
    for assignment in cfg.resubmit_env:
        key, _, value = assignment.partition("=")
        env[key] = value
    env.update(plan.env)
    return env


def lay_out_job_dir(spec: JobSpec, new_id: str, roots: Sequence[Path]) -> Path | None:
    """`<root>/<new id>-<name>/` with `log` (and `artifact`, as the old one had) links, owned by
    the job's owner: what maxtext-slurm's submit.sh makes after sbatch (rule REC-18). Nothing
    outside a configured outputs root; an existing directory is left as it is."""
    root = _outputs_root_of(spec, roots)
    name = spec.get("JobName")
    if root is None or not name or "/" in name or name.startswith("."):
        return None
    old = root / f"{spec.job_id}-{name}"
    if not old.is_dir() or old.is_symlink():
        return None
    new = root / f"{new_id}-{name}"
    new.mkdir(mode=0o755, exist_ok=True)
    links = {"log": f"../{new_id}-{name}.log"}
    artifact = old / "artifact"
    if artifact.is_symlink():
        links["artifact"] = os.readlink(artifact)
    for link, target in links.items():
        path = new / link
        if not os.path.lexists(path):
            os.symlink(target, path)
    owner = spec.user
    if owner and os.geteuid() == 0:
        try:
            pw = pwd.getpwnam(owner)
        except KeyError:
            return new
        for path in (new, *(new / link for link in links)):
            os.lchown(path, pw.pw_uid, pw.pw_gid)
    return new
