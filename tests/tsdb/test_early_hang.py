"""The early page's pure judgement: in-memory series at a fake time, the hang signatures and what must not confirm."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from jobdiagd.tsdb.client import Series
from jobdiagd.tsdb.early_hang import (
    IO_FULL,
    METRICS,
    POWER,
    PROCS,
    UTIL,
    VRAM,
    early_query,
    judge,
    profile_for,
    window_s,
)
from jobdiagd.tsdb.settings import DEFAULT_PROFILES, Thresholds, TsdbSettings

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
) -> list[Series]:
    """What `early_query` returns: per (metric, host, GPU) the raw samples at `times`."""
    out: list[Series] = []
    for i, h in enumerate(nodes):
        for g in range(GPUS):
            for name, k in ((UTIL, 0), (POWER, 1), (PROCS, 2)):
                if name in without:
                    continue
                gpu_label = {"GpuIndex": str(g), "ip": f"10.0.0.{i + 1}"} if name == UTIL else {"gpu": str(g)}
                labels = {"__name__": name, "host": h, **gpu_label}
                out.append(Series(labels, tuple((t, state(h, t)[k]) for t in times)))
            out.append(Series({"__name__": VRAM, "host": h, "gpu": str(g)}, ((times[-1], 192.0 * 2**30),)))
        out.append(Series({"__name__": IO_FULL, "host": h}, tuple((t, io(h, t)) for t in times)))
    return out


def run(series: list[Series], *, at: float = AT, nodes: Sequence[str] = NODES):  # type: ignore[no-untyped-def]
    return judge(
        series, at=at, nodes=nodes, profile=MI300X, thresholds=Thresholds(), scrape_interval_s=SCRAPE
    )


def every(gpu: Gpu) -> Callable[[str, float], Gpu]:
    return lambda h, t: gpu


def test_busy_wait_on_every_host_for_two_scrapes_confirms() -> None:
    v = run(scrapes(every(BUSY)))
    assert v.confirmed and v.state == "busy-wait"
    assert v.suspects == () and "busy-wait" in v.mechanism
    assert set(v.per_host) == set(NODES)


def test_one_scrape_of_busy_wait_does_not_confirm() -> None:
    # Training until the scrape before the last: only the newest scrape spins.
    v = run(scrapes(lambda h, t: BUSY if t > AT - 10 else TRAIN))
    assert not v.confirmed and v.state == "not-a-hang"
    # ... and the next scrape, ten seconds later, confirms.
    later = scrapes(lambda h, t: BUSY if t > AT - 10 else TRAIN, times=(AT - 15, AT - 5, AT + 5))
    assert run(later, at=AT + 6).state == "busy-wait"


def test_samples_after_the_judged_time_are_not_read() -> None:
    future = scrapes(lambda h, t: BUSY if t > AT else TRAIN, times=(AT - 15, AT - 5, AT + 5, AT + 15))
    assert run(future, at=AT).state == "not-a-hang"


def test_one_host_still_training_does_not_confirm() -> None:
    v = run(scrapes(lambda h, t: TRAIN if h == "node002" else BUSY))
    assert not v.confirmed and "training" in v.per_host["node002"]


def test_stale_metrics_never_confirm() -> None:
    # The newest samples are 30 s old: more than two scrape intervals.
    v = run(scrapes(every(BUSY), times=(AT - 50, AT - 40, AT - 30)))
    assert v.state == "no-data" and not v.confirmed and "stale" in v.summary


def test_a_single_sample_never_confirms() -> None:
    v = run(scrapes(every(BUSY), times=(AT - 5,)))
    assert v.state == "no-data"


def test_a_silent_node_never_confirms() -> None:
    v = run(scrapes(every(BUSY), nodes=NODES[:3]))
    assert v.state == "no-data" and "node004" in v.summary
    assert v.per_host["node004"] == "no samples at all (silent host)"


@pytest.mark.parametrize("missing", [UTIL, POWER])
def test_a_missing_metric_never_confirms(missing: str) -> None:
    v = run(scrapes(every(BUSY), without=frozenset({missing})))
    assert v.state == "no-data" and missing in v.per_host["node001"]


def test_nothing_at_all_is_no_data() -> None:
    assert run([], nodes=()).state == "no-data"


@pytest.mark.parametrize(
    ("phase", "gpu", "io"),
    [
        ("checkpoint save", CKPT, 25.0),  # GPUs wait on D2H and I/O: low util, low power, I/O pressure
        ("eval", EVAL, 0.5),  # forward passes: high util at near-training power
        ("compilation", COMPILE, 0.5),  # host CPU work: GPUs near idle, process alive
        ("restore", COMPILE, 30.0),  # storage reads, then compilation
    ],
)
def test_pauses_that_are_not_hangs_do_not_confirm(phase: str, gpu: Gpu, io: float) -> None:
    v = run(scrapes(every(gpu), io=lambda h, t: io))
    assert not v.confirmed, (phase, v)
    assert v.state == "not-a-hang"


def test_io_pressure_vetoes_even_a_spinning_signature() -> None:
    """A save that looks like a spin (async checkpoint threads keep a kernel polling) is left to the step budget."""
    v = run(scrapes(every(BUSY), io=lambda h, t: 40.0 if h == "node001" else 0.5))
    assert not v.confirmed and "I/O pressure" in v.summary and "node001" in v.summary


def test_dead_node_names_the_host() -> None:
    v = run(scrapes(lambda h, t: DEAD if h == "node003" else BUSY))
    assert v.confirmed and v.state == "dead-node"
    assert v.suspects == ("node003",)
    assert "node003" in v.summary and "dead node" in v.mechanism


def test_dead_node_needs_the_gpu_process_count() -> None:
    v = run(scrapes(lambda h, t: DEAD if h == "node003" else BUSY, without=frozenset({PROCS})))
    assert v.state == "no-data" and PROCS in v.per_host["node003"]


def test_idle_host_with_its_process_alive_is_not_a_dead_node() -> None:
    v = run(scrapes(lambda h, t: IDLE_ALIVE if h == "node003" else BUSY))
    assert not v.confirmed and "process alive" in v.per_host["node003"]


def test_every_host_idle_without_processes_is_not_a_hang() -> None:
    """The job's processes are gone everywhere (it exited): nobody waits on anybody."""
    assert run(scrapes(every(DEAD))).state == "not-a-hang"


def test_dead_node_needs_two_scrapes() -> None:
    v = run(scrapes(lambda h, t: DEAD if h == "node003" and t > AT - 10 else BUSY))
    assert not v.confirmed


def test_fqdn_labels_match_short_node_names() -> None:
    series = scrapes(every(BUSY))
    fqdn = [Series({**s.labels, "host": s.labels["host"] + ".cluster.local"}, s.points) for s in series]
    assert run(fqdn).state == "busy-wait"


def test_the_power_bands_follow_the_gpu_model() -> None:
    """An H100 eval at 400 W is under its training band but above its busy-wait band: no hang.
    Judged with MI300X bands (busy-wait up to 350 W + 15 %) it would look like a spin."""
    h100_eval = [
        Series(dict(s.labels), ((s.points[-1][0], 80.0 * 2**30),)) if s.labels["__name__"] == VRAM else s
        for s in scrapes(every((98.0, 400.0, 1.0)))
    ]
    prof = profile_for(h100_eval, TsdbSettings())
    assert prof.name == "H100"
    args = {"at": AT, "nodes": NODES, "thresholds": Thresholds(), "scrape_interval_s": SCRAPE}
    assert judge(h100_eval, profile=prof, **args).state == "not-a-hang"  # type: ignore[arg-type]
    assert judge(h100_eval, profile=MI300X, **args).state == "busy-wait"  # type: ignore[arg-type]
    assert profile_for(h100_eval, TsdbSettings(gpu_model="MI355X")).name == "MI355X"
    assert profile_for([], TsdbSettings()).name == "MI300X"


def test_the_query_asks_every_family_over_three_scrapes() -> None:
    q = early_query(SCRAPE)
    assert all(m in q for m in METRICS)
    assert q.endswith(f"[{window_s(SCRAPE)}s]") and window_s(SCRAPE) == 30
