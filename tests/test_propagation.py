"""Carrying context into other threads (SPEC 2.5, 7.4).

aprof.wrap, aprof.launch, aprof.propagating and install_propagation: each
submission is an EXECUTOR range on the worker's track, linked to the
submitter, and the user's own context variables follow the work; bare
submissions are not recorded (CP-02..CP-04). Loop callbacks (CP-05), tasks
given an explicit context (CP-07), the trio/anyio thread bridges (CP-08),
load (LD-03) and leaks (LD-05).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import gc
import os
import re
import sys
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

import aprof

from .conftest import Backend

EXECUTOR = aprof.RecordScope.EXECUTOR
USER = aprof.RecordScope.USER_SCOPE
TASK = aprof.RecordScope.TASK

ORIGINAL_SUBMIT = concurrent.futures.ThreadPoolExecutor.submit
ORIGINAL_START = threading.Thread.start

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")

# asyncio runners: plain, uvloop, and the eager task factory where it exists.
APROF_DIR = os.path.dirname(aprof.__file__)

RUNNERS = ["asyncio", "uvloop", *(["asyncio-eager"] if sys.version_info >= (3, 12) else [])]


def run_with(runner: str, main: Callable[[], Any]) -> Any:
    if runner == "uvloop":
        import uvloop

        return uvloop.run(main())
    if runner == "asyncio-eager":

        async def eager() -> Any:
            asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
            return await main()

        return asyncio.run(eager())
    return asyncio.run(main())


def work(tag: str = "") -> tuple[str, int, int]:
    """The submitted job: one user range; reports the context variable and where it ran."""
    with aprof.record_function("inside" + tag):
        return request_id.get(), aprof.current_thread_id(), threading.get_ident()


def ranged(name: str) -> None:
    with aprof.record_function(name):
        pass


def by_scope(prof: aprof.profile, scope: aprof.RecordScope) -> list[aprof.FunctionEvent]:
    return [e for e in prof.events() if e.scope is scope]


def check_executor_ranges(prof: aprof.profile, submitter: int, submitter_os: int, n: int, name: str = "work") -> None:
    """SPEC 7.4: ``n`` EXECUTOR ranges on worker tracks, linked to the
    submitter, each holding one "inside" range as its child."""
    executors = [e for e in by_scope(prof, EXECUTOR) if e.name == name]
    assert len(executors) == n, [(e.name, e.track) for e in by_scope(prof, EXECUTOR)]
    insides = [e for e in by_scope(prof, USER) if e.name.startswith("inside")]
    assert len(insides) == n
    for ex in executors:
        assert ex.thread_id != submitter
        assert ex.os_thread_id != submitter_os
        assert ex.forward_thread_id == submitter
        assert ex.sequence_nr > 0
        assert not ex.unfinished
        assert ex.exception is None
        assert len(ex.children) == 1
        assert ex.children[0].name.startswith("inside")
        assert ex.children[0].parent is ex
        assert ex.children[0].thread_id == ex.thread_id
    assert len({ex.sequence_nr for ex in executors}) == n
    assert {id(e.parent) for e in insides} == {id(ex) for ex in executors}


# ---------------------------------------------------------------------------
# CP-02: the propagation helpers
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
def test_wrap_with_run_in_executor(runner: str) -> None:
    # CP-02, SPEC 2.5, 7.4: aprof.wrap + loop.run_in_executor is an EXECUTOR
    # range on the worker's track, linked to the submitting task, and the
    # user's context variable reaches the work.
    async def main() -> tuple[aprof.profile, int, list[Any]]:
        request_id.set("req-1")
        loop = asyncio.get_running_loop()
        async with aprof.profile() as prof:
            me = aprof.current_thread_id()
            results = [await loop.run_in_executor(None, aprof.wrap(work)) for _ in range(2)]
        return prof, me, results

    prof, me, results = run_with(runner, main)
    assert [r[0] for r in results] == ["req-1", "req-1"]
    check_executor_ranges(prof, me, threading.get_ident(), 2)
    assert all(r[1] != me for r in results)


@pytest.mark.parametrize("how", ["thread", "launch", "submit", "map"])
def test_propagation_helpers_record_executor_ranges(how: str) -> None:
    # CP-02, SPEC 2.5, 7.4: wrap + threading.Thread(target=), aprof.launch,
    # propagating(ThreadPoolExecutor).submit and .map.
    token = request_id.set("req-2")
    try:
        with aprof.profile() as prof:
            me = aprof.current_thread_id()
            if how == "thread":
                out: list[Any] = []

                def thread_job() -> None:
                    out.append(work())

                t = threading.Thread(target=aprof.wrap(thread_job))
                t.start()
                t.join()
                results, name, n = out, "test_propagation_helpers_record_executor_ranges.<locals>.thread_job", 1
            elif how == "launch":
                fut = aprof.launch(work, tag="-kw")
                assert isinstance(fut, Future)
                results, name, n = [fut.result()], "work", 1
            else:
                with aprof.propagating(ThreadPoolExecutor(2)) as pool:
                    if how == "submit":
                        results = [f.result() for f in [pool.submit(work), pool.submit(work, "-arg")]]
                    else:
                        results = list(pool.map(work, ["-a", "-b", "-c"]))
                name, n = "work", len(results)
    finally:
        request_id.reset(token)
    assert [r[0] for r in results] == ["req-2"] * n
    assert all(r[2] != threading.get_ident() for r in results)
    check_executor_ranges(prof, me, threading.get_ident(), n, name=name)
    insides = sorted(e.name for e in by_scope(prof, USER))
    expected = {
        "thread": ["inside"],
        "launch": ["inside-kw"],
        "submit": ["inside", "inside-arg"],
        "map": ["inside-a", "inside-b", "inside-c"],
    }[how]
    assert insides == expected


def test_executor_range_records_the_exception() -> None:
    # SPEC 2.5, 4.2: an exception in launched work reaches the future
    # unchanged, and the EXECUTOR range ends with its type name.
    err = ZeroDivisionError("nope")

    def fail() -> None:
        with aprof.record_function("failing"):
            raise err

    with aprof.profile() as prof:
        fut = aprof.launch(fail)
        with pytest.raises(ZeroDivisionError) as info:
            fut.result()
    assert info.value is err
    (ex,) = by_scope(prof, EXECUTOR)
    assert ex.exception == "ZeroDivisionError"
    assert ex.children[0].exception == "ZeroDivisionError"


def test_helpers_reject_non_callables() -> None:
    # SPEC 2.5, 12: wrap, launch and submit name what was wrong.
    with pytest.raises(TypeError, match="wrap"):
        aprof.wrap(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="launch"):
        aprof.launch("not callable")  # type: ignore[arg-type]
    with aprof.propagating(ThreadPoolExecutor(1)) as pool, pytest.raises(TypeError, match="submit"):
        pool.submit(None)  # type: ignore[arg-type]


def test_bare_submissions_are_not_recorded() -> None:
    # CP-02, SPEC 1, 2.5: bare run_in_executor, Executor.submit and
    # threading.Thread do not carry the context: nothing recorded, the
    # context variable is not seen there, and nothing raises.
    async def main() -> tuple[aprof.profile, list[Any]]:
        request_id.set("req-3")
        loop = asyncio.get_running_loop()
        async with aprof.profile() as prof:
            results = [await loop.run_in_executor(None, work, "-loop")]
            with ThreadPoolExecutor(1) as pool:
                results.append(pool.submit(work, "-submit").result())
            out: list[Any] = []
            t = threading.Thread(target=lambda: out.append(work("-thread")))
            t.start()
            t.join()
            results += out
            with aprof.record_function("control"):
                pass
        return prof, results

    prof, results = asyncio.run(main())
    assert [r[0] for r in results] == ["unset"] * 3
    assert [e.name for e in prof.events()] == ["control"]


def test_to_thread_is_an_executor_range(backend: Backend) -> None:
    # CP-02, CP-08, SPEC 1, 7.4: the runtimes' to_thread copy the context, so
    # ranges inside are recorded on the worker's track; CP-02 also asks for
    # the EXECUTOR range linking them to the submitter. The hook is there
    # only while the profile runs.
    import asyncio.threads

    originals = {"asyncio": asyncio.to_thread, "asyncio.threads": asyncio.threads.to_thread}

    async def main() -> tuple[aprof.profile, int]:
        async with aprof.profile() as prof:
            me = aprof.current_thread_id()
            await backend.to_thread(work)
        return prof, me

    prof, me = backend.run(main)
    (inside,) = by_scope(prof, USER)
    assert inside.thread_id != me
    assert inside.os_thread_id != threading.get_ident()
    check_executor_ranges(prof, me, threading.get_ident(), 1)
    assert {"asyncio": asyncio.to_thread, "asyncio.threads": asyncio.threads.to_thread} == originals


def test_to_thread_with_recording_off_is_not_recorded(backend: Backend) -> None:
    # CP-02, SPEC 3.4: with recording switched off around the call, the
    # hooked to_thread records nothing, and the work runs as before.
    async def main() -> tuple[aprof.profile, tuple[str, int, int]]:
        async with aprof.profile() as prof:
            with aprof.RecordFunctionGuard(enabled=False):
                result = await backend.to_thread(work, "-off")
        return prof, result

    prof, result = backend.run(main)
    assert result[2] != threading.get_ident()
    assert by_scope(prof, EXECUTOR) == []
    assert by_scope(prof, USER) == []


# ---------------------------------------------------------------------------
# CP-03: one wrapped callable run many times at once
# ---------------------------------------------------------------------------


def test_one_wrapped_callable_submitted_many_times() -> None:
    # CP-03, SPEC 2.5: the same aprof.wrap callable running in 8 workers at
    # once never hits "cannot enter context: ... is already entered", and
    # every run is recorded.
    n = 1000
    token = request_id.set("req-4")
    try:
        with aprof.profile() as prof:
            me = aprof.current_thread_id()
            wrapped = aprof.wrap(work)
            with ThreadPoolExecutor(8) as pool:
                results = [f.result() for f in [pool.submit(wrapped) for _ in range(n)]]
    finally:
        request_id.reset(token)
    assert all(r[0] == "req-4" for r in results)
    executors = by_scope(prof, EXECUTOR)
    assert len(executors) == n
    assert len(by_scope(prof, USER)) == n
    assert all(e.forward_thread_id == me and len(e.children) == 1 for e in executors)
    # One wrap is one submission point: every run links to the same spawn.
    assert len({e.sequence_nr for e in executors}) == 1


# ---------------------------------------------------------------------------
# CP-04: install_propagation / uninstall_propagation
# ---------------------------------------------------------------------------


def test_install_propagation_is_idempotent_and_reversible() -> None:
    # CP-04, SPEC 2.5: while installed, bare submit, run_in_executor (asyncio
    # and uvloop) and Thread(target=) carry the context and are recorded once
    # each (installing twice does not wrap twice); after uninstalling twice
    # the stdlib originals are back (identity) and bare submit no longer
    # propagates.
    import uvloop

    async def in_loop() -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, work, "-loop")

    token = request_id.set("req-5")
    try:
        aprof.install_propagation()
        aprof.install_propagation()
        try:
            with aprof.profile() as prof, ThreadPoolExecutor(1) as pool:
                me = aprof.current_thread_id()
                results = [pool.submit(work, "-submit").result(), asyncio.run(in_loop()), uvloop.run(in_loop())]
                out: list[Any] = []
                t = threading.Thread(target=lambda: out.append(work("-thread")))
                t.start()
                t.join()
                results += out
        finally:
            aprof.uninstall_propagation()
            aprof.uninstall_propagation()
        assert concurrent.futures.ThreadPoolExecutor.submit is ORIGINAL_SUBMIT
        assert threading.Thread.start is ORIGINAL_START
        with aprof.profile() as after, ThreadPoolExecutor(1) as pool:
            bare = pool.submit(work, "-after").result()
    finally:
        request_id.reset(token)
    assert [r[0] for r in results] == ["req-5"] * 4
    assert sorted(e.name for e in by_scope(prof, USER)) == [
        "inside-loop",
        "inside-loop",
        "inside-submit",
        "inside-thread",
    ]
    # (asyncio.run's shutdown thread is an EXECUTOR range too: every Thread propagates.)
    executors = [e for e in by_scope(prof, EXECUTOR) if e.children]
    assert len(executors) == 4
    for ex in executors:
        assert len(ex.children) == 1  # installed twice, wrapped once
        assert ex.children[0].name.startswith("inside")
        assert ex.sequence_nr > 0
        assert ex.thread_id != me
    # The two event loops run in this thread but in their own tasks.
    direct = [ex for ex in executors if ex.children[0].name in ("inside-submit", "inside-thread")]
    assert all(ex.forward_thread_id == me for ex in direct)
    assert bare[0] == "unset"
    assert after.events() == []


def test_uninstall_without_install_is_a_no_op() -> None:
    # CP-04, SPEC 2.5: uninstalling when nothing is installed changes nothing.
    aprof.uninstall_propagation()
    assert concurrent.futures.ThreadPoolExecutor.submit is ORIGINAL_SUBMIT
    assert threading.Thread.start is ORIGINAL_START


# ---------------------------------------------------------------------------
# BI-09: process pools
# ---------------------------------------------------------------------------


def test_propagating_takes_a_process_pool_and_refuses_a_non_executor() -> None:
    # BI-09, SPEC 2.5, 11.4: a ProcessPoolExecutor is taken (the work is
    # profiled in the child: tests/test_processes.py); a non-executor is a
    # TypeError.
    pool = concurrent.futures.ProcessPoolExecutor(1)
    try:
        wrapped = aprof.propagating(pool)
        assert wrapped.inner is pool  # type: ignore[attr-defined]
    finally:
        pool.shutdown()
    with pytest.raises(TypeError, match="Executor"):
        aprof.propagating(object())  # type: ignore[arg-type]


def test_propagating_twice_is_the_same_executor() -> None:
    # SPEC 2.5: wrapping a propagating executor again does not record twice.
    with aprof.propagating(ThreadPoolExecutor(1)) as inner:
        outer = aprof.propagating(inner)
        with aprof.profile() as prof:
            outer.submit(work).result()
    assert len(by_scope(prof, EXECUTOR)) == 1


# ---------------------------------------------------------------------------
# CP-05: loop callbacks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
def test_loop_callbacks_follow_the_scheduling_task(runner: str) -> None:
    # CP-05, SPEC 1, 2.2: call_soon, call_later and add_done_callback
    # callbacks scheduled from a profiled task are recorded in its profile,
    # on the loop thread's track (no task runs there); those scheduled from
    # an unprofiled task are not.
    loop_thread = aprof.current_thread_id()  # this OS thread, outside any task
    tasks_in_callbacks: list[Any] = []

    def callback(name: str) -> Callable[..., None]:
        def cb(*_: Any) -> None:
            tasks_in_callbacks.append(asyncio.current_task())
            ranged(name)

        return cb

    async def schedule_all(prefix: str) -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        loop.call_soon(callback(prefix + "call_soon"))
        loop.call_later(0.001, callback(prefix + "call_later"))
        fut = loop.create_future()
        fut.add_done_callback(callback(prefix + "done_callback"))
        fut.add_done_callback(lambda _: done.set())
        loop.call_later(0.002, fut.set_result, None)
        await done.wait()
        await asyncio.sleep(0.003)  # call_later has fired

    async def main() -> tuple[aprof.profile, int]:
        started, other_done = asyncio.Event(), asyncio.Event()
        out: dict[str, Any] = {}

        async def profiled() -> None:
            async with aprof.profile() as prof:
                out["task"] = aprof.current_thread_id()
                started.set()
                await schedule_all("")
                await other_done.wait()  # the other task's callbacks ran while profiling
            out["prof"] = prof

        async def unprofiled() -> None:
            await started.wait()
            await schedule_all("other-")
            other_done.set()

        await asyncio.gather(profiled(), unprofiled())
        return out["prof"], out["task"]

    prof, task_id = run_with(runner, main)
    assert tasks_in_callbacks == [None] * 6
    events = by_scope(prof, USER)
    assert sorted(e.name for e in events) == ["call_later", "call_soon", "done_callback"]
    for e in events:
        assert e.thread_id == loop_thread != task_id
        assert e.os_thread_id == threading.get_ident()
        assert e.track == threading.current_thread().name


# ---------------------------------------------------------------------------
# CP-07: tasks given an explicit context
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("spawn", ["create_task", "TaskGroup"])
def test_task_with_explicit_context(runner: str, spawn: str) -> None:
    # CP-07, SPEC 2.2, 5.2: a task given a context copied before the profile
    # started is not recorded; one given a context copied inside is.
    async def child(name: str) -> None:
        with aprof.record_function(name):
            await asyncio.sleep(0)

    async def main() -> aprof.profile:
        before = contextvars.copy_context()
        async with aprof.profile() as prof:
            inside = contextvars.copy_context()
            if spawn == "create_task":
                await asyncio.create_task(child("before"), context=before)
                await asyncio.create_task(child("inside"), context=inside)
            else:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(child("before"), context=before)
                    tg.create_task(child("inside"), context=inside)
        return prof

    prof = run_with(runner, main)
    assert [e.name for e in by_scope(prof, USER)] == ["inside"]
    tasks = by_scope(prof, aprof.RecordScope.TASK)
    assert len(tasks) == 1
    assert by_scope(prof, USER)[0].parent is tasks[0]


# ---------------------------------------------------------------------------
# CP-08: the thread bridges of trio and anyio (and asyncio's equivalents)
# ---------------------------------------------------------------------------


def from_thread_calls(backend: Backend, loop: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(run an async function, run a sync function) in the event loop, from a worker thread."""
    if backend.is_anyio:
        import anyio.from_thread

        return anyio.from_thread.run, anyio.from_thread.run_sync
    if backend.is_trio:
        import trio

        return trio.from_thread.run, trio.from_thread.run_sync

    def run(afn: Callable[..., Any], *args: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(afn(*args), loop).result()

    def run_sync(fn: Callable[..., Any], *args: Any) -> Any:
        fut: Future[Any] = Future()
        loop.call_soon_threadsafe(lambda: fut.set_result(fn(*args)))
        return fut.result()

    return run, run_sync


def test_thread_bridges_have_the_same_structure(backend: Backend) -> None:
    # CP-08, SPEC 11.1, 2.5, 7.4: to_thread of an aprof.wrap'd job, which
    # calls back into the loop (from_thread.run / run_sync, or asyncio's
    # run_coroutine_threadsafe / call_soon_threadsafe): the same events on
    # every backend.
    async def in_loop(name: str) -> str:
        with aprof.record_function(name):
            await backend.checkpoint()
        return request_id.get()

    def job(run: Callable[..., Any], run_sync: Callable[..., Any]) -> tuple[str, ...]:
        with aprof.record_function("inside"):
            a = run(in_loop, "from-thread")
            run_sync(ranged, "from-thread-sync")
            return request_id.get(), a

    async def main() -> tuple[aprof.profile, int, tuple[str, ...]]:
        request_id.set("req-8")
        loop = None if backend.is_trio or backend.is_anyio else asyncio.get_running_loop()
        run, run_sync = from_thread_calls(backend, loop)
        async with aprof.profile() as prof:
            me = aprof.current_thread_id()
            with aprof.record_function("outer"):
                result = await backend.to_thread(aprof.wrap(job), run, run_sync)
        return prof, me, result

    prof, me, result = backend.run(main)
    assert result == ("req-8", "req-8")
    users = {e.name: e for e in by_scope(prof, USER)}
    assert sorted(users) == ["from-thread", "from-thread-sync", "inside", "outer"]
    outer = users["outer"]
    assert outer.thread_id == me
    (ex,) = by_scope(prof, EXECUTOR)
    assert ex.name == "test_thread_bridges_have_the_same_structure.<locals>.job"
    assert ex.thread_id != me
    assert ex.os_thread_id != threading.get_ident()
    assert ex.forward_thread_id == me
    assert ex.sequence_nr > 0
    assert ex.parent is outer
    assert users["inside"].parent is ex
    # The callbacks into the loop run on the loop's thread, not the worker's track.
    for name in ("from-thread", "from-thread-sync"):
        assert users[name].os_thread_id == threading.get_ident()
        assert users[name].thread_id != ex.thread_id
        assert not users[name].unfinished


@pytest.mark.parametrize("portal_backend", ["asyncio", "trio"])
def test_blocking_portal_call_carries_the_context(portal_backend: str) -> None:
    # CP-08, SPEC 2.5, 11.1: anyio's portal.call from a profiled thread runs
    # the function in the portal's loop with the caller's context.
    import anyio
    import anyio.from_thread

    async def in_portal(name: str) -> str:
        with aprof.record_function(name):
            await anyio.sleep(0)
        return request_id.get()

    def sync_in_portal(name: str) -> str:
        ranged(name)
        return request_id.get()

    token = request_id.set("req-9")
    try:
        with aprof.profile() as prof:
            me = aprof.current_thread_id()
            with (
                aprof.record_function("outer"),
                anyio.from_thread.start_blocking_portal(portal_backend) as portal,
            ):
                results = [portal.call(in_portal, "portal-async"), portal.call(sync_in_portal, "portal-sync")]
    finally:
        request_id.reset(token)
    assert results == ["req-9", "req-9"]
    users = {e.name: e for e in by_scope(prof, USER)}
    assert sorted(users) == ["outer", "portal-async", "portal-sync"]
    for name in ("portal-async", "portal-sync"):
        assert users[name].thread_id != me
        assert users[name].os_thread_id != threading.get_ident()
        assert not users[name].unfinished


# ---------------------------------------------------------------------------
# LD-03: threads, tasks, to_thread and launch together
# ---------------------------------------------------------------------------


def test_threads_tasks_to_thread_and_launch_under_load() -> None:
    # LD-03, SPEC 2.5, 6.1: 4 OS threads (asyncio and uvloop), 100 tasks
    # each, every task using to_thread and aprof.launch: exact per-track
    # totals, nothing lost, duplicated or mis-attributed, no deadlock.
    import uvloop

    n_threads, n_tasks = 4, 100

    async def one_task(i: int) -> None:
        with aprof.record_function("task"):
            await asyncio.to_thread(ranged, "to-thread")
            await asyncio.wrap_future(aprof.launch(ranged, "launched"))

    async def thread_loop() -> None:
        async with asyncio.TaskGroup() as tg:
            for i in range(n_tasks):
                tg.create_task(one_task(i))

    def thread_main(k: int) -> None:
        (uvloop.run if k % 2 else asyncio.run)(thread_loop())

    with aprof.profile() as prof:
        threads = [threading.Thread(target=aprof.wrap(thread_main), args=(k,)) for k in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    total = n_threads * n_tasks
    users = by_scope(prof, USER)
    counts = Counter(e.name for e in users)
    assert counts == {"task": total, "to-thread": total, "launched": total}
    assert all(not e.unfinished and not e.is_async for e in users)
    task_ranges = [e for e in users if e.name == "task"]
    task_ids = Counter(e.thread_id for e in task_ranges)
    assert len(task_ids) == total  # one track per task, one range on each
    jobs = [e for e in by_scope(prof, EXECUTOR) if e.name == "ranged"]
    # Each task launched once and went to a thread once (the tasks of the
    # threads' loops are spawned in the profiled context, so their
    # to_thread work is an EXECUTOR range too, SPEC 7.1, 7.4): every task
    # track is the forward link of exactly one job of each kind.
    for kind in ("launched", "to-thread"):
        of_kind = [e for e in jobs if [c.name for c in e.children] == [kind]]
        assert len(of_kind) == total
        assert Counter(e.forward_thread_id for e in of_kind) == task_ids
    assert len(jobs) == 2 * total
    tasks = {e.thread_id: e for e in by_scope(prof, TASK)}
    assert all(tasks[e.thread_id].name == e.track for e in task_ranges)  # each on its TASK's track
    for e in users:
        if e.name == "to-thread":
            assert e.thread_id not in task_ids
    # No duplicates: every (track, start) is one event.
    assert len({(e.thread_id, e.start_ns, e.name) for e in users}) == len(users)


# ---------------------------------------------------------------------------
# LD-05: a long-lived pool keeps nothing alive
# ---------------------------------------------------------------------------


class Payload:
    """A user object stored in a context variable."""


payload_var: contextvars.ContextVar[Payload | None] = contextvars.ContextVar("payload", default=None)


def test_long_lived_pool_keeps_no_profile_or_user_value_alive() -> None:
    # LD-05, SPEC 12: after the profile is stopped and deleted, a propagating
    # pool that ran its work (and aprof.launch's pool) holds neither the
    # profile's state nor the user's context values.
    pool = aprof.propagating(ThreadPoolExecutor(2))
    try:

        def request() -> tuple[weakref.ref[Any], weakref.ref[Payload]]:
            payload = Payload()
            payload_var.set(payload)
            prof = aprof.profile().start()
            state = aprof.get_debug_info(aprof.DebugInfoKind.PROFILER_STATE)
            assert state is not None
            futures = [pool.submit(work) for _ in range(4)]
            futures += list(pool.map(work, ["-m1", "-m2"]))  # results, not futures: harmless
            futures.append(aprof.launch(work))
            for f in futures:
                if isinstance(f, Future):
                    f.result()
            prof.stop()
            assert len(by_scope(prof, EXECUTOR)) == 7
            refs = weakref.ref(state), weakref.ref(payload)
            del prof, state, payload, futures
            return refs

        state_ref, payload_ref = contextvars.copy_context().run(request)
        gc.collect()
        assert state_ref() is None, gc.get_referrers(state_ref())
        assert payload_ref() is None, gc.get_referrers(payload_ref())
        # The pool is still alive and usable.
        assert pool.submit(work).result()[0] == "unset"
        assert isinstance(pool, concurrent.futures.Executor)
    finally:
        pool.shutdown()


# ---------------------------------------------------------------------------
# install_propagation and threading.Timer (issue 15 item 9)
# ---------------------------------------------------------------------------

ORIGINAL_TIMER_RUN = threading.Timer.run


def test_install_propagation_covers_threading_timer() -> None:
    # SPEC 2.5, 7.4, 15.6 (issue 15 item 9): while installed, a Timer's
    # function runs in a copy of the context that started the timer, as an
    # EXECUTOR range on the timer's thread linked to the start; the timer's
    # function attribute is the program's own. A cancelled timer records
    # nothing; after uninstalling, a timer propagates nothing.
    results: list[tuple[str, int, int]] = []

    def fire(tag: str) -> None:
        results.append(work(tag))

    token = request_id.set("req-timer")
    try:
        aprof.install_propagation()
        try:
            with aprof.profile() as prof:
                me = aprof.current_thread_id()
                timer = threading.Timer(0.0, fire, args=("-timer",))
                timer.start()
                timer.join()
                assert timer.function is fire
                cancelled = threading.Timer(60.0, fire, args=("-cancelled",))
                cancelled.start()
                cancelled.cancel()
                cancelled.join()
        finally:
            aprof.uninstall_propagation()
        assert threading.Timer.run is ORIGINAL_TIMER_RUN
        with aprof.profile() as after:
            late = threading.Timer(0.0, fire, args=("-after",))
            late.start()
            late.join()
    finally:
        request_id.reset(token)
    assert [r[0] for r in results] == ["req-timer", "unset"]
    (ex,) = by_scope(prof, EXECUTOR)
    assert ex.name == "test_install_propagation_covers_threading_timer.<locals>.fire"
    assert ex.forward_thread_id == me
    assert ex.thread_id == results[0][1] != me
    assert [c.name for c in ex.children] == ["inside-timer"]
    assert after.events() == []


def test_timer_subclass_overriding_run_is_left_alone() -> None:
    # SPEC 2.5, 15.6: as with Thread subclasses, a Timer subclass with its
    # own run() is not wrapped, and runs as it would without aprof.
    ran: list[str] = []

    class MyTimer(threading.Timer):
        def run(self) -> None:
            ran.append(request_id.get())

    token = request_id.set("req-sub")
    aprof.install_propagation()
    try:
        t = MyTimer(0.0, print)
        t.start()
        t.join()
    finally:
        aprof.uninstall_propagation()
        request_id.reset(token)
    assert ran == ["unset"]
    assert "_aprof_call" not in vars(t)


class _Job:
    """A callable object: named after its type."""

    def __call__(self, tag: str) -> str:
        with aprof.record_function("inside" + tag):
            return tag


def _executor_scenario(scope: str, with_stack: bool, budget: int | None) -> list[tuple[Any, ...]]:
    """Jobs run as EXECUTOR ranges every way the range is taken (propagating,
    a wrapped callable, follow_executors' bare submit and to_thread, a
    partial, a callable object, a failing job), and what was recorded, with
    the counters that differ from run to run (sequence numbers, thread ids)
    made relative (and the numbers in the names of pools' threads and tasks)."""
    import functools

    from aprof._integrations._executors import follow_executors

    def fail() -> None:
        raise KeyError("x")

    kwargs: dict[str, Any] = {"with_stack": with_stack}
    if budget is not None:
        kwargs["max_events"] = budget
    with aprof.profile(scope=scope, **kwargs) as prof:  # type: ignore[arg-type]
        with aprof.propagating(ThreadPoolExecutor(1)) as pool:
            assert pool.submit(work, "-a").result()[0] == "unset"
            assert pool.submit(functools.partial(work, "-b")).result()[0] == "unset"
            assert pool.submit(_Job(), "-c").result() == "-c"
            with pytest.raises(KeyError):
                pool.submit(fail).result()
        undo = follow_executors()
        try:
            with ThreadPoolExecutor(1) as bare:
                bare.submit(work, "-d").result()

            async def main() -> None:
                await asyncio.to_thread(work, "-e")

            asyncio.run(main())
        finally:
            undo()
    events = sorted(prof.events(), key=lambda e: (e.start_ns, e.name))
    seqs = sorted({e.sequence_nr for e in events if e.sequence_nr > 0})
    tids: dict[int, int] = {}
    for e in events:
        tids.setdefault(e.thread_id, len(tids))
    return [
        (
            re.sub(r"\d+", "N", e.name), e.scope, e.args, re.sub(r"\d+", "N", e.track), tids[e.thread_id], tids.get(e.end_thread_id), e.exception, e.unfinished,
            seqs.index(e.sequence_nr) if e.sequence_nr > 0 else e.sequence_nr,
            tids.get(e.forward_thread_id, e.forward_thread_id), sorted(e.extra or {}),
            # aprof's own frames inside a stack are the implementation's: the
            # twin's Python frame is one more than the C function has.
            e.stack and [f for f in e.stack if not f[0].startswith(APROF_DIR)],
            [c.name for c in e.children],
        )
        for e in events
    ]  # fmt: skip


@pytest.mark.parametrize(("scope", "with_stack", "budget"), [("context", False, None), ("context", True, None), ("global", False, None), ("context", False, 12)])
def test_executor_range_in_c_matches_the_python_twin(
    scope: str, with_stack: bool, budget: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 20, SPEC 15.2: the EXECUTOR range runs in C when the extension
    # is active (_executor_range, aprof/_cranges.c); its pure-Python twin
    # (_run_executor_range_py) records the same events: names, scopes,
    # tracks, links (flow ids), exceptions, submit times, stacks.
    from aprof._core import _native, _propagation
    from aprof._integrations import _executors

    from .conftest import require_c_extension

    if _native.extension is None:
        pytest.skip("the C extension is not active (APROF_PURE_PYTHON=1)")
    ext = require_c_extension()
    assert _propagation._run_executor_range is ext._executor_range
    got = _executor_scenario(scope, with_stack, budget)
    monkeypatch.setattr(_propagation, "_run_executor_range", _propagation._run_executor_range_py)
    monkeypatch.setattr(_executors, "_run_executor_range", _propagation._run_executor_range_py)
    want = _executor_scenario(scope, with_stack, budget)
    assert got == want
    names = [r[0] for r in got if r[1] is EXECUTOR]
    if budget is None:
        # The bare submit runs in the worker's own context: only a global
        # profile sees it; to_thread carries the caller's.
        bare = ["work"] if scope == "global" else []
        assert names == ["work", "work", "_Job", "_executor_scenario.<locals>.fail", *bare, "work"]
        assert [r[6] for r in got if r[1] is EXECUTOR] == [None, None, None, "KeyError", *[None] * len(bare), None]
        assert all(r[11] is not None for r in got if r[1] is EXECUTOR) == with_stack
    else:
        assert len(got) <= budget


def test_executor_range_in_c_rejects_bad_arguments() -> None:
    # The C entry point says what it takes instead of crashing.
    from aprof._core import _native

    if _native.extension is None:
        pytest.skip("the C extension is not active (APROF_PURE_PYTHON=1)")
    with pytest.raises(TypeError, match="_executor_range"):
        _native.extension._executor_range(print, [], {}, 0, 1, 2)
    with pytest.raises(TypeError, match="_executor_range"):
        _native.extension._executor_range(print, (), {})
