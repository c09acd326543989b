"""Which step numbers count as progress (`model.stepguard`): bogus ones do not, legitimate ones do."""

from __future__ import annotations

from jobdiagd.logs.state import LogState
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.records import StepRecord
from jobdiagd.model.stepguard import JUMP_MIN_STEPS, SLACK, StepGuard, implausible_top
from jobdiagd.service.jobs import JobView

T0 = 1_780_000_000.0


def newest(
    g: StepGuard, keys: list[int], prev: int, prev_at: float | None, now: float, total: int | None
) -> int:
    return g.newest(
        max(keys), lambda: keys, prev=prev, prev_at=prev_at, now=now, total=total, step_time=lambda: 2.0
    )


def test_a_log_read_at_once_keeps_its_legitimate_top() -> None:
    assert implausible_top(list(range(0, 30)), 5000) == {}
    assert implausible_top([3000, 3001, 3002], 5000) == {}  # restored: starts at N > 0
    assert implausible_top(list(range(4990, 5000)), 5000) == {}  # the last step, total - 1
    assert implausible_top([4999, 5000], 5000) == {}  # a final line numbered `total`
    # A long log's kept records: exact early steps, a down-sampled middle with wide gaps, the
    # exact newest ones. Only the top matters, and its neighbour is one step away.
    long_log = list(range(64)) + list(range(4096, 8_000_000, 4096)) + list(range(8_000_000, 8_001_024))
    assert implausible_top(long_log, 10_000_000) == {}


def test_a_log_read_at_once_drops_a_bogus_top() -> None:
    assert implausible_top([*range(30), 9_999_999], 5000) == {
        9_999_999: "step 9999999 is past the configured total of 5000 steps"
    }
    assert list(implausible_top([*range(30), 50_000], None)) == [50_000]  # no total: the jump
    assert implausible_top([*range(30), 29 + JUMP_MIN_STEPS], None) == {}  # within the floor


def test_incremental_reads_judge_new_steps_once_on_the_daemon_clock() -> None:
    g = StepGuard()
    keys = list(range(30))
    assert newest(g, keys, -1, None, T0, 5000) == 29
    keys.append(4999)  # within the total, but 4970 steps after step 29 in 10 s of 2 s steps
    assert newest(g, keys, 29, T0, T0 + 10, 5000) == 29
    assert list(g.suspects) == [4999] and len(g.take_news()) == 1
    # The job hangs: however long, the old bogus line never becomes plausible.
    assert newest(g, keys, 29, T0, T0 + 10 * 24 * 3600, 5000) == 29
    assert g.take_news() == []
    keys += [30, 31]  # real progress counts again
    assert newest(g, keys, 29, T0, T0 + 20, 5000) == 31


def test_fast_legitimate_progress_and_a_daemon_that_was_away_are_not_suspect() -> None:
    g = StepGuard()
    # 5 minutes away at 2 s steps: 150 steps, well inside 10x slack.
    assert newest(g, list(range(0, 181)), 30, T0, T0 + 300, 5000) == 180
    # Longer away than the floor covers: the slack scales with the time.
    far = 30 + int(SLACK * 3600 / 2.0) - 1
    assert newest(g, [30, far], 30, T0, T0 + 3600, 10**9) == far
    assert g.suspects == {}


def test_the_job_view_keeps_bogus_steps_out_of_progress_and_the_stall_records() -> None:
    state = LogState("/x/7001.log", ref_time=T0)
    state.header["PASSTHROUGH_ARGS"] = '"steps=5000"'
    view = JobView(key="7001", ref=JobRef("7001", "x", None, None, "slurm"), first_seen=T0, main=state)
    for k in range(30):
        state.steps.add(StepRecord(k, 2.0, 3000.0, None, 2.5, None, k + 1, 0, state.source))
        state.step_lines += 1
    assert view.note_read(T0) and view.last_step == 29
    state.steps.add(StepRecord(9_999_999, 1.0, None, None, None, None, 40, None, state.source))
    state.step_lines += 1
    assert not view.note_read(T0 + 15)
    assert view.last_step == 29 and view.last_step_at == T0
    assert [r.step for r in view.sorted_steps()][-1] == 29
    (news,) = view.step_guard.take_news()
    assert news[0] == 9_999_999
    res = view.analysis(T0 + 15)
    assert res.progress.last_step == 29
    assert any("9999999" in n for n in res.cls.notes)
