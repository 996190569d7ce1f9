"""The C paths and their pure-Python twins mean the same (issue #4 item 4).

``record_function``'s ``__init__``/``__enter__``/``__exit__`` run in C when
the extension is built (aprof/_cranges.c) and in Python otherwise
(``_PyRangeCore``); so does consolidation at stop (aprof/_cevents.c against
``_records_of``, ``_sort_by_start`` and ``_nest`` in ``aprof._post._events``).
The core tests run on both: here in this process on the C path, and once
more in a child process with ``APROF_PURE_PYTHON=1``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import gc
import json
import os
import subprocess
import sys
import threading
import tracemalloc
import weakref
from array import array
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._core import _native, _record_function, _threads
from aprof._core._callbacks import RF_STATE
from aprof._core._recorder import ASYNC_SAME_THREAD, KIND_INSTANT
from aprof._post import _events
from aprof._post._table import COLUMNS, EventTable

from .conftest import require_c_extension

ROOT = Path(__file__).resolve().parent.parent

#: The test files that pin down the meaning of ranges, callbacks, profiles,
#: context propagation and task attribution (SPEC 2-6).
CORE_TESTS = [
    "tests/test_record_function.py",
    "tests/test_callbacks.py",
    "tests/test_profiler.py",
    "tests/test_context.py",
    "tests/test_propagation.py",
    "tests/test_tasks.py",
    "tests/test_invisible.py",
]


def _require_extension() -> None:
    """The C path runs: the extension is built (else fail or skip) and not switched off."""
    require_c_extension()
    if _native.extension is None:
        pytest.fail("this test checks the C path; run it without APROF_PURE_PYTHON")


def raw_lists() -> dict[Any, list[tuple[Any, ...]]]:
    recorder = RF_STATE.get().recorder
    assert recorder is not None
    assert recorder.state is not None
    return recorder.state.lists


def test_record_function_runs_in_c_when_the_extension_is_built() -> None:
    # SPEC 4.1, 14: on a GIL build with the extension, ranges take the C path.
    _require_extension()
    assert _record_function.C_RANGES
    assert type(aprof.record_function("x")).__mro__[1] is _native.extension.RangeCore  # type: ignore[union-attr]
    assert _threads.stepping is _native.extension.stepping  # type: ignore[union-attr]
    assert _events.FunctionEvent.__mro__[1] is _native.extension.EventView  # type: ignore[union-attr]
    assert _events.nest is _native.extension.nest  # type: ignore[union-attr]


@pytest.mark.timeout(900)
def test_the_core_tests_pass_on_the_pure_python_path() -> None:
    # Issue #4 item 4: "identical semantics (the core tests pass on both paths)".
    env = dict(os.environ, APROF_PURE_PYTHON="1")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *CORE_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=880,
    )
    tail = "\n".join(run.stdout.splitlines()[-30:])
    assert run.returncode == 0, f"core tests failed on the pure-Python path:\n{tail}\n{run.stderr[-2000:]}"
    assert " passed" in tail


def test_pure_python_switch_is_honoured_in_a_child() -> None:
    # SPEC 14 (docs/reference.md, APROF_PURE_PYTHON).
    # What the test above relies on: the switch really selects the twins.
    code = (
        "from aprof._core import _record_function, _threads, _tracer, _tracer_py;"
        "assert not _record_function.C_RANGES;"
        "assert type(_threads.stepping) is _threads._Stepping;"
        "assert _tracer.implementation() is _tracer_py;"
        "print('ok')"
    )
    run = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        env=dict(os.environ, APROF_PURE_PYTHON="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


# ---------------------------------------------------------------------------
# What only the C path can get wrong
# ---------------------------------------------------------------------------


def _stack_site(fn: Any) -> Any:
    return fn()


def test_with_stack_keeps_stacks_raw_until_stop() -> None:
    # SPEC 8.3, 6.1 (issue 15 item 7): while recording, a range's stack is
    # its frames' code objects and instruction offsets, out of the GC's
    # lists (naming every frame at each start cost ~16 us at depth 23), and
    # the extension's frame walker and its pure-Python twin agree.
    from aprof._core import _recorder

    _require_extension()
    seen: list[Any] = []

    def at_site() -> None:
        with aprof.record_function("r"):
            starts = [t for lst in raw_lists().values() for t in lst if len(t) == 5 and t[0] == "r"]
            seen.append(starts[-1][4])
            seen.append(_native.extension.stack_here(0, _recorder._APROF_DIR))  # type: ignore[union-attr]
            seen.append(_recorder._stack_here_py(0, _recorder._APROF_DIR))

    with aprof.profile(with_stack=True) as prof:
        _stack_site(at_site)
        (codes, lastis), c_walk, py_walk = seen
        assert type(codes) is tuple
        assert type(lastis) is bytes
        assert codes[:2] == (at_site.__code__, _stack_site.__code__)
        assert len(lastis) == 4 * len(codes)
        assert not gc.is_tracked(seen[0])
        assert c_walk[0] == py_walk[0]
        assert c_walk[1][4:] == py_walk[1][4:]  # same frames, same offsets (but the innermost line)
    (r,) = [e for e in prof.events() if e.name == "r"]
    assert r.stack is not None
    assert [f[2] for f in r.stack[:2]] == [at_site.__qualname__, "_stack_site"]


def test_c_ranges_are_packed_into_one_block_the_gc_does_not_walk() -> None:
    # SPEC 3, issue 17 item 4: on the C path a plain range is a 48-byte slot
    # of a RangeBlock at the tail of its thread's raw list, not two tuples;
    # its end is written into the slot. A block holds only strs, so it is no
    # GC container.
    _require_extension()
    with aprof.profile() as prof:
        with aprof.record_function("a", args="k=1"):
            try:
                with aprof.record_function("b"):
                    raise KeyError("x")
            except KeyError:
                pass
        (records,) = raw_lists().values()
        (block,) = records
        assert type(block) is _native.extension.RangeBlock  # type: ignore[union-attr]
        (name_a, scope, start_a, args_a, end_a, tid_a, exc_a), (name_b, _, start_b, args_b, end_b, tid_b, exc_b) = (
            block.rows()
        )
        assert (name_a, scope, args_a, exc_a) == ("a", "user_scope", "k=1", None)
        assert (name_b, args_b, exc_b) == ("b", None, "KeyError")
        assert tid_a == tid_b == aprof.current_thread_id()
        assert start_a <= start_b <= end_b <= end_a
        with aprof.record_function("c"):
            assert block.rows()[2][4] is None  # open: no end yet
        assert len(records) == 1
        assert len(block) == 3
    b = next(e for e in prof.events() if e.name == "b")
    assert b.exception == "KeyError"
    assert [e.name for e in prof.events()] == ["a", "b", "c"]


def test_a_block_keeps_exact_strs_only_so_the_gc_need_not_walk_it() -> None:
    # Issue 17 item 4: a block is no GC container, so what it holds must not
    # be able to close a cycle: an exception whose __name__ is a str
    # subclass (which may carry a __dict__) is kept as an exact copy, and a
    # str-subclass name keeps the tuple form.
    _require_extension()

    class S(str):
        def __str__(self) -> str:
            return self  # str() of it stays a subclass

    class Odd(Exception):
        pass

    Odd.__name__ = S("Odd")
    with aprof.profile() as prof:
        try:
            with aprof.record_function("r"):
                raise Odd
        except Odd:
            pass
        with aprof.record_function(S("sub")):
            pass
        block, tup, _end = next(iter(raw_lists().values()))
        exc = block.rows()[0][6]
        assert exc == "Odd"
        assert type(exc) is str
        assert type(tup) is tuple
        assert type(tup[0]) is S
    assert [(e.name, e.exception) for e in prof.events()] == [("r", "Odd"), ("sub", None)]
    with pytest.raises(TypeError, match="not a subclass"):
        _native.extension.RangeBlock(S("user_scope"))  # type: ignore[union-attr]


def test_a_block_sits_among_the_tuples_in_the_order_things_were_recorded() -> None:
    # SPEC 3: a record of another kind between two ranges ends the tail
    # block; the next range opens a new one after it, so the raw list keeps
    # the order everything was recorded in.
    _require_extension()
    with aprof.profile() as prof:
        with aprof.record_function("a"):
            pass
        aprof.mark("mark")
        with aprof.record_function("b"):
            pass
        kinds = [type(r).__name__ for r in next(iter(raw_lists().values()))]
    assert kinds == ["RangeBlock", "tuple", "RangeBlock"]
    assert [e.name for e in prof.events()] == ["a", "mark", "b"]


def test_a_range_holds_at_most_64_bytes_while_recording() -> None:
    # Issue 17 item 4: "Recording: at most 64 B held per user range."
    _require_extension()
    names = [f"range-{i}" for i in range(4)]
    n = 30_000
    with aprof.profile():
        with aprof.record_function("warm"):
            pass
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(n):
                with aprof.record_function(names[i & 3], args="id=1" if i % 100 == 0 else None):
                    pass
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert held / n <= 64, f"{held / n:.1f} B held per range"


def test_unpacked_blocks_consolidate_like_the_blocks() -> None:
    # Issue 17 item 4: the tuple-pairing path (with_stack, the twins) reads a
    # raw list holding blocks the same as the one-pass path: same columns.
    _require_extension()
    ext = _native.extension
    assert ext is not None
    block = ext.RangeBlock("user_scope")
    raw: list[Any] = [("t0", "user_scope", 5, None)]
    i = block.open("outer", "k=1", 10)
    j = block.open("inner", None, 12)
    block.close(j, 15, TID, "ValueError")
    block.close(j, 99, TID, None)  # a second end is ignored
    block.close(i, 30, TID + 1, None)  # ended on another logical thread: async
    block.open("open", None, 31)  # still open at stop
    raw += [block, (0, 40, TID, None), ("t1", "user_scope", 41, None), (3, 45, TID, "KeyError")]
    unpacked = _events.unpack_blocks(raw)
    assert not any(type(t) is ext.RangeBlock for t in unpacked)

    def table(one_pass: bool) -> Any:
        tab = EventTable()
        track = tab.add_track(_events.Track(TID, "t", "thread", 1, 0))
        if one_pass:
            ext.consolidate_raw(raw, TID, [], track, 50, tab, [])
        else:
            records = _events._records_of(unpacked, TID)
            _events._sort_by_start(records)
            _events._nest(records, track, 50, tab, [])
        return tab

    one, two = table(True), table(False)
    for col, _ in COLUMNS:
        assert getattr(one, col) == getattr(two, col), col
    assert one.names == two.names
    assert one.rare == two.rare
    assert [one.names[k] for k in one.name] == ["t0", "outer", "inner", "open", "t1"]
    assert list(one.end) == [40, 30, 15, 50, 45]  # t1's end tuple names it at its place after the block
    assert one.rare[4][0] == "KeyError"


def test_c_records_keep_a_str_subclass_name_tracked() -> None:
    # SPEC 4.1.
    # A name that is a str subclass may carry a __dict__, so the record may
    # hold a cycle: it stays visible to the collector.
    class Name(str):
        pass

    with aprof.profile() as prof:
        with aprof.record_function(Name("sub")):
            pass
        (records,) = raw_lists().values()
        assert gc.is_tracked(records[0])
    assert [e.name for e in prof.events()] == ["sub"]


def test_record_function_misuse_is_named_on_both_paths() -> None:
    # SPEC 4.1, 12: every misuse names what was wrong.
    with pytest.raises(TypeError, match="record_function: name must be a str, got int"):
        aprof.record_function(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="record_function: args must be a str or None, got bytes"):
        aprof.record_function("x", args=b"1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="record_function: name must be a str, got NoneType"):
        aprof.record_function(name=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        aprof.record_function()  # type: ignore[call-arg]
    r = aprof.record_function(name="kw", args="a=1")
    assert (r.name, r.args) == ("kw", "a=1")


def test_calling_record_function_builds_what_type_call_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 4.1: the C path's shortcut for calling the class gives the same
    # object as type.__call__, the same errors, and honours an __init__
    # patched onto the class later.
    made = [aprof.record_function("x"), aprof.record_function("x", "a=1"), type.__call__(aprof.record_function, "x", "a=1")]
    assert [(type(r), r.name, r.args) for r in made] == [
        (aprof.record_function, "x", None),
        (aprof.record_function, "x", "a=1"),
        (aprof.record_function, "x", "a=1"),
    ]
    with pytest.raises(TypeError, match="record_function: args must be a str or None, got bytes"):
        aprof.record_function("x", b"1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        aprof.record_function("x", "a", "b")  # type: ignore[call-arg]
    calls: list[str] = []
    original = aprof.record_function.__init__

    def patched(self: Any, name: str, args: str | None = None) -> None:
        calls.append(name)
        original(self, name.upper(), args)

    monkeypatch.setattr(aprof.record_function, "__init__", patched)
    with aprof.profile() as prof:
        with aprof.record_function("patched"):
            pass
    monkeypatch.undo()
    assert calls == ["patched"]
    assert [e.name for e in prof.events()] == ["PATCHED"]
    assert aprof.record_function("after").name == "after"


def test_exit_called_by_hand_with_wrong_arguments_is_a_clear_error() -> None:
    # SPEC 12.
    r = aprof.record_function("x")
    r.__enter__()
    with pytest.raises(TypeError, match="__exit__"):
        r.__exit__(None)  # type: ignore[call-arg]
    r.__exit__(None, None, None)


def test_record_function_can_be_subclassed() -> None:
    # SPEC 4.1.
    class Named(aprof.record_function):
        def __init__(self) -> None:
            super().__init__("named", args="sub")

    with aprof.profile() as prof:
        with Named():
            pass
    (e,) = prof.events()
    assert (e.name, e.args) == ("named", "sub")


def test_stepping_slot_is_per_os_thread() -> None:
    # SPEC 2: logical threads are per OS thread outside tasks.
    # The C slot behaves like the threading.local it replaces.
    stepping = _threads.stepping
    marker = _threads.LogicalThread("thread", "marker")
    seen: list[Any] = []
    stepping.lt = marker
    try:
        t = threading.Thread(target=lambda: seen.append(stepping.lt))
        t.start()
        t.join()
        assert seen == [None]
        assert stepping.lt is marker
    finally:
        stepping.lt = None
    assert stepping.lt is None


def test_range_in_an_unwrapped_task_is_on_the_tasks_track() -> None:
    # SPEC 2, 4.1.
    # The task that starts the profile is not one aprof wrapped: the C path
    # finds its logical thread through asyncio, as the Python path does.
    async def main() -> tuple[int, int]:
        async with aprof.profile() as prof:
            with aprof.record_function("in_main"):
                pass
            mine = aprof.current_thread_id()
        (e,) = prof.events()
        return e.thread_id, mine

    tid, mine = asyncio.run(main())
    assert tid == mine


def test_range_in_a_plain_thread_after_asyncio_ran_elsewhere() -> None:
    # SPEC 2, 4.1.
    # A loop running in another thread must not make this thread's range
    # land on that loop's task (3.11 checks the hint's thread).
    started = threading.Event()
    release = threading.Event()

    async def busy() -> None:
        started.set()
        while not release.is_set():
            await asyncio.sleep(0.001)

    t = threading.Thread(target=asyncio.run, args=(busy(),))
    t.start()
    try:
        assert started.wait(10)
        with aprof.profile() as prof:
            with aprof.record_function("here"):
                pass
            me = aprof.current_thread_id()
    finally:
        release.set()
        t.join()
    (e,) = prof.events()
    assert e.thread_id == me


def test_range_in_a_plain_thread_with_trio_imported_is_on_the_threads_track() -> None:
    # SPEC 2, 4.1.
    # trio imported but not running here: the thread's own track (the C path
    # reads trio's per-thread run context without raising).
    import trio

    async def in_trio() -> int:
        with aprof.record_function("in_trio"):
            pass
        return aprof.current_thread_id()

    with aprof.profile() as prof:
        trio_tid = trio.run(in_trio)
        with aprof.record_function("here"):
            pass
        me = aprof.current_thread_id()
    by_name = {e.name: e for e in prof.events()}
    assert by_name["here"].thread_id == me
    assert by_name["in_trio"].thread_id == trio_tid
    assert trio_tid != me


def test_c_ranges_read_aprofs_slots_directly() -> None:
    # Issue #4 item 4: the C path reads these __slots__ without getattr.
    _require_extension()
    assert sorted(_native.extension._range_slots()) == sorted(  # type: ignore[union-attr]
        ["mode", "recorder", "state", "lists", "id", "os_thread_id", "_task_ref", "with_stack", "budget"]
    )


class _RenumberedThread(_threads.LogicalThread):
    """A logical thread whose ``id`` is not the slot (getattr finds the property)."""

    __slots__ = ()
    id = property(lambda self: 424242, lambda self, value: None)  # type: ignore[assignment]


def test_c_ranges_answer_what_getattr_answers_for_an_overridden_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 2.3, 4.1: a slot read directly must give what getattr gives, for a
    # subclass that overrides the attribute and after the class changes.
    stepping = _threads.stepping
    lt = _RenumberedThread("thread", "renumbered")
    with aprof.profile() as prof:
        with aprof.record_function("plain"):  # the reader checks LogicalThread here
            pass
        stepping.lt = lt
        try:
            with aprof.record_function("subclass"):
                pass
        finally:
            stepping.lt = None
        monkeypatch.setattr(_threads.LogicalThread, "id", property(lambda self: 777, lambda self, value: None))
        with aprof.record_function("patched"):
            pass
        monkeypatch.undo()
        with aprof.record_function("restored"):
            pass
    by_name = {e.name: e for e in prof.events()}
    assert by_name["subclass"].end_thread_id == 424242
    assert by_name["patched"].end_thread_id == 777
    assert by_name["restored"].end_thread_id == by_name["plain"].end_thread_id == aprof.current_thread_id()


def test_c_ranges_see_each_step_of_tasks_sharing_one_context() -> None:
    # SPEC 2.3: tasks that share a Context object (create_task(context=...))
    # and alternate steps each keep their own track; the C path's cached
    # logical thread is per step, not per context.
    import contextvars

    async def worker(name: str) -> int:
        for _ in range(3):
            with aprof.record_function(name):
                pass
            await asyncio.sleep(0)
        return aprof.current_thread_id()

    async def main() -> tuple[Any, int, int]:
        async with aprof.profile() as prof:
            shared = contextvars.copy_context()
            a = asyncio.get_running_loop().create_task(worker("a"), context=shared)
            b = asyncio.get_running_loop().create_task(worker("b"), context=shared)
            tid_a, tid_b = await asyncio.gather(a, b)
        return prof, tid_a, tid_b

    prof, tid_a, tid_b = asyncio.run(main())
    assert tid_a != tid_b
    tracks = {(e.name, e.thread_id, e.end_thread_id) for e in prof.events() if e.name in ("a", "b")}
    assert tracks == {("a", tid_a, tid_a), ("b", tid_b, tid_b)}


# ---------------------------------------------------------------------------
# Consolidation in C (aprof/_cevents.c) against its twins in _events.py
# ---------------------------------------------------------------------------

TID = 7


def tricky_raw() -> list[tuple[Any, ...]]:
    """One logical thread's raw list with every case consolidation handles."""
    return [
        ("outer", "user_scope", 100, "k=1"),  # 0
        ("inner", "user_scope", 110, None),  # 1
        (1, 120, TID, None),
        ("raised", "user_scope", 130, None),  # 3
        (3, 140, TID, "KeyError"),
        (3, 141, TID, None),  # a second end for the same start: ignored
        ("mark", "user_scope", 150, None, -1, 0, None, None, KIND_INSTANT, {"k": 1}),  # 6
        ("exec", "executor", 160, None, 5, 3, ("1",), (("f.py", 1, "f"),), 0, 155),  # 7: extra is submit_ns
        (7, 170, TID, None),
        ("elsewhere", "user_scope", 175, None),  # 9: ended in another logical thread
        (9, 185, 8, None),
        ("declared_async", "user_scope", 176, None),  # 11
        (11, 180, ASYNC_SAME_THREAD, None),
        ("outlives", "user_scope", 190, None),  # 13: ends after outer
        (0, 200, TID, None),
        (13, 210, TID, None),
        (99, 211, TID, None),  # an end naming no start: ignored
        ("open", "user_scope", 220, None),  # never ends: closed at stop
        ("late", "user_scope", 90, None),  # out of start order (the tracer's replay appends)
        (18, 95, TID, None),
        ("spawned", "task", 212, None, 4, 3, None, None, 0, None),  # 20: top-level work spawned from thread 3
        (20, 215, TID, None),
    ]


def consolidated(records_of: Any, sort_by_start: Any, nest: Any) -> tuple[list[list[Any]], list[tuple[Any, ...]], Any]:
    records = records_of(tricky_raw(), TID)
    sort_by_start(records)
    paired = copy.deepcopy(records)  # as records_of paired them (nest's Python twin fills in ends and flags)
    tab = _events.EventTable()
    linked: list[int] = []
    nest(records, tab.add_track(_events.Track(TID, "t", "thread", 1, 0)), 300, tab, linked)
    assert [tab[i].name for i in linked] == ["spawned"]  # top-level, with a forward thread: linked across tracks later
    shape = [
        (e.name, e.parent.name if e.parent else None, [c.name for c in e.children], e.is_async, e.unfinished)
        for e in tab
    ]
    return paired, shape, tab


def test_c_consolidation_matches_the_python_twin() -> None:
    # SPEC 6.2, 6.3: the same records, the same nesting, the same flags, the same columns.
    _require_extension()
    ext: Any = _native.extension
    c_records, c_shape, c_tab = consolidated(ext.records_of, ext.sort_by_start, ext.nest)
    py_records, py_shape, py_tab = consolidated(_events._records_of, _events._sort_by_start, _events._nest)
    assert c_records == py_records
    assert c_shape == py_shape
    assert c_tab.columns() == py_tab.columns()
    assert c_tab.names == py_tab.names
    assert c_tab.rare == py_tab.rare
    by_name = {row[0]: row for row in c_shape}
    assert [row[0] for row in c_shape][0] == "late"
    assert by_name["outer"][2] == ["inner", "raised", "mark", "exec"]
    assert by_name["open"][1] is None
    assert by_name["elsewhere"][1:4] == ("outer", [], True)
    assert by_name["declared_async"][3]
    assert by_name["outlives"][3]
    assert by_name["open"][4]
    assert not by_name["outer"][4]
    rec = {r[0]: r for r in c_records}
    assert rec["raised"][3:6] == [140, None, "KeyError"]
    assert rec["elsewhere"][4] == 8
    assert rec["declared_async"][4] == TID
    assert rec["exec"][12] == {"submit_ns": 155}
    events = {e.name: e for e in c_tab}
    assert events["open"].end_ns == 300  # closed at the stop time
    assert events["raised"].exception == "KeyError"
    assert events["elsewhere"].end_thread_id == 8
    assert events["exec"].extra == {"submit_ns": 155}
    assert events["exec"].inputs == ("1",)


LEAD = [  # a task's TASK record, as _task_events makes it: goes before the track's raw records
    ["Task-9", aprof.RecordScope.TASK, 50, None, None, None, None, 3, 2, None, None, 0, {"coro": "c", "steps": [50, 60]}],
]


@pytest.mark.parametrize("lead", [[], LEAD], ids=["thread", "task"])
def test_c_one_pass_consolidation_matches_the_three_steps(lead: list[list[Any]]) -> None:
    # SPEC 6.2, 6.3: consolidate_raw pairs, orders and nests in one pass over
    # C arrays; the table it builds is the one the Python twins build, name
    # ids, rare fields and spawn links included.
    _require_extension()
    ext: Any = _native.extension

    def build(one_pass: bool) -> tuple[Any, list[int]]:
        tab = _events.EventTable()
        linked: list[int] = []
        track = tab.add_track(_events.Track(TID, "t", "thread", 1, 0))
        if one_pass:
            ext.consolidate_raw(tricky_raw(), TID, copy.deepcopy(lead), track, 300, tab, linked)
        else:
            records = copy.deepcopy(lead) + _events._records_of(tricky_raw(), TID)
            _events._sort_by_start(records)
            _events._nest(records, track, 300, tab, linked)
        return tab, linked

    (c_tab, c_linked), (py_tab, py_linked) = build(True), build(False)
    assert c_tab.columns() == py_tab.columns()
    assert (c_tab.names, c_tab.rare, c_linked) == (py_tab.names, py_tab.rare, py_linked)
    assert ext.raw_first_start(tricky_raw()) == min(t[2] for t in tricky_raw() if type(t[0]) is not int)
    assert ext.raw_first_start([]) is None


def test_c_consolidated_records_of_strs_and_ints_leave_the_gc_alone() -> None:
    # SPEC 6.2: a million plain ranges do not weigh on every later collection;
    # records holding containers stay tracked.
    _require_extension()
    records = _native.extension.records_of(tricky_raw(), TID)  # type: ignore[union-attr]
    rec = {r[0]: r for r in records}
    assert not gc.is_tracked(rec["outer"])
    assert not gc.is_tracked(rec["raised"])
    assert gc.is_tracked(rec["mark"])
    assert gc.is_tracked(rec["exec"])


def test_c_event_views_are_one_per_row_while_held_and_freed_after() -> None:
    # SPEC 6.2: asking for the same event twice gives the same object while
    # it is held (``a.parent is b``); dropping the events and the table frees
    # them without waiting for the cyclic GC (views hold the table, not the
    # other way round).
    _require_extension()
    _records, shape, tab = consolidated(
        _native.extension.records_of,  # type: ignore[union-attr]
        _native.extension.sort_by_start,  # type: ignore[union-attr]
        _native.extension.nest,  # type: ignore[union-attr]
    )
    assert len(shape) == 11
    outer = next(e for e in tab if e.name == "outer")
    assert all(c.parent is outer for c in outer.children)
    assert tab[outer._i] is outer
    ref = weakref.ref(tab)
    gc.disable()
    try:
        del tab, outer
        assert ref() is None  # freed by reference counting alone
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("raw", "error", "words"),
    [
        ([42], TypeError, "raw record 0 is not a start or end tuple"),
        ([("a", "no_such_scope", 1, None)], ValueError, "unknown scope 'no_such_scope'"),
        ([("a", "user_scope", 1, None, 0, 0)], TypeError, "raw start record 0 has 6 fields"),
    ],
)
def test_c_consolidation_names_a_bad_raw_record(raw: list[Any], error: type[Exception], words: str) -> None:
    # SPEC 12: bad input gets an error naming what was wrong.
    _require_extension()
    with pytest.raises(error, match=words):
        _native.extension.records_of(raw, TID)  # type: ignore[union-attr]


def test_c_consolidation_refuses_a_record_layout_it_does_not_know() -> None:
    # SPEC 12: the C and Python layouts of a record cannot drift apart silently.
    _require_extension()
    ext: Any = _native.extension
    with pytest.raises(ValueError, match="record layout constant 0 is 5 in Python, 0 in C"):
        ext._events_setup(_events.FunctionEvent, _events.SCOPES, _events._SCOPES, _events._start_of, (5,) * 17)
    with pytest.raises(TypeError, match="must subclass EventView"):
        ext._events_setup(dict, _events.SCOPES, _events._SCOPES, _events._start_of, (0,) * 17)
    # Refused setups change nothing: consolidation still works.
    assert consolidated(ext.records_of, ext.sort_by_start, ext.nest)[1][0][0] == "late"


# ---------------------------------------------------------------------------
# Chrome export: runs of plain ranges written in C (aprof/_cevents.c)
# ---------------------------------------------------------------------------


def rich_session() -> aprof.Session:
    """A session with every kind of Chrome line: plain and nested ranges,
    args, exceptions, instants, async slices, tasks with steps, executor
    work, names that need escaping."""

    class Name(str):
        pass

    def in_pool() -> None:
        with aprof.record_function("in pool"):
            pass

    async def child(i: int) -> None:
        with aprof.record_function("child", args=f"i={i}"):
            await asyncio.sleep(0)
        aprof.mark("marked")
        with contextlib.suppress(KeyError), aprof.record_function("raises"):
            raise KeyError(i)

    async def main() -> aprof.profile:
        async with aprof.profile(with_stack=True) as prof:
            for name in ("plain", 'quote " and \\ backslash', "line\nbreak", "caf\u00e9 \u2603", Name("sub")):
                with aprof.record_function(name), aprof.record_function("nested"):
                    pass
            late = aprof.record_function("outlives")
            with aprof.record_function("short"):
                late.__enter__()
            late.__exit__(None, None, None)
            await asyncio.gather(*(child(i) for i in range(3)))
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                await asyncio.get_running_loop().run_in_executor(aprof.propagating(pool), in_pool)
            for _ in range(50):
                with aprof.record_function("many"):
                    pass
        return prof

    return asyncio.run(main()).session


def test_chrome_export_is_the_same_text_on_the_c_and_python_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 9.1: the C writer of plain ranges changes the speed, not one byte.
    _require_extension()
    from aprof._export._chrome import chrome_trace_chunks

    session = rich_session()
    for batch in (1, 3, 4096):
        c_text = "".join(chrome_trace_chunks(session, batch))
        with monkeypatch.context() as m:
            m.setattr(_native, "extension", None)
            py_text = "".join(chrome_trace_chunks(session, batch))
        assert c_text == py_text
    doc = json.loads(c_text)
    names = {e.get("name") for e in doc["traceEvents"]}
    assert {"plain", 'quote " and \\ backslash', "line\nbreak", "caf\u00e9 \u2603", "sub", "nested", "many"} <= names
    assert {"b", "e", "i", "s", "f", "X", "M"} <= {e["ph"] for e in doc["traceEvents"]}


@pytest.mark.parametrize("offset_ns", [0, 1, 999, 1000, 1001, 123_456_789_012, -1, -999, -1000, -1_234_567])
def test_c_chrome_times_print_as_python_prints_them(offset_ns: int) -> None:
    # SPEC 9.1: timestamps are microseconds with nanosecond decimals, as
    # f"{ns / 1000.0:.3f}" prints them (negative for frames open before start).
    _require_extension()
    base = 10**15
    track = _events.Track(1, "t", "thread", 1, 0)
    rec = ["r", aprof.RecordScope.USER_SCOPE, base + offset_ns, base + offset_ns + 2_500, None, None, None, -1, 0,
           None, None, 0, None]  # fmt: skip
    tab = _events.EventTable()
    _events.add_event(tab, rec, track, is_async=False, unfinished=False)
    cats = tuple(sc.value for sc in _events.SCOPES)
    text, nxt = _native.extension.chrome_plain(  # type: ignore[union-attr]
        tab, 0, base, ['"pid":1,"tid":1'], {}, cats, json.dumps, 10, array("i"), [None]
    )
    assert nxt == 1
    assert text == f'{{"ph":"X","name":"r","cat":"user_scope","pid":1,"tid":1,"ts":{offset_ns / 1000.0:.3f},"dur":2.500}}'


def test_c_chrome_writer_stops_at_the_first_event_it_does_not_write() -> None:
    # SPEC 9.1: anything with args, flags or links is left to the exporter.
    _require_extension()
    track = _events.Track(1, "t", "thread", 1, 0)
    plain = ["p", aprof.RecordScope.USER_SCOPE, 10, 20, None, None, None, -1, 0, None, None, 0, None]
    with_args = [*plain[:6], "k=1", *plain[7:]]
    tab = _events.EventTable()
    for r in (plain, plain, with_args, plain):
        _events.add_event(tab, list(r), track, False, False)
    rare = array("i", sorted(tab.rare))
    cats = tuple(sc.value for sc in _events.SCOPES)
    where = ['"pid":1,"tid":1']
    chrome_plain = _native.extension.chrome_plain  # type: ignore[union-attr]
    no_steps = [None]
    text, nxt = chrome_plain(tab, 0, 0, where, {}, cats, json.dumps, 100, rare, no_steps)
    assert nxt == 2
    assert text.count('"ph":"X"') == 2
    assert chrome_plain(tab, 2, 0, where, {}, cats, json.dumps, 100, rare, no_steps) == ("", 2)
    assert chrome_plain(tab, 3, 0, where, {}, cats, json.dumps, 100, rare, no_steps)[1] == 4  # past the one with args
    assert chrome_plain(tab, 0, 0, where, {}, cats, json.dumps, 1, rare, no_steps)[1] == 1  # the batch limit
    # On a task's track (its steps: ran 5..15 and 18..30), a range's
    # running and waiting time, as the Python path spells them.
    text, nxt = chrome_plain(tab, 0, 0, where, {}, cats, json.dumps, 1, rare, [[5, 15, 18, 30]])
    assert nxt == 1
    assert text.endswith(',"args":{"running_ns": 7, "waiting_ns": 3}}')
    assert json.loads(text)["args"] == {"running_ns": 7, "waiting_ns": 3}


def test_the_stub_names_everything_the_extension_has() -> None:
    # SPEC 14 (issue #4 item 1: the extension is described by a .pyi stub).
    _require_extension()
    import ast

    stub = ast.parse((ROOT / "aprof" / "_ctracer.pyi").read_text())
    named = {n.name for n in stub.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    named |= {t.id for n in stub.body if isinstance(n, ast.AnnAssign) for t in [n.target] if isinstance(t, ast.Name)}
    have = {n for n in dir(_native.extension) if not n.startswith("__")}
    assert have - named == set()
