"""Tasks on their own tracks (SPEC 7.1-7.4, the flow arrows of 9.1, 11.1).

Every task spawned in a profiled context is a TASK range on its own track,
from spawn to finish, named after the task, carrying its coroutine's name
and its outcome, linked to the range it was spawned from; its time splits
into running and waiting. asyncio (plain, eager, uvloop), trio and anyio
behave the same (the ``backend`` fixture); asyncio-only spawn APIs are
checked on asyncio and uvloop. RELIABILITY cases CP-01, CP-06, CP-07, LD-01
(scaled) and LC-05.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

import aprof

from . import conftest
from .conftest import Backend, named_group
from .tracecheck import validate_trace

TASK = aprof.RecordScope.TASK
USER = aprof.RecordScope.USER_SCOPE
EXECUTOR = aprof.RecordScope.EXECUTOR

# asyncio-only APIs run on asyncio and on uvloop (SPEC 11.1).
RUNNERS = ["asyncio", "uvloop"]
needs_eager = pytest.mark.skipif(sys.version_info < (3, 12), reason="asyncio.eager_task_factory is new in 3.12")


def uvloop_runs_eager_tasks() -> bool:
    """Whether this uvloop and this asyncio agree on the eager task factory.

    uvloop 0.21+ passes ``eager_start=`` to task factories on 3.13, which
    the eager factory of CPython 3.13.0 refuses with a TypeError, profiled
    or not; where they disagree, uvloop + eager is not a combination a
    program can use, so it is not tested.
    """
    if sys.version_info < (3, 12):
        return False
    import uvloop

    async def nothing() -> None:
        pass

    async def probe() -> bool:
        loop = asyncio.get_running_loop()
        loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
        coro = nothing()
        try:
            await loop.create_task(coro)
        except TypeError:
            coro.close()
            return False
        finally:
            loop.set_task_factory(None)
        return True

    return bool(uvloop.run(probe()))


EAGER_RUNNERS = ["asyncio", *(["uvloop"] if uvloop_runs_eager_tasks() else [])]


def new_loop(runner: str) -> asyncio.AbstractEventLoop:
    if runner == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run_on(runner: str, main: Callable[[], Coroutine[Any, Any, Any]], *, eager: bool = False) -> Any:
    """Run ``main()`` on a fresh asyncio or uvloop loop, optionally with the eager task factory."""

    async def top() -> Any:
        if eager:
            asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
        return await main()

    if runner == "uvloop":
        import uvloop

        return uvloop.run(top())
    return asyncio.run(top())


def by_scope(events: list[aprof.FunctionEvent], scope: aprof.RecordScope) -> list[aprof.FunctionEvent]:
    return [e for e in events if e.scope is scope]


def one(events: list[aprof.FunctionEvent], name: str) -> aprof.FunctionEvent:
    found = [e for e in events if e.name == name]
    assert len(found) == 1, f"expected one {name!r}, got {found}"
    return found[0]


def on_track(events: list[aprof.FunctionEvent], tid: int) -> list[aprof.FunctionEvent]:
    return [e for e in events if e.thread_id == tid]


def task_of(events: list[aprof.FunctionEvent], ev: aprof.FunctionEvent) -> aprof.FunctionEvent:
    """The TASK event on ``ev``'s track."""
    tasks = [t for t in by_scope(events, TASK) if t.thread_id == ev.thread_id]
    assert len(tasks) == 1, f"expected one TASK on the track of {ev}, got {tasks}"
    return tasks[0]




def check_spawned(
    events: list[aprof.FunctionEvent], parent: aprof.FunctionEvent, child_ranges: list[aprof.FunctionEvent]
) -> None:
    """CP-01: each child range sits in its own TASK range, on its own track,
    linked to ``parent``; the parent's track holds only the parent's events."""
    tasks = by_scope(events, TASK)
    assert len(tasks) == len(child_ranges)
    assert len({t.thread_id for t in tasks} | {parent.thread_id}) == len(tasks) + 1
    seqs = set()
    for r in child_ranges:
        task = task_of(events, r)
        assert r.parent is task  # SPEC 7.1: the child's range is inside its task's range
        assert task.children == [r]
        assert task.parent is parent  # linked to the range it was spawned in
        assert task.forward_thread_id == parent.thread_id  # SPEC 7.2
        assert task.sequence_nr > 0
        seqs.add(task.sequence_nr)
        assert not task.is_async
        assert not task.unfinished
        assert task.start_ns <= r.start_ns <= r.end_ns <= task.end_ns
        assert parent.start_ns <= task.extra["spawn_ns"] <= parent.end_ns
    assert len(seqs) == len(child_ranges)  # one sequence number per spawn
    # The parent's list is unchanged: only its own range, with no child.
    assert on_track(events, parent.thread_id) == [parent]
    assert parent.children == []
    assert not parent.is_async


# ---------------------------------------------------------------------------
# CP-01: spawned tasks are TASK ranges on their own tracks, linked to the spawner
# ---------------------------------------------------------------------------


def test_group_children_are_task_ranges_on_their_own_tracks(backend: Backend) -> None:
    # SPEC 7.1, 7.2, 2.2, 6.2, 11.1, CP-01, CP-08: asyncio.TaskGroup, a trio
    # nursery and anyio task groups give the same structure.
    async def child(i: int) -> None:
        with aprof.record_function(f"child-{i}"):
            await backend.sleep(0.001)

    async def main() -> tuple[aprof.profile, int]:
        async with aprof.profile() as prof:
            with aprof.record_function("parent"):
                async with backend.group() as g:
                    for i in range(3):
                        g.start_soon(child, i)
        return prof, aprof.current_thread_id()

    prof, me = backend.run(main)
    events = prof.events()
    parent = one(events, "parent")
    assert parent.thread_id == me
    check_spawned(events, parent, [one(events, f"child-{i}") for i in range(3)])


@pytest.mark.parametrize(
    ("runner", "eager"),
    [*((r, False) for r in RUNNERS), *(pytest.param(r, True, marks=needs_eager) for r in EAGER_RUNNERS)],
    ids=[*RUNNERS, *(f"{r}-eager" for r in EAGER_RUNNERS)],
)
def test_create_task_taskgroup_and_gather_children(runner: str, eager: bool) -> None:
    # SPEC 7.1, 7.2, 2.2, 6.2, CP-01: one child each from create_task,
    # TaskGroup.create_task and gather, all under one parent range.
    async def child(name: str) -> None:
        with aprof.record_function(name):
            await asyncio.sleep(0.001)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            with aprof.record_function("parent"):
                t = asyncio.create_task(child("by-create_task"))
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(child("by-TaskGroup"))
                await asyncio.gather(child("by-gather"))
                await t
        return prof

    prof = run_on(runner, main, eager=eager)
    events = prof.events()
    names = ["by-create_task", "by-TaskGroup", "by-gather"]
    check_spawned(events, one(events, "parent"), [one(events, n) for n in names])
    tasks = [task_of(events, one(events, n)) for n in names]
    # Spawned in this order, so numbered in this order.
    assert tasks[0].sequence_nr < tasks[1].sequence_nr < tasks[2].sequence_nr


@pytest.mark.parametrize("runner", RUNNERS)
def test_tasks_made_by_the_task_constructor_are_recorded(runner: str) -> None:
    # SPEC 7.1, 7.2, issue 15 item 11: a task made with the bare constructor,
    # asyncio.Task(coro, loop=loop) (aiohttp's server makes its handlers'
    # tasks so on 3.12+), is a TASK range linked to its spawner like any
    # other; on 3.12+ one started eagerly (eager_start=True) too.
    async def child(tag: str) -> None:
        with aprof.record_function(tag):
            await asyncio.sleep(0)

    tags = ["by-constructor", *(["by-eager-constructor"] if sys.version_info >= (3, 12) else [])]

    async def main() -> aprof.profile:
        loop = asyncio.get_running_loop()
        async with aprof.profile() as prof:
            with aprof.record_function("parent"):
                await asyncio.Task(child(tags[0]), loop=loop)
                if len(tags) > 1:
                    await asyncio.Task(child(tags[1]), loop=loop, eager_start=True)  # type: ignore[call-arg]
        return prof

    events = run_on(runner, main).events()
    check_spawned(events, one(events, "parent"), [one(events, t) for t in tags])
    for t in tags:
        task = task_of(events, one(events, t))
        assert task.extra["coro"] == child.__qualname__
        assert task.extra["outcome"] == "returned"
        assert task.running_ns > 0  # type: ignore[operator]


# ---------------------------------------------------------------------------
# CP-06: the eager task factory runs the first step inside create_task
# ---------------------------------------------------------------------------


@needs_eager
@pytest.mark.parametrize("runner", EAGER_RUNNERS)
def test_eager_first_step_lands_on_the_child_track(runner: str) -> None:
    # SPEC 2.2, 6.2, 7.1, CP-06: the child's first, synchronous step opens a
    # range inside the parent's create_task(); it belongs to the child's
    # track, and the parent's open ranges keep proper nesting. A child that
    # finishes in that first step is a TASK range all the same.
    async def suspends() -> None:
        with aprof.record_function("eager-suspends"):
            await asyncio.sleep(0.001)

    async def never_suspends() -> str:
        with aprof.record_function("eager-sync"):
            return "done"

    async def raises_at_once() -> None:
        with aprof.record_function("eager-raises"):
            raise ValueError("at once")

    async def main() -> tuple[aprof.profile, str]:
        async with aprof.profile() as prof:
            with aprof.record_function("parent"):
                with aprof.record_function("spawning"):
                    t1 = asyncio.create_task(suspends())
                    t2 = asyncio.create_task(never_suspends())
                    t3 = asyncio.create_task(raises_at_once())
                    assert t2.done()  # it really ran eagerly
                    assert t3.done()
                with aprof.record_function("after"):
                    await t1
                result = await t2
                with pytest.raises(ValueError, match="at once"):
                    await t3
        return prof, result

    prof, result = run_on(runner, main, eager=True)
    assert result == "done"
    events = prof.events()
    parent, spawning, after = one(events, "parent"), one(events, "spawning"), one(events, "after")
    children = [one(events, "eager-suspends"), one(events, "eager-sync"), one(events, "eager-raises")]
    assert len({c.thread_id for c in children} | {parent.thread_id}) == 4
    for c in children:
        task = task_of(events, c)
        assert c.parent is task
        assert task.parent is spawning  # spawned inside "spawning"
        assert task.forward_thread_id == parent.thread_id
        assert task.sequence_nr > 0
        assert not c.is_async
        assert not c.unfinished
        assert not task.unfinished
    assert [task_of(events, c).extra["outcome"] for c in children] == ["returned", "returned", "raised ValueError"]
    assert one(events, "eager-raises").exception == "ValueError"
    # The parent's track: parent > (spawning, after), nothing else, all nested.
    assert on_track(events, parent.thread_id) == [parent, spawning, after]
    assert parent.children == [spawning, after]
    assert spawning.parent is parent
    assert after.parent is parent
    assert spawning.children == []
    assert not any(e.is_async or e.unfinished for e in (parent, spawning, after))


# ---------------------------------------------------------------------------
# CP-07: a task given an explicit context belongs to that context's profile
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("spawn", ["create_task", "TaskGroup"])
@pytest.mark.parametrize("runner", RUNNERS)
def test_explicit_context_decides_whether_a_task_is_recorded(runner: str, spawn: str) -> None:
    # SPEC 2.2, 5.2, 7.1, CP-07: a context copied before profile() started
    # yields no event at all (no TASK event, nor for the tasks it spawns);
    # one copied inside is recorded like any child.
    async def grandchild() -> None:
        with aprof.record_function("grandchild-range"):
            await asyncio.sleep(0)

    async def child(tag: str) -> None:
        with aprof.record_function(f"{tag}-range"):
            await asyncio.create_task(grandchild(), name=f"{tag}-grandchild")

    async def main() -> aprof.profile:
        before = contextvars.copy_context()
        async with aprof.profile() as prof:
            inside = contextvars.copy_context()
            if spawn == "create_task":
                await asyncio.create_task(child("before"), name="before", context=before)
                await asyncio.create_task(child("inside"), name="inside", context=inside)
            else:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(child("before"), name="before", context=before)
                    tg.create_task(child("inside"), name="inside", context=inside)
        return prof

    prof = run_on(runner, main)
    events = prof.events()
    assert sorted(e.name for e in by_scope(events, TASK)) == ["inside", "inside-grandchild"]
    assert sorted(e.name for e in by_scope(events, USER)) == ["grandchild-range", "inside-range"]
    assert not [e for e in events if "before" in e.name or "before" in e.track]
    inside_task = one(events, "inside")
    assert one(events, "inside-range").parent is inside_task
    assert one(events, "inside-grandchild").parent is one(events, "inside-range")


# ---------------------------------------------------------------------------
# SPEC 7.1: names, coroutine names, outcomes
# ---------------------------------------------------------------------------


def test_task_name_coroutine_and_outcome(backend: Backend) -> None:
    # SPEC 7.1, 11.1: the TASK event is named after the task (name=...),
    # extra["coro"] is the coroutine's qualified name, and extra["outcome"]
    # says how it ended: "returned", "raised ValueError" (exception set),
    # or "cancelled" (a sibling's failure cancels it).
    async def returns() -> int:
        await backend.checkpoint()
        return 1

    async def raises() -> None:
        await backend.sleep(0.01)
        raise ValueError("boom")

    async def hangs() -> None:
        await backend.sleep(30)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            try:
                async with named_group(backend) as spawn:
                    spawn(returns, name="the-returner")
                    spawn(raises, name="the-raiser")
                    spawn(hangs, name="the-hanger")
            except* ValueError:
                pass
        return prof

    prof = backend.run(main)
    events = prof.events()
    tasks = {t.name: t for t in by_scope(events, TASK)}
    assert sorted(tasks) == ["the-hanger", "the-raiser", "the-returner"]
    for name, fn in (("the-returner", returns), ("the-raiser", raises), ("the-hanger", hangs)):
        assert tasks[name].extra["coro"] == fn.__qualname__
        assert tasks[name].track == name
        assert not tasks[name].unfinished
    assert tasks["the-returner"].extra["outcome"] == "returned"
    assert tasks["the-returner"].exception is None
    assert tasks["the-raiser"].extra["outcome"] == "raised ValueError"
    assert tasks["the-raiser"].exception == "ValueError"
    assert tasks["the-hanger"].extra["outcome"] == "cancelled"
    assert tasks["the-hanger"].exception == ("Cancelled" if backend.is_trio else "CancelledError")
    # The cancelled task ended when the sibling failed, not 30 s later.
    assert tasks["the-hanger"].end_ns - tasks["the-raiser"].end_ns < 5_000_000_000


@pytest.mark.parametrize("backend_name", ["trio", "anyio-asyncio", "anyio-trio"])
def test_task_started_with_start_and_task_status(backend_name: str) -> None:
    # SPEC 7.1, 7.2, 11.1: nursery.start() / TaskGroup.start() (no asyncio
    # equivalent): the started task is one TASK range, named as asked, with
    # the user's function as its coroutine, holding the ranges from before
    # and after task_status.started(), linked to the range it was started in.
    backend = Backend(backend_name)

    async def server(task_status: Any) -> None:
        with aprof.record_function("before-started"):
            await backend.checkpoint()
        task_status.started("ready")
        with aprof.record_function("after-started"):
            await backend.checkpoint()

    async def main() -> tuple[aprof.profile, object, int]:
        async with aprof.profile() as prof:
            with aprof.record_function("parent"):
                if backend.is_anyio:
                    import anyio

                    async with anyio.create_task_group() as tg:
                        value = await tg.start(server, name="the-server")
                else:
                    import trio

                    async with trio.open_nursery() as nursery:
                        value = await nursery.start(server, name="the-server")
        return prof, value, aprof.current_thread_id()

    prof, value, me = backend.run(main)
    assert value == "ready"
    events = prof.events()
    (task,) = by_scope(events, TASK)
    assert task.name == "the-server"
    assert task.extra["coro"] == server.__qualname__
    assert task.extra["outcome"] == "returned"
    assert task.parent is one(events, "parent")
    assert task.forward_thread_id == me
    assert task.sequence_nr > 0
    assert [c.name for c in task.children] == ["before-started", "after-started"]
    assert on_track(events, me) == [one(events, "parent")]


@pytest.mark.parametrize("runner", RUNNERS)
def test_asyncio_task_renamed_while_running_shows_its_last_name(runner: str) -> None:
    # SPEC 7.1: the TASK range carries the task's name as it was when the
    # task finished, and the name given at create_task when it never ran.
    async def renames() -> None:
        await asyncio.sleep(0)
        current = asyncio.current_task()
        assert current is not None
        current.set_name("renamed")
        await asyncio.sleep(0)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            await asyncio.create_task(renames(), name="original")
            never = asyncio.create_task(renames(), name="never-ran")
        never.cancel()
        return prof

    prof = run_on(runner, main)
    tasks = {t.name: t for t in by_scope(prof.events(), TASK)}
    assert set(tasks) == {"renamed", "never-ran"}
    assert tasks["renamed"].track == "renamed"
    assert tasks["renamed"].extra["outcome"] == "returned"
    assert tasks["never-ran"].unfinished


@pytest.mark.parametrize("runner", RUNNERS)
def test_finished_tasks_are_not_kept_alive_by_a_running_profile(runner: str) -> None:
    # SPEC 7.1, LC-04: recording keeps no reference to a finished task, its
    # coroutine or its frame's locals while the profile goes on recording.
    import weakref

    class Payload:
        pass

    refs: list[weakref.ref[Any]] = []

    async def child() -> None:
        payload = Payload()
        refs.append(weakref.ref(payload))
        await asyncio.sleep(0)

    async def main() -> tuple[aprof.profile, list[bool]]:
        async with aprof.profile() as prof:
            task = asyncio.create_task(child())
            await task
            refs.append(weakref.ref(task))
            del task
            await asyncio.sleep(0)
            gc.collect()
            alive = [r() is not None for r in refs]
        return prof, alive

    prof, alive = run_on(runner, main)
    assert alive == [False, False]
    (task,) = by_scope(prof.events(), TASK)
    assert task.extra["outcome"] == "returned"


@pytest.mark.parametrize("runner", RUNNERS)
def test_asyncio_outcomes_of_awaited_and_cancelled_tasks(runner: str) -> None:
    # SPEC 7.1: the same outcomes for bare create_task tasks: task.cancel(),
    # an exception the spawner retrieves, and the default name "Task-N".
    async def raises() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    async def hangs() -> None:
        await asyncio.sleep(30)

    async def returns() -> str:
        return "ok"

    async def main() -> tuple[aprof.profile, list[str], str]:
        async with aprof.profile() as prof:
            t_ret = asyncio.create_task(returns())
            t_raise = asyncio.create_task(raises(), name="raiser")
            t_hang = asyncio.create_task(hangs(), name="hanger")
            t_early = asyncio.create_task(hangs(), name="cancelled-before-start")
            t_early.cancel()
            await asyncio.sleep(0.001)
            t_hang.cancel()
            results = await asyncio.gather(t_ret, t_raise, t_hang, t_early, return_exceptions=True)
        return prof, [type(r).__name__ for r in results], t_ret.get_name()

    prof, kinds, default_name = run_on(runner, main)
    assert kinds == ["str", "ValueError", "CancelledError", "CancelledError"]
    events = prof.events()
    assert default_name.startswith("Task-")
    assert one(events, default_name).extra["outcome"] == "returned"
    assert one(events, default_name).extra["coro"] == returns.__qualname__
    assert one(events, "raiser").extra["outcome"] == "raised ValueError"
    assert one(events, "raiser").exception == "ValueError"
    assert one(events, "hanger").extra["outcome"] == "cancelled"
    assert one(events, "hanger").exception == "CancelledError"
    early = one(events, "cancelled-before-start")
    assert early.extra["outcome"] == "cancelled"
    assert early.track == "cancelled-before-start"
    assert not early.unfinished


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_tasks_end_recorded_in_c_matches_the_python_twin(runner: str) -> None:
    # SPEC 7.1: a C Task's end is recorded in C (aprof/_ctasks.c,
    # finish_in_c); the Python twin (_asyncio._task_done, TaskThread.finished)
    # records every other case. Both give the same record: name (after a
    # rename), outcome, exception name, steps (one cut by the end of a task
    # that cancels itself mid-step), long waits.
    from aprof._integrations import _asyncio as hooks

    conftest.require_c_extension()
    ext = hooks._ext
    if ext is None:
        pytest.skip("APROF_PURE_PYTHON=1: the C task hooks are off, the twin alone records")

    class Odd(Exception):
        pass

    async def raises() -> None:
        await asyncio.sleep(0)
        raise Odd("boom")

    async def renamed() -> None:
        await asyncio.sleep(0)
        t = asyncio.current_task()
        assert t is not None
        t.set_name("renamed-late")

    async def waits() -> None:
        await asyncio.sleep(0.003)

    async def cancels_itself() -> None:
        t = asyncio.current_task()
        assert t is not None
        t.cancel()
        await asyncio.sleep(0)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            tasks = [
                asyncio.create_task(raises(), name="raiser"),
                asyncio.create_task(renamed(), name="renamer"),
                asyncio.create_task(waits(), name="waiter"),
                asyncio.create_task(cancels_itself(), name="canceller"),
            ]
            await asyncio.gather(*tasks, return_exceptions=True)
        return prof

    def records() -> dict[str, tuple[Any, ...]]:
        out = {}
        for e in run_on(runner, main).events():
            if e.scope == aprof.RecordScope.TASK:
                x = e.extra
                out[e.track] = (e.name, x["outcome"], e.exception, x["coro"], len(x["steps"]), bool(x.get("waits")))
        return out

    in_c = records()
    ext._task_finish_setup(None)
    try:
        in_python = records()
    finally:
        ext._task_finish_setup(hooks._NO_RECORDS, hooks.DISCARD_STEPS)
    assert in_c == in_python
    assert in_c["raiser"][1:3] == ("raised Odd", "Odd")
    assert in_c["renamed-late"][0] == "renamed-late"
    assert in_c["waiter"][5] is True
    assert in_c["canceller"][1:3] == ("cancelled", "CancelledError")


@pytest.mark.parametrize("eager", [False, True], ids=["scheduled", "eager"])
@pytest.mark.parametrize("scope", ["context", "global"])
@pytest.mark.parametrize("runner", RUNNERS)
def test_a_tasks_creation_recorded_in_c_matches_the_python_twin(runner: str, scope: str, eager: bool) -> None:
    # SPEC 7.1, 7.2: a new C Task spawned inside a recorded task's step is
    # recorded in C (aprof/_ctasks.c, create_in_c), and so is one whose
    # eager first step starts there (3.12+, eager_create_in_c: what aiohttp
    # does for each request); the Python twin (_asyncio._record,
    # _eager_started, TaskThread.__init__) records every other case. Both
    # give the same tasks: names, coroutine names (anyio's wrapper left to
    # the twin), spawn sites, spawn links, logical threads.
    if eager and sys.version_info < (3, 12):
        pytest.skip("eager tasks are new in 3.12")
    from aprof._integrations import _asyncio as hooks
    from aprof._integrations._tasks import TaskThread

    conftest.require_c_extension()
    ext = hooks._ext
    if ext is None:
        pytest.skip("APROF_PURE_PYTHON=1: the C task hooks are off, the twin alone records")

    async def leaf(i: int) -> int:
        await asyncio.sleep(0)
        return i

    seen: list[tuple[Any, ...]] = []

    def spawn(coro: Coroutine[Any, Any, int], name: str | None = None) -> asyncio.Task[int]:
        if eager:  # its first step runs now, inside the parent's
            return asyncio.Task(coro, loop=asyncio.get_running_loop(), name=name, eager_start=True)  # type: ignore[call-arg]
        return asyncio.create_task(coro, name=name)

    async def parent() -> None:
        kids = [spawn(leaf(i), name=f"kid{i}") for i in range(3)]
        kids.append(spawn(leaf(9)))  # a default name, Task-N
        for k in kids:
            tt = getattr(k, "_aprof_logical_thread", None)
            assert type(tt) is TaskThread
            seen.append((tt.kind, tt.name.startswith("Task-"), tt.coro_name, tt.os_thread_id, tt.ready_ns, tt.waits, tt._more, tt.spawn_site))
        await asyncio.gather(*kids)

    async def main() -> aprof.profile:
        async with aprof.profile(scope=scope) as prof:  # type: ignore[arg-type]
            await asyncio.create_task(parent(), name="parent")
        return prof

    def tasks() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        seen.clear()
        events = run_on(runner, main).events()
        by_id = {e.thread_id: e.name for e in events if e.scope == aprof.RecordScope.TASK}
        out = sorted(
            (
                "Task-N" if e.name.startswith("Task-") else e.name,
                e.extra["coro"],
                e.extra["outcome"],
                tuple(e.extra["spawn_site"]),
                by_id.get(e.forward_thread_id),
            )
            for e in events
            if e.scope == aprof.RecordScope.TASK and e.name != "parent"
        )
        return out, list(seen)

    in_c = tasks()
    ext._task_create_setup(None)
    try:
        in_python = tasks()
    finally:
        ext._task_create_setup(
            hooks.states_in, hooks._ids, hooks._sequence_numbers, hooks.ProfilerState, hooks._c_user_site,
            hooks._library_cache, hooks.is_library_cached, hooks.coro_qualname, hooks._ring.TASK,
        )  # fmt: skip
    assert in_c == in_python
    assert [t[0] for t in in_c[0]] == ["Task-N", "kid0", "kid1", "kid2"]
    assert all(t[4] == "parent" for t in in_c[0])  # spawned from the parent's track
    assert all(t[2] == "returned" for t in in_c[0])
    assert in_c[0][0][1].endswith("leaf")


# ---------------------------------------------------------------------------
# SPEC 7.3: running and waiting
# ---------------------------------------------------------------------------


def test_running_and_waiting_split(backend: Backend) -> None:
    # SPEC 7.3, 6.4: a task that sleeps is mostly waiting, one that burns the
    # CPU is mostly running (coarse sanity only); a range inside each gets
    # the same split, and key_averages shows it by name and by track.
    async def sleeper() -> None:
        with aprof.record_function("sleeping"):
            await backend.sleep(0.2)

    async def burner() -> None:
        await backend.checkpoint()
        with aprof.record_function("burning"):
            deadline = time.perf_counter() + 0.2
            while time.perf_counter() < deadline:
                pass

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with named_group(backend) as spawn:
                spawn(sleeper, name="sleeper")
                spawn(burner, name="burner")
        return prof

    prof = backend.run(main)
    events = prof.events()
    for name in ("sleeper", "sleeping"):
        e = one(events, name)
        assert e.running_ns is not None
        assert e.waiting_ns is not None
        assert e.running_ns + e.waiting_ns == e.duration_ns
        assert e.waiting_ns > 0.8 * e.duration_ns, (e, e.running_ns, e.waiting_ns)
    for name in ("burner", "burning"):
        e = one(events, name)
        assert e.running_ns is not None
        assert e.waiting_ns is not None
        assert e.running_ns + e.waiting_ns == e.duration_ns
        assert e.running_ns > 0.8 * e.duration_ns, (e, e.running_ns, e.waiting_ns)
    assert one(events, "burning").duration_ns >= 200_000_000

    rows = prof.key_averages()
    sleeper_row = rows[f"task {sleeper.__qualname__}"]
    burner_row = rows[f"task {burner.__qualname__}"]
    assert sleeper_row.count == burner_row.count == 1
    assert sleeper_row.waiting_ns == one(events, "sleeper").waiting_ns
    assert sleeper_row.running_ns == one(events, "sleeper").running_ns
    assert burner_row.running_ns == one(events, "burner").running_ns
    assert rows["sleeping"].waiting_ns > 0.8 * rows["sleeping"].total_ns
    assert rows["burning"].running_ns > 0.8 * rows["burning"].total_ns
    table = rows.table()
    assert "Running" in table
    assert "Waiting" in table

    by_track = {r.key: r for r in prof.key_averages(group_by="track")}
    sleeper_track = by_track[f"sleeper ({one(events, 'sleeper').thread_id})"]
    burner_track = by_track[f"burner ({one(events, 'burner').thread_id})"]
    assert sleeper_track.count == burner_track.count == 2  # the TASK range and the user range
    assert sleeper_track.waiting_ns > 0.8 * sleeper_track.total_ns
    assert burner_track.running_ns > 0.8 * burner_track.total_ns
    assert "Running" in prof.key_averages(group_by="track").table()


def test_running_never_exceeds_the_span_of_nested_ranges(backend: Backend) -> None:
    # SPEC 7.3: running + waiting == duration for every range on a task's
    # track, and a nested range never runs longer than its enclosing one.
    async def worker() -> None:
        with aprof.record_function("outer"):
            for i in range(3):
                with aprof.record_function(f"inner-{i}"):
                    await backend.sleep(0.001)
                    sum(range(1000))

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                g.start_soon(worker)
        return prof

    events = backend.run(main).events()
    outer = one(events, "outer")
    task = task_of(events, outer)
    assert outer.parent is task
    inners = [one(events, f"inner-{i}") for i in range(3)]
    for e in (task, outer, *inners):
        assert e.running_ns is not None
        assert e.waiting_ns is not None
        assert 0 < e.running_ns <= e.duration_ns
        assert e.running_ns + e.waiting_ns == e.duration_ns
    assert sum(i.running_ns for i in inners) <= outer.running_ns <= task.running_ns  # type: ignore[misc]
    steps = task.extra["steps"]
    assert len(steps) % 2 == 0
    assert len(steps) >= 8  # at least one step per sleep, plus the first
    assert steps == sorted(steps)
    assert task.start_ns <= steps[0]
    assert steps[-1] <= task.end_ns


# ---------------------------------------------------------------------------
# Issue 16 items 3 and 7: what a task waited on, where it was spawned
# ---------------------------------------------------------------------------


def _lock(backend: Backend) -> Any:
    if backend.is_anyio:
        import anyio

        return anyio.Lock()
    if backend.is_trio:
        import trio

        return trio.Lock()
    return asyncio.Lock()


def _event(backend: Backend) -> Any:
    if backend.is_anyio:
        import anyio

        return anyio.Event()
    if backend.is_trio:
        import trio

        return trio.Event()
    return asyncio.Event()


def test_a_long_wait_is_described_when_the_task_resumes(backend: Backend) -> None:
    # SPEC 7.3 (issue 16 item 3): a step that starts 1 ms or more after the
    # task's last one records what the task waited on, walked from its
    # await chain before it resumed: here a lock its spawner held for 30 ms.
    # Short waits (checkpoints) are not described.
    lock = _lock(backend)

    async def reader() -> None:
        for _ in range(5):
            await backend.checkpoint()
        async with lock:
            pass

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with lock:
                async with named_group(backend) as spawn:
                    spawn(reader, name="reader")
                    await backend.sleep(0.03)
                    lock.release()  # let the reader in while the group waits
                    try:
                        await backend.sleep(0)
                    finally:
                        await lock.acquire()  # for the `async with` to release
        return prof

    prof = backend.run(main)
    task = one(prof.events(), "reader")
    waits = task.extra["waits"]
    assert len(waits) == 1, waits  # the checkpoints were shorter than 1 ms
    first_start, last_end, count, total, longest, what, kind, where, caller, longest_end = waits[0]
    assert (count, kind) == (1, "lock"), waits
    package = "anyio" if backend.is_anyio else "trio" if backend.is_trio else "asyncio"
    assert what.startswith(f"{package}."), what
    assert "Lock" in what, what
    assert where.startswith("tests/test_tasks.py:"), where
    assert where.endswith(" test_a_long_wait_is_described_when_the_task_resumes.<locals>.reader"), where
    assert longest == total == last_end - first_start >= 25_000_000
    assert longest_end == last_end
    # It is the wait between two of the task's steps, up to when the task
    # was made runnable again: the step starts just after it.
    steps = task.extra["steps"]
    assert any(
        steps[i] == first_start and 0 <= steps[i + 1] - last_end < 5_000_000 for i in range(1, len(steps) - 1, 2)
    ), (steps, waits[0])
    (line,) = [w for w in prof.summary(limit=20).longest_waits if w.task == "reader"]
    assert (line.kind, line.where) == ("lock", where)


def test_time_queued_behind_a_busy_loop_is_not_a_wait(backend: Backend) -> None:
    # SPEC 7.3 (issue 16 item 3): a wait ends when the task is made runnable
    # again. A task that yields and is ready at once, but then sits 30 ms
    # in the run queue behind a blocking task, did not wait on anything:
    # its await chain is not walked and no wait is recorded. (That time is
    # the loop's: the blocker is what the loop-block records name.)
    async def yielder() -> None:
        for _ in range(3):
            await backend.checkpoint()

    async def blocker() -> None:
        await backend.checkpoint()
        time.sleep(0.03)  # holds the loop while the yielder is queued

    async def main() -> aprof.profile:
        async with aprof.profile() as prof, named_group(backend) as spawn:
            spawn(yielder, name="yielder")
            spawn(blocker, name="blocker")
        return prof

    prof = backend.run(main)
    task = one(prof.events(), "yielder")
    steps = task.extra["steps"]
    gaps = [steps[i + 1] - steps[i] for i in range(1, len(steps) - 1, 2)]
    assert max(gaps) >= 25_000_000, gaps  # it was held up behind the blocker
    assert "waits" not in task.extra or not task.extra["waits"], task.extra["waits"]


def test_spawn_site_is_the_users_line(backend: Backend) -> None:
    # Issue 16 item 7: each task carries the nearest user frame above its
    # spawn (create_task, start_soon and the runtime's own frames skipped).
    async def child() -> None:
        await backend.checkpoint()

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with named_group(backend) as spawn:
                spawn(child, name="child")
        return prof

    prof = backend.run(main)
    site = one(prof.events(), "child").extra["spawn_site"]
    assert site[0] == conftest.__file__
    assert site[2] == "named_group.<locals>.<lambda>"  # the line that called create_task / start_soon
    lines = Path(conftest.__file__).read_text().splitlines()
    assert "lambda fn, *args, name:" in lines[site[1] - 1]


def test_a_task_pending_at_stop_says_what_it_waits_on(backend: Backend) -> None:
    # Issue 16 item 7: a task still waiting when the profile stops carries
    # what it waits on then (extra["waiting_on"]); the summary names it.
    ev = _event(backend)

    async def parked() -> None:
        await ev.wait()

    async def main() -> aprof.profile:
        async with named_group(backend) as spawn:
            async with aprof.profile() as prof:
                spawn(parked, name="parked")
                await backend.sleep(0.01)
            ev.set()
        return prof

    prof = backend.run(main)
    task = one(prof.events(), "parked")
    assert task.extra["outcome"] == "unfinished"
    what, kind, where, _ = task.extra["waiting_on"]
    assert kind == "event", task.extra["waiting_on"]
    assert "Event" in what, what
    assert what.endswith(".wait"), what
    assert where.endswith("test_a_task_pending_at_stop_says_what_it_waits_on.<locals>.parked"), where
    (pending,) = prof.summary().pending
    assert pending.waiting_on == f"{what} at {where}"


def test_a_failing_await_chain_walk_never_breaks_the_task(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 12: aprof's own failure in the walk is one AprofWarning; the task
    # runs on and its steps are still timed.
    from aprof._integrations import _tasks

    def broken(coro: Any, task: Any = None) -> None:
        raise RuntimeError("walk failed")

    monkeypatch.setattr(_tasks, "describe_wait", broken)
    monkeypatch.setattr(_tasks, "_warned", set())

    async def sleeper() -> int:
        for _ in range(3):
            await backend.sleep(0.005)
        return 7

    results: list[int] = []

    async def keep(fn: Callable[[], Coroutine[Any, Any, int]]) -> None:
        results.append(await fn())

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with named_group(backend) as spawn:
                spawn(keep, sleeper, name="sleeper")
        return prof

    with pytest.warns(aprof.AprofWarning, match="await chain") as caught:
        prof = backend.run(main)
    assert results == [7]
    assert len([w for w in caught if "await chain" in str(w.message)]) == 1
    task = one(prof.events(), "sleeper")
    # Four steps: the first and one after each sleep. The pure-Python twin
    # does not time an eager task's first step when nothing in it asks for
    # the task (docs/guide.md, eager tasks): three there.
    from aprof._core import _native

    untimed_first = backend.name == "asyncio-eager" and _native.extension is None
    assert len(task.extra["steps"]) == (6 if untimed_first else 8)
    assert "waits" not in task.extra


# ---------------------------------------------------------------------------
# tasks=False, and what the hooks leave behind
# ---------------------------------------------------------------------------


def current_factory(backend: Backend) -> object:
    """The running asyncio loop's task factory; None on trio."""
    if backend.is_trio:
        return None
    return asyncio.get_running_loop().get_task_factory()


def asyncio_hooks(backend: Backend) -> list[str]:
    """aprof's asyncio hooks in place now (white-box: an instance attribute
    ``call_soon`` on the running loop, ``add`` on asyncio's set of tasks)."""
    if backend.is_trio:
        return []
    import asyncio.tasks

    registry = asyncio.tasks._scheduled_tasks if sys.version_info >= (3, 12) else asyncio.tasks._all_tasks  # type: ignore[attr-defined]
    found = []
    loop = asyncio.get_running_loop()
    # Not through vars(): that would turn the objects' attributes into real dicts.
    if loop.call_soon != type(loop).call_soon.__get__(loop, type(loop)):
        found.append("loop.call_soon")
    if registry.add != type(registry).add.__get__(registry, type(registry)):
        found.append("tasks.add")
    return found


def test_tasks_false_records_ranges_but_no_task_events(backend: Backend) -> None:
    # SPEC 5.1, 7.1: tasks=False records the children's ranges (the context
    # still follows them, each on its own track) but no TASK event, and
    # installs no task factory.
    async def child(i: int) -> None:
        with aprof.record_function(f"child-{i}"):
            await backend.sleep(0)

    async def main() -> tuple[aprof.profile, list[object]]:
        factories = [current_factory(backend)]
        async with aprof.profile(tasks=False) as prof:
            factories.append(current_factory(backend))
            assert aprof_trio_instruments() == []
            async with backend.group() as g:
                for i in range(3):
                    g.start_soon(child, i)
        factories.append(current_factory(backend))
        return prof, factories

    prof, factories = backend.run(main)
    events = prof.events()
    assert by_scope(events, TASK) == []
    children = [one(events, f"child-{i}") for i in range(3)]
    assert len({c.thread_id for c in children}) == 3
    assert all(c.running_ns is None for c in children)  # no steps without task recording
    expected = asyncio.eager_task_factory if backend.name == "asyncio-eager" else None  # type: ignore[attr-defined]
    assert factories == [expected] * 3


def test_hooks_are_removed_at_stop(backend: Backend) -> None:
    # SPEC 5.5, 7.1, 11.1, 15.6: the task factory is never touched; after
    # stop the task hooks are gone (asyncio: the loop's call_soon and the
    # task set's add are the classes' again; trio: the instrument is
    # removed): tasks spawned afterwards record nothing, nothing raises, and
    # a second profile in the same run records each of its tasks exactly once.
    async def child(tag: str) -> None:
        with aprof.record_function(tag):
            await backend.checkpoint()

    async def spawn_three(tag: str) -> None:
        async with backend.group() as g:
            for _ in range(3):
                g.start_soon(child, tag)

    async def main() -> tuple[aprof.profile, aprof.profile, list[object], list[list[str]]]:
        factories = [current_factory(backend)]
        hooks = [asyncio_hooks(backend)]
        async with aprof.profile() as first:
            factories.append(current_factory(backend))
            hooks.append(asyncio_hooks(backend))
            assert len(aprof_trio_instruments()) == (1 if backend.is_trio else 0)
            await spawn_three("first")
        hooks.append(asyncio_hooks(backend))
        factories.append(current_factory(backend))
        await spawn_three("after-stop")
        async with aprof.profile() as second:
            await spawn_three("second")
        factories.append(current_factory(backend))
        hooks.append(asyncio_hooks(backend))
        await spawn_three("after-second")
        assert not aprof_trio_instruments()
        return first, second, factories, hooks

    first, second, factories, hooks = backend.run(main)
    assert all(f is factories[0] for f in factories)
    assert hooks == [[], [] if backend.is_trio else ["loop.call_soon", "tasks.add"], [], []]
    for prof, tag in ((first, "first"), (second, "second")):
        events = prof.events()
        assert sorted(e.name for e in by_scope(events, USER)) == [tag] * 3
        tasks = by_scope(events, TASK)
        assert len(tasks) == 3
        assert all(t.extra["outcome"] == "returned" for t in tasks)
        assert len({t.thread_id for t in tasks}) == 3


def aprof_trio_instruments() -> list[object]:
    """aprof's instruments still in the current trio run (white-box: trio has
    no public list of instruments, so this reads the runner's table)."""
    if "trio" not in sys.modules:
        return []
    import trio

    if not trio.lowlevel.in_trio_run():
        return []
    runner = trio._core._run.GLOBAL_RUN_CONTEXT.runner
    table = runner.instruments
    found = {inst for hook in table.values() for inst in hook}
    return [inst for inst in found if type(inst).__module__.startswith("aprof")]


class UserTask(asyncio.Task):  # type: ignore[type-arg]
    """What a user's task factory makes."""


def user_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
    return UserTask(coro, loop=loop, **kwargs)


@pytest.mark.parametrize("runner", RUNNERS)
def test_user_task_factory_is_left_alone(runner: str) -> None:
    # SPEC 7.1, 11.1, 15.6, issue 15 item 15d: a task factory the user
    # installed is the loop's factory while the profile runs (what
    # loop.get_task_factory() returns is what the program set), makes every
    # task, and its tasks are recorded.
    async def child() -> str:
        with aprof.record_function("in-child"):
            await asyncio.sleep(0)
        return type(asyncio.current_task()).__name__

    async def main() -> tuple[aprof.profile, list[object], list[str]]:
        loop = asyncio.get_running_loop()
        loop.set_task_factory(user_factory)
        try:
            async with aprof.profile() as prof:
                during = loop.get_task_factory()
                made = [await asyncio.create_task(child(), name="during")]
            after = loop.get_task_factory()
            made.append(await asyncio.create_task(child(), name="after"))
        finally:
            loop.set_task_factory(None)
        return prof, [during, after], made

    prof, (during, after), made = run_on(runner, main)
    assert during is user_factory
    assert after is user_factory
    assert made == ["UserTask", "UserTask"]
    events = prof.events()
    assert [e.name for e in by_scope(events, TASK)] == ["during"]
    assert one(events, "in-child").parent is one(events, "during")


def test_spawns_of_an_unprofiled_sibling_are_not_recorded(backend: Backend) -> None:
    # SPEC 5.2, 7.1: a profile started in one task records the tasks that
    # task spawns, not those a sibling spawns on the same loop at the same time.
    flags = {"profiling": False, "sibling_done": False}

    async def grandchild(tag: str) -> None:
        with aprof.record_function(tag):
            await backend.checkpoint()

    async def unprofiled() -> None:
        while not flags["profiling"]:
            await backend.checkpoint()
        async with backend.group() as g:
            for _ in range(3):
                g.start_soon(grandchild, "sibling's")
        flags["sibling_done"] = True

    async def profiled(out: list[aprof.profile]) -> None:
        async with aprof.profile() as prof:
            flags["profiling"] = True
            async with backend.group() as g:
                g.start_soon(grandchild, "mine")
            while not flags["sibling_done"]:
                await backend.checkpoint()
        out.append(prof)

    async def main() -> aprof.profile:
        out: list[aprof.profile] = []
        async with backend.group() as g:
            g.start_soon(unprofiled)
            g.start_soon(profiled, out)
        return out[0]

    events = backend.run(main).events()
    assert [e.name for e in by_scope(events, USER)] == ["mine"]
    assert len(by_scope(events, TASK)) == 1
    assert one(events, "mine").parent is by_scope(events, TASK)[0]


def test_task_outliving_its_profile(backend: Backend) -> None:
    # SPEC 5.5, 7.1: a task spawned in the profile and still running at stop
    # is an unfinished TASK range (closed at the stop time) holding its
    # unfinished range; what it does after stop (finishing its range,
    # opening others, spawning) is dropped, never raises, and does not
    # change the stopped profile's results.
    stopped = {"yes": False}

    async def late_child() -> None:
        with aprof.record_function("late-child-range"):
            await backend.checkpoint()

    async def outliver() -> None:
        with aprof.record_function("open-at-stop"):
            while not stopped["yes"]:
                await backend.checkpoint()
        with aprof.record_function("after-stop"):
            async with backend.group() as g:
                g.start_soon(late_child)

    async def main() -> tuple[aprof.profile, int]:
        async with backend.group() as g:
            async with aprof.profile() as prof:
                g.start_soon(outliver)
                await backend.sleep(0.01)
            stopped["yes"] = True
            count = len(prof.events())
        return prof, count

    prof, count = backend.run(main)
    events = prof.events()
    assert len(events) == count == 2
    task, open_range = by_scope(events, TASK)[0], one(events, "open-at-stop")
    assert open_range.parent is task
    assert task.unfinished
    assert open_range.unfinished
    assert task.extra["outcome"] == "unfinished"
    assert task.end_ns == open_range.end_ns


def test_task_spawned_just_before_stop(backend: Backend) -> None:
    # SPEC 5.5, 7.1: a task spawned in the profile that first runs after
    # stop is an unfinished TASK range with no running time and nothing
    # inside; its work after stop is dropped without raising. (An eager
    # task ran its first step inside the spawn: that step is recorded.)
    ran: list[str] = []

    async def late() -> None:
        with aprof.record_function("first-step"):
            ran.append("first-step")
            await backend.checkpoint()

    async def main() -> aprof.profile:
        async with backend.group() as g:
            async with aprof.profile() as prof:
                g.start_soon(late)
        return prof

    prof = backend.run(main)
    assert ran == ["first-step"]
    events = prof.events()
    (task,) = by_scope(events, TASK)
    assert task.unfinished
    assert task.extra["outcome"] == "unfinished"
    if backend.name == "asyncio-eager":
        step = one(events, "first-step")
        assert events == [task, step]
        assert step.unfinished
        assert task.running_ns > 0  # type: ignore[operator]
    else:
        assert events == [task]
        assert task.running_ns == 0
        assert task.waiting_ns == task.duration_ns


@pytest.mark.parametrize("stop_outer_first", [False, True], ids=["inner-stops-first", "outer-stops-first"])
def test_nested_profiles_share_the_task_hook(backend: Backend, stop_outer_first: bool) -> None:
    # SPEC 5.2, 7.1: a profile started in a child task takes that subtree;
    # whichever of the two stops first, the other keeps recording its own
    # tasks, and the hook goes only when the last one stops.
    async def leaf(tag: str) -> None:
        with aprof.record_function(tag):
            await backend.checkpoint()

    async def spawn(tag: str) -> None:
        async with backend.group() as g:
            g.start_soon(leaf, tag)

    async def inner_profiled(out: list[aprof.profile], outer: aprof.profile, stop_outer_first: bool) -> None:
        async with aprof.profile() as inner:
            await spawn("inner-1")
            if stop_outer_first:
                outer.stop()
            await spawn("inner-2")
        out.append(inner)

    async def main() -> tuple[aprof.profile, aprof.profile, object, object]:
        before = current_factory(backend)
        out: list[aprof.profile] = []
        outer = aprof.profile().start()
        try:
            await spawn("outer-1")
            async with backend.group() as g:
                g.start_soon(inner_profiled, out, outer, stop_outer_first)
            await spawn("outer-2")
            if backend.is_trio and not stop_outer_first:
                assert len(aprof_trio_instruments()) == 1  # still there for the outer profile
        finally:
            if outer.running:
                outer.stop()
        assert aprof_trio_instruments() == []
        return outer, out[0], before, current_factory(backend)

    outer, inner, before, after = backend.run(main)
    assert after is before
    inner_events = inner.events()
    assert sorted(e.name for e in by_scope(inner_events, USER)) == ["inner-1", "inner-2"]
    assert len(by_scope(inner_events, TASK)) == 2
    outer_users = sorted(e.name for e in by_scope(outer.events(), USER))
    # The outer profile never sees the inner subtree; stopped first, it
    # misses what main spawns later, too.
    assert outer_users == (["outer-1"] if stop_outer_first else ["outer-1", "outer-2"])
    # outer-1's task group child, the task running the inner profile, and
    # (when still running) outer-2's.
    assert len(by_scope(outer.events(), TASK)) == (2 if stop_outer_first else 3)


# ---------------------------------------------------------------------------
# LD-01 (scaled): many tasks, one range each
# ---------------------------------------------------------------------------


def test_five_thousand_tasks(backend: Backend, tmp_path: Path) -> None:
    # SPEC 6.1, 7.1, 9.1, LD-01 (5,000 instead of 100k; no timing asserted):
    # 5,000 TASK events and 5,000 range events, each range in its own task,
    # and the export validates with one flow arrow per task.
    n = 5_000

    async def work() -> None:
        with aprof.record_function("work"):
            await backend.checkpoint()

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                for _ in range(n):
                    g.start_soon(work)
        return prof

    prof = backend.run(main)
    events = prof.events()
    tasks = by_scope(events, TASK)
    ranges = by_scope(events, USER)
    assert len(tasks) == n
    assert len(ranges) == n
    assert len({t.thread_id for t in tasks}) == n
    tasks_by_track = {t.thread_id: t for t in tasks}
    assert all(r.parent is tasks_by_track[r.thread_id] for r in ranges)
    assert all(t.extra["outcome"] == "returned" for t in tasks)
    assert len({t.sequence_nr for t in tasks}) == n
    path = tmp_path / "many.json"
    prof.export_chrome_trace(path)
    doc = validate_trace(path)
    assert sum(1 for e in doc["traceEvents"] if e["ph"] == "s") == n
    assert sum(1 for e in doc["traceEvents"] if e["ph"] == "f") == n


# ---------------------------------------------------------------------------
# LC-05: the loop closed while recorded tasks are pending
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("stop_when", ["after-close", "before-close"])
@pytest.mark.parametrize("runner", RUNNERS)
def test_loop_closed_with_pending_tasks(runner: str, stop_when: str, tmp_path: Path) -> None:
    # SPEC 5.5, LC-05: tasks left pending when the loop closes ("Task was
    # destroyed but it is pending") show as unfinished TASK ranges holding
    # unfinished user ranges; export works after the loop is closed; what
    # those tasks do after stop (when they are destroyed, their ranges end
    # and a finally block opens a new one) is dropped without raising.
    unraisable: list[Any] = []
    closed: list[int] = []
    prof = aprof.profile()

    async def hang(i: int) -> None:
        try:
            with aprof.record_function(f"open-{i}"):
                await asyncio.get_running_loop().create_future()  # never resolved
        finally:
            with aprof.record_function(f"finally-{i}"):
                closed.append(i)

    async def main() -> list[asyncio.Task[None]]:
        prof.start()
        with aprof.record_function("spawner"):
            tasks = [asyncio.create_task(hang(i), name=f"pending-{i}") for i in range(3)]
            await asyncio.sleep(0.01)  # each opens its range and waits
        if stop_when == "before-close":
            prof.stop()
            # Recorded tasks keep spawning and opening ranges after stop.
            tasks.append(asyncio.create_task(hang(3), name="spawned-after-stop"))
            await asyncio.sleep(0.01)
        return tasks

    loop = new_loop(runner)
    old_hook = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        tasks = loop.run_until_complete(main())
        loop.close()  # the tasks are still pending
        if stop_when == "after-close":
            prof.stop()
        events = prof.events()
        prof.export_chrome_trace(tmp_path / "closed.json")
        validate_trace(tmp_path / "closed.json")
        # Dropping the pending tasks closes their coroutines: the ranges end
        # (after stop) and the finally blocks record again.
        assert closed == []
        del tasks
        gc.collect()
    finally:
        sys.unraisablehook = old_hook
    assert [u.exc_value for u in unraisable] == []
    assert sorted(closed) == list(range(4 if stop_when == "before-close" else 3))

    assert sorted(e.name for e in by_scope(events, TASK)) == ["pending-0", "pending-1", "pending-2"]
    spawner = one(events, "spawner")
    for i in range(3):
        r = one(events, f"open-{i}")
        task = task_of(events, r)
        assert r.parent is task
        assert r.unfinished
        assert task.unfinished
        assert task.extra["outcome"] == "unfinished"
        assert task.parent is spawner
        assert r.end_ns == task.end_ns  # both closed at the stop time
    assert not spawner.unfinished
    assert not [e for e in events if e.name.startswith("finally") or "after-stop" in e.name]
    # The stopped profile's results did not change after stop.
    assert len(prof.events()) == len(events)


# ---------------------------------------------------------------------------
# SPEC 9.1: flow arrows and running rows in the Chrome trace
# ---------------------------------------------------------------------------


def flows(doc: dict[str, Any]) -> dict[Any, dict[str, dict[str, Any]]]:
    """Flow events by id: {"s": start, "f": finish}; each id used once per phase."""
    out: dict[Any, dict[str, dict[str, Any]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] in ("s", "f"):
            pair = out.setdefault(e["id"], {})
            assert e["ph"] not in pair, f"flow id {e['id']} used twice for {e['ph']}"
            pair[e["ph"]] = e
    return out


def check_flows_and_running_rows(prof: aprof.profile, doc: dict[str, Any]) -> None:
    """One s/f pair per TASK and EXECUTOR event, from the spawner's track to
    the work's; each task's steps as "running" slices on a row of its own."""
    events = prof.events()
    linked = [e for e in events if e.scope in (TASK, EXECUTOR)]
    pairs = flows(doc)
    assert len(pairs) == len(linked)
    assert all(set(p) == {"s", "f"} for p in pairs.values())
    finishes = sorted((p["f"]["tid"], p["s"]["tid"]) for p in pairs.values())
    assert finishes == sorted((e.thread_id, e.forward_thread_id) for e in linked)
    for p in pairs.values():
        assert p["s"]["ts"] <= p["f"]["ts"] + 0.001

    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    running = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == "running"]
    rows: dict[int, list[dict[str, Any]]] = {}
    for e in running:
        rows.setdefault(e["tid"], []).append(e)
    tasks = by_scope(events, TASK)
    assert len(rows) == len(tasks)  # one running row per task
    task_tids = {t.thread_id for t in tasks}
    track_tids = {e.thread_id for e in events}
    task_x = {e["tid"]: e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == TASK.value}
    for t in tasks:
        row = [rid for rid in rows if names[rid] == names[t.thread_id] + " running"]
        assert len(row) == 1, (t, names)  # tasks here have unique names
        rid = row[0]
        assert rid not in track_tids  # a row of its own, not the task's track
        assert len(rows[rid]) == len(t.extra["steps"]) // 2
        span = task_x[t.thread_id]
        for step in rows[rid]:  # each step within the task's range
            assert span["ts"] - 0.001 <= step["ts"]
            assert step["ts"] + step["dur"] <= span["ts"] + span["dur"] + 0.002
    assert not task_tids & set(rows)


def test_chrome_trace_flow_arrows_and_running_rows(backend: Backend, tmp_path: Path) -> None:
    # SPEC 9.1, 7.2, 7.4, 7.3: tasks and aprof.wrap'd work handed to a
    # thread each get one flow arrow from the spawn or submit point; each
    # task's steps are "running" slices on a row of its own; the trace
    # validates.
    def blocking(i: int) -> None:
        with aprof.record_function(f"in-thread-{i}"):
            time.sleep(0.001)

    async def child(i: int) -> None:
        with aprof.record_function(f"child-{i}"):
            await backend.sleep(0.001)
            await backend.to_thread(aprof.wrap(blocking), i)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            with aprof.record_function("parent"):
                async with named_group(backend) as spawn:
                    for i in range(3):
                        spawn(child, i, name=f"child-task-{i}")
        return prof

    prof = backend.run(main)
    events = prof.events()
    assert len(by_scope(events, TASK)) == 3
    executors = by_scope(events, EXECUTOR)
    assert len(executors) == 3
    for ex in executors:
        assert ex.sequence_nr > 0
        assert ex.forward_thread_id in {t.thread_id for t in by_scope(events, TASK)}
    prof.export_chrome_trace(tmp_path / "t.json")
    check_flows_and_running_rows(prof, validate_trace(tmp_path / "t.json"))


@pytest.mark.parametrize("runner", RUNNERS)
def test_chrome_trace_flow_arrows_for_run_in_executor(runner: str, tmp_path: Path) -> None:
    # SPEC 9.1, 7.2, 7.4: aprof.wrap + loop.run_in_executor from a task and
    # from the profiling task: one s/f pair per EXECUTOR and TASK event.
    def blocking(tag: str) -> str:
        with aprof.record_function(f"in-executor-{tag}"):
            return tag

    async def child() -> str:
        return await asyncio.get_running_loop().run_in_executor(None, aprof.wrap(blocking), "child")

    async def main() -> tuple[aprof.profile, list[str]]:
        loop = asyncio.get_running_loop()
        async with aprof.profile() as prof:
            got = [await loop.run_in_executor(None, aprof.wrap(blocking), "main"), await asyncio.create_task(child())]
        return prof, got

    prof, got = run_on(runner, main)
    assert got == ["main", "child"]
    events = prof.events()
    assert len(by_scope(events, TASK)) == 1
    assert len(by_scope(events, EXECUTOR)) == 2
    prof.export_chrome_trace(tmp_path / "t.json.gz")
    check_flows_and_running_rows(prof, validate_trace(tmp_path / "t.json.gz"))


def test_the_c_path_finds_the_profile_of_a_new_task_as_its_twin_does() -> None:
    # Issue 19: which profile records a task spawned in a context
    # (_tasks.states_in) is found in C for the common cases: no profile, a
    # context profile with or without tasks, a global one, recording off.
    # Several profiles are the twin's (NotImplemented); every answer the C
    # path gives is the twin's.
    ext = conftest.require_c_extension()
    conftest.require_c_paths()
    import aprof._integrations._asyncio  # noqa: F401  (sets the C path up)
    from aprof._integrations._tasks import states_in

    answers: list[tuple[str, Any, Any]] = []

    def look(label: str) -> None:
        ctx = contextvars.copy_context()
        answers.append((label, ext._states_in(ctx), states_in(ctx)))

    def off(label: str) -> None:
        aprof.enable_record_function(False)
        look(f"{label}, recording off")

    async def main() -> None:
        look("no profile")
        async with aprof.profile(tasks=True):
            look("context, tasks")
            contextvars.copy_context().run(off, "context")
        async with aprof.profile(tasks=False):
            look("context, no tasks")
        with aprof.profile(tasks=True, scope="global"):
            look("global")
            async with aprof.profile(tasks=True):
                look("global and context")
            contextvars.copy_context().run(off, "global")

    asyncio.run(main())
    # The twin says one profile as it or as a list of it (the caller takes either).
    got = {label: (c, twin[0] if isinstance(twin, list) and len(twin) == 1 else twin) for label, c, twin in answers}
    for label, (c, twin) in got.items():
        if c is not NotImplemented:
            assert c is twin, label
    assert got["no profile"] == (None, None)
    assert got["context, tasks"][0] is not None
    assert got["context, no tasks"] == (None, None)
    assert got["global"][0] is not None
    assert got["context, recording off"] == (None, None)
    assert got["global, recording off"] == (None, None)
    assert got["global and context"][0] is NotImplemented  # two profiles: the twin's
    assert isinstance(got["global and context"][1], list)
    assert len(got["global and context"][1]) == 2
