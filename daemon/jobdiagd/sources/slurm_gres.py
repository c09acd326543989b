"""Which GPUs of which node Slurm gave a job: the per-node GRES lines of `scontrol -d show job`.

`scontrol -d show job <id>` (also with `-o`, all on one line) prints one detail entry per node
set after the job's fields:

    Nodes=node[001-002] CPU_IDs=0-111 Mem=0 GRES=gpu:8(IDX:0-7)
    Nodes=node003 CPU_IDs=0-55 Mem=0 GRES=gpu:h100:4(IDX:0-3)

GRES forms seen in Slurm 20-25: `gpu:8(IDX:0-7)`, `gpu:a40:1(IDX:0)`, `gpu:h100:2(IDX:0,3)`,
`gpu:(null):2(IDX:0-1)`, `gpu:(null):0(IDX:N/A)`, several types comma separated
(`gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:2)`), older releases' `GRES_IDX=gpu(IDX:0-3)`, and GPU
sharing (`shard:...`, `mps:...`), which means the job's GPUs are shared with other jobs.
`OverSubscribe=NO` is how scontrol shows a job that holds its nodes whole (`--exclusive`).

Pure: text in, `JobGpus` out; malformed entries are skipped (the job then has no index for
those nodes, and the site source refuses to confirm a hang from a shared node without one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from jobdiagd.rules.hostlist import parse_hostlist, valid_host

# A detail entry's GRES is within its own few tokens, never past the next `Nodes=` entry.
_ENTRY = re.compile(r"(?:^|\s)Nodes=(\S+)[ \t]+(?:(?!Nodes=)\S+[ \t]+){0,6}?(?:GRES|GRES_IDX)=(\S+)")
# gpu[:type]:count[(IDX:...)] -- the type may be "(null)"; the parenthesis may also be socket info (S:0-1).
_GPU = re.compile(
    r"^gpu(?::(?:\(null\)|[A-Za-z_][A-Za-z0-9_.-]*|[0-9]+[A-Za-z_.-][A-Za-z0-9_.-]*))?:(\d+)(?:\(([^)]*)\))?$"
)
_OLD_IDX = re.compile(r"^gpu\(IDX:([^)]*)\)$")  # GRES_IDX=gpu(IDX:0-3) of Slurm < 20
_SHARED = re.compile(r"^(shard|mps)\b")
_OVERSUB = re.compile(r"(?:^|\s)OverSubscribe=(\S+)")
_MAX_INDEX = 4096


@dataclass(frozen=True)
class NodeGpus:
    """What Slurm allotted on one node: the GPU count and, when shown, the GPU indices."""

    count: int | None = None
    indices: frozenset[int] | None = None
    shared: bool = False  # the job holds GPU shards / MPS shares: its GPUs are shared with others


@dataclass(frozen=True)
class JobGpus:
    nodes: Mapping[str, NodeGpus] = field(default_factory=dict)
    exclusive: bool = False


def parse_indices(text: str) -> frozenset[int] | None:
    """`0-3,5` -> {0, 1, 2, 3, 5}; None for `N/A` or anything malformed."""
    out: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if m is None:
            return None
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo or hi > _MAX_INDEX:
            return None
        out.update(range(lo, hi + 1))
    return frozenset(out)


def _split_gres(text: str) -> list[str]:
    """Top-level comma split (commas inside `(IDX:0,3)` stay)."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p]


def parse_gres(text: str) -> NodeGpus:
    """One node set's GRES value."""
    count, indices, shared, seen = 0, set[int](), False, False
    known = True
    for item in _split_gres(text):
        if _SHARED.match(item):
            shared = True
            continue
        old = _OLD_IDX.match(item)
        m = _GPU.match(item)
        if old is not None:
            idx = parse_indices(old.group(1))
            count += len(idx or ())
        elif m is not None:
            count += int(m.group(1))
            inner = m.group(2) or ""
            idx = parse_indices(inner.removeprefix("IDX:")) if inner.startswith("IDX:") else None
        else:
            continue
        seen = True
        if idx is None:
            known = False
        else:
            indices |= idx
    return NodeGpus(
        count=count if seen else None,
        indices=frozenset(indices) if seen and known else None,
        shared=shared,
    )


def parse_job_gpus(text: str) -> JobGpus:
    """The GPU allotment of one job from `scontrol -d show job` (multi-line or `-o`) output."""
    nodes: dict[str, NodeGpus] = {}
    for m in _ENTRY.finditer(text):
        try:
            names = parse_hostlist(m.group(1))
        except ValueError:
            continue
        gpus = parse_gres(m.group(2))
        for n in names:
            if valid_host(n):
                nodes[n] = gpus
    over = _OVERSUB.search(text)
    return JobGpus(nodes, exclusive=bool(over and over.group(1).upper() == "NO"))
