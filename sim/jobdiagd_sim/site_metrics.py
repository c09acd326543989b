"""A simulated job's hosts as a site's central Prometheus sees them: GPU exporter and node_exporter
series under the exporters' own names and labels, as OpenMetrics for `promtool tsdb
create-blocks-from openmetrics` (the site source's backtest and benchmark, docs/site-prometheus.md).

`vendor="amd"`: AMD Device Metrics Exporter (`gpu_power_usage`, `gpu_gfx_activity`,
`gpu_umc_activity`, `gpu_used_vram` in MB; labels `hostname`, `gpu_id`, `card_series`, and the
Slurm integration's `job_id`); `vendor="dcgm"`: NVIDIA DCGM exporter (`DCGM_FI_DEV_*`, framebuffer
in MiB; labels `Hostname`, `gpu`, `modelName`, and with HPC job mapping `hpc_job`). The values are
`metrics.JobSim`'s (its GPUs draw MI300X power, whatever the exporter is called: with DCGM names a
site sets `[tsdb] gpu_model`, or the `model` label names the simulated model). node_exporter's
PSI, netstat and infiniband counters carry `instance="<host>:9100"`.

A GPU whose training process is gone holds 0.3 GiB (the framebuffer freed), any other 170 GiB:
what the site source reads as "no process" (rule SITE-2). A host that died (`dead-node`) stops
reporting every series, as an exporter on a dead host does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, Literal, TextIO

from jobdiagd_sim.metrics import GIB, RDMA_DEVICES, JobSim, _times, openmetrics_blocks

Vendor = Literal["amd", "dcgm"]
MIB = 2**20
CARD_SERIES = {"MI300X": "AMD Instinct MI300X OAM", "MI355X": "AMD Instinct MI355X OAM"}

Fn = Callable[[float], float]


def _mem_activity(sim: JobSim, host: str, g: int, t: float) -> float:
    """Memory controller busy (%): high while training, a few % while spinning."""
    phase = sim.phase(host, t)
    return {"train": 55.0, "eval": 40.0, "ckpt": 20.0, "busywait": 3.0}.get(phase, 0.0)


def _vram(sim: JobSim, host: str, t: float) -> float:
    return 0.3 * GIB if sim.gpu_user_processes(host, t) == 0 else 170.0 * GIB


def _gpu_series(sim: JobSim, vendor: Vendor, job_label: bool) -> Iterator[tuple[str, str, str, Any]]:
    sc = sim.sc
    if vendor == "amd":
        names = ("gpu_power_usage", "gpu_gfx_activity", "gpu_umc_activity", "gpu_used_vram")
        model = CARD_SERIES.get(sc.model, sc.model)
    else:
        names = (
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            "DCGM_FI_DEV_FB_USED",
        )
        model = sc.model
    for h in sc.nodes:
        for g in range(sc.gpus):
            if vendor == "amd":
                lab = f'hostname="{h}",gpu_id="{g}",card_series="{model}"'
                lab += f',job_id="{sc.job_id if job_label else ""}"'
            else:
                lab = f'Hostname="{h}",gpu="{g}",modelName="{model}"'
                lab += f',hpc_job="{sc.job_id}"' if job_label else ""
            power, util, mem, vram = names
            yield power, lab, h, lambda t, h=h, g=g: sim.gpu_power(h, g, t)
            yield util, lab, h, lambda t, h=h, g=g: sim.gpu_util(h, g, t)
            yield mem, lab, h, lambda t, h=h, g=g: _mem_activity(sim, h, g, t)
            yield vram, lab, h, lambda t, h=h: _vram(sim, h, t) / MIB


def _node_series(sim: JobSim, times: list[float]) -> Iterator[tuple[str, str, str, Any]]:
    sc = sim.sc
    for h in sc.nodes:
        lab = f'instance="{h}:9100",job="node"'
        # PSI "full" I/O: seconds stalled, the integral of the percent the job's hosts show.
        stalled: dict[float, float] = {}
        total, prev = 0.0, sc.start
        for t in times:
            total += sim.io_full(h, t) / 100.0 * (t - prev)
            stalled[t], prev = total, t
        yield "node_pressure_io_stalled_seconds_total", lab, h, lambda t, s=stalled: s[t]
        yield "node_pressure_memory_waiting_seconds_total", lab, h, lambda t: 0.005 * (t - sc.start)
        yield "node_netstat_Tcp_RetransSegs", lab, h, lambda t, h=h: sim.tcp_retx(h, t)
        for dev in RDMA_DEVICES:
            dl = lab + f',device="{dev}",port="1"'
            yield (
                "node_infiniband_local_ack_timeout_errors_total",
                dl,
                h,
                lambda t, h=h, d=dev: sim.rdma_ack_timeout(h, d, t),
            )
            yield (
                "node_infiniband_packet_sequence_errors_total",
                dl,
                h,
                lambda t, h=h, d=dev: sim.rdma_retx(h, d, t),
            )


def write_site_openmetrics(
    sim: JobSim, out: TextIO, *, vendor: Vendor = "amd", job_label: bool = True
) -> int:
    """Every site series of the job's hosts, one series at a time. Returns the sample count."""
    times = list(_times(sim.sc.start, sim.end, sim.sc.hw_interval))
    groups: dict[str, list[tuple[str, str, Fn]]] = {}
    for name, lab, host, fn in (*_gpu_series(sim, vendor, job_label), *_node_series(sim, times)):
        groups.setdefault(name, []).append((lab, host, fn))
    count = 0
    for name, series in groups.items():
        for lab, host, fn in series:
            buf = [f"{name}{{{lab}}} {fn(t):.12g} {t:.3f}\n" for t in times if sim.alive(host, t)]
            out.write("".join(buf))
            count += len(buf)
    out.write("# EOF\n")
    return count


def build_site_tsdb(
    sim: JobSim,
    tsdb_dir: Path,
    *,
    vendor: Vendor = "amd",
    job_label: bool = True,
    promtool: str = "/usr/bin/promtool",
    work: Path | None = None,
) -> int:
    """The job's site series as TSDB blocks (promtool). Returns the number of samples."""
    om = (work or tsdb_dir.parent) / f".site-{sim.sc.job_id}-{sim.sc.name}.om"
    write = partial(write_site_openmetrics, sim, vendor=vendor, job_label=job_label)
    return openmetrics_blocks(write, om, tsdb_dir, promtool)
