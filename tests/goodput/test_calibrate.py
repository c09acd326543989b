"""calibrate's judgement on outcomes of a tiny synthetic archive (rule GP-10)."""

from __future__ import annotations

from jobdiagd.goodput.calibrate import (
    Outcome,
    Policy,
    grid,
    group_key,
    propose,
    render_table,
    step_band,
    toml_snippet,
)

TIGHT = Policy(2.0, 60.0, 300.0)
MID = Policy(3.0, 120.0, 900.0)
LOOSE = Policy(6.0, 300.0, 1800.0)


def o(
    job: str, hang: bool, paged: bool, latency: float | None = None, false: bool = False, group: str = "g"
) -> Outcome:
    return Outcome(job=job, group=group, hang=hang, paged=paged, latency_s=latency, false_page=false)


def results() -> dict[Policy, list[Outcome]]:
    """A slow healthy job false-pages at the tight policy; the loose one misses a short hang."""
    return {
        TIGHT: [o("h1", True, True, 70), o("h2", True, True, 80), o("ok", False, True, false=True)],
        MID: [o("h1", True, True, 130), o("h2", True, True, 150), o("ok", False, False)],
        LOOSE: [o("h1", True, True, 320), o("h2", True, False), o("ok", False, False)],
    }


def test_the_tightest_clean_policy_is_proposed() -> None:
    p = propose(results())
    assert p.overall.policy == MID and p.overall_clean
    assert (p.overall.hangs, p.overall.misses, p.overall.false_pages, p.overall.worst_s) == (2, 0, 0, 150)
    by = {s.policy: s for s in p.table}
    assert (by[TIGHT].false_pages, by[LOOSE].misses) == (1, 1)
    assert "<- proposed" in next(ln for ln in render_table(p).splitlines() if ln.lstrip().startswith("3 "))


def test_each_configuration_gets_its_own_proposal() -> None:
    res = results()
    res = {
        k: [*v, o("x", True, True, {TIGHT: 40, MID: 90, LOOSE: 200}[k], group="fast")] for k, v in res.items()
    }
    p = propose(res)
    assert p.groups["fast"][0].policy == TIGHT and p.groups["fast"][1]
    assert p.groups["g"][0].policy == MID
    text = toml_snippet(p, "test")
    assert (
        "[detectors.hang]\nstall_factor = 3\nmin_stall_seconds = 120\ncheckpoint_budget_seconds = 900\n"
        in text
    )
    assert "#   fast: stall_factor = 2, min_stall_seconds = 60" in text


def test_without_a_clean_policy_the_closest_is_named_so() -> None:
    res = {
        TIGHT: [o("ok", False, True, false=True)],
        LOOSE: [o("h", True, False), o("ok2", False, True, false=True)],
    }
    p = propose(res)
    assert not p.overall_clean and p.overall.policy == TIGHT
    assert "No policy of the grid caught every hang" in toml_snippet(p, "test")


def test_grid_bands_and_group_keys() -> None:
    assert len(grid()) == 36 and grid()[0] == TIGHT
    assert [step_band(x) for x in (0.7, 1.0, 5.2, 16.0, None)] == ["0.5-1s", "1-2s", "4-8s", "16-32s", "?"]
    assert group_key("llama3.1-70b", 4, 5.2) == "llama3.1-70b x4 4-8s"
