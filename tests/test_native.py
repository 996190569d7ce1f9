"""The C range path and its pure-Python twin mean the same (issue #4 item 4).

``record_function``'s ``__init__``/``__enter__``/``__exit__`` run in C when
the extension is built (aprof/_cranges.c) and in Python otherwise
(``_PyRangeCore``). The core tests run on both: here in this process on the
C path, and once more in a child process with ``APROF_PURE_PYTHON=1``.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._core import _native, _record_function, _threads
from aprof._core._callbacks import RF_STATE

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


def test_c_records_have_the_python_paths_shape_and_leave_the_gc_alone() -> None:
    # SPEC 3: a range is a start tuple and an end tuple naming it. The C path
    # takes its records (strs, ints, None only) out of the collector's lists.
    _require_extension()
    with aprof.profile() as prof:
        with aprof.record_function("a", args="k=1"):
            try:
                with aprof.record_function("b"):
                    raise KeyError("x")
            except KeyError:
                pass
        (records,) = raw_lists().values()
        start_a, start_b, end_b, end_a = records
        assert start_a[:2] == ("a", "user_scope")
        assert start_a[3] == "k=1"
        assert start_b[0] == "b"
        assert start_b[3] is None
        assert end_b[0] == 1
        assert end_b[3] == "KeyError"
        assert end_b[2] == aprof.current_thread_id()
        assert end_a[0] == 0
        assert end_a[3] is None
        assert start_a[2] <= start_b[2] <= end_b[1] <= end_a[1]
        assert not any(gc.is_tracked(r) for r in records)
    b = next(e for e in prof.events() if e.name == "b")
    assert b.exception == "KeyError"


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
