"""Write docs/reliability.md from a run of the fault-injection tests: one row per fault and test.

    .venv/bin/python scripts/reliability_report.py            # run the tests, write the page
    .venv/bin/python scripts/reliability_report.py --from DIR # render a previous run's DIR again

The tests run under pytest with JOBDIAGD_FAULT_REPORT_DIR set: a test built for this report
writes a record of what it injected, what the daemon did, what was delivered and its figures
(`tests/helpers/faults.py`), taken from that run. Older fault tests write none: their row
says what the test injects and checks (FAULTS below) with the run's result and duration from
pytest's JUnit XML. A test that failed, was skipped or did not run says so in its row; the
page is written anyway, so a regression shows in the diff. Exit 1 when a test did not pass.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Fault:
    fault: str  # as issue 11 lists it
    test: str  # pytest node id
    injected: str = ""  # for tests without a record: what the test does
    checked: str = ""  # ... and what it asserts the daemon did / delivered


FAULTS: tuple[Fault, ...] = (
    Fault(
        "squeue hangs past its timeout",
        "tests/daemon/test_slurm_faults.py::test_hung_squeue_wrapper_is_killed_at_the_timeout_and_ticks_go_on",
        "a `squeue` wrapper first on the daemon's PATH sleeps 600 s on every call (real Slurm behind it)",
        "each call's process group killed at the 2 s timeout; ticks go on and the job's hang is paged "
        "meanwhile; status DEGRADED; SIGTERM during a hung call stops the daemon and the call",
    ),
    Fault(
        "squeue fails",
        "tests/daemon/test_slurm_faults.py::test_status_exits_nonzero_and_says_degraded_while_squeue_fails",
        "`squeue` exits 1 (unable to contact slurm controller)",
        "`jobdiagd status` exits 1 naming the error; one degraded notice, one recovered notice",
    ),
    Fault(
        "squeue prints garbage or nothing",
        "tests/daemon/test_slurm_faults.py::test_empty_or_garbage_squeue_answers_do_not_end_a_running_job",
        "`squeue` exits 0 printing nothing, then an HTML 502 page, while the job runs",
        "no end report for the running job (scontrol says RUNNING); one degraded and one recovered "
        "notice; the real scancel later reported once",
    ),
    Fault(
        "scontrol (or any Slurm command) hangs",
        "tests/slurm/test_backend.py::test_timeout_kills_a_wrapper_scripts_whole_process_group",
        "a Slurm command that never answers (wrapper script with children)",
        "the whole process group killed at the timeout, a clear error",
    ),
    Fault(
        "scontrol fails or contradicts squeue",
        "tests/slurm/test_backend.py::test_watcher_does_not_end_a_job_scontrol_still_runs",
        "squeue stops listing a job that scontrol still reports running",
        "the job is not ended",
    ),
    Fault("slurmctld stopped and restarted mid-run", "tests/service/test_slurmctld_restart.py"),
    Fault(
        "ssh connection dropped mid-query",
        "tests/tsdb/test_live_ssh.py::test_reconnects_after_connection_loss",
        "the ssh connection to the head node (real sshd on 127.0.0.1) closed under an open tunnel",
        "the pool reconnects and the next query goes through",
    ),
    Fault(
        "head node unreachable",
        "tests/tsdb/test_access.py::test_live_unreachable_falls_back_to_block_copy",
        "the live job's head node does not answer ssh",
        "the diagnosis falls back to a block copy and says the head node was unreachable",
    ),
    Fault(
        "Prometheus errors or is very slow",
        "tests/tsdb/test_client.py::test_request_on_the_wire_and_errors",
        "a local HTTP server in place of Prometheus's API answers an error and a query 3x past the timeout",
        "PromError naming the server and the query; the slow query cut at the timeout",
    ),
    Fault("Prometheus answering 500, invalid JSON, garbage, very slowly", "tests/tsdb/test_client_faults.py"),
    Fault(
        "Prometheus verdict unavailable on a hang page",
        "tests/daemon/test_tsdb_enrich.py::test_unknown_verdict_never_suppresses_a_page",
        "the GPU verdict query of a RAY=1 job's hang fails",
        "the hang is still paged, saying the verdict is unknown",
    ),
    Fault(
        "log truncated, rotated, renamed, deleted, a directory, unreadable, 100 MB line, binary garbage",
        "tests/service/test_log_faults.py",
    ),
    Fault(
        "log replaced by a FIFO (or socket, device, directory)",
        "tests/daemon/test_hostile_files.py::test_fifo_socket_device_and_directory_logs_are_refused_while_other_jobs_stay_watched",
        "job logs that are a FIFO, a socket, a device and a directory",
        "each refused without blocking (one blind notice each), the other jobs still watched",
    ),
    Fault(
        "log unreadable from the start",
        "tests/daemon/test_hostile_files.py::test_a_log_unreadable_from_the_start_is_reported_blind_then_restored",
        "a mode-000 log before the daemon's first read (daemon without CAP_DAC_OVERRIDE)",
        "one blind notice, status blind; restored notice once readable, its steps read",
    ),
    Fault(
        "symlink pointing out of the outputs roots",
        "tests/daemon/test_hostile_files.py::test_log_links_out_of_the_root_or_to_another_users_file_are_refused_and_never_quoted",
        "`log` links to a file outside the roots and to another user's file",
        "refused, never read nor quoted; one blind notice each",
    ),
    Fault(
        "a line that never ends",
        "tests/daemon/test_memory_bound.py::test_a_line_that_never_ends_does_not_grow_the_reader",
        "a log growing without a newline",
        "the reader's memory stays bounded",
    ),
    Fault(
        "chat API down for a simulated hour",
        "tests/notifiers/test_chat_outage.py::test_a_long_chat_outage_delivers_every_alert_once_in_order",
    ),
    Fault(
        "a 429 storm",
        "tests/notifiers/test_chat_outage.py::test_a_429_storm_delays_pages_but_delivers_each_once_in_order",
    ),
    Fault(
        "429 from Telegram",
        "tests/chat/test_telegram_daemon.py::test_a_429_is_retried_and_the_page_arrives_once",
        "Telegram answers 429 with retry_after to the page",
        "retried no sooner than retry_after; the page arrives once",
    ),
    Fault(
        "429 from Slack",
        "tests/chat/test_slack_daemon.py::test_a_429_is_retried_after_retry_after_and_the_page_arrives_once",
        "Slack answers 429 with Retry-After to the page",
        "retried after Retry-After; the page arrives once",
    ),
    Fault(
        "state directory full",
        "tests/daemon/test_disk_full.py::test_hang_opened_on_a_full_disk_is_paged_once_when_space_returns",
        "the state dir on a real tmpfs filled up while a hang opens",
        "the page is held, sent once when space returns; status shows the store failing",
    ),
    Fault(
        "state directory full across a restart",
        "tests/daemon/test_disk_full.py::test_hang_opened_on_a_full_disk_survives_a_restart_while_still_full",
        "the disk stays full across a daemon restart",
        "the hang is found again and paged once",
    ),
    Fault(
        "SQLite store corrupted at start",
        "tests/daemon/test_corrupt_state.py::test_a_damaged_store_at_start_is_quarantined_and_the_daemon_runs_clean",
        "the alert store overwritten with garbage before start",
        "moved aside (quarantined), a clean store started with a notice, monitoring runs",
    ),
    Fault(
        "SQLite store locked at start",
        "tests/daemon/test_corrupt_state.py::test_a_store_another_process_keeps_unreadable_at_start_is_waited_for",
        "another process holds the store's lock when the daemon starts",
        "one log line, the daemon waits and starts once it is released",
    ),
    Fault(
        "SQLite store locked while running",
        "tests/daemon/test_corrupt_state.py::test_a_page_made_while_another_process_holds_the_write_lock_is_sent_once_it_is_released",
        "another process holds the write lock while a page is made",
        "the page is sent once the lock is released",
    ),
    Fault("kill -9 at random points of a tick, 50 times", "tests/service/test_kill_loop.py"),
    Fault("500 jobs at once; 10 000 finished jobs in the outputs root", "tests/service/test_many_jobs.py"),
    Fault("HA pair: two daemons, one killed", "tests/service/test_ha_pair.py"),
    Fault(
        "HA pair: one Alertmanager peer down",
        "tests/alerts/test_alertmanager.py::test_ha_pair_with_one_peer_down_still_delivers_and_the_peer_catches_up",
        "one of the two Alertmanager peers stopped, then started again",
        "delivered through the live peer; the returned peer gets the next re-post",
    ),
)


def run_tests(out: Path, tests: list[str]) -> int:
    records = out / "records"
    records.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "JOBDIAGD_FAULT_REPORT_DIR": str(records)}
    (out / "commit.txt").write_text(git_commit() + "\n")  # the code the tests ran
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-s",
        f"--junitxml={out / 'junit.xml'}",
    ]
    return subprocess.run([*cmd, *tests], cwd=REPO, env=env, check=False).returncode


def junit_results(path: Path) -> dict[str, tuple[str, float]]:
    """node id -> (passed|failed|skipped, seconds)."""
    if not path.exists():
        return {}
    out: dict[str, tuple[str, float]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        file = case.get("classname", "").replace(".", "/") + ".py"
        node = f"{file}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "skipped"
        out[node] = (outcome, float(case.get("time", "0")))
    return out


def records(path: Path) -> dict[str, list[dict[str, Any]]]:
    """test node id -> its records."""
    out: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(path.glob("*.json")) if path.exists() else []:
        rec = json.loads(f.read_text())
        out.setdefault(str(rec["test"]), []).append(rec)
    return out


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def figures(fig: dict[str, Any]) -> str:
    return "; ".join(f"{k.replace('_', ' ')} {v}" for k, v in fig.items())


def soak_section(path: Path | None) -> str:
    """The figures of a `bench/soak.py` run (its printed JSON), when given."""
    if path is None or not path.exists():
        return ""
    d = json.loads(path.read_text())
    lines = [
        "",
        "## Soak (`bench/soak.py`, outside the test run)",
        "",
        f"{d['minutes']:g} minutes, {d['jobs_live']} jobs live at a time ({d['jobs_total']} in all, churned), "
        f"faults injected: {', '.join(f'{k} {v}' for k, v in d['faults_injected'].items())}. "
        f"Result: {'flat and complete' if d['ok'] else 'NOT OK'}.",
        "",
        "| measure | start (2nd fifth, mean) | end (last fifth, mean) | max | growth | allowance | flat |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, label in (("rss_mb", "RSS (MB)"), ("fds", "open fds"), ("asyncio_tasks", "asyncio tasks")):
        m = d[key]
        lines.append(
            f"| {label} | {m['start']} | {m['end']} | {m['max']} | {m['growth']} | {m['allowance']} | {m['flat']} |"
        )
    lines += [
        "",
        f"Hang pages owed {d['hang_pages']['owed']}, missed {len(d['hang_pages']['missed'])}; end reports owed "
        f"{d['end_reports']['owed']}, missed {len(d['end_reports']['missed'])}; blind notices "
        f"{d['blind_notices']}, restored {d['restored_notices']}; {d['notifications']} notifications; "
        f"last full-tick p99 {d['tick_p99_ms_last']} ms; daemon exit {d['daemon_exit']}.",
        "",
    ]
    return "\n".join(lines)


def render(out: Path, started: float, commit: str, soak: Path | None = None) -> tuple[str, int]:
    results = junit_results(out / "junit.xml")
    recs = records(out / "records")
    rows = []
    not_passed = 0
    for f in FAULTS:
        own = [r for node, rs in recs.items() if node == f.test or node.startswith(f.test + "::") for r in rs]
        matching = {
            k: v for k, v in results.items() if k == f.test or k.startswith((f.test + "::", f.test + "["))
        }
        outcome = "not run"
        seconds = 0.0
        if matching:
            outcomes = {o for o, _ in matching.values()}
            outcome = "failed" if "failed" in outcomes else ("skipped" if "skipped" in outcomes else "passed")
            seconds = sum(s for _, s in matching.values())
        if outcome != "passed":
            not_passed += 1
        test = f"`{f.test.split('::')[-1] if '::' in f.test else f.test}`"
        if own and outcome == "passed":
            for r in own:
                fig = figures(r["figures"])
                rows.append(
                    f"| {cell(f.fault)} | {test} | {outcome} ({seconds:.0f} s) | {cell(r['injected'])} "
                    f"| {cell(r['daemon'])} | {cell(r['delivered'])} | {cell(fig)} |"
                )
        else:
            rows.append(
                f"| {cell(f.fault)} | {test} | {outcome} ({seconds:.0f} s) | {cell(f.injected or '(see the test)')} "
                f"| {cell(f.checked or '(see the test)')} | as asserted by the test | test time {seconds:.1f} s |"
            )
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    head = f"""# Reliability: faults injected for real

Generated by `scripts/reliability_report.py` from a run of the fault-injection tests on {when}
(commit `{commit}`, {os.cpu_count()} CPUs). Do not edit by hand: run the script again.

Every fault runs against real parts: `jobdiagd run` as a process, real Slurm (`scripts/services/slurm.sh`),
sshd, Alertmanager and SQLite; only Telegram and Slack are local emulators speaking their real APIs
to the real client libraries. Rows with figures come from records the tests wrote during this run
(`tests/helpers/faults.py`); the others state what their test injects and asserts, with its result.

What the daemon promises after a fault: it keeps monitoring what it still can, sends one
"degraded" (or "monitoring blind") notice per source and one "recovered" notice, and
`jobdiagd status` shows the fault (exit 1, DEGRADED) while it lasts.

| Fault | Test | Result | Injected | What the daemon did | Delivered | Figures |
|---|---|---|---|---|---|---|
"""
    tail = (
        "\nNot covered by a test yet: Prometheus answering badly *through the daemon's ssh tunnel* end\n"
        "to end (the client is tested against each bad answer, the daemon against a failed verdict: the\n"
        "page goes out, verdict unknown). Prometheus and ssh have no degraded/recovered notice of their\n"
        "own: they are asked per hang alert, not per tick, and a failure shows in that page.\n"
    )
    return head + "\n".join(rows) + "\n" + tail + soak_section(soak), not_passed


def git_commit() -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "docs" / "reliability.md")
    p.add_argument("--from", dest="from_dir", type=Path, help="render this earlier run's dir (no tests run)")
    p.add_argument("--keep", type=Path, help="keep this run's records and JUnit XML in this dir")
    p.add_argument("--soak", type=Path, help="add the figures of a bench/soak.py run (its JSON output)")
    a = p.parse_args(argv)
    started = time.time()
    if a.from_dir is not None:
        work = a.from_dir
        started = (work / "junit.xml").stat().st_mtime
    else:
        work = a.keep or Path(tempfile.mkdtemp(prefix="jd-reliability-"))
        run_tests(work, sorted({f.test for f in FAULTS}))
    ran_at = work / "commit.txt"
    commit = ran_at.read_text().strip() if ran_at.exists() else git_commit()
    page, not_passed = render(work, started, commit, a.soak)
    a.out.write_text(page)
    print(f"wrote {a.out} ({len(FAULTS)} faults, {not_passed} not passed); run dir {work}")
    return 1 if not_passed else 0


if __name__ == "__main__":
    sys.exit(main())
