"""The site source's PromQL, built from the metric map, and its answers read back (pure).

One query per question (rule SITE-5):

- **early** (`early_expr`): one `query_range` over the last three scrape intervals, step half an
  interval, for the job's nodes only (a regex of their escaped host label values). Every role
  is one arm of an `or`, tagged with `__role`; a gauge's arm is paired with `timestamp()` of
  the same selector (tagged `__ts`), so each step carries the *sample's own time* and the raw
  samples are read back exactly (a step that only repeats the previous sample adds nothing):
  the judge's "two fresh scrapes" is about real scrapes, not the query's grid. Counters (I/O
  pressure seconds) are `rate()`s summed per host, timed by their step.
- **slide** (`slide_expr`): one `query_range` over the slide's window, at most `MAX_POINTS`
  points per series: per-GPU power, utilization and memory activity (`avg_over_time` per
  step: a silent GPU drops out), and per-host rates of the host metrics.
- **check** (`check_expr`): per role, `max by (<its labels>)` of its metric: which of its
  host/GPU/job labels the series carry, and its largest value (a 0-1 "utilization").

`decode` maps the answer back into `SiteSeries` of the job's nodes; series whose host label
names no node of the query are dropped (counted).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from jobdiagd.tsdb.client import Series
from jobdiagd.tsdb.site.hosts import HostRewrite, promql_string, re2_escape
from jobdiagd.tsdb.site.placement import SiteSeries
from jobdiagd.tsdb.site.profiles import GPU_ROLES, MetricMap, MetricSpec

EARLY_ROLES = ("power", "util", "vram_used", "processes", "io_pressure")
SLIDE_ROLES = ("power", "util", "mem_activity", "mem_pressure", "tcp_retrans", "rdma_retrans")
MAX_POINTS = 120
ROLE = "__role"
TS = "__ts"
PART = "__part"


def window_s(interval_s: float) -> int:
    """The early query's reach: three scrapes, so the newest two of the slowest series are in it."""
    return max(1, math.ceil(3 * interval_s))


def early_step_s(interval_s: float) -> float:
    return max(0.25, interval_s / 2)


def slide_step_s(start: float, end: float, interval_s: float) -> int:
    return max(math.ceil(interval_s), math.ceil((end - start) / max(1, MAX_POINTS - 1)))


def _name_matcher(spec: MetricSpec) -> str:
    if len(spec.names) == 1:
        return f'__name__="{promql_string(spec.names[0])}"'
    alts = "|".join(re2_escape(n) for n in spec.names)
    return f'__name__=~"{promql_string(alts)}"'


def selector(spec: MetricSpec, host_label: str, host_re: str) -> str:
    return f'{{{_name_matcher(spec)},{host_label}=~"{promql_string(host_re)}"}}'


def _tag(expr: str, role: str, extra: str = "") -> str:
    tagged = f'label_replace({expr}, "{ROLE}", "{role}", "", "")'
    return f'label_replace({tagged}, "{extra}", "1", "", "")' if extra else tagged


def _scaled(expr: str, scale: float) -> str:
    return expr if scale == 1.0 else f"({expr}) * {scale:.17g}"


def _keep_labels(spec: MetricSpec, host_label: str) -> str:
    return ", ".join(
        label for label in (host_label, spec.gpu_label, spec.job_label, spec.model_label) if label
    )


def _counter_arms(spec: MetricSpec, host_label: str, host_re: str, range_s: int, role: str) -> list[str]:
    """One arm per metric name (`rate()` drops the name: two names in one selector would collide),
    tagged `__part` when there are several; `decode` sums the parts."""
    by = _keep_labels(spec, host_label)
    arms = []
    for i, name in enumerate(spec.names):
        sel = selector(replace(spec, names=(name,)), host_label, host_re)
        expr = _scaled(f"sum by ({by}) (rate({sel}[{range_s}s]))", spec.scale)
        tagged = _tag(expr, role)
        arms.append(f'label_replace({tagged}, "{PART}", "{i}", "", "")' if len(spec.names) > 1 else tagged)
    return arms


def early_expr(metrics: MetricMap, rewrite: HostRewrite, nodes: Iterable[str], interval_s: float) -> str:
    """The early query's expression for these nodes (raises ValueError when no node name is valid)."""
    host_re = rewrite.selector_regex(nodes)
    arms: list[str] = []
    for role in EARLY_ROLES:
        spec = metrics.get(role)
        if spec is None:
            continue
        for hl in spec.host_labels:
            sel = selector(spec, hl, host_re)
            if spec.counter:
                arms += _counter_arms(spec, hl, host_re, window_s(interval_s), role)
                continue
            arms.append(_tag(_scaled(sel, spec.scale), role))
            arms.append(_tag(f"timestamp({sel})", role, TS))
    return " or ".join(arms)


def slide_expr(
    metrics: MetricMap, rewrite: HostRewrite, nodes: Iterable[str], interval_s: float, step_s: int
) -> str:
    host_re = rewrite.selector_regex(nodes)
    rate_s = max(step_s, window_s(interval_s))
    arms: list[str] = []
    for role in SLIDE_ROLES:
        spec = metrics.get(role)
        if spec is None:
            continue
        for hl in spec.host_labels:
            sel = selector(spec, hl, host_re)
            if spec.counter:
                arms += _counter_arms(spec, hl, host_re, rate_s, role)
            elif role in GPU_ROLES:
                arms.append(_tag(_scaled(f"avg_over_time({sel}[{step_s}s])", spec.scale), role))
            else:
                by = _keep_labels(spec, hl)
                arms.append(
                    _tag(_scaled(f"avg by ({by}) (avg_over_time({sel}[{step_s}s]))", spec.scale), role)
                )
    return " or ".join(arms)


def check_expr(spec: MetricSpec) -> str:
    """One query for one role: its series grouped by every label the map relies on."""
    labels = [*spec.host_labels, spec.gpu_label, spec.job_label, spec.model_label]
    by = ", ".join(dict.fromkeys(["__name__", *(label for label in labels if label)]))
    return f"max by ({by}) ({{{_name_matcher(spec)}}})"


@dataclass(frozen=True)
class Decoded:
    series: tuple[SiteSeries, ...]
    foreign: int = 0  # series whose host label names no node of the query


def _host_value(spec: MetricSpec, labels: dict[str, str]) -> str:
    return next((labels[hl] for hl in spec.host_labels if labels.get(hl)), "")


def _raw_samples(
    values: Sequence[tuple[float, float]], stamps: Sequence[tuple[float, float]]
) -> tuple[tuple[float, float], ...]:
    """Steps -> the samples they carried: (sample time, value), each sample once, in time order."""
    when = dict(stamps)
    out: dict[float, float] = {}
    for t, v in values:
        ts = when.get(t)
        if ts is not None and not math.isnan(v):
            out[ts] = v
    return tuple(sorted(out.items()))


def _sum_points(
    a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]
) -> tuple[tuple[float, float], ...]:
    """Two parts of one counter role, summed where both have a step (one alone counts as is)."""
    total = dict(a)
    for t, v in b:
        total[t] = total.get(t, 0.0) + v
    return tuple(sorted(total.items()))


def decode(
    answer: Sequence[Series], metrics: MetricMap, rewrite: HostRewrite, nodes: Sequence[str]
) -> Decoded:
    """The query's series as `SiteSeries` of `nodes` (raw samples for gauges with a `__ts` twin)."""
    arms: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Sequence[tuple[float, float]]]] = {}
    for s in answer:
        labels = dict(s.labels)
        role = labels.pop(ROLE, "")
        kind = "ts" if labels.pop(TS, None) is not None else "v"
        part = labels.pop(PART, None)
        labels.pop("__name__", None)
        if metrics.get(role) is None:
            continue
        slot = arms.setdefault((role, tuple(sorted(labels.items()))), {})
        if part is not None and kind in slot:
            slot[kind] = _sum_points(slot[kind], s.points)
        else:
            slot[kind] = s.points
    out: list[SiteSeries] = []
    foreign = 0
    for (role, items), parts in arms.items():
        spec = metrics.get(role)
        assert spec is not None
        labels = dict(items)
        node = rewrite.node_of(_host_value(spec, labels), nodes)
        if node is None:
            foreign += 1
            continue
        values = parts.get("v", ())
        points = (
            _raw_samples(values, parts["ts"])
            if "ts" in parts
            else tuple((t, v) for t, v in values if not math.isnan(v))
        )
        gpu = labels.get(spec.gpu_label, "") if role in GPU_ROLES else ""
        job = labels.get(spec.job_label, "") if spec.job_label else ""
        model = labels.get(spec.model_label, "") if spec.model_label else ""
        out.append(SiteSeries(role, node, gpu, points, job, model))
    out.sort(key=lambda x: (x.role, x.node, x.gpu, x.job))
    return Decoded(tuple(out), foreign)
