"""ASGI middleware (SPEC 11.3): profile chosen requests, and nobody else's.

A trace holds a server's code paths, file names, arguments and timings, and
profiling costs time: the middleware is closed by default. A request is
profiled only when a policy given at construction says so:

* ``secret``: the request presents the shared secret (header
  ``x-aprof-token``, or a query parameter if ``token_query`` names one),
  compared in constant time;
* ``allow``: the caller's predicate ``allow(scope)`` returns True;
* ``sample_rate``: the server draws it (the client has no say).

and only while the rate limit (``max_per_minute``) has room. A request that
asks without credentials gets the app's normal response, unprofiled, with
nothing that hints at profiling. A profiled request's Chrome trace is stored
in ``directory`` (created 0700, files 0600); with ``return_trace=True``, a
request profiled through ``secret`` or ``allow`` that asks with
``x-aprof: trace`` / ``html`` (or ``?aprof=trace`` / ``html``) gets the trace
instead of the body. A request whose handler raises is stored or returned
like any other, with the exception on its range, and the exception goes on
to the server. Loop-block detection is on (50 ms) in every profiled request.
With ``opentelemetry=True`` the request's profile is also sent as
OpenTelemetry spans under the span current in the request.

The threat model is in docs/guide.md ("Profiling requests in a server").
"""

from __future__ import annotations

import inspect
import itertools
import math
import os
import random
import re
import stat
import tempfile
import threading
import time
import warnings
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from os import PathLike
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs

from .._core import _flight
from .._core._callbacks import AprofWarning
from .._core._memory import DEFAULT_INTERVAL as DEFAULT_MEMORY_INTERVAL
from .._core._memory import check_memory_interval
from .._core._memory import running as memory_runs
from .._core._memory import unavailable_reason as memory_unavailable
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

_WHAT: Final = "ProfilerMiddleware"
#: The shortest secret accepted: shorter ones can be guessed.
MIN_SECRET_LENGTH: Final = 16
# RFC 9110 token characters: what a header name may hold.
_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_SLUG: Final = re.compile(r"[^A-Za-z0-9_.-]+")
_ASKED: Final = "asked"  # profiled through secret or allow
_SAMPLED: Final = "sampled"  # profiled because the server drew it
_WINDOW_S: Final = 60.0


class _RateLimit:
    """At most ``cap`` grants in any 60-second window (a sliding log).

    The log holds at most ``cap`` times, so its memory is bounded; a lock
    makes it safe for an app served from several threads.
    """

    def __init__(self, cap: int | None, clock: Callable[[], float]) -> None:
        self.cap = cap
        self._clock = clock
        self._times: deque[float] = deque()
        self._lock = threading.Lock()

    def take(self) -> bool:
        if self.cap is None:
            return True
        with self._lock:
            now = self._clock()
            times = self._times
            while times and now - times[0] >= _WINDOW_S:
                times.popleft()
            if len(times) >= self.cap:
                return False
            times.append(now)
            return True


def _header_name(name: object, option: str) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"{_WHAT}: {option} must be a header name (str), got {type(name).__name__}")
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"{_WHAT}: {option} {name!r} is not a valid HTTP header name")
    return name.lower().encode("ascii")


def _query_name(name: object, option: str) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise TypeError(f"{_WHAT}: {option} must be a query parameter name (a non-empty str) or None, got {name!r}")
    return name


def _seconds_or_none(value: object, option: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{_WHAT}: {option} must be a number of seconds or None, got {type(value).__name__}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{_WHAT}: {option} must be a number of seconds > 0, or None to switch it off, got {value!r}")
    return float(value)


def _check_directory(path: Path) -> None:
    """``path`` is a directory of this user's that no one else can enter.

    Raises:
        NotADirectoryError: it is not a directory.
        PermissionError: another user owns it, or its mode lets group or
            others in; the message says what to do.
    """
    st = os.stat(path)  # follows a symlink: the directory the files land in
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{_WHAT}: directory {str(path)!r} is not a directory")
    if st.st_uid != os.getuid():
        raise PermissionError(
            f"{_WHAT}: directory {str(path)!r} belongs to another user (uid {st.st_uid}): traces hold the "
            "server's code paths and timings; give a directory of your own"
        )
    if st.st_mode & 0o077:
        raise PermissionError(
            f"{_WHAT}: directory {str(path)!r} is open to other users (mode {stat.S_IMODE(st.st_mode):#o}): traces "
            f"hold the server's code paths and timings; run 'chmod 700 {path}' or give another directory"
        )


def _prepare_directory(path: Path) -> None:
    """Create ``path`` with mode 0700 if it is missing, then check it."""
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    else:
        os.chmod(path, 0o700)  # whatever the umask did
    _check_directory(path)


class ProfilerMiddleware:
    """Profile chosen HTTP requests of an ASGI app, closed by default.

    Nothing is profiled unless a policy says so: a shared ``secret`` the
    request presents, an ``allow`` predicate, or server-side sampling
    (``sample_rate``). At most ``max_per_minute`` requests are profiled per
    minute through ``secret``/``allow``, and as many through sampling. A
    request that asks without credentials gets the app's normal response,
    unprofiled, with no sign that profiling exists.

    Args:
        app: The ASGI application.
        secret: Profile requests that present this secret (at least 16
            characters) in the ``token_header`` header, or in the
            ``token_query`` query parameter when one is named. Compared in
            constant time.
        allow: Profile requests for which ``allow(scope)`` returns True
            (called for every HTTP request; must return a bool). A predicate
            that raises or returns something else is reported once with an
            ``AprofWarning`` and switched off.
        sample_rate: Also profile this fraction of all requests (0..1),
            drawn by the server. Sampled traces are stored, never returned.
        max_per_minute: The most requests profiled in any 60 seconds, for
            ``secret``/``allow`` and for sampling separately (so sampling
            never uses up the requests you ask for). Requests past it run
            unprofiled; an authenticated one gets the response header
            ``x-aprof-status: rate-limited``. None: no limit.
        directory: Store each profiled request's Chrome trace here. Created
            with mode 0700 if missing; an existing one must be yours and
            closed to group and others. Files are written with mode 0600.
        return_trace: Let a request profiled through ``secret`` or ``allow``
            ask for its trace in the response: ``x-aprof: trace`` (Chrome
            trace) or ``html`` (the HTML report), or ``?aprof=trace`` /
            ``html``. Off by default.
        loop_block_threshold: Record what held the event loop longer than
            this many seconds during a profiled request (SPEC 7.5); None
            switches it off.
        token_header: The request header that carries the secret.
        token_query: A query parameter that may carry the secret; None (the
            default) accepts it only in the header, since URLs end up in
            access logs, proxies and browser history.
        header: The request header that asks for the trace in the response.
        query_param: The query parameter that asks for it; None: header only.
        opentelemetry: Also send each profiled request's events as
            OpenTelemetry spans, under the span current in the request
            (SPEC 11.5). An export that fails is reported with an
            ``AprofWarning``; the response is not affected.
        tracer_provider: The provider for those spans; None uses the
            global one.
        for_flight_recorder: The middleware is there for a running
            :class:`aprof.flight_recorder` alone (each request a range in its
            ring, and its ``slow_request`` trigger): no policy is needed, and
            none is warned about. With or without it, while a flight
            recorder runs, every request not profiled on its own is a range
            in the recorder's ring.
        profile_memory: Also track the request's allocations
            (``profile(profile_memory=True)``): its range and tasks carry
            bytes allocated, net and peak, and the trace a memory counter.
            One memory profile runs at a time: a request profiled while
            another request's memory is tracked is profiled without memory.
        memory_interval: With ``profile_memory``, bytes between samples
            (``profile(memory_interval=...)``; 0: every allocation).

    Raises:
        TypeError: an argument has the wrong type (the message names it).
        ValueError: an argument is out of range: a short ``secret``,
            ``sample_rate`` outside 0..1, ``max_per_minute`` below 1, a bad
            header name, a ``loop_block_threshold`` not above 0.
        PermissionError: ``directory`` belongs to another user or is open to
            group or others.
        ImportError: ``opentelemetry=True`` without the OpenTelemetry API.
        RuntimeError: ``profile_memory=True`` without aprof's C extension.

    Example:
        >>> import aprof
        >>> async def app(scope, receive, send): ...
        >>> secret = "9c1f0e4b7a52d8e3f6a1b0c9d8e7f6a5"   # in a server: os.environ["APROF_SECRET"]
        >>> app = aprof.ProfilerMiddleware(app, secret=secret, return_trace=True)

    ``curl -H "x-aprof-token: $APROF_SECRET" https://host/path`` stores a
    trace; adding ``-H "x-aprof: html"`` returns the HTML report instead of
    the body (``text/html``; the app's own status is in the
    ``x-aprof-app-status`` header).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        secret: str | bytes | None = None,
        allow: Callable[[Scope], bool] | None = None,
        sample_rate: float = 0.0,
        max_per_minute: int | None = 60,
        directory: str | PathLike[str] | None = None,
        return_trace: bool = False,
        loop_block_threshold: float | None = 0.05,
        token_header: str = "x-aprof-token",
        token_query: str | None = None,
        header: str = "x-aprof",
        query_param: str | None = "aprof",
        opentelemetry: bool = False,
        tracer_provider: object = None,
        for_flight_recorder: bool = False,
        profile_memory: bool = False,
        memory_interval: int = DEFAULT_MEMORY_INTERVAL,
    ) -> None:
        if not callable(app):
            raise TypeError(f"{_WHAT}: app must be an ASGI application (a callable), got {type(app).__name__}")
        if secret is not None:
            if not isinstance(secret, (str, bytes)):
                raise TypeError(f"{_WHAT}: secret must be a str or bytes, got {type(secret).__name__}")
            if len(secret) < MIN_SECRET_LENGTH:
                raise ValueError(f"{_WHAT}: secret must be at least {MIN_SECRET_LENGTH} characters long, got {len(secret)}")
        if allow is not None:
            if not callable(allow):
                raise TypeError(f"{_WHAT}: allow must be a callable allow(scope) -> bool, got {type(allow).__name__}")
            if inspect.iscoroutinefunction(allow):
                raise TypeError(f"{_WHAT}: allow must be a plain function returning a bool, not an async function")
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, float)):
            raise TypeError(f"{_WHAT}: sample_rate must be a number in 0..1, got {type(sample_rate).__name__}")
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"{_WHAT}: sample_rate must be a number in 0..1, got {sample_rate!r}")
        if max_per_minute is not None:
            if isinstance(max_per_minute, bool) or not isinstance(max_per_minute, int):
                raise TypeError(f"{_WHAT}: max_per_minute must be an int or None, got {type(max_per_minute).__name__}")
            if max_per_minute < 1:
                raise ValueError(f"{_WHAT}: max_per_minute must be at least 1 (None: no limit), got {max_per_minute}")
        if directory is not None and not isinstance(directory, (str, PathLike)):
            raise TypeError(f"{_WHAT}: directory must be a path (str or os.PathLike) or None, got {type(directory).__name__}")
        for option, value in (("return_trace", return_trace), ("opentelemetry", opentelemetry)):
            if not isinstance(value, bool):
                raise TypeError(f"{_WHAT}: {option} must be a bool, got {type(value).__name__}")
        self.loop_block_threshold = _seconds_or_none(loop_block_threshold, "loop_block_threshold")
        if not isinstance(profile_memory, bool):
            raise TypeError(f"{_WHAT}: profile_memory must be True or False, got {profile_memory!r}")
        self.profile_memory = profile_memory
        self.memory_interval = check_memory_interval(memory_interval)
        if profile_memory:
            why = memory_unavailable()
            if why is not None:
                raise RuntimeError(f"{_WHAT}: {why}")
        self.token_header = _header_name(token_header, "token_header")
        self.header = _header_name(header, "header")
        self.token_query = _query_name(token_query, "token_query")
        self.query_param = _query_name(query_param, "query_param")
        if opentelemetry:
            from .._export._otel import _import_api

            _import_api()  # fail here, not at the first profiled request
        # Absolute now: a server that changes its working directory later
        # still writes where it was told.
        self.directory = Path(directory).absolute() if directory is not None else None
        if self.directory is not None:
            _prepare_directory(self.directory)

        self.app = app
        self._secret_digest: bytes | None = None
        if secret is not None:
            # Imported here: hashlib loads OpenSSL, a cost `import aprof` need not pay.
            import hashlib
            import hmac

            self._sha256 = hashlib.sha256
            self._compare_digest = hmac.compare_digest
            self._secret_digest = self._sha256(secret.encode("utf-8") if isinstance(secret, str) else secret).digest()
        self._allow = allow
        self.sample_rate = float(sample_rate)
        self.max_per_minute = max_per_minute
        self.return_trace = return_trace
        self.opentelemetry = opentelemetry
        self.tracer_provider = tracer_provider
        self._rng = random.Random()
        self._limits = {
            _ASKED: _RateLimit(max_per_minute, time.monotonic),
            _SAMPLED: _RateLimit(max_per_minute, time.monotonic),
        }
        self._names = itertools.count()
        if for_flight_recorder and secret is None and allow is None and not self.sample_rate:
            pass  # it feeds a flight recorder alone: nothing to warn about
        elif secret is None and allow is None and not self.sample_rate:
            warnings.warn(
                f"{_WHAT}: no policy given (secret=, allow= or sample_rate=): no request will be profiled",
                AprofWarning,
                stacklevel=2,
            )
        elif self.directory is None and not return_trace and not opentelemetry:
            warnings.warn(
                f"{_WHAT}: profiled requests go nowhere: give directory=, return_trace=True or opentelemetry=True",
                AprofWarning,
                stacklevel=2,
            )

    # -- who is profiled ----------------------------------------------------

    def _presents_secret(self, scope: Scope) -> bool:
        digest = self._secret_digest
        if digest is None:
            return False
        ok = False
        for name, value in scope.get("headers", ()):
            if name.lower() == self.token_header:
                # Hashing first makes the comparison's time independent of
                # the length of what was sent, not only of its content.
                ok |= self._compare_digest(self._sha256(bytes(value)).digest(), digest)
        if self.token_query is not None and not ok:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            for value in query.get(self.token_query, ()):
                ok |= self._compare_digest(self._sha256(value.encode("utf-8", "surrogateescape")).digest(), digest)
        return ok

    def _allowed(self, scope: Scope) -> bool:
        allow = self._allow
        if allow is None:
            return False
        try:
            verdict = allow(scope)
        except Exception as exc:
            self._allow = None
            warnings.warn(
                f"{_WHAT}: allow({_describe(scope)}) raised {exc!r}; the allow policy is switched off",
                AprofWarning,
                stacklevel=1,
            )
            return False
        if type(verdict) is not bool:
            self._allow = None
            if inspect.iscoroutine(verdict):
                verdict.close()  # never awaited, on purpose: no "never awaited" warning
            warnings.warn(
                f"{_WHAT}: allow({_describe(scope)}) returned {type(verdict).__name__}, not a bool; "
                "the allow policy is switched off",
                AprofWarning,
                stacklevel=1,
            )
            return False
        return verdict

    def _policy(self, scope: Scope) -> str | None:
        """How this request is to be profiled (_ASKED, _SAMPLED), or None."""
        if self._presents_secret(scope) or self._allowed(scope):
            return _ASKED
        if self.sample_rate and self._rng.random() < self.sample_rate:
            return _SAMPLED
        return None

    def _wanted(self, scope: Scope) -> str:
        """What an authorised request asked for: "store", "trace" or "html"."""
        if not self.return_trace:
            return "store"
        if self.query_param is not None:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            values = query.get(self.query_param, ())
            for v in ("trace", "html"):
                if v in values:
                    return v
        for name, value in scope.get("headers", ()):
            if name.lower() == self.header:
                asked = bytes(value).strip().lower()
                if asked in (b"trace", b"html"):
                    return asked.decode("ascii")
        return "store"

    # -- the request ----------------------------------------------------------

    async def _flight_request(self, recorder: _flight.flight_recorder, scope: Scope, receive: Receive, send: Send) -> None:
        """A request not profiled on its own while a flight recorder runs: a
        range in the recorder's ring, and its time, so that a request slower
        than ``slow_request`` dumps the ring (issue 19)."""
        name = f"{scope.get('method', 'GET')} {scope.get('path', '/')}"
        t0 = time.perf_counter_ns()
        try:
            with record_function(name):
                await self.app(scope, receive, send)
        finally:
            recorder.request_done(name, time.perf_counter_ns() - t0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        via = self._policy(scope)
        if via is None:
            recorder = _flight.active()
            if recorder is None:
                await self.app(scope, receive, send)
            else:
                await self._flight_request(recorder, scope, receive, send)
            return
        if not self._limits[via].take():
            # An authenticated caller learns why; anyone else sees nothing.
            await self.app(scope, receive, _with_header(send, b"x-aprof-status", b"rate-limited") if via == _ASKED else send)
            return
        wanted = self._wanted(scope) if via == _ASKED else "store"
        method, path = str(scope.get("method", "GET")), str(scope.get("path", "/"))
        held: list[Message] = []

        async def hold(message: Message) -> None:
            held.append(message)

        # Another request's memory profile holds the allocator hooks: this
        # one is profiled without memory rather than not at all.
        memory = self.profile_memory and not memory_runs()
        prof = profile(loop_block_threshold=self.loop_block_threshold, profile_memory=memory, memory_interval=self.memory_interval)
        try:
            prof.start()
        except RuntimeError as exc:  # a profile already runs in this context (an outer middleware)
            warnings.warn(f"{_WHAT}: {method} {path} not profiled: {exc}", AprofWarning, stacklevel=1)
            await self.app(scope, receive, send)
            return
        try:
            with record_function(f"{method} {path}"):
                await self.app(scope, receive, send if wanted == "store" else hold)
        except BaseException as exc:
            prof.stop()
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            # The failed request is kept like any other (its range carries the
            # exception); the exception goes on to the server.
            self._deliver_quietly(prof, method, path)
            if wanted != "store" and isinstance(exc, Exception):
                await self._respond_with_trace(send, prof, wanted, held, type(exc).__name__)
            raise
        prof.stop()
        self._deliver_quietly(prof, method, path)
        if wanted != "store":
            await self._respond_with_trace(send, prof, wanted, held, None)

    def _deliver_quietly(self, prof: profile, method: str, path: str) -> None:
        """Store the trace and send the spans; a failure is a warning, never the request's."""
        session = prof.session
        if self.directory is not None:
            try:
                self._store(session, method, path)
            except Exception as exc:
                warnings.warn(f"{_WHAT}: could not store the trace of {method} {path}: {exc}", AprofWarning, stacklevel=1)
        if self.opentelemetry:
            try:
                session.export_opentelemetry(self.tracer_provider)
            except Exception as exc:  # the request must not fail for it
                warnings.warn(
                    f"{_WHAT}: OpenTelemetry export of {method} {path} failed: {exc!r}",
                    AprofWarning,
                    stacklevel=1,
                )

    def _store(self, session: Any, method: str, path: str) -> Path:
        """Write the Chrome trace as a new 0600 file in the directory."""
        directory = self.directory
        assert directory is not None
        _prepare_directory(directory)  # still there, still closed (it may have been removed or opened up)
        method_slug = _SLUG.sub("_", method)[:16] or "METHOD"
        slug = _SLUG.sub("_", path).strip("_")[:80] or "root"
        target = directory / f"{time.time_ns()}-{next(self._names)}-{method_slug}-{slug}.json"
        # mkstemp creates the file 0600 with O_EXCL; the rename keeps the
        # mode, and readers never see half a file.
        fd, tmp = tempfile.mkstemp(prefix=".aprof-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chrome_trace_chunks(session):
                    f.write(chunk.encode("utf-8", "surrogatepass"))
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return target

    async def _respond_with_trace(
        self, send: Send, prof: profile, wanted: str, held: list[Message], exception: str | None
    ) -> None:
        """Send the trace as the response, in place of the app's (held) one."""
        status = next((m.get("status", 200) for m in held if m.get("type") == "http.response.start"), 500)
        chunks, ctype = (chrome_trace_chunks, b"application/json") if wanted == "trace" else (html_chunks, b"text/html; charset=utf-8")
        body = "".join(chunks(prof.session)).encode("utf-8", "surrogatepass")
        headers = [
            (b"content-type", ctype),
            (b"content-length", str(len(body)).encode()),
            (b"x-aprof-app-status", str(status).encode()),
        ]
        if exception is not None:
            headers.append((b"x-aprof-app-exception", exception.encode("ascii", "replace")))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _describe(scope: Scope) -> str:
    return f"{scope.get('method', '?')} {scope.get('path', '?')}"


def _with_header(send: Send, name: bytes, value: bytes) -> Send:
    """``send`` with one more header on the response start."""

    async def sending(message: Message) -> None:
        if message.get("type") == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (name, value)]}
        await send(message)

    return sending
