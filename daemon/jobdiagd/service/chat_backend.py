"""The chat router's view of the running daemon: status, jobs, incidents, and long commands run as
worker processes with a timeout (the same `jobdiagd triage/diagnose/compare` a terminal runs).

Long commands run as child processes (`python -m jobdiagd.cli ...`, no shell, validated
arguments, cwd = the state dir) rather than in a `concurrent.futures` pool: a process that
overruns its timeout is killed with its whole process group (triage forks pre-filter workers),
which a pool cannot do to a running task. The router bounds how many run at once and queue;
the event loop only waits on pipes, so ticks and alerts never wait on a command. Ids are
located under the outputs roots (or the watched job's own files) here, never resolved
against the daemon's working directory.

A triage answers with the daemon's view of the job (rule VIEW-3), not the command's defaults:
the daemon's stall policy and instant always; for a job it watches, Slurm's state only when
squeue gave one (`--no-slurm` under outputs discovery: no Slurm to ask), and what the hang
detector knows of its progress on the daemon's clock (`--daemon-*`: since when no step was read,
the budget applied). The flags are made by `triage.cli.policy_argv`/`stall_argv` from typed
values, never from chat text. `/job` shows the same triage's status line (rule VIEW-4).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jobdiagd import clock
from jobdiagd.alerts.pipeline import AlertPipeline
from jobdiagd.chat.auth import Sender
from jobdiagd.chat.buttons import can_scancel
from jobdiagd.chat.commands import run_long
from jobdiagd.chat.model import ChatMessage
from jobdiagd.chat.ports import TaskError, TaskResult
from jobdiagd.config import Config
from jobdiagd.durations import exact_duration, rounded_duration
from jobdiagd.model.alerts import Incident
from jobdiagd.model.kinds import IncidentKind, StallBasis
from jobdiagd.service.engine import Engine
from jobdiagd.service.plots_bridge import PlotBridge, chart_payload
from jobdiagd.service.reading import Watched
from jobdiagd.service.recovery_wiring import RECOVERED_KINDS, RecoveryWiring
from jobdiagd.service.status_cli import PHONE_COLUMNS, format_status
from jobdiagd.triage.cli import policy_argv, stall_argv
from jobdiagd.tsdb.playbooks.registry import PLAYBOOKS

MAX_OUTPUT = 32 * 1024 * 1024
# A Slurm state word as the parser normalizes it (RUNNING, OUT_OF_MEMORY, ...): the only form
# passed on to `jobdiagd triage --slurm-state`.
_SLURM_STATE_RE = re.compile(r"[A-Z][A-Z_]{0,31}")


async def run_tool(
    argv: Sequence[str], *, cwd: Path | None, env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """Run `python -m jobdiagd.cli ARGV`; cancelling (the router's timeout) kills its process group."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jobdiagd.cli",
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(cwd) if cwd is not None else None,
        env=dict(env) if env is not None else None,
        start_new_session=True,
        limit=MAX_OUTPUT,
    )
    try:
        out, err = await proc.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        raise
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""


class DaemonChatBackend:
    """The daemon as the chat sees it (`chat.ports.ChatBackend`, and the `Worker` long commands run on)."""

    def __init__(
        self,
        cfg: Config,
        config_path: Path,
        engine: Engine,
        pipeline: AlertPipeline,
        snapshot: Callable[[], Mapping[str, Any]],
        *,
        plots: PlotBridge | None = None,
        recovery: RecoveryWiring | None = None,
        now: Callable[[], float] = clock.wall,
    ) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.engine = engine
        self.pipeline = pipeline
        self._snapshot = snapshot
        self.plots = plots
        self.recovery = recovery
        self._now = now

    # -- facts ------------------------------------------------------------------------

    @property
    def outputs_roots(self) -> Sequence[Path]:
        roots = list(self.cfg.slurm.outputs_roots)
        if self.engine.discovery is not None:
            roots += [d for d in self.engine.discovery.dirs() if d not in roots]
        return roots

    @property
    def playbooks(self) -> Sequence[str]:
        return sorted(PLAYBOOKS)

    def status(self, now: float) -> ChatMessage:
        text = format_status(self._snapshot(), now, width=PHONE_COLUMNS)
        return ChatMessage("jobdiagd status", text, preformatted=True)

    def _job_line(self, j: Mapping[str, Any], now: float) -> str:
        parts = [f"`{j['job_id']}` {j.get('state') or '-'}"]
        if j.get("name"):
            parts.append(str(j["name"]))
        if j.get("last_step") is not None:
            total = f"/{j['total_steps']}" if j.get("total_steps") else ""
            ago = (
                f" ({rounded_duration(now - float(j['last_step_at']))} ago)" if j.get("last_step_at") else ""
            )
            parts.append(f"step {j['last_step']}{total}{ago}")
        if j.get("step_time_s"):
            parts.append(f"{float(j['step_time_s']):.2f} s/step")
        if j.get("phase"):
            parts.append(f"[{j['phase']}]")
        tgs = j.get("tgs")
        if isinstance(tgs, Mapping) and tgs.get("change_pct") is not None:
            parts.append(
                f"TGS {float(tgs['change_pct']):+.0f}%" + (" DEGRADED" if tgs.get("degraded") else "")
            )
        if j.get("open_incidents"):
            parts.append("⚠ " + ", ".join(j["open_incidents"]))
        if j.get("blind"):
            parts.append("👁 blind")
        return " · ".join(parts)

    def jobs(self, now: float) -> ChatMessage:
        rows = self.engine.snapshot_jobs(now)
        if not rows:
            return ChatMessage("no jobs watched")
        return ChatMessage(
            f"{len(rows)} job(s) watched", "\n".join(f"- {self._job_line(j, now)}" for j in rows)
        )

    def job(self, job_id: str, now: float) -> ChatMessage | None:
        row = next((j for j in self.engine.snapshot_jobs(now) if j["job_id"] == job_id), None)
        if row is None:
            return None
        lines = [self._job_line(row, now)]
        if row.get("expected_step") is not None and row.get("expected_step") != row.get("last_step"):
            lines.append(f"- expected ≈ step {row['expected_step']} by now")
        if row.get("log"):
            lines.append(f"- log: `{row['log']}`")
        triage = self._triage_line(job_id, now)
        if triage:
            lines.append(triage)
        for inc in self.open_incidents(job_id, None):
            snap = self.pipeline.book.snapshot(inc, now)
            state = f"open {rounded_duration(now - inc.opened_at)}"
            if inc.acked_at is not None:
                state += f", acked by {inc.acked_by or 'someone'}"
            if snap.get("muted_until"):
                state += f", muted {rounded_duration(float(snap['muted_until']) - now)} more"
            lines.append(f"- incident `{inc.id}` ({inc.severity}): {inc.summary} — {state}")
        return ChatMessage(f"job {job_id}", "\n".join(lines))

    # -- incidents ----------------------------------------------------------------------

    def open_incidents(self, job_id: str, kind: str | None) -> list[Incident]:
        return [
            i
            for i in self.pipeline.book.open_incidents()
            if i.job_id == job_id and (kind is None or i.kind == kind)
        ]

    def incident(self, token: int) -> Incident | None:
        inc = self.pipeline.store.incident_by_token(token)
        if inc is not None and inc.is_open:
            # The book holds the current state (acks, reminders) of the incident still open.
            current = self.pipeline.book.get(inc.job_id, inc.kind)
            if current is not None and current.id == inc.id:
                return current
        return inc

    def incident_token(self, incident_id: str) -> int | None:
        return self.pipeline.store.incident_token(incident_id)

    def snapshot(self, incident: Incident, now: float) -> Mapping[str, Any]:
        return self.pipeline.book.snapshot(incident, now)

    def ack(self, incident: Incident, by: str, now: float) -> None:
        self.pipeline.ack(incident.job_id, incident.kind, now, by)
        if self.recovery is not None:  # an ack cancels a pending restart (rule REC-9)
            self.recovery.keep(incident.job_id, by, now, rule="REC-9", why=f"acked by {by}")

    def mute(self, job_id: str, kind: str, until: float, by: str, now: float) -> None:
        self.pipeline.mute(job_id, kind, until, now, by)
        if self.recovery is not None and (kind == "*" or kind in RECOVERED_KINDS):  # so does a mute (REC-9)
            self.recovery.keep(job_id, by, now, rule="REC-9", why=f"muted by {by}")

    def unmute(self, job_id: str, kind: str, by: str, now: float) -> bool:
        return self.pipeline.unmute(job_id, kind, now, by)

    # -- long commands ------------------------------------------------------------------

    def _locate(self, target: str) -> str:
        """An absolute path for a validated id or path: the watched job's own files, else a job
        directory or log named after the id under an outputs root (never the daemon's cwd), kept
        only if its real path stays under a root."""
        if os.path.isabs(target):
            return target  # chat.commands.path_under_roots checked it
        w = self.engine.jobs.get(target)
        if w is not None:
            ref = w.view.ref
            if ref.job_dir is not None:
                return str(ref.job_dir)
            if ref.log is not None:
                return str(ref.log)
        roots = [Path(os.path.realpath(r)) for r in self.outputs_roots]
        for root in roots:
            # The id is validated (letters, digits, _ . + -): no glob or path syntax in it.
            found = [root / target] + sorted(root.glob(f"{target}-*"))
            for cand in found:
                real = Path(os.path.realpath(cand))
                usable = real.is_dir() or (real.is_file() and real.suffix == ".log")
                if usable and any(real.is_relative_to(r) for r in roots):
                    return str(real)
        shown = ", ".join(str(r) for r in roots) or "(no outputs roots configured)"
        raise TaskError(f"job {target}: no {target}-* directory or log under {shown}")

    def _triage_line(self, job_id: str, now: float) -> str | None:
        """The status line of the job view's triage (rule VIEW-4): what the detectors and a Full
        triage conclude, with the daemon's clock on the stall when it has one."""
        w = self.engine.jobs.get(job_id)
        if w is None or w.view.main is None:
            return None
        res = w.view.final or w.view.analysis(now)
        line = f"- triage: {res.status}" + (f", primary {res.primary}" if res.primary else "")
        st = res.cls.stall
        if st is not None and st.basis == StallBasis.DAEMON and st.gap_s is not None:
            line += (
                f" — no step for {exact_duration(st.gap_s)} "
                f"(budget {exact_duration(st.budget_s)}, phase {st.phase})"
            )
        return line

    def _watched(self, target: str, path: str) -> Watched | None:
        """The watched job a triage target names: by id, or by its job directory or log (a
        `.log` names the directory beside it, rule RES-1)."""
        w = self.engine.jobs.get(target)
        if w is not None:
            return w
        dirs = {path, path.removesuffix(".log")}
        for cand in self.engine.jobs.values():
            ref = cand.view.ref
            if str(ref.job_dir) in dirs or str(ref.log) == path:
                return cand
        return None

    def _daemon_view_args(self, target: str, path: str, now: float) -> list[str]:
        """`jobdiagd triage` flags for the daemon's view of the job (rule VIEW-3)."""
        argv = ["--now", repr(now), *policy_argv(self.engine.policy)]
        w = self._watched(target, path)
        slurm = w.view.slurm if w is not None else None
        if slurm is not None and _SLURM_STATE_RE.fullmatch(slurm.state):
            argv += ["--slurm-state", slurm.state]
        elif slurm is not None or (
            self.engine.discovery is not None and self.engine.discovery.name == "outputs"
        ):
            argv.append("--no-slurm")
        known = self.engine.stall_knowledge(w.view.key, now) if w is not None else None
        return argv + (stall_argv(known) if known is not None else [])

    async def _tool(self, argv: list[str], what: str) -> str:
        rc, out, err = await run_tool(argv, cwd=self.cfg.daemon.state_dir)
        if rc != 0 and not out.strip():
            raise TaskError(f"{what}: {_last_line(err) or f'exit code {rc}'}")
        return out

    async def run_task(self, name: str, args: tuple[str, ...]) -> TaskResult:
        return await run_long(self, name, args)

    # -- what long commands run (`chat.ports.Worker`) --------------------------------------

    async def triage(self, target: str) -> str:
        path = self._locate(target)
        view = self._daemon_view_args(target, path, self._now())
        return await self._tool(["triage", path, *view], f"triage {target}")

    async def diagnose(self, target: str, playbook: str | None) -> str:
        argv = ["diagnose", self._locate(target), "--config", str(self.config_path)]
        if playbook is not None:
            argv += ["--playbook", playbook]
        return await self._tool(argv, f"diagnose {target}")

    async def compare(self, a: str, b: str) -> str:
        pa, pb = self._locate(a), self._locate(b)
        return await self._tool(["compare", pa, pb, "--config", str(self.config_path)], "compare")

    async def plot(self, job_id: str) -> bytes:
        w = self.engine.jobs.get(job_id)
        if w is None:
            raise TaskError(f"job {job_id} is not being watched (only live jobs have a plot)")
        if self.plots is None:
            raise TaskError("pictures are not available in this build (matplotlib / chat.plots missing)")
        now = self._now()
        kind = (
            IncidentKind.HANG
            if self.pipeline.book.get(job_id, IncidentKind.HANG) is not None
            else IncidentKind.TGS_DEGRADATION
        )
        tgs = self.cfg.detectors.tgs
        payload = chart_payload(
            w.view,
            kind,
            now,
            tgs_threshold_pct=tgs.drop_pct,
            baseline_steps=(tgs.baseline_first_step, tgs.baseline_last_step),
        )
        pngs = await self.plots.render(payload) if payload is not None else []
        if not pngs:
            raise TaskError("the picture could not be rendered")
        return pngs[0]

    # -- recovery (`service.recovery_wiring`) ---------------------------------------------

    def nodes(self, now: float) -> ChatMessage:
        if self.recovery is None:
            return ChatMessage("node memory is not running in this daemon")
        return self.recovery.nodes(now)

    def recovery_operator(self, sender: Sender) -> bool:
        return self.recovery is not None and self.recovery.is_operator(sender)

    def keep_recovery(self, incident: Incident, by: str, now: float) -> str:
        kept = self.recovery.keep(incident.job_id, by, now) if self.recovery is not None else []
        return f"✋ Kept: the restart of job {incident.job_id} is cancelled." if kept else ""

    def approve_recovery(
        self, incident: Incident, sender: Sender, *, operator: bool, now: float
    ) -> tuple[str, bool]:
        if self.recovery is None:
            return "Recovery is not running in this daemon.", False
        return self.recovery.approve(incident.job_id, sender, operator=operator, now=now)

    async def drain(self, node: str, by: str, *, operator: bool) -> str:
        if self.recovery is None:
            raise TaskError("recovery is not running in this daemon")
        return await self.recovery.drain(node, by, operator=operator)

    async def scancel(self, job_id: str, by: str) -> str:
        if not can_scancel(job_id) or job_id not in self.engine.jobs:
            raise TaskError(f"job {job_id} is not a watched Slurm job")
        env = dict(os.environ)
        if self.cfg.slurm.slurm_conf:
            env["SLURM_CONF"] = str(self.cfg.slurm.slurm_conf)
        try:
            proc = await asyncio.create_subprocess_exec(
                "scancel",
                job_id,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
        except OSError as exc:
            raise TaskError(f"cannot run scancel: {exc.strerror or exc}") from None
        try:
            async with asyncio.timeout(self.cfg.slurm.command_timeout_seconds):
                _, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise TaskError("scancel timed out") from None
        if proc.returncode != 0:
            raise TaskError(_last_line(err.decode(errors="replace")) or f"exit code {proc.returncode}")
        return f"scancel {job_id}: requested by {by}"
