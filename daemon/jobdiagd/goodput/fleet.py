"""The fleet's measured rates, kept between `jobdiagd goodput` and the daemon's job-end reports.

`jobdiagd goodput --config FILE` writes them (`goodput-fleet.json`, 0600, in the state dir of
that config, replaced atomically); the job-end report reads them to add the checkpoint-interval
advice for the job that just ended (rule GP-9): its own measured save cost and step time, the
fleet's MTBF for its node count, and the fleet's detection and restart latencies. Without the
file (goodput never ran) the report has no advice section. Reading is pure over the text; the
file I/O is two small functions at the edge.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jobdiagd.goodput.advice import Advice, Rates, advise, detection_latencies, rates, restart_latencies
from jobdiagd.goodput.facts import past_warmup, save_costs
from jobdiagd.goodput.ledger import Chain
from jobdiagd.model.triage import TriageResult
from jobdiagd.privatefs import UnsafePathError, open_private

FLEET_NAME = "goodput-fleet.json"


@dataclass(frozen=True, slots=True)
class Fleet:
    hours: dict[int, float]  # run-hours per node count
    events: dict[int, int]  # interruptions per node count
    detection_s: float  # mean last step -> detection of interruptions
    restart_s: float  # mean interrupted end -> next run's first step
    made_at: float
    save_s: dict[str, float] = field(default_factory=dict)  # median save cost per configuration

    @property
    def rates(self) -> Rates:
        return Rates(dict(self.hours), dict(self.events))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Fleet:
        raw: dict[str, Any] = json.loads(text)
        return cls(
            hours={int(k): float(v) for k, v in raw["hours"].items()},
            events={int(k): int(v) for k, v in raw["events"].items()},
            detection_s=float(raw["detection_s"]),
            restart_s=float(raw["restart_s"]),
            made_at=float(raw["made_at"]),
            save_s={str(k): float(v) for k, v in raw.get("save_s", {}).items()},
        )


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def fleet_of(chains: Sequence[Chain], *, now: float) -> Fleet:
    runs = [r for ch in chains for r in ch.runs]
    r = rates(runs)
    saves: dict[str, list[float]] = {}
    for run in runs:
        saves.setdefault(run.facts.config_key, []).extend(run.facts.save_costs)
    return Fleet(
        hours=r.hours,
        events=r.events,
        detection_s=_mean(detection_latencies(runs)),
        restart_s=_mean(restart_latencies(chains)),
        made_at=now,
        save_s={k: statistics.median(v) for k, v in saves.items() if v},
    )


def job_advice(r: TriageResult, fleet: Fleet) -> Advice | None:
    """The advice for the job `r` describes: its own saves and step time, the fleet's rates."""
    p = r.progress
    if not p.checkpoint_period or not p.step_time_s or not r.steps:
        return None
    costs, _ = save_costs(r.steps, r.ckpt, p.step_time_s)
    own = past_warmup(costs, r.steps[0].step)
    nnodes = len(r.nodes) or 1
    model = (r.header or {}).get("MODEL_NAME") or r.job_name or "?"
    key = f"{model} x{nnodes}"
    ts = statistics.median(own) if own else fleet.save_s.get(key)
    mtbf, basis = fleet.rates.mtbf_s(nnodes)
    if ts is None or mtbf is None:
        return None
    return advise(
        config=key,
        nnodes=nnodes,
        step_time_s=p.step_time_s,
        period_steps=p.checkpoint_period,
        save_s=ts,
        mtbf_s=mtbf,
        detection_s=fleet.detection_s,
        restart_s=fleet.restart_s,
        mtbf_basis=basis,
    )


def advice_section(a: Advice, fleet: Fleet) -> str:
    """The job-end report's Markdown section."""
    made = _dt.datetime.fromtimestamp(fleet.made_at, _dt.UTC).strftime("%Y-%m-%d")
    sentence = a.sentence()
    return (
        "### Checkpoint interval\n"
        f"{sentence[0].upper()}{sentence[1:]}.\n\n"
        f"{a.formula()}; MTBF: {a.mtbf_basis} (the fleet's figures, `jobdiagd goodput` of {made}).\n"
    )


def write_fleet(state_dir: Path, fleet: Fleet) -> Path:
    """Replace the state dir's fleet file (0600, atomically)."""
    path = state_dir / FLEET_NAME
    tmp = state_dir / f".{FLEET_NAME}.tmp"
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "fleet file")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(fleet.to_json())
    os.replace(tmp, path)
    return path


def read_fleet(path: Path) -> Fleet | None:
    """The fleet file, or None when it is missing or unreadable (no advice then)."""
    try:
        fd = open_private(path, os.O_RDONLY, "fleet file")
        with os.fdopen(fd, encoding="utf-8") as fh:
            return Fleet.from_json(fh.read())
    except (OSError, ValueError, KeyError, TypeError, UnsafePathError):
        return None
