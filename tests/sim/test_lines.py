"""Line formatters produce the exact real formats documented in docs/log-formats.md."""

from __future__ import annotations

import re

from jobdiagd_sim import lines as L

T = 1781251200.0 + 3600 * 2 + 15 * 60 + 22.481234  # 2026-06-12 10:15:22.481234 UTC


def test_srun_prefix_is_padded_to_width_of_ntasks_minus_one() -> None:
    assert L.srun_prefix(0, 8) == "0: "
    assert L.srun_prefix(7, 8) == "7: "
    assert L.srun_prefix(0, 24) == " 0: "
    assert L.srun_prefix(23, 24) == "23: "
    assert L.srun_prefix(5, 100) == " 5: "
    assert L.srun_prefix(0, 1) == "0: "
    assert re.match(r"^\s*(\d+): ", L.srun_prefix(3, 24) + "x")


def test_absl_prefix_shape() -> None:
    p = L.absl_prefix(T, 139872, "metric_logger.py:232")
    assert p == "I0612 10:15:22.481234 139872 metric_logger.py:232] "


def test_compact_nodelist() -> None:
    assert L.compact_nodelist(L.hostnames(8)) == "node[001-008]"
    assert L.compact_nodelist(["node001", "node002", "node003", "node005"]) == "node[001-003,005]"
    assert L.compact_nodelist(["node007"]) == "node007"


def _fields(**kw: object) -> L.StepFields:
    base: dict[str, object] = dict(
        step=5, seconds=5.668, tflops=134.909, tokens=8671.794, total_weights=196608, loss=10.879
    )
    base.update(kw)
    return L.StepFields(**base)  # type: ignore[arg-type]


def test_step_line_current_form_matches_the_documented_example() -> None:
    assert L.step_line(_fields()) == (
        "completed step: 5, seconds: 5.668, TFLOP/s/device: 134.909, Tokens/s/device: 8671.794, "
        "total_weights: 196608, loss: 10.879"
    )


def test_step_line_variants() -> None:
    mfu = L.step_line(_fields(), L.StepStyle(mfu_peak=839.0))
    assert "TFLOP/s/device: 134.909, MFU: 16.08%, Tokens/s/device" in mfu
    lm = L.step_line(_fields(moe_lb_loss=0.01), L.StepStyle(lm_loss=True, moe=True))
    assert re.search(r"loss: 10\.879, lm_loss: 10\.869, perplexity: [\d.]+, moe_lb_loss: 0\.01000$", lm)
    elastic = L.step_line(_fields(), L.StepStyle(live_slices=2))
    assert "seconds: 5.668, live slice count: 2, TFLOP/s/device" in elastic
    ramp = L.step_line(_fields(rampup=True))
    assert ramp.startswith("[Rampup Batch Size Phase], completed step: 5, seconds: 5.668, Tokens/s/device")
    assert "TFLOP" not in ramp
    old = L.step_line(_fields(), L.StepStyle(era="2023"))
    assert old == "completed step: 5, seconds: 5.668, TFLOP/s: 134.909, loss: 10.879"
    first = L.step_line(_fields(step=0, loss=10.4), L.StepStyle(first_loss_no_colon=True), first=True)
    assert first.endswith("loss 10.4")
    assert L.profiler_line(7) == "completed profiler activation step: 7"


def test_restore_and_checkpoint_lines() -> None:
    assert re.search(r"step\s+(\d+)", L.restore_line(200, spaced=True))
    assert L.restore_line(200, spaced=True) == "restoring from this run's directory latest step           200"
    assert L.checkpoint_saved(400) == "Saved a checkpoint at step 400."
    assert L.checkpoint_saved(400, "old") == "saved a checkpoint at step 400"
    assert L.orbax_finalized(3, "/o/ck", 400).startswith(
        "[process=3][thread=async_save] Finished saving checkpoint"
    )


def test_job_summary_forms() -> None:
    ok = L.job_summary(
        job_id="12345", name="JAX-llama2-70b-steps_100", model="llama2-70b", nnodes=8, wall=3662, rc=0
    )
    assert ok[0] == "========================== JOB SUMMARY =========================="
    assert "  Job:    12345 (JAX-llama2-70b-steps_100)" in ok
    assert "  Wall:   1h 1m 2s" in ok
    assert "  Status: SUCCESS (exit 0)" in ok
    bad = L.job_summary(
        job_id="1",
        name="n",
        model="m",
        nnodes=1,
        wall=62,
        rc=1,
        failure="Training FAILED (exit=1)",
        color="setaf",
    )
    assert "  Wall:   1m 2s" in bad
    status = next(x for x in bad if "Status:" in x)
    assert "\x1b[31mFAILED (exit 1) \u2014 Training FAILED (exit=1)\x1b(B\x1b[m" in status
    assert L.fmt_wall(9) == "9s"


def test_heartbeat_block_has_both_endings() -> None:
    new = L.heartbeat_block(T, 157988, [3])
    assert new[0].startswith("E0612 10:15:22.") and "coordination_service_agent.cc:332]" in new[0]
    assert new[1].startswith("F0612 ") and new[1].endswith("(stopped sending heartbeats):")
    assert new[2] == "/job:jax_worker/replica:0/task:3"
    assert "scheduler events" in new[3]
    old = L.heartbeat_block(T, 1, [3, 5], old_ending=True)
    assert old[-1] == "The tasks have crashed. Check the task logs for an earlier error to debug further."
    assert old[2:4] == ["/job:jax_worker/replica:0/task:3", "/job:jax_worker/replica:0/task:5"]


def test_nccl_warn_is_preceded_by_blank_line_and_optionally_timestamped() -> None:
    plain = L.nccl_warn(
        "node001", 81234, 81502, 3, "misc/socket.cc:478", "socketStartConnect: exceeded timeouts (5)"
    )
    assert plain == [
        "",
        "node001:81234:81502 [3] misc/socket.cc:478 NCCL WARN socketStartConnect: exceeded timeouts (5)",
    ]
    ts = L.nccl_warn("node001", 1, 2, 0, "x.cc:1", "m", ts=T)
    assert ts[1].startswith("[2026-06-12 10:15:22] node001:1:2 [0] x.cc:1 NCCL WARN m")


def test_slurm_lines() -> None:
    assert L.srun_task_exit("node006", "5", 137) == "srun: error: node006: task 5: Exited with exit code 137"
    assert L.srun_task_killed("node001", "0-7") == "srun: error: node001: tasks 0-7: Killed"
    assert L.srun_terminating("123456.0") == "srun: Terminating StepId=123456.0"
    assert L.srun_terminating("123456.0", old=True) == "srun: Terminating job step 123456.0"
    t = 1748779205.0  # 2025-06-01T12:00:05
    assert L.slurmstepd_cancelled("123456", "node001", t, reason="time") == (
        "slurmstepd: error: *** JOB 123456 ON node001 CANCELLED AT 2025-06-01T12:00:05 DUE TO TIME LIMIT ***"
    )
    assert L.slurmstepd_cancelled("123456", "node001", t).endswith("CANCELLED AT 2025-06-01T12:00:05 ***")
    assert "DUE to SIGNAL Terminated" in L.slurmstepd_cancelled("1", "n", t, slurm="25.05")
    assert "oom-kill event(s)" in L.slurmstepd_oom("1.0", slurm="22.05")
    assert L.slurmstepd_oom("1.0").endswith("Some of the step tasks have been OOM Killed.")


def test_prometheus_auto_increment_and_tunnel() -> None:
    out = L.prometheus_lines(["node001", "node002"], "1-JAX-x", 9190, 9192)
    assert out[0] == "[Prometheus] Port 9190 occupied, trying 9191..."
    assert "[Prometheus] WARNING: port 9190 was occupied; using 9192 instead" in out
    assert (
        "[Prometheus] Started on port 9192 (ray: 'node001:55080', 'node002:55080'; "
        "node_hw: 'node001:9400', 'node002:9400')"
    ) in out
    old = L.prometheus_lines(["node001"], "1-JAX-x", 9190, 9190, pid=4242)
    assert (
        old[0]
        == "[Prometheus] Started on port 9190 (pid 4242; ray: 'node001:55080'; node_hw: 'node001:9400')"
    )
    tun = L.tunnel_lines("me@login01", "me@10.1.1.1", "node001", 9192)
    fwd = "-L 8265:localhost:8265 -L 6006:localhost:6006 -L 9192:localhost:9192 root@node001"
    assert f"  ssh -J me@login01 {fwd}" in tun
    assert any(re.fullmatch(rf"  ssh -J me@10\.1\.1\.1\s+{fwd}", x) for x in tun)


def test_harmless_lines_cover_the_runbook_table() -> None:
    import random

    text = "\n".join("\n".join(g) for g in L.harmless_lines(T, 1, "node001", random.Random(0)))
    for pattern in (
        "Failed call to cuInit: UNKNOWN ERROR (303)",
        "INTERNAL: CUDA error",
        "NCCL WARN MSCCL++: Feature not enabled",
        "Token indices sequence length is longer than the specified maximum sequence length",
        "OCI runtime exec failed",
        "docker exec failed",
        "falling back to host-level kill",
        "[cgroup] Sent SIGKILL to 0/0 processes",
        "error executing setns process: exit status 1: unknown",
        "Cannot read CPU core",
        "topology.cc",
        "No hardware is found. Using default TPU version: jellyfish",
        "No device identifiers found",
        "trace.cc",
        "Enabling PjRt/TPU event dependency logging",
        "Fiber init: default domain = futex",
        "init-domain.cc",
        "Error response from daemon: cannot remove container",
        "did not receive an exit event",
    ):
        assert pattern in text, pattern
