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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from jobdiagd.sim import lines as L
from jobdiagd.sim.job import SIM_EPOCH

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
    pre_head = [
        L.artifact_line("/shared/artifacts/maxtext-slurm-bench"),
        *L.git_summary_block(repo="maxtext-slurm", branch="main", commit="5c0ffee123", subject="bench"),
        *L.stage_timeouts_block(),
        L.stage_begin("Training", None),
    ]
    prefixes = [L.srun_prefix(r, nodes) for r in range(nodes)]
    tids = [rng.randrange(130000, 160000) for _ in hosts]
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

    # Noise is drawn from a pool of pre-rendered lines (rendering each line is the expensive part),
    # re-rendered every REFRESH steps so absl/Ray timestamps keep moving with the step clock.
    def render_pool(t: float) -> list[str]:
        out: list[str] = []
        for r, h in enumerate(hosts):
            for _ in range(2):
                for group in L.generic_noise(t, tids[r], h, r, rng) + L.harmless_lines(t, tids[r], h, rng):
                    out.extend(prefixes[r] + g for g in group)
        return out

    t = SIM_EPOCH + 600.0  # training starts ten minutes in
    pool = render_pool(t)
    pool_n = len(pool)
    picks = [rng.randrange(1 << 30) for _ in range(4096)]

    # Size the run up front so the header's steps= matches the last step (a completed job).
    sample = L.StepFields(
        step=12345, seconds=5.6, tflops=51.2, tokens=3290.0, total_weights=1572864, loss=3.2
    )
    absl_width = 0 if undated_steps else 48
    step_bytes: float = nodes * (len(prefixes[-1]) + absl_width + len(L.step_line(sample)) + 1)
    step_bytes += noise_per_step * (sum(len(x) + 1 for x in pool) / pool_n)
    fixed = sum(len(x) + 1 for x in pre) + 4096
    total_steps = max(int((size_bytes - fixed) / step_bytes), 1)
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
    pre = header + pre_head + pre

    lines_written = 0
    order = list(range(nodes))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as fh:
        head = ("\n".join(pre) + "\n").encode()
        fh.write(head)
        written = len(head)
        lines_written += len(pre)
        buf: list[str] = []
        buf_len = 0
        pi = 0

        def flush() -> None:
            nonlocal buf, buf_len, written
            data = ("\n".join(buf) + "\n").encode("utf-8", "surrogateescape")
            fh.write(data)
            written += len(data)
            buf, buf_len = [], 0

        for step in range(total_steps):
            secs = step_time * (9.0 if step == 0 else rng.uniform(0.99, 1.01))
            t += secs
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
            ts = L.absl_prefix(t, 0, "metric_logger.py:232")
            head_ts, tail_ts = ts.split(" 0 ", 1)
            if undated_steps:
                rng.shuffle(order)  # srun interleaves the tasks: task 0 is rarely first
            for r in order:
                if undated_steps:
                    line = f"{prefixes[r]}{body}"
                else:
                    line = f"{prefixes[r]}{head_ts} {tids[r]} {tail_ts}{body}"
                buf.append(line)
                buf_len += len(line) + 1
            if step % REFRESH == 0 and step:
                pool = render_pool(t)
                pool_n = len(pool)
            for _ in range(noise_per_step):
                line = pool[picks[pi & 4095] % pool_n]
                pi += 1
                buf.append(line)
                buf_len += len(line) + 1
            lines_written += nodes + noise_per_step
            if buf_len >= CHUNK:
                flush()
        tail = [
            L.stage_end("Training", int(t - SIM_EPOCH)),
            *L.job_summary(
                job_id=job_id, name=name, model=model, nnodes=nodes, wall=int(t - SIM_EPOCH + 60), rc=0
            ),
        ]
        tail_len = sum(len(x) + 1 for x in tail)
        # Top up with teardown chatter (no steps) if the estimate fell short of the requested size.
        while written + buf_len + tail_len < size_bytes:
            line = pool[picks[pi & 4095] % pool_n]
            pi += 1
            buf.append(line)
            buf_len += len(line) + 1
            lines_written += 1
            if buf_len >= CHUNK:
                flush()
        buf.extend(tail)
        lines_written += len(tail)
        flush()
    return BigLogResult(out, written, 0, total_steps - 1, total_steps, nodes, lines_written)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobdiagd.sim.biglog", description=__doc__)
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
