"""The Python tracer (SPEC 8.1-8.2; RELIABILITY FA-08, LC-06, LD-02).

Every scenario runs against both implementations of the recording half: the
C extension ``aprof._ctracer`` and its pure-Python twin (the ``impl``
fixture), and the parity test checks they record the same call trees.
"""

from __future__ import annotations

import contextvars
import subprocess
import sys
import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import aprof
from aprof._core import _tracer, _tracer_py
from aprof._post._replay import prune_filename

from .conftest import Backend, require_c_extension
from .tracecheck import validate_trace

PY = aprof.RecordScope.PYTHON_FUNCTION
HERE = "test_tracer.py"


def _use(which: str, c_calls: bool | None = None) -> Iterator[ModuleType]:
    module = _tracer_py if which == "python" else require_c_extension()
    _tracer._forced = module
    _tracer._forced_c_calls = True if which == "c, C calls" else c_calls
    try:
        yield module
    finally:
        _tracer._forced = None
        _tracer._forced_c_calls = None


@pytest.fixture(params=["c", "python", "c, C calls"])
def impl(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    """The tracer implementation with its defaults (Python frames only, which
    on 3.11 the C tracer records through a frame evaluator), and the C one
    with C calls (the profile function on 3.11, CALL events on 3.12+)."""
    yield from _use(request.param)


@pytest.fixture(params=["c", "python"])
def impl_cc(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    """The tracer implementation, recording C calls (for the tests of them)."""
    yield from _use(request.param, c_calls=True)


def py_events(prof: aprof.profile, name_part: str | None = None) -> list[aprof.FunctionEvent]:
    return [e for e in prof.events() if e.scope is PY and (name_part is None or name_part in e.name)]


def short(e: aprof.FunctionEvent) -> str:
    """'fib' from 'tests/test_tracer.py(12): fib'."""
    return e.name.rsplit(": ", 1)[-1]


def depth(e: aprof.FunctionEvent) -> int:
    d = 0
    p = e.parent
    while p is not None:
        d += 1
        p = p.parent
    return d


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def leaf() -> int:
    return 1


def middle() -> int:
    return leaf() + leaf()


def raises() -> None:
    raise KeyError("x")


def catches() -> str:
    try:
        raises()
    except KeyError:
        return "caught"
    return "no"


# -- synchronous code --------------------------------------------------------


def test_calls_are_ranges_nested_like_the_calls(impl: ModuleType) -> None:
    # SPEC 8.1
    with aprof.profile(python_tracer=True) as prof:
        middle()
    evs = py_events(prof, HERE)
    mids = [e for e in evs if short(e) == "middle"]
    assert len(mids) == 1
    mid = mids[0]
    assert [short(c) for c in mid.children] == ["leaf", "leaf"]
    for c in mid.children:
        assert mid.start_ns <= c.start_ns <= c.end_ns <= mid.end_ns
        assert not c.unfinished
        assert c.track == mid.track == threading.current_thread().name


def test_times_are_on_the_profile_clock(impl: ModuleType) -> None:
    # The tracer's clock (TSC ticks where invariant) is mapped onto
    # perf_counter_ns: every call lies inside the profile, in call order.
    with aprof.profile(python_tracer=True) as prof:
        fib(8)
    meta = prof.session.metadata
    evs = py_events(prof, "fib")
    assert len(evs) == 67
    for e in evs:
        assert meta["start_ns"] <= e.start_ns <= e.end_ns <= meta["stop_ns"]
    starts = [e.start_ns for e in evs]
    assert starts == sorted(starts)


def test_calls_nest_in_the_ranges_around_them(impl: ModuleType) -> None:
    # SPEC 8.1: the tracer's times and the ranges' times are one clock. A
    # call made inside a range lies inside it; a calibration of the TSC read
    # across a preemption shifted every call against the ranges (seen as
    # calls outliving their range, flagged async, on a loaded machine).
    with aprof.profile(python_tracer=True) as prof:
        for _ in range(300):
            with aprof.record_function("around"):
                leaf()
    ranges = [e for e in prof.events() if e.name == "around"]
    assert len(ranges) == 300
    for r in ranges:
        calls = [c for c in r.children if short(c) == "leaf"]
        assert len(calls) == 1, r.children
        assert r.start_ns <= calls[0].start_ns <= calls[0].end_ns <= r.end_ns
        assert not calls[0].is_async


def test_global_scope_traces_every_thread(impl: ModuleType) -> None:
    # SPEC 5.3 with the tracer: a thread that does not carry the context.
    def outside() -> None:
        leaf()

    with aprof.profile(python_tracer=True, scope="global") as prof:
        th = threading.Thread(target=outside, name="plain-thread")
        th.start()
        th.join()
    evs = [e for e in py_events(prof, HERE) if short(e) == "leaf"]
    assert [e.track for e in evs] == ["plain-thread"]


def test_c_calls_are_recorded_when_asked(impl_cc: ModuleType) -> None:
    # SPEC 8.1: "C calls only with c_calls=True"
    def uses_builtins() -> int:
        return len(sorted([3, 1, 2]))

    with aprof.profile(python_tracer=True) as prof:
        uses_builtins()
    (outer,) = [e for e in py_events(prof, HERE) if short(e) == "test_c_calls_are_recorded_when_asked.<locals>.uses_builtins"]
    names = {c.name for c in outer.children}
    assert "<built-in method len>" in names
    assert "<built-in method sorted>" in names


@pytest.mark.parametrize("which", ["c", "python"])
def test_python_frames_only_is_the_default(which: str) -> None:
    # SPEC 8.1: "Python frames only is the default"
    def uses_builtins() -> int:
        return len(sorted([3, 1, 2]))

    use = _use(which)
    next(use)
    try:
        assert aprof.profile(python_tracer=True).c_calls is False
        with aprof.profile(python_tracer=True) as prof:
            uses_builtins()
    finally:
        use.close()
    (outer,) = [e for e in py_events(prof, HERE) if short(e).endswith("<locals>.uses_builtins")]
    assert outer.children == []
    assert not [e for e in py_events(prof) if e.name.startswith("<built-in")]


def test_parity_between_c_and_python(impl: ModuleType) -> None:
    # Both implementations record the same Python call tree.
    c_module = require_c_extension()
    shapes = []
    for module in (c_module, _tracer_py):
        _tracer._forced = module
        with aprof.profile(python_tracer=True) as prof:
            fib(6)
            catches()
        shapes.append([(short(e), depth(e)) for e in py_events(prof, HERE)])
    assert shapes[0] == shapes[1]
    assert sum(1 for name, _ in shapes[0] if name == "fib") == 25


def _gen(n: int) -> Iterator[int]:
    yield from range(n)


def _c_and_python() -> int:
    made = _gen(2)  # made, never run: not a call of _gen (no frame)
    del made
    total = sum(_gen(3)) + len(sorted([3, 1, 2]))
    catches()
    return total + fib(4)


def _python_tree(prof: aprof.profile) -> list[tuple[str, int]]:
    """(name, depth among Python frames) of this file's frames, in order."""
    out = []
    for e in py_events(prof, HERE):
        d, p = 0, e.parent
        while p is not None:
            d += p.scope is PY and not p.name.startswith("<built-in")
            p = p.parent
        out.append((short(e), d))
    return out


@pytest.mark.parametrize("which", ["c", "python"])
def test_without_c_calls_the_python_frames_are_the_same(which: str) -> None:
    # SPEC 8.1 with c_calls=False: the same Python call tree as with C calls,
    # and no C call (on 3.11 the C tracer gets the frames from another hook).
    use = _use(which)
    next(use)
    try:
        trees, builtins = [], []
        for c_calls in (True, False):
            with aprof.profile(python_tracer=True, c_calls=c_calls) as prof:
                _c_and_python()
            trees.append(_python_tree(prof))
            builtins.append([e.name for e in py_events(prof) if e.name.startswith("<built-in")])
    finally:
        use.close()
    assert trees[0] == trees[1]
    # sum() ran one _gen for 4 steps. Making the other was no call; dropping
    # it unstarted is a step on 3.11 only (it is closed by a throw).
    assert [n for n, _ in trees[1]].count("_gen") == (5 if sys.version_info < (3, 12) else 4)
    assert "<built-in method sorted>" in builtins[0]
    assert builtins[1] == []


def test_an_exception_leaving_traced_frames_reaches_the_caller_unchanged(impl: ModuleType) -> None:
    # A failure in the profiled code is the user's, whole: the tracer records
    # the frames it leaves and hands the same exception on.
    err = ValueError("boom")

    def deep() -> None:
        raise err

    def mid() -> None:
        deep()

    with pytest.raises(ValueError, match="boom") as info, aprof.profile(python_tracer=True) as prof:
        mid()
    assert info.value is err
    (d,) = [e for e in py_events(prof, HERE) if short(e).endswith("deep")]
    (m,) = [e for e in py_events(prof, HERE) if short(e).endswith("mid")]
    assert d.parent is m
    assert not d.unfinished
    assert not m.unfinished


def _recurse(n: int) -> int:
    return 0 if n == 0 else 1 + _recurse(n - 1)


def test_a_recursion_deeper_than_the_c_stack_is_traced_whole(impl: ModuleType) -> None:
    # Plain 3.11 and 3.12 run a recursion this deep in a raised recursion
    # limit without C stack. Under the frame evaluator (3.11 and 3.12, no C
    # calls) every call is a C call: the tracer hands over (to the profile
    # function on 3.11, to sys.monitoring callbacks on 3.12) before the C
    # stack overflows, says so, and keeps every frame.
    n = 30_000
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(n + 500)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with aprof.profile(python_tracer=True) as prof:
                assert _recurse(n) == n
    finally:
        sys.setrecursionlimit(limit)
    evs = sorted((e for e in py_events(prof, HERE) if short(e) == "_recurse"), key=lambda e: e.start_ns)
    assert len(evs) == n + 1
    assert not [e for e in evs if e.unfinished]
    assert all(inner.parent is outer for outer, inner in zip(evs, evs[1:], strict=False))
    evaluator = impl is not _tracer_py and not _tracer._forced_c_calls and sys.version_info < (3, 13)
    assert any("ran the C stack low" in str(w.message) for w in caught) == evaluator
    if sys.version_info >= (3, 12):  # the hand-over's callbacks went with the profile
        mon: Any = sys.monitoring  # type: ignore[attr-defined]
        assert mon.get_tool(mon.PROFILER_ID) is None
    # The next profile starts afresh, on the evaluator again where it has one.
    with aprof.profile(python_tracer=True) as prof:
        middle()
    assert [short(e) for e in py_events(prof, HERE) if short(e) in ("middle", "leaf")] == ["middle", "leaf", "leaf"]
    run = _tracer.TracerRun(None, c_calls=bool(_tracer._forced_c_calls))
    assert run.evaluator == evaluator


_SMALL_STACK_PROGRAM = """
import threading, warnings, aprof
def rec(n): return 0 if n == 0 else 1 + rec(n - 1)
out = []
def work():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with aprof.profile(python_tracer=True) as prof:
            out.append(rec(900))
    out.append(len([e for e in prof.events() if e.name.endswith(": rec")]))
    out.append(any("C stack low" in str(w.message) for w in caught))
threading.stack_size(256 * 1024)
t = threading.Thread(target=work)
t.start()
t.join()
print(out)
"""


def test_a_thread_with_a_small_stack_is_traced_whole(tmp_path: Path) -> None:
    # SPEC 15.6 with a small thread stack (threading.stack_size(256 KiB)):
    # plain Python runs this recursion without C stack; under the evaluator
    # (3.11, 3.12) every traced call is a C call, so the tracer hands over at
    # half such a stack (it used to wait for 2,000 levels, past its end:
    # SIGSEGV on 3.11).
    require_c_extension()
    script = tmp_path / "small_stack.py"
    script.write_text(_SMALL_STACK_PROGRAM)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str([900, 901, sys.version_info < (3, 13)])


def _deepest(n: int = 0) -> int:
    try:
        return _deepest(n + 1)
    except RecursionError:
        return n


@pytest.mark.parametrize("which", ["c", "c, C calls"])
def test_a_recursion_fails_at_the_depth_it_fails_without_the_profile(which: str) -> None:
    # SPEC 15.6: the recursion limit a program meets is the same with the C
    # tracer. (3.12's evaluator entry charges the C recursion counter, 1,500
    # units that sys.setrecursionlimit does not raise; the tracer gives them
    # back for the frame's duration. The twin's Python callbacks use a few
    # levels of the limit themselves.)
    plain = _deepest()
    use = _use(which)
    next(use)
    try:
        with aprof.profile(python_tracer=True) as prof:
            traced = _deepest()
    finally:
        use.close()
    assert traced == plain
    assert len([e for e in py_events(prof, HERE) if short(e) == "_deepest"]) == plain + 1


def test_c_calls_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="c_calls"):
        aprof.profile(python_tracer=True, c_calls="no")  # type: ignore[arg-type]


def test_another_frame_evaluator_is_refused_with_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # RELIABILITY FA-08 for the hook of 3.11 and 3.12 without C calls: a PEP
    # 523 frame evaluator that another tool installed (a debugger,
    # torch.compile).
    c = require_c_extension()
    real = c.foreign_frame_evaluator
    assert real() is None  # the default one
    with aprof.profile(python_tracer=True, c_calls=False):
        assert real() is None  # aprof's own is not foreign
    monkeypatch.setattr(c, "foreign_frame_evaluator", lambda: "the function at 0x1234")
    prof = aprof.profile(python_tracer=True, c_calls=False)
    if sys.version_info < (3, 13):
        with pytest.raises(RuntimeError, match=r"frame evaluator \(PEP 523.*the function at 0x1234.*c_calls=True"):
            prof.start()
        assert not _tracer.running()
        assert real() is None  # nothing was installed
        if sys.version_info >= (3, 12):  # nor the sys.monitoring id kept
            mon: Any = sys.monitoring  # type: ignore[attr-defined]
            assert mon.get_tool(mon.PROFILER_ID) is None
    else:  # 3.13 records frames through sys.monitoring, no evaluator
        prof.start()
        leaf()
        prof.stop()
        assert "leaf" in [short(e) for e in py_events(prof, HERE)]


def test_exceptions_close_the_frames_they_leave(impl: ModuleType) -> None:
    # SPEC 8.1: a frame left by an exception ends there, not at stop.
    with aprof.profile(python_tracer=True) as prof:
        catches()
        leaf()
    (r,) = [e for e in py_events(prof, HERE) if short(e) == "raises"]
    (c,) = [e for e in py_events(prof, HERE) if short(e) == "catches"]
    (lf,) = [e for e in py_events(prof, HERE) if short(e) == "leaf"]
    assert not r.unfinished
    assert not c.unfinished
    assert r.parent is c
    assert r.end_ns <= c.end_ns <= lf.start_ns
    if sys.version_info >= (3, 12):  # PY_UNWIND passes the exception; 3.11's profile hook does not
        assert r.exception == "KeyError"
    assert c.exception is None


def _starts_profile(prof: aprof.profile) -> None:
    prof.start()
    leaf()


def _stops_profile(prof: aprof.profile) -> None:
    leaf()
    prof.stop()


def _live_at_start(prof: aprof.profile) -> None:
    _starts_profile(prof)
    leaf()


def _live_at_stop(prof: aprof.profile) -> None:
    leaf()
    _stops_profile(prof)


def test_frames_live_at_start_are_included_and_open_ones_closed_at_stop(impl: ModuleType) -> None:
    # RELIABILITY LC-06: started with frames on the stack, stopped inside others.
    prof = aprof.profile(python_tracer=True)
    _live_at_start(prof)
    _live_at_stop(prof)
    evs = py_events(prof, HERE)
    by_name = {short(e): e for e in evs}
    started = by_name["_live_at_start"]
    assert not started.unfinished  # its return was seen
    assert started.start_ns >= prof.session.metadata["start_ns"]
    assert [short(c) for c in started.children] == ["_starts_profile", "leaf"]
    stopped = by_name["_live_at_stop"]
    assert stopped.unfinished  # still running when the profile stopped
    assert stopped.end_ns == prof.session.metadata["stop_ns"]
    # The test function itself was on the stack for the whole profile.
    (test_fn,) = [e for e in evs if short(e).startswith("test_frames_live_at_start")]
    assert test_fn.unfinished


def _starts_via_c(prof: aprof.profile) -> None:
    list(map(_live_at_start, [prof]))  # a C function calls the frame the profile starts in
    middle()


def test_frames_live_at_start_called_from_c_close_when_their_caller_moves_on(impl: ModuleType) -> None:
    # LC-06 across a C call: on 3.12 the frames between map() and the frame
    # it calls hold an entry frame of the C stack. The frame map() called
    # returns unseen by the evaluator; its caller's next call closes it there.
    prof = aprof.profile(python_tracer=True)
    _starts_via_c(prof)
    prof.stop()
    evs = py_events(prof, HERE)

    def kids(e: aprof.FunctionEvent) -> list[str]:
        return [short(c) for c in e.children if HERE in c.name]

    (started,) = [e for e in evs if short(e) == "_live_at_start"]
    assert not started.unfinished
    assert kids(started) == ["_starts_profile", "leaf"]
    (outer,) = [e for e in evs if short(e) == "_starts_via_c"]
    assert not outer.unfinished  # it returned before the stop
    assert kids(outer) == ["_live_at_start", "middle"]
    assert started.end_ns <= [c for c in outer.children if short(c) == "middle"][0].start_ns
    assert started.parent is outer


def _gen_thrown_into() -> Iterator[int]:
    try:
        yield 1
    except KeyError:
        leaf()
        yield 2
    finally:
        leaf()


def test_generators_thrown_into_and_closed_are_traced_per_step(impl: ModuleType) -> None:
    # SPEC 8.1: throw() and close() resume the generator's frame (the
    # evaluator is entered with the exception to raise already set); each
    # is a step of its own, closed when the frame yields or unwinds.
    with aprof.profile(python_tracer=True) as prof:
        g = _gen_thrown_into()
        assert next(g) == 1
        assert g.throw(KeyError("k")) == 2
        g.close()
    steps = sorted((e for e in py_events(prof, HERE) if short(e) == "_gen_thrown_into"), key=lambda e: e.start_ns)
    assert [[short(c) for c in e.children if HERE in c.name] for e in steps] == [[], ["leaf"], ["leaf"]]
    assert not [e for e in steps if e.unfinished]


def test_only_the_profiled_context_is_recorded(impl: ModuleType) -> None:
    # SPEC 5.2 applied to the tracer: a thread running another context is not traced.
    done = threading.Event()

    def outside() -> None:
        leaf()
        done.set()

    with aprof.profile(python_tracer=True) as prof:
        th = threading.Thread(target=outside)  # a plain Thread does not carry the context
        th.start()
        th.join()
        middle()
    assert done.is_set()
    names = [short(e) for e in py_events(prof, HERE)]
    assert "test_only_the_profiled_context_is_recorded.<locals>.outside" not in names
    assert names.count("middle") == 1


def test_threads_started_mid_profile_are_traced_on_their_track(impl: ModuleType) -> None:
    # SPEC 8.1: threads started while the tracer runs, carrying the context.
    def work() -> None:
        middle()

    hook = getattr(threading, "_profile_hook", None)
    with aprof.profile(python_tracer=True) as prof:
        th = threading.Thread(target=aprof.wrap(work), name="worker-7")
        th.start()
        th.join()
    assert getattr(threading, "_profile_hook", None) is hook  # restored at stop
    evs = [e for e in py_events(prof, HERE) if short(e) == "middle"]
    assert len(evs) == 1
    assert evs[0].track == "worker-7"
    assert [short(c) for c in evs[0].children] == ["leaf", "leaf"]


def test_bounded_buffer_counts_what_it_drops(impl: ModuleType, tmp_path: Path) -> None:
    # RELIABILITY LD-02: a cap on raw events, a dropped count, a loadable trace,
    # and the next profile records normally.
    with aprof.profile(python_tracer=True, max_events=100) as prof:
        fib(12)  # 465 calls: 930 events
    assert prof.session.dropped > 700
    assert 0 < len(py_events(prof, "fib")) <= 50
    out = tmp_path / "t.json"
    prof.export_chrome_trace(out)
    validate_trace(out)
    with aprof.profile(python_tracer=True) as again:
        fib(5)
    assert again.session.dropped == 0
    assert len(py_events(again, "fib")) == 15


def _bare_tracer(impl: ModuleType, max_events: int = 0, keep_latest: bool = False) -> Any:
    """A recording half on its own, recording every context (no profile)."""
    from aprof._core._callbacks import RF_STATE

    lt, ignore = _tracer.TRACER_LT, _tracer.APROF_DIR
    return impl.Tracer(RF_STATE, None, lt, _tracer._starting_thread_lt, ignore, max_events, keep_latest=keep_latest)


def test_a_bounded_buffer_keeps_exactly_the_first_max_events(impl: ModuleType) -> None:
    # RELIABILITY LD-02, at the buffer: the first event of the thread is its
    # SWITCH, then one event per call; past the cap every event is counted.
    # (25 frames on the stack at start: the buffer's path on every version.)
    t = _bare_tracer(impl, max_events=10)
    t.start([leaf.__code__] * 25)
    t.stop()
    assert t.count == 10
    # 16 dropped; the C call to t.stop() itself, which 3.11's profile
    # function sees, is aprof's own method and not recorded.
    assert t.dropped == 16


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring is new in 3.12")
def test_aprofs_own_code_is_switched_off_where_monitoring_allows_it(impl_cc: ModuleType) -> None:
    # aprof's own frames are never recorded, so their locations are switched
    # off (DISABLE) and cost nothing after their first event. PY_THROW,
    # PY_UNWIND, C_RETURN and C_RAISE refuse DISABLE (sys.monitoring raises
    # into the running code), so those hooks never return it.
    disable = sys.monitoring.DISABLE  # type: ignore[attr-defined]
    own = _tracer.publish_task.__code__
    user = leaf.__code__
    exc = KeyError("x")
    t = _bare_tracer(impl_cc)
    t.start([])
    try:
        assert t.py_start(own, 0) is disable
        assert t.py_resume(own, 0) is disable
        assert t.py_return(own, 0, None) is disable
        assert t.py_yield(own, 0, None) is disable
        assert t.call(own, 0, len, "ab") is disable
        assert t.py_throw(own, 0, exc) is None
        assert t.py_unwind(own, 0, exc) is None
        assert t.c_return(own, 0, len, "ab") is None
        assert t.c_raise(own, 0, len, "ab") is None
        assert t.py_start(user, 0) is None
        assert t.py_return(user, 0, None) is None
        assert t.call(user, 0, len, "ab") is None
        assert t.c_return(user, 0, len, "ab") is None
        assert t.call(user, 0, leaf, None) is disable  # a Python callee gets PY_START
    finally:
        t.stop()
    assert t.py_start(own, 0) is None  # stopped: nothing is decided any more
    # Recorded: the thread's SWITCH, then leaf's start and return, and len's
    # call and return; nothing of aprof's code.
    assert t.count == 5


def test_the_c_hooks_refuse_calls_sys_monitoring_never_makes() -> None:
    ext = require_c_extension()
    if sys.version_info < (3, 12):
        assert not hasattr(ext.Tracer, "py_start")  # 3.11 installs a C profile function instead
        return
    t = _bare_tracer(ext)
    hook = t.py_start
    assert repr(hook) == "<aprof tracer hook py_start>"
    assert repr(t.c_raise) == "<aprof tracer hook c_raise>"
    with pytest.raises(TypeError, match=r"hook py_start: expected \(code, offset\)"):
        hook("not code", 0)
    with pytest.raises(TypeError, match="hook py_start"):
        hook(leaf.__code__)
    with pytest.raises(TypeError, match=r"hook call: expected \(code, offset, callable, arg0\)"):
        t.call(leaf.__code__, 0)
    with pytest.raises(TypeError, match="hook py_return"):
        t.py_return(code=leaf.__code__, offset=0, retval=None)
    assert t.count == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
def test_max_events_is_checked(bad: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="max_events"):
        aprof.profile(python_tracer=True, max_events=bad)


def test_chrome_export_of_traced_calls(impl: ModuleType, tmp_path: Path) -> None:
    with aprof.profile(python_tracer=True) as prof:
        with aprof.record_function("outer-range"):
            middle()
    out = tmp_path / "t.json"
    prof.export_chrome_trace(out)
    validate_trace(out)
    (rng,) = [e for e in prof.events() if e.name == "outer-range"]
    assert any(short(c) == "middle" for c in rng.children)


def test_file_names_are_pruned() -> None:
    # SPEC 8.2
    assert prune_filename("/x/lib/python3.11/site-packages/anyio/_core/_tasks.py") == "anyio/_core/_tasks.py"
    assert prune_filename("/usr/lib/python3/dist-packages/foo/bar.py") == "foo/bar.py"
    assert prune_filename(str(Path.cwd() / "pkg" / "mod.py")) == str(Path("pkg") / "mod.py")
    assert prune_filename("/elsewhere/mod.py") == "/elsewhere/mod.py"


def test_aprof_frames_are_not_traced(impl: ModuleType) -> None:
    with aprof.profile(python_tracer=True) as prof, aprof.record_function("r"):
        leaf()
    assert not [e for e in py_events(prof) if "aprof/" in e.name and "tests" not in e.name]


def test_one_tracer_at_a_time(impl: ModuleType) -> None:
    def inner() -> None:
        with aprof.profile(python_tracer=True):
            pass

    with aprof.profile(python_tracer=True):
        errors: list[BaseException] = []

        def run() -> None:
            try:
                inner()
            except RuntimeError as exc:
                errors.append(exc)

        th = threading.Thread(target=run)
        th.start()
        th.join()
    assert len(errors) == 1
    assert "only one Python tracer" in str(errors[0])


# -- foreign hooks (FA-08) -----------------------------------------------------


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.11 uses the sys.setprofile hook")
def test_foreign_setprofile_is_refused_with_its_name(impl_cc: ModuleType) -> None:
    # RELIABILITY FA-08
    def foreign(frame: Any, event: str, arg: Any) -> None:
        pass

    sys.setprofile(foreign)
    try:
        with pytest.raises(RuntimeError, match="sys.setprofile.*foreign"):
            aprof.profile(python_tracer=True).start()
        assert sys.getprofile() is foreign
    finally:
        sys.setprofile(None)
    assert aprof.get_debug_info(aprof.DebugInfoKind.PROFILER_STATE) is None


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring is new in 3.12")
def test_monitoring_id_taken_is_refused_with_its_name(impl: ModuleType) -> None:
    # RELIABILITY FA-08: cProfile (or anyone) holding PROFILER_ID.
    mon: Any = sys.monitoring  # type: ignore[attr-defined]
    mon.use_tool_id(mon.PROFILER_ID, "some-other-profiler")
    try:
        with pytest.raises(RuntimeError, match="some-other-profiler"):
            aprof.profile(python_tracer=True).start()
        assert mon.get_tool(mon.PROFILER_ID) == "some-other-profiler"
    finally:
        mon.free_tool_id(mon.PROFILER_ID)
    assert aprof.get_debug_info(aprof.DebugInfoKind.PROFILER_STATE) is None


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring is new in 3.12")
def test_cprofile_holding_the_id_is_named(impl: ModuleType) -> None:
    import cProfile

    pr = cProfile.Profile()
    pr.enable()
    try:
        with pytest.raises(RuntimeError, match="cProfile"):
            aprof.profile(python_tracer=True).start()
    finally:
        pr.disable()


def test_coverage_style_settrace_keeps_running(impl: ModuleType) -> None:
    # RELIABILITY FA-08: a sys.settrace hook is chained (both see the code)
    # and is still in place after stop.
    seen: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            seen.append(frame.f_code.co_name)
        return None

    sys.settrace(tracer)
    try:
        with aprof.profile(python_tracer=True) as prof:
            middle()
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)
    assert "middle" in seen
    assert [short(e) for e in py_events(prof, HERE)].count("leaf") == 2


# -- async (every backend) ---------------------------------------------------


async def agen(backend: Backend, n: int) -> AsyncIterator[int]:
    for i in range(n):
        await backend.checkpoint()
        yield leaf() + i


async def consume(backend: Backend) -> int:
    total = 0
    async for v in agen(backend, 3):
        total += v
    return total


async def child(backend: Backend) -> None:
    leaf()
    await backend.checkpoint()
    middle()


def test_coroutine_frames_land_on_their_task_track(impl: ModuleType, backend: Backend) -> None:
    # SPEC 8.1: a coroutine's frames on its task's track, each suspension
    # closing the frame and each resumption reopening it (LC-06).
    async def main() -> aprof.profile:
        async with aprof.profile(python_tracer=True) as prof:
            async with backend.group() as g:
                g.start_soon(child, backend)
                g.start_soon(child, backend)
        return prof

    prof = backend.run(main)
    tasks = [e for e in prof.events() if e.scope is aprof.RecordScope.TASK]
    task_tracks = {e.thread_id for e in tasks if "child" in (e.extra or {}).get("coro", "")}
    assert len(task_tracks) == 2
    slices = [e for e in py_events(prof, HERE) if short(e) == "child"]
    assert {e.thread_id for e in slices} == task_tracks
    for track in task_tracks:
        mine = sorted((e for e in slices if e.thread_id == track), key=lambda e: e.start_ns)
        assert len(mine) >= 2  # suspended at the checkpoint, resumed after
        assert all(a.end_ns <= b.start_ns for a, b in zip(mine, mine[1:], strict=False))
        assert any(short(c) == "middle" for e in mine for c in e.children)
        assert all(not e.unfinished for e in mine)


class _Stop(Exception):
    pass


async def _cancelled_child(backend: Backend, started: list[int]) -> None:
    try:
        started.append(1)
        await backend.sleep(60)
    finally:
        leaf()


def test_a_cancelled_coroutine_is_traced_to_its_unwind(impl: ModuleType, backend: Backend) -> None:
    # SPEC 8.1: cancelling a task resumes its coroutine with the cancellation
    # (a throw() on asyncio); the step that unwinds is on the task's track,
    # holds what its finally block calls, and is closed.
    async def cancel_one() -> None:
        started: list[int] = []
        async with backend.group() as g:
            g.start_soon(_cancelled_child, backend, started)
            while not started:
                await backend.checkpoint()
            raise _Stop

    async def main() -> aprof.profile:
        async with aprof.profile(python_tracer=True) as prof:
            with pytest.raises((_Stop, BaseExceptionGroup)) as info:  # a group wraps it on some backends
                await cancel_one()
            assert isinstance(info.value, _Stop) or info.value.subgroup(_Stop) is not None
        return prof

    prof = backend.run(main)
    steps = sorted(
        (e for e in py_events(prof, HERE) if short(e) == "_cancelled_child"), key=lambda e: e.start_ns
    )
    assert len(steps) >= 2  # started, suspended in the sleep, resumed to unwind
    assert len({e.thread_id for e in steps}) == 1
    assert [short(c) for c in steps[-1].children if HERE in c.name] == ["leaf"]
    assert not [e for e in steps if e.unfinished]


def test_async_generators_are_traced_per_step(impl: ModuleType, backend: Backend) -> None:
    async def main() -> tuple[aprof.profile, int]:
        async with aprof.profile(python_tracer=True) as prof:
            total = await consume(backend)
        return prof, total

    prof, total = backend.run(main)
    assert total == 6
    steps = [e for e in py_events(prof, HERE) if short(e) == "agen"]
    assert len(steps) >= 4  # three yields and the final step, at least
    track = steps[0].track
    assert all(e.track == track for e in steps)
    assert sum(1 for e in steps for c in e.children if short(c) == "leaf") == 3


def test_task_that_started_the_profile_keeps_its_frames(impl: ModuleType, backend: Backend) -> None:
    # LC-06 in a task: the coroutine running at start is on the task's
    # track; it is suspended and resumed during the profile.
    async def main() -> tuple[aprof.profile, int]:
        prof = aprof.profile(python_tracer=True)
        prof.start()
        await backend.checkpoint()
        leaf()
        prof.stop()
        return prof, aprof.current_thread_id()

    prof, tid = backend.run(main)
    mains = [e for e in py_events(prof, HERE) if short(e).endswith("<locals>.main")]
    assert mains, [e.name for e in py_events(prof)]
    assert all(e.thread_id == tid for e in mains)
    assert mains[-1].unfinished  # still running at stop
    assert any(short(c) == "leaf" for c in mains[-1].children)


# -- lifecycle -------------------------------------------------------------------


def test_schedule_cycles_each_get_a_tracer(impl: ModuleType) -> None:
    # SPEC 5.6 with the tracer: warmup calls are dropped, active ones kept.
    ready: list[int] = []

    def on_ready(p: aprof.profile) -> None:
        ready.append(len([e for e in py_events(p, HERE) if short(e) == "leaf"]))

    sched = aprof.schedule(wait=0, warmup=1, active=1, repeat=2)
    with aprof.profile(python_tracer=True, schedule=sched, on_trace_ready=on_ready) as prof:
        for _ in range(4):
            leaf()
            prof.step()
    assert ready == [1, 1]


def _steps_inside(prof: aprof.profile, depth: int) -> None:
    if depth:
        _steps_inside(prof, depth - 1)
        leaf()
    else:
        prof.step()


def test_a_frame_that_steps_the_schedule_closes_once_in_the_next_cycle(impl: ModuleType) -> None:
    # Each cycle starts two _steps_inside frames deep; both return in that
    # cycle, each closed once: the leaf after the inner one's return is the
    # outer one's. (Without C calls on 3.11 and 3.12 the frames were entered under
    # the previous cycle's evaluator and return through it, and are also on
    # the new cycle's list of frames live at start.)
    cycles: list[list[tuple[str, str | None, bool]]] = []

    def on_ready(p: aprof.profile) -> None:
        evs = [e for e in py_events(p, HERE) if short(e) in ("_steps_inside", "leaf")]
        cycles.append([(short(e), e.parent and short(e.parent), e.unfinished) for e in evs])

    sched = aprof.schedule(wait=0, warmup=0, active=1, repeat=3)
    with aprof.profile(python_tracer=True, schedule=sched, on_trace_ready=on_ready) as prof:
        for _ in range(3):
            _steps_inside(prof, 1)
    me = "test_a_frame_that_steps_the_schedule_closes_once_in_the_next_cycle"
    assert cycles[1] == [
        ("_steps_inside", me, False),
        ("_steps_inside", "_steps_inside", False),
        ("leaf", "_steps_inside", False),
        ("_steps_inside", me, True),
        ("_steps_inside", "_steps_inside", True),
    ]
    assert cycles[2] == cycles[1]


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_forked_child_keeps_none_of_the_parents_calls(impl: ModuleType) -> None:
    # RELIABILITY LC-01 with the tracer: the child stops its copy and records nothing of the parent.
    import os

    with aprof.profile(python_tracer=True) as prof:
        middle()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                prof.stop()
                n = len(py_events(prof, "middle"))
                code = 0 if n == 0 and sys.getprofile() is None else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert len(py_events(prof, "middle")) == 1


def test_to_thread_work_lands_on_the_worker_track(impl: ModuleType, backend: Backend) -> None:
    # SPEC 8.1 + 2.5: the worker inherits the task's context (and its
    # published logical thread), but its calls are the worker thread's.
    async def main() -> tuple[aprof.profile, int]:
        async with aprof.profile(python_tracer=True) as prof:
            await backend.to_thread(middle)
            leaf()
        return prof, aprof.current_thread_id()

    prof, task_tid = backend.run(main)
    mids = [e for e in py_events(prof, HERE) if short(e) == "middle"]
    if impl is _tracer_py and sys.version_info < (3, 12) and backend.is_trio:
        # The twin cannot hook threads that exist before it starts on 3.11,
        # and trio reuses idle workers: the worker's calls may be missing
        # (documented), but never land on the task's track.
        assert len(mids) <= 1
        assert all(m.thread_id != task_tid for m in mids)
    else:
        (mid,) = mids
        assert mid.thread_id != task_tid
        assert mid.os_thread_id != threading.get_ident()
        assert [short(c) for c in mid.children] == ["leaf", "leaf"]
    top_leaves = [
        e for e in py_events(prof, HERE) if short(e) == "leaf" and e.parent is not None and short(e.parent) != "middle"
    ]
    assert {e.thread_id for e in top_leaves} == {task_tid}


def _calls(f: Any) -> Any:
    return f()


def test_a_call_site_seen_calling_python_records_c_calls_in_the_next_profile(impl_cc: ModuleType) -> None:
    # 3.12+: CALL is switched off (DISABLE) at sites that call Python
    # functions; the next profile switches them back on.
    with aprof.profile(python_tracer=True):
        _calls(leaf)
    with aprof.profile(python_tracer=True) as prof:
        _calls([].copy)
    assert "<built-in method list.copy>" in [e.name for e in py_events(prof)]


_NO_EXTENSION_PROGRAM = """
import asyncio, sys, warnings
sys.modules["aprof._ctracer"] = None  # as if no compiler was there at install time
warnings.simplefilter("always")
import aprof
from aprof._core import _record_function, _tracer, _tracer_py, _threads

def leaf():
    return 1

def middle():
    return leaf() + leaf()

async def child():
    with aprof.record_function("in_child"):
        middle()

async def main():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        async with aprof.profile(python_tracer=True) as prof:
            with aprof.record_function("outer"):
                await asyncio.create_task(child())
        async with aprof.profile(python_tracer=True):
            pass
    mine = [str(w.message) for w in record if issubclass(w.category, aprof.AprofWarning)]
    assert len(mine) == 1 and "not built" in mine[0], mine
    assert not _record_function.C_RANGES
    assert type(_threads.stepping) is _threads._Stepping
    assert _tracer.implementation() is _tracer_py
    names = {e.name: e for e in prof.events()}
    assert names["outer"].thread_id != names["in_child"].thread_id
    middles = [e for e in prof.events() if e.name.endswith("middle")]
    assert [c.name.split()[-1] for c in middles[0].children] == ["leaf", "leaf"], middles
    print("ok")

asyncio.run(main())
"""


def test_without_the_extension_everything_runs_in_python_with_one_warning(tmp_path: Path) -> None:
    # Issue #4 item 1: no compiler at install time -> aprof still works
    # (ranges, tasks, the tracer through its twin) and says so once.
    script = tmp_path / "no_ext.py"
    script.write_text(_NO_EXTENSION_PROGRAM)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


# -- the recording switch (SPEC 3.4; issue 15 item 4) ------------------------


@pytest.mark.parametrize("scope", ["context", "global"])
def test_recording_switched_off_records_no_calls(impl: ModuleType, scope: str) -> None:
    # SPEC 3.4, 8.1: nothing records while recording is off, the tracer
    # included; it records again once the guard exits.
    with aprof.profile(python_tracer=True, scope=scope) as prof:  # type: ignore[arg-type]
        leaf()
        with aprof.DisableRecordFunctionGuard():
            middle()
            fib(3)
        leaf()
    names = [short(e) for e in py_events(prof, HERE)]
    assert names.count("leaf") == 2
    assert "middle" not in names
    assert "fib" not in names


_COUNT: contextvars.ContextVar[int] = contextvars.ContextVar("_COUNT", default=0)


def _sets_a_variable() -> int:
    _COUNT.set(_COUNT.get() + 1)  # this frame returns in other context variables than it was called in
    return leaf()


def _runs_a_copied_context() -> int:
    return contextvars.copy_context().run(middle) + leaf()  # back in its own context to return


def _switches_recording_off() -> int:
    with aprof.DisableRecordFunctionGuard():
        middle()
    return leaf()


def _runs_an_empty_context() -> int:
    # Returns right after: no Python call of its own is there to notice that
    # its context is back (a context-scoped profile does not record leaf).
    return contextvars.Context().run(leaf)


def _context_changes() -> int:
    return (
        _sets_a_variable()
        + _runs_a_copied_context()
        + _switches_recording_off()
        + _runs_an_empty_context()
        + _sets_a_variable()
    )


@pytest.mark.parametrize("scope", ["context", "global"])
def test_frames_whose_context_changes_before_they_return_close_where_they_return(
    impl: ModuleType, scope: str
) -> None:
    # SPEC 8.1: the context is asked at every call and return (the C
    # evaluator answers from a per-thread cache while the context's variables
    # stay the same); a frame that set a variable, or ran another context
    # below it (one that carries the profile, or an empty one), or switched
    # recording off and on, is closed at its own return, with every call
    # under it in place, on the calling thread's track.
    with aprof.profile(python_tracer=True, scope=scope) as prof:  # type: ignore[arg-type]
        _context_changes()
        _context_changes()
    (test, base), *tree = _python_tree(prof)  # the test's own frame, live at start, holds the rest
    assert test.startswith("test_frames_whose_context")
    tree = [(name, d - base - 1) for name, d in tree]
    once = [
        ("_context_changes", 0),
        ("_sets_a_variable", 1),
        ("leaf", 2),
        ("_runs_a_copied_context", 1),
        ("middle", 2),
        ("leaf", 3),
        ("leaf", 3),
        ("leaf", 2),
        ("_switches_recording_off", 1),
        ("leaf", 2),
        ("_runs_an_empty_context", 1),
        *([("leaf", 2)] if scope == "global" else []),
        ("_sets_a_variable", 1),
        ("leaf", 2),
    ]
    assert tree == once + once
    evs = [e for e in py_events(prof, HERE) if short(e) != test]  # (the test's frame is open at stop)
    assert not [e for e in evs if e.unfinished]
    assert {e.track for e in evs} == {threading.current_thread().name}


def test_a_thread_with_recording_off_is_not_traced_by_a_global_profile(impl: ModuleType) -> None:
    # SPEC 3.4, 5.3: a global tracer skips a thread whose context switched
    # recording off, and keeps tracing the others.
    def off() -> None:
        aprof.enable_record_function(False)
        middle()

    with aprof.profile(python_tracer=True, scope="global") as prof:
        t = threading.Thread(target=off, name="switched-off")
        t.start()
        t.join()
        leaf()
    # off() itself started with recording on; nothing it called is traced.
    assert [short(e) for e in py_events(prof, HERE) if e.track == "switched-off"] == [
        "test_a_thread_with_recording_off_is_not_traced_by_a_global_profile.<locals>.off"
    ]
    assert [short(e) for e in py_events(prof, HERE)].count("leaf") == 1


def test_tasks_spawned_while_recording_is_off_are_not_traced(impl: ModuleType, backend: Backend) -> None:
    # SPEC 3.4, 8.1: a task spawned while recording is off inherits "off".
    def in_child() -> int:
        return 2

    async def child() -> None:
        in_child()
        await backend.checkpoint()
        in_child()

    async def main() -> aprof.profile:
        async with aprof.profile(python_tracer=True) as prof:
            with aprof.DisableRecordFunctionGuard():
                async with backend.group() as g:
                    g.start_soon(child)
            leaf()
        return prof

    prof = backend.run(main)
    names = [short(e) for e in py_events(prof, HERE)]
    assert "leaf" in names
    assert not [n for n in names if "in_child" in n or n.endswith("child")]


def test_aprofs_own_c_methods_are_not_recorded_as_c_calls(impl_cc: ModuleType) -> None:
    # SPEC 8.1 (issue 15 item 9): record_function's __enter__/__exit__ are
    # aprof's own (in C with the extension), not the program's C calls.
    with aprof.profile(python_tracer=True) as prof:
        with aprof.record_function("r"):
            leaf()
        r = aprof.record_function("explicit")
        r.__enter__()
        r.__exit__(None, None, None)
    assert [e.name for e in prof.events() if e.scope is aprof.RecordScope.USER_SCOPE] == ["r", "explicit"]
    builtins = [e.name for e in py_events(prof) if e.name.startswith("<built-in")]
    assert not [n for n in builtins if "__exit__" in n or "__enter__" in n or "record_function" in n], builtins


# -- method frames (issue 15 item 8) -----------------------------------------


class Layer:
    def __call__(self, x: int) -> int:
        return self.forward(x)

    def forward(self, x: int) -> int:
        return x

    @classmethod
    def make(cls) -> Layer:
        return cls()


class Linear(Layer):
    pass


class Conv(Layer):
    def forward(self, x: int) -> int:
        return x + 1


def _names_receivers(impl: ModuleType) -> bool:
    # The twin reads a frame's first argument through 3.13's f_locals proxy;
    # before 3.13 it would leave a snapshot of every local on the frame.
    return impl is not _tracer_py or sys.version_info >= (3, 13)


def test_method_frames_name_the_receivers_class(impl: ModuleType) -> None:
    # Issue 15 item 8, SPEC 8.1: one method's code is shared by the classes
    # that inherit it; a frame run on another class than the defining one
    # says which (the defining class's own calls keep their plain name).
    with aprof.profile(python_tracer=True) as prof:
        for layer in (Layer(), Linear(), Conv(), Linear()):
            layer(1)
        Linear.make()
    calls = [short(e) for e in py_events(prof, HERE) if "Layer." in e.name or "Conv." in e.name]
    if not _names_receivers(impl):
        assert calls.count("Layer.__call__") == 4
        return
    assert calls == [
        "Layer.__call__", "Layer.forward",
        "Layer.__call__ [Linear]", "Layer.forward [Linear]",
        "Layer.__call__ [Conv]", "Conv.forward",
        "Layer.__call__ [Linear]", "Layer.forward [Linear]",
        "Layer.make [Linear]",
    ]  # fmt: skip


def test_instance_ids_name_each_instance(impl: ModuleType) -> None:
    # Issue 15 item 8: instance_ids=True numbers the instances of each class
    # in order of first sight (the seed's module attribution); an instance
    # that died does not lend its number to a new one at the same address.
    a, b = Linear(), Linear()
    with aprof.profile(python_tracer=True, instance_ids=True) as prof:
        a(1)
        b(1)
        a(1)
        Conv()(1)
        for _ in range(3):
            Layer()(1)  # each made and dropped: a new instance every time
    calls = [short(e) for e in py_events(prof, HERE) if short(e).startswith("Layer.__call__")]
    if not _names_receivers(impl):
        assert calls == ["Layer.__call__"] * 7
        return
    assert calls == [
        "Layer.__call__ [Linear#0]", "Layer.__call__ [Linear#1]", "Layer.__call__ [Linear#0]",
        "Layer.__call__ [Conv#0]", "Layer.__call__ [Layer#0]", "Layer.__call__ [Layer#1]", "Layer.__call__ [Layer#2]",
    ]  # fmt: skip


def test_instance_ids_keep_no_instance_alive(impl: ModuleType) -> None:
    # SPEC 12, 15.6: naming instances holds no reference to them.
    import weakref

    layer = Linear()
    ref = weakref.ref(layer)
    with aprof.profile(python_tracer=True, instance_ids=True):
        layer(1)
        del layer
        assert ref() is None


def test_instance_ids_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="instance_ids"):
        aprof.profile(python_tracer=True, instance_ids=1)  # type: ignore[arg-type]


def test_coroutine_methods_keep_their_receiver_across_steps(impl: ModuleType) -> None:
    # Issue 15 item 8 with PY_RESUME: each step of a method coroutine is a
    # slice named with its receiver.
    import asyncio

    class Handler:
        async def handle(self) -> None:
            await asyncio.sleep(0)

    class Special(Handler):
        pass

    async def main() -> aprof.profile:
        async with aprof.profile(python_tracer=True) as prof:
            await Special().handle()
        return prof

    prof = asyncio.run(main())
    steps = [short(e) for e in py_events(prof, HERE) if "handle" in e.name]
    assert len(steps) == 2
    if _names_receivers(impl):
        assert set(steps) == {"test_coroutine_methods_keep_their_receiver_across_steps.<locals>.Handler.handle [Special]"}


# -- a ring: keep="latest" (issue 19) ---------------------------------------


def early() -> int:
    return 1


def late() -> int:
    return 2


def test_a_ring_keeps_the_latest_calls_whole_and_counts_what_it_lets_go(impl: ModuleType) -> None:
    # Issue 19 item 1: with keep="latest" the tracer's buffer is a ring; the
    # oldest events go, the latest calls are kept whole, and what went is
    # counted. One thread: after the first segment goes, its events read only
    # through the header every segment starts with.
    with aprof.profile(python_tracer=True, max_events=400, keep="latest") as prof:
        for _ in range(1000):
            early()
        for _ in range(50):
            late()
    kept = py_events(prof, HERE)
    lates = [e for e in kept if short(e) == "late"]
    earlies = [e for e in kept if short(e) == "early"]
    assert len(lates) == 50
    assert 0 < len(earlies) < 1000
    assert not any(e.unfinished for e in lates + earlies)
    assert max(e.end_ns for e in earlies) <= min(e.start_ns for e in lates)
    dropped = prof.session.dropped_by_kind["tracer_events"]
    assert dropped >= 2 * (1000 - len(earlies))  # a call and a return for each early() gone
    assert "tracer events" in str(prof.summary())


def test_a_rings_buffer_holds_at_most_its_budget_and_counts_exactly(impl: ModuleType) -> None:
    # At the buffer: every event the program wrote is either kept or counted
    # in dropped, and the ring never holds more than max_events.
    from aprof._core._tracer_py import EV_CALL, EV_SWITCH

    t = _bare_tracer(impl, max_events=64, keep_latest=True)
    t.start([leaf.__code__] * 300)  # a SWITCH, then 300 CALLs
    t.stop()
    assert 0 < t.count <= 64
    data, _, _ = t.take()
    words = memoryview(data).cast("Q")[::2]
    calls = sum(1 for w in words if w & 15 == EV_CALL)
    assert calls < 300
    # The first SWITCH went with the oldest segment; the headers' SWITCHes
    # are the ring's own and never counted.
    assert calls + t.dropped == 301
    assert words[1] & 15 == EV_SWITCH  # a segment reads on its own: TIME, SWITCH, ...


def test_a_ring_needs_a_budget(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="keep_latest needs max_events > 0"):
        _bare_tracer(impl, 0, keep_latest=True)


def test_a_ring_of_a_huge_budget_records_or_counts_every_event(impl: ModuleType) -> None:
    # A budget near sys.maxsize must not wrap a segment's byte count (a
    # 96-byte block written past): the C ring cannot allocate such a
    # segment and counts the events dropped; the twin records them.
    t = _bare_tracer(impl, sys.maxsize, keep_latest=True)
    t.start([leaf.__code__] * 10)  # a SWITCH and 10 CALLs
    t.stop()
    assert t.count + t.dropped == 11


def _ping_pong(rounds: int) -> None:
    """The main thread and a worker call alternately, each ``rounds`` times."""
    turn = [threading.Event(), threading.Event()]

    def worker() -> None:
        for _ in range(rounds):
            turn[1].wait()
            turn[1].clear()
            late()
            turn[0].set()

    th = threading.Thread(target=worker, name="worker-ring")
    th.start()
    for _ in range(rounds):
        early()
        turn[1].set()
        turn[0].wait()
        turn[0].clear()
    th.join()


def test_a_ring_keeps_every_threads_calls_on_its_track(impl: ModuleType) -> None:
    # Each OS thread writes its SWITCH once; after a rotation every thread
    # writes it again, so its calls still land on its track once the segment
    # holding the first SWITCH is gone.
    with aprof.profile(python_tracer=True, max_events=2_000, keep="latest", scope="global") as prof:
        _ping_pong(800)
    assert prof.session.dropped_by_kind["tracer_events"] > 0
    kept = py_events(prof, HERE)
    lates = [e for e in kept if short(e) == "late"]
    earlies = [e for e in kept if short(e) == "early"]
    assert {e.track for e in lates} == {"worker-ring"}
    main_tracks = {e.track for e in earlies}
    assert len(main_tracks) == 1
    assert "worker-ring" not in main_tracks
    # Both threads' latest calls are kept, over the same stretch of time.
    assert len(lates) > 10
    assert len(earlies) > 10
    assert max(e.end_ns for e in earlies) > min(e.start_ns for e in lates)


def test_a_ring_keeps_the_receivers_its_lost_segments_named(impl: ModuleType) -> None:
    # A method code's first receiver is its default, written once; a ring
    # that lets that segment go keeps the defaults in a prologue, so the
    # latest calls keep their receiver's name.
    with aprof.profile(python_tracer=True, max_events=400, keep="latest") as prof:
        layer = Linear()
        for i in range(500):
            layer(i)
    assert prof.session.dropped_by_kind["tracer_events"] > 0
    calls = {short(e) for e in py_events(prof, HERE) if "Layer." in e.name}
    if _names_receivers(impl):
        assert calls == {"Layer.__call__ [Linear]", "Layer.forward [Linear]"}
    else:
        assert calls == {"Layer.__call__", "Layer.forward"}


async def _ring_worker(backend: Backend, n: int) -> None:
    for _ in range(n):
        early()
        await backend.checkpoint()
    late()


def test_a_ring_keeps_tasks_calls_on_their_tracks(impl: ModuleType, backend: Backend) -> None:
    # Issue 19 on every backend: tasks interleave in one thread (a SWITCH at
    # every step); the ring keeps the latest steps on the right task tracks.
    async def main() -> aprof.profile:
        async with aprof.profile(python_tracer=True, max_events=2_000, keep="latest") as prof:
            async with backend.group() as g:
                for _ in range(4):
                    g.start_soon(_ring_worker, backend, 300)
        return prof

    prof = backend.run(main)
    assert prof.session.dropped_by_kind["tracer_events"] > 0
    tasks = [e for e in prof.events() if e.scope is aprof.RecordScope.TASK and "_ring_worker" in (e.extra or {}).get("coro", "")]
    tracks = {e.thread_id for e in tasks}
    assert len(tracks) == 4
    kept = py_events(prof, HERE)
    lates = [e for e in kept if short(e) == "late"]
    assert {e.thread_id for e in lates} == tracks  # each task's last call, on its own track
    assert {e.thread_id for e in kept if short(e) in ("early", "_ring_worker")} <= tracks


def test_max_bytes_bounds_the_tracers_buffer_too(impl: ModuleType) -> None:
    # Issue 19 item 1: max_bytes bounds tracer events as well (16 bytes
    # each, a buffer of their own): 64 KiB holds 4,096 of them.
    with aprof.profile(python_tracer=True, max_bytes=65_536) as prof:
        fib(16)  # 3,193 calls: 6,386 events
    dropped = prof.session.dropped_by_kind["tracer_events"]
    # Give or take the frames on the stack at start, which open first.
    assert 6_386 - 4_096 <= dropped <= 6_386 - 4_096 + 100
    assert 0 < len(py_events(prof, "fib")) < 3_193


def test_starting_and_stopping_the_profile_leave_no_frame_in_the_trace(impl: ModuleType) -> None:
    # SPEC 8.1, 15.6: the tracer records the program's calls only. aprof's
    # own frames are not traced, and neither are the library frames its
    # start and stop would call (a WeakSet's discard at stop once showed as
    # the program's last call); frames live at start stay open (unfinished).
    with aprof.profile(python_tracer=True) as prof:
        leaf()
    closed = [e.name for e in py_events(prof) if not e.unfinished]
    assert [n for n in closed if HERE not in n] == []
    assert [short(e) for e in py_events(prof, HERE) if not e.unfinished] == ["leaf"]


def test_a_peek_copies_the_calls_so_far_and_tracing_goes_on(impl: ModuleType) -> None:
    # Issue 19: a flight recorder's dump reads the tracer without stopping
    # it (Tracer.peek): whole events, the codes they name, times on the
    # profile's clock; the tracer records on and keeps everything for stop.
    from aprof._core._tracer_py import EV_CALL

    with aprof.profile(python_tracer=True) as prof:
        leaf()
        run = prof._tracer
        assert run is not None
        data, objs, start_ns = run.tracer.peek()
        middle()
    assert len(data) % 16 == 0
    words = memoryview(data).cast("Q")
    called = [objs[words[i + 1]] for i in range(0, len(words), 2) if words[i] & 15 == EV_CALL]
    assert leaf.__code__ in called
    assert middle.__code__ not in called
    started = prof.session.metadata["start_ns"]
    assert started <= start_ns < started + 1_000_000_000  # perf_counter_ns, not TSC ticks
    names = [short(e) for e in py_events(prof, HERE) if not e.unfinished]
    assert names.count("leaf") == 3
    assert names.count("middle") == 1
