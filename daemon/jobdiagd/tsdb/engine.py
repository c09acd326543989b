"""Diagnosis orchestration: access -> discovery (+ log cross-check) -> playbook -> earliest anomaly.

The earliest-anomaly sweep can name a root the playbook missed (runbook: "find the earliest anomaly",
"always report the full chain"): a training-level metric (tb_learning_*) first in a training-stability
diagnosis with no chain of its own, or a network/RDMA error counter on specific hosts first before a
busy-wait hang (or a hang then killed by the heartbeat). Then that root heads root_cause and chain (and
the hang's hosts become anomalous); the verdict is left to the playbook (see the hang and training
playbooks for why it stays). A network counter that rose alike on the other hosts (peers_alike) is a
cluster-wide event, not one host's trigger, and is never adopted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from jobdiagd.model.kinds import FailureClass, PlaybookName
from jobdiagd.tsdb.access import NoTsdb, SshTunnelPool, TsdbHandle, open_tsdb
from jobdiagd.tsdb.anomaly import AnomalyReport, Shift, earliest_anomaly
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.discovery import Discovery, WrongDatabase, discover
from jobdiagd.tsdb.playbooks import playbook_name_for_class
from jobdiagd.tsdb.playbooks.base import PlaybookEnv, PlaybookResult, Verdict, hang_window
from jobdiagd.tsdb.playbooks.heartbeat import heartbeat_times
from jobdiagd.tsdb.playbooks.registry import PLAYBOOKS
from jobdiagd.tsdb.settings import TsdbSettings


@dataclass
class Diagnosis:
    ctx: DiagnosisContext
    playbook: str
    result: PlaybookResult | None = None
    discovery: Discovery | None = None
    anomaly: AnomalyReport | None = None
    access_mode: str = ""
    server: str = ""
    notes: list[str] = field(default_factory=list)
    no_tsdb: str | None = None
    queries: int = 0
    elapsed_s: float = 0.0


def incident_time(env: PlaybookEnv, res: PlaybookResult) -> float | None:
    """When the incident happened, for the earliest-anomaly sweep."""
    ctx = env.ctx
    if res.incident is not None:
        return res.incident
    if not res.applicable:
        return None  # the playbook's trigger is absent: no incident
    if res.playbook == PlaybookName.HANG:
        return hang_window(env).last
    if res.playbook == PlaybookName.HEARTBEAT:
        stop = heartbeat_times(env).stop
        if res.verdict == Verdict.HANG_THEN_HEARTBEAT:
            # The hang, not the heartbeat kill, is the incident whose first anomaly matters.
            before = [p.t for p in env.disc.timeline.points if p.t <= stop]
            return before[-1] if before else stop
        return stop
    if ctx.incident_time is not None:
        return ctx.incident_time
    if res.playbook in (PlaybookName.OOM, PlaybookName.HARDWARE) and res.verdict != Verdict.HEALTHY:
        # A crash: the last real training step is the best estimate of when it happened.
        return env.disc.timeline.last_time or res.window[1]
    # Steady-state findings (constant RDMA load, a restore leak) have no incident to sweep around.
    return None


NETWORK_ERROR_PREFIXES = ("hw_rdma_", "hw_tcp_", "hw_net_")


def adopt_earliest_root(res: PlaybookResult, rep: AnomalyReport) -> PlaybookResult:
    """The result with the sweep's root at its head when the playbook found no cause of that kind."""
    root = rep.root
    if root is None or root.symptom:
        return res
    if (
        res.playbook == PlaybookName.TRAINING_STABILITY
        and not res.chain
        and root.family.startswith("tb_learning_")
        and not res.root_cause.startswith("Training-level root cause")
    ):
        return replace(
            res,
            root_cause=f"Training-level root cause (earliest anomaly): {root.describe()}. {res.root_cause}",
            chain=rep.chain(),
        )
    if (
        res.playbook in (PlaybookName.HANG, PlaybookName.HEARTBEAT)
        and res.verdict in (Verdict.RCCL_BUSY_WAIT_HANG, Verdict.HANG_THEN_HEARTBEAT)
        and root.family.startswith(NETWORK_ERROR_PREFIXES)
        and root.kind == Shift.UP
        and not root.peers_alike  # a cluster-wide rise is not one host's trigger
        and root.onset <= rep.incident
        and root.host not in res.anomalous_hosts
    ):
        return replace(
            res,
            anomalous_hosts=sorted({*res.anomalous_hosts, root.host}),
            root_cause=f"Trigger (earliest anomaly): {root.describe()}. {res.root_cause}",
            chain=[f"network error on {root.host}: {root.describe()}", *res.chain],
        )
    return res


def stalled(disc: Discovery) -> bool:
    """Training stopped well before the data ends (a hang), rather than at the end of the job."""
    tl = disc.timeline
    if tl.empty or tl.last_time is None:
        return True  # no step at all: a pre-training hang is possible
    st = tl.median_step_time() or 30.0
    return disc.max_time - tl.last_time > max(5 * st, 300.0)


def check_database(disc: Discovery, handle: TsdbHandle) -> None:
    if disc.crosscheck.status == "mismatch":
        raise WrongDatabase(f"wrong TSDB at {handle.client.label}: {disc.crosscheck.detail}")


async def diagnose(
    ctx: DiagnosisContext,
    settings: TsdbSettings,
    *,
    now: float,
    playbook: str | None = None,
    tunnels: SshTunnelPool | None = None,
    with_anomaly: bool = True,
) -> Diagnosis:
    name = playbook or playbook_name_for_class(ctx.primary_class)
    if name not in PLAYBOOKS:
        raise ValueError(f"unknown playbook {name!r}; known: {', '.join(PLAYBOOKS)}")
    out = Diagnosis(ctx, name)
    t0 = time.perf_counter()
    try:
        async with open_tsdb(ctx, settings, now=now, tunnels=tunnels) as handle:
            out.access_mode, out.server = handle.mode, handle.client.label
            out.notes.extend(handle.notes)
            disc = await discover(handle, ctx, settings)
            out.discovery = disc
            out.notes.extend(disc.notes)
            check_database(disc, handle)
            if (
                playbook is None
                and name == PlaybookName.HANG
                and ctx.primary_class in (FailureClass.CANCELLED, FailureClass.TRAIN_TIMEOUT)
                and not stalled(disc)
            ):
                # Cancellation is only the mechanism; without a stall before it there was no hang to explain.
                name = out.playbook = PlaybookName.TRAINING_STABILITY
                out.notes.append(
                    f"{ctx.primary_class} without a stall before the end of the data: training-stability playbook"
                )
            env = PlaybookEnv(handle.client, ctx, disc, settings, now)
            res = await PLAYBOOKS[name].run(env)
            out.result = res
            if with_anomaly:
                t = incident_time(env, res)
                if t is not None:
                    out.anomaly = await earliest_anomaly(
                        handle.client, disc, t, settings.thresholds, checkpoint_period=ctx.checkpoint_period
                    )
                    out.result = adopt_earliest_root(res, out.anomaly)
            out.queries = handle.client.query_count
    except NoTsdb as exc:
        out.no_tsdb = str(exc)
    out.elapsed_s = time.perf_counter() - t0
    return out
