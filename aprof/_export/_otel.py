"""OpenTelemetry export (SPEC 11.5): a session's events as spans.

For users whose traces must join a distributed tracing backend. The spans
go through the OpenTelemetry API (``opentelemetry-api``, an optional extra:
``pip install 'aprof[otel]'``) to whatever tracer provider the program set
up, so they reach the backend through its own processors and exporters.

The mapping:

* one root span, ``aprof profile``, from the profile's start to its stop,
  a child of ``parent`` (by default the span current where the export is
  called, so a request's profile lands under the request's span);
* one span per range, with the range's name and times. A range's parent
  span is its parent event's: the range it is nested in on its track, or,
  for a task's or executor job's range, the range it was spawned or
  submitted from. Ranges without a parent are children of the root;
* instants (``aprof.mark``) become span events on their parent's span;
* a range that ended in an exception gets an ``ERROR`` status and an
  ``exception`` span event with ``exception.type``;
* Python tracer frames are left out unless ``python_frames=True`` (a traced
  run holds millions of them; a tracing backend wants the ranges). The
  ranges nested in a left-out frame go to the nearest span kept above it.

Times are the events' ``perf_counter_ns`` values moved onto the Unix epoch
with the offset the session recorded at stop (``unix_offset_ns`` in its
metadata; saved sessions and Chrome traces keep it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _version
from .._core._callbacks import RecordScope

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from .._post._events import FunctionEvent
    from .._post._session import Session

__all__ = ["export_opentelemetry"]

ROOT_NAME = "aprof profile"
_WHAT = "export_opentelemetry"
# extra keys that are times on aprof's clock (meaningless to a backend) or
# bulky; the useful part of each is written as its own attribute.
_SKIPPED_EXTRA = frozenset({"steps", "spawn_ns", "submit_ns"})


def _import_api() -> tuple[Any, Any, Any]:
    try:
        from opentelemetry import context as otel_context
        from opentelemetry import trace
        from opentelemetry.trace.status import Status, StatusCode
    except ImportError as exc:
        raise ImportError(
            f"{_WHAT} needs the OpenTelemetry API: pip install 'aprof[otel]' (or opentelemetry-api)"
        ) from exc
    return otel_context, trace, (Status, StatusCode)


def _parent_context(parent: object, otel_context: Any, trace: Any) -> Context:
    if parent is None:
        ctx: Context = otel_context.get_current()
        return ctx
    if isinstance(parent, trace.Span):
        ctx = trace.set_span_in_context(parent)
        return ctx
    if isinstance(parent, otel_context.Context):
        given: Context = parent
        return given
    raise TypeError(f"{_WHAT}: parent must be an OpenTelemetry Span or Context, or None, got {type(parent).__name__}")


def _tracer(tracer_provider: object, trace: Any) -> Tracer:
    if tracer_provider is None:
        tracer_provider = trace.get_tracer_provider()
    get_tracer = getattr(tracer_provider, "get_tracer", None)
    if not callable(get_tracer):
        raise TypeError(
            f"{_WHAT}: tracer_provider must be an OpenTelemetry TracerProvider, got {type(tracer_provider).__name__}"
        )
    tracer: Tracer = get_tracer("aprof", _version.__version__)
    return tracer


def _attributes(ev: FunctionEvent, pids: dict[str, Any]) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "aprof.scope": ev.scope.value,
        "aprof.track": ev.track,
        "aprof.thread_id": ev.thread_id,
        "thread.id": ev.os_thread_id,
        # The process (SPEC 15.4): a merged session's spans come from several.
        "aprof.node_id": ev.node_id,
    }
    pid = pids.get(str(ev.node_id))
    if type(pid) is int:
        attrs["process.pid"] = pid
    if ev.args is not None:
        attrs["aprof.args"] = ev.args
    if ev.inputs is not None:
        attrs["aprof.inputs"] = list(ev.inputs)
    if ev.sequence_nr >= 0:
        attrs["aprof.sequence_nr"] = ev.sequence_nr
    if ev.is_async:
        attrs["aprof.is_async"] = True
        attrs["aprof.end_thread_id"] = ev.end_thread_id
    if ev.unfinished:
        attrs["aprof.unfinished"] = True
    if ev.stack is not None:
        attrs["code.stacktrace"] = "\n".join(f"{f}:{line} {fn}" for f, line, fn in ev.stack)
    running = ev.running_ns
    if running is not None:
        attrs["aprof.running_ns"] = running
        attrs["aprof.waiting_ns"] = ev.waiting_ns
    extra = ev.extra
    if extra:
        for key, value in extra.items():
            if key not in _SKIPPED_EXTRA and isinstance(value, (str, bool, int, float)):
                attrs[f"aprof.{key}"] = value
        submit = extra.get("submit_ns")
        if isinstance(submit, int):
            attrs["aprof.queued_ns"] = max(0, ev.start_ns - submit)
    return attrs


def export_opentelemetry(
    session: Session,
    tracer_provider: object = None,
    *,
    parent: object = None,
    python_frames: bool = False,
) -> int:
    """Emit ``session``'s events as OpenTelemetry spans; return how many.

    Raises:
        ImportError: ``opentelemetry-api`` is not installed.
        TypeError: ``tracer_provider``, ``parent`` or ``python_frames`` has
            the wrong type; the message names it.
        ValueError: the session has no wall-clock offset (it was read from
            a file written before aprof kept one).
    """
    if not isinstance(python_frames, bool):
        raise TypeError(f"{_WHAT}: python_frames must be a bool, got {type(python_frames).__name__}")
    otel_context, trace, (Status, StatusCode) = _import_api()
    tracer = _tracer(tracer_provider, trace)
    parent_ctx = _parent_context(parent, otel_context, trace)
    offset = session.metadata.get("unix_offset_ns")
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise ValueError(
            f"{_WHAT}: the session has no 'unix_offset_ns' in its metadata, so its times cannot be placed "
            "on the wall clock (it was read from a file written without one)"
        )
    meta = session.metadata
    root = tracer.start_span(
        ROOT_NAME,
        context=parent_ctx,
        start_time=int(meta["start_ns"]) + offset,
        attributes={
            "aprof.version": str(meta.get("aprof_version")),
            "aprof.dropped": int(meta.get("dropped", 0)),
            **{f"aprof.dropped.{k}": int(v) for k, v in session.dropped_by_kind.items() if v},
            "aprof.python_frames": python_frames,
        },
    )
    events = session.events()
    pids: dict[str, Any] = meta.get("pids") or {}
    python_scope = RecordScope.PYTHON_FUNCTION
    # The span each event maps to: its own, or for a left-out frame, the
    # nearest kept ancestor's (the root when there is none). Filled parent
    # first, walking up iteratively: traced call chains can be deep.
    span_of: dict[int, Span] = {}
    ends: list[tuple[Span, int]] = []
    instants: list[tuple[FunctionEvent, Span]] = []

    def resolve(ev: FunctionEvent | None) -> Span:
        chain: list[FunctionEvent] = []
        while ev is not None and id(ev) not in span_of:
            chain.append(ev)
            ev = ev.parent
        span = root if ev is None else span_of[id(ev)]
        for e in reversed(chain):
            if e.is_instant or (e.scope is python_scope and not python_frames):
                span_of[id(e)] = span
                continue
            span = tracer.start_span(
                e.name,
                context=trace.set_span_in_context(span),
                start_time=e.start_ns + offset,
                attributes=_attributes(e, pids),
            )
            exc = e.exception
            if exc is not None:
                span.add_event("exception", {"exception.type": exc}, timestamp=e.end_ns + offset)
                span.set_status(Status(StatusCode.ERROR, exc))
            span_of[id(e)] = span
            ends.append((span, e.end_ns + offset))
        return span

    for ev in events:
        if ev.is_instant:
            instants.append((ev, resolve(ev.parent)))
        else:
            resolve(ev)
    for ev, span in instants:
        attrs: dict[str, Any] = {"aprof.track": ev.track, "aprof.thread_id": ev.thread_id}
        if ev.args is not None:
            attrs["aprof.args"] = ev.args
        span.add_event(ev.name, attrs, timestamp=ev.start_ns + offset)
    for span, end in ends:
        span.end(end_time=end)
    root.end(end_time=int(meta["stop_ns"]) + offset)
    return len(ends) + 1
