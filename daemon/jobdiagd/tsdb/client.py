"""Async Prometheus HTTP API client (aiohttp) with explicit URL encoding, timeouts and descriptive errors.

The response parsers (`parse_response`, `decode_result`, `parse_metrics_text`) are pure and
raise only `PromError` for a body that is not what the HTTP API documents (not JSON, a
result of the wrong shape, labels that are not strings, values that are not numbers).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import yarl


class PromError(Exception):
    """A Prometheus request failed; the message names the server, endpoint and query."""

    def __init__(self, server: str, endpoint: str, query: str | None, reason: str) -> None:
        self.server = server
        self.endpoint = endpoint
        self.query = query
        self.reason = reason
        where = f"{server}{endpoint}"
        what = f" query={query!r}" if query else ""
        super().__init__(f"Prometheus {where}{what}: {reason}")


@dataclass(frozen=True)
class Sample:
    """One instant-vector element."""

    labels: Mapping[str, str]
    t: float
    v: float


@dataclass(frozen=True)
class Series:
    """One range-vector / matrix element: (timestamp, value) points in time order."""

    labels: Mapping[str, str]
    points: Sequence[tuple[float, float]] = field(default_factory=tuple)

    def values(self) -> list[float]:
        return [v for _, v in self.points if not math.isnan(v)]


def encode_params(params: Mapping[str, str]) -> str:
    """Form-encode query parameters, escaping every reserved character.

    PromQL range selectors contain ``[`` and ``]``; they must travel as %5B / %5D, and
    ``+``, ``&``, ``=`` and ``"`` inside a query must never be read as separators.
    """
    return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in params.items())


def _fmt_time(t: float) -> str:
    return f"{t:.3f}"


def _parse_value(raw: str) -> float:
    # Prometheus sends "NaN", "+Inf", "-Inf" as strings; float() understands all three.
    return float(raw)


class _Malformed(Exception):
    """A response part that is not what the HTTP API documents (turned into a PromError)."""


def _labels(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise _Malformed("metric labels are not a map of strings")
    return raw


def _point(raw: Any) -> tuple[float, float]:
    """`[<unix time>, "<value>"]`: the time a JSON number, the value a string (as the API sends)."""
    if not isinstance(raw, list) or len(raw) != 2:
        raise _Malformed("a sample is not a [time, value] pair")
    t, v = raw
    if isinstance(t, bool) or not isinstance(t, int | float) or not isinstance(v, str):
        raise _Malformed("a sample is not a [number, string] pair")
    try:
        value = _parse_value(v)
    except ValueError:
        raise _Malformed(f"a sample value is not a number: {v[:40]!r}") from None
    if not math.isfinite(float(t)):
        raise _Malformed("a sample time is not finite")
    return float(t), value


def parse_response(body: str, server: str, endpoint: str, query: str | None) -> Any:
    """The `data` of an API response body; PromError for anything but `{"status": "success", ...}`."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise PromError(server, endpoint, query, f"invalid JSON: {body[:200]!r}") from exc
    if not isinstance(doc, dict) or doc.get("status") != "success":
        reason = doc.get("error", "unknown error") if isinstance(doc, dict) else "bad response"
        etype = doc.get("errorType", "") if isinstance(doc, dict) else ""
        raise PromError(server, endpoint, query, f"{str(etype)[:100]} {str(reason)[:300]}".strip())
    return doc.get("data")


def parse_metrics_text(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text exposition (`name value [timestamp]`)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or "{" in line:
            continue
        parts = line.split()
        if len(parts) >= 2:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                continue
    return out


class PromClient:
    """Thin client for one Prometheus server (base URL such as http://127.0.0.1:9190)."""

    def __init__(
        self,
        base_url: str,
        *,
        label: str | None = None,
        timeout_s: float = 30.0,
        session: aiohttp.ClientSession | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # Sent with every request (a site Prometheus's Authorization); never part of an error.
        self._headers = dict(headers or {})
        # `label` names the server in errors (e.g. "node001:9190 via ssh"), not the forwarded loopback port.
        self.label = label or self.base_url
        self.timeout_s = timeout_s
        self._session = session
        self._own_session = session is None
        self.query_count = 0

    async def __aenter__(self) -> PromClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
            self._own_session = True
        return self._session

    def url(self, endpoint: str, params: Mapping[str, str] | None = None) -> yarl.URL:
        text = f"{self.base_url}{endpoint}"
        if params:
            text += "?" + encode_params(params)
        return yarl.URL(text, encoded=True)

    async def _get_raw(self, endpoint: str, params: Mapping[str, str] | None, query: str | None) -> str:
        session = self._get_session()
        self.query_count += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                async with session.get(self.url(endpoint, params), headers=self._headers) as resp:
                    body = await resp.text()
                    if resp.status >= 400:
                        raise PromError(self.label, endpoint, query, f"HTTP {resp.status}: {body[:300]}")
                    return body
        except TimeoutError as exc:
            raise PromError(self.label, endpoint, query, f"timed out after {self.timeout_s:g}s") from exc
        except aiohttp.ClientError as exc:
            raise PromError(self.label, endpoint, query, f"{type(exc).__name__}: {exc}") from exc
        except UnicodeDecodeError as exc:  # binary garbage where Prometheus sends JSON or text
            raise PromError(self.label, endpoint, query, f"invalid body, not text: {exc.reason}") from exc

    async def _get_json(self, endpoint: str, params: Mapping[str, str] | None, query: str | None) -> Any:
        body = await self._get_raw(endpoint, params, query)
        return parse_response(body, self.label, endpoint, query)

    async def ready(self) -> bool:
        try:
            await self._get_raw("/-/ready", None, None)
        except PromError:
            return False
        return True

    async def query(self, promql: str, at: float | None) -> list[Sample] | list[Series]:
        """Instant query. `at` is required for finished TSDBs (None means the server's now)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = _fmt_time(at)
        data = await self._get_json("/api/v1/query", params, promql)
        return decode_result(data, self.label, promql)

    async def query_vector(self, promql: str, at: float | None) -> list[Sample]:
        res = await self.query(promql, at)
        if res and not isinstance(res[0], Sample):
            raise PromError(self.label, "/api/v1/query", promql, "expected an instant vector, got a matrix")
        return [r for r in res if isinstance(r, Sample)]

    async def query_matrix(self, promql: str, at: float | None) -> list[Series]:
        """Instant query of a range selector: raw samples, no resampling."""
        res = await self.query(promql, at)
        if res and not isinstance(res[0], Series):
            raise PromError(self.label, "/api/v1/query", promql, "expected a range vector")
        return [r for r in res if isinstance(r, Series)]

    async def query_range(self, promql: str, start: float, end: float, step_s: float) -> list[Series]:
        params = {
            "query": promql,
            "start": _fmt_time(start),
            "end": _fmt_time(end),
            "step": f"{max(step_s, 0.001):g}",
        }
        data = await self._get_json("/api/v1/query_range", params, promql)
        res = decode_result(data, self.label, promql, "/api/v1/query_range")
        return [r for r in res if isinstance(r, Series)]

    async def label_values(
        self, label: str, *, match: Sequence[str] = (), start: float | None = None, end: float | None = None
    ) -> list[str]:
        params: dict[str, str] = {}
        if start is not None:
            params["start"] = _fmt_time(start)
        if end is not None:
            params["end"] = _fmt_time(end)
        endpoint = f"/api/v1/label/{quote(label, safe='')}/values"
        # Repeated match[] parameters cannot live in a dict; append them by hand.
        data = await self._get_json_multi(endpoint, params, [("match[]", m) for m in match], label)
        if not isinstance(data, list | type(None)) or not all(isinstance(x, str) for x in data or []):
            raise PromError(self.label, endpoint, label, "label values are not a list of strings")
        return sorted(data or [])

    async def series(
        self, match: Sequence[str], *, start: float | None = None, end: float | None = None
    ) -> list[dict[str, str]]:
        params: dict[str, str] = {}
        if start is not None:
            params["start"] = _fmt_time(start)
        if end is not None:
            params["end"] = _fmt_time(end)
        data = await self._get_json_multi(
            "/api/v1/series", params, [("match[]", m) for m in match], ",".join(match)
        )
        try:
            if not isinstance(data, list | type(None)):
                raise _Malformed("series are not a list")
            return [_labels(x) for x in data or []]
        except _Malformed as exc:
            raise PromError(self.label, "/api/v1/series", ",".join(match), str(exc)) from None

    async def _get_json_multi(
        self, endpoint: str, params: dict[str, str], extra: list[tuple[str, str]], what: str
    ) -> Any:
        if not extra:
            return await self._get_json(endpoint, params, what)
        # Fold repeated keys into one pre-encoded string; encode_params keeps insertion order.
        suffix = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in extra)
        base = encode_params(params)
        query = f"{base}&{suffix}" if base else suffix
        return await self._get_json(endpoint + "?" + query, None, what)

    async def status_tsdb(self) -> dict[str, Any]:
        data = await self._get_json("/api/v1/status/tsdb", None, None)
        if not isinstance(data, dict | type(None)):
            raise PromError(self.label, "/api/v1/status/tsdb", None, "status is not an object")
        return dict(data or {})

    async def self_metrics(self) -> dict[str, float]:
        """Prometheus' own /metrics (unlabelled gauges only), e.g. prometheus_tsdb_lowest_timestamp_seconds."""
        return parse_metrics_text(await self._get_raw("/metrics", None, None))


def decode_result(
    data: Any, server: str, promql: str, endpoint: str = "/api/v1/query"
) -> list[Sample] | list[Series]:
    """A query's `data` as samples (vector, scalar) or series (matrix); PromError if malformed."""
    if not isinstance(data, dict):
        raise PromError(server, endpoint, promql, "missing data")
    rtype = data.get("resultType")
    result = data.get("result") or []
    try:
        if rtype == "scalar":
            t, v = _point(result)
            return [Sample({}, t, v)]
        if rtype not in ("vector", "matrix"):
            raise PromError(server, endpoint, promql, f"unsupported resultType {str(rtype)[:40]!r}")
        if not isinstance(result, list) or not all(isinstance(r, dict) for r in result):
            raise _Malformed("result is not a list of objects")
        if rtype == "vector":
            return [Sample(_labels(r.get("metric")), *_point(r.get("value"))) for r in result]
        out: list[Series] = []
        for r in result:
            values = r.get("values") or []
            if not isinstance(values, list):
                raise _Malformed("series values are not a list")
            out.append(Series(_labels(r.get("metric")), tuple(_point(p) for p in values)))
        return out
    except _Malformed as exc:
        raise PromError(server, endpoint, promql, f"malformed {rtype} result: {exc}") from None


def multi_arm(arms: Mapping[str, str], key_label: str = "__arm") -> str:
    """Join several PromQL expressions into one query, tagging each result with its arm name.

    One HTTP round trip instead of len(arms); each expression must produce series without
    __name__ (aggregations and functions do) so label_replace can tag it.
    """
    parts = [f'label_replace(({expr}), "{key_label}", "{name}", "", "")' for name, expr in arms.items()]
    return " or ".join(parts)


def split_arms(samples: Sequence[Sample], key_label: str = "__arm") -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for s in samples:
        arm = s.labels.get(key_label, "")
        labels = {k: v for k, v in s.labels.items() if k != key_label}
        out.setdefault(arm, []).append(Sample(labels, s.t, s.v))
    return out


def split_arms_series(series: Sequence[Series], key_label: str = "__arm") -> dict[str, list[Series]]:
    out: dict[str, list[Series]] = {}
    for s in series:
        arm = s.labels.get(key_label, "")
        labels = {k: v for k, v in s.labels.items() if k != key_label}
        out.setdefault(arm, []).append(Series(labels, s.points))
    return out


_RE_META = set("\\.^$|?*+()[]{}")


def regex_union(values: Sequence[str]) -> str:
    """`a|b|c` for a PromQL `=~` matcher, each value matched literally (RE2 metacharacters escaped)."""
    parts = ["".join("\\" + c if c in _RE_META else c for c in v) for v in values]
    # Inside a PromQL double-quoted string a backslash must itself be escaped.
    return "|".join(parts).replace("\\", "\\\\").replace('"', '\\"')
