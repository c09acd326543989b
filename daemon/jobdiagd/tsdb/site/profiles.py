"""The metric map of a site Prometheus: which exporter metric answers each question, and its labels.

A site's central Prometheus scrapes a GPU exporter and node_exporter on every node. The map
names, for each *role* the judges read, the exporter's metric, the label that names the host,
the label that names the GPU, the label that names the Slurm job (when the exporter has one),
the label that names the GPU model, a scale to the unit the judges use, and whether the metric
is a counter (read as a per-second rate). Three built-in profiles; every field of every role
can be overridden in `[site_prometheus.metrics.<role>]`.

Roles and the unit the judges read (rules SITE-1, SITE-2 in docs/rules.md):

| role | unit | used by |
|---|---|---|
| `power` | watts per GPU | early judge, slow host |
| `util` | percent per GPU | early judge, slow host |
| `mem_activity` | percent per GPU (memory controller busy) | slow host (evidence) |
| `vram_used` | bytes per GPU | early judge: stands in for a GPU process count (below) |
| `processes` | GPU user processes per GPU | early judge (dead node) |
| `io_pressure` | percent of time all tasks stalled on I/O, per host | early judge (checkpoint veto) |
| `mem_pressure` | percent of time some task stalled on memory, per host | slow host |
| `tcp_retrans` | TCP segments retransmitted per second, per host | slow host |
| `rdma_retrans` | RDMA retransmission events per second, per host | slow host |

Profiles, and where their names come from (checked against the exporters' own sources):

- `dcgm` -- NVIDIA DCGM exporter, default collector `etc/default-counters.csv`
  (https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv):
  `DCGM_FI_DEV_POWER_USAGE` (W), `DCGM_FI_DEV_GPU_UTIL` (%), `DCGM_FI_DEV_MEM_COPY_UTIL` (%),
  `DCGM_FI_DEV_FB_USED` (MiB). Labels, from the exporter's renderer
  (`internal/pkg/rendermetrics/render_metrics.go`): `gpu` (index), `UUID`, `pci_bus_id`,
  `device` (nvidiaN), `modelName` (e.g. "NVIDIA H100 80GB HBM3"), and `Hostname` -- spelt
  `hostname` since the commit "Rename Hostname label to hostname" (#655, May 2026), so the
  profile accepts either and the start-up check keeps the one the series carry. With
  `--hpc-job-mapping-dir` (https://docs.nvidia.com/datacenter/cloud-native/gpu-telemetry/latest/
  dcgm-exporter.html, "HPC job mapping") each GPU's series carries `hpc_job="<job id>"`, one
  series per job when a GPU is mapped to several (`internal/pkg/transformation/hpc.go`).
  DCGM Exporter 4.9.0 renames 23 default fields and turns utilization into a 0-1 ratio
  (https://github.com/NVIDIA/dcgm-exporter/releases, 4.9.0 notes): such a site overrides
  `name` and sets `scale = 100` for `util` (the start-up check warns when every utilization
  is at most 1). `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a 0-1 ratio, profiling collector) may stand
  in for `util` the same way.
- `amd` -- AMD Device Metrics Exporter (https://github.com/ROCm/device-metrics-exporter,
  `docs/configuration/metricslist.md`, `docs/integrations/slurm-integration.md`): metrics are
  the field names in lower case, `gpu_power_usage` (W; MI2xx and MI3xx), `gpu_gfx_activity`
  (%), `gpu_umc_activity` (%), `gpu_used_vram` (MB); labels `gpu_id`, `hostname`,
  `card_series` ("AMD Instinct MI300X OAM"), `card_model`, `serial_number`, `gpu_uuid`,
  and with the Slurm prolog/epilog integration `job_id`, `job_user`, `job_partition` (empty
  strings on a GPU no job holds). A `CommonConfig.MetricsFieldPrefix` (often "amd_") is an
  override of each `name`.
- `generic` -- the runbook's own metric catalog (the job scripts' node_hw and Ray exporters,
  scraped centrally): `hw_gpu_power_watts`, `ray_node_gpus_utilization` (gpu label
  `GpuIndex`), `hw_gpu_user_processes`, `hw_gpu_vram_used_bytes`, `hw_io_pressure_full_pct`,
  `hw_tcp_retransmits_total`, `hw_rdma_tx_retx_pkts_total`, host label `host`. For any other
  exporter (amd-smi based ones, nvidia_gpu_exporter, ...) start from it and override names.

The host metrics of `dcgm` and `amd` come from node_exporter
(https://github.com/prometheus/node_exporter, `collector/pressure_linux.go`,
`collector/netstat_linux.go`, `collector/infiniband_linux.go`), host label `instance` (its
`host:port` scrape target; the port is dropped when matching nodes):
`node_pressure_io_stalled_seconds_total` and `node_pressure_memory_waiting_seconds_total`
(PSI "full" I/O and "some" memory, counters of seconds: rate x 100 = percent),
`node_netstat_Tcp_RetransSegs` (in the netstat collector's default field list) and the
infiniband collector's RDMA hardware counters `node_infiniband_local_ack_timeout_errors_total`,
`node_infiniband_packet_sequence_errors_total` and `node_infiniband_roce_adp_retransmits_total`
(summed: each is a retransmission the requester had to make; labels `device`, `port`).

**Decision (no process metric, rule SITE-2):** neither DCGM nor AMD's exporter exports a GPU
process count, which the dead-node signature needs. GPU memory stands in for it: a training
process holds its framebuffer (JAX preallocates most of it) until it exits, so a GPU holding
less than `idle_vram_gib` (2 GiB) counts as having no process, one holding more as having one.
Without a `vram_used` metric either, an idle host cannot be told from a dead one and the early
judge answers `no-data` for it (the step budget pages).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

ProfileName = Literal["dcgm", "amd", "generic"]
PROFILES: tuple[ProfileName, ...] = ("dcgm", "amd", "generic")

GPU_ROLES = ("power", "util", "mem_activity", "vram_used", "processes")
HOST_ROLES = ("io_pressure", "mem_pressure", "tcp_retrans", "rdma_retrans")
ROLES = GPU_ROLES + HOST_ROLES
# Roles without which the early judge has nothing to judge: a map without them is an error.
REQUIRED = ("power", "util")

_METRIC_RE = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]{0,199}\Z")
_LABEL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}\Z")
OVERRIDE_KEYS = ("name", "host_label", "gpu_label", "job_label", "model_label", "scale", "counter")


@dataclass(frozen=True)
class MetricSpec:
    """One role's metric. `names` are summed (per host) when there are several; `host_labels` are
    candidates, the first one the series carry is used (the start-up check settles it)."""

    names: tuple[str, ...]
    host_labels: tuple[str, ...]
    gpu_label: str = ""
    job_label: str = ""
    model_label: str = ""
    scale: float = 1.0
    counter: bool = False

    @property
    def host_label(self) -> str:
        return self.host_labels[0]

    @property
    def mapped(self) -> bool:
        return bool(self.names)


@dataclass(frozen=True)
class MetricMap:
    """Role -> spec for every role the site maps (unmapped roles are absent)."""

    profile: str
    specs: Mapping[str, MetricSpec]

    def get(self, role: str) -> MetricSpec | None:
        spec = self.specs.get(role)
        return spec if spec is not None and spec.mapped else None

    def roles(self) -> tuple[str, ...]:
        return tuple(r for r in ROLES if self.get(r) is not None)

    def with_spec(self, role: str, spec: MetricSpec) -> MetricMap:
        return MetricMap(self.profile, {**self.specs, role: spec})


_MIB = float(2**20)
_NODE = ("instance",)


def _node_exporter() -> dict[str, MetricSpec]:
    return {
        "io_pressure": MetricSpec(
            ("node_pressure_io_stalled_seconds_total",), _NODE, scale=100.0, counter=True
        ),
        "mem_pressure": MetricSpec(
            ("node_pressure_memory_waiting_seconds_total",), _NODE, scale=100.0, counter=True
        ),
        "tcp_retrans": MetricSpec(("node_netstat_Tcp_RetransSegs",), _NODE, counter=True),
        "rdma_retrans": MetricSpec(
            (
                "node_infiniband_local_ack_timeout_errors_total",
                "node_infiniband_packet_sequence_errors_total",
                "node_infiniband_roce_adp_retransmits_total",
            ),
            _NODE,
            counter=True,
        ),
    }


def _dcgm() -> dict[str, MetricSpec]:
    host = ("Hostname", "hostname")

    def gpu(name: str, scale: float = 1.0) -> MetricSpec:
        return MetricSpec((name,), host, "gpu", "hpc_job", "modelName", scale)

    return {
        "power": gpu("DCGM_FI_DEV_POWER_USAGE"),
        "util": gpu("DCGM_FI_DEV_GPU_UTIL"),
        "mem_activity": gpu("DCGM_FI_DEV_MEM_COPY_UTIL"),
        "vram_used": gpu("DCGM_FI_DEV_FB_USED", _MIB),
        **_node_exporter(),
    }


def _amd() -> dict[str, MetricSpec]:
    host = ("hostname",)

    def gpu(name: str, scale: float = 1.0) -> MetricSpec:
        return MetricSpec((name,), host, "gpu_id", "job_id", "card_series", scale)

    return {
        "power": gpu("gpu_power_usage"),
        "util": gpu("gpu_gfx_activity"),
        "mem_activity": gpu("gpu_umc_activity"),
        "vram_used": gpu("gpu_used_vram", _MIB),
        **_node_exporter(),
    }


def _generic() -> dict[str, MetricSpec]:
    host = ("host",)
    return {
        "power": MetricSpec(("hw_gpu_power_watts",), host, "gpu"),
        "util": MetricSpec(("ray_node_gpus_utilization",), host, "GpuIndex"),
        "vram_used": MetricSpec(("hw_gpu_vram_used_bytes",), host, "gpu"),
        "processes": MetricSpec(("hw_gpu_user_processes",), host, "gpu"),
        "io_pressure": MetricSpec(("hw_io_pressure_full_pct",), host),
        "tcp_retrans": MetricSpec(("hw_tcp_retransmits_total",), host, counter=True),
        "rdma_retrans": MetricSpec(("hw_rdma_tx_retx_pkts_total",), host, counter=True),
    }


_BUILTIN = {"dcgm": _dcgm, "amd": _amd, "generic": _generic}


def builtin(profile: str) -> MetricMap:
    if profile not in _BUILTIN:
        raise ValueError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})")
    return MetricMap(profile, _BUILTIN[profile]())


def check_override(role: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """One `[site_prometheus.metrics.<role>]` table, validated: unknown keys and malformed names
    are ValueErrors naming the table and the key. Returns the keys as given."""
    where = f"[site_prometheus.metrics.{role}]"
    if role not in ROLES:
        raise ValueError(f"{where}: unknown role (known: {', '.join(ROLES)})")
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in OVERRIDE_KEYS:
            raise ValueError(f"{where} {key}: unknown key (known: {', '.join(OVERRIDE_KEYS)})")
        out[key] = _check_value(where, key, value)
    return out


def _check_value(where: str, key: str, value: Any) -> Any:
    if key == "name":
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{where} name: must be a metric name or a list of them, got {value!r}")
        bad = [n for n in names if n and not _METRIC_RE.match(n)]
        if bad:
            raise ValueError(f"{where} name: not Prometheus metric names: {bad!r}")
        return tuple(n for n in names if n)
    if key == "scale":
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e12:
            raise ValueError(f"{where} scale: must be a positive number, got {value!r}")
        return float(value)
    if key == "counter":
        if not isinstance(value, bool):
            raise ValueError(f"{where} counter: must be true or false, got {value!r}")
        return value
    if not isinstance(value, str) or (value and not _LABEL_RE.match(value)):
        raise ValueError(f"{where} {key}: must be a Prometheus label name, got {value!r}")
    if key == "host_label" and not value:
        raise ValueError(f"{where} host_label: must not be empty")
    return value


def resolve(profile: str, overrides: Mapping[str, Mapping[str, Any]]) -> MetricMap:
    """The built-in profile with the (checked) overrides applied; `name = ""` unmaps a role."""
    base = builtin(profile)
    specs = dict(base.specs)
    for role, raw in overrides.items():
        table = check_override(role, raw)
        if not table:
            continue
        spec = specs.get(role) or MetricSpec((), ("host",))
        changes: dict[str, Any] = {}
        for key, value in table.items():
            if key == "name":
                changes["names"] = value
            elif key == "host_label":
                changes["host_labels"] = (value,)
            else:
                changes[key] = value
        specs[role] = replace(spec, **changes)
    missing = [r for r in REQUIRED if not (specs.get(r) and specs[r].mapped)]
    if missing:
        raise ValueError(
            f"[site_prometheus.metrics] {', '.join(missing)}: must map a metric (the early judge needs it)"
        )
    for role, spec in specs.items():
        if spec.mapped and role in GPU_ROLES and not spec.gpu_label:
            raise ValueError(
                f"[site_prometheus.metrics.{role}] gpu_label: a per-GPU metric needs its GPU label"
            )
    return MetricMap(profile, specs)
