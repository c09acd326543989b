"""The runbook's failure-signature and known-harmless tables, as data.

Every row names the runbook section it comes from. A row matches a (prefix-stripped)
line when one of its `needles` occurs in it and, if given, its `regex` also matches.
Needles double as the fast pre-filter of the log reader (`jobdiagd.logs.scan`), so a
row must never rely on a regex alone.

Rows are in the runbook's priority order; `classify` decides the primary failure from
them (with the cascade rules documented there), the order here is the tie-breaker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

SRC_INFRA = "job-log-triage.md § Failure classification table › Infrastructure failures"
SRC_STAGE = "job-log-triage.md § Failure classification table › Stage timeouts"
SRC_TRAIN = "job-log-triage.md § Failure classification table › Training failures"
SRC_JOB = "job-log-triage.md § Failure classification table › Job-level status"
SRC_HARMLESS = "job-log-triage.md § Known-harmless log entries"
SRC_FORMATS = "notes/log-formats.md"


class Tier(Enum):
    """How a class takes part in choosing the primary failure (see classify.py)."""

    INFRA = "infrastructure"  # before training: the job never trained
    ROOT = "root"  # a specific root cause
    SYMPTOM = "symptom"  # specific, but usually downstream of another root cause
    CARRIER = "carrier"  # the mechanism that ended the job (traceback, exit code)
    ADVISORY = "advisory"  # reported, never primary (e.g. Ray falls back to non-Ray)


@dataclass(frozen=True, slots=True)
class Signature:
    cls: str
    needles: tuple[str, ...]
    source: str
    tier: Tier
    regex: re.Pattern[str] | None = None
    # Only count the line once training has started (barrier passed or a step completed).
    training_only: bool = False
    caseless: bool = False
    description: str = ""
    stage: str = ""

    def matches(self, text: str) -> bool:
        hay = text.lower() if self.caseless else text
        if not any(n in hay for n in self.needles):
            return False
        return self.regex is None or self.regex.search(text) is not None


def _rx(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


SIGNATURES: tuple[Signature, ...] = (
    # --- Infrastructure failures (before training starts) -------------------------------
    Signature(
        "prolog-kill-no-log",
        ("died in prolog before writing any log",),
        SRC_INFRA,
        Tier.INFRA,
        description="slurmd killed the job before the batch script could run",
        stage="Slurm prolog",
    ),
    Signature(
        "container-pull-fail",
        ("[ERROR] Pull failed for", "[ERROR] Authenticated pull failed", "[ERROR] Login to"),
        SRC_INFRA,
        Tier.INFRA,
        regex=_rx(r"\[ERROR\] (?:Pull failed for|Authenticated pull failed|Login to .* failed)"),
        description="Image pull or registry auth failed",
        stage="Docker pull",
    ),
    Signature(
        "container-load-fail",
        ("[ERROR] Unable to determine image name or ID from docker load output",),
        SRC_INFRA,
        Tier.INFRA,
        description="Tarball load failed",
        stage="Docker pull",
    ),
    Signature(
        "no-gpu",
        ("WARNING: No GPU devices detected",),
        SRC_INFRA,
        Tier.INFRA,
        description="No GPU devices visible",
        stage="Container start",
    ),
    Signature(
        "nccl-nic-fail",
        ("Failed to auto-detect NCCL_SOCKET_IFNAME",),
        SRC_INFRA,
        Tier.INFRA,
        description="Multi-node: no suitable NIC for NCCL",
        stage="Container start",
    ),
    Signature(
        "port-fail",
        (
            "FATAL: Could not find a free port for JAX coordinator",
            "FATAL: Could not find a free port for Ray",
        ),
        SRC_INFRA,
        Tier.INFRA,
        description="Port allocation failed",
        stage="Job start",
    ),
    Signature(
        "model-not-found",
        ("!!! Unknown model:", "!!! Model name resolution failed"),
        SRC_INFRA,
        Tier.INFRA,
        description="Config file missing or ambiguous name",
        stage="Training start",
    ),
    Signature(
        "patch-branch-fail",
        ("[FAIL] Failed to check out",),
        SRC_INFRA,
        Tier.INFRA,
        description="MaxText hotfix branch checkout failed",
        stage="Container start",
    ),
    Signature(
        "ray-start-fail",
        ("[Ray] HEAD failed to start", "[Ray] HEAD timeout", "[Ray] WORKER failed"),
        SRC_INFRA,
        Tier.ADVISORY,
        description="Ray cluster bootstrap failed (falls back to non-Ray)",
        stage="Ray init",
    ),
    # --- Stage timeouts -------------------------------------------------------------------
    Signature(
        "preflight-timeout",
        ("== Preflight TIMEOUT",),
        SRC_STAGE,
        Tier.INFRA,
        description="Preflight checks hung (stale GPU processes, NFS, NUMA)",
        stage="Preflight",
    ),
    Signature(
        "pull-timeout",
        ("== Docker pull TIMEOUT",),
        SRC_STAGE,
        Tier.INFRA,
        description="Image pull took too long (slow registry or large image)",
        stage="Docker pull",
    ),
    Signature(
        "ecc-timeout",
        ("== ECC check TIMEOUT",),
        SRC_STAGE,
        Tier.INFRA,
        description="ECC memory check hung (GPU driver issue)",
        stage="ECC check",
    ),
    Signature(
        "train-timeout",
        ("== Training TIMEOUT",),
        SRC_STAGE,
        Tier.ROOT,
        description="Training exceeded the configured wall-clock limit",
        stage="Training",
    ),
    # --- Training failures ----------------------------------------------------------------
    # `hang` has no log signature: it is decided from step progress (classify.py).
    Signature(
        "heartbeat-timeout",
        ("stopped sending heartbeats", "The tasks have crashed"),
        SRC_TRAIN,
        Tier.ROOT,
        description="JAX coordination heartbeat timeout",
        stage="Training",
    ),
    # Host OOM: the kernel / cgroup / shell wording. "Out of memory while trying to allocate"
    # is XLA's GPU message and must not land here, hence the negative look-ahead.
    Signature(
        "oom-host",
        (
            "oom-kill",
            "oom_kill",
            "Killed process",
            "Out of memory",
            "Out Of Memory",
            "invoked oom-killer",
            " Killed",
        ),
        SRC_TRAIN,
        Tier.ROOT,
        regex=_rx(
            r"oom[-_]kill|Killed process \d+|invoked oom-killer|Out of memory(?! while trying)"
            r"|: Out Of Memory|: line \d+: +\d+ Killed\b"
        ),
        description="Host OOM: process killed by Linux OOM killer",
        stage="Training",
    ),
    Signature(
        "oom-gpu",
        (
            "OUT_OF_MEMORY",
            "XLA_ERROR",
            "ResourceExhausted",
            "RESOURCE_EXHAUSTED",
            "out of memory",
            "Out of memory while trying to allocate",
            "ran out of memory",
        ),
        SRC_TRAIN,
        Tier.ROOT,
        regex=_rx(
            r"OUT_OF_MEMORY|XLA_ERROR|ResourceExhausted|RESOURCE_EXHAUSTED|out of memory"
            r"|Out of memory while trying to allocate|ran out of memory trying to allocate"
        ),
        description="GPU VRAM exhausted during compilation or execution",
        stage="Training",
    ),
    Signature(
        "nccl-timeout",
        ("NCCL WARN", "NCCL error", "Timeout waiting for", "ncclSystemError", "unhandled system error"),
        SRC_TRAIN,
        Tier.SYMPTOM,
        # MSCCL++ is in the harmless table; plain NCCL WARN counts only during training.
        regex=_rx(
            r"NCCL WARN.*[Tt]imeout|NCCL error|Timeout waiting for|ncclSystemError"
            r"|unhandled system error|NCCL WARN(?!.*MSCCL\+\+)"
        ),
        description="NCCL/RCCL collective timeout — network or GPU issue",
        stage="Training",
    ),
    Signature(
        "xla-compile-fail",
        ("INTERNAL: Failed to compile", "XLA compilation failed", "HloModule", "ptxas exited with non-zero"),
        SRC_TRAIN,
        Tier.ROOT,
        regex=_rx(
            r"INTERNAL: Failed to compile|XLA compilation failed|HloModule.*(?:[Ee]rror|failed)"
            r"|(?:[Ee]rror|failed).*HloModule|ptxas exited with non-zero"
        ),
        description="XLA/GPU compiler failure",
        stage="Training",
    ),
    Signature(
        "python-exception",
        ("Traceback (most recent call last):",),
        SRC_TRAIN,
        Tier.CARRIER,
        description="Unhandled Python exception",
        stage="Training",
    ),
    Signature(
        "signal-kill",
        ("Training subprocess killed by",),
        SRC_TRAIN,
        Tier.CARRIER,
        description="Training process killed by signal (SIGSEGV, SIGABRT, etc.)",
        stage="Training",
    ),
    Signature(
        "subprocess-fail",
        ("Training subprocess exited with code",),
        SRC_TRAIN,
        Tier.CARRIER,
        regex=_rx(r"Training subprocess exited with code (?!0\b)"),
        description="Training process exited non-zero",
        stage="Training",
    ),
    Signature(
        "actor-fail",
        ("Actor failed:",),
        SRC_TRAIN,
        Tier.CARRIER,
        description="Ray actor exception",
        stage="Training",
    ),
    Signature(
        "checkpoint-fs-error",
        ("Checkpointing failed", "manifest.ocdbt.__lock"),
        SRC_TRAIN,
        Tier.ROOT,
        regex=_rx(
            r"Training stopped: Checkpointing failed|No such file or directory: .*manifest\.ocdbt\.__lock"
        ),
        description="Checkpoint write failed due to NFS/storage filesystem error",
        stage="Checkpoint save",
    ),
    # --- Job-level status -------------------------------------------------------------------
    Signature(
        "node-fail",
        ("NODE_EXIT host=",),
        SRC_JOB,
        Tier.CARRIER,
        regex=_rx(r"NODE_EXIT host=\S+ exit=(?!0\b)\d+"),
        description="One or more nodes exited with errors",
    ),
    Signature(
        "stage-fail",
        (" FAILED (exit=",),
        SRC_JOB,
        Tier.CARRIER,
        regex=_rx(r"^== .+ FAILED \(exit="),
        description="A non-timeout stage failure",
    ),
)

BY_CLASS: dict[str, Signature] = {s.cls: s for s in SIGNATURES}

# Classes decided from progress or job state rather than a line signature.
DERIVED_CLASSES: tuple[str, ...] = ("hang", "cancelled", "unknown-death", "soft-success", "tgs-degradation")

# Every class name the runbook defines, in its table order (hang sits before heartbeat).
ALL_CLASSES: tuple[str, ...] = (
    *(s.cls for s in SIGNATURES if s.source in (SRC_INFRA, SRC_STAGE)),
    "hang",
    *(s.cls for s in SIGNATURES if s.source == SRC_TRAIN),
    "tgs-degradation",
    "cancelled",
    "node-fail",
    "unknown-death",
    "stage-fail",
    "soft-success",
)


@dataclass(frozen=True, slots=True)
class Harmless:
    needles: tuple[str, ...]
    why: str
    regex: re.Pattern[str] | None = None
    source: str = SRC_HARMLESS

    def matches(self, text: str) -> bool:
        if not any(n in text for n in self.needles):
            return False
        return self.regex is None or self.regex.search(text) is not None


# A line matching one of these is never evidence of a failure (runbook: "Do not classify
# them as failures or mention them in the triage report").
HARMLESS: tuple[Harmless, ...] = (
    Harmless(("Failed call to cuInit", "INTERNAL: CUDA error"), "JAX/XLA CUDA probe on AMD nodes"),
    Harmless(("MSCCL++: Feature not enabled", "MSCCL++"), "RCCL init notice"),
    Harmless(("Token indices sequence length is longer than the specified maximum",), "tokenizer warning"),
    Harmless(("OCI runtime exec failed",), "container cleanup / teardown race"),
    Harmless(("docker exec failed", "falling back to host-level kill"), "preflight cleanup"),
    Harmless(("Sent SIGKILL to 0/0 processes",), "preflight cleanup, nothing to kill"),
    Harmless(("Cannot read CPU core",), "topology probe outside the cgroup"),
    Harmless(("No hardware is found. Using default TPU version",), "TPU probe on a GPU node"),
    Harmless(("No device identifiers found",), "XLA tracing probe"),
    Harmless(("Enabling PjRt/TPU event dependency logging",), "XLA logging init"),
    Harmless(("Fiber init: default domain",), "threading init"),
    Harmless(("cannot remove container",), "Docker slow to exit during teardown"),
    Harmless(("did not receive an exit event",), "Docker slow to exit during teardown"),
)


def is_harmless(text: str) -> bool:
    return any(h.matches(text) for h in HARMLESS)


def match_line(text: str, *, training_started: bool) -> list[Signature]:
    """All signature rows a stripped line matches (empty for harmless lines)."""
    found: list[Signature] = []
    for sig in SIGNATURES:
        if sig.matches(text):
            if sig.cls == "nccl-timeout" and not training_started and not _NCCL_ALWAYS.search(text):
                continue
            found.append(sig)
    if found and is_harmless(text):
        return []
    if len(found) > 1 and any(s.cls == "oom-host" for s in found):
        # "Memory cgroup out of memory: Killed process" is the kernel, not the GPU allocator.
        found = [s for s in found if s.cls != "oom-gpu"]
    return found


# NCCL lines that count even before training: explicit errors and timeouts.
_NCCL_ALWAYS = re.compile(
    r"NCCL WARN.*[Tt]imeout|NCCL error|Timeout waiting for|ncclSystemError|unhandled system error"
)

SIGNATURE_NEEDLES: tuple[str, ...] = tuple(sorted({n for s in SIGNATURES for n in s.needles}))
