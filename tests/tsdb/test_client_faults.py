"""A Prometheus that answers badly: 500, invalid JSON, binary garbage, a body cut short, very slowly.

A local aiohttp server stands in for Prometheus's HTTP API; the real client must turn every
bad answer into one PromError naming the server and the query (what the hang verdict turns
into "unknown", never into a crash or a silent empty result).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from jobdiagd.tsdb.client import PromClient, PromError
from tests.helpers.faults import record_fault

GOOD = {"status": "success", "data": {"resultType": "vector", "result": []}}


async def handler(request: web.Request) -> web.StreamResponse:
    fault = request.query.get("query", "")
    if fault == "http500":
        return web.Response(status=500, text="<html><h1>500 Internal Server Error</h1></html>")
    if fault == "truncated-json":
        return web.Response(
            text='{"status": "success", "data": {"resultType": "vec', content_type="application/json"
        )
    if fault == "binary":
        return web.Response(body=b"\xff\xfe\x00\x81garbage\xc3\x28", content_type="application/json")
    if fault == "html-200":
        return web.Response(text="<html>login required</html>", content_type="text/html")
    if fault == "slow":
        await asyncio.sleep(3)
    if fault == "cut":
        # Headers promise more than is sent, then the connection drops mid-body.
        resp = web.StreamResponse(headers={"Content-Length": "1000", "Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"status": "succ')
        assert request.transport is not None
        request.transport.close()
        return resp
    return web.json_response(GOOD)


@pytest.fixture
async def prom() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/api/v1/query", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


FAULTS = {
    "http500": "HTTP 500",
    "truncated-json": "invalid JSON",
    "binary": "invalid",
    "html-200": "invalid JSON",
    "slow": "timed out after 1s",
    "cut": "node009:9190",
}


async def test_every_bad_answer_is_one_clear_prom_error(prom: str) -> None:
    errors: dict[str, str] = {}
    async with PromClient(prom, label="node009:9190 (test)", timeout_s=1.0) as c:
        for fault, expected in FAULTS.items():
            with pytest.raises(PromError) as err:
                await c.query_vector(fault, 100.0)
            text = str(err.value)
            assert "node009:9190 (test)" in text and f"'{fault}'" in text, text
            assert expected in text, text
            errors[fault] = text.split(": ", 1)[-1][:80]
        assert await c.query_vector("up", 100.0) == []  # and the next good answer is read
    record_fault(
        "Prometheus answers badly",
        injected="a local stand-in for Prometheus's API answering 500, truncated JSON, binary garbage, "
        "an HTML page with 200, 3 s late (timeout 1 s), and dropping the connection mid-body",
        daemon="each one PromError naming the server and the query; the next good answer read",
        delivered="; ".join(f"{k}: {v}" for k, v in errors.items()),
        figures={"bad answers": len(FAULTS), "errors raised": len(errors)},
    )
