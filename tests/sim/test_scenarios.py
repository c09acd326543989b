"""The simulated corpus is deterministic, laid out like real jobs, and agrees with its own manifest."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from jobdiagd_sim import scenarios as S

STEP_RE = re.compile(rb"completed step: (\d+), seconds: ([\d.]+)(?:.*?Tokens/s/device: ([\d.]+))?")
SUMMARY_STATUS_RE = re.compile(
    rb"  Status: (?:\x1b\[[\d;]*m|\x1b\(B)*(SUCCESS \(exit 0\)|FAILED \(exit (\d+)\))"
)

# Literal signatures from the classification table (docs/rules.md §3; a subset per class is enough to
# prove the scenario exercises the class; the triage engine's own table lives elsewhere).
SIGNATURES: dict[str, tuple[bytes, ...]] = {
    "container-pull-fail": (
        b"[ERROR] Pull failed for",
        b"[ERROR] Authenticated pull failed",
        b"[ERROR] Login to",
    ),
    "container-load-fail": (b"[ERROR] Unable to determine image name or ID from docker load output",),
    "no-gpu": (b"WARNING: No GPU devices detected",),
    "nccl-nic-fail": (b"Failed to auto-detect NCCL_SOCKET_IFNAME; ABORTING",),
    "port-fail": (b"FATAL: Could not find a free port for",),
    "model-not-found": (b"!!! Unknown model:",),
    "patch-branch-fail": (b"[FAIL] Failed to check out",),
    "ray-start-fail": (b"[Ray] HEAD failed to start", b"[Ray] HEAD timeout", b"[Ray] WORKER failed"),
    "preflight-timeout": (b"== Preflight TIMEOUT",),
    "pull-timeout": (b"== Docker pull TIMEOUT",),
    "ecc-timeout": (b"== ECC check TIMEOUT",),
    "train-timeout": (b"== Training TIMEOUT",),
    "heartbeat-timeout": (b"UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats)",),
    "oom-host": (b"Killed ", b"oom_kill", b"oom-kill"),
    "oom-gpu": (b"RESOURCE_EXHAUSTED",),
    "nccl-timeout": (b"ncclSystemError", b"Timeout waiting for", b"exceeded timeouts"),
    "xla-compile-fail": (b"INTERNAL: Failed to compile", b"XLA compilation failed"),
    "python-exception": (b"Traceback (most recent call last):",),
    "signal-kill": (b"Training subprocess killed by",),
    "subprocess-fail": (b"Training subprocess exited with code",),
    "actor-fail": (b"Actor failed:",),
    "checkpoint-fs-error": (b"Training stopped: Checkpointing failed",),
    "cancelled": (b"CANCELLED (scancel / SIGTERM)",),
    "stage-fail": (b" FAILED (exit=",),
}
# Patterns that mean "something failed" and must not appear in a healthy job's logs.
FAILURE_MARKERS = (
    b"Traceback",
    b"RESOURCE_EXHAUSTED",
    b"out of memory",
    b"Out of memory",
    b"Killed ",
    b"ncclSystemError",
    b"Timeout waiting for",
    b"stopped sending heartbeats",
    b"FAILED",
    b"TIMEOUT (",
    b"Actor failed",
    b"Training subprocess exited",
    b"NODE_EXIT",
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[S.Expectation]]:
    root = tmp_path_factory.mktemp("outputs")
    return root, S.build_all(root)


def _job_bytes(e: S.Expectation) -> bytes:
    data = e.log.read_bytes() if e.log.exists() else b""
    if e.job_dir.is_dir():
        for p in sorted(e.job_dir.rglob("*.out")) + sorted(e.job_dir.glob("rank-*.log")):
            data += p.read_bytes()
    return data


def _steps(data: bytes, rank0_only: bool = False) -> list[tuple[int, float, float | None]]:
    out = []
    for line in data.splitlines():
        if rank0_only and not re.match(rb"^\s*0: ", line):
            continue
        m = STEP_RE.search(line)
        if m:
            out.append((int(m.group(1)), float(m.group(2)), float(m.group(3)) if m.group(3) else None))
    return out


def test_every_scenario_builds_and_manifest_round_trips(corpus: tuple[Path, list[S.Expectation]]) -> None:
    root, exps = corpus
    assert [e.scenario for e in exps] == list(S.SCENARIOS)
    doc = json.loads((root / "manifest.json").read_text())
    assert len(doc["jobs"]) == len(exps)
    for row, e in zip(doc["jobs"], exps, strict=True):
        assert row["scenario"] == e.scenario
        assert (root / row["job_dir"]).resolve() == e.job_dir.resolve()
        assert sorted(row["expected_classes"]) == sorted(e.expected_classes)
        if e.primary_failure is not None:
            assert e.primary_failure in e.expected_classes, e.scenario
        assert not (e.expected_classes & e.absent_classes), e.scenario


def test_layout_and_symlinks(corpus: tuple[Path, list[S.Expectation]]) -> None:
    root, exps = corpus
    for e in exps:
        link = e.job_dir / "log"
        if not e.is_job:
            assert e.job_dir.is_dir() and not link.exists() and not link.is_symlink()
            continue
        assert link.is_symlink(), e.scenario
        assert os.readlink(link) == f"../{e.log.name}"
        if e.scenario == "prolog-kill-no-log":
            assert not e.log.exists() and list(e.job_dir.iterdir()) == [link]
            assert not list(root.glob(f"{e.job_id}-*.log"))
            continue
        assert link.resolve() == e.log.resolve()
        assert e.log.parent == root and e.job_dir.parent == root
        if e.scenario == "renamed-log":
            assert re.fullmatch(rf"{re.escape(e.job_dir.name)}-4N-TGS_\d+\.log", e.log.name)
        else:
            assert e.log.name == f"{e.job_dir.name}.log"
        if e.ray:
            assert e.authoritative_log is not None and e.authoritative_log.parent.name == e.head_node
            assert re.fullmatch(r"worker-[0-9a-f]{56}-01000000-\d+\.out", e.authoritative_log.name)
        if e.platform == "k8s":
            assert re.match(r"k8s-\d{8}-\d{6}-[0-9a-f]{4}-JAX-", e.job_dir.name)
            assert (e.job_dir / "rank-1.log").exists() and not (e.job_dir / "rank-0.log").exists()
            assert b"[1] All 2 nodes ready" in (e.job_dir / "rank-1.log").read_bytes()
            assert b"[1] All 2 nodes ready" not in e.log.read_bytes()
            assert b"\n0: " not in e.log.read_bytes()
        if e.platform == "local":
            assert re.match(r"local_\d{8}_\d{6}_[0-9a-f]{4}-JAX-", e.job_dir.name)


def test_progress_fields_match_the_authoritative_log(corpus: tuple[Path, list[S.Expectation]]) -> None:
    _, exps = corpus
    for e in exps:
        if not e.is_job or not e.log.exists():
            continue
        assert e.authoritative_log is not None
        if e.last_step is None:
            assert e.first_step is None and e.start is None, e.scenario
            assert b"completed step:" not in e.log.read_bytes()
            if e.authoritative_log.exists():
                assert b"completed step:" not in e.authoritative_log.read_bytes()
            continue
        steps = _steps(e.authoritative_log.read_bytes(), rank0_only=e.platform == "slurm" and not e.ray)
        assert steps, e.scenario
        assert steps[0][0] == e.first_step, e.scenario
        assert steps[-1][0] == e.last_step, e.scenario
        assert [s for s, _, _ in steps] == list(range(e.first_step, e.last_step + 1)), e.scenario
        assert e.train_seconds == pytest.approx(sum(x for _, x, _ in steps), abs=0.01 * len(steps))
        assert e.start == ("fresh" if e.first_step == 0 else "restored")
        assert e.restored_from_step == (e.first_step - 1 if e.first_step else None)
        assert (
            e.last_checkpoint_step == S.last_periodic_checkpoint(e.last_step, e.checkpoint_period)
            or e.scenario == "checkpoint-fs-error"
        )
        header = e.log.read_bytes()[:4000]
        m = re.search(rb'PASSTHROUGH_ARGS="[^"]*\bsteps=(\d+)', header)
        assert m and int(m.group(1)) == e.total_steps, e.scenario


def test_status_matches_summary_and_step_semantics(corpus: tuple[Path, list[S.Expectation]]) -> None:
    _, exps = corpus
    for e in exps:
        if not e.is_job or not e.log.exists():
            continue
        data = e.log.read_bytes()
        m = SUMMARY_STATUS_RE.search(data[-2000:])
        if e.status in ("running", "hanging", "unknown-death"):
            assert m is None, e.scenario
        elif e.scenario == "port-fail":
            assert m is None and data.strip() == b"FATAL: Could not find a free port for JAX coordinator"
        else:
            assert m is not None, e.scenario
            ok = m.group(1) == b"SUCCESS (exit 0)"
            if e.status == "completed" and e.primary_failure != "soft-success":
                assert ok, e.scenario
            if e.status == "cancelled":
                assert m.group(2) == b"143"
            if e.primary_failure == "soft-success":
                assert not ok and e.last_step == (e.total_steps or 0) - 1
        if e.status == "completed" and e.total_steps and e.last_step is not None:
            assert e.last_step == e.total_steps - 1, e.scenario
        if e.status in ("running", "hanging"):
            assert e.slurm_state == "RUNNING"


def test_truncated_ray_log_stops_early_but_worker_log_is_complete(
    corpus: tuple[Path, list[S.Expectation]],
) -> None:
    _, exps = corpus
    e = next(x for x in exps if x.scenario == "completed-ray1-truncated")
    slurm_steps = _steps(e.log.read_bytes())
    assert max(s for s, _, _ in slurm_steps) == 33
    assert e.last_step == 99
    for worker in e.job_dir.glob("ray_logs/*/worker-*-01000000-*.out"):
        assert _steps(worker.read_bytes())[-1][0] == 99
    assert b"completed profiler activation step: 10" in e.log.read_bytes()


def test_live_and_hang_times_are_reproducible(corpus: tuple[Path, list[S.Expectation]]) -> None:
    _, exps = corpus
    by = {e.scenario: e for e in exps}
    run, hang = by["running"], by["hanging"]
    assert run.log.stat().st_mtime <= run.now < run.log.stat().st_mtime + 10
    assert 0 < hang.now - hang.log.stat().st_mtime < 120  # mtime fresh although steps stopped hours ago
    assert by["hanging"].prometheus_port == 9191
    assert b"[Prometheus] Started on port 9191" in hang.log.read_bytes()


def test_signatures_of_expected_classes_are_present(corpus: tuple[Path, list[S.Expectation]]) -> None:
    _, exps = corpus
    for e in exps:
        data = _job_bytes(e)
        for cls in e.expected_classes:
            if cls in SIGNATURES:
                assert any(sig in data for sig in SIGNATURES[cls]), (e.scenario, cls)


def test_healthy_jobs_carry_no_failure_signature(corpus: tuple[Path, list[S.Expectation]]) -> None:
    _, exps = corpus
    healthy = [e for e in exps if e.status in ("completed", "running") and e.primary_failure is None]
    assert len(healthy) >= 8
    for e in healthy:
        data = _job_bytes(e)
        for marker in FAILURE_MARKERS:
            assert marker not in data, (e.scenario, marker)


def test_noise_includes_every_harmless_pattern_odd_bytes_and_colour(
    corpus: tuple[Path, list[S.Expectation]],
) -> None:
    _, exps = corpus
    everything = b"".join(_job_bytes(e) for e in exps)
    for pattern in (
        b"Failed call to cuInit",
        b"MSCCL++: Feature not enabled",
        b"Token indices sequence length",
        b"[cgroup] Sent SIGKILL to 0/0 processes",
        b"error executing setns process",
        b"Cannot read CPU core",
        b"default TPU version: jellyfish",
        b"No device identifiers found",
        b"PjRt/TPU event dependency logging",
        b"Fiber init: default domain = futex",
        b"did not receive an exit event",
        b"NCCL INFO",
        b"Autotun",
        b"across cluster]",
    ):
        assert pattern in everything, pattern
    with pytest.raises(UnicodeDecodeError):
        everything.decode("utf-8")
    assert b"\x1b[" in everything
    # NCCL >= 2.26 timestamp prefix and the blank line before NCCL WARN
    assert re.search(
        rb"\n\s*\d+: \n\s*\d+: \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] node\d+:\d+:\d+ \[\d\] \S+ NCCL WARN",
        everything,
    )


def test_tgs_ground_truth_agrees_with_the_runbook_check(corpus: tuple[Path, list[S.Expectation]]) -> None:
    """Runbook step 5: last 10 steps' TGS vs steady-state steps 5-15 (relative to the first step)."""
    _, exps = corpus
    checked = 0
    for e in exps:
        if e.tgs_pattern is None or e.authoritative_log is None:
            continue
        steps = _steps(e.authoritative_log.read_bytes(), rank0_only=not e.ray)
        first = steps[0][0]
        early = [t for s, _, t in steps if first + 5 <= s <= first + 15 and t]
        late = [t for _, _, t in steps[-10:] if t]
        drop = 1 - (sum(late) / len(late)) / (sum(early) / len(early))
        assert (drop > 0.10) == e.tgs_degraded, (e.scenario, drop)
        checked += 1
    assert checked == 7  # the five runbook patterns and the two noisy ones (jitter, profiler window)


def test_scenarios_are_small(corpus: tuple[Path, list[S.Expectation]]) -> None:
    _, exps = corpus
    for e in exps:
        size = e.log.stat().st_size if e.log.exists() else 0
        if e.job_dir.is_dir() and e.is_job:
            size += sum(p.stat().st_size for p in e.job_dir.rglob("*") if p.is_file() and not p.is_symlink())
        assert size < 300_000, (e.scenario, size)


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    names = ["completed-ray1-truncated", "oom-cascade", "k8s", "hanging"]
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    ea = S.build_all(a, names=names)
    eb = S.build_all(b, names=names)
    S.build_all(c, names=names, seed=7)

    def files(root: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()
        }

    fa, fb, fc = files(a), files(b), files(c)
    assert fa == fb
    assert [x.to_dict(a) for x in ea] == [x.to_dict(b) for x in eb]
    assert fa.keys() & fc.keys()
    assert any(fa[k] != fc[k] for k in fa.keys() & fc.keys() if k.endswith(".log"))


def test_build_rejects_unknown_names(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="unknown scenario"):
        S.build("no-such-thing", tmp_path)


def test_bundled_examples_are_current(tmp_path: Path) -> None:
    """The shipped demo corpus is what --write-examples produces today (regenerate when this fails)."""
    bundled = S.examples_dir()
    exps = S.write_examples(tmp_path / "ex")
    assert {e.scenario for e in exps} == set(S.EXAMPLE_SCENARIOS)
    fresh = {
        str(p.relative_to(tmp_path / "ex")): p.read_bytes()
        for p in (tmp_path / "ex").rglob("*")
        if p.is_file()
    }
    shipped = {str(p.relative_to(bundled)): p.read_bytes() for p in bundled.rglob("*") if p.is_file()}
    assert fresh == shipped
    assert sum(p.stat().st_size for p in bundled.rglob("*") if p.is_file() and not p.is_symlink()) < 2_000_000
    for e in exps:
        assert os.readlink(bundled / e.job_dir.name / "log") == f"../{e.log.name}"


def test_checkpoint_period_is_derivable_by_the_runbook_rule(corpus: tuple[Path, list[S.Expectation]]) -> None:
    """Config param line, else PASSTHROUGH_ARGS checkpoint_period, else 200 when checkpointing is on."""
    _, exps = corpus
    seen = set()
    for e in exps:
        if not e.is_job or not e.log.exists():
            continue
        data = e.log.read_bytes()
        if e.authoritative_log is not None and e.authoritative_log.exists():
            data += e.authoritative_log.read_bytes()
        header = re.search(rb'PASSTHROUGH_ARGS="([^"]*)"', data)
        args = header.group(1) if header else b""
        cfg = re.search(rb"Config param checkpoint_period: (\d+)", data)
        arg = re.search(rb"\bcheckpoint_period=(\d+)", args)
        if cfg:
            derived: int | None = int(cfg.group(1))
            seen.add("config")
        elif arg:
            derived = int(arg.group(1))
        elif b"enable_checkpointing=true" in args:
            derived = 200
            seen.add("default")
        else:
            derived = None
        if arg and not cfg:
            seen.add("args-only")
        if cfg and not arg and b"enable_checkpointing=true" in args:
            seen.add("config-only")
        assert derived == e.checkpoint_period, e.scenario
    assert {"config", "default", "config-only"} <= seen


def test_wall_forms_and_colour_variants_all_appear(corpus: tuple[Path, list[S.Expectation]]) -> None:
    _, exps = corpus
    walls: list[bytes] = []
    statuses: list[bytes] = []
    for e in exps:
        if e.log.exists():
            data = e.log.read_bytes()
            walls += re.findall(rb"  Wall:   ([^\n]*)\n", data)
            statuses += re.findall(rb"  Status: ([^\n]*)\n", data)
    assert any(re.fullmatch(rb"\d+h \d+m \d+s", w) for w in walls)
    assert any(re.fullmatch(rb"\d+m \d+s", w) for w in walls)
    assert any(re.fullmatch(rb"\d+s", w) for w in walls)
    assert b"\x1b[32mSUCCESS (exit 0)\x1b(B\x1b[m" in statuses
    assert any(x.startswith(b"\x1b[1mFAILED (exit 143)") and x.endswith(b"\x1b[0m") for x in statuses)
    assert b"SUCCESS (exit 0)" in statuses
