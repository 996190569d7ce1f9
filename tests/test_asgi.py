"""The ASGI middleware (SPEC 11.3, 12; issue 22 items 1 and 3, issue 16 items 2 and 8).

The policy tests run the middleware under a real uvicorn server on loopback
and talk to it with a real HTTP client: what a stranger, a wrong secret, the
right secret and a flood of requests each get. What a request's profile holds
(a failed handler, a blocked loop) is checked on every backend by calling the
middleware directly, as an ASGI server would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import sys
import threading
import time
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
from aprof._integrations import _asgi
from aprof._post._readers import read_profile

from .conftest import Backend
from .tracecheck import validate_trace

SECRET = "correct horse battery staple 42"
TOKEN = {"x-aprof-token": SECRET}


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
    if scope["path"] == "/boom":
        with aprof.record_function(f"handler {rid}"):
            await asyncio.sleep(0)
            1 / 0  # noqa: B018

    async def sub() -> None:
        with aprof.record_function(f"sub {rid}"):
            await asyncio.sleep(0.01)

    with aprof.record_function(f"handler {rid}"):
        await asyncio.sleep(0.01)
        await asyncio.gather(sub(), sub())
    body = f"ok {rid}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def serving(asgi_app: Any) -> Iterator[str]:
    """Run ``asgi_app`` under uvicorn on loopback in a thread; yield its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(asgi_app, log_level="critical", lifespan="on")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(srv.serve(sockets=[sock])), daemon=True)
    thread.start()
    for _ in range(250):
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
        assert not thread.is_alive()


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


def fetch(base: str, *requests: tuple[str, dict[str, str]], concurrent: bool = False) -> list[Reply]:
    """GET each (path, headers), one after another unless ``concurrent``."""

    async def main() -> list[Reply]:
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def one(path: str, headers: dict[str, str]) -> Reply:
                async with session.get(base + path, headers=headers) as resp:
                    return Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, await resp.read())

            if concurrent:
                return list(await asyncio.gather(*(one(p, h) for p, h in requests)))
            return [await one(p, h) for p, h in requests]

    return asyncio.run(main())


def stored(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if not p.name.startswith("."))


def user_ranges(path: Path) -> list[str]:
    return sorted(e["name"] for e in validate_trace(path)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_scope")


# -- Closed by default (issue 22 item 1) ---------------------------------------


def test_nobody_is_profiled_without_credentials(tmp_path: Path) -> None:
    # SPEC 11.3: asking without credentials, or with the wrong secret, gets
    # the app's normal response, unprofiled, and nothing hints at profiling.
    traces = tmp_path / "traces"
    mw = aprof.ProfilerMiddleware(app, secret=SECRET, directory=traces, return_trace=True, token_query="aprof_token")
    asks = [
        ("/x?id=1", {}),
        ("/x?id=1&aprof=trace", {}),
        ("/x?id=1&aprof=html", {"x-aprof": "html"}),
        ("/x?id=1", {"x-aprof": "trace"}),
        ("/x?id=1", {"x-aprof-token": "wrong"}),
        ("/x?id=1", {"x-aprof-token": SECRET[:-1]}),
        ("/x?id=1", {"x-aprof-token": SECRET + "x", "x-aprof": "trace"}),
        ("/x?id=1", {"x-aprof-token": SECRET.upper()}),
        ("/x?id=1&aprof_token=wrong&aprof=trace", {}),
        ("/x?id=1&aprof=" + SECRET, {}),  # the secret in the mode parameter is not a token
    ]
    with serving(mw) as base:
        replies = fetch(base, *asks)
    plain = replies[0]
    assert (plain.status, plain.body) == (200, b"ok 1")
    for reply in replies:
        assert (reply.status, reply.body) == (200, b"ok 1")
        assert sorted(reply.headers) == sorted(plain.headers)  # not one extra header
        assert not any("aprof" in k or "aprof" in v for k, v in reply.headers.items())
    assert stored(traces) == []


def test_the_right_secret_profiles_the_request(tmp_path: Path) -> None:
    # SPEC 11.3, 5.2: the secret in the header (or, when allowed, the query)
    # stores a trace holding only that request; concurrent requests each get
    # their own; the others are untouched.
    traces = tmp_path / "traces"
    mw = aprof.ProfilerMiddleware(app, secret=SECRET, directory=traces, token_query="aprof_token")
    asks = [(f"/items?id={i}", TOKEN) for i in range(4)]
    asks += [("/items?id=4&aprof_token=" + SECRET.replace(" ", "+"), {}), ("/items?id=plain", {})]
    with serving(mw) as base:
        replies = fetch(base, *asks, concurrent=True)
    assert [r.body for r in replies] == [f"ok {i}".encode() for i in range(5)] + [b"ok plain"]
    files = stored(traces)
    assert len(files) == 5
    seen = set()
    for f in files:
        names = user_ranges(f)
        rid = next(n for n in names if n.startswith("handler")).split()[1]
        assert names == ["GET /items", f"handler {rid}", f"sub {rid}", f"sub {rid}"]
        seen.add(rid)
    assert seen == {"0", "1", "2", "3", "4"}


def test_a_query_token_is_refused_unless_allowed(tmp_path: Path) -> None:
    # SPEC 11.3: URLs land in access logs; the secret is a header unless
    # token_query names a parameter.
    traces = tmp_path / "traces"
    mw = aprof.ProfilerMiddleware(app, secret=SECRET, directory=traces)
    with serving(mw) as base:
        (reply,) = fetch(base, ("/x?id=1&aprof-token=" + SECRET.replace(" ", "+"), {}))
    assert reply.body == b"ok 1"
    assert stored(traces) == []


def test_stored_traces_are_private(tmp_path: Path) -> None:
    # SPEC 11.3: the directory is created 0700 and each trace is 0600,
    # whatever the umask.
    traces = tmp_path / "deep" / "traces"
    old = os.umask(0)
    try:
        mw = aprof.ProfilerMiddleware(app, secret=SECRET, directory=traces)
    finally:
        os.umask(old)
    assert stat.S_IMODE(traces.stat().st_mode) == 0o700
    with serving(mw) as base:
        fetch(base, ("/x?id=1", TOKEN))
    (f,) = stored(traces)
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert [p.name for p in traces.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_returning_the_trace_needs_return_trace(tmp_path: Path) -> None:
    # SPEC 11.3: with the right secret but return_trace off, asking for the
    # trace gets the app's body (the trace is stored).
    traces = tmp_path / "traces"
    mw = aprof.ProfilerMiddleware(app, secret=SECRET, directory=traces)
    with serving(mw) as base:
        (reply,) = fetch(base, ("/x?id=3&aprof=trace", {**TOKEN, "x-aprof": "trace"}))
    assert reply.body == b"ok 3"
    assert len(stored(traces)) == 1


def test_trace_and_html_returned_to_an_authenticated_request(tmp_path: Path) -> None:
    # SPEC 11.3, 9.2: x-aprof: trace / html (or ?aprof=) returns that request's
    # trace while another request runs beside it.
    mw = aprof.ProfilerMiddleware(app, secret=SECRET, return_trace=True)
    with serving(mw) as base:
        trace, html, other, by_query = fetch(
            base,
            ("/x?id=7", {**TOKEN, "x-aprof": "trace"}),
            ("/x?id=8", {**TOKEN, "x-aprof": "html"}),
            ("/x?id=9", {}),
            ("/x?id=6&aprof=trace", TOKEN),
            concurrent=True,
        )
    assert (trace.status, trace.headers["content-type"], trace.headers["x-aprof-app-status"]) == (200, "application/json", "200")
    assert {"handler 7", "sub 7", "GET /x"} <= {e.get("name") for e in json.loads(trace.body)["traceEvents"]}
    assert {"handler 6", "GET /x"} <= {e.get("name") for e in json.loads(by_query.body)["traceEvents"]}
    assert other.body == b"ok 9"
    assert html.body.startswith(b"<!doctype html>")
    page = tmp_path / "report.html"
    page.write_bytes(html.body)
    events = read_profile(page).events()
    assert {e.name for e in events if e.scope is aprof.RecordScope.USER_SCOPE} == {"GET /x", "handler 8", "sub 8"}
    assert sum(1 for e in events if e.scope is aprof.RecordScope.TASK) == 2  # the two sub() tasks


def test_allow_predicate_decides(tmp_path: Path) -> None:
    # SPEC 11.3: allow(scope) -> bool, called for every HTTP request.
    traces = tmp_path / "traces"
    seen: list[str] = []

    def allow(scope: dict[str, Any]) -> bool:
        seen.append(scope["path"])
        return scope["path"] == "/admin"

    mw = aprof.ProfilerMiddleware(app, allow=allow, directory=traces, return_trace=True)
    with serving(mw) as base:
        admin, public = fetch(base, ("/admin?id=1", {"x-aprof": "trace"}), ("/public?id=2", {"x-aprof": "trace"}))
    assert seen == ["/admin", "/public"]
    assert "traceEvents" in json.loads(admin.body)
    assert public.body == b"ok 2"
    assert len(stored(traces)) == 1


def test_sampled_requests_are_stored_never_returned(tmp_path: Path) -> None:
    # SPEC 11.3: sampling is the server's choice; a sampled client cannot
    # ask for its trace, and it gets its normal response.
    traces = tmp_path / "traces"
    mw = aprof.ProfilerMiddleware(app, sample_rate=1.0, directory=traces, return_trace=True)
    with serving(mw) as base:
        replies = fetch(base, ("/x?id=1&aprof=trace", {"x-aprof": "html"}), ("/x?id=2", {}))
    assert [r.body for r in replies] == [b"ok 1", b"ok 2"]
    assert all(not any("aprof" in k for k in r.headers) for r in replies)
    assert len(stored(traces)) == 2


def test_rate_limit_caps_profiled_requests(tmp_path: Path) -> None:
    # SPEC 11.3: at most max_per_minute profiled requests per policy; past
    # it, requests run unprofiled. Sampling has its own budget, so it never
    # uses up the requests asked for with the secret.
    traces = tmp_path / "traces"
    mw = aprof.ProfilerMiddleware(app, secret=SECRET, sample_rate=1.0, max_per_minute=2, directory=traces, return_trace=True)
    with serving(mw) as base:
        sampled = fetch(base, *[(f"/s?id={i}", {}) for i in range(4)])
        assert len(stored(traces)) == 2
        asked = fetch(base, *[(f"/a?id={i}", {**TOKEN, "x-aprof": "trace"}) for i in range(4)])
    assert [r.body for r in sampled] == [f"ok {i}".encode() for i in range(4)]
    assert all("x-aprof-status" not in r.headers for r in sampled)  # strangers learn nothing
    assert [("traceEvents" in r.body.decode()) for r in asked] == [True, True, False, False]
    assert [r.body for r in asked[2:]] == [b"ok 2", b"ok 3"]
    assert [r.headers.get("x-aprof-status") for r in asked] == [None, None, "rate-limited", "rate-limited"]
    assert len(stored(traces)) == 2 + 2


def test_the_rate_limit_window_slides() -> None:
    # SPEC 11.3: a minute after a grant, its slot is free again.
    now = [1000.0]
    limit = _asgi._RateLimit(2, lambda: now[0])
    assert [limit.take(), limit.take(), limit.take()] == [True, True, False]
    now[0] += 59.9
    assert limit.take() is False
    now[0] += 0.1
    assert [limit.take(), limit.take(), limit.take()] == [True, True, False]
    assert _asgi._RateLimit(None, lambda: 0.0).take() is True


# -- The failed request is kept (issue 16 item 8) ------------------------------


def test_a_failing_request_is_stored_and_the_error_reaches_the_server(tmp_path: Path) -> None:
    # SPEC 11.3, 4.2: the handler's exception is on the request's range in the
    # stored trace; the client gets the server's 500, as without aprof.
    traces = tmp_path / "traces"
    mw = aprof.ProfilerMiddleware(app, secret=SECRET, directory=traces)
    with serving(mw) as base:
        (reply,) = fetch(base, ("/boom?id=5", TOKEN))
    assert reply.status == 500
    (f,) = stored(traces)
    events = [e for e in validate_trace(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_scope"]
    assert {e["name"]: e["args"].get("exception") for e in events} == {
        "GET /boom": "ZeroDivisionError",
        "handler 5": "ZeroDivisionError",
    }


def test_a_failing_request_returns_its_trace(tmp_path: Path) -> None:
    # SPEC 11.3, 4.2: asked for, the failed request's trace is the response,
    # with the app's status and exception in headers.
    mw = aprof.ProfilerMiddleware(app, secret=SECRET, return_trace=True)
    with serving(mw) as base:
        (reply,) = fetch(base, ("/boom?id=6", {**TOKEN, "x-aprof": "trace"}))
    assert reply.status == 200
    assert reply.headers["x-aprof-app-status"] == "500"
    assert reply.headers["x-aprof-app-exception"] == "ZeroDivisionError"
    ranges = {e["name"]: e for e in json.loads(reply.body)["traceEvents"] if e.get("cat") == "user_scope"}
    assert ranges["GET /boom"]["args"]["exception"] == "ZeroDivisionError"


def _call(mw: Any, backend: Backend, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[list[Any], BaseException | None]:
    """Run one request through ``mw`` on ``backend``, as an ASGI server would."""
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": headers}
    try:
        backend.run(mw, scope, receive, send)
    except Exception as exc:
        return sent, exc
    return sent, None


def _backend_app(backend: Backend) -> Any:
    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        with aprof.record_function("handler"):
            await backend.sleep(0)
            if scope["path"] == "/block":
                time.sleep(0.15)  # holds the loop (or the trio run)
                await backend.sleep(0.06)  # so the watchdog sees the loop come back
            if scope["path"] == "/boom":
                raise KeyError("gone")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    return inner


def test_a_failing_request_is_kept_on_every_backend(backend: Backend, tmp_path: Path) -> None:
    # SPEC 11.1, 11.3, 4.2: stored with the exception on its range; the
    # same exception object goes on to the server.
    traces = tmp_path / "traces"
    mw = aprof.ProfilerMiddleware(_backend_app(backend), secret=SECRET, directory=traces, loop_block_threshold=None)
    sent, error = _call(mw, backend, "/boom", [(b"x-aprof-token", SECRET.encode())])
    assert isinstance(error, KeyError)
    assert sent == []
    (f,) = stored(traces)
    ranges = {e["name"]: e["args"].get("exception") for e in validate_trace(f)["traceEvents"] if e.get("cat") == "user_scope"}
    assert ranges == {"GET /boom": "KeyError", "handler": "KeyError"}


def test_loop_blocks_are_recorded_by_default(backend: Backend, tmp_path: Path) -> None:
    # SPEC 7.5, 11.3, issue 16 item 2: a profiled request records what held
    # the loop longer than 50 ms, without being asked.
    traces = tmp_path / "traces"
    mw = aprof.ProfilerMiddleware(_backend_app(backend), secret=SECRET, directory=traces)
    assert mw.loop_block_threshold == 0.05
    sent, error = _call(mw, backend, "/block", [(b"x-aprof-token", SECRET.encode())])
    assert error is None
    assert sent[-1]["body"] == b"done"
    (f,) = stored(traces)
    blocks = [e for e in validate_trace(f)["traceEvents"] if e.get("cat") == "loop_block"]
    assert len(blocks) == 1
    assert blocks[0]["dur"] > 50_000  # µs: longer than the threshold (the sleep is 150 ms)


def test_loop_block_detection_can_be_switched_off(backend: Backend, tmp_path: Path) -> None:
    # SPEC 7.5, 11.3: loop_block_threshold=None records no loop blocks.
    traces = tmp_path / "traces"
    mw = aprof.ProfilerMiddleware(_backend_app(backend), secret=SECRET, directory=traces, loop_block_threshold=None)
    _call(mw, backend, "/block", [(b"x-aprof-token", SECRET.encode())])
    (f,) = stored(traces)
    assert not [e for e in validate_trace(f)["traceEvents"] if e.get("cat") == "loop_block"]


# -- Policy failures and bad arguments (issue 22 item 3) -----------------------


def test_a_failing_allow_predicate_is_reported_once_and_switched_off(backend: Backend, tmp_path: Path) -> None:
    # SPEC 12: a failing user callback never breaks the request.
    calls = []

    def allow(scope: dict[str, Any]) -> bool:
        calls.append(scope["path"])
        raise RuntimeError("auth service down")

    mw = aprof.ProfilerMiddleware(_backend_app(backend), allow=allow, directory=tmp_path / "t")
    with pytest.warns(aprof.AprofWarning, match="auth service down"):
        sent, error = _call(mw, backend, "/x", [])
    assert error is None
    assert sent[-1]["body"] == b"done"
    sent, error = _call(mw, backend, "/y", [])  # no second warning (filterwarnings = error)
    assert error is None
    assert sent[-1]["body"] == b"done"
    assert calls == ["/x"]
    assert stored(tmp_path / "t") == []


def test_an_allow_predicate_returning_a_non_bool_is_switched_off(tmp_path: Path) -> None:
    # SPEC 12: a truthy object (a coroutine from an async predicate hidden
    # in a lambda, say) must not profile every request.
    async def check(scope: Any) -> bool:
        return False

    mw = aprof.ProfilerMiddleware(_backend_app(Backend("asyncio")), allow=lambda scope: check(scope), directory=tmp_path / "t")
    with pytest.warns(aprof.AprofWarning, match="returned coroutine, not a bool"):
        sent, error = _call(mw, Backend("asyncio"), "/x", [])
    assert error is None
    assert sent[-1]["body"] == b"done"
    assert stored(tmp_path / "t") == []


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"app": None}, TypeError, "app must be an ASGI application"),
        ({"app": 5}, TypeError, "app must be an ASGI application"),
        ({"directory": 5}, TypeError, "directory must be a path"),
        ({"header": None}, TypeError, "header must be a header name"),
        ({"header": "x aprof"}, ValueError, "header 'x aprof' is not a valid HTTP header name"),
        ({"token_header": b"x-aprof-token"}, TypeError, "token_header must be a header name"),
        ({"token_query": 5}, TypeError, "token_query must be a query parameter name"),
        ({"query_param": ""}, TypeError, "query_param must be a query parameter name"),
        ({"secret": 12345678901234567890}, TypeError, "secret must be a str or bytes"),
        ({"secret": "short"}, ValueError, "secret must be at least 16 characters"),
        ({"allow": True}, TypeError, "allow must be a callable"),
        ({"sample_rate": 1.5}, ValueError, "sample_rate must be a number in 0..1"),
        ({"sample_rate": "0.5"}, TypeError, "sample_rate must be a number in 0..1"),
        ({"max_per_minute": 0}, ValueError, "max_per_minute must be at least 1"),
        ({"max_per_minute": 2.5}, TypeError, "max_per_minute must be an int or None"),
        ({"return_trace": "yes"}, TypeError, "return_trace must be a bool"),
        ({"opentelemetry": "yes"}, TypeError, "opentelemetry must be a bool"),
        ({"loop_block_threshold": 0}, ValueError, "loop_block_threshold must be a number of seconds > 0"),
        ({"loop_block_threshold": "50ms"}, TypeError, "loop_block_threshold must be a number of seconds"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict[str, Any], error: type[Exception], words: str, tmp_path: Path) -> None:
    # SPEC 12, issue 22 item 3: ProfilerMiddleware(None), directory=5 and
    # header=None were AttributeErrors at the first request, or later.
    args = {"app": app, "secret": SECRET, "directory": tmp_path / "t", **kwargs}
    with pytest.raises(error, match=words):
        aprof.ProfilerMiddleware(args.pop("app"), **args)


def test_an_async_allow_predicate_is_refused(tmp_path: Path) -> None:
    # SPEC 12: its coroutine would be truthy: refused at construction.
    async def allow(scope: Any) -> bool:
        return True

    with pytest.raises(TypeError, match="allow must be a plain function"):
        aprof.ProfilerMiddleware(app, allow=allow, directory=tmp_path)


def test_no_policy_or_no_output_is_a_warning(tmp_path: Path) -> None:
    # SPEC 11.3: the old default (anyone may ask) is gone: say so.
    with pytest.warns(aprof.AprofWarning, match="no policy given"):
        aprof.ProfilerMiddleware(app, directory=tmp_path / "t")
    with pytest.warns(aprof.AprofWarning, match="go nowhere"):
        aprof.ProfilerMiddleware(app, secret=SECRET)


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701, 0o777])
def test_a_directory_open_to_others_is_refused(mode: int, tmp_path: Path) -> None:
    # SPEC 11.3: aprof does not loosen or tighten a directory it did not
    # create; one that others can enter is refused, naming it and the fix.
    traces = tmp_path / "shared"
    traces.mkdir()
    traces.chmod(mode)
    with pytest.raises(PermissionError, match=rf"{traces}.*open to other users.*chmod 700"):
        aprof.ProfilerMiddleware(app, secret=SECRET, directory=traces)
    assert stat.S_IMODE(traces.stat().st_mode) == mode
    traces.chmod(0o700)
    aprof.ProfilerMiddleware(app, secret=SECRET, directory=traces)


def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    # SPEC 11.3: its owner could read or swap the traces.
    if os.getuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
    else:
        theirs = Path("/")  # root's
    with pytest.raises(PermissionError, match="belongs to another user"):
        aprof.ProfilerMiddleware(app, secret=SECRET, directory=theirs)


def test_a_directory_opened_up_later_stops_storing(tmp_path: Path, backend: Backend) -> None:
    # SPEC 11.3, 12: checked again before each write; the request is unaffected.
    traces = tmp_path / "traces"
    mw = aprof.ProfilerMiddleware(_backend_app(backend), secret=SECRET, directory=traces, loop_block_threshold=None)
    traces.chmod(0o755)
    with pytest.warns(aprof.AprofWarning, match="open to other users"):
        sent, error = _call(mw, backend, "/x", [(b"x-aprof-token", SECRET.encode())])
    assert error is None
    assert sent[-1]["body"] == b"done"
    assert stored(traces) == []


# -- OpenTelemetry ---------------------------------------------------------------


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
    profiled = aprof.ProfilerMiddleware(app, secret=SECRET, opentelemetry=True, tracer_provider=provider)
    with serving(with_server_span(profiled, provider)) as base:
        replies = fetch(base, *[(f"/items?id={i}", TOKEN) for i in range(4)], ("/items?id=plain", {}), concurrent=True)
    assert [r.body for r in replies] == [f"ok {i}".encode() for i in range(4)] + [b"ok plain"]
    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    servers = {s.name: s for s in spans if s.name.startswith("server ")}
    assert len(servers) == 5
    roots = [s for s in spans if s.name == "aprof profile"]
    assert len(roots) == 4  # the unprofiled request sent none
    for i in range(4):
        server = servers[f"server id={i}"]
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

    profiled = aprof.ProfilerMiddleware(app, secret=SECRET, opentelemetry=True, tracer_provider=BrokenProvider())
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/x", "query_string": b"id=3", "headers": [(b"x-aprof-token", SECRET.encode())]}
    with pytest.warns(aprof.AprofWarning, match="collector down"):
        asyncio.run(profiled(scope, receive, send))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[1]["body"] == b"ok 3"


def test_bad_opentelemetry_option(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # SPEC 12: the error names the option; without the OpenTelemetry API
    # the middleware refuses at construction, not at the first request.
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"aprof\[otel\]"):
        aprof.ProfilerMiddleware(app, secret=SECRET, opentelemetry=True)
    aprof.ProfilerMiddleware(app, secret=SECRET, directory=tmp_path)  # without it, nothing needs the API


def test_profile_memory_reports_the_requests_memory(backend: Backend, tmp_path: Path) -> None:
    # SPEC 15.5, issue 21 item 3: a request profiled with profile_memory
    # carries its allocations: the request's range and the counter track.
    keep: list[bytes] = []

    async def leaky(scope: dict[str, Any], receive: Any, send: Any) -> None:
        with aprof.record_function("leaky handler"):
            keep.append(bytes(256 * 1024))
            await backend.checkpoint()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    traces = tmp_path / "traces"
    mw = aprof.ProfilerMiddleware(leaky, secret=SECRET, directory=traces, profile_memory=True, memory_interval=0)
    sent, error = _call(mw, backend, "/leak", [(b"x-aprof-token", SECRET.encode())])
    assert error is None
    (f,) = stored(traces)
    doc = validate_trace(f)
    mem = doc["otherData"]["aprof_memory"]
    by_name = {e["name"]: e for e in mem["events"]}
    assert by_name["leaky handler"]["net"] >= 256 * 1024
    assert by_name["GET /leak"]["net"] >= 256 * 1024  # the request's range includes its handler's
    assert max(e["args"]["live bytes"] for e in doc["traceEvents"] if e.get("ph") == "C") >= 256 * 1024
    with pytest.raises(ValueError, match="memory_interval"):
        aprof.ProfilerMiddleware(leaky, secret=SECRET, profile_memory=True, memory_interval=-1)
    with pytest.raises(TypeError, match="profile_memory"):
        aprof.ProfilerMiddleware(leaky, secret=SECRET, profile_memory=1)  # type: ignore[arg-type]
