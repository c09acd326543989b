"""Fuzzing the Prometheus response parsers of tsdb.client (body -> data -> samples/series; /metrics text).

Properties: any body is the response's data or one `PromError`; any data is a list of
samples or series with string labels and float values, or one `PromError`; a response
written the way Prometheus writes it reads back as the samples it was written from; the
exposition-text parser never raises and keeps only what it could read.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from jobdiagd.tsdb.client import PromError, Sample, Series, decode_result, parse_metrics_text, parse_response
from tests.helpers.fuzz import fuzz_settings

SERVER, QUERY = "node001:9190 via ssh", 'up{job="x"}'

json_value = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12),
        st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "vector", "matrix", "scalar", "success"]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["status", "data", "resultType", "result", "metric", "value", "values",
                                         "error", "errorType", "__name__", "host"]), inner, max_size=4),
    ),
    max_leaves=20,
)


@st.composite
def data_shaped(draw: st.DrawFn) -> Any:
    """Mostly well-formed query data with one part replaced by anything."""
    rtype = draw(st.sampled_from(["vector", "matrix", "scalar", "string", None]))
    point = draw(st.one_of(st.just([1.5, "2"]), json_value))
    metric = draw(st.one_of(st.just({"host": "node001"}), json_value))
    if rtype == "matrix":
        result: Any = [{"metric": metric, "values": draw(st.one_of(st.lists(st.just(point), max_size=3), json_value))}]
    elif rtype == "scalar":
        result = point
    else:
        result = [{"metric": metric, "value": point}]
    return {"resultType": rtype, "result": draw(st.one_of(st.just(result), json_value))}


def _check_decoded(out: list[Sample] | list[Series]) -> None:
    for item in out:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in item.labels.items())
        points = [(item.t, item.v)] if isinstance(item, Sample) else list(item.points)
        for t, v in points:
            assert isinstance(t, float) and math.isfinite(t) and isinstance(v, float)


@fuzz_settings(examples=400)
@given(st.one_of(json_value, data_shaped()))
# Found by this test: each raised KeyError, TypeError, ValueError or IndexError out of the
# parser instead of a PromError naming the server and the query.
@example({"resultType": "vector", "result": [{"metric": {}, "value": [1]}]})
@example({"resultType": "vector", "result": [{"metric": {}}]})
@example({"resultType": "matrix", "result": [{"values": [[1, "x"]]}]})
@example({"resultType": "scalar", "result": [1, 2, 3]})
@example({"resultType": "vector", "result": [{"metric": {"host": 1}, "value": [1, "1"]}]})
@example({"resultType": "vector", "result": "abc"})
def test_any_data_decodes_or_gives_one_prom_error(data: Any) -> None:
    try:
        out = decode_result(data, SERVER, QUERY)
    except PromError as exc:
        assert exc.server == SERVER and exc.query == QUERY and len(str(exc)) < 1000
        return
    _check_decoded(out)


@fuzz_settings(examples=300)
@given(st.one_of(st.text(max_size=300), json_value.map(json.dumps), st.builds(lambda d: json.dumps(
    {"status": "success", "data": d}), data_shaped())))
@example("[" * 100_000)
@example('{"status": "error", "errorType": "bad_data", "error": "' + "x" * 10_000 + '"}')
def test_any_body_gives_data_or_one_prom_error(body: str) -> None:
    try:
        data = parse_response(body, SERVER, "/api/v1/query", QUERY)
        out = decode_result(data, SERVER, QUERY)
    except PromError as exc:
        assert len(str(exc)) < 1000
        return
    _check_decoded(out)


def _prom_float(v: float) -> str:
    """A sample value as Prometheus writes it (strconv.FormatFloat 'f', -1, with NaN and +Inf)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


_labels = st.dictionaries(st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True), st.text(max_size=20), max_size=4)
_t = st.floats(min_value=0, max_value=4e9)
_v = st.floats(allow_nan=True, allow_infinity=True)


@fuzz_settings(examples=200)
@given(st.lists(st.tuples(_labels, st.lists(st.tuples(_t, _v), min_size=1, max_size=5)), max_size=5), st.booleans())
def test_a_response_as_prometheus_writes_it_reads_back(series: list[tuple[dict[str, str], list[tuple[float, float]]]], vector: bool) -> None:
    if vector:
        result = [{"metric": m, "value": [pts[0][0], _prom_float(pts[0][1])]} for m, pts in series]
    else:
        result = [{"metric": m, "values": [[t, _prom_float(v)] for t, v in pts]} for m, pts in series]
    body = json.dumps({"status": "success", "data": {"resultType": "vector" if vector else "matrix", "result": result}})
    out = decode_result(parse_response(body, SERVER, "/api/v1/query", QUERY), SERVER, QUERY)
    assert len(out) == len(series)
    for got, (labels, pts) in zip(out, series, strict=True):
        assert dict(got.labels) == labels
        got_pts = [(got.t, got.v)] if isinstance(got, Sample) else list(got.points)
        want = pts[:1] if vector else pts
        assert len(got_pts) == len(want)
        for (t1, v1), (t2, v2) in zip(got_pts, want, strict=True):
            assert t1 == t2 and (v1 == v2 or (math.isnan(v1) and math.isnan(v2)))


@fuzz_settings(examples=200)
@given(st.text(max_size=500), st.dictionaries(st.from_regex(r"[a-z_:][a-z0-9_:]{0,20}", fullmatch=True), _v, max_size=5))
def test_metrics_text_never_raises_and_reads_back_unlabelled_samples(noise: str, samples: dict[str, float]) -> None:
    out = parse_metrics_text(noise)
    assert all(isinstance(k, str) and isinstance(v, float) for k, v in out.items())
    text = "# HELP x y\n" + "".join(f"{k} {_prom_float(v)}\n" for k, v in samples.items()) + 'lab{a="b"} 1\n'
    got = parse_metrics_text(text)
    assert set(got) == set(samples)
    assert all(got[k] == v or (math.isnan(got[k]) and math.isnan(v)) for k, v in samples.items())
