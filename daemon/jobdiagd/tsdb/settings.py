"""Diagnosis settings and per-GPU-model thresholds (defaults: rule PB-GPU-1, docs/rules.md; overridable from TOML).

Example `[tsdb]` table (every key optional; unknown keys are errors that name the key):

    [tsdb]
    prometheus_binary = "/usr/bin/prometheus"
    gpu_model = "MI355X"              # default: detected from VRAM size, else MI300X
    confirm_hang_with_power = true    # hold a hang page while the GPUs deny the hang (rule HANG-9)
    early_page = true                 # GPU-confirmed early page of live hangs (RAY=1; [site_prometheus]: every job)
    early_max_concurrent = 8          # early-page queries in flight at once
    [tsdb.thresholds]
    warmup_steps = 10
    [tsdb.gpu_profiles.H100]
    train_power_min_w = 500
    [tsdb.ssh]
    config_paths = ["~/.ssh/config"]  # default: asyncssh reads ~/.ssh/config itself
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GpuProfile:
    """Power/thermal bands for one GPU model. Source: runbook 'Key thresholds' + docs/log-formats.md power bands."""

    name: str
    train_power_min_w: float
    train_power_max_w: float
    busy_wait_power_min_w: float
    busy_wait_power_max_w: float
    idle_power_max_w: float
    temp_limit_c: float
    vram_gib: tuple[float, ...] = ()


DEFAULT_PROFILES: dict[str, GpuProfile] = {
    # MI300X: training 600-750 W, busy-wait 250-350 W, idle < 100 W (runbook Playbook 1).
    "MI300X": GpuProfile("MI300X", 600, 750, 250, 350, 100, 90, (192.0,)),
    # MI355X: training ~900 W (800-1000), busy-wait ~260-310 W (triage heartbeat checklist).
    "MI355X": GpuProfile("MI355X", 800, 1000, 240, 350, 120, 90, (288.0,)),
    # NVIDIA defaults are estimates from TDP (700 W / 1000 W); tune them in [tsdb.gpu_profiles.*].
    "H100": GpuProfile("H100", 450, 700, 150, 300, 100, 87, (80.0, 94.0)),
    "H200": GpuProfile("H200", 450, 700, 150, 300, 100, 87, (141.0,)),
    "B200": GpuProfile("B200", 700, 1000, 200, 400, 150, 90, (180.0, 186.0)),
}


@dataclass(frozen=True)
class Thresholds:
    """Model-independent decision thresholds; each names the rule it implements (docs/rules.md)."""

    busy_util_pct: float = 90.0  # "100% utilization + low watts" (Playbook 1)
    idle_util_pct: float = 10.0
    tcp_outlier_factor: float = 100.0  # "orders of magnitude higher than peers (10M vs 10K)"
    rate_outlier_factor: float = 5.0  # per-host rate vs cluster median
    rdma_retx_min_per_s: float = 1.0  # below this a retransmit rate is noise
    rdma_ack_timeout_min_per_s: float = 0.05  # several ACK timeouts a minute; single digits are background
    net_error_min_per_s: float = 0.0  # other network error counters (drops, retry exhaustion): any event
    tcp_rate_min_per_s: float = 5.0  # per-host TCP retransmit rate below this is background noise
    # A counter rate stands out against the job's own baseline (the same host before the incident)
    # AND the other hosts (their median + k x MAD): "background counts are not a trigger".
    baseline_rate_factor: float = 5.0
    peer_mad_k: float = 5.0
    ce_warn_count: float = 100.0  # "high correctable errors -> degrading hardware"
    mem_oom_fraction: float = 0.95  # host memory at/above this fraction of total = at the limit
    ramp_min_r2: float = 0.8
    ramp_min_growth_fraction: float = 0.15
    spike_min_fraction: float = 0.10  # jump of >= 10% of total RAM counts as a spike
    tgs_regression_pct: float = 10.0  # ">10% drop from steady-state average warrants investigation"
    io_pressure_full_pct: float = 10.0
    procs_leak_min_delta: float = 2.0  # restore leak: ~3-8 extra runnable procs per host
    procs_uniform_max_cv: float = 0.5
    warmup_steps: int = 5  # "typically 5-10 steps after the later job's first step"
    heartbeat_timeout_default_s: float = 100.0  # patched MaxText default
    stall_min_s: float = 600.0  # training stalled this long before a heartbeat kill = hang first
    anomaly_baseline_s: float = 1800.0
    anomaly_after_s: float = 300.0
    anomaly_k: float = 6.0


@dataclass(frozen=True)
class SshSettings:
    username: str | None = None
    port: int | None = None
    config_paths: tuple[str, ...] = ()  # empty: asyncssh reads ~/.ssh/config
    client_keys: tuple[str, ...] = ()
    known_hosts: str | None = None
    connect_timeout_s: float = 10.0
    max_attempts: int = 4
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0


@dataclass(frozen=True)
class TsdbSettings:
    prometheus_binary: str = "/usr/bin/prometheus"
    promtool_binary: str = "/usr/bin/promtool"
    gpu_model: str | None = None  # None: detect from triage platform / VRAM size
    query_timeout_s: float = 30.0
    ready_timeout_s: float = 60.0
    lookback_delta: str = "5m"
    work_dir: str | None = None  # where temp copies and configs go (default: tempfile)
    confirm_hang_with_power: bool = False  # hold a hang page while the GPUs deny the hang (rule HANG-9)
    # Early page of live jobs (tsdb.gpu_hang, rule HANG-GPU; RAY=1, or every job with the site
    # Prometheus, service.site_source): once the expected step is overdue by
    # early_overdue_factor x steady step time + early_overdue_slack_s, the job's Prometheus is
    # asked once per early_scrape_interval_s (the slowest exporter's scrape interval: node_hw
    # 10 s in the job scripts), at most early_max_concurrent jobs at a time; two scrapes of
    # the hang signature on every host page at once.
    early_page: bool = True
    early_overdue_factor: float = 1.5
    early_overdue_slack_s: float = 20.0
    early_scrape_interval_s: float = 10.0
    early_max_concurrent: int = 8
    thresholds: Thresholds = field(default_factory=Thresholds)
    ssh: SshSettings = field(default_factory=SshSettings)
    gpu_profiles: Mapping[str, GpuProfile] = field(default_factory=lambda: dict(DEFAULT_PROFILES))

    def profile(self, model: str | None) -> GpuProfile:
        key = normalize_model(model or self.gpu_model or "MI300X")
        return self.gpu_profiles.get(key) or self.gpu_profiles["MI300X"]


def normalize_model(name: str) -> str:
    up = name.upper().replace("-", "").replace(" ", "")
    for key in ("MI355X", "MI300X", "H200", "H100", "B200"):
        if key in up:
            return key
    return up


# Numeric keys: finite and within bounds that say why (issue 7: `1e309` and `0.000001` were taken).
_NAMED_BOUNDS: dict[str, tuple[float, float, str]] = {
    "query_timeout_s": (0.1, 3600, "a query not answered in an hour is not coming"),
    "ready_timeout_s": (0.1, 3600, "a Prometheus not ready in an hour is not starting"),
    "connect_timeout_s": (0.1, 600, "a tick waits this long for an ssh connection"),
    "max_attempts": (1, 100, "at least one attempt; more only delays the verdict"),
    "port": (1, 65535, "a TCP port"),
    "warmup_steps": (0, 1_000_000, "a step count of a real training run"),
    "ramp_min_r2": (0, 1, "a coefficient of determination"),
    "temp_limit_c": (0, 200, "degrees Celsius of a GPU"),
    "early_overdue_factor": (0, 100, "steady step times before the GPUs are asked"),
    "early_overdue_slack_s": (0, 86400, "at most a day"),
    "early_scrape_interval_s": (1, 600, "a Prometheus scrape interval"),
    "early_max_concurrent": (1, 256, "queries in flight at once; each holds an ssh channel"),
}


def _bounds(key: str) -> tuple[float, float, str]:
    if key in _NAMED_BOUNDS:
        return _NAMED_BOUNDS[key]
    if key.endswith("_pct"):
        return 0, 100, "a percentage"
    if key.endswith("_fraction"):
        return 0, 1, "a fraction"
    if key.endswith("_w"):
        return 0, 10_000, "watts drawn by one GPU"
    if key.endswith("_s"):
        return 0, 30 * 86400, "a duration of at most 30 days"
    return 0, 1e12, "a non-negative count, rate or ratio"


def _check_number(where: str, key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    if not math.isfinite(value):
        raise ValueError(f"[{where}] {key}: must be a finite number, got {value!r}")
    low, high, why = _bounds(key)
    if not low <= value <= high:
        raise ValueError(f"[{where}] {key}: must be between {low:g} and {high:g} ({why}), got {value!r}")


def _check_type(where: str, key: str, value: Any, default: Any, annotation: str = "") -> None:
    """Values must have the default's type (ints are fine for floats); a None default takes what
    its annotation names (`str | None`: a string, `int | None`: an integer)."""
    if default is None:
        kinds = (str,) * ("str" in annotation) + (int,) * ("int" in annotation)
        ok = isinstance(value, kinds or (str, int)) and not isinstance(value, bool)
        want = " or ".join({str: "a string", int: "an integer"}[k] for k in kinds) or "a string or a number"
    elif isinstance(default, bool):
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(default, float):
        ok, want = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    elif isinstance(default, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, str):
        ok, want = isinstance(value, str), "a string"
    elif isinstance(default, tuple):
        ok, want = isinstance(value, list), "a list"
    else:
        ok, want = isinstance(value, dict), "a table"
    if not ok:
        raise ValueError(f"[{where}] {key}: must be {want}, got {value!r}")


def _build(cls: type[Any], data: Mapping[str, Any], where: str) -> Any:
    """Unknown keys and wrongly typed values are errors that name the table and the key."""
    if not isinstance(data, Mapping):
        raise ValueError(f"[{where}]: must be a table, got {data!r}")
    defaults = cls()
    known = {f.name: str(f.type) for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise ValueError(f"[{where}] {key}: unknown key")
        default = getattr(defaults, key)
        if default is None and value == "":
            continue  # TOML has no null: "" means "not set"
        _check_type(where, key, value, default, known[key])
        for item in value if isinstance(value, list) else [value]:
            _check_number(where, key, item)
        kwargs[key] = tuple(value) if isinstance(value, list) else value
    return cls(**kwargs)


def settings_from_mapping(data: Mapping[str, Any]) -> TsdbSettings:
    """Build settings from a `[tsdb]` table; unknown keys are errors naming the key."""
    base = TsdbSettings()
    plain = {k: v for k, v in data.items() if k not in ("thresholds", "ssh", "gpu_profiles")}
    s: TsdbSettings = _build(TsdbSettings, plain, "tsdb")
    s = replace(s, thresholds=_build(Thresholds, data.get("thresholds", {}), "tsdb.thresholds"))
    s = replace(s, ssh=_build(SshSettings, data.get("ssh", {}), "tsdb.ssh"))
    profiles = dict(base.gpu_profiles)
    tables = data.get("gpu_profiles") or {}
    if not isinstance(tables, Mapping):
        raise ValueError(f"[tsdb.gpu_profiles]: must be a table of GPU models, got {tables!r}")
    for name, prof in tables.items():
        if not isinstance(prof, Mapping):
            raise ValueError(f"[tsdb.gpu_profiles.{name}]: must be a table, got {prof!r}")
        key = normalize_model(name)
        start = profiles.get(key, DEFAULT_PROFILES["MI300X"])
        merged = {f.name: getattr(start, f.name) for f in fields(GpuProfile)} | {"name": key}
        for k, v in prof.items():
            if k not in merged:
                raise ValueError(f"[tsdb.gpu_profiles.{name}] {k}: unknown key")
            for item in v if isinstance(v, list) else [v]:
                _check_number(f"tsdb.gpu_profiles.{name}", k, item)
            merged[k] = tuple(v) if isinstance(v, list) else v
        profiles[key] = GpuProfile(**merged)
    s = replace(s, gpu_profiles=profiles)
    if s.gpu_model is not None and normalize_model(s.gpu_model) not in profiles:
        raise ValueError(
            f"[tsdb] gpu_model: unknown GPU model {s.gpu_model!r} (known: {', '.join(sorted(profiles))}; "
            "add one under [tsdb.gpu_profiles])"
        )
    return s


def load_settings(path: Path | None) -> TsdbSettings:
    if path is None:
        return TsdbSettings()
    with path.open("rb") as fh:
        doc = tomllib.load(fh)
    return settings_from_mapping(doc.get("tsdb", {}))


def model_from_vram(total_bytes: float) -> str | None:
    gib = total_bytes / 2**30
    best: tuple[float, str] | None = None
    for prof in DEFAULT_PROFILES.values():
        for size in prof.vram_gib:
            d = abs(size - gib)
            if d <= 4 and (best is None or d < best[0]):
                best = (d, prof.name)
    return best[1] if best else None
