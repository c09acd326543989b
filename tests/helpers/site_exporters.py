"""A simulated cluster's exporters for the site Prometheus tests: DCGM exporter, AMD Device Metrics
Exporter and node_exporter, served on 127.0.0.1, values driven by the simulated jobs' phases.

One HTTP server answers for every node and exporter (`/<exporter>/<node>/metrics`); the
Prometheus config from `prometheus_config()` scrapes each path as its own target, with the
`instance` label a real deployment has (`<node>:9400`, `<node>:5000`, `<node>:9100`).

The exposition follows the exporters' own output (text format 0.0.4, `# HELP` / `# TYPE`):
- DCGM: the label set of `internal/pkg/rendermetrics/render_metrics.go` (gpu, UUID,
  pci_bus_id, device, modelName, then `Hostname`, or `hostname` from exporter builds after
  #655) plus `DCGM_FI_DRIVER_VERSION` and, with HPC job mapping, `hpc_job`;
  help strings from `etc/default-counters.csv`;
- AMD: lower-case field names with the default label set (card_model, card_series,
  card_vendor, cluster_name, container, driver_version, gpu_compute_partition_type, gpu_id,
  gpu_memory_partition_type, gpu_partition_id, gpu_uuid, hostname, job_id, job_partition,
  job_user, namespace, pod, serial_number, vbios_version), empty strings where unset;
- node_exporter: the pressure, netstat and infiniband collectors' names, help and types.

Phases of a GPU (its power, utilization, memory copy activity and framebuffer use):
`train`, `busywait` (a collective spinning on a peer), `ckpt` (waiting on a checkpoint
write: low use, the host's I/O stalled), `eval`, `compile` (idle, process alive) and `dead`
(idle, its process gone: framebuffer freed). A node marked down answers 503 (its exporters
unreachable, the target down). Counters (I/O and memory stall seconds, retransmits) grow at the
rates set per node, integrated over wall time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

GIB = 2**30
MIB = 2**20
Vendor = Literal["dcgm", "amd"]

# Per-GPU (power W, utilization %, memory copy activity %, framebuffer GiB) of each phase.
H100 = {
    "train": (620.0, 100.0, 55.0, 62.0),
    "busywait": (220.0, 100.0, 3.0, 62.0),
    "ckpt": (120.0, 15.0, 20.0, 62.0),
    "eval": (450.0, 98.0, 40.0, 62.0),
    "compile": (80.0, 0.0, 0.0, 62.0),
    "dead": (60.0, 0.0, 0.0, 0.4),
}
MI300X = {
    "train": (680.0, 100.0, 55.0, 170.0),
    "busywait": (300.0, 100.0, 3.0, 170.0),
    "ckpt": (180.0, 15.0, 20.0, 170.0),
    "eval": (520.0, 98.0, 40.0, 170.0),
    "compile": (130.0, 0.0, 0.0, 170.0),
    "dead": (90.0, 0.0, 0.0, 0.3),
}


@dataclass
class SimNode:
    name: str
    vendor: Vendor
    gpus: int = 8
    phase: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)  # the exporter's job label per GPU ("" = none)
    power_delta: float = 0.0  # added to every GPU's power (a slide: GPUs waiting part of each step)
    hostname_label: str = "Hostname"  # DCGM's spelling (hostname after dcgm-exporter #655)
    down: bool = False
    # Rates of the node_exporter counters, per second.
    io_stall: float = 0.0  # seconds fully stalled on I/O per second (0.3 = 30 % PSI full)
    mem_wait: float = 0.005
    tcp_retrans: float = 0.5
    rdma_ack_timeout: float = 0.02
    rdma_seq_err: float = 0.03
    _counters: dict[str, float] = field(default_factory=dict)
    _at: float | None = None

    def __post_init__(self) -> None:
        self.phase = self.phase or ["train"] * self.gpus
        self.jobs = self.jobs or [""] * self.gpus

    def advance(self, now: float) -> None:
        """Integrate the counters up to `now` at the rates set so far."""
        if self._at is not None:
            dt = max(0.0, now - self._at)
            for name, rate in self.rates().items():
                self._counters[name] = self._counters.get(name, 0.0) + rate * dt
        self._at = now

    def rates(self) -> dict[str, float]:
        return {
            "io": self.io_stall,
            "mem": self.mem_wait,
            "tcp": self.tcp_retrans,
            "ack": self.rdma_ack_timeout,
            "seq": self.rdma_seq_err,
        }

    def counter(self, name: str) -> float:
        return self._counters.get(name, 0.0)

    def gpu_values(self, g: int) -> tuple[float, float, float, float]:
        table = H100 if self.vendor == "dcgm" else MI300X
        power, util, mem, fb = table[self.phase[g]]
        # Small deterministic per-GPU spread, as real GPUs have.
        return power + self.power_delta + (g % 3) * 2.0, util, mem, fb


class SiteCluster:
    """The simulated nodes, shared by the HTTP handler threads and the test (one lock)."""

    def __init__(self) -> None:
        self.nodes: dict[str, SimNode] = {}
        self.lock = threading.Lock()

    def add(self, node: SimNode) -> SimNode:
        with self.lock:
            self.nodes[node.name] = node
        return node

    def update(self, name: str, **changes: object) -> None:
        """Change a node's state; its counters are integrated up to now at the old rates first."""
        with self.lock:
            node = self.nodes[name]
            node.advance(time.time())
            for key, value in changes.items():
                setattr(node, key, value)

    def render(self, exporter: str, name: str) -> str | None:
        with self.lock:
            node = self.nodes.get(name)
            if node is None or node.down:
                return None
            node.advance(time.time())
            if exporter == "node":
                return node_exporter_text(node)
            if exporter == node.vendor:
                return dcgm_text(node) if node.vendor == "dcgm" else amd_text(node)
            return None


def _fmt(v: float) -> str:
    return repr(float(v))


def dcgm_text(node: SimNode) -> str:
    fields = (
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", 0, 1.0),
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 1, 1.0),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", 2, 1.0),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", 3, GIB / MIB),
    )
    lines: list[str] = []
    for name, help_text, i, scale in fields:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for g in range(node.gpus):
            labels = (
                f'gpu="{g}",UUID="GPU-{node.name}-{g:04d}-5a3c",pci_bus_id="00000000:{0x19 + g:02X}:00.0",'
                f'device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",{node.hostname_label}="{node.name}",'
                'DCGM_FI_DRIVER_VERSION="550.54.15"'
            )
            if node.jobs[g]:
                labels += f',hpc_job="{node.jobs[g]}"'
            value = node.gpu_values(g)[i] * scale
            lines.append(f"{name}{{{labels}}} {_fmt(round(value, 3))}")
    return "\n".join(lines) + "\n"


def amd_text(node: SimNode) -> str:
    fields = (
        ("gpu_power_usage", "power usage in Watts", 0, 1.0),
        ("gpu_gfx_activity", "graphics engine usage percentage", 1, 1.0),
        ("gpu_umc_activity", "memory engine usage percentage", 2, 1.0),
        ("gpu_used_vram", "total VRAM memory used in MB", 3, GIB / MIB),
    )
    lines: list[str] = []
    for name, help_text, i, scale in fields:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for g in range(node.gpus):
            job = node.jobs[g]
            labels = (
                'card_model="102-G30211-0C",card_series="AMD Instinct MI300X OAM",card_vendor="AMD",'
                'cluster_name="",container="",driver_version="6.12.12",gpu_compute_partition_type="spx",'
                f'gpu_id="{g}",gpu_memory_partition_type="nps1",gpu_partition_id="0",'
                f'gpu_uuid="{g:02x}ff74a1-0000-1000-80e0-c6d49f5b0d86",hostname="{node.name}",'
                f'job_id="{job}",job_partition="{"gpu" if job else ""}",job_user="{"alice" if job else ""}",'
                f'namespace="",pod="",serial_number="69240900{g:04d}",vbios_version="022.040.003.043.000001"'
            )
            value = node.gpu_values(g)[i] * scale
            lines.append(f"{name}{{{labels}}} {_fmt(round(value, 3))}")
    return "\n".join(lines) + "\n"


def node_exporter_text(node: SimNode) -> str:
    c = node.counter
    lines = [
        "# HELP node_pressure_io_stalled_seconds_total Total time in seconds no process could make progress due to IO congestion",
        "# TYPE node_pressure_io_stalled_seconds_total counter",
        f"node_pressure_io_stalled_seconds_total {_fmt(c('io'))}",
        "# HELP node_pressure_memory_waiting_seconds_total Total time in seconds that processes have waited for memory",
        "# TYPE node_pressure_memory_waiting_seconds_total counter",
        f"node_pressure_memory_waiting_seconds_total {_fmt(c('mem'))}",
        "# HELP node_netstat_Tcp_RetransSegs Statistic TcpRetransSegs.",
        "# TYPE node_netstat_Tcp_RetransSegs untyped",
        f"node_netstat_Tcp_RetransSegs {_fmt(round(c('tcp')))}",
    ]
    ib = (
        (
            "local_ack_timeout_errors_total",
            "The number of times QP's ack timer expired for RC, XRC, DCT QPs at the sender side. The QP retry limit was not exceed, therefore it is still recoverable error.",
            "ack",
        ),
        (
            "packet_sequence_errors_total",
            "The number of received NAK sequence error packets. The QP retry limit was not exceeded.",
            "seq",
        ),
    )
    for suffix, help_text, key in ib:
        name = f"node_infiniband_{suffix}"
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        for dev in ("mlx5_0", "mlx5_1"):
            share = 1.0 if dev == "mlx5_0" else 0.0  # the events on the first port
            lines.append(f'{name}{{device="{dev}",port="1"}} {_fmt(round(c(key) * share))}')
    return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    cluster: SiteCluster

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        parts = self.path.strip("/").split("/")
        body = None
        if len(parts) == 3 and parts[2] == "metrics":
            body = self.cluster.render(parts[0], parts[1])
        if body is None:
            self.send_response(503)
            self.end_headers()
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        # Prometheus may stop mid-scrape (the end of a test module).
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return


class ExporterServer:
    """Every node's exporters on one loopback port (port 0: the OS picks)."""

    def __init__(self, cluster: SiteCluster) -> None:
        handler = type("Handler", (_Handler,), {"cluster": cluster})
        self.cluster = cluster
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="site-exporters", daemon=True)

    def __enter__(self) -> ExporterServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _targets(self) -> Iterator[tuple[str, str, str]]:
        """(scrape job, metrics path, instance label) of every node's exporters."""
        for node in self.cluster.nodes.values():
            port = 9400 if node.vendor == "dcgm" else 5000
            yield node.vendor, f"/{node.vendor}/{node.name}/metrics", f"{node.name}:{port}"
            yield "node", f"/node/{node.name}/metrics", f"{node.name}:9100"

    def prometheus_config(self, interval: str = "1s") -> str:
        jobs: dict[str, list[str]] = {}
        for job, path, instance in self._targets():
            jobs.setdefault(job, []).append(
                f"      - targets: ['127.0.0.1:{self.port}']\n"
                f"        labels: {{__metrics_path__: '{path}', instance: '{instance}'}}\n"
            )
        out = f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\nscrape_configs:\n"
        for job, entries in jobs.items():
            out += f"  - job_name: {job}\n    static_configs:\n" + "".join(entries)
        return out
