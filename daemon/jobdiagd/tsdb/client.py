"""Async Prometheus HTTP API client (aiohttp) with explicit URL encoding, timeouts and descriptive errors."""

from __future__ import annotations

import asyncio
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


class PromClient:
    """Thin client for one Prometheus server (base URL such as http://127.0.0.1:9190)."""

    def __init__(
        self,
        base_url: str,
        *,
        label: str | None = None,
        timeout_s: float = 30.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
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
                async with session.get(self.url(endpoint, params)) as resp:
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
        import json

        body = await self._get_raw(endpoint, params, query)
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise PromError(self.label, endpoint, query, f"invalid JSON: {body[:200]!r}") from exc
        if not isinstance(doc, dict) or doc.get("status") != "success":
            reason = doc.get("error", "unknown error") if isinstance(doc, dict) else "bad response"
            etype = doc.get("errorType", "") if isinstance(doc, dict) else ""
            raise PromError(self.label, endpoint, query, f"{etype} {reason}".strip())
        return doc.get("data")

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
        return _decode_result(data, self.label, promql)

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
        res = _decode_result(data, self.label, promql)
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
        return sorted(str(x) for x in (data or []))

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
        return [dict(x) for x in (data or [])]

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
        return dict(data or {})

    async def status_runtime(self) -> dict[str, Any]:
        data = await self._get_json("/api/v1/status/runtimeinfo", None, None)
        return dict(data or {})

    async def self_metrics(self) -> dict[str, float]:
        """Prometheus' own /metrics (unlabelled gauges only), e.g. prometheus_tsdb_lowest_timestamp_seconds."""
        text = await self._get_raw("/metrics", None, None)
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


def _decode_result(data: Any, server: str, promql: str) -> list[Sample] | list[Series]:
    if not isinstance(data, dict):
        raise PromError(server, "/api/v1/query", promql, "missing data")
    rtype = data.get("resultType")
    result = data.get("result") or []
    if rtype == "vector":
        return [
            Sample(r.get("metric", {}), float(r["value"][0]), _parse_value(r["value"][1])) for r in result
        ]
    if rtype == "matrix":
        return [
            Series(r.get("metric", {}), tuple((float(t), _parse_value(v)) for t, v in r.get("values", [])))
            for r in result
        ]
    if rtype == "scalar":
        t, v = result
        return [Sample({}, float(t), _parse_value(v))]
    raise PromError(server, "/api/v1/query", promql, f"unsupported resultType {rtype!r}")


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
