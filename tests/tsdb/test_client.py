"""Prometheus client: URL encoding, multi-arm batching, error messages and timeouts (real aiohttp servers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from jobdiagd.tsdb.access import LocalPrometheus
from jobdiagd.tsdb.client import PromClient, PromError, Sample, encode_params, multi_arm, split_arms
from jobdiagd.tsdb.settings import TsdbSettings
from tests.helpers.tsdb import Fixtures


def test_range_selector_brackets_are_encoded() -> None:
    q = encode_params({"query": 'rate(hw_tcp_retransmits_total{host="a"}[5m]) + 1', "time": "1.000"})
    assert "%5B5m%5D" in q and "[" not in q and "]" not in q
    assert "%2B" in q and "%3D" in q and "%22" in q  # '+', '=' and '"' never read as separators
    assert q.endswith("&time=1.000")


def test_multi_arm_roundtrip() -> None:
    expr = multi_arm({"a": "sum(x)", "b": "max by (host) (y)"})
    assert (
        expr
        == 'label_replace((sum(x)), "__arm", "a", "", "") or label_replace((max by (host) (y)), "__arm", "b", "", "")'
    )
    res = split_arms([Sample({"__arm": "a"}, 1, 2.0), Sample({"__arm": "b", "host": "h"}, 1, 3.0)])
    assert res["a"][0].labels == {} and res["b"][0].labels == {"host": "h"}


@pytest.fixture
async def echo_server() -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []

    async def query(request: web.Request) -> web.Response:
        seen.append(request.raw_path)
        if request.query.get("query") == "slow":
            await asyncio.sleep(1.5)
        if request.query.get("query") == "bad(":
            return web.json_response(
                {"status": "error", "errorType": "bad_data", "error": "parse error"}, status=400
            )
        return web.json_response(
            {
                "status": "success",
                "data": {
                    "resultType": "vector",
                    "result": [{"metric": {"host": "n1"}, "value": [1.5, "NaN"]}],
                },
            }
        )

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


async def test_request_on_the_wire_and_errors(echo_server: tuple[str, list[str]]) -> None:
    url, seen = echo_server
    async with PromClient(url, label="node001:9190 (test)", timeout_s=0.5) as c:
        res = await c.query_vector("increase(x[1h])", 100.0)
        assert res[0].labels == {"host": "n1"} and res[0].v != res[0].v  # NaN parsed
        assert seen[-1] == "/api/v1/query?query=increase%28x%5B1h%5D%29&time=100.000"
        with pytest.raises(PromError) as err:
            await c.query_vector("bad(", 1.0)
        assert (
            "node001:9190 (test)" in str(err.value)
            and "'bad('" in str(err.value)
            and "parse error" in str(err.value)
        )
        with pytest.raises(PromError, match="timed out after 0.5s"):
            await c.query_vector("slow", 1.0)
        assert c.query_count == 3


async def test_connection_refused_names_server() -> None:
    async with PromClient("http://127.0.0.1:1", label="node009:9191 via ssh", timeout_s=2) as c:
        with pytest.raises(PromError, match="node009:9191 via ssh/api/v1/query query='up'"):
            await c.query_vector("up", None)
        assert not await c.ready()


async def test_real_prometheus_endpoints(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("healthy", tmp_path)
    async with (
        LocalPrometheus(b.files.prometheus, TsdbSettings(work_dir=str(tmp_path))) as prom,
        PromClient(prom.base_url) as c,
    ):
        t = b.sim.train_end
        assert "hw_gpu_power_watts" in await c.label_values("__name__")
        assert await c.label_values("host") == ["node001", "node002", "node003", "node004"]
        series = await c.series(['hw_procs_running{host=~"node00[12]"}'])
        assert sorted(s["host"] for s in series) == ["node001", "node002"]
        rng = await c.query_range("sum(rate(hw_tcp_retransmits_total[5m]))", t - 600, t, 60)
        assert len(rng) == 1 and len(rng[0].points) == 11
        assert all(abs(v - 0.8) < 0.05 for _, v in rng[0].points)  # 4 hosts x 0.2/s
        raw = await c.query_matrix("tb_step[120s]", t)
        assert raw and raw[0].points[-1][1] == b.sim.steps[-1].step
        # An instant query without time= is "now": past the end of a finished TSDB -> empty.
        assert await c.query_vector("hw_procs_running", None) == []
        head = (await c.status_tsdb())["headStats"]
        assert head["numSeries"] == 0  # status/tsdb covers the (empty) head only
