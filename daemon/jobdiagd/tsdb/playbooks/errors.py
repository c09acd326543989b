"""Shared queries for GPU error counters (RAS UE/CE per block, PCIe) used by the hardware and GPU-health playbooks."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobdiagd.tsdb.client import Sample
from jobdiagd.tsdb.playbooks.base import PlaybookEnv, by_gpu

RAS_BLOCKS = ("umc", "xgmi", "gfx", "mmhub", "sdma")
PCIE_KINDS = ("correctable", "nonfatal", "fatal")


@dataclass
class GpuErrors:
    """Lifetime (max over the window) and new-in-window counts per (host, gpu)."""

    ue: dict[tuple[str, str], float] = field(default_factory=dict)
    ce: dict[tuple[str, str], float] = field(default_factory=dict)
    ue_new: dict[tuple[str, str], float] = field(default_factory=dict)
    ce_new: dict[tuple[str, str], float] = field(default_factory=dict)
    pcie: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)
    blocks: dict[tuple[str, str], list[str]] = field(default_factory=dict)


def error_arms(env: PlaybookEnv, window: str) -> dict[str, str]:
    arms: dict[str, str] = {}
    for b in RAS_BLOCKS:
        for kind in ("ue", "ce"):
            name = f"hw_gpu_ras_{b}_{kind}_total"
            if env.disc.has(name):
                arms[f"ras_{b}_{kind}"] = f"max_over_time({name}[{window}])"
                arms[f"rasnew_{b}_{kind}"] = (
                    f"max_over_time({name}[{window}]) - min_over_time({name}[{window}])"
                )
    for k in PCIE_KINDS:
        name = f"hw_gpu_pcie_{k}_total"
        if env.disc.has(name):
            arms[f"pcie_{k}"] = f"max_over_time({name}[{window}])"
    return arms


def collect_errors(res: dict[str, list[Sample]]) -> GpuErrors:
    e = GpuErrors()
    for arm, samples in res.items():
        vals = by_gpu(samples)
        if arm.startswith("ras_") or arm.startswith("rasnew_"):
            _, block, kind = arm.split("_")
            tgt = {
                ("ras", "ue"): e.ue,
                ("ras", "ce"): e.ce,
                ("rasnew", "ue"): e.ue_new,
                ("rasnew", "ce"): e.ce_new,
            }[(arm.split("_")[0], kind)]
            for k, v in vals.items():
                tgt[k] = tgt.get(k, 0.0) + v
                if arm.startswith("ras_") and v > 0 and kind == "ue":
                    e.blocks.setdefault(k, []).append(f"{block} UE={v:.0f}")
        elif arm.startswith("pcie_"):
            e.pcie[arm[5:]] = vals
    return e
