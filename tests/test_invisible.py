"""Nothing aprof does is visible to the profiled program (SPEC 15.6).

What a program can observe about its tasks, threads and contexts is the same
with a profile running as without one: task names, ``task.get_coro()``,
tracebacks, the loop's task factory, worker threads' names and contexts,
reference lifetimes and exit status (issue 15 items 10-15d). Each scenario
runs the program both ways, or checks what a plain run would show.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import re
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

import aprof

from .conftest import Backend

ROOT = Path(__file__).resolve().parent.parent
APROF_DIR = str(ROOT / "aprof")
RUNNERS = ["asyncio", "uvloop"]
TASK = aprof.RecordScope.TASK


def run_on(runner: str, main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    if runner == "uvloop":
        import uvloop

        return uvloop.run(main())
    return asyncio.run(main())


def both_ways(run: Callable[[], Any]) -> tuple[Any, Any, aprof.profile]:
    """``run()`` plain, then under a global profile: (plain result, profiled result, the profile)."""
    plain = run()
    with aprof.profile(scope="global") as prof:
        profiled = run()
    return plain, profiled, prof


# ---------------------------------------------------------------------------
# Items 10, 13, 15d: names, coroutines, tracebacks and the task factory
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
def test_unnamed_tasks_keep_their_names_everywhere(runner: str) -> None:
    # SPEC 15.6, 7.1, 6.4, 7.5, issue 15 item 10 (3.13 named them "None"):
    # an unnamed task is "Task-N" as the program sees it, and the same name
    # is on its TASK range, its track, the track table and a loop block it
    # causes.
    async def blocks() -> str:
        await asyncio.sleep(0.01)
        deadline = time.perf_counter() + 0.15  # holds the loop (SPEC 7.5)
        while time.perf_counter() < deadline:
            pass
        current = asyncio.current_task()
        assert current is not None
        return current.get_name()

    async def main() -> tuple[str, aprof.profile]:
        async with aprof.profile(loop_block_threshold=0.03) as prof:
            name = await asyncio.create_task(blocks())
            for _ in range(5):
                await asyncio.sleep(0.01)  # the heartbeat sees the block end
        return name, prof

    name, prof = run_on(runner, main)
    assert re.fullmatch(r"Task-\d+", name), name
    (task,) = [e for e in prof.events() if e.scope is TASK]
    assert task.name == task.track == name
    assert f"{name} ({task.thread_id})" in {r.key for r in prof.key_averages(group_by="track")}
    blocked = [e.name for e in prof.events() if e.scope is aprof.RecordScope.LOOP_BLOCK]
    assert f"loop blocked by {name}" in blocked, blocked
    assert "loop blocked by None" not in blocked


@pytest.mark.parametrize("runner", RUNNERS)
def test_get_coro_and_tracebacks_are_the_programs(runner: str) -> None:
    # SPEC 15.6, issue 15 item 13: task.get_coro() is the coroutine the
    # program passed (a real coroutine), the task's stack is its own, and a
    # failed task's traceback holds no aprof frame.
    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    async def main() -> tuple[bool, bool, list[str], list[str]]:
        coro = fails()
        task = asyncio.create_task(coro)
        same = task.get_coro() is coro
        real = inspect.iscoroutine(task.get_coro())
        await asyncio.sleep(0)
        stack = [f.f_code.co_filename for f in task.get_stack()]
        try:
            await task
        except ValueError as exc:
            tb = [f.filename for f in traceback.extract_tb(exc.__traceback__)]
        return same, real, stack, tb

    plain, profiled, _ = both_ways(lambda: run_on(runner, main))
    assert profiled[:2] == (True, True)
    assert profiled == plain
    assert not any(f.startswith(APROF_DIR) for f in profiled[2] + profiled[3])


def test_scheduled_steps_read_as_asyncios_own() -> None:
    # SPEC 15.6, issue 15 item 13: in debug mode (which checks and formats
    # every callback), a recorded task's scheduled step reads as asyncio's
    # own: the handle's repr, its callback's repr, __self__ and class; and
    # loop.call_soon reads as the loop's method.
    async def child() -> None:
        await asyncio.sleep(0)

    def normalise(text: str) -> str:
        return re.sub(r"0x[0-9a-f]+", "0x", text)

    async def main() -> list[object]:
        loop = asyncio.get_running_loop()
        loop.set_debug(True)
        task = asyncio.create_task(child())
        (handle,) = [h for h in loop._ready if getattr(h._callback, "__self__", None) is task]  # type: ignore[attr-defined]
        cb = handle._callback
        seen = [
            normalise(repr(handle)),
            normalise(repr(cb)),
            cb.__self__ is task,
            cb.__class__.__name__,
            normalise(repr(loop.call_soon)),
            loop.call_soon.__name__,
        ]
        await task
        return seen

    plain, profiled, prof = both_ways(lambda: asyncio.run(main()))
    assert profiled == plain
    assert len([e for e in prof.events() if e.scope is TASK]) >= 2


@pytest.mark.parametrize("runner", RUNNERS)
def test_the_task_factory_is_the_programs(runner: str) -> None:
    # SPEC 15.6, issue 15 item 15d: loop.get_task_factory() returns what the
    # program installed (None, or its own), while a profile runs too.
    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def main() -> list[object]:
        loop = asyncio.get_running_loop()
        seen = [loop.get_task_factory()]
        loop.set_task_factory(factory)
        seen.append(loop.get_task_factory())
        await asyncio.create_task(asyncio.sleep(0))
        loop.set_task_factory(None)
        seen.append(loop.get_task_factory())
        return seen

    plain, profiled, prof = both_ways(lambda: run_on(runner, main))
    assert plain == profiled == [None, factory, None]
    assert len([e for e in prof.events() if e.scope is TASK]) >= 1


@pytest.mark.skipif(sys.version_info < (3, 12), reason="asyncio.eager_task_factory is new in 3.12")
@pytest.mark.parametrize("backend_name", ["anyio-asyncio"])
def test_anyio_sees_the_eager_task_factory(backend_name: str) -> None:
    # SPEC 15.6, 11.1, issue 15 item 15d: anyio recognises the eager task
    # factory through loop.get_task_factory() and then starts its task
    # group's tasks lazily; a cancel scope in a child works under a profile
    # as without one (309 of anyio's tests failed when aprof's factory hid
    # the eager one).
    import anyio

    async def child(out: list[str]) -> None:
        with anyio.CancelScope():
            await anyio.sleep(0)
        out.append("ok")

    async def main() -> list[str]:
        asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
        out: list[str] = []
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(child, out)
        return out

    plain, profiled, prof = both_ways(lambda: asyncio.run(main()))
    assert plain == profiled == ["ok"] * 3
    assert len([e for e in prof.events() if e.scope is TASK]) >= 3


# ---------------------------------------------------------------------------
# Items 12 and 15c: worker threads' names and contexts
# ---------------------------------------------------------------------------


def test_trio_worker_threads_keep_their_names(tmp_path: Path) -> None:
    # SPEC 15.6, 9.1, issue 15 item 12: under `aprof run`, trio's worker
    # threads are named after the function they run, as without aprof, and
    # the cached worker's track is named after the thread (its name at stop),
    # not after the first job it ran.
    script = tmp_path / "names.py"
    script.write_text(
        "import threading, trio\n"
        "seen = []\n"
        "def f():\n    seen.append(threading.current_thread().name)\n"
        "def g():\n    seen.append(threading.current_thread().name)\n"
        "async def main():\n"
        "    await trio.to_thread.run_sync(f)\n"
        "    async with trio.open_nursery() as n:\n"
        "        n.start_soon(trio.to_thread.run_sync, g, name='other')\n"
        "    await trio.to_thread.run_sync(f)\n"
        "trio.run(main)\n"
        "print(seen)\n"
    )
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True)
    out = tmp_path / "t.aprof"
    profiled = subprocess.run(
        [sys.executable, "-m", "aprof", "run", "--no-summary", "-o", str(out), str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert plain.stdout == profiled.stdout == "['f from __main__.main', 'g from other', 'f from __main__.main']\n"
    session = aprof.load(out)
    jobs = [e for e in session.events() if e.scope is aprof.RecordScope.EXECUTOR]
    assert sorted(e.name for e in jobs) == ["f", "f", "g"]
    (track,) = {e.track for e in jobs}
    assert re.fullmatch(r"Trio thread \d+", track), track


@pytest.mark.parametrize("backend_name", ["asyncio", "trio", "anyio-asyncio", "anyio-trio"])
def test_to_thread_workers_see_the_context_their_runtime_prepared(backend_name: str) -> None:
    # SPEC 15.6, 7.4, issue 15 item 15c: anyio sets sniffio's library to
    # None in its worker thread; trio and asyncio hand the worker a copy of
    # the caller's context. Under a profile the worker sees exactly that
    # (and its work is still an EXECUTOR range).
    import sniffio

    backend = Backend(backend_name)

    def in_worker() -> str | None:
        try:
            return str(sniffio.current_async_library())
        except sniffio.AsyncLibraryNotFoundError:
            return None

    async def main() -> str | None:
        return await backend.to_thread(in_worker)  # type: ignore[no-any-return]

    plain = backend.run(main)

    async def profiled_main() -> tuple[str | None, aprof.profile]:
        async with aprof.profile() as prof:
            got = await backend.to_thread(in_worker)
        return got, prof

    profiled, prof = backend.run(profiled_main)
    assert profiled == plain
    if backend.is_anyio:
        assert plain is None
    assert [e.name for e in prof.events() if e.scope is aprof.RecordScope.EXECUTOR] == [
        "test_to_thread_workers_see_the_context_their_runtime_prepared.<locals>.in_worker"
    ]


# ---------------------------------------------------------------------------
# Items 14 and 15b: reference lifetimes
# ---------------------------------------------------------------------------


class _Payload:
    pass


@pytest.mark.parametrize("backend_name", ["anyio-asyncio", "anyio-trio"])
def test_a_failed_anyio_task_is_freed_without_the_cyclic_gc(backend_name: str) -> None:
    # SPEC 15.6, 12, issue 15 item 15b: anyio breaks the reference cycles of a
    # failed task on purpose; naming its task (reading the wrapper
    # coroutine's frame) must not re-create one, or the exception, its
    # traceback and every frame's locals live until a collection.
    import anyio

    backend = Backend(backend_name)
    refs: list[weakref.ref[_Payload]] = []

    async def fails() -> None:
        payload = _Payload()
        refs.append(weakref.ref(payload))
        await anyio.sleep(0)
        raise ValueError("boom")

    async def main() -> bool:
        async with aprof.profile():
            gc.disable()
            try:
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(fails)
                except BaseException:  # the ExceptionGroup, dropped at once
                    pass
                return refs[-1]() is None
            finally:
                gc.enable()

    assert backend.run(main)


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_dropped_task_dies_when_it_would_without_aprof(runner: str) -> None:
    # SPEC 15.6, 12: a failed task nobody awaits is freed when the loop lets
    # go of its last step, outside its context, and the loop's exception
    # handler runs where the loop runs it: asyncio's in the task's own
    # context on 3.12+ (CPython's test_task_exc_handler_correct_context), in
    # the loop's on 3.11 and on uvloop. aprof broke both: the task died
    # inside its step, its context still entered.
    import contextvars

    name: contextvars.ContextVar[str] = contextvars.ContextVar("name", default="outside")

    async def fails() -> None:
        name.set("inside")
        raise ZeroDivisionError

    async def main() -> list[str]:
        seen: list[str] = []
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: seen.append(name.get()))
        asyncio.create_task(fails())  # dropped at once: nobody awaits it
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        gc.collect()
        loop.set_exception_handler(None)
        return seen

    plain, profiled, _ = both_ways(lambda: run_on(runner, main))
    inside = runner == "asyncio" and sys.version_info >= (3, 12)
    assert plain == profiled == (["inside"] if inside else ["outside"])


@pytest.mark.parametrize("runner", RUNNERS)
def test_finished_loops_are_not_kept_alive_by_a_global_profile(runner: str) -> None:
    # SPEC 15.6, 12, issue 15 item 14: a program that runs asyncio.run() many
    # times under a global profile (aprof run, pytest --aprof) gets its
    # finished loops collected as it would without aprof.
    async def work() -> None:
        await asyncio.create_task(asyncio.sleep(0))

    def loops_alive() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_closed())

    before = loops_alive()
    with aprof.profile(scope="global") as prof:
        for _ in range(20):
            run_on(runner, work)
        during = loops_alive()
    assert during - before <= 1, f"{during - before} finished loops are still alive"
    assert len([e for e in prof.events() if e.scope is TASK]) >= 20


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_finished_loop_dies_without_the_cyclic_gc_as_it_would_without_aprof(runner: str) -> None:
    # SPEC 15.6, issue 15 item 14: the loop holds aprof's call_soon hook, so
    # a hook holding the loop would make a cycle, and a loop freed by its
    # last reference without aprof would wait for the cyclic GC (anyio's
    # test_asyncio_run_does_not_leak_event_loop: a worker thread drops the
    # loop after the test's gc.collect()). The hook holds the loop weakly
    # where it can (asyncio's loops; uvloop's cannot be weakly referenced).
    async def main() -> tuple[weakref.ref[Any], str, bool]:
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: None)
        await asyncio.create_task(asyncio.sleep(0))
        return weakref.ref(loop), repr(loop.call_soon), loop.call_soon.__self__ is loop

    def run() -> tuple[bool, str, bool]:
        gc.collect()
        gc.disable()
        try:
            ref, call_soon_repr, bound_to_loop = run_on(runner, main)
            return ref() is None, call_soon_repr.split(" of ")[0], bound_to_loop
        finally:
            gc.enable()

    plain, profiled, prof = both_ways(run)
    if runner == "uvloop":  # held by its hook, as it was before
        assert plain[1:] == profiled[1:]
    else:
        assert plain == profiled == (True, "<bound method BaseEventLoop.call_soon", True)
    assert [e for e in prof.events() if e.scope is TASK]


def test_a_finished_loop_is_freed_under_aprof_runs_defaults() -> None:
    # SPEC 15.6, 7.5: what `aprof run` switches on (a global profile that
    # watches every loop for blocks) must not keep a finished loop alive:
    # the loop-block watch, its heartbeat on the loop and the list of
    # watched loops hold it weakly (anyio's
    # test_asyncio_run_does_not_leak_event_loop failed under `aprof run`).
    # asyncio only: uvloop's loops cannot be weakly referenced, by aprof or
    # by a test.
    async def main() -> weakref.ref[Any]:
        await asyncio.sleep(0)
        return weakref.ref(asyncio.get_running_loop())

    with aprof.profile(scope="global", loop_block_threshold=0.05):
        ref = asyncio.run(main())
        gc.collect()
        assert ref() is None


# ---------------------------------------------------------------------------
# Item 15: exit status when a trio run fails before its first task
# ---------------------------------------------------------------------------

FAILED_TRIO_RUN = """
import trio

async def main(needed):
    pass

try:
    trio.run(main)  # a missing argument: the run fails before its main task starts
except TypeError as exc:
    print("the program caught:", exc)
"""


def test_a_trio_run_that_fails_early_does_not_break_the_profile() -> None:
    # SPEC 5.4, 12, 15.6, issue 15 item 15: stop() succeeds after a trio run
    # that failed before its main task (its wake-up socket is closed), leaves
    # no hook behind, and a later run is recorded as usual.
    import trio

    async def main(needed: int) -> None:
        pass

    async def works() -> None:
        with aprof.record_function("in-the-second-run"):
            await trio.sleep(0)

    prof = aprof.profile(scope="global").start()
    with pytest.raises(TypeError):
        trio.run(main)  # type: ignore[call-arg]
    trio.run(works)
    prof.stop()
    assert not aprof.has_callbacks()
    assert [e.name for e in prof.events() if e.scope is aprof.RecordScope.USER_SCOPE] == ["in-the-second-run"]


def test_aprof_run_exits_as_the_program_after_a_failed_trio_run(tmp_path: Path) -> None:
    # SPEC 10.1, 15.6, issue 15 item 15: `aprof run` exits 0 for a program
    # that exits 0, writes the trace, and prints no traceback of its own.
    script = tmp_path / "failed_run.py"
    script.write_text(FAILED_TRIO_RUN)
    out = tmp_path / "t.json"
    proc = subprocess.run(
        [sys.executable, "-m", "aprof", "run", "--no-summary", "-o", str(out), str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "the program caught" in proc.stdout
    assert "Traceback" not in proc.stderr
    assert out.exists()


pytest_plugins = ["pytester"]


def test_pytest_aprof_passes_a_test_with_a_failed_trio_run(pytester: pytest.Pytester) -> None:
    # SPEC 11.2, 15.6, issue 15 item 15: `pytest --aprof` passes a test that
    # passes without it.
    pytester.makepyfile(
        test_inner="""
import pytest, trio

async def main(needed):
    pass

def test_failed_run_is_caught():
    with pytest.raises(TypeError):
        trio.run(main)
"""
    )
    result = pytester.runpytest_subprocess("--aprof=traces")
    result.assert_outcomes(passed=1)


def test_worker_thread_is_left_alone() -> None:
    # SPEC 15.6: threads aprof does not own keep their names (a guard for the
    # track-naming change: aprof reads thread names, never sets them).
    names: list[str] = []
    t = threading.Thread(target=lambda: names.append(threading.current_thread().name), name="mine")
    with aprof.profile(scope="global"):
        t.start()
        t.join()
    assert names == ["mine"]
    assert t.name == "mine"


# ---------------------------------------------------------------------------
# trio runs under a global profile: no public name replaced, no task added
# (trio's own suite under `aprof run` / `pytest --aprof`, tests/wild)
# ---------------------------------------------------------------------------


def test_trio_public_functions_stay_trios_own() -> None:
    # SPEC 15.6: a global profile hooks new trio runs without replacing
    # trio.run or trio.lowlevel.start_guest_run (trio's
    # test_core_is_properly_reexported failed under `pytest --aprof`).
    import trio
    import trio._core

    with aprof.profile(scope="global"):
        assert trio.run is trio._core.run
        assert trio.lowlevel.start_guest_run is trio._core.start_guest_run
    assert trio.run is trio._core.run


def test_trio_loop_block_watch_adds_no_task_and_no_deadline() -> None:
    # SPEC 15.6, 7.5: the loop-block watch `aprof run` switches on adds no
    # task and no deadline to a trio run, so wait_all_tasks_blocked with a
    # cushion returns as it would without aprof (trio's
    # test_host_wakeup_doesnt_trigger_wait_all_tasks_blocked hung, and
    # test_guest_warns_if_abandoned failed, under `aprof run`).
    import trio
    import trio.testing

    async def main() -> tuple[int, float, bool]:
        await trio.sleep(0.01)
        stats = trio.lowlevel.current_statistics()
        with trio.move_on_after(3) as scope:
            await trio.testing.wait_all_tasks_blocked(cushion=0.2)
        return stats.tasks_living, stats.seconds_to_next_deadline, scope.cancelled_caught

    plain = trio.run(main)
    with aprof.profile(scope="global", loop_block_threshold=0.05):
        profiled = trio.run(main)
    assert plain == profiled == (3, float("inf"), False)


def test_trio_loop_blocks_are_still_found_without_a_heartbeat() -> None:
    # SPEC 7.5: with the watch an instrument, a step that holds the run is
    # still a block, with its stack.
    import trio

    async def hog() -> None:
        await trio.sleep(0)
        time.sleep(0.2)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hog)

    with aprof.profile(scope="global", loop_block_threshold=0.05) as prof:
        trio.run(main)
    blocks = [e for e in prof.events() if e.scope is aprof.RecordScope.LOOP_BLOCK]
    assert len(blocks) == 1
    assert blocks[0].name.endswith("hog")
    assert blocks[0].duration_ns >= 150_000_000
