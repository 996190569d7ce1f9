"""ASGI middleware (SPEC 11.3): profile chosen requests.

A request is profiled when it asks (the ``aprof`` query parameter or the
``x-aprof`` header) or when it is drawn by ``sample_rate``. Its profile is
context-scoped: the request's task and what it spawns, nothing from the
requests running beside it. The trace is stored in ``directory`` and, when
the request asks with ``aprof=trace`` or ``aprof=html`` (or the header
``x-aprof: trace`` / ``html``), returned instead of the app's response body
as a Chrome trace or as the self-contained HTML report. With
``opentelemetry=True`` the request's profile is also sent as OpenTelemetry
spans under the span current in the request (the server span of
OpenTelemetry's own ASGI instrumentation, when it wraps this middleware).
"""

from __future__ import annotations

import random
import re
import time
import warnings
from collections.abc import Awaitable, Callable, MutableMapping
from os import PathLike
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from .._core._callbacks import AprofWarning
from .._core._profiler import profile
from .._core._record_function import record_function
from .._export._chrome import chrome_trace_chunks
from .._export._html import html_chunks

__all__ = ["ProfilerMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ProfilerMiddleware:
    """Profile chosen HTTP requests of an ASGI app.

    Args:
        app: The ASGI application.
        directory: Store each request's Chrome trace here (created if
            missing); None stores nothing.
        sample_rate: Also profile this fraction of all requests (0..1).
        query_param: The query parameter that asks for a profile.
        header: The request header that asks for a profile.
        opentelemetry: Also send each profiled request's events as
            OpenTelemetry spans, under the span current in the request
            (SPEC 11.5). An export that fails is reported with an
            ``AprofWarning``; the response is not affected.
        tracer_provider: The provider for those spans; None uses the
            global one.

    Raises:
        ValueError: ``sample_rate`` is outside 0..1.
        TypeError: ``opentelemetry`` is not a bool.
        ImportError: ``opentelemetry=True`` without the OpenTelemetry API.

    Example:
        >>> import aprof
        >>> async def app(scope, receive, send): ...
        >>> app = aprof.ProfilerMiddleware(app, directory="traces")

    ``GET /path?aprof=1`` stores a trace; ``GET /path?aprof=trace`` returns
    it as the response body (``application/json``), ``?aprof=html`` as the
    HTML report (``text/html``). The app's own status is in the
    ``x-aprof-app-status`` header.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        directory: str | PathLike[str] | None = None,
        sample_rate: float = 0.0,
        query_param: str = "aprof",
        header: str = "x-aprof",
        opentelemetry: bool = False,
        tracer_provider: object = None,
    ) -> None:
        if not isinstance(opentelemetry, bool):
            raise TypeError(f"ProfilerMiddleware: opentelemetry must be a bool, got {type(opentelemetry).__name__}")
        if opentelemetry:
            from .._export._otel import _import_api

            _import_api()  # fail here, not at the first profiled request
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, float)) or not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"ProfilerMiddleware: sample_rate must be a number in 0..1, got {sample_rate!r}")
        self.app = app
        self.directory = Path(directory) if directory is not None else None
        self.sample_rate = float(sample_rate)
        self.query_param = query_param
        self.header = header.lower().encode("latin-1")
        self.opentelemetry = opentelemetry
        self.tracer_provider = tracer_provider
        self._rng = random.Random()

    def _wanted(self, scope: Scope) -> str | None:
        """None, or what the request asked for ("store", "trace" or "html")."""
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        values = query.get(self.query_param)
        if values is not None:
            return next((v for v in ("trace", "html") if v in values), "store")
        for name, value in scope.get("headers", ()):
            if name.lower() == self.header:
                asked = value.strip().lower().decode("latin-1")
                return asked if asked in ("trace", "html") else "store"
        if self.sample_rate and self._rng.random() < self.sample_rate:
            return "store"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        wanted = self._wanted(scope)
        if wanted is None:
            await self.app(scope, receive, send)
            return
        method, path = scope.get("method", "GET"), scope.get("path", "/")
        held: list[Message] = []

        async def hold(message: Message) -> None:
            held.append(message)

        async with profile() as prof:
            with record_function(f"{method} {path}"):
                await self.app(scope, receive, send if wanted == "store" else hold)
        session = prof.session
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", path).strip("_")[:80] or "root"
            target = self.directory / f"{time.time_ns()}-{method}-{slug}.json"
            session.export_chrome_trace(target)
        if self.opentelemetry:
            try:
                session.export_opentelemetry(self.tracer_provider)
            except Exception as exc:  # the request must not fail for it
                warnings.warn(
                    f"ProfilerMiddleware: OpenTelemetry export of {method} {path} failed: {exc!r}",
                    AprofWarning,
                    stacklevel=1,
                )
        if wanted != "store":
            status = next((m.get("status", 200) for m in held if m["type"] == "http.response.start"), 500)
            chunks, ctype = (chrome_trace_chunks, b"application/json") if wanted == "trace" else (html_chunks, b"text/html; charset=utf-8")
            body = "".join(chunks(session)).encode("utf-8", "surrogatepass")
            headers = [
                (b"content-type", ctype),
                (b"content-length", str(len(body)).encode()),
                (b"x-aprof-app-status", str(status).encode()),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
