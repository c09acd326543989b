"""What the diagnosis needs to know about a job (from triage): built from the in-process `TriageResult`,
or from its JSON document (`--triage-json`, read from disk).

`context_from_result` reads the result's attributes directly (no dict round trip inside the daemon);
`context_from_triage` parses the document `TriageResult.to_dict()` writes. Both apply the same
normalisation, so the two give equal contexts for the same result (tests/tsdb/test_context.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobdiagd.model.kinds import FailureClass, JobStatus

if TYPE_CHECKING:  # only for the annotation: the CLI's start-up does not import the triage model
    from jobdiagd.model.triage import TriageResult

LIVE_STATUSES = frozenset({JobStatus.RUNNING, JobStatus.HANGING})


def short_host(name: str) -> str:
    """Short host name: the log's node list says gpu-a01 where a label may say gpu-a01.cluster.local.

    Every comparison and every report uses the short name; IP addresses are kept whole.
    """
    if not name or name.replace(".", "").isdigit() or ":" in name:
        return name
    return name.split(".", 1)[0]


@dataclass(frozen=True)
class HeartbeatInfo:
    time: float | None
    timeout_s: float | None
    accused_tasks: tuple[int, ...] = ()
    accused_hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class LogStep:
    """One `completed step:` record from the log (triage's authoritative per-step list)."""

    step: int
    seconds: float | None = None
    loss: float | None = None
    tgs: float | None = None
    time: float | None = None


@dataclass(frozen=True)
class FailureRef:
    cls: str
    host: str | None = None
    task: int | None = None
    time: float | None = None
    text: str = ""


@dataclass(frozen=True)
class DiagnosisContext:
    """Triage facts that shape a diagnosis; tests build it directly, the CLI adapts the triage document."""

    job_dir: Path | None
    nodes: tuple[str, ...]
    job_id: str | None = None
    job_name: str | None = None
    log_path: Path | None = None
    nnodes: int | None = None
    ray: bool | None = True
    status: str | None = None
    primary_class: str | None = None
    head_node: str | None = None
    port: int | None = None
    tunnel: str | None = None
    incident_time: float | None = None
    first_step: int | None = None
    last_step: int | None = None
    last_step_time: float | None = None
    restored_from_step: int | None = None
    checkpoint_period: int | None = None
    step_time_s: float | None = None
    heartbeat: HeartbeatInfo | None = None
    config: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    steps: tuple[LogStep, ...] = ()
    failures: tuple[FailureRef, ...] = ()
    platform: str | None = None
    next_steps: tuple[str, ...] = ()

    @property
    def live(self) -> bool:
        return (self.status or "").lower() in LIVE_STATUSES

    @property
    def prometheus_dir(self) -> Path | None:
        return self.job_dir / "prometheus" if self.job_dir is not None else None

    @property
    def label(self) -> str:
        return self.job_id or (self.job_dir.name if self.job_dir else "job")

    @property
    def async_checkpointing(self) -> bool:
        return self.config.get("async_checkpointing", "").lower() in ("true", "1")

    @property
    def single_replica_restore(self) -> bool:
        """The job ran with enable_single_replica_ckpt_restoring=true (a restore then takes that path)."""
        return self.config.get("enable_single_replica_ckpt_restoring", "").lower() in ("true", "1")


def _f(x: Any) -> float | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _i(x: Any) -> int | None:
    v = _f(x)
    return int(v) if v is not None else None


def _str_map(x: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in x.items()} if isinstance(x, Mapping) else {}


def _incident(
    primary_class: str | None, failures: Sequence[FailureRef], heartbeat: HeartbeatInfo | None
) -> float | None:
    """When the primary failure happened: its earliest record, or the heartbeat error of a heartbeat kill."""
    incident = None
    if primary_class:
        times = [f.time for f in failures if f.cls == primary_class and f.time is not None]
        incident = min(times) if times else None
    if (
        heartbeat is not None
        and heartbeat.time is not None
        and primary_class == FailureClass.HEARTBEAT_TIMEOUT
    ):
        incident = heartbeat.time
    return incident


def context_from_triage(doc: Mapping[str, Any]) -> DiagnosisContext:
    """The context of a triage document (`TriageResult.to_dict()`, e.g. a `--triage-json` file)."""
    job = doc.get("job") or {}
    progress = doc.get("progress") or {}
    live = doc.get("live") or {}
    config = _str_map(doc.get("config"))
    failures_raw: Sequence[Mapping[str, Any]] = doc.get("failures") or []
    failures = tuple(
        FailureRef(
            cls=str(f.get("class", "")),
            host=f.get("host") or None,
            task=_i(f.get("task")),
            time=_f(f.get("time")),
            text=str(f.get("text") or ""),
        )
        for f in failures_raw
    )
    primary = doc.get("primary_failure")
    primary_class = str(primary) if primary else None
    hb_raw = doc.get("heartbeat")
    heartbeat = None
    if isinstance(hb_raw, Mapping):
        heartbeat = HeartbeatInfo(
            time=_f(hb_raw.get("time")),
            timeout_s=_f(hb_raw.get("timeout_s")),
            accused_tasks=tuple(int(t) for t in hb_raw.get("accused_tasks") or []),
            accused_hosts=tuple(str(h) for h in hb_raw.get("accused_hosts") or []),
        )
    steps = tuple(
        LogStep(
            step=int(s["step"]),
            seconds=_f(s.get("seconds")),
            loss=_f(s.get("loss")),
            tgs=_f(s.get("tgs")),
            time=_f(s.get("time")),
        )
        for s in (doc.get("steps") or [])
        if _i(s.get("step")) is not None
    )
    incident = _incident(primary_class, failures, heartbeat)
    ckpt = _i(progress.get("checkpoint_period"))
    if ckpt is None:
        ckpt = _i(config.get("checkpoint_period"))
    job_dir = job.get("job_dir")
    log = job.get("log")
    ray = job.get("ray")
    return DiagnosisContext(
        # Absolute: Prometheus runs in its own working directory (a relative TSDB path there is a new, empty TSDB).
        job_dir=Path(job_dir).absolute() if job_dir else None,
        nodes=tuple(str(n) for n in job.get("nodes") or []),
        job_id=str(job["id"]) if job.get("id") is not None else None,
        job_name=str(job["name"]) if job.get("name") else None,
        log_path=Path(log).absolute() if log else None,
        nnodes=_i(job.get("nnodes")),
        ray=bool(ray) if ray is not None else None,
        status=str(doc.get("status")) if doc.get("status") else None,
        primary_class=primary_class,
        head_node=str(live["head_node"]) if live.get("head_node") else None,
        port=_i(live.get("prometheus_port")),
        tunnel=str(live["tunnel"]) if live.get("tunnel") else None,
        incident_time=incident,
        first_step=_i(progress.get("first_step")),
        last_step=_i(progress.get("last_step")),
        last_step_time=_f(progress.get("last_step_time")),
        restored_from_step=_i(progress.get("restored_from_step")),
        checkpoint_period=ckpt,
        step_time_s=_f(progress.get("step_time_s")),
        heartbeat=heartbeat,
        config=config,
        env=_str_map(doc.get("env")),
        steps=steps,
        failures=failures,
        platform=str(job["platform"]) if job.get("platform") else None,
        next_steps=tuple(str(s) for s in doc.get("next_steps") or []),
    )


# The environment variables TriageResult.to_dict() keeps (the diagnosis reads no others).
KEPT_ENV_PREFIXES = ("XLA_", "NCCL_", "RCCL_", "JAX_", "RAY", "HIP_", "CUDA_")


def _nnodes(res: TriageResult) -> int | None:
    if res.header is None:
        return None
    if res.nodes:
        return len(res.nodes)
    try:
        raw = res.header.get("NNODES")
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _failures(res: TriageResult) -> tuple[FailureRef, ...]:
    refs = [
        FailureRef(
            cls=str(e.cls), host=e.host or None, task=_i(e.task), time=_f(e.time), text=str(e.text or "")
        )
        for e in res.cls.evidence
    ]
    tgs = res.tgs
    if tgs.degraded:
        refs.append(
            FailureRef(
                cls=FailureClass.TGS_DEGRADATION,
                text=f"TGS {tgs.magnitude} over steps {tgs.range} ({tgs.pattern})",
            )
        )
    return tuple(refs)


def context_from_result(res: TriageResult) -> DiagnosisContext:
    """The context of an in-process triage result: its attributes, read as `context_from_triage` reads
    the same result's document (equal contexts for the same result)."""
    ref, progress, live, hb = res.ref, res.progress, res.live, res.cls.heartbeat
    config = _str_map(res.config)
    failures = _failures(res)
    primary_class = str(res.cls.primary) if res.cls.primary else None
    heartbeat = (
        None
        if hb is None
        else HeartbeatInfo(
            time=_f(hb.time),
            timeout_s=_f(hb.timeout_s),
            accused_tasks=tuple(int(t) for t in hb.accused_tasks or []),
            accused_hosts=tuple(str(h) for h in hb.accused_hosts or []),
        )
    )
    ckpt = _i(progress.checkpoint_period)
    if ckpt is None:
        ckpt = _i(config.get("checkpoint_period"))
    return DiagnosisContext(
        # Absolute: Prometheus runs in its own working directory (a relative TSDB path there is a new, empty TSDB).
        job_dir=Path(str(ref.job_dir)).absolute() if ref.job_dir else None,
        nodes=tuple(str(n) for n in res.nodes),
        job_id=str(res.job_id) if res.job_id is not None else None,
        job_name=str(res.job_name) if res.job_name else None,
        log_path=Path(str(ref.log)).absolute() if ref.log else None,
        nnodes=_i(_nnodes(res)),
        ray=bool(res.ray) if res.ray is not None else None,
        status=str(res.cls.status) if res.cls.status else None,
        primary_class=primary_class,
        head_node=str(live.head_node) if live.head_node else None,
        port=_i(live.prometheus_port),
        tunnel=str(live.tunnel) if live.tunnel else None,
        incident_time=_incident(primary_class, failures, heartbeat),
        first_step=_i(progress.first_step),
        last_step=_i(progress.last_step),
        last_step_time=_f(progress.last_step_time),
        restored_from_step=_i(progress.restored_from_step),
        checkpoint_period=ckpt,
        step_time_s=_f(progress.step_time_s),
        heartbeat=heartbeat,
        config=config,
        env=_str_map({k: v for k, v in res.env.items() if k.startswith(KEPT_ENV_PREFIXES)}),
        steps=tuple(
            LogStep(step=int(s.step), seconds=_f(s.seconds), loss=_f(s.loss), tgs=_f(s.tgs), time=_f(s.time))
            for s in res.steps
            if _i(s.step) is not None
        ),
        failures=failures,
        platform=str(ref.platform) if ref.platform else None,
        next_steps=tuple(str(s) for s in res.next_steps or []),
    )
