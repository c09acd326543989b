"""Scenario simulator for the per-job Prometheus: OpenMetrics fixtures (-> promtool blocks), job logs, a live exporter."""

from __future__ import annotations

import copy
import datetime as _dt
import math
import os
import random
import re
import subprocess
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

SCENARIOS = (
    "healthy",
    "rccl-hang",
    "init-hang",
    "dead-node",
    "rdma-degraded",
    "host-oom-ramp",
    "hardware-fault",
    "restore-fresh",
    "restore-leak",
    "io-contention",
    "thermal-throttle",
    "network-partition",
    "dead-process",
    "hang-then-heartbeat",
    "rdma-background",
    "rdma-trigger",
    "healthy-evals",
    "heartbeat-false-positive",
)

GIB = 2**30
RAS_BLOCKS = ("umc", "xgmi", "gfx", "mmhub", "sdma")
RDMA_DEVICES = ("mlx5_0", "mlx5_1")
BASE_TIME = 1780272000.0  # 2026-06-01T00:00:00Z
SIX_NODES = tuple(f"node{i:03d}" for i in range(1, 7))


@dataclass(frozen=True)
class Scenario:
    name: str = "healthy"
    job_id: str = "4242"
    nodes: tuple[str, ...] = ("node001", "node002", "node003", "node004")
    gpus: int = 8
    start: float = BASE_TIME
    init_s: float = 240.0  # container start, compile: GPUs not training yet
    steps: int = 300  # planned steps=T
    first_step: int = 0
    restored_from: int | None = None
    step_time: float = 6.0
    checkpoint_period: int = 100
    checkpoint_extra_s: float = 20.0
    hw_interval: float = 10.0
    ray_interval: float = 5.0
    tail_s: float = 60.0  # data after the last event (job end)
    hang_after_steps: int | None = None  # steps completed before a hang / crash
    hang_s: float = 1200.0  # how long a hang lasts before scancel
    bad_host: str = "node003"
    bad_gpu: int = 3
    procs_extra: float = 0.0
    tgs_factor: float = 1.0
    seed: int = 7
    dcn_data_parallelism: int = 2
    model: str = "MI300X"
    extra: dict[str, Any] = field(default_factory=dict)


# Each named scenario's departures from the Scenario defaults (`scenario()` copies them).
_SCENARIO_DEFAULTS: dict[str, dict[str, Any]] = {
    "rccl-hang": {"hang_after_steps": 150, "extra": {"tcp_lifetime_outlier": "node002"}},
    "init-hang": {"hang_after_steps": 0, "hang_s": 900.0},
    "dead-node": {"hang_after_steps": 150},
    # The training process on bad_host dies right after the last step; the host keeps reporting.
    "dead-process": {"hang_after_steps": 150, "nodes": SIX_NODES, "bad_host": "node004"},
    # Steps stop at T; every GPU busy-waits; a gRPC deadlock lets the heartbeat kill the job at T + 40 min.
    "hang-then-heartbeat": {
        "hang_after_steps": 150,
        "hang_s": 2400.0,
        "tail_s": 20.0,
        "extra": {"heartbeat_kill": True, "heartbeat_timeout_s": 100.0, "accused_task": 2},
    },
    # A collective hang with single-digit RDMA retransmit / ACK-timeout increments on every host.
    "rdma-background": {"hang_after_steps": 150, "nodes": SIX_NODES, "extra": {"rdma_background": True}},
    # The same background, plus a real retransmit / ACK-timeout burst on bad_host before the stall.
    "rdma-trigger": {
        "hang_after_steps": 150,
        "nodes": SIX_NODES,
        "bad_host": "node005",
        "extra": {"rdma_background": True, "rdma_burst_before_s": 90.0},
    },
    # A healthy run with long checkpoint saves, evals and a mid-run recompilation: pauses
    # between step lines where the GPUs do something other than spin (no hang to page).
    "healthy-evals": {
        "checkpoint_extra_s": 60.0,
        "extra": {"pauses": ((50, 60.0, "eval"), (120, 45.0, "compile"), (150, 60.0, "eval"))},
    },
    # Training runs right up to the heartbeat error that kills the job (gRPC false positive).
    "heartbeat-false-positive": {
        "hang_after_steps": 180,
        "hang_s": 0.0,
        "tail_s": 20.0,
        "extra": {"heartbeat_kill": True, "heartbeat_timeout_s": 100.0, "accused_task": 2},
    },
    "rdma-degraded": {"tgs_factor": 0.92},
    "host-oom-ramp": {"hang_after_steps": 200, "hang_s": 0.0, "tail_s": 20.0},
    "io-contention": {"extra": {"degrade_from": 0.6}, "bad_host": "node002"},
    "thermal-throttle": {"extra": {"degrade_from": 0.6}, "bad_host": "node002"},
    "network-partition": {"hang_after_steps": 150, "bad_host": "node004"},
    "hardware-fault": {"hang_after_steps": 180, "hang_s": 0.0, "tail_s": 20.0, "bad_host": "node002"},
    "restore-fresh": {"steps": 400, "job_id": "5001"},
    "restore-leak": {
        "steps": 600,
        "first_step": 200,
        "restored_from": 200,
        "procs_extra": 5.0,
        "tgs_factor": 0.992,
        "job_id": "5002",
        "start": BASE_TIME + 86400,
    },
}


def scenario(name: str, **kw: Any) -> Scenario:
    """Defaults for each named scenario; keyword arguments override them."""
    if name not in _SCENARIO_DEFAULTS and name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    # A deep copy: a caller that changes its scenario's `extra` must not change the table.
    return Scenario(**{"name": name, **copy.deepcopy(_SCENARIO_DEFAULTS.get(name, {})), **kw})


@dataclass(frozen=True)
class StepRec:
    step: int
    t: float
    seconds: float
    loss: float
    tgs: float
    grad_norm: float
    lr: float


class JobSim:
    """Deterministic metric values for a scenario as functions of (series, time)."""

    BASE_TGS = 8671.8

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        rng = random.Random(sc.seed)
        self.train_start = sc.start + sc.init_s
        self.steps: list[StepRec] = []
        t = self.train_start
        last = sc.steps if sc.hang_after_steps is None else min(sc.steps, sc.first_step + sc.hang_after_steps)
        # Pauses after a step (eval, recompilation): (after step, seconds, kind), no step line meanwhile.
        pauses = {int(k): (float(secs), str(kind)) for k, secs, kind in sc.extra.get("pauses", ())}
        self.pause_windows: list[tuple[float, float, str]] = []
        for k in range(sc.first_step, last):
            extra = sc.checkpoint_extra_s if (k > 0 and k % sc.checkpoint_period == 0) else 0.0
            first = 30.0 if k == sc.first_step else 0.0  # first step includes compilation
            nominal = sc.step_time / sc.tgs_factor
            if "degrade_from" in sc.extra and k >= sc.first_step + sc.extra["degrade_from"] * (
                sc.steps - sc.first_step
            ):
                nominal *= 1.2  # contention in the last part of the run: steps 20% slower
            secs = nominal * (1 + rng.uniform(-0.01, 0.01)) + extra + first
            t += secs
            # Loss depends on the step only, so a restored job reproduces the fresh job's curve.
            loss = (
                2.2 + 8.7 * math.exp(-k / 120.0) + random.Random(sc.seed * 100_003 + k).uniform(-0.004, 0.004)
            )
            tgs = self.BASE_TGS * sc.step_time / secs
            lr = 3e-4 * min(1.0, (k + 1) / 50)
            self.steps.append(
                StepRec(
                    k,
                    round(t, 3),
                    round(secs, 3),
                    round(loss, 3),
                    round(tgs, 3),
                    1.0 + rng.uniform(-0.05, 0.05),
                    lr,
                )
            )
            if k in pauses and k < last - 1:
                secs, kind = pauses[k]
                self.pause_windows.append((t, t + secs, kind))
                t += secs
        self.train_end = self.steps[-1].t if self.steps else self.train_start
        self.hang = sc.hang_after_steps is not None and sc.hang_s > 0
        self.crash = sc.hang_after_steps is not None and sc.hang_s == 0
        self.end = self.train_end + (sc.hang_s if self.hang else 0.0) + sc.tail_s
        self.ckpt_windows = [
            (s.t - s.seconds, s.t) for s in self.steps if s.step > 0 and s.step % sc.checkpoint_period == 0
        ]
        n = len(sc.nodes)
        per = max(1, n // max(1, sc.dcn_data_parallelism))
        self.replica0 = set(sc.nodes[:per])
        self.dead_t = self.train_end + 3.0 if sc.name == "dead-node" else None
        # The process (not the node) dies: the host reports idle GPUs with no user process.
        self.gone_t = self.train_end + 3.0 if sc.name == "dead-process" else None
        self._noise = random.Random(sc.seed + 1)

    # -- phases ------------------------------------------------------------------------------
    def phase(self, host: str, t: float) -> str:
        sc = self.sc
        if self.dead_t is not None and host == sc.bad_host and t >= self.dead_t:
            return "dead"
        if self.gone_t is not None and host == sc.bad_host and t >= self.gone_t:
            return "gone"
        if t < self.train_start:
            return "init"
        if t <= self.train_end or not self.steps and t < self.train_start + 1:
            for a, b, kind in self.pause_windows:
                if a < t < b:
                    return kind
            for a, b in self.ckpt_windows:
                if a + sc.step_time <= t <= b:
                    return "ckpt"
            return "train"
        if self.hang:
            return "busywait"
        return "idle"

    def degraded(self, t: float) -> bool:
        frac = self.sc.extra.get("degrade_from")
        if frac is None or not self.steps:
            return False
        k = self.sc.first_step + frac * (self.sc.steps - self.sc.first_step)
        t0 = next((s.t - s.seconds for s in self.steps if s.step >= k), self.train_end)
        return t0 <= t <= self.train_end

    def series_alive(self, name: str, host: str, t: float) -> bool:
        """Whether one series still reports; `gone_stops` lists metric prefixes that vanish with the process."""
        gone = self.gone_t is not None and host == self.sc.bad_host and t >= self.gone_t
        if gone and name.startswith(tuple(self.sc.extra.get("gone_stops", ()))):
            return False
        return self.alive(host, t)

    def alive(self, host: str, t: float) -> bool:
        if (
            self.sc.name == "network-partition"
            and host == self.sc.bad_host
            and self.train_end - 5 <= t <= self.train_end + 600
        ):
            return False  # unreachable for 10 minutes (the collective hangs on it), then back
        return self.phase(host, t) != "dead" and t <= self.end

    def _n(self, key: str, t: float, amp: float) -> float:
        # Cheap deterministic noise: hash of series key and time bucket.
        h = zlib.crc32(f"{key}|{int(t)}".encode()) & 0xFFFF
        return (h / 0xFFFF - 0.5) * 2 * amp

    # -- GPU -----------------------------------------------------------------------------------
    def busy_gpus(self, host: str) -> set[int]:
        if self.sc.name == "init-hang":
            idx = self.sc.nodes.index(host)
            return {1, 7} if idx in (1, len(self.sc.nodes) - 1) else {4, 7}
        return set(range(self.sc.gpus))

    def gpu_util(self, host: str, g: int, t: float) -> float:
        ph = self.phase(host, t)
        if ph == "train":
            return 100.0
        if ph == "ckpt":
            return 15.0
        if ph == "eval":
            return 98.0  # forward passes: the GPUs compute
        if ph == "busywait":
            return 100.0 if g in self.busy_gpus(host) else 0.0
        return 0.0

    def gpu_user_processes(self, host: str, t: float) -> float:
        return 0.0 if self.phase(host, t) == "gone" else 1.0

    def gpu_power(self, host: str, g: int, t: float) -> float:
        ph = self.phase(host, t)
        key = f"p{host}{g}"
        if ph == "train":
            p = 680.0 + self._n(key, t, 15)
            if self.sc.name == "rdma-degraded":
                p -= 20
            return p
        if ph == "ckpt":
            return 180.0 + self._n(key, t, 10)
        if ph == "eval":
            return 520.0 + self._n(key, t, 15)  # forward only: under training power, far above busy-wait
        if ph == "compile":
            return 130.0 + self._n(key, t, 10)  # XLA compiles on the host CPU: GPUs near idle
        if ph == "busywait":
            return (300.0 if g in self.busy_gpus(host) else 95.0) + self._n(key, t, 10)
        if ph == "init":
            return 140.0 + self._n(key, t, 10)
        if ph == "gone":
            # An idle GPU after its process died; `gone_power_w` moves it within (or near) the idle band.
            return float(self.sc.extra.get("gone_power_w", 90.0)) + self._n(key, t, 5)
        return 90.0 + self._n(key, t, 5)

    def gpu_temp(self, host: str, g: int, t: float) -> float:
        if self.sc.name == "thermal-throttle" and host == self.sc.bad_host and self.degraded(t):
            return 94.0 + g * 0.2 + self._n(f"t{host}{g}", t, 0.5)
        p = self.gpu_power(host, g, t)
        return 30.0 + p * 0.065 + g * 0.3 + self._n(f"t{host}{g}", t, 0.5)

    def gpu_sclk(self, host: str, g: int, t: float) -> float:
        if self.sc.name == "thermal-throttle" and host == self.sc.bad_host and self.degraded(t):
            return 1600.0
        ph = self.phase(host, t)
        return 2100.0 if ph in ("train", "busywait", "ckpt") else 800.0

    def ras(self, host: str, g: int, block: str, kind: str, t: float) -> float:
        sc = self.sc
        if sc.name != "hardware-fault" or host != sc.bad_host or g != sc.bad_gpu or block != "umc":
            return 0.0
        if kind == "ce":
            return float(int(max(0.0, t - self.train_start) / 10.0))  # steadily accumulating CE
        return 2.0 if t >= self.train_end - 120 else 0.0

    def dmesg(self, host: str, t: float) -> float:
        if self.sc.name == "hardware-fault" and host == self.sc.bad_host and t >= self.train_end - 110:
            return 5.0
        return 0.0

    # -- host -----------------------------------------------------------------------------------
    def procs_running(self, host: str, t: float) -> float:
        ph = self.phase(host, t)
        base = 12.0 if ph in ("train", "ckpt", "busywait", "eval", "compile") else 3.0
        if ph in ("train", "ckpt", "busywait", "eval", "compile"):
            base += self.sc.procs_extra
        return round(base + self._n(f"pr{host}", t, 1.0))

    def mem_used(self, host: str, t: float) -> float:
        sc = self.sc
        used = 220 * GIB + self._n(f"m{host}", t, 2 * GIB)
        if self.phase(host, t) == "ckpt" and host in self.replica0:
            used += 300 * GIB
        if sc.name == "host-oom-ramp" and host == sc.bad_host and t >= self.train_start:
            frac = min(1.0, (t - self.train_start) / max(1.0, self.train_end - self.train_start))
            used = 220 * GIB + frac * (self.mem_total() - 222 * GIB)
        return used

    def mem_total(self) -> float:
        return 1024.0 * GIB

    def oom_kills(self, host: str, t: float) -> float:
        return (
            1.0
            if self.sc.name == "host-oom-ramp" and host == self.sc.bad_host and t >= self.train_end
            else 0.0
        )

    def io_full(self, host: str, t: float) -> float:
        if self.sc.name == "io-contention" and self.degraded(t):
            return 35.0
        return 25.0 if self.phase(host, t) == "ckpt" else 0.5

    def tcp_retx(self, host: str, t: float) -> float:
        base = 10_000.0 + 1000.0 * self.sc.nodes.index(host)
        if self.sc.extra.get("tcp_lifetime_outlier") == host:
            base = 12_000_000.0
        return base + 0.2 * (t - self.sc.start)

    def rdma_tx_pkts(self, host: str, dev: str, t: float) -> float:
        active = max(0.0, min(t, self.train_end) - self.train_start)
        return 1e5 * active

    def rdma_retx(self, host: str, dev: str, t: float) -> float:
        el = max(0.0, t - self.sc.start)
        if self.sc.name == "rdma-degraded" and host == self.sc.bad_host and dev == "mlx5_0":
            return 50.0 * el
        v = float(int(0.002 * el))
        if self.sc.extra.get("rdma_background"):
            v += self._background(f"rx{host}{dev}", t, period=90.0, size=6)
        return v + 200.0 * self._burst(host, dev, t)

    def rdma_ack_timeout(self, host: str, dev: str, t: float) -> float:
        el = max(0.0, t - self.sc.start)
        if self.sc.name == "rdma-degraded" and host == self.sc.bad_host and dev == "mlx5_0":
            return 2.0 * el
        v = 0.0
        if self.sc.extra.get("rdma_background"):
            v += self._background(f"ack{host}{dev}", t, period=240.0, size=2)
        return v + 2.0 * self._burst(host, dev, t)

    def _background(self, key: str, t: float, *, period: float, size: int) -> float:
        """Sparse single-digit increments: about one every `period` s, each of 1..size, at per-series phases."""
        el = max(0.0, t - self.sc.start)
        phase = (zlib.crc32(key.encode()) & 0xFFFF) / 0xFFFF * period
        ticks = int((el + phase) // period)
        return float(sum(1 + zlib.crc32(f"{key}|{i}".encode()) % size for i in range(ticks)))

    def _burst(self, host: str, dev: str, t: float) -> float:
        """Seconds of burst so far on bad_host's first device (from `rdma_burst_before_s` before the last step)."""
        lead = self.sc.extra.get("rdma_burst_before_s")
        if lead is None or host != self.sc.bad_host or dev != RDMA_DEVICES[0] or not self.steps:
            return 0.0
        return max(0.0, t - (self.train_end - float(lead)))

    # -- series table ------------------------------------------------------------------------------
    def hw_series(self) -> Iterator[tuple[str, str, str, Any]]:
        """(metric name, label string, host, value(t)) for every hw_* series."""
        sc = self.sc
        for h in sc.nodes:
            for g in range(sc.gpus):
                lab = f'host="{h}",gpu="{g}"'
                yield "hw_gpu_temperature_celsius", lab, h, lambda t, h=h, g=g: self.gpu_temp(h, g, t)
                yield "hw_gpu_power_watts", lab, h, lambda t, h=h, g=g: self.gpu_power(h, g, t)
                yield "hw_gpu_clock_mhz", lab + ',type="sclk"', h, lambda t, h=h, g=g: self.gpu_sclk(h, g, t)
                yield "hw_gpu_clock_mhz", lab + ',type="mclk"', h, lambda t: 1300.0
                yield (
                    "hw_gpu_vram_used_bytes",
                    lab,
                    h,
                    lambda t, h=h: 2 * GIB if self.phase(h, t) in ("init", "gone") else 170 * GIB,
                )
                yield "hw_gpu_vram_total_bytes", lab, h, lambda t: 192.0 * GIB
                yield "hw_gpu_user_processes", lab, h, lambda t, h=h: self.gpu_user_processes(h, t)
                for b in RAS_BLOCKS:
                    for kind in ("ue", "ce"):
                        yield (
                            f"hw_gpu_ras_{b}_{kind}_total",
                            lab,
                            h,
                            lambda t, h=h, g=g, b=b, k=kind: self.ras(h, g, b, k, t),
                        )
                for kind in ("correctable", "nonfatal", "fatal"):
                    yield f"hw_gpu_pcie_{kind}_total", lab, h, lambda t: 0.0
            lab = f'host="{h}"'
            yield "hw_procs_running", lab, h, lambda t, h=h: self.procs_running(h, t)
            yield "hw_procs_blocked", lab, h, lambda t, h=h: 4.0 if self.phase(h, t) == "ckpt" else 0.0
            yield "hw_context_switches_total", lab, h, lambda t: 5e4 * (t - sc.start)
            yield "hw_oom_kills_total", lab, h, lambda t, h=h: self.oom_kills(h, t)
            yield (
                "hw_mem_dirty_bytes",
                lab,
                h,
                lambda t, h=h: 8 * GIB if self.phase(h, t) == "ckpt" else 0.05 * GIB,
            )
            yield "hw_mem_writeback_bytes", lab, h, lambda t: 0.0
            yield "hw_io_pressure_some_pct", lab, h, lambda t, h=h: self.io_full(h, t) * 1.5
            yield "hw_io_pressure_full_pct", lab, h, lambda t, h=h: self.io_full(h, t)
            yield "hw_io_pressure_some_avg300_pct", lab, h, lambda t: 1.0
            yield "hw_io_pressure_full_avg300_pct", lab, h, lambda t: 0.5
            yield "hw_dmesg_gpu_errors_total", lab, h, lambda t, h=h: self.dmesg(h, t)
            yield "hw_scrape_duration_seconds", lab, h, lambda t: 0.4
            yield "hw_tcp_retransmits_total", lab, h, lambda t, h=h: self.tcp_retx(h, t)
            for n in ("listen_overflows", "listen_drops", "estab_resets", "abort_on_timeout"):
                yield f"hw_tcp_{n}_total", lab, h, lambda t: 0.0
            for d in ("rx", "tx"):
                yield f"hw_net_{d}_bytes_total", lab + ',device="eth0"', h, lambda t: 1e6 * (t - sc.start)
                yield f"hw_net_{d}_errors_total", lab + ',device="eth0"', h, lambda t: 0.0
                yield f"hw_net_{d}_drop_total", lab + ',device="eth0"', h, lambda t: 0.0
            for dev in RDMA_DEVICES:
                dl = lab + f',device="{dev}",port="1"'
                yield "hw_rdma_tx_pkts_total", dl, h, lambda t, h=h, d=dev: self.rdma_tx_pkts(h, d, t)
                yield "hw_rdma_rx_pkts_total", dl, h, lambda t, h=h, d=dev: self.rdma_tx_pkts(h, d, t)
                yield "hw_rdma_tx_bytes_total", dl, h, lambda t, h=h, d=dev: 4096 * self.rdma_tx_pkts(h, d, t)
                yield "hw_rdma_rx_bytes_total", dl, h, lambda t, h=h, d=dev: 4096 * self.rdma_tx_pkts(h, d, t)
                yield "hw_rdma_tx_retx_pkts_total", dl, h, lambda t, h=h, d=dev: self.rdma_retx(h, d, t)
                yield (
                    "hw_rdma_tx_retx_bytes_total",
                    dl,
                    h,
                    lambda t, h=h, d=dev: 4096 * self.rdma_retx(h, d, t),
                )
                yield (
                    "hw_rdma_tx_ack_timeout_total",
                    dl,
                    h,
                    lambda t, h=h, d=dev: self.rdma_ack_timeout(h, d, t),
                )
                yield "hw_rdma_rx_ecn_pkts_total", dl, h, lambda t: 0.0
                yield "hw_rdma_rx_cnp_pkts_total", dl, h, lambda t: 0.0
                yield "hw_rdma_tx_cnp_pkts_total", dl, h, lambda t: 0.0
                yield "hw_rdma_req_rx_cqe_err_total", dl, h, lambda t: 0.0
                yield "hw_rdma_req_tx_retry_excd_err_total", dl, h, lambda t: 0.0
                yield "hw_rdma_port_state", dl, h, lambda t: 1.0

    def ray_series(self) -> Iterator[tuple[str, str, str, Any]]:
        for i, h in enumerate(self.sc.nodes):
            ip = f"10.0.0.{i + 1}"
            for g in range(self.sc.gpus):
                yield (
                    "ray_node_gpus_utilization",
                    f'host="{h}",ip="{ip}",GpuIndex="{g}"',
                    h,
                    lambda t, h=h, g=g: self.gpu_util(h, g, t),
                )
            lab = f'host="{h}",ip="{ip}"'
            yield "ray_node_mem_used", lab, h, lambda t, h=h: self.mem_used(h, t)  # noqa: B023
            yield "ray_node_mem_total", lab, h, self._const(self.mem_total())
            yield "ray_node_cpu_utilization", lab, h, lambda t, h=h: self.cpu_util(h, t)

    def cpu_util(self, host: str, t: float) -> float:
        ph = self.phase(host, t)
        if ph == "compile":
            return 90.0  # XLA compilation is host CPU work
        return 35.0 if ph in ("train", "busywait", "eval") else 5.0

    @staticmethod
    def _const(v: float) -> Callable[[float], float]:
        return lambda _t: v

    def tb_samples(self) -> list[tuple[str, float, float]]:
        """(name, t, value) of rank-0 training metrics, with 150 s staleness fills while steps stall."""
        out: list[tuple[str, float, float]] = []
        prev_t = self.train_start
        last: StepRec | None = None
        for s in self.steps:
            out.extend(self._tb_point(s, s.t, 0.0))
            prev_t, last = s.t, s
        if last is not None:
            t = prev_t + 150.0
            while t < self.end:
                out.extend(self._tb_point(last, t, 1.0))
                t += 150.0
        return out

    @staticmethod
    def _tb_point(s: StepRec, t: float, fill: float) -> list[tuple[str, float, float]]:
        return [
            ("tb_step", t, float(s.step)),
            ("tb_learning_loss", t, s.loss),
            ("tb_learning_grad_norm", t, s.grad_norm),
            ("tb_learning_raw_grad_norm", t, s.grad_norm),
            ("tb_learning_current_learning_rate", t, s.lr),
            ("tb_perf_step_time_seconds", t, s.seconds),
            ("tb_perf_per_device_tokens_per_sec", t, s.tgs),
            ("tb_perf_per_device_tflops_per_sec", t, s.tgs / 30.0),
            ("tb_metrics_plugin_staleness_fill", t, fill),
        ]


def _times(start: float, end: float, step: float) -> Iterator[float]:
    n = int((end - start) // step)
    for i in range(n + 1):
        yield round(start + i * step, 3)


def write_openmetrics(sim: JobSim, out: TextIO) -> int:
    """Write every series of the scenario, one series at a time (each in time order). Returns sample count."""
    sc = sim.sc
    count = 0
    hw_times = list(_times(sc.start, sim.end, sc.hw_interval))
    ray_times = list(_times(sc.start, sim.end, sc.ray_interval))
    groups: dict[str, list[tuple[str, str, Callable[[float], float]]]] = {}
    for name, lab, host, fn in sim.hw_series():
        groups.setdefault(name, []).append((lab, host, fn))
    for name, series in groups.items():
        for lab, host, fn in series:
            buf = [
                f"{name}{{{lab}}} {fn(t):.12g} {t:.3f}\n" for t in hw_times if sim.series_alive(name, host, t)
            ]
            out.write("".join(buf))
            count += len(buf)
    rgroups: dict[str, list[tuple[str, str, Callable[[float], float]]]] = {}
    for name, lab, host, fn in sim.ray_series():
        rgroups.setdefault(name, []).append((lab, host, fn))
    for name, series in rgroups.items():
        for lab, host, fn in series:
            buf = [
                f"{name}{{{lab}}} {fn(t):.12g} {t:.3f}\n"
                for t in ray_times
                if sim.series_alive(name, host, t)
            ]
            out.write("".join(buf))
            count += len(buf)
    for job, port, times in (("node_hw", 9400, hw_times), ("ray", 55080, ray_times)):
        for h in sc.nodes:
            buf = [
                f'up{{job="{job}",instance="{h}:{port}"}} {1 if sim.alive(h, t) else 0} {t:.3f}\n'
                for t in times
                if not (sim.dead_t is not None and h == sc.bad_host and t >= sim.dead_t + 60)
            ]
            out.write("".join(buf))
            count += len(buf)
    head = sc.nodes[0]
    tb: dict[str, list[tuple[float, float]]] = {}
    # `no_tb`: the training-metrics plugin did not run (the TSDB has system metrics only).
    for name, t, v in [] if sc.extra.get("no_tb") else sim.tb_samples():
        tb.setdefault(name, []).append((t, v))
    for name, pts in tb.items():
        out.write("".join(f'{name}{{host="{head}"}} {v:.8g} {t:.3f}\n' for t, v in pts))
        count += len(pts)
    out.write("# EOF\n")
    return count


def build_tsdb(
    sim: JobSim, tsdb_dir: Path, *, promtool: str = "/usr/bin/promtool", work: Path | None = None
) -> int:
    """Write OpenMetrics and turn it into TSDB blocks with promtool. Returns the number of samples."""
    om = (work or tsdb_dir.parent) / f".{sim.sc.job_id}-{sim.sc.name}.om"
    return openmetrics_blocks(lambda fh: write_openmetrics(sim, fh), om, tsdb_dir, promtool)


def openmetrics_blocks(write: Callable[[TextIO], int], om: Path, tsdb_dir: Path, promtool: str) -> int:
    """`write` OpenMetrics to the scratch file `om`, turn it into TSDB blocks in `tsdb_dir` with
    promtool, and remove it. Returns the number of samples written."""
    tsdb_dir.mkdir(parents=True, exist_ok=True)
    with om.open("w") as fh:
        n = write(fh)
    try:
        subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb_dir)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    finally:
        om.unlink(missing_ok=True)
    return n


# --- job log -----------------------------------------------------------------------------------------


def _absl(t: float) -> str:
    d = _dt.datetime.fromtimestamp(t, tz=_dt.UTC)
    return f"I{d:%m%d %H:%M:%S}.{d.microsecond:06d} 139872 metric_logger.py:232] "


_RAY_STAMP = re.compile(r"\(raylet\) \[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
_ABSL_STAMP = re.compile(r"[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ")


def _line_time(line: str) -> float:
    """Sort key of a line of `write_job`'s log: its stamp (undated header lines first; stable)."""
    m = _RAY_STAMP.search(line)
    if m is not None:
        d = _dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=_dt.UTC)
        return d.timestamp() + int(m.group(2)) / 1000
    a = _ABSL_STAMP.search(line)
    if a is not None:
        mon, day, hh, mm, ss, us = (int(x) for x in a.groups())
        year = _dt.datetime.fromtimestamp(BASE_TIME, tz=_dt.UTC).year
        return _dt.datetime(year, mon, day, hh, mm, ss, us, tzinfo=_dt.UTC).timestamp()
    return float("-inf")


def _nodelist(nodes: tuple[str, ...]) -> str:
    nums = [n[4:] for n in nodes]
    if all(n.startswith("node") for n in nodes) and nums == [
        f"{i:03d}" for i in range(int(nums[0]), int(nums[0]) + len(nums))
    ]:
        return f"node[{nums[0]}-{nums[-1]}]"
    return ",".join(nodes)


@dataclass(frozen=True)
class JobFiles:
    log: Path
    job_dir: Path
    prometheus: Path


def job_name(sc: Scenario) -> str:
    return f"JAX-llama2-70b-{sc.name}"


def write_job(
    sim: JobSim,
    outputs: Path,
    *,
    port: int = 9190,
    finished: bool = True,
    with_tsdb: bool = True,
    ray: bool = True,
    hang_chatter_s: float | None = None,
) -> JobFiles:
    """Write `<id>-<name>.log` and `<id>-<name>/` (log link, ray_logs, prometheus blocks).

    `hang_chatter_s`: during a hang (and a pause), the head's raylet prints a dated state dump this
    often, as real hung RAY=1 jobs do (without Ray: task 0's pending-event logger, during a hang);
    a replay's clock (`jobdiagd backtest`) then sees the hang last.
    `extra["unforwarded_end"]` (RAY=1): Ray stopped forwarding the training processes' output
    after the last step, so what they print at the end (the heartbeat error) is in the head's
    worker log only, and the job log goes on with the job script's undated lines (each node's
    "Training subprocess exited with code N", then the JOB SUMMARY)."""
    sc = sim.sc
    stem = f"{sc.job_id}-{job_name(sc)}"
    job_dir = outputs / stem
    log_path = outputs / f"{stem}.log"
    job_dir.mkdir(parents=True, exist_ok=True)
    link = job_dir / "log"
    if not link.exists():
        os.symlink(f"../{stem}.log", link)
    head = sc.nodes[0]
    lines = _log_head(sim, stem, port=port, ray=ray)
    worker = _nccl_waves(sim)
    _add_steps(sim, lines, worker, ray=ray)
    if hang_chatter_s:
        lines += _raylet_chatter(sim, hang_chatter_s) if ray else _stall_chatter(sim, hang_chatter_s)
        lines.sort(key=_line_time)
    failure = _failure_lines(sim)
    if ray and sc.extra.get("unforwarded_end"):
        worker += [ln.split(": ", 1)[1] for ln in failure if ln.startswith("0: ")]  # the head's task
        rc = 1 if failure else 0
        failure = [
            f"{i}: [Node {i} @ {host}] Training subprocess exited with code {rc}"
            for i, host in enumerate(sc.nodes)
        ]
    lines += failure
    if finished:
        lines += _job_summary(sim)
    log_path.write_text("\n".join(lines) + "\n")
    ray_dir = job_dir / "ray_logs" / head
    if ray:
        ray_dir.mkdir(parents=True, exist_ok=True)
        (ray_dir / "worker-0a1b2c-01000000-2345.out").write_text("\n".join(worker) + "\n")
    prom = job_dir / "prometheus"
    if ray and with_tsdb:
        build_tsdb(sim, prom, work=outputs)
        if sc.name in ("rccl-hang", "hardware-fault"):
            (prom / "lock").write_text("")  # stale lock left by the job's Prometheus
    return JobFiles(log_path, job_dir, prom)


def _passthrough_args(sc: Scenario) -> str:
    args = f"steps={sc.steps} per_device_batch_size=2 enable_checkpointing=true checkpoint_period={sc.checkpoint_period} dcn_data_parallelism={sc.dcn_data_parallelism}"
    if sc.restored_from is not None or sc.name.startswith("restore"):
        args += " enable_single_replica_ckpt_restoring=true"
    if "heartbeat_timeout_s" in sc.extra:
        args += f" jax_distributed_heartbeat_timeout_seconds={int(sc.extra['heartbeat_timeout_s'])}"
    return args


def _log_head(sim: JobSim, stem: str, *, port: int, ray: bool) -> list[str]:
    """The launcher's header, preflight, Ray/Prometheus start-up, restore and barrier lines."""
    sc = sim.sc
    head = sc.nodes[0]
    lines = [
        f"JOB_ID={sc.job_id}",
        f"JOB_NAME={job_name(sc)}",
        f"NNODES={len(sc.nodes)}",
        f"JOB_NODELIST={_nodelist(sc.nodes)}",
        "JAX_COORDINATOR_PORT=12345",
    ]
    if ray:
        lines.append("RAY_PORT=6379")
    lines += [
        f'PASSTHROUGH_ARGS="{_passthrough_args(sc)}"',
        "MODEL_NAME=llama2-70b",
        f"[INFO] Running from artifact: /outputs/{stem}/artifact",
        '==STAGE TIMEOUTS (override: STAGE_TIMEOUTS="stage:seconds,...")==',
        "  preflight    900s",
        "  train        none",
        "== Preflight BEGIN (timeout=900s) ==",
        "== Preflight END (14s) ==",
    ]
    if ray:
        lines += _ray_start_lines(head, stem, port)
    if sc.restored_from is not None:
        lines.append(
            f"0: {_absl(sim.train_start - 5)}restoring from this run's directory step {sc.restored_from}"
        )
    else:
        lines.append(
            f"0: {_absl(sim.train_start - 5)}No existing checkpoints found, not restoring checkpoint."
        )
    lines.append(f"0: {_absl(sim.train_start - 2)}====== BARRIER PASSED: Starting training loop ======")
    return lines


def _ray_start_lines(head: str, stem: str, port: int) -> list[str]:
    return [
        f"[Ray] Starting HEAD on {head}:6379 (bind=10.0.0.1)",
        *[f"[Prometheus] Port {p} occupied, trying {p + 1}..." for p in range(9190, port)],
        *([f"[Prometheus] WARNING: port 9190 was occupied; using {port} instead"] if port != 9190 else []),
        f"[Prometheus] Started on port {port} (ray: '{head}:55080', node_hw: '{head}:9400')",
        f"[Prometheus] TSDB -> /outputs/{stem}/prometheus (persistent)",
        f"0:   ssh -J me@login01 -L 8265:localhost:8265 -L 6006:localhost:6006 -L {port}:localhost:{port} root@{head}",
    ]


def _nccl_waves(sim: JobSim) -> list[str]:
    """The worker log's NCCL warning waves: start-up, (restore broadcast), training."""
    sc = sim.sc
    head = sc.nodes[0]
    worker: list[str] = []

    def nccl_wave(t: float) -> None:
        # NCCL >= 2.26 prefixes WARN lines with "[%F %T] "; one line per local rank.
        d = _dt.datetime.fromtimestamp(t, tz=_dt.UTC)
        for rank in range(sc.gpus):
            worker.append(
                f"[{d:%Y-%m-%d %H:%M:%S}] {head}:2345:{2400 + rank} [{rank}] init.cc:2095 NCCL WARN MSCCL++: Feature not enabled. ENABLE_MSCCLPP must be defined at compile-time to enable this feature."
            )

    nccl_wave(sc.start + 30)  # startup
    if sc.restored_from is not None and sc.extra.get("restore_extra_wave", True):
        # Single-replica restore broadcast: the extra wave (absent when Orbax's dispatcher path is used).
        nccl_wave(sim.train_start - 120)
    nccl_wave(sim.train_start - 20)  # training
    return worker


def _add_steps(sim: JobSim, lines: list[str], worker: list[str], *, ray: bool) -> None:
    """Each step's line in the job log and the worker log, and a save line at each checkpoint."""
    sc = sim.sc
    prefix = "(MaxTextTrainerActor pid=2345) " if ray else ""
    for s in sim.steps:
        text = (
            f"completed step: {s.step}, seconds: {s.seconds:.3f}, TFLOP/s/device: {s.tgs / 30.0:.3f}, "
            f"Tokens/s/device: {s.tgs:.3f}, total_weights: 196608, loss: {s.loss:.3f}"
        )
        lines.append(f"0: {prefix}{_absl(s.t)}{text}")
        worker.append(f"{_absl(s.t)}{text}")
        if s.step > 0 and s.step % sc.checkpoint_period == 0:
            lines.append(f"0: {prefix}{_absl(s.t + 0.5)}Saved a checkpoint at step {s.step}.")


def _raylet_chatter(sim: JobSim, every_s: float) -> list[str]:
    """The head raylet's dated state dumps during the hang and each pause."""
    quiet = [(sim.train_end, sim.train_end + sim.sc.hang_s)] if sim.hang else []
    out: list[str] = []
    for a, b in [*quiet, *((a, b) for a, b, _k in sim.pause_windows)]:
        t = a + every_s
        while t < b:
            d = _dt.datetime.fromtimestamp(t, tz=_dt.UTC)
            ts = f"{d:%Y-%m-%d %H:%M:%S},{d.microsecond // 1000:03d}"
            out.append(
                f"0: (raylet) [{ts} I 4242 4242] (raylet) node_manager.cc:525: [state-dump] "
                "NodeManager: [state-dump] Node ID: 5f1e0a1b2c3d4e5f"
            )
            t += every_s
    return out


def _stall_chatter(sim: JobSim, every_s: float) -> list[str]:
    """Without Ray: task 0's PjRt pending-event logger, dated, while the hang lasts (the collective
    never completes), so a replay's clock sees the hang last too."""
    if not sim.hang:
        return []
    out: list[str] = []
    t = sim.train_end + every_s
    while t < sim.train_end + sim.sc.hang_s:
        waited = int(t - sim.train_end)
        out.append(
            "0: "
            + _absl(t).replace("I", "W", 1).replace("metric_logger.py:232", "pending_event_logger.cc:88")
            + f"pending_event_logger: 1 event(s) still pending after {waited}s: "
            "PjRtStreamExecutorBuffer::BlockHostUntilReady (device 0)"
        )
        t += every_s
    return out


def _failure_lines(sim: JobSim) -> list[str]:
    """What the failing scenarios print at the end: OOM kill, heartbeat errors, SIGABRT."""
    sc = sim.sc
    lines: list[str] = []
    if sc.name == "host-oom-ramp":
        lines.append(
            f"{sc.nodes.index(sc.bad_host)}: Memory cgroup out of memory: Killed process 424242 (python3) total-vm:1kB, anon-rss:1kB"
        )
        lines.append(f"NODE_EXIT host={sc.bad_host} exit=137")
    if sc.extra.get("heartbeat_kill") and (sim.hang or sim.crash):
        from jobdiagd_sim.lines import heartbeat_block

        crash = sim.train_end + sc.hang_s
        width = len(str(len(sc.nodes) - 1))
        for task in range(len(sc.nodes)):
            for ln in heartbeat_block(crash + 0.01 * task, 157988, [int(sc.extra.get("accused_task", 1))]):
                lines.append(f"{task:>{width}}: {ln}")
    if sc.name == "hardware-fault":
        lines.append(
            f"{sc.nodes.index(sc.bad_host)}: [Node {sc.nodes.index(sc.bad_host)} @ {sc.bad_host}] Training subprocess killed by SIGABRT (signal 6)"
        )
        lines.append(f"NODE_EXIT host={sc.bad_host} exit=134")
    return lines


def _job_summary(sim: JobSim) -> list[str]:
    sc = sim.sc
    status = "SUCCESS (exit 0)"
    if sc.extra.get("heartbeat_kill") and (sim.hang or sim.crash):
        status = "FAILED (exit 1) — Training FAILED (exit=1)"
    elif sim.hang or sc.name == "dead-node":
        status = "FAILED (exit 143) — CANCELLED (scancel / SIGTERM)"
    elif sim.crash:
        status = "FAILED (exit 1) — Training FAILED (exit=1)"
    wall = int(sim.end - sc.start)
    return [
        "========================== JOB SUMMARY ==========================",
        f"  Job:    {sc.job_id} ({job_name(sc)})",
        "  Model:  llama2-70b",
        f"  Nodes:  {len(sc.nodes)}",
        f"  Wall:   {wall // 3600}h {wall % 3600 // 60}m {wall % 60}s",
        f"  Status: {status}",
        "=================================================================",
    ]


# --- live exporter ----------------------------------------------------------------------------------


class LiveExporter:
    """A prometheus_client HTTP exporter serving the scenario's current values (sim time = wall - offset)."""

    def __init__(self, sim: JobSim, *, clock: Callable[[], float], offset: float, port: int = 0) -> None:
        from prometheus_client import CollectorRegistry
        from prometheus_client.core import GaugeMetricFamily
        from prometheus_client.registry import Collector

        self.sim = sim
        self.clock = clock
        self.offset = offset
        self.registry = CollectorRegistry()
        outer = self

        class _C(Collector):
            def collect(self) -> Iterator[GaugeMetricFamily]:
                yield from outer._collect(GaugeMetricFamily)

        self.registry.register(_C())
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def _collect(self, family: Any) -> Iterator[Any]:
        now = self.clock()
        t = now - self.offset
        fams: dict[str, Any] = {}
        for name, lab, host, fn in [*self.sim.hw_series(), *self.sim.ray_series()]:
            if not self.sim.series_alive(name, host, t):
                continue
            labels = dict(kv.split("=", 1) for kv in lab.split(","))
            labels = {k: v.strip('"') for k, v in labels.items()}
            fam = fams.get(name)
            if fam is None:
                fam = fams[name] = family(name, name, labels=sorted(labels))
            fam.add_metric([labels[k] for k in sorted(labels)], fn(t))
        yield from fams.values()
        last: dict[str, tuple[float, float]] = {}
        for name, ts, v in self.sim.tb_samples():
            if ts <= t:
                last[name] = (ts, v)
        for name, (ts, v) in last.items():
            fam = family(name, name, labels=["host"])
            fam.add_metric([self.sim.sc.nodes[0]], v, timestamp=ts + self.offset)
            yield fam

    def start(self) -> int:
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)
        self.port = int(self._server.server_port)
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def main(argv: list[str] | None = None) -> int:
    """`python -m jobdiagd_sim.metrics SCENARIO OUTPUTS` writes a job log + TSDB fixture."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("scenario", choices=SCENARIOS)
    p.add_argument("outputs", type=Path)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--steps", type=int)
    a = p.parse_args(argv)
    kw: dict[str, Any] = {"nodes": tuple(f"node{i:03d}" for i in range(1, a.nodes + 1)), "gpus": a.gpus}
    if a.steps:
        kw["steps"] = a.steps
    sc = scenario(a.scenario, **kw)
    files = write_job(JobSim(sc), a.outputs)
    print(files.log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "SCENARIOS",
    "JobFiles",
    "JobSim",
    "LiveExporter",
    "Scenario",
    "build_tsdb",
    "replace",
    "scenario",
    "write_job",
    "write_openmetrics",
]
