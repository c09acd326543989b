"""The one GPU-hang judge (rule HANG-GPU): its rule table on in-memory series at a fake time.

The early page and the hang page's verdict both call `judge`; these are the rows of the table in
`tsdb/gpu_hang.py`'s docstring, then what must not confirm, then the inputs (stale, missing, labels)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from jobdiagd.model.kinds import GpuHangState
from jobdiagd.tsdb.client import Series
from jobdiagd.tsdb.gpu_hang import (
    IO_FULL,
    METRICS,
    POWER,
    PROCS,
    UTIL,
    VRAM,
    GpuVerdict,
    gpu_query,
    judge,
    profile_for,
    window_s,
)
from jobdiagd.tsdb.settings import DEFAULT_PROFILES, GpuProfile, Thresholds, TsdbSettings

S = GpuHangState
NODES = ("node001", "node002", "node003", "node004")
GPUS = 8
AT = 1_780_000_000.0
SCRAPE = 10.0
MI300X = DEFAULT_PROFILES["MI300X"]

# (utilization %, power W, GPU processes) per GPU at one scrape
Gpu = tuple[float, float, float]
TRAIN: Gpu = (100.0, 690.0, 1.0)
BUSY: Gpu = (100.0, 305.0, 1.0)
CKPT: Gpu = (15.0, 180.0, 1.0)
EVAL: Gpu = (98.0, 520.0, 1.0)
COMPILE: Gpu = (0.0, 130.0, 1.0)
DEAD: Gpu = (0.0, 90.0, 0.0)
IDLE_ALIVE: Gpu = (0.0, 90.0, 1.0)


def scrapes(
    state: Callable[[str, float], Gpu],
    *,
    times: Sequence[float] = (AT - 25, AT - 15, AT - 5),
    nodes: Sequence[str] = NODES,
    io: Callable[[str, float], float] = lambda h, t: 0.5,
    without: frozenset[str] = frozenset(),
    vram_gib: float = 192.0,
) -> list[Series]:
    """What `gpu_query` returns: per (metric, host, GPU) the raw samples at `times`."""
    out: list[Series] = []
    for i, h in enumerate(nodes):
        for g in range(GPUS):
            for name, k in ((UTIL, 0), (POWER, 1), (PROCS, 2)):
                if name in without:
                    continue
                gpu_label = {"GpuIndex": str(g), "ip": f"10.0.0.{i + 1}"} if name == UTIL else {"gpu": str(g)}
                labels = {"__name__": name, "host": h, **gpu_label}
                out.append(Series(labels, tuple((t, state(h, t)[k]) for t in times)))
            out.append(Series({"__name__": VRAM, "host": h, "gpu": str(g)}, ((times[-1], vram_gib * 2**30),)))
        out.append(Series({"__name__": IO_FULL, "host": h}, tuple((t, io(h, t)) for t in times)))
    return out


def run(
    series: list[Series], *, at: float = AT, nodes: Sequence[str] = NODES, profile: GpuProfile = MI300X
) -> GpuVerdict:
    return judge(
        series, at=at, nodes=nodes, profile=profile, thresholds=Thresholds(), scrape_interval_s=SCRAPE
    )


def every(gpu: Gpu) -> Callable[[str, float], Gpu]:
    return lambda h, t: gpu


def on(host: str, gpu: Gpu, others: Gpu) -> Callable[[str, float], Gpu]:
    return lambda h, t: gpu if h == host else others


# -- the vocabulary ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "confirmed", "denies"),
    [
        (S.BUSY_WAIT, True, False),
        (S.DEAD_NODE, True, False),
        (S.TRAINING, False, True),
        (S.NOT_A_HANG, False, True),
        (S.MIXED, False, False),
        (S.NO_PROCESS, False, False),
        (S.NO_DATA, False, False),
    ],
)
def test_each_state_confirms_denies_or_neither(state: GpuHangState, confirmed: bool, denies: bool) -> None:
    assert (state.confirmed, state.denies) == (confirmed, denies)
    assert (GpuVerdict(state, "x").confirmed, GpuVerdict(state, "x").denies) == (confirmed, denies)


# -- the rule table, row by row ----------------------------------------------------------------


def test_busy_wait_on_every_host_for_two_scrapes_confirms() -> None:
    v = run(scrapes(every(BUSY)))
    assert v.confirmed and v.state is S.BUSY_WAIT
    assert v.suspects == () and "busy-wait" in v.mechanism
    assert set(v.per_host) == set(NODES)
    assert v.mean_power_w == pytest.approx(305.0) and v.gpu_model == "MI300X"


def test_frozen_power_at_full_utilization_is_busy_wait() -> None:
    """marin-community/marin #7344: GB200 ranks at 100 % utilization and 230-280 W, frozen, no error.
    The B200 profile (the GB200's VRAM names it) puts that in the busy-wait band: a hang."""
    wedge = scrapes(lambda h, t: (100.0, 244.0 + (h == "node002") * 30.0, 1.0), vram_gib=186.0)
    prof = profile_for(wedge, TsdbSettings())
    assert prof.name == "B200"
    v = run(wedge, profile=prof)
    assert v.state is S.BUSY_WAIT and v.confirmed


def test_full_utilization_below_the_busy_wait_band_is_busy_wait() -> None:
    """Utilization says busy, power says nothing is computing: power decides."""
    assert run(scrapes(every((100.0, 120.0, 1.0)))).state is S.BUSY_WAIT


def test_frozen_power_between_the_bands_does_not_confirm() -> None:
    """Flat at 450 W with 100 % utilization (MI300X: above busy-wait, under training): a steady eval
    draws the same; flatness alone is not a hang signature."""
    v = run(scrapes(every((100.0, 450.0, 1.0))))
    assert v.state is S.NOT_A_HANG and not v.confirmed


def test_dead_node_under_busy_waiting_peers_names_the_host() -> None:
    v = run(scrapes(on("node003", DEAD, BUSY)))
    assert v.confirmed and v.state is S.DEAD_NODE
    assert v.suspects == ("node003",)
    assert "node003" in v.summary and "dead node" in v.mechanism


def test_more_dead_hosts_than_busy_ones_is_mixed() -> None:
    v = run(scrapes(lambda h, t: BUSY if h == "node001" else DEAD))
    assert v.state is S.MIXED and not v.confirmed and not v.denies


def test_every_host_idle_without_processes_neither_confirms_nor_denies() -> None:
    """The job's processes are gone everywhere (it exited, or was killed with the allocation held):
    nobody waits on anybody, so no collective hang -- and no sign of health either."""
    v = run(scrapes(every(DEAD)))
    assert v.state is S.NO_PROCESS and not v.confirmed and not v.denies


def test_training_power_is_not_a_hang() -> None:
    v = run(scrapes(every(TRAIN)))
    assert v.state is S.TRAINING and v.denies and not v.confirmed
    assert "log output may lag" in v.summary and "32/32" in v.summary


def test_training_with_a_few_gpus_below_training_power_is_still_training() -> None:
    v = run(scrapes(lambda h, t: EVAL if h == "node004" else TRAIN))
    assert v.state is S.TRAINING and "24/32" in v.summary


def test_every_host_idle_with_processes_alive_is_compilation_not_a_hang() -> None:
    v = run(scrapes(every(COMPILE)))
    assert v.state is S.NOT_A_HANG and v.denies
    assert "compilation or restore" in v.summary


def test_io_pressure_vetoes_even_a_spinning_signature() -> None:
    """A save that looks like a spin (async checkpoint threads keep a kernel polling) is left to the step budget."""
    v = run(scrapes(every(BUSY), io=lambda h, t: 40.0 if h == "node001" else 0.5))
    assert v.state is S.NOT_A_HANG and not v.confirmed
    assert "I/O pressure" in v.summary and "node001" in v.summary


def test_some_hosts_spinning_on_an_idle_host_with_its_process_alive_is_mixed() -> None:
    """A host still compiling (or stuck in host code) while the others spin: not confirmed (a
    recompilation looks so for a while), not denied (the others are not working)."""
    v = run(scrapes(on("node003", IDLE_ALIVE, BUSY)))
    assert v.state is S.MIXED and not v.confirmed and not v.denies
    assert "process alive" in v.per_host["node003"]


def test_one_host_still_training_is_mixed() -> None:
    v = run(scrapes(on("node002", TRAIN, BUSY)))
    assert v.state is S.MIXED and "training power" in v.per_host["node002"]


def test_one_scrape_of_busy_wait_does_not_confirm() -> None:
    # Training until the scrape before the last: only the newest scrape spins.
    v = run(scrapes(lambda h, t: BUSY if t > AT - 10 else TRAIN))
    assert not v.confirmed and v.state is S.MIXED
    # ... and the next scrape, ten seconds later, confirms.
    later = scrapes(lambda h, t: BUSY if t > AT - 10 else TRAIN, times=(AT - 15, AT - 5, AT + 5))
    assert run(later, at=AT + 6).state is S.BUSY_WAIT


def test_dead_node_needs_two_scrapes() -> None:
    v = run(scrapes(lambda h, t: DEAD if h == "node003" and t > AT - 10 else BUSY))
    assert not v.confirmed


# -- what must not confirm (the catalog's look-alikes) -----------------------------------------


@pytest.mark.parametrize(
    ("phase", "gpu", "io", "state"),
    [
        ("checkpoint save", CKPT, 25.0, S.NOT_A_HANG),  # GPUs wait on D2H and I/O: I/O pressure vetoes
        ("eval", EVAL, 0.5, S.NOT_A_HANG),  # forward passes: high util at near-training power
        ("compilation", COMPILE, 0.5, S.NOT_A_HANG),  # host CPU work: GPUs near idle, process alive
        ("restore", COMPILE, 30.0, S.NOT_A_HANG),  # storage reads, then compilation
        ("training", TRAIN, 0.5, S.TRAINING),  # the log lags, the GPUs work
    ],
)
def test_pauses_that_are_not_hangs_deny(phase: str, gpu: Gpu, io: float, state: GpuHangState) -> None:
    v = run(scrapes(every(gpu), io=lambda h, t: io))
    assert v.state is state, (phase, v)
    assert not v.confirmed and v.denies


def test_the_power_bands_follow_the_gpu_model() -> None:
    """An H100 eval at 400 W is under its training band but above its busy-wait band: no hang.
    Judged with MI300X bands (busy-wait up to 350 W + 15 %) it would look like a spin."""
    h100_eval = scrapes(every((98.0, 400.0, 1.0)), vram_gib=80.0)
    prof = profile_for(h100_eval, TsdbSettings())
    assert prof.name == "H100"
    assert run(h100_eval, profile=prof).state is S.NOT_A_HANG
    assert run(h100_eval, profile=MI300X).state is S.BUSY_WAIT
    assert profile_for(h100_eval, TsdbSettings(gpu_model="MI355X")).name == "MI355X"
    assert profile_for([], TsdbSettings()).name == "MI300X"


# -- missing or stale data never confirm (and never deny) ---------------------------------------


def test_stale_metrics_are_no_data() -> None:
    # The newest samples are 30 s old: more than two scrape intervals.
    v = run(scrapes(every(BUSY), times=(AT - 50, AT - 40, AT - 30)))
    assert v.state is S.NO_DATA and not v.confirmed and not v.denies and "stale" in v.summary


def test_stale_training_does_not_deny_either() -> None:
    assert run(scrapes(every(TRAIN), times=(AT - 50, AT - 40, AT - 30))).state is S.NO_DATA


def test_a_single_sample_is_no_data() -> None:
    assert run(scrapes(every(BUSY), times=(AT - 5,))).state is S.NO_DATA


def test_a_silent_node_is_no_data() -> None:
    """A node that died with its exporter: the step budget pages it, the verdict names it."""
    v = run(scrapes(every(BUSY), nodes=NODES[:3]))
    assert v.state is S.NO_DATA and "node004" in v.summary
    assert v.per_host["node004"] == "no samples at all (silent host)"


@pytest.mark.parametrize("missing", [UTIL, POWER])
def test_a_missing_metric_is_no_data(missing: str) -> None:
    v = run(scrapes(every(BUSY), without=frozenset({missing})))
    assert v.state is S.NO_DATA and missing in v.per_host["node001"]


def test_dead_node_needs_the_gpu_process_count() -> None:
    v = run(scrapes(on("node003", DEAD, BUSY), without=frozenset({PROCS})))
    assert v.state is S.NO_DATA and PROCS in v.per_host["node003"]


def test_nothing_at_all_is_no_data() -> None:
    assert run([], nodes=()).state is S.NO_DATA


def test_samples_after_the_judged_time_are_not_read() -> None:
    future = scrapes(lambda h, t: BUSY if t > AT else TRAIN, times=(AT - 15, AT - 5, AT + 5, AT + 15))
    assert run(future, at=AT).state is S.TRAINING


# -- inputs ---------------------------------------------------------------------------------


def test_fqdn_labels_match_short_node_names() -> None:
    series = scrapes(every(BUSY))
    fqdn = [Series({**s.labels, "host": s.labels["host"] + ".cluster.local"}, s.points) for s in series]
    assert run(fqdn).state is S.BUSY_WAIT


def test_the_query_asks_every_family_over_three_scrapes() -> None:
    q = gpu_query(SCRAPE)
    assert all(m in q for m in METRICS)
    assert q.endswith(f"[{window_s(SCRAPE)}s]") and window_s(SCRAPE) == 30
