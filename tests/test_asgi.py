"""The ASGI middleware against a real server and a real HTTP client (SPEC 11.3)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest
import uvicorn
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import aprof
from aprof._post._readers import read_profile

from .tracecheck import validate_trace


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    rid = parse_qs(scope["query_string"].decode()).get("id", ["?"])[0]

    async def sub() -> None:
        with aprof.record_function(f"sub {rid}"):
            await asyncio.sleep(0.01)

    with aprof.record_function(f"handler {rid}"):
        await asyncio.sleep(0.03)
        await asyncio.gather(sub(), sub())
    body = f"ok {rid}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    traces = tmp_path / "traces"
    with serving(aprof.ProfilerMiddleware(app, directory=traces)) as base:
        yield base, traces


@contextlib.contextmanager
def serving(asgi_app: Any) -> Iterator[str]:
    """Run ``asgi_app`` under uvicorn in a thread; yield its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(asgi_app, log_level="warning", lifespan="on")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(srv.serve(sockets=[sock])), daemon=True)
    thread.start()
    for _ in range(200):
        if srv.started:
            break
        threading.Event().wait(0.02)
    assert srv.started
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(10)
        sock.close()


async def fetch_all(urls: list[str]) -> list[tuple[int, bytes]]:
    async with aiohttp.ClientSession() as session:

        async def one(url: str) -> tuple[int, bytes]:
            async with session.get(url) as resp:
                return resp.status, await resp.read()

        return await asyncio.gather(*(one(u) for u in urls))


def test_concurrent_requests_get_separate_traces(server: tuple[str, Path]) -> None:
    # SPEC 11.3, 5.2: each stored trace holds only its own request.
    base, traces = server
    urls = [f"{base}/items?aprof=1&id={i}" for i in range(5)] + [f"{base}/items?id=plain"]
    results = asyncio.run(fetch_all(urls))
    assert [body for _, body in results] == [f"ok {i}".encode() for i in range(5)] + [b"ok plain"]
    files = sorted(traces.iterdir())
    assert len(files) == 5  # the unprofiled request stored nothing
    seen = set()
    for f in files:
        names = [e["name"] for e in validate_trace(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_scope"]
        (handler,) = [n for n in names if n.startswith("handler")]
        rid = handler.split()[1]
        assert sorted(names) == ["GET /items", f"handler {rid}", f"sub {rid}", f"sub {rid}"]
        seen.add(rid)
    assert seen == {str(i) for i in range(5)}


def test_trace_returned_in_the_response(server: tuple[str, Path]) -> None:
    # SPEC 11.3: ?aprof=trace returns the trace instead of the body.
    base, _ = server
    ((status, body),) = asyncio.run(fetch_all([f"{base}/x?aprof=trace&id=7"]))
    assert status == 200
    doc = json.loads(body)
    names = {e.get("name") for e in doc["traceEvents"]}
    assert {"handler 7", "sub 7", "GET /x"} <= names


def test_html_report_returned_in_the_response(server: tuple[str, Path], tmp_path: Path) -> None:
    # SPEC 11.3, 9.2: ?aprof=html returns the HTML report of that request only,
    # while another request runs beside it.
    base, _ = server
    (status, body), (_, other) = asyncio.run(fetch_all([f"{base}/x?aprof=html&id=8", f"{base}/x?id=9"]))
    assert status == 200
    assert other == b"ok 9"
    assert body.startswith(b"<!doctype html>")
    page = tmp_path / "report.html"
    page.write_bytes(body)
    events = read_profile(page).events()
    assert {e.name for e in events if e.scope is aprof.RecordScope.USER_SCOPE} == {"GET /x", "handler 8", "sub 8"}
    assert sum(1 for e in events if e.scope is aprof.RecordScope.TASK) == 2  # the two sub() tasks


def test_bad_sample_rate() -> None:
    # SPEC 12: the error names the option.
    with pytest.raises(ValueError, match="sample_rate"):
        aprof.ProfilerMiddleware(app, sample_rate=1.5)


def with_server_span(inner: Any, provider: TracerProvider) -> Any:
    """What OpenTelemetry's ASGI instrumentation does: each request runs
    under a server span of its own."""
    tracer = provider.get_tracer("server")

    async def instrumented(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        with tracer.start_as_current_span(f"server {scope['query_string'].decode()}"):
            await inner(scope, receive, send)

    return instrumented


def test_profiled_requests_become_spans_under_their_server_span() -> None:
    # SPEC 11.3, 11.5, 5.2: concurrent requests each get their profile as
    # spans under their own server span, holding only that request's work.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    profiled = aprof.ProfilerMiddleware(app, opentelemetry=True, tracer_provider=provider)
    with serving(with_server_span(profiled, provider)) as base:
        urls = [f"{base}/items?aprof=1&id={i}" for i in range(4)] + [f"{base}/items?id=plain"]
        results = asyncio.run(fetch_all(urls))
    assert [body for _, body in results] == [f"ok {i}".encode() for i in range(4)] + [b"ok plain"]
    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    servers = {s.name: s for s in spans if s.name.startswith("server ")}
    assert len(servers) == 5
    roots = [s for s in spans if s.name == "aprof profile"]
    assert len(roots) == 4  # the unprofiled request sent none
    for i in range(4):
        server = servers[f"server aprof=1&id={i}"]
        [root] = [r for r in roots if r.parent is not None and r.parent.span_id == server.context.span_id]
        mine = [s for s in spans if s.context.trace_id == server.context.trace_id and s.name.startswith(("handler", "sub"))]
        assert sorted(s.name for s in mine) == [f"handler {i}", f"sub {i}", f"sub {i}"]
        for s in mine:  # every one of them hangs under this request's profile
            up = s
            while up.parent is not None and up is not root:
                up = by_id[up.parent.span_id]
            assert up is root
    provider.shutdown()


def test_a_failing_span_export_does_not_fail_the_request() -> None:
    # SPEC 11.5, 12: the response is the app's; the failure is a warning.
    class BrokenProvider:
        def get_tracer(self, *args: Any) -> Any:
            raise RuntimeError("collector down")

    profiled = aprof.ProfilerMiddleware(app, opentelemetry=True, tracer_provider=BrokenProvider())
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/x", "query_string": b"aprof=1&id=3", "headers": []}
    with pytest.warns(aprof.AprofWarning, match="collector down"):
        asyncio.run(profiled(scope, receive, send))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[1]["body"] == b"ok 3"


def test_bad_opentelemetry_option(monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 12: the error names the option; without the OpenTelemetry API
    # the middleware refuses at construction, not at the first request.
    with pytest.raises(TypeError, match="opentelemetry"):
        aprof.ProfilerMiddleware(app, opentelemetry="yes")  # type: ignore[arg-type]
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"aprof\[otel\]"):
        aprof.ProfilerMiddleware(app, opentelemetry=True)
    aprof.ProfilerMiddleware(app)  # without it, nothing needs the API
