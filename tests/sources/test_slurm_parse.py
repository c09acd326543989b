"""Pure parsers of Slurm output, on text captured from Slurm 22.05.8 here and on >= 23.11 shapes."""

from __future__ import annotations

import json
from datetime import UTC, timedelta, timezone
from pathlib import Path

import pytest

from jobdiagd.rules.hostlist import parse_hostlist
from jobdiagd.rules.slurm import normalize_state, parse_slurm_duration, parse_slurm_time
from jobdiagd.sources.slurm_parse import (
    SQUEUE_FIELDS,
    SQUEUE_SEP,
    SlurmJob,
    filter_jobs,
    parse_sacct_parsable,
    parse_scontrol_oneline,
    parse_scontrol_output,
    parse_scontrol_pairs,
    parse_squeue_format,
    parse_squeue_json,
    validate_job_id,
    validate_partition,
    validate_user,
)

DATA = Path(__file__).parent / "data"
S = SQUEUE_SEP

# --- captured on Slurm 22.05.8 (this machine), SLURM_TIME_FORMAT=%s, squeue -h -r -o SQUEUE_FORMAT ---
SQUEUE_22_05 = "\n".join(
    [
        S.join(
            ["2", "PENDING", "root", "debug", "", "N/A", "0:00", "UNLIMITED", "/tmp/sx", "Resources", "short"]
        ),
        S.join(
            ["3", "PENDING", "root", "debug", "", "N/A", "0:00", "UNLIMITED", "/tmp/sx", "Priority", "pend"]
        ),
        S.join(
            [
                "1",
                "RUNNING",
                "root",
                "debug",
                "node001",
                "1795945920",
                "0:01",
                "10:00",
                "/tmp/sx",
                "None",
                "feas job|x",
            ]
        ),
        S.join(
            [
                "4",
                "RUNNING",
                "alice",
                "gpu",
                "node[001-003,007]",
                "1795945920",
                "1-02:03:04",
                "2-00:00:00",
                "/home/alice/maxtext",
                "None",
                "JAX-llama2-70b-steps_100",
            ]
        ),
    ]
)

SCONTROL_RUNNING = (
    "JobId=1 JobName=feas job|x UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:23 TimeLimit=00:10:00 TimeMin=N/A "
    "SubmitTime=1795945919 EligibleTime=1795945919 AccrueTime=1795945919 StartTime=1795945920 "
    "EndTime=1795946520 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=1795945920 "
    "Scheduler=Main Partition=debug AllocNode:Sid=localhost:3447 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=node001 BatchHost=node001 NumNodes=1 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=2,node=1,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 "
    "MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
    "Licenses=(null) Network=(null) Command=/tmp/sx/job.sh WorkDir=/tmp/sx "
    "StdErr=/tmp/sx/outputs/1-feas job|x.log StdIn=/dev/null StdOut=/tmp/sx/outputs/1-feas job|x.log Power= "
)
SCONTROL_PENDING = (
    "JobId=3 JobName=pend UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757 Nice=0 "
    "Account=(null) QOS=(null) JobState=PENDING Reason=Priority Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-11-29T09:51:59 EligibleTime=2026-11-29T09:51:59 AccrueTime=2026-11-29T09:51:59 "
    "StartTime=Unknown EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
    "LastSchedEval=2026-11-29T09:52:00 Scheduler=Main Partition=debug AllocNode:Sid=localhost:3447 "
    "ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=2 NumTasks=2 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=2,mem=1000M,node=1,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* "
    "CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/sx "
    "StdErr=/tmp/sx/outputs/3-pend.log StdIn=/dev/null StdOut=/tmp/sx/outputs/3-pend.log Power= "
)


def _scontrol_final(state: str, exit_code: str, reason: str = "None") -> str:
    return (
        SCONTROL_RUNNING.replace("JobState=RUNNING", f"JobState={state}")
        .replace("Reason=None", f"Reason={reason}")
        .replace("ExitCode=0:0", f"ExitCode={exit_code}")
        .replace("RunTime=00:00:23", "RunTime=00:00:27")
        .replace("EndTime=1795946520", "EndTime=1795945947")
    )


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("good", ["1", "123456", "123_4", "123+1"])
def test_valid_job_ids(good: str) -> None:
    assert validate_job_id(good) == good


@pytest.mark.parametrize(
    "bad", ["", "-1", "--help", "1 2", "1;rm -rf /", "12a", "1_", "abc", "1\n2", "9" * 11]
)
def test_invalid_job_ids_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        validate_job_id(bad)


def test_user_and_partition_validation() -> None:
    assert validate_user("alice.b-c_1") == "alice.b-c_1"
    assert validate_partition("gpu-mi300x.a") == "gpu-mi300x.a"
    for bad in ["-u", "a b", "a,b", "$(id)", "", "x" * 40]:
        with pytest.raises(ValueError):
            validate_user(bad)
    for bad in ["-p", "a b", "a,b", ""]:
        with pytest.raises(ValueError):
            validate_partition(bad)


# --- states, durations, times, host lists ----------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("RUNNING", "RUNNING"),
        ("running", "RUNNING"),
        ("R", "RUNNING"),
        ("PD", "PENDING"),
        ("CA", "CANCELLED"),
        ("CANCELLED by 1000", "CANCELLED"),
        ("CANCELLED+", "CANCELLED"),
        ("OOM", "OUT_OF_MEMORY"),
        ("OUT_OF_MEMORY", "OUT_OF_MEMORY"),
        ("NF", "NODE_FAIL"),
        ("TO", "TIMEOUT"),
        ("PR", "PREEMPTED"),
        (["RUNNING"], "RUNNING"),
        (["PENDING", "REQUEUED"], "REQUEUED"),
        (["RUNNING", "COMPLETING"], "COMPLETING"),
        (["COMPLETED"], "COMPLETED"),
        ([], "UNKNOWN"),
        ("", "UNKNOWN"),
        (None, "UNKNOWN"),
        (42, "UNKNOWN"),
    ],
)
def test_normalize_state(raw: object, want: str) -> None:
    assert normalize_state(raw) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("1-02:03:04", 93784),
        ("02:03:04", 7384),
        ("0:03", 3),  # squeue %M: minutes:seconds
        ("10:00", 600),
        ("5", 300),  # a bare number is minutes
        ("2-00:00:00", 172800),
        ("1-02", 93600),
        ("1-02:03", 93780),
        ("00:00:01.234", 1),
        ("UNLIMITED", None),
        ("INVALID", None),
        ("N/A", None),
        ("", None),
    ],
)
def test_parse_slurm_duration(text: str, want: int | None) -> None:
    assert parse_slurm_duration(text) == want


@pytest.mark.parametrize("bad", ["abc", "1-", "1:2:3:4", "-5", "1--2"])
def test_parse_slurm_duration_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_slurm_duration(bad)


def test_parse_slurm_time() -> None:
    assert parse_slurm_time("1795945920") == 1795945920.0
    assert parse_slurm_time("2026-11-29T09:52:00", UTC) == 1795945920.0
    assert parse_slurm_time("2026-11-29T10:52:00", timezone(timedelta(hours=1))) == 1795945920.0
    for none in ["N/A", "Unknown", "None", "0", ""]:
        assert parse_slurm_time(none) is None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("node001", ["node001"]),
        (
            "node[001-003,007],gpu-a[1-2]",
            ["node001", "node002", "node003", "node007", "gpu-a1", "gpu-a2"],
        ),
        ("node[08-11]", ["node08", "node09", "node10", "node11"]),
        ("node[9-11]", ["node9", "node10", "node11"]),
        ("a,b,c", ["a", "b", "c"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("smc-1[01-02],smc-2", ["smc-101", "smc-102", "smc-2"]),
        ("", []),
        ("(null)", []),
        ("None assigned", []),
    ],
)
def test_parse_hostlist(text: str, want: list[str]) -> None:
    assert parse_hostlist(text) == want


@pytest.mark.parametrize("bad", ["node[1-", "node]1[", "node[3-1]", "node[a-b]", "n[1-2", "n[1-200000]"])
def test_parse_hostlist_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_hostlist(bad)


# --- squeue -o ------------------------------------------------------------------------------------


def test_squeue_format_fields_keep_name_last() -> None:
    # The job name is the one free-text field: it must be last so that split(maxsplit) keeps it.
    assert SQUEUE_FIELDS[-1] == "%j"


def test_parse_squeue_format_captured_22_05() -> None:
    jobs = parse_squeue_format(SQUEUE_22_05)
    assert [j.job_id for j in jobs] == ["2", "3", "1", "4"]
    pending, _, running, multi = jobs
    assert pending.state == "PENDING"
    assert pending.start_time is None
    assert pending.reason == "Resources"
    assert pending.time_limit_s is None
    assert pending.node_list == ()
    assert running == SlurmJob(
        job_id="1",
        name="feas job|x",
        user="root",
        state="RUNNING",
        partition="debug",
        nodes="node001",
        node_list=("node001",),
        start_time=1795945920.0,
        run_time_s=1,
        time_limit_s=600,
        stdout=None,
        work_dir="/tmp/sx",
        exit_code=None,
        reason=None,
    )
    assert multi.node_list == ("node001", "node002", "node003", "node007")
    assert multi.run_time_s == 93784
    assert multi.time_limit_s == 172800
    assert multi.user == "alice"
    assert multi.partition == "gpu"


def test_parse_squeue_format_name_with_separator_and_garbage_lines() -> None:
    line = S.join(["9", "R", "bob", "p", "n1", "1795945920", "0:05", "5:00", "/w", "None", f"odd{S}name"])
    text = "JOBID STATE\n\n" + line + "\nnot-a-job\n"
    jobs = parse_squeue_format(text)
    assert len(jobs) == 1
    assert jobs[0].name == f"odd{S}name"
    assert jobs[0].state == "RUNNING"


def test_strict_squeue_parse_refuses_lines_that_are_not_jobs() -> None:
    assert len(parse_squeue_format(SQUEUE_22_05, strict=True)) == 4
    line = S.join(["9", "R", "bob", "p", "n1", "1795945920", "0:05", "5:00", "/w", "None", "two"])
    # The rest of a job name with a newline in it is not garbage.
    assert [j.name for j in parse_squeue_format(line + "\nlines\n", strict=True)] == ["two"]
    assert parse_squeue_format("", strict=True) == [] == parse_squeue_format("\n \n", strict=True)
    for text in ["JOBID STATE\n" + line, "garbage", f"x{S}RUNNING{S}me", line.replace("9", "-9", 1)]:
        assert len(parse_squeue_format(text)) <= 1  # lenient: skipped
        with pytest.raises(ValueError, match=r"line\(s\) are not jobs, first '"):
            parse_squeue_format(text, strict=True)


# --- scontrol -o show job -------------------------------------------------------------------------


def test_scontrol_pairs_values_with_spaces_and_equals() -> None:
    kv = parse_scontrol_pairs(SCONTROL_RUNNING)
    assert kv["JobName"] == "feas job|x"
    assert kv["TRES"] == "cpu=2,node=1,billing=2"
    assert kv["AllocNode:Sid"] == "localhost:3447"
    assert kv["CPUs/Task"] == "1"
    assert kv["StdOut"] == "/tmp/sx/outputs/1-feas job|x.log"
    assert kv["Power"] == ""


def test_parse_scontrol_running_captured() -> None:
    job = parse_scontrol_oneline(SCONTROL_RUNNING)
    assert job is not None
    assert job.job_id == "1"
    assert job.name == "feas job|x"
    assert job.user == "root"
    assert job.state == "RUNNING"
    assert job.is_running and not job.is_finished
    assert job.partition == "debug"
    assert job.node_list == ("node001",)
    assert job.start_time == 1795945920.0
    assert job.run_time_s == 23
    assert job.time_limit_s == 600
    assert job.stdout == "/tmp/sx/outputs/1-feas job|x.log"
    assert job.work_dir == "/tmp/sx"
    assert job.exit_code == 0
    assert job.exit_signal is None
    assert job.end_time is None  # the expected end of a running job is not an end
    assert job.reason is None


def test_parse_scontrol_pending_captured_iso_times() -> None:
    job = parse_scontrol_oneline(SCONTROL_PENDING, UTC)
    assert job is not None
    assert job.state == "PENDING"
    assert job.start_time is None
    assert job.nodes == ""
    assert job.node_list == ()
    assert job.time_limit_s is None
    assert job.reason == "Priority"
    assert job.stdout == "/tmp/sx/outputs/3-pend.log"


@pytest.mark.parametrize(
    ("state", "ec", "reason", "code", "sig"),
    [
        ("CANCELLED", "0:15", "None", 0, 15),  # scancel, as seen here
        ("COMPLETED", "0:0", "None", 0, None),
        ("FAILED", "3:0", "NonZeroExitCode", 3, None),
        ("TIMEOUT", "0:15", "TimeLimit", 0, 15),
        ("OUT_OF_MEMORY", "0:125", "OutOfMemory", 0, 125),
        ("NODE_FAIL", "0:0", "NodeDown", 0, None),
        ("PREEMPTED", "0:15", "None", 0, 15),
    ],
)
def test_parse_scontrol_final_states(state: str, ec: str, reason: str, code: int, sig: int | None) -> None:
    job = parse_scontrol_oneline(_scontrol_final(state, ec, reason))
    assert job is not None
    assert job.state == state
    assert job.is_finished
    assert job.exit_code == code
    assert job.exit_signal == sig
    assert job.end_time == 1795945947.0
    assert job.run_time_s == 27
    assert job.reason == (None if reason == "None" else reason)


def test_parse_scontrol_output_array_lines_and_garbage() -> None:
    a = SCONTROL_RUNNING.replace("JobId=1 ", "JobId=11 ArrayJobId=10 ArrayTaskId=1 ")
    b = SCONTROL_RUNNING.replace("JobId=1 ", "JobId=12 ArrayJobId=10 ArrayTaskId=2 ")
    jobs = parse_scontrol_output(f"{a}\n\n{b}\nslurm_load_jobs error: Invalid job id specified\n")
    assert [j.job_id for j in jobs] == ["11", "12"]
    assert parse_scontrol_oneline("JobId=abc JobName=x") is None


# --- sacct ----------------------------------------------------------------------------------------


def test_parse_sacct_jobcomp_captured() -> None:
    # sacct -c -X -n -P --delimiter=$'\x1f' -o <SACCT_FIELDS> on the jobcomp/filetxt file, 22.05.
    # The jobcomp file splits on spaces: a job name with one loses its state (empty here).
    sep = "\x1f"
    text = (
        sep.join(
            [
                "1",
                "root(0)",
                "",
                "debug",
                "node001",
                "1795945920",
                "1795945947",
                "00:00:27",
                "10",
                "/tmp/sx",
                "0:0",
                "",
                "feas",
            ]
        )
        + "\n"
        + sep.join(
            [
                "2",
                "root(0)",
                "FAILED",
                "debug",
                "node001",
                "1795945947",
                "1795945947",
                "00:00:00",
                "UNLIMITED",
                "/tmp/sx",
                "3:0",
                "",
                "short",
            ]
        )
        + "\n"
        + sep.join(["2.batch"] + [""] * 12)
        + "\n"
    )
    one, two = parse_sacct_parsable(text)
    assert one.state == "UNKNOWN"
    assert one.time_limit_s == 600
    assert one.user == "root"
    assert two == SlurmJob(
        job_id="2",
        name="short",
        user="root",
        state="FAILED",
        partition="debug",
        nodes="node001",
        node_list=("node001",),
        start_time=1795945947.0,
        run_time_s=0,
        time_limit_s=None,
        stdout=None,
        work_dir="/tmp/sx",
        exit_code=3,
        reason=None,
        exit_signal=None,
        end_time=1795945947.0,
    )


def test_parse_sacct_slurmdbd_form() -> None:
    sep = "\x1f"
    row = [
        "77",
        "alice",
        "CANCELLED by 1000",
        "gpu",
        "node[01-02]",
        "1795945920",
        "1795949520",
        "01:00:00",
        "1-00:00:00",
        "/w",
        "0:15",
        "None",
        "JAX-x",
    ]
    (job,) = parse_sacct_parsable(sep.join(row))
    assert job.state == "CANCELLED"
    assert job.node_list == ("node01", "node02")
    assert job.run_time_s == 3600
    assert job.time_limit_s == 86400
    assert job.exit_signal == 15


# --- squeue --json -----------------------------------------------------------------------------------


def test_parse_squeue_json_captured_22_05() -> None:
    # Captured here: 1 cancelled while running, 2 exited 3, 3 running, 4 pending (openapi v0.0.38).
    text = (DATA / "squeue-22.05.json").read_text()
    assert json.loads(text)["meta"]["plugin"]["type"] == "openapi/v0.0.38"
    jobs = {j.job_id: j for j in parse_squeue_json(text, now=1795945970.0)}
    assert set(jobs) == {"1", "2", "3", "4"}
    c, f, r, p = jobs["1"], jobs["2"], jobs["3"], jobs["4"]
    assert (c.state, c.exit_code, c.exit_signal, c.run_time_s) == ("CANCELLED", 0, 15, 27)
    assert c.name == "feas job|x"
    assert c.time_limit_s == 600
    assert (f.state, f.exit_code, f.exit_signal, f.reason) == ("FAILED", 3, None, "NonZeroExitCode")
    assert (r.state, r.run_time_s, r.time_limit_s, r.end_time) == ("RUNNING", 23, None, None)
    assert r.node_list == ("node001",)
    assert r.user == "root"
    # 22.05 gives the unexpanded pattern (/tmp/sx/outputs/%j-%x.log): not a path, so None.
    assert r.stdout is None
    assert r.work_dir == "/tmp/sx"
    assert (p.state, p.start_time, p.nodes, p.time_limit_s, p.reason) == (
        "PENDING",
        None,
        "",
        86400,
        "Resources",
    )


def _num(n: int) -> dict[str, object]:
    return {"set": True, "infinite": False, "number": n}


def _exit(code: int, sig: int = 0, status: str = "SUCCESS") -> dict[str, object]:
    return {
        "status": [status],
        "return_code": _num(code),
        "signal": {"id": {"set": sig != 0, "infinite": False, "number": sig}, "name": "TERM" if sig else ""},
    }


# Shape of squeue --json with data_parser v0.0.40 (23.11) / v0.0.42 (24.11): reconstructed from the
# OpenAPI schema (job_state a list, numbers as set/infinite/number objects, exit_code an object).
SQUEUE_24 = {
    "jobs": [
        {
            "job_id": 1201,
            "name": "JAX-llama2-70b-steps_100",
            "user_name": "alice",
            "job_state": ["RUNNING"],
            "partition": "mi300x",
            "nodes": "node[001-002]",
            "start_time": _num(1795945920),
            "end_time": _num(1795949520),
            "submit_time": _num(1795945900),
            "time_limit": _num(60),
            "standard_output": "/home/alice/outputs/1201-JAX-llama2-70b-steps_100.log",
            "current_working_directory": "/home/alice",
            "exit_code": _exit(0, status="SUCCESS"),
            "state_reason": "None",
            "array_job_id": _num(0),
            "array_task_id": {"set": False, "infinite": False, "number": 0},
        },
        {
            "job_id": 1202,
            "name": "pending",
            "user_name": "alice",
            "job_state": ["PENDING"],
            "partition": "mi300x",
            "nodes": "",
            "start_time": _num(1795999999),  # expected start, not a start
            "end_time": _num(0),
            "time_limit": {"set": False, "infinite": True, "number": 0},
            "standard_output": "/home/alice/outputs/%j-%x.log",
            "current_working_directory": "/home/alice",
            "exit_code": _exit(0, status="PENDING"),
            "state_reason": "Resources",
        },
        {
            "job_id": 1203,
            "name": "cancelled",
            "user_name": "bob",
            "job_state": ["CANCELLED"],
            "partition": "debug",
            "nodes": "gpu-a[1-2]",
            "start_time": _num(1795945920),
            "end_time": _num(1795945980),
            "time_limit": _num(30),
            "exit_code": _exit(0, 15, "SIGNALED"),
            "state_reason": "None",
        },
        {
            "job_id": 1204,
            "name": "completing",
            "user_name": "bob",
            "job_state": ["RUNNING", "COMPLETING"],
            "partition": "debug",
            "nodes": "gpu-a1",
            "start_time": _num(1795945920),
            "end_time": _num(1795945990),
            "time_limit": _num(30),
            "exit_code": _exit(0),
            "state_reason": "None",
        },
        {"job_id": 1205, "job_state": ["OUT_OF_MEMORY"], "exit_code": _exit(0, 9, "SIGNALED")},
        {"name": "no id"},
    ],
    "last_backfill": _num(1795945960),
    "last_update": _num(1795945970),
    "meta": {
        "plugin": {"type": "", "name": "", "data_parser": "data_parser/v0.0.42", "accounting_storage": ""},
        "slurm": {"version": {"major": "24", "micro": "3", "minor": "11"}, "release": "24.11.3"},
    },
    "errors": [],
    "warnings": [],
}


def test_parse_squeue_json_24_shapes() -> None:
    jobs = {j.job_id: j for j in parse_squeue_json(json.dumps(SQUEUE_24), now=1795946020.0)}
    assert set(jobs) == {"1201", "1202", "1203", "1204", "1205"}
    r = jobs["1201"]
    assert (r.state, r.start_time, r.run_time_s, r.time_limit_s) == ("RUNNING", 1795945920.0, 100, 3600)
    assert r.node_list == ("node001", "node002")
    assert r.stdout == "/home/alice/outputs/1201-JAX-llama2-70b-steps_100.log"
    assert (r.exit_code, r.exit_signal, r.end_time, r.reason) == (0, None, None, None)
    p = jobs["1202"]
    assert (p.state, p.start_time, p.time_limit_s, p.stdout, p.reason) == (
        "PENDING",
        None,
        None,
        None,
        "Resources",
    )
    c = jobs["1203"]
    assert (c.state, c.exit_code, c.exit_signal, c.run_time_s, c.end_time) == (
        "CANCELLED",
        0,
        15,
        60,
        1795945980.0,
    )
    assert c.node_list == ("gpu-a1", "gpu-a2")
    assert jobs["1204"].state == "COMPLETING"
    oom = jobs["1205"]
    assert (oom.state, oom.exit_signal, oom.name, oom.run_time_s) == ("OUT_OF_MEMORY", 9, "", None)


def test_parse_squeue_json_accepts_a_parsed_document_and_rejects_other_json() -> None:
    assert [j.job_id for j in parse_squeue_json(SQUEUE_24)][:1] == ["1201"]
    with pytest.raises(ValueError):
        parse_squeue_json('{"errors": []}')
    with pytest.raises(ValueError):
        parse_squeue_json("not json")


def test_json_sentinels_mean_no_value() -> None:
    doc = {
        "jobs": [
            {
                "job_id": 5,
                "job_state": "RUNNING",
                "start_time": 1795945920,
                "time_limit": 4294967295,  # INFINITE in a plain 22.05 integer
                "exit_code": 4294967294,  # NO_VAL
            }
        ]
    }
    (job,) = parse_squeue_json(doc)
    assert job.time_limit_s is None
    assert job.exit_code is None
    assert job.run_time_s is None  # running, and no `now` given


def test_filter_jobs() -> None:
    jobs = parse_squeue_format(SQUEUE_22_05)
    assert [j.job_id for j in filter_jobs(jobs, ["alice"], [])] == ["4"]
    assert [j.job_id for j in filter_jobs(jobs, [], ["debug"])] == ["2", "3", "1"]
    assert [j.job_id for j in filter_jobs(jobs, ["root"], ["gpu"])] == []
    assert len(filter_jobs(jobs, [], [])) == 4
