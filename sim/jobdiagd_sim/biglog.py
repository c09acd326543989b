"""Streams a realistic multi-GB RAY=0 Slurm log for benchmarks without holding it in memory.

`undated_steps=True` prints the step lines the way print()-era MaxText did (no absl prefix, so
only the `seconds:` fields time them) while XLA/NCCL chatter keeps its own stamps: the mixed
shape `jobdiagd backtest` has to clock.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from jobdiagd_sim import lines as L
from jobdiagd_sim.job import SIM_EPOCH

CHUNK = 8 << 20  # bytes per write
REFRESH = 200  # steps between noise-pool re-renders


@dataclass(frozen=True)
class BigLogResult:
    path: Path
    size: int
    first_step: int
    last_step: int
    total_steps: int
    nodes: int
    lines: int

    def to_dict(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "size": self.size,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "total_steps": self.total_steps,
            "nodes": self.nodes,
            "lines": self.lines,
        }


def write_biglog(
    out: Path,
    size_bytes: int,
    *,
    nodes: int = 24,
    noise_per_step: int = 40,
    step_time: float = 5.6,
    seed: int = 0,
    job_id: str = "99001",
    model: str = "llama3.1-405b",
    undated_steps: bool = False,
) -> BigLogResult:
    """Write a completed-job log of at least `size_bytes` (header, steps on every node, noise, summary)."""
    rng = random.Random(f"biglog:{seed}")
    hosts = L.hostnames(nodes)
    name = L.job_name(model, "bench")
    prefixes = [L.srun_prefix(r, nodes) for r in range(nodes)]
    tids = [rng.randrange(130000, 160000) for _ in hosts]
    pre = _node_preamble(hosts, prefixes, job_id, name)
    t = SIM_EPOCH + 600.0  # training starts ten minutes in
    noise = _NoisePool(hosts, prefixes, tids, rng, t)
    # Size the run up front so the header's steps= matches the last step (a completed job).
    absl_width = 0 if undated_steps else 48
    total_steps = _steps_for_size(
        size_bytes, pre, noise, len(prefixes[-1]) + absl_width, nodes, noise_per_step
    )
    header = L.header_lines(
        job_id=job_id,
        name=name,
        nnodes=nodes,
        nodelist=L.compact_nodelist(hosts),
        jax_port=12321,
        ray_port=None,
        passthrough={"steps": total_steps},
        model=model,
    )
    pre = header + _pre_head() + pre

    order = list(range(nodes))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as fh:
        chunks = _Chunks(fh, pre)
        for step in range(total_steps):
            secs = step_time * (9.0 if step == 0 else rng.uniform(0.99, 1.01))
            t += secs
            if undated_steps:
                rng.shuffle(order)  # srun interleaves the tasks: task 0 is rarely first
            chunks.extend(_step_lines(step, secs, t, [(prefixes[r], tids[r]) for r in order], undated_steps))
            if step % REFRESH == 0 and step:
                noise.refresh(t)
            chunks.extend(noise.take() for _ in range(noise_per_step))
            chunks.flush_if_full()
        tail = [
            L.stage_end("Training", int(t - SIM_EPOCH)),
            *L.job_summary(
                job_id=job_id, name=name, model=model, nnodes=nodes, wall=int(t - SIM_EPOCH + 60), rc=0
            ),
        ]
        tail_len = sum(len(x) + 1 for x in tail)
        # Top up with teardown chatter (no steps) if the estimate fell short of the requested size.
        while chunks.written + chunks.buf_len + tail_len < size_bytes:
            chunks.extend([noise.take()])
            chunks.flush_if_full()
        chunks.extend(tail)
        chunks.flush()
    return BigLogResult(out, chunks.written, 0, total_steps - 1, total_steps, nodes, chunks.lines)


def _pre_head() -> list[str]:
    return [
        L.artifact_line("/shared/artifacts/maxtext-slurm-bench"),
        *L.git_summary_block(repo="maxtext-slurm", branch="main", commit="5c0ffee123", subject="bench"),
        *L.stage_timeouts_block(),
        L.stage_begin("Training", None),
    ]


def _node_preamble(hosts: Sequence[str], prefixes: Sequence[str], job_id: str, name: str) -> list[str]:
    """Every node's environment dump, then the barrier on every node."""
    nodes = len(hosts)
    pre: list[str] = []
    for r, h in enumerate(hosts):
        env = L.node_env(
            host=h, rank=r, job_id=job_id, name=name, nnodes=nodes, hosts=hosts, jax_port=12321, ray=False
        )
        pre.extend(prefixes[r] + x for x in L.env_dump(env))
    for r in range(nodes):
        pre.append(prefixes[r] + L.BARRIER_BEGIN)
    for r in range(nodes):
        pre.append(prefixes[r] + L.BARRIER_PASSED)
    return pre


class _NoisePool:
    """Noise drawn from a pool of pre-rendered lines (rendering each line is the expensive part),
    re-rendered every REFRESH steps so absl/Ray timestamps keep moving with the step clock."""

    def __init__(
        self, hosts: Sequence[str], prefixes: Sequence[str], tids: Sequence[int], rng: random.Random, t: float
    ) -> None:
        self._hosts = hosts
        self._prefixes = prefixes
        self._tids = tids
        self._rng = rng
        self.lines = self._render(t)
        self._picks = [rng.randrange(1 << 30) for _ in range(4096)]
        self._next = 0

    def _render(self, t: float) -> list[str]:
        out: list[str] = []
        rng, prefixes, tids = self._rng, self._prefixes, self._tids
        for r, h in enumerate(self._hosts):
            for _ in range(2):
                for group in L.generic_noise(t, tids[r], h, r, rng) + L.harmless_lines(t, tids[r], h, rng):
                    out.extend(prefixes[r] + g for g in group)
        return out

    def refresh(self, t: float) -> None:
        self.lines = self._render(t)

    def take(self) -> str:
        line = self.lines[self._picks[self._next & 4095] % len(self.lines)]
        self._next += 1
        return line


def _steps_for_size(
    size_bytes: int, pre: Sequence[str], noise: _NoisePool, prefix_width: int, nodes: int, noise_per_step: int
) -> int:
    """How many steps make the log `size_bytes` long, from a sample step line and the noise pool."""
    sample = L.StepFields(
        step=12345, seconds=5.6, tflops=51.2, tokens=3290.0, total_weights=1572864, loss=3.2
    )
    step_bytes: float = nodes * (prefix_width + len(L.step_line(sample)) + 1)
    step_bytes += noise_per_step * (sum(len(x) + 1 for x in noise.lines) / len(noise.lines))
    fixed = sum(len(x) + 1 for x in pre) + 4096
    return max(int((size_bytes - fixed) / step_bytes), 1)


def _step_lines(
    step: int, secs: float, t: float, tasks: Sequence[tuple[str, int]], undated: bool
) -> list[str]:
    """One step's line on every task (srun prefix, thread id), in the order given."""
    tokens = 18424.0 / secs
    f = L.StepFields(
        step=step,
        seconds=secs,
        tflops=tokens * 0.01556,
        tokens=tokens,
        total_weights=1572864,
        loss=2.1 + 8.8 * math.exp(-step / 45.0),
    )
    body = L.step_line(f)
    if undated:
        return [f"{prefix}{body}" for prefix, _tid in tasks]
    head_ts, tail_ts = L.absl_prefix(t, 0, "metric_logger.py:232").split(" 0 ", 1)
    return [f"{prefix}{head_ts} {tid} {tail_ts}{body}" for prefix, tid in tasks]


class _Chunks:
    """The log file written in CHUNK-sized blocks; counts the bytes and lines written."""

    def __init__(self, fh: BinaryIO, head: Sequence[str]) -> None:
        self._fh = fh
        data = ("\n".join(head) + "\n").encode()
        fh.write(data)
        self.written = len(data)
        self.lines = len(head)
        self._buf: list[str] = []
        self.buf_len = 0

    def extend(self, lines: Iterable[str]) -> None:
        for line in lines:
            self._buf.append(line)
            self.buf_len += len(line) + 1
            self.lines += 1

    def flush_if_full(self) -> None:
        if self.buf_len >= CHUNK:
            self.flush()

    def flush(self) -> None:
        data = ("\n".join(self._buf) + "\n").encode("utf-8", "surrogateescape")
        self._fh.write(data)
        self.written += len(data)
        self._buf, self.buf_len = [], 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobdiagd_sim.biglog", description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--size-gb", type=float, default=1.0)
    p.add_argument("--size-mb", type=float, default=None, help="overrides --size-gb")
    p.add_argument("--nodes", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--undated-steps", action="store_true", help="step lines without absl prefix")
    a = p.parse_args(argv)
    size = int((a.size_mb * (1 << 20)) if a.size_mb is not None else a.size_gb * (1 << 30))
    res = write_biglog(a.out, size, nodes=a.nodes, seed=a.seed, undated_steps=a.undated_steps)
    print(json.dumps(res.to_dict()))
    print(f"expected last step: {res.last_step}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
