"""User ranges: record_function, explicit start/end, mark (SPEC 4).

Also the RELIABILITY cases about one range's life: handed between tasks
(CP-09, CP-10), exited out of order (CP-11), held across an async
generator's yields (CP-12), opened in an eager task's first step (CP-06),
ended by an exception, a cancellation or a timeout (FA-01 to FA-03), odd
names and inputs (BI-04, BI-05), decorated callables of every kind (BI-08)
and ranges dropped without an end (LC-03).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import math
import sys
import threading
import time
import traceback
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import aprof

from .tracecheck import validate_trace

USER = aprof.RecordScope.USER_SCOPE
TASK = aprof.RecordScope.TASK

RUNNERS = [pytest.param(asyncio.run, id="asyncio")]
with contextlib.suppress(ImportError):
    import uvloop

    RUNNERS.append(pytest.param(uvloop.run, id="uvloop"))

# uvloop passes eager_start= to task factories, which 3.13's
# asyncio.eager_task_factory refuses (with or without aprof): no eager uvloop there.
EAGER_RUNNERS = [p for p in RUNNERS if p.id == "asyncio" or sys.version_info < (3, 13)]


def user_events(prof: aprof.profile) -> list[aprof.FunctionEvent]:
    return [e for e in prof.events() if e.scope is USER]


def one(prof: aprof.profile, name: str) -> aprof.FunctionEvent:
    found = [e for e in prof.events() if e.name == name]
    assert len(found) == 1, f"expected one {name!r}, got {found}"
    return found[0]


def cancel_name(backend: Any) -> str:
    """The type name of the backend's cancellation exception."""
    return "Cancelled" if backend.is_trio else "CancelledError"


@contextlib.asynccontextmanager
async def fail_after(backend: Any, seconds: float) -> AsyncIterator[None]:
    """The backend's "raise when the deadline passes" block."""
    if backend.is_anyio:
        import anyio

        with anyio.fail_after(seconds):
            yield
    elif backend.is_trio:
        import trio

        with trio.fail_after(seconds):
            yield
    else:
        async with asyncio.timeout(seconds):
            yield


def drop(objects: list[Any]) -> None:
    """Let go of the only references to ``objects`` and collect them."""
    objects.clear()
    gc.collect()


@contextlib.contextmanager
def collect_unraisable() -> Iterator[list[Any]]:
    """Exceptions Python could not raise (finalizers, __del__) during the body."""
    seen: list[Any] = []
    old = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        yield seen
    finally:
        sys.unraisablehook = old


# ---------------------------------------------------------------------------
# 4.1: with, async with, decorators
# ---------------------------------------------------------------------------


def test_sync_with_records_one_user_range_around_the_block() -> None:
    # SPEC 4.1
    with aprof.profile() as prof:
        before = time.perf_counter_ns()
        with aprof.record_function("block", args="n=3") as r:
            inside = time.perf_counter_ns()
        after = time.perf_counter_ns()
    assert isinstance(r, aprof.record_function)
    ev = one(prof, "block")
    assert ev.scope is USER
    assert ev.args == "n=3"
    assert before <= ev.start_ns <= inside <= ev.end_ns <= after
    assert (ev.is_async, ev.unfinished, ev.exception) == (False, False, None)
    assert ev.thread_id == aprof.current_thread_id()


def test_async_with_and_decorators_cover_the_whole_call(backend) -> None:
    # SPEC 4.1: async with, and a decorated function or coroutine function,
    # each give one range from first entry to return, across awaits.
    stamps: dict[str, int] = {}

    @aprof.record_function("sync-fn")
    def compute(x: int) -> int:
        stamps["sync-fn"] = time.perf_counter_ns()
        return x * 2

    @aprof.record_function("coro-fn")
    async def fetch(x: int) -> int:
        await backend.sleep(0.002)
        stamps["coro-fn"] = time.perf_counter_ns()
        return compute(x) + 1

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with aprof.record_function("outer"):
                assert await fetch(20) == 41
                await backend.sleep(0)
                stamps["outer"] = time.perf_counter_ns()
        return prof

    prof = backend.run(main)
    assert sorted(e.name for e in user_events(prof)) == ["coro-fn", "outer", "sync-fn"]
    outer, coro, fn = one(prof, "outer"), one(prof, "coro-fn"), one(prof, "sync-fn")
    for ev in (outer, coro, fn):
        assert ev.start_ns <= stamps[ev.name] <= ev.end_ns
        assert (ev.is_async, ev.unfinished, ev.exception) == (False, False, None)
    assert coro.parent is outer
    assert fn.parent is coro
    assert outer.children == [coro]
    # The coroutine's range spans its sleep: it covers the awaited execution.
    assert coro.duration_ns >= 1_000_000
    assert compute.__name__ == "compute"
    assert fetch.__name__ == "fetch"


class CountingRepr:
    """An argument that counts how often it is repr()'d, and can be watched by weakref."""

    reprs = 0

    def __repr__(self) -> str:
        CountingRepr.reprs += 1
        return "<counted>"


def decorated_kinds(backend: Any) -> dict[str, Any]:
    """One decorated callable of each kind, each taking (a, b, *, c), and how to call it."""

    @aprof.record_function("fn")
    def fn(a: Any, b: Any, *, c: Any = None) -> str:
        return "fn"

    @aprof.record_function("coro")
    async def coro(a: Any, b: Any, *, c: Any = None) -> str:
        await backend.checkpoint()
        return "coro"

    @aprof.record_function("gen")
    def gen(a: Any, b: Any, *, c: Any = None) -> Iterator[int]:
        yield 1

    @aprof.record_function("agen")
    async def agen(a: Any, b: Any, *, c: Any = None) -> AsyncIterator[int]:
        await backend.checkpoint()
        yield 1

    async def call_all(*a: Any, **k: Any) -> None:
        assert fn(*a, **k) == "fn"
        assert await coro(*a, **k) == "coro"
        assert list(gen(*a, **k)) == [1]
        assert [x async for x in agen(*a, **k)] == [1]

    return {"call_all": call_all}


def test_decorated_calls_record_their_arguments_with_record_inputs(backend) -> None:
    # SPEC 4.1, 5.1, 12 (issue 15 item 5): under profile(record_inputs=True)
    # a decorated call of any kind records its arguments, keywords included,
    # as bounded reprs (never the objects: nothing is kept alive).
    call_all = decorated_kinds(backend)["call_all"]
    held = [CountingRepr()]
    ref = weakref.ref(held[0])

    async def main() -> aprof.profile:
        async with aprof.profile(record_inputs=True) as prof:
            await call_all(1, "x" * 500, c=held[0])
        return prof

    prof = backend.run(main)
    held.clear()
    gc.collect()
    assert ref() is None
    events = {e.name: e for e in user_events(prof)}
    assert sorted(events) == ["agen", "coro", "fn", "gen"]
    for ev in events.values():
        assert ev.inputs is not None
        one_, long_, c = ev.inputs
        assert one_ == "1"
        assert long_.startswith("'xxx")
        assert long_.endswith("...")
        assert len(long_) <= 200
        assert c == "c=<counted>"


def test_needs_inputs_callbacks_see_decorated_arguments(backend) -> None:
    # SPEC 3.2, 3.5 (issue 15 item 5): a needs_inputs() callback sees the
    # call's arguments in rf.inputs and its keywords in rf.kwinputs; one that
    # does not ask sees neither, and nothing is repr()'d for it.
    call_all = decorated_kinds(backend)["call_all"]
    seen: list[tuple[str, tuple[Any, ...], dict[str, Any], bool]] = []
    plain: list[tuple[tuple[Any, ...], dict[str, Any], bool]] = []
    marker = object()
    handles = [
        aprof.add_global_callback(
            aprof.RecordFunctionCallback(lambda rf: seen.append((rf.name, rf.inputs, rf.kwinputs, rf.needs_inputs)))
            .needs_inputs()
            .scopes({USER})
        )
    ]
    try:
        backend.run(functools.partial(call_all, 1, marker, c="kw"))
    finally:
        aprof.remove_callback(handles.pop())
    assert [(n, i, k, needs) for n, i, k, needs in seen] == [
        (name, (1, marker), {"c": "kw"}, True) for name in ("fn", "coro", "gen", "agen")
    ]

    CountingRepr.reprs = 0
    handles.append(
        aprof.add_global_callback(
            aprof.RecordFunctionCallback(lambda rf: plain.append((rf.inputs, rf.kwinputs, rf.needs_inputs))).scopes({USER})
        )
    )
    try:
        backend.run(functools.partial(call_all, CountingRepr(), 2, c=CountingRepr()))
    finally:
        aprof.remove_callback(handles.pop())
    assert plain == [((), {}, False)] * 4
    assert CountingRepr.reprs == 0


def test_nothing_needing_inputs_builds_no_reprs(backend) -> None:
    # SPEC 3.6, 12 (issue 15 item 5): a decorated call under a profile
    # without record_inputs (or with nothing listening) repr()s nothing.
    call_all = decorated_kinds(backend)["call_all"]
    CountingRepr.reprs = 0

    async def main() -> aprof.profile:
        await call_all(CountingRepr(), 1, c=CountingRepr())
        async with aprof.profile() as prof:
            await call_all(CountingRepr(), 1, c=CountingRepr())
        return prof

    prof = backend.run(main)
    assert CountingRepr.reprs == 0
    assert sorted(e.name for e in user_events(prof)) == ["agen", "coro", "fn", "gen"]
    assert all(e.inputs is None for e in user_events(prof))


def test_record_function_needs_inputs_says_whether_to_build_them(backend) -> None:
    # SPEC 3.5 (issue 15 item 5): rf.needs_inputs is the cheap test a
    # library makes before building inputs (the seed's needsInputs()).
    F = aprof.RecordScope.FUNCTION

    def needs() -> bool:
        rf = aprof.RecordFunction(F)
        try:
            return rf.needs_inputs
        finally:
            rf.end()

    assert needs() is False
    h = aprof.add_global_callback(aprof.RecordFunctionCallback(lambda rf: None))
    assert needs() is False
    aprof.remove_callback(h)
    h = aprof.add_global_callback(aprof.RecordFunctionCallback(lambda rf: None).needs_inputs().scopes({USER}))
    assert needs() is False  # that callback does not see FUNCTION ranges
    aprof.remove_callback(h)
    with aprof.profile():
        assert needs() is False
    with aprof.profile(record_inputs=True):
        assert needs() is True
    with aprof.DisableRecordFunctionGuard(), aprof.profile(record_inputs=True):
        assert needs() is False


APROF_DIR = str(Path(aprof.__file__).resolve().parent)


@pytest.mark.parametrize("listening", ["profile", "context-callback", "record_inputs", "global-profile"])
def test_ranges_opened_from_a_signal_handler_at_any_point(listening: str) -> None:
    # SPEC 6.2, 12 (issue 15 item 21): a signal handler may run between any
    # two bytecodes of aprof's own code and open ranges of its own on the
    # same track. Here it runs at *every* bytecode of every aprof frame (a
    # superset of where CPython runs signal handlers), through an opcode
    # trace. Every range, the main thread's nested ones and the handler's,
    # still ends, nests under the right parent and is not flagged async, on
    # the C path and on the pure-Python one (test_native runs this file
    # with APROF_PURE_PYTHON=1).
    injected = [0]

    def handler() -> None:
        with aprof.record_function("handler"):
            aprof.mark("handler-mark")
            with aprof.record_function("handler-inner"):
                pass

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if not frame.f_code.co_filename.startswith(APROF_DIR):
            return None
        frame.f_trace_opcodes = True

        def at_each_opcode(frame: Any, event: str, arg: Any) -> Any:
            if event == "opcode":
                injected[0] += 1
                handler()
            return at_each_opcode

        return at_each_opcode

    handle = None
    if listening == "context-callback":
        handle = aprof.add_context_callback(aprof.RecordFunctionCallback(lambda rf: None))
    try:
        with aprof.profile(record_inputs=listening == "record_inputs", scope="global" if listening == "global-profile" else "context") as prof:
            sys.settrace(trace)
            try:
                for _ in range(4):
                    with aprof.record_function("outer"):
                        with aprof.record_function("mid", args="k=v"):
                            aprof.mark("mark")
                            with aprof.record_function("inner"):
                                pass
            finally:
                sys.settrace(None)
    finally:
        if handle is not None:
            aprof.remove_callback(handle)
    events = prof.events()
    assert [(e.name, e.unfinished, e.is_async) for e in events if e.unfinished or e.is_async] == []
    counts = Counter(e.name for e in events)
    assert counts["outer"] == counts["mid"] == counts["inner"] == counts["mark"] == 4
    assert counts["handler"] == counts["handler-inner"] == counts["handler-mark"] == injected[0]
    expected_parent = {"mid": "outer", "inner": "mid", "mark": "mid", "handler-inner": "handler", "handler-mark": "handler"}
    for ev in events:
        if ev.name in expected_parent:
            assert ev.parent is not None
            assert ev.parent.name == expected_parent[ev.name]
        if ev.parent is not None:
            assert ev.parent.start_ns <= ev.start_ns
            assert ev.end_ns <= ev.parent.end_ns
            assert ev in ev.parent.children


STACK_SOURCE = """\
import aprof
def leaf():
    with aprof.record_function("leaf"):
        pass
    aprof.mark("mark")
def caller():
    leaf()
@aprof.record_function("decorated")
def decorated():
    pass
def calls_decorated():
    decorated()
"""


@pytest.mark.parametrize("listening", ["profile", "callback", "record_inputs"])
def test_with_stack_names_frames_at_stop_and_lets_code_go(listening: str) -> None:
    # SPEC 8.3, 12 (issue 15 item 7): each range's stack at its start,
    # (file, line, qualified name) innermost first from the user's code, on
    # the fast path, the general path and for instants and hand-offs; the
    # frames are kept raw while recording and named at stop, after which
    # no code object is held by aprof (reference counts are back).
    ns: dict[str, Any] = {}
    exec(compile(STACK_SOURCE, "<stacks>", "exec"), ns)
    codes = [ns[f].__code__ for f in ("leaf", "caller", "calls_decorated")] + [ns["decorated"].__wrapped__.__code__]
    before = [sys.getrefcount(c) for c in codes]
    me = "test_with_stack_names_frames_at_stop_and_lets_code_go"
    handle = None
    if listening == "callback":
        handle = aprof.add_context_callback(aprof.RecordFunctionCallback(lambda rf: None))
    try:
        with aprof.profile(with_stack=True, record_inputs=listening == "record_inputs") as prof:
            ns["caller"]()
            ns["calls_decorated"]()
            aprof.wrap(ns["caller"])()
    finally:
        if handle is not None:
            aprof.remove_callback(handle)
    events = prof.events()
    by_name: dict[str, list[aprof.FunctionEvent]] = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e)
    direct_leaf, wrapped_leaf = by_name["leaf"]
    assert direct_leaf.stack is not None
    assert direct_leaf.stack[:2] == (("<stacks>", 3, "leaf"), ("<stacks>", 7, "caller"))
    assert direct_leaf.stack[2][0] == __file__
    assert direct_leaf.stack[2][2] == me
    assert by_name["mark"][0].stack[:2] == (("<stacks>", 5, "leaf"), ("<stacks>", 7, "caller"))
    # A decorated call's range starts at its caller, not in aprof's wrapper.
    (deco,) = by_name["decorated"]
    assert deco.stack is not None
    assert deco.stack[0] == ("<stacks>", 12, "calls_decorated")
    # The hand-off: the EXECUTOR range and the ranges inside it.
    (executor,) = [e for e in events if e.scope is aprof.RecordScope.EXECUTOR]
    assert executor.stack is not None
    assert executor.stack[0][2] == me
    assert wrapped_leaf.stack is not None
    assert wrapped_leaf.stack[:2] == direct_leaf.stack[:2]
    for e in events:
        assert e.stack is not None
        assert all(type(f) is str and type(n) is int and type(q) is str for f, n, q in e.stack), e
    del events, by_name, direct_leaf, wrapped_leaf, deco, executor, e
    gc.collect()
    assert [sys.getrefcount(c) for c in codes] == before


def test_decorated_generators_range_from_first_step_to_the_end(backend) -> None:
    # SPEC 4.1, BI-08: for a generator and an async generator the range covers
    # the iteration, from the first step to exhaustion, not the creation.
    stamps: dict[str, int] = {}

    @aprof.record_function("sync-gen")
    def numbers(n: int) -> Iterator[int]:
        yield from range(n)

    @aprof.record_function("async-gen")
    async def ticks(n: int) -> AsyncIterator[int]:
        for i in range(n):
            await backend.sleep(0)
            yield i

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            gen, agen = numbers(3), ticks(3)
            stamps["created"] = time.perf_counter_ns()
            await backend.sleep(0.002)
            stamps["iterating"] = time.perf_counter_ns()
            assert list(gen) == [0, 1, 2]
            stamps["sync-gen"] = time.perf_counter_ns()
            assert [i async for i in agen] == [0, 1, 2]
            stamps["async-gen"] = time.perf_counter_ns()
        return prof

    prof = backend.run(main)
    sync_gen, async_gen = one(prof, "sync-gen"), one(prof, "async-gen")
    for ev in (sync_gen, async_gen):
        assert ev.start_ns >= stamps["iterating"] > stamps["created"]
        assert ev.end_ns <= stamps[ev.name]
        assert (ev.is_async, ev.unfinished, ev.exception) == (False, False, None)
    assert sync_gen.end_ns <= async_gen.start_ns


def test_decorated_classmethod_and_staticmethod(backend) -> None:
    # SPEC 4.1, BI-08: the decorator accepts classmethod and staticmethod
    # objects and keeps their binding; the range covers the awaited execution.
    stamps: dict[str, int] = {}

    class Service:
        factor = 3

        @aprof.record_function("Service.scale")
        @classmethod
        async def scale(cls, x: int) -> int:
            await backend.sleep(0)
            stamps["scale"] = time.perf_counter_ns()
            return cls.factor * x

        @aprof.record_function("Service.parse")
        @staticmethod
        def parse(text: str) -> int:
            return int(text)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            pending = Service.scale(2)  # constructed, not yet awaited
            stamps["created"] = time.perf_counter_ns()
            await backend.sleep(0.001)
            assert await pending == 6
            assert Service().parse("7") == 7
            assert Service.parse("8") == 8
        return prof

    prof = backend.run(main)
    scale = one(prof, "Service.scale")
    assert stamps["created"] < scale.start_ns <= stamps["scale"] <= scale.end_ns
    assert [e.name for e in user_events(prof)].count("Service.parse") == 2


def test_decorated_callable_objects_with_async_call(backend) -> None:
    # SPEC 4.1, BI-08: an object whose __call__ is a coroutine function (an
    # ASGI app, say) or an async generator function is decorated like one:
    # the range covers the awaited run, not the creation of the coroutine.
    stamps: dict[str, int] = {}

    class App:
        async def __call__(self, x: int) -> int:
            await backend.sleep(0.001)
            stamps["app"] = time.perf_counter_ns()
            return x + 1

    class Stream:
        async def __call__(self, n: int) -> AsyncIterator[int]:
            for i in range(n):
                await backend.sleep(0)
                yield i
            stamps["stream"] = time.perf_counter_ns()

    app = aprof.record_function("app")(App())
    stream = aprof.record_function("stream")(Stream())

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            pending = app(1)
            stamps["created"] = time.perf_counter_ns()
            await backend.sleep(0.001)
            assert await pending == 2
            assert [i async for i in stream(3)] == [0, 1, 2]
        return prof

    prof = backend.run(main)
    for name in ("app", "stream"):
        ev = one(prof, name)
        assert stamps["created"] < ev.start_ns <= stamps[name] <= ev.end_ns
        assert (ev.is_async, ev.unfinished, ev.exception) == (False, False, None)


def test_unawaited_decorated_coroutine_records_nothing() -> None:
    # SPEC 4.1, BI-08: an un-awaited coroutine opens no range; the only
    # complaint is Python's own RuntimeWarning.
    @aprof.record_function("never-run")
    async def job() -> None:
        raise AssertionError("the body must not run")

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            with pytest.warns(RuntimeWarning, match="never awaited"):
                drop([job()])
            with aprof.record_function("after"):
                pass
        return prof

    prof = asyncio.run(main())
    assert [e.name for e in user_events(prof)] == ["after"]
    assert not any(e.unfinished for e in prof.events())


def test_record_function_refuses_names_that_are_not_str() -> None:
    # SPEC 4.1, BI-04
    for bad in (None, 123, b"x"):
        with pytest.raises(TypeError, match="name must be a str"):
            aprof.record_function(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="args"):
        aprof.record_function("ok", args=5)  # type: ignore[arg-type]


def test_a_str_subclass_is_a_name_like_any_str() -> None:
    # SPEC 4.1: "any str" includes subclasses (an enum.StrEnum member, say).
    class Name(str):
        pass

    with aprof.profile() as prof:
        with aprof.record_function(Name("outer"), args=Name("a=1")):
            with aprof.record_function(Name("inner")):
                pass
    outer = one(prof, "outer")
    assert outer.args == "a=1"
    assert [c.name for c in outer.children] == ["inner"]


AWKWARD_NAMES = [
    "",
    "x" * 10_240,
    'back\\slash "quoted"',
    "new\nline\ttab",
    "nul\x00byte",
    "emoji \U0001f680 and \u00e9",
    "\ud7ff\ue000 edge of the BMP",
]


def test_awkward_names_round_trip_through_export_save_and_load(tmp_path: Path) -> None:
    # SPEC 4.1, 6.5, 9.1, BI-04: any str is a name, and comes back exactly.
    with aprof.profile() as prof:
        for name in AWKWARD_NAMES:
            with aprof.record_function(name, args=name):
                aprof.mark(name)
    recorded = [e.name for e in user_events(prof)]
    assert recorded == [n for name in AWKWARD_NAMES for n in (name, name)]

    prof.export_chrome_trace(tmp_path / "t.json")
    doc = validate_trace(tmp_path / "t.json")
    ranges = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_scope"]
    instants = [e for e in doc["traceEvents"] if e.get("ph") == "i"]
    assert [e["name"] for e in ranges] == AWKWARD_NAMES
    assert [e["args"]["args"] for e in ranges] == AWKWARD_NAMES
    assert [e["name"] for e in instants] == AWKWARD_NAMES
    # Plain json (the way other tools read it) agrees with the strict reader.
    plain = json.loads((tmp_path / "t.json").read_text(encoding="utf-8"))
    assert [e["name"] for e in plain["traceEvents"] if e.get("ph") == "i"] == AWKWARD_NAMES

    prof.save(tmp_path / "s.aprof")
    loaded = aprof.load(tmp_path / "s.aprof")
    assert [e.name for e in loaded.events() if e.scope is USER] == recorded
    assert [e.args for e in loaded.events() if e.scope is USER and not e.is_instant] == AWKWARD_NAMES


# ---------------------------------------------------------------------------
# 4.2: exceptions end the range and propagate unchanged (FA-01)
# ---------------------------------------------------------------------------


def test_exception_ends_the_range_and_propagates_unchanged() -> None:
    # SPEC 4.2, FA-01: the range records the type name; the very same
    # exception object arrives, with the raising frame in its traceback.
    err = ZeroDivisionError("boom")

    def divide() -> None:
        raise err

    with aprof.profile() as prof:
        with pytest.raises(ZeroDivisionError) as caught, aprof.record_function("outer"):
            with aprof.record_function("inner"):
                divide()
        with aprof.record_function("after"):
            pass
    assert caught.value is err
    frames = [f.name for f in traceback.extract_tb(err.__traceback__)]
    assert frames[-1] == "divide"
    assert err.__context__ is None
    assert err.__cause__ is None
    assert one(prof, "inner").exception == "ZeroDivisionError"
    assert one(prof, "outer").exception == "ZeroDivisionError"
    assert one(prof, "after").exception is None
    assert one(prof, "inner").parent is one(prof, "outer")
    assert one(prof, "after").parent is None


def test_exception_through_decorated_callables(backend) -> None:
    # SPEC 4.2, FA-01: the decorator's range ends with the exception, which
    # reaches the caller unchanged, for every kind of decorated callable.
    errors = {kind: ValueError(kind) for kind in ("fn", "coro", "gen", "agen")}

    @aprof.record_function("fn")
    def fn() -> None:
        raise errors["fn"]

    @aprof.record_function("coro")
    async def coro() -> None:
        await backend.sleep(0)
        raise errors["coro"]

    @aprof.record_function("gen")
    def gen() -> Iterator[int]:
        yield 1
        raise errors["gen"]

    @aprof.record_function("agen")
    async def agen() -> AsyncIterator[int]:
        yield 1
        await backend.sleep(0)
        raise errors["agen"]

    async def main() -> tuple[aprof.profile, dict[str, BaseException]]:
        caught: dict[str, BaseException] = {}
        async with aprof.profile() as prof:
            try:
                fn()
            except ValueError as e:
                caught["fn"] = e
            try:
                await coro()
            except ValueError as e:
                caught["coro"] = e
            try:
                list(gen())
            except ValueError as e:
                caught["gen"] = e
            try:
                [i async for i in agen()]
            except ValueError as e:
                caught["agen"] = e
        return prof, caught

    prof, caught = backend.run(main)
    for kind, err in errors.items():
        assert caught[kind] is err
        assert traceback.extract_tb(err.__traceback__)[-1].name == kind
        ev = one(prof, kind)
        assert ev.exception == "ValueError"
        assert (ev.is_async, ev.unfinished) == (False, False)


@pytest.mark.parametrize("run", RUNNERS)
@pytest.mark.parametrize("path", ["fast", "with-callback"])
def test_cancel_mid_range_three_deep(run: Any, path: str) -> None:
    # SPEC 4.2, FA-02: task.cancel() in the innermost range: all three end
    # with CancelledError, innermost first; the cancel propagates and the
    # task's cancelling() count is what asyncio alone would give.
    seen: dict[str, Any] = {}
    ends: list[tuple[str, str | None]] = []
    handle = None
    if path == "with-callback":  # the general path, with a profile behind it
        cb = aprof.RecordFunctionCallback(lambda rf: None, lambda rf, ctx: ends.append((rf.name, rf.exception)))
        handle = aprof.add_global_callback(cb.scopes({USER}))

    async def work(entered: asyncio.Event) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            with aprof.record_function("outer"), aprof.record_function("middle"), aprof.record_function("inner"):
                entered.set()
                await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen["cancelling"] = task.cancelling()
            seen["thread"] = aprof.current_thread_id()
            raise

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            entered = asyncio.Event()
            task = asyncio.create_task(work(entered))
            await entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            seen["cancelled"] = task.cancelled()
            seen["uncancel"] = task.uncancel()
        return prof

    try:
        prof = run(main())
    finally:
        if handle is not None:
            aprof.remove_callback(handle)
    assert seen["cancelling"] == 1
    assert seen["cancelled"] is True
    assert seen["uncancel"] == 0
    outer, middle, inner = (one(prof, n) for n in ("outer", "middle", "inner"))
    for ev in (outer, middle, inner):
        assert ev.exception == "CancelledError"
        assert ev.thread_id == seen["thread"]
        assert (ev.is_async, ev.unfinished) == (False, False)
    assert inner.end_ns <= middle.end_ns <= outer.end_ns
    assert inner.parent is middle
    assert middle.parent is outer
    if path == "with-callback":
        assert ends == [("inner", "CancelledError"), ("middle", "CancelledError"), ("outer", "CancelledError")]
    task_ev = next(e for e in prof.events() if e.scope is TASK)
    assert task_ev.extra is not None
    assert task_ev.extra["outcome"] == "cancelled"


def test_cancel_scope_ends_nested_ranges(backend, tmp_path: Path) -> None:
    # SPEC 4.2, FA-03: a deadline expires inside nested ranges: both end with
    # the backend's cancellation, the timeout error propagates unchanged, and
    # the range around the deadline records that error.
    async def main() -> tuple[aprof.profile, BaseException | None]:
        caught = None
        async with aprof.profile() as prof:
            try:
                async with aprof.record_function("deadline"), fail_after(backend, 0.01):
                    with aprof.record_function("outer"), aprof.record_function("inner"):
                        await backend.sleep(10)
            except Exception as e:  # TimeoutError, or trio.TooSlowError
                caught = e
            with aprof.record_function("after"):
                await backend.checkpoint()
        return prof, caught

    prof, caught = backend.run(main)
    expected = "TooSlowError" if backend.name == "trio" else "TimeoutError"
    assert type(caught).__name__ == expected
    assert one(prof, "inner").exception == cancel_name(backend)
    assert one(prof, "outer").exception == cancel_name(backend)
    assert one(prof, "deadline").exception == expected
    assert one(prof, "after").exception is None
    assert not any(e.unfinished for e in prof.events())
    prof.export_chrome_trace(tmp_path / "t.json")
    validate_trace(tmp_path / "t.json")


@pytest.mark.parametrize("run", RUNNERS)
def test_asyncio_timeout_inside_nested_ranges(run: Any, tmp_path: Path) -> None:
    # SPEC 4.2, FA-03 (cpython #96037): asyncio.timeout expiring inside two
    # ranges closes both; TimeoutError propagates, chained to the cancel as
    # asyncio alone makes it; the task is not left cancelling.
    seen: dict[str, Any] = {}

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            task = asyncio.current_task()
            assert task is not None
            try:
                async with asyncio.timeout(0.01):
                    with aprof.record_function("outer"), aprof.record_function("inner"):
                        await asyncio.sleep(10)
            except TimeoutError as e:
                seen["error"] = e
            seen["cancelling"] = task.cancelling()
        return prof

    prof = run(main())
    assert isinstance(seen["error"].__context__, asyncio.CancelledError)
    assert seen["cancelling"] == 0
    assert one(prof, "inner").exception == "CancelledError"
    assert one(prof, "outer").exception == "CancelledError"
    assert one(prof, "inner").end_ns <= one(prof, "outer").end_ns
    prof.export_chrome_trace(tmp_path / "t.json")
    validate_trace(tmp_path / "t.json")


def test_task_group_with_a_raising_child(backend, tmp_path: Path) -> None:
    # SPEC 4.2, FA-03 (gh-95704): a child raises inside a range; its siblings'
    # ranges are cancelled and closed; the exception group carries the very
    # exception raised; the export validates.
    err = KeyError("bad child")
    ids: dict[str, int] = {}

    async def sibling(i: int) -> None:
        ids[f"sibling-{i}"] = aprof.current_thread_id()
        with aprof.record_function(f"sibling-{i}"), aprof.record_function(f"sibling-{i}-inner"):
            await backend.sleep(10)

    async def failing() -> None:
        with aprof.record_function("failing"):
            await backend.sleep(0.005)
            raise err

    async def main() -> tuple[aprof.profile, BaseException | None]:
        caught = None
        async with aprof.profile() as prof:
            try:
                with aprof.record_function("group"):
                    async with backend.group() as g:
                        for i in range(3):
                            g.start_soon(sibling, i)
                        g.start_soon(failing)
            except BaseExceptionGroup as eg:
                caught = eg
        return prof, caught

    prof, caught = backend.run(main)
    assert isinstance(caught, BaseExceptionGroup)
    leaves: list[BaseException] = []

    def flatten(g: BaseException) -> None:
        if isinstance(g, BaseExceptionGroup):
            for e in g.exceptions:
                flatten(e)
        else:
            leaves.append(g)

    flatten(caught)
    assert leaves == [err]
    assert one(prof, "failing").exception == "KeyError"
    assert one(prof, "group").exception == type(caught).__name__
    for i in range(3):
        outer, inner = one(prof, f"sibling-{i}"), one(prof, f"sibling-{i}-inner")
        assert outer.exception == inner.exception == cancel_name(backend)
        assert outer.thread_id == inner.thread_id == ids[f"sibling-{i}"]
        assert inner.parent is outer
        assert not outer.unfinished
        assert not inner.unfinished
    prof.export_chrome_trace(tmp_path / "t.json")
    validate_trace(tmp_path / "t.json")


# ---------------------------------------------------------------------------
# 4.3: explicit start/end, across tasks and threads (CP-09, CP-10)
# ---------------------------------------------------------------------------


def test_one_record_function_object_shared_by_concurrent_tasks(backend) -> None:
    # SPEC 4.1, 12: a module-level `RANGE = aprof.record_function("db")`
    # entered by several tasks at once gives each task its own range.
    shared = aprof.record_function("shared")
    ids: dict[int, int] = {}
    slept: dict[int, int] = {}

    async def user(i: int) -> None:
        ids[i] = aprof.current_thread_id()
        async with shared:
            t0 = time.perf_counter_ns()
            await backend.sleep(0.001 * (3 - i))
            slept[ids[i]] = time.perf_counter_ns() - t0

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                for i in range(3):
                    g.start_soon(user, i)
        return prof

    prof = backend.run(main)
    events = [e for e in prof.events() if e.name == "shared"]
    assert not [e for e in events if e.unfinished or e.is_async]
    assert sorted(e.thread_id for e in events) == sorted(ids.values())
    assert all(e.end_thread_id == e.thread_id for e in events)
    # Each range spans its own task's sleep, not a sibling's shorter one
    # (the loop's timer granularity decides how long a sleep really takes).
    assert all(e.duration_ns >= slept[e.thread_id] for e in events)


@pytest.mark.parametrize("callbacks", [False, True], ids=["fast-path", "with-callback"])
def test_one_record_function_object_entered_recursively(callbacks: bool) -> None:
    # SPEC 4.1: `with r: with r:` on one instance nests two ranges, both closed.
    shared = aprof.record_function("again")
    handle = aprof.add_global_callback(aprof.RecordFunctionCallback(lambda rf: None)) if callbacks else None
    try:
        with aprof.profile() as prof, shared, shared:
            aprof.mark("inside")
    finally:
        if handle is not None:
            aprof.remove_callback(handle)
    outer, inner, mark = prof.events()
    assert (outer.name, inner.name, mark.name) == ("again", "again", "inside")
    assert inner.parent is outer
    assert [(e.unfinished, e.is_async) for e in (outer, inner)] == [(False, False)] * 2


def test_explicit_start_and_end_in_one_thread() -> None:
    # SPEC 4.3
    with aprof.profile() as prof:
        r = aprof.record_function("manual")
        assert r.start() is r
        with aprof.record_function("inside"):
            pass
        r.end()
    manual, inside = one(prof, "manual"), one(prof, "inside")
    assert (manual.is_async, manual.unfinished) == (False, False)
    assert manual.end_thread_id == manual.thread_id
    assert inside.parent is manual


def test_range_started_in_one_task_ended_in_another(backend, tmp_path: Path) -> None:
    # SPEC 4.3, 6.3, CP-09: one event, async, on the starting track, naming
    # the ending task; the starting task's later ranges still nest.
    ids: dict[str, int] = {}

    async def ender(r: aprof.record_function) -> None:
        ids["ender"] = aprof.current_thread_id()
        with aprof.record_function("ender-work"):
            await backend.sleep(0.001)
        r.end()

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            ids["main"] = aprof.current_thread_id()
            with aprof.record_function("enclosing"):
                r = aprof.record_function("handed").start()
                async with backend.group() as g:
                    g.start_soon(ender, r)
            with aprof.record_function("later"), aprof.record_function("later-inner"):
                await backend.checkpoint()
        return prof

    prof = backend.run(main)
    handed = one(prof, "handed")
    assert handed.is_async is True
    assert handed.thread_id == ids["main"]
    assert handed.end_thread_id == ids["ender"] != ids["main"]
    assert handed.unfinished is False
    assert handed.end_ns >= one(prof, "ender-work").end_ns
    # It ended inside the range it started in, and is still nobody's child.
    enclosing = one(prof, "enclosing")
    assert handed.parent is enclosing
    assert enclosing.children == []
    assert handed.end_ns <= enclosing.end_ns
    later, later_inner = one(prof, "later"), one(prof, "later-inner")
    assert later.parent is None
    assert later.children == [later_inner]
    assert not later.is_async
    assert not later_inner.is_async
    assert one(prof, "ender-work").thread_id == ids["ender"]
    assert [e.name for e in user_events(prof)].count("handed") == 1
    prof.export_chrome_trace(tmp_path / "t.json")
    doc = validate_trace(tmp_path / "t.json")
    slices = [e for e in doc["traceEvents"] if e.get("name") == "handed"]
    assert sorted(e["ph"] for e in slices) == ["b", "e"]
    assert {e["tid"] for e in slices} == {ids["main"]}


def test_range_ended_in_a_worker_thread(backend) -> None:
    # SPEC 4.3, 6.3, CP-09: the end may come from another OS thread.
    ids: dict[str, int] = {}

    def end_it(r: aprof.record_function) -> None:
        ids["worker"] = aprof.current_thread_id()
        r.end()

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            ids["main"] = aprof.current_thread_id()
            with aprof.record_function("enclosing"):
                r = aprof.record_function("to-thread").start()
                await backend.to_thread(end_it, r)
                t = threading.Thread(target=end_it, args=(aprof.record_function("plain-thread").start(),))
                t.start()
                t.join()
        return prof

    prof = backend.run(main)
    for name in ("to-thread", "plain-thread"):
        ev = one(prof, name)
        assert ev.is_async is True
        assert ev.thread_id == ids["main"]
        assert ev.end_thread_id not in (0, ids["main"])
        assert not ev.unfinished
        assert ev.parent is one(prof, "enclosing")
        assert ev not in ev.parent.children
    assert one(prof, "plain-thread").end_thread_id == ids["worker"]


@pytest.mark.parametrize("path", ["fast", "with-callback"])
def test_end_twice_in_two_tasks_is_one_event(backend, path: str) -> None:
    # SPEC 3.5, 4.3, CP-10: end() in A and again in B: one event, ended by A,
    # one end callback.
    ends: list[str] = []
    handle = None
    if path == "with-callback":
        cb = aprof.RecordFunctionCallback(lambda rf: None, lambda rf, ctx: ends.append(rf.name))
        handle = aprof.add_global_callback(cb.scopes({USER}))
    ids: dict[str, int] = {}

    async def second(r: aprof.record_function) -> None:
        r.end()
        r.end()

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            ids["main"] = aprof.current_thread_id()
            r = aprof.record_function("twice").start()
            await backend.checkpoint()
            r.end()
            async with backend.group() as g:
                g.start_soon(second, r)
            r.end()
        return prof

    try:
        prof = backend.run(main)
    finally:
        if handle is not None:
            aprof.remove_callback(handle)
    ev = one(prof, "twice")
    assert (ev.is_async, ev.unfinished) == (False, False)
    assert ev.end_thread_id == ids["main"]
    if path == "with-callback":
        assert ends == ["twice"]


def test_low_level_end_is_idempotent() -> None:
    # SPEC 3.5, CP-10: RecordFunction.end() repeated: one end callback, one event.
    ends: list[str] = []
    handle = aprof.add_global_callback(
        aprof.RecordFunctionCallback(lambda rf: None, lambda rf, ctx: ends.append(rf.name))
    )
    try:
        with aprof.profile() as prof:
            rf = aprof.RecordFunction()
            rf.before("low")
            for _ in range(3):
                rf.end()
    finally:
        aprof.remove_callback(handle)
    assert ends == ["low"]
    assert [e.name for e in prof.events()] == ["low"]


# ---------------------------------------------------------------------------
# CP-11: out-of-order exits in one task
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["fast", "with-callback"])
def test_out_of_order_exits_follow_the_documented_rule(path: str, tmp_path: Path) -> None:
    # SPEC 6.2, CP-11: enter X, enter Y, exit X, exit Y. The documented rule
    # (aprof/_post/_events.py, docs/guide.md): Y, started later and outliving
    # its enclosing X, becomes an async slice; X keeps its place; the track
    # still nests and the export validates.
    handle = None
    if path == "with-callback":
        handle = aprof.add_global_callback(aprof.RecordFunctionCallback(lambda rf: None))
    try:
        with aprof.profile() as prof:
            x = aprof.record_function("X")
            y = aprof.record_function("Y")
            x.__enter__()
            y.__enter__()
            with aprof.record_function("in-both"):
                pass
            x.__exit__(None, None, None)
            with aprof.record_function("in-Y-only"):
                pass
            y.__exit__(None, None, None)
            with aprof.record_function("after"):
                pass
    finally:
        if handle is not None:
            aprof.remove_callback(handle)
    X, Y = one(prof, "X"), one(prof, "Y")
    assert X.start_ns <= Y.start_ns <= X.end_ns <= Y.end_ns
    assert (X.is_async, Y.is_async) == (False, True)
    assert not X.unfinished
    assert not Y.unfinished
    assert X.parent is None
    assert Y.parent is X
    assert Y not in X.children
    assert Y.end_thread_id == Y.thread_id == X.thread_id
    # Ranges opened meanwhile still nest in the synchronous ranges.
    assert one(prof, "in-both").parent is X
    assert one(prof, "in-Y-only").parent is None
    assert one(prof, "after").parent is None
    prof.export_chrome_trace(tmp_path / "t.json")
    doc = validate_trace(tmp_path / "t.json")
    phases = {e["name"]: [] for e in doc["traceEvents"] if e.get("name") in ("X", "Y")}
    for e in doc["traceEvents"]:
        if e.get("name") in phases:
            phases[e["name"]].append(e["ph"])
    assert phases == {"X": ["X"], "Y": ["b", "e"]}


# ---------------------------------------------------------------------------
# CP-12: a range across an async generator's yields
# ---------------------------------------------------------------------------


def test_async_generator_abandoned_mid_range(
    backend, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # SPEC 2.3, 4.1, CP-12: left with `break`, no aclose, then finalized by
    # the loop's asyncgen hook when collected: no error anywhere, and each
    # range ends on the originating track, with GeneratorExit or unfinished.
    async def inline(n: int) -> AsyncIterator[int]:
        with aprof.record_function("inline-range"):
            for i in range(n):
                yield i
                await backend.sleep(0)

    @aprof.record_function("decorated-range")
    async def decorated(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i
            await backend.sleep(0)

    ids: dict[str, int] = {}
    leftovers: list[Any] = []

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            ids["main"] = aprof.current_thread_id()
            for make in (inline, decorated):
                agen = make(10)
                async for i in agen:
                    if i == 2:
                        break
                # trio complains itself about the missing aclose; asyncio is silent.
                with pytest.warns(ResourceWarning, match="aclosing") if backend.is_trio else contextlib.nullcontext():
                    del agen
                    gc.collect()
                for _ in range(5):  # let the finalizer's aclose run
                    await backend.sleep(0.001)
        leftovers.append(aprof.get_debug_info(aprof.DebugInfoKind.PROFILER_STATE))
        leftovers.append(aprof.has_callbacks())
        return prof

    with collect_unraisable() as unraisable:
        prof = backend.run(main)
        gc.collect()
    assert unraisable == []
    assert leftovers == [None, False]
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert "Error" not in err
    assert [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")] == []
    for name in ("inline-range", "decorated-range"):
        ev = one(prof, name)
        assert ev.thread_id == ids["main"]
        assert ev.unfinished or ev.exception == "GeneratorExit"


def test_async_generator_collected_outside_any_loop() -> None:
    # SPEC 2.3, 4.1, CP-12: with no loop hook to finalize it, a suspended
    # async generator is closed by the GC, here in another OS thread: no
    # error, and the range ends with GeneratorExit on the originating track.
    async def inline() -> AsyncIterator[int]:
        with aprof.record_function("inline-range"):
            yield 1
            yield 2

    @aprof.record_function("decorated-range")
    async def decorated() -> AsyncIterator[int]:
        yield 1
        yield 2

    def first_item(agen: Any) -> Any:
        step = agen.__anext__()
        with pytest.raises(StopIteration) as done:
            step.send(None)
        return done.value.value

    holder: list[Any] = []
    ids: dict[str, int] = {}

    def collect_elsewhere() -> None:
        ids["collector"] = aprof.current_thread_id()
        holder.clear()
        gc.collect()

    with collect_unraisable() as unraisable, aprof.profile() as prof:
        ids["main"] = aprof.current_thread_id()
        holder.extend((inline(), decorated()))
        assert [first_item(g) for g in holder] == [1, 1]
        t = threading.Thread(target=collect_elsewhere)
        t.start()
        t.join()
    assert unraisable == []
    for name in ("inline-range", "decorated-range"):
        ev = one(prof, name)
        assert ev.thread_id == ids["main"]
        assert ev.end_thread_id == ids["collector"]
        assert ev.exception == "GeneratorExit"
        assert (ev.is_async, ev.unfinished) == (True, False)


def test_async_generator_closed_with_aclosing_ends_normally(backend) -> None:
    # SPEC 4.1, 4.2, CP-12: with contextlib.aclosing the range ends in the
    # consumer's task when the block exits: neither async nor unfinished. A
    # generator left early records the GeneratorExit that closed it (4.2);
    # one run to exhaustion records no exception.
    async def inline(n: int) -> AsyncIterator[int]:
        with aprof.record_function(f"inline-{n}"):
            for i in range(n):
                yield i
                await backend.sleep(0)

    def decorated(n: int) -> AsyncIterator[int]:
        @aprof.record_function(f"decorated-{n}")
        async def gen() -> AsyncIterator[int]:
            for i in range(n):
                yield i
                await backend.sleep(0)

        return gen()

    ids: dict[str, int] = {}
    closed_at: dict[str, int] = {}

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            ids["main"] = aprof.current_thread_id()
            for make in (inline, decorated):
                for n in (10, 3):
                    async with contextlib.aclosing(make(n)) as agen:
                        async for i in agen:
                            if i == 4:  # only the 10-item generators are left early
                                break
                    closed_at[f"{make.__name__}-{n}"] = time.perf_counter_ns()
        return prof

    prof = backend.run(main)
    for name, exception in (
        ("inline-10", "GeneratorExit"),
        ("decorated-10", "GeneratorExit"),
        ("inline-3", None),
        ("decorated-3", None),
    ):
        ev = one(prof, name)
        assert ev.thread_id == ev.end_thread_id == ids["main"]
        assert ev.exception == exception
        assert (ev.is_async, ev.unfinished) == (False, False)
        assert ev.end_ns <= closed_at[name]


# ---------------------------------------------------------------------------
# CP-06: the eager task factory (3.12+)
# ---------------------------------------------------------------------------


@pytest.mark.skipif(sys.version_info < (3, 12), reason="asyncio.eager_task_factory is new in Python 3.12")
@pytest.mark.parametrize("run", EAGER_RUNNERS)
def test_eager_first_step_lands_on_the_child_track(run: Any, tmp_path: Path) -> None:
    # SPEC 2.2, 6.2, CP-06: an eager child's first, synchronous step runs
    # inside the parent's create_task call; its ranges are the child's, and
    # the parent's open range still nests properly.
    ids: dict[str, int] = {}

    async def child(key: str, awaits: bool) -> None:
        ids[key] = aprof.current_thread_id()
        with aprof.record_function(f"{key}-first-step"):
            pass
        if awaits:
            with aprof.record_function(f"{key}-across-await"):
                await asyncio.sleep(0)

    async def main() -> aprof.profile:
        asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
        async with aprof.profile() as prof:
            ids["parent"] = aprof.current_thread_id()
            with aprof.record_function("parent"):
                t1 = asyncio.create_task(child("awaiting", True))
                t2 = asyncio.create_task(child("sync-only", False))
                assert t2.done()  # ran to completion inside create_task
                with aprof.record_function("parent-after"):
                    pass
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(child("in-group", True))
                await t1
        return prof

    prof = run(main())
    parent, after = one(prof, "parent"), one(prof, "parent-after")
    assert parent.thread_id == ids["parent"]
    assert parent.children == [after]
    assert (parent.is_async, after.is_async) == (False, False)
    for key, names in (
        ("awaiting", ["awaiting-first-step", "awaiting-across-await"]),
        ("sync-only", ["sync-only-first-step"]),
        ("in-group", ["in-group-first-step", "in-group-across-await"]),
    ):
        assert ids[key] != ids["parent"]
        task_ev = next(e for e in prof.events() if e.scope is TASK and e.thread_id == ids[key])
        for name in names:
            ev = one(prof, name)
            assert ev.thread_id == ids[key]
            assert ev.parent is task_ev
            assert (ev.is_async, ev.unfinished) == (False, False)
    prof.export_chrome_trace(tmp_path / "t.json")
    validate_trace(tmp_path / "t.json")


# ---------------------------------------------------------------------------
# 4.4: mark
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("with_callback", [False, True])
def test_mark_refuses_args_that_are_not_str(tmp_path: Path, with_callback: bool) -> None:
    # SPEC 4.4, 12 (issue 15 item 22): args is a str as for record_function;
    # an object would stay alive past stop() and break save(). The refused
    # mark records nothing, and the profile saves.
    class Payload:
        pass

    payload = Payload()
    ref = weakref.ref(payload)
    handle = aprof.add_context_callback(aprof.RecordFunctionCallback(lambda rf: None)) if with_callback else None
    try:
        with aprof.profile() as prof:
            for bad in (payload, 5, b"k=v", ["k"]):
                with pytest.raises(TypeError, match="mark: args"):
                    aprof.mark("m", args=bad)  # type: ignore[arg-type]
            aprof.mark("ok", args="k=v")
    finally:
        if handle is not None:
            aprof.remove_callback(handle)
    del payload
    gc.collect()
    assert ref() is None
    assert [(e.name, e.args) for e in prof.events()] == [("ok", "k=v")]
    prof.save(tmp_path / "run.aprof")
    assert [e.name for e in aprof.load(tmp_path / "run.aprof").events()] == ["ok"]


def test_mark_records_an_instant_in_the_enclosing_range(backend, tmp_path: Path) -> None:
    # SPEC 4.4: an instant event on the current track, inside its range.
    ids: dict[str, int] = {}

    async def child() -> None:
        ids["child"] = aprof.current_thread_id()
        aprof.mark("child-mark", args="k=v")

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            ids["main"] = aprof.current_thread_id()
            with aprof.record_function("around"):
                aprof.mark("here")
                async with backend.group() as g:
                    g.start_soon(child)
        return prof

    prof = backend.run(main)
    here, around, child_mark = one(prof, "here"), one(prof, "around"), one(prof, "child-mark")
    for ev in (here, child_mark):
        assert ev.is_instant is True
        assert ev.duration_ns == 0
        assert ev.start_ns == ev.end_ns
        assert ev.scope is USER
        assert not ev.unfinished
        assert not ev.is_async
    assert here.parent is around
    assert around.start_ns <= here.start_ns <= around.end_ns
    assert here.thread_id == ids["main"]
    assert child_mark.thread_id == ids["child"]
    assert child_mark.args == "k=v"
    prof.export_chrome_trace(tmp_path / "t.json")
    doc = validate_trace(tmp_path / "t.json")
    assert {e["name"] for e in doc["traceEvents"] if e.get("ph") == "i"} == {"here", "child-mark"}
    with pytest.raises(TypeError, match="name must be a str"):
        aprof.mark(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# BI-05: inputs that do not serialize
# ---------------------------------------------------------------------------


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


class Plain:
    pass


def test_inputs_that_do_not_serialize(tmp_path: Path) -> None:
    # SPEC 12, BI-05: record_inputs keeps reprs or placeholders, the strict
    # validator passes, and no input object outlives stop().
    loop_list: list[Any] = [1]
    loop_list.append(loop_list)
    bad, plain, a_set = BadRepr(), Plain(), {1, 2}
    refs = [weakref.ref(x) for x in (bad, plain, a_set)]
    with aprof.profile(record_inputs=True) as prof:
        rf = aprof.RecordFunction(USER)
        rf.before("odd-inputs", (object(), a_set, b"\x00\xff", math.nan, math.inf, -math.inf, loop_list, bad, plain))
        rf.end()
        del rf
    del bad, plain, a_set
    gc.collect()
    assert [r() for r in refs] == [None, None, None]

    ev = one(prof, "odd-inputs")
    assert ev.inputs is not None
    assert all(isinstance(s, str) for s in ev.inputs)
    assert ev.inputs[1:7] == ("{1, 2}", "b'\\x00\\xff'", "nan", "inf", "-inf", "[1, [...]]")
    assert "BadRepr" in ev.inputs[7]
    assert "RuntimeError" in ev.inputs[7]
    assert "Plain" in ev.inputs[8]
    prof.export_chrome_trace(tmp_path / "t.json")
    doc = validate_trace(tmp_path / "t.json")
    exported = next(e for e in doc["traceEvents"] if e.get("name") == "odd-inputs")
    assert exported["args"]["inputs"] == list(ev.inputs)
    prof.save(tmp_path / "s.aprof")
    assert next(e for e in aprof.load(tmp_path / "s.aprof").events()).inputs == ev.inputs


# ---------------------------------------------------------------------------
# LC-03: ranges dropped without an end
# ---------------------------------------------------------------------------


def test_ranges_dropped_without_end_are_unfinished_and_keep_nothing_alive() -> None:
    # SPEC 5.5, LC-03: __enter__() or start() with no end, the object
    # dropped and collected: at stop the range is closed and unfinished, and
    # nothing keeps the profile's state alive.
    prof = aprof.profile().start()
    state = aprof.get_debug_info(aprof.DebugInfoKind.PROFILER_STATE)
    assert state is not None
    state_ref = weakref.ref(state)
    del state

    def open_and_forget() -> None:
        aprof.record_function("entered").__enter__()
        aprof.record_function("started").start()
        rf = aprof.RecordFunction(USER)
        rf.before("low-level")

    open_and_forget()
    gc.collect()
    with aprof.record_function("closed"):
        pass
    prof.stop()
    stop_ns = prof.session.metadata["stop_ns"]
    for name in ("entered", "started", "low-level"):
        ev = one(prof, name)
        assert ev.unfinished is True
        assert ev.end_ns == stop_ns
    assert one(prof, "closed").unfinished is False
    events = prof.events()
    del prof
    gc.collect()
    assert state_ref() is None
    assert len(events) == 4  # the results outlive the profile object
