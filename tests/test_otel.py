"""OpenTelemetry export (SPEC 11.5).

Every test sends the spans through a real OpenTelemetry SDK pipeline (a
``TracerProvider`` with an in-memory exporter) and checks them against the
events they come from: one span per range with the same name and times, the
parent a backend shows being the range it was nested in or spawned from,
instants as span events, exceptions as error status.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import aprof
from aprof._post._readers import read_profile  # what `aprof convert` and `aprof report` read with

TASK = aprof.RecordScope.TASK
EXECUTOR = aprof.RecordScope.EXECUTOR
PYTHON = aprof.RecordScope.PYTHON_FUNCTION


class Sdk:
    """A tracer provider whose finished spans the test can read."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())


@pytest.fixture
def sdk() -> Iterator[Sdk]:
    s = Sdk()
    yield s
    s.provider.shutdown()


def root_of(spans: list[ReadableSpan]) -> ReadableSpan:
    [root] = [s for s in spans if s.name == "aprof profile"]
    return root


def by_event(session: aprof.Session, spans: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    """The span of each non-instant event (keyed by id(event)), matched on
    name and start time, which the scenarios keep unique."""
    offset = session.metadata["unix_offset_ns"]
    index = {(s.name, s.start_time): s for s in spans}
    assert len(index) == len(spans), "two spans share a name and start time"
    return {id(e): index[(e.name, e.start_ns + offset)] for e in session.events() if not e.is_instant}


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_spans_mirror_the_events_on_every_backend(backend, sdk: Sdk) -> None:
    # SPEC 11.5, 6.3, 7.2, 7.4: one span per range, same names and times;
    # parents are the nesting range or the spawning/submitting range; an
    # async range ends where it ended; instants are span events; an
    # exception is an error status.
    def job() -> None:
        with aprof.record_function("in-thread"):
            pass

    async def child(i: int, handed: aprof.record_function | None) -> None:
        with aprof.record_function(f"child-{i}"):
            await backend.sleep(0.001)
        if handed is not None:
            handed.end()

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            with aprof.record_function("outer", args="batch=32"):
                with aprof.record_function("inner"):
                    await backend.sleep(0)
                with contextlib.suppress(ValueError), aprof.record_function("fails"):
                    raise ValueError("boom")
                handed = aprof.record_function("handed-over").start()
                async with backend.group() as g:
                    g.start_soon(child, 0, handed)
                    g.start_soon(child, 1, None)
                await backend.to_thread(aprof.wrap(job))
                aprof.mark("here", args="k=1")
        return prof

    prof = backend.run(main)
    assert prof.export_opentelemetry(sdk.provider) == len(sdk.spans())
    session = prof.session
    events = session.events()
    spans = sdk.spans()
    offset = session.metadata["unix_offset_ns"]
    ranges = [e for e in events if not e.is_instant]
    assert len(spans) == len(ranges) + 1
    root = root_of(spans)
    assert root.parent is None  # no span was current at export
    assert root.start_time == session.metadata["start_ns"] + offset
    assert root.end_time == session.metadata["stop_ns"] + offset
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}

    span = by_event(session, spans)
    for e in ranges:
        s = span[id(e)]
        assert (s.start_time, s.end_time) == (e.start_ns + offset, e.end_ns + offset)
        assert s.attributes is not None
        assert s.attributes["aprof.scope"] == e.scope.value
        assert s.attributes["aprof.track"] == e.track
        assert s.attributes["aprof.thread_id"] == e.thread_id
        expected_parent = span[id(e.parent)] if e.parent is not None else root
        assert parent_id(s) == expected_parent.context.span_id, f"{e.name} under the wrong span"
        if e.exception is None:
            assert s.status.status_code is StatusCode.UNSET
    # Nesting, spawns and submits, as a backend shows them.
    names = {e.name: e for e in ranges}
    assert parent_id(span[id(names["inner"])]) == span[id(names["outer"])].context.span_id
    tasks = [e for e in ranges if e.scope is TASK]
    assert len(tasks) == 2
    for t in tasks:
        assert span[id(t)].name == t.name
        assert parent_id(span[id(t)]) == span[id(names["outer"])].context.span_id
        attrs = span[id(t)].attributes
        assert attrs is not None
        assert attrs["aprof.running_ns"] + attrs["aprof.waiting_ns"] == t.duration_ns
    child0 = span[id(names["child-0"])]
    assert parent_id(child0) in {span[id(t)].context.span_id for t in tasks}
    [submitted] = [e for e in ranges if e.scope is EXECUTOR]
    assert parent_id(span[id(submitted)]) == span[id(names["outer"])].context.span_id
    assert span[id(submitted)].attributes["aprof.queued_ns"] >= 0  # type: ignore[index]
    assert parent_id(span[id(names["in-thread"])]) == span[id(submitted)].context.span_id
    # The range handed to a child: on its own span, flagged, ending where it ended.
    handed = span[id(names["handed-over"])]
    assert handed.attributes["aprof.is_async"] is True  # type: ignore[index]
    assert handed.attributes["aprof.end_thread_id"] == names["handed-over"].end_thread_id  # type: ignore[index]
    # Args, exception.
    assert span[id(names["outer"])].attributes["aprof.args"] == "batch=32"  # type: ignore[index]
    fails = span[id(names["fails"])]
    assert fails.status.status_code is StatusCode.ERROR
    assert fails.status.description == "ValueError"
    [exc] = fails.events
    assert exc.name == "exception"
    assert exc.attributes == {"exception.type": "ValueError"}
    assert exc.timestamp == fails.end_time
    # The instant: an event on the span of the range it happened in.
    [mark] = [e for e in events if e.is_instant]
    [here] = span[id(names["outer"])].events
    assert here.name == "here"
    assert here.timestamp == mark.start_ns + offset
    assert here.attributes is not None
    assert here.attributes["aprof.args"] == "k=1"


def test_spans_join_the_trace_of_the_current_or_given_span(sdk: Sdk) -> None:
    # SPEC 11.5: the profile lands under the span current at export (a
    # request's, say), or under the parent given as a Span or a Context.
    with aprof.profile() as prof, aprof.record_function("work"):
        pass
    tracer = sdk.provider.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        prof.export_opentelemetry(sdk.provider)
    other = tracer.start_span("other")
    prof.export_opentelemetry(sdk.provider, parent=other)
    prof.export_opentelemetry(sdk.provider, parent=trace.set_span_in_context(other))
    other.end()
    roots = [s for s in sdk.spans() if s.name == "aprof profile"]
    assert len(roots) == 3
    assert parent_id(roots[0]) == request.get_span_context().span_id
    assert roots[0].context.trace_id == request.get_span_context().trace_id
    for root in roots[1:]:
        assert parent_id(root) == other.get_span_context().span_id
        assert root.context.trace_id == other.get_span_context().trace_id
    works = [s for s in sdk.spans() if s.name == "work"]
    assert [parent_id(w) for w in works] == [r.context.span_id for r in roots]


def test_without_a_provider_the_global_one_is_used(sdk: Sdk, monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 11.5: like OpenTelemetry's own instrumentations.
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: sdk.provider)
    with aprof.profile() as prof, aprof.record_function("work"):
        pass
    assert prof.export_opentelemetry() == 2
    assert sorted(s.name for s in sdk.spans()) == ["aprof profile", "work"]
    [scope] = {s.instrumentation_scope.name for s in sdk.spans() if s.instrumentation_scope is not None}
    assert scope == "aprof"


def test_python_frames_are_left_out_unless_asked(sdk: Sdk) -> None:
    # SPEC 11.5, 8.1: a traced run's frames are not spans by default, and
    # the ranges inside a frame go to the nearest span kept above it.
    def traced_work() -> None:
        with aprof.record_function("inside"):
            pass

    with aprof.profile(python_tracer=True) as prof, aprof.record_function("outer"):
        traced_work()
    frames = [e for e in prof.events() if e.scope is PYTHON and "traced_work" in e.name]
    assert len(frames) == 1

    prof.export_opentelemetry(sdk.provider)
    spans = sdk.spans()
    assert all(s.attributes["aprof.scope"] != PYTHON.value for s in spans if s.name != "aprof profile")  # type: ignore[index]
    outer = next(s for s in spans if s.name == "outer")
    inside = next(s for s in spans if s.name == "inside")
    assert parent_id(inside) == outer.context.span_id
    assert root_of(spans).attributes["aprof.python_frames"] is False  # type: ignore[index]

    sdk.exporter.clear()
    n = prof.export_opentelemetry(sdk.provider, python_frames=True)
    spans = sdk.spans()
    assert n == len(spans) == len([e for e in prof.events() if not e.is_instant]) + 1
    # Frames running at start share the start time, so match by name here.
    [frame] = [s for s in spans if s.name == frames[0].name]
    assert frame.attributes["aprof.scope"] == PYTHON.value  # type: ignore[index]
    inside = next(s for s in spans if s.name == "inside")
    assert parent_id(inside) == frame.context.span_id
    assert parent_id(frame) == next(s for s in spans if s.name == "outer").context.span_id


def test_a_deep_chain_of_ranges_exports_whole(sdk: Sdk) -> None:
    # SPEC 11.5: parents are found without recursion, so a chain deeper than
    # the recursion limit exports with every link.
    depth = sys.getrecursionlimit() + 500
    with aprof.profile() as prof, contextlib.ExitStack() as stack:
        for i in range(depth):
            stack.enter_context(aprof.record_function(f"level-{i}"))
    assert prof.export_opentelemetry(sdk.provider) == depth + 1
    spans = {s.name: s for s in sdk.spans()}
    for i in range(1, depth):
        assert parent_id(spans[f"level-{i}"]) == spans[f"level-{i - 1}"].context.span_id
    assert parent_id(spans["level-0"]) == spans["aprof profile"].context.span_id


def _spans_seen(sdk: Sdk, session: aprof.Session) -> list[tuple[str, int, int, str | None]]:
    sdk.exporter.clear()
    session.export_opentelemetry(sdk.provider)
    spans = sdk.spans()
    ids = {s.context.span_id: s.name for s in spans}
    return sorted((s.name, s.start_time, s.end_time, ids.get(parent_id(s) or 0)) for s in spans)


def test_saved_sessions_and_chrome_traces_keep_the_wall_clock(sdk: Sdk, tmp_path: Path) -> None:
    # SPEC 11.5, 6.5: the offset to the wall clock survives save/load and a
    # Chrome trace, so a file exported later gives the same spans.
    with aprof.profile() as prof:
        with aprof.record_function("a"), aprof.record_function("b"):
            pass
        with aprof.record_function("c"):
            pass
    direct = _spans_seen(sdk, prof.session)
    prof.save(tmp_path / "s.aprof")
    assert _spans_seen(sdk, aprof.load(tmp_path / "s.aprof")) == direct
    prof.export_chrome_trace(tmp_path / "t.json")
    from_chrome = _spans_seen(sdk, read_profile(tmp_path / "t.json"))
    assert [(n, p) for n, _, _, p in from_chrome] == [(n, p) for n, _, _, p in direct]
    for (_, s0, e0, _), (_, s1, e1, _) in zip(from_chrome, direct, strict=True):
        # ns, through microseconds with 3 decimals
        assert abs(s0 - s1) <= 1
        assert abs(e0 - e1) <= 1


def _chrome_without_offset(prof: aprof.profile, tmp_path: Path) -> Path:
    prof.export_chrome_trace(tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    del doc["otherData"]["unix_offset_ns"]
    old = tmp_path / "old.json.gz"
    old.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return old


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"tracer_provider": "jaeger"}, TypeError, "tracer_provider"),
        ({"parent": 42}, TypeError, "parent"),
        ({"python_frames": 1}, TypeError, "python_frames"),
    ],
)
def test_bad_arguments_are_named_and_nothing_is_lost(
    sdk: Sdk, kwargs: dict[str, Any], error: type[Exception], named: str
) -> None:
    # SPEC 11.5, 12: a clear error naming the argument, no span sent, and
    # the session still exports afterwards.
    with aprof.profile() as prof, aprof.record_function("work"):
        pass
    kwargs.setdefault("tracer_provider", sdk.provider)
    with pytest.raises(error, match=named):
        prof.export_opentelemetry(**kwargs)
    assert sdk.spans() == []
    assert prof.export_opentelemetry(sdk.provider) == 2
    assert [e.name for e in prof.events()] == ["work"]


def test_a_session_without_wall_clock_offset_is_refused(sdk: Sdk, tmp_path: Path) -> None:
    # SPEC 11.5, 12: a file from before the offset was kept cannot be placed
    # in time; the error says why, and nothing is sent.
    with aprof.profile() as prof, aprof.record_function("work"):
        pass
    old = read_profile(_chrome_without_offset(prof, tmp_path))
    with pytest.raises(ValueError, match="unix_offset_ns"):
        old.export_opentelemetry(sdk.provider)
    assert sdk.spans() == []
    assert [e.name for e in old.events()] == ["work"]


def test_a_running_profile_cannot_export(sdk: Sdk) -> None:
    # SPEC 11.5, 12: like every export, only after stop.
    with aprof.profile() as prof:
        with pytest.raises(RuntimeError):
            prof.export_opentelemetry(sdk.provider)
        with aprof.record_function("work"):
            pass
    assert prof.export_opentelemetry(sdk.provider) == 2


def test_without_the_api_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 11.5: the OpenTelemetry API is an optional extra, not a dependency.
    with aprof.profile() as prof, aprof.record_function("work"):
        pass
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"aprof\[otel\]"):
        prof.export_opentelemetry()
