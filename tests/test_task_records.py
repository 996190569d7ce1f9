"""What a finished task leaves behind, and what aprof reads of a live one
(SPEC 7.1, 15.2, 15.6; issue 19: the always-on server's cost per request).

A finished task's record is the extension's ``TaskRecord``: the fields of
``TASK_RECORD_FIELDS`` as a sequence that is no GC container, so a task per
request does not bring the collector's young collections more often than
the program alone does. And aprof reads a C Task's waiter, coroutine and
name in place once it has checked where they sit, without asking
``get_name()``, which from Python 3.12 formats a name the program may never
ask for.
"""

from __future__ import annotations

import asyncio
import gc
import sys
from typing import Any

import pytest

import aprof
from aprof._core import _native
from aprof._integrations._tasks import TASK_RECORD_FIELDS

from .conftest import Backend, named_group, require_c_extension, require_c_paths

TASK = aprof.RecordScope.TASK


# -- TaskRecord ----------------------------------------------------------------


def test_a_task_record_reads_as_the_tuple_of_its_fields() -> None:
    # SPEC 7.1: every consumer of a finished task's record reads its fields
    # by index or by unpacking, as it read the tuple the record was.
    ext = require_c_extension()
    fields = (7, "Task-7", "asyncio", 1, "main", 10, 3, 1, 20, "returned", None, [10, 20], None, None)
    rec = ext.TaskRecord(*fields)
    assert len(rec) == len(TASK_RECORD_FIELDS) == 14
    assert rec[0] == 7
    assert rec[11] == [10, 20]
    assert rec[13] is None
    assert tuple(rec) == fields
    tid, name, *_, site = rec
    assert (tid, name, site) == (7, "Task-7", None)
    assert rec == fields
    assert rec == ext.TaskRecord(*fields)
    assert rec != (*fields[:-1], "x")
    assert repr(rec) == f"TaskRecord{fields!r}"
    with pytest.raises(IndexError):
        rec[14]


def test_a_task_record_is_no_gc_container_and_smaller_than_the_tuple() -> None:
    # Issue 19: the record holds plain data only, so it is never on the
    # collector's lists, and not counted towards its next collection.
    ext = require_c_extension()
    fields = tuple(range(14))
    rec = ext.TaskRecord(*fields)
    assert not gc.is_tracked(rec)
    assert not type(rec).__flags__ & (1 << 14)  # Py_TPFLAGS_HAVE_GC
    assert sys.getsizeof(rec) < sys.getsizeof(fields)
    gc.disable()
    try:
        before = gc.get_count()[0]
        kept = [ext.TaskRecord(*fields) for _ in range(1_000)]
        assert gc.get_count()[0] - before < 10  # the list's own growth at most
    finally:
        gc.enable()
    del kept


@pytest.mark.parametrize("args", [(), tuple(range(13)), tuple(range(15))])
def test_a_task_record_takes_its_fourteen_fields_and_nothing_else(args: tuple[int, ...]) -> None:
    ext = require_c_extension()
    with pytest.raises(TypeError, match="TASK_RECORD_FIELDS"):
        ext.TaskRecord(*args)
    with pytest.raises(TypeError, match="TASK_RECORD_FIELDS"):
        ext.TaskRecord(*range(14), name="x")
    with pytest.raises(TypeError):
        type("Sub", (ext.TaskRecord,), {})  # not a base type


def test_every_finished_tasks_record_is_a_task_record_and_no_gc_container(backend: Backend) -> None:
    # Every backend's finished tasks (the C end of a C Task, and the Python
    # twin's end of the rest: trio, anyio on trio, a Python Task) leave a
    # TaskRecord with the extension, a tuple without it.
    async def child() -> None:
        await backend.checkpoint()

    async def main() -> tuple[Any, list[Any]]:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                for _ in range(20):
                    g.start_soon(child)
            recs = [r for r in prof._state.all_task_records() if type(r) in _native.TASK_RECORD_TYPES]
        return prof, recs

    prof, recs = backend.run(main)
    assert len(recs) >= 20
    want = tuple if _native.extension is None else _native.extension.TaskRecord
    assert all(type(r) is want for r in recs)
    assert not any(gc.is_tracked(r) for r in recs if type(r) is not tuple)
    assert sum(e.scope is TASK for e in prof.events()) >= 20


@pytest.mark.parametrize("with_range", [False, True], ids=["task", "task+range"])
def test_a_task_per_request_adds_nothing_to_the_collectors_count(backend: Backend, with_range: bool) -> None:
    # Issue 19: the always-on server keeps a finished task's record per
    # request in its ring, and its range. What a finished task leaves (its
    # record, its steps, its range) must not count towards the collector's
    # next young collection: a tuple per request, and a list of the task's
    # own ranges keyed by its logical thread, brought the collections up to
    # four times as often as without aprof, each walking every request in
    # flight, now and then the whole heap.
    require_c_paths()
    n = 300

    async def child() -> None:
        if with_range:
            with aprof.record_function("handler"):
                await backend.checkpoint()
        else:
            await backend.checkpoint()

    async def requests(k: int) -> None:
        for _ in range(k):
            async with backend.group() as g:
                g.start_soon(child)

    async def main() -> float:
        async with aprof.profile(max_bytes=50_000_000, keep="latest"):
            await requests(50)  # warm: the loop's hooks, caches and free lists
            gc.collect()
            gc.disable()
            try:
                before = gc.get_count()[0]
                await requests(n)
                return (gc.get_count()[0] - before) / n
            finally:
                gc.enable()

    async def plain() -> float:
        await requests(50)
        gc.collect()
        gc.disable()
        try:
            before = gc.get_count()[0]
            await requests(n)
            return (gc.get_count()[0] - before) / n
        finally:
            gc.enable()

    profiled, without = backend.run(main), backend.run(plain)
    # A tuple per task was 1 more a task than without aprof; with a range,
    # its list and its logical thread 2 more.
    assert profiled - without < 0.2, (profiled, without)


def test_a_finished_task_with_ranges_leaves_no_list_nor_logical_thread(backend: Backend) -> None:
    # Issue 19: a task's plain ranges go to its generation's one list of
    # task blocks, each block naming its task; once the task finishes,
    # nothing holds its TaskThread, and its ranges are still on its track.
    import weakref

    require_c_paths()
    from aprof._core._recorder import TASK_BLOCKS
    from aprof._core._threads import stepping

    threads: list[Any] = []

    async def child(i: int) -> None:
        with aprof.record_function(f"work-{i}"):
            await backend.checkpoint()
        with aprof.record_function(f"more-{i}"):
            pass
        lt = stepping.lt
        threads.append(weakref.ref(lt) if lt is not None else None)

    async def main() -> tuple[Any, dict[Any, Any]]:
        async with aprof.profile() as prof:
            async with named_group(backend) as spawn:
                for i in range(10):
                    spawn(child, i, name=f"kid-{i}")
            lists = dict(prof._state.lists)
        return prof, lists

    prof, lists = backend.run(main)
    gc.collect()
    assert TASK_BLOCKS in lists
    assert all(type(b).__name__ == "RangeBlock" and b.owner > 0 for b in lists[TASK_BLOCKS])
    assert not any(getattr(lt, "coro_name", None) for lt in lists)  # no task's own list
    assert threads
    assert all(r is not None and r() is None for r in threads)
    tasks = {e.name: e for e in prof.events() if e.scope is TASK and e.name.startswith("kid-")}
    assert len(tasks) == 10
    for e in prof.events():
        if e.name.startswith(("work-", "more-")):
            assert e.thread_id == tasks[f"kid-{e.name.split('-')[1]}"].thread_id


def test_a_tasks_ranges_over_its_steps_share_one_block(backend: Backend) -> None:
    # Issue 19: tasks interleave their steps, so the shared list's tail is
    # most often another task's block; a task takes its own block again
    # (while it is in the current generation's list): one block of a few
    # ranges per task, not one per step.
    require_c_paths()
    from aprof._core._recorder import TASK_BLOCKS

    async def child(i: int) -> None:
        with aprof.record_function("handle"):
            for _ in range(5):
                with aprof.record_function("step"):
                    await backend.checkpoint()

    async def main() -> list[Any]:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                for i in range(20):
                    g.start_soon(child, i)
            return list(prof._state.lists[TASK_BLOCKS])

    blocks = backend.run(main)
    assert len(blocks) == 20
    assert sorted(len(b) for b in blocks) == [6] * 20
    assert len({b.owner for b in blocks}) == 20


def test_a_tasks_blocks_come_back_to_its_track_beside_its_own_list() -> None:
    # owned_blocks: a task's blocks are one more chunk of its logical
    # thread's records where it has a list of its own; those of a task with
    # a TASK record kept go to its track; a task with neither gets a list
    # under a logical thread named from its blocks.
    ext = require_c_extension()
    require_c_paths()
    from aprof._core._recorder import TASK_BLOCKS, LogicalThread
    from aprof._post._events import owned_blocks

    user = aprof.RecordScope.USER_SCOPE.value
    mine = LogicalThread("asyncio", "kid")
    own = [("instant", user, 5, None)]
    a, b, c, d = (ext.RangeBlock(user) for _ in range(4))
    a.own(mine.id, "kid", "asyncio", 1)
    b.own(mine.id + 1000, "orphan", "trio", 2)
    c.own(mine.id, "kid", "asyncio", 1)
    d.own(mine.id + 2000, "recorded", "asyncio", 1)
    lists = {mine: own, TASK_BLOCKS: ([a, b, d], [c])}
    out, owned = owned_blocks(lists, {mine.id + 2000: "its track"})
    assert TASK_BLOCKS not in out
    assert out[mine] == (own, [a, c])
    assert owned == {mine.id + 2000: [d]}
    (orphan,) = [lt for lt in out if lt is not mine]
    assert (orphan.id, orphan.name, orphan.kind, orphan.os_thread_id) == (mine.id + 1000, "orphan", "trio", 2)
    assert orphan.current_name() == "orphan"
    assert out[orphan] == [b]
    assert owned_blocks({mine: own}, {}) == ({mine: own}, {})
    assert ext.group_owned([a, b, c, d]) == {mine.id: [a, c], mine.id + 1000: [b], mine.id + 2000: [d]}


# -- A C Task's fields, read in place ---------------------------------------------


def _layout() -> tuple[int, int, int, bool]:
    return require_c_extension()._task_layout()  # type: ignore[no-any-return]


@pytest.mark.parametrize("runner", ["asyncio", "asyncio-eager", "uvloop"])
def test_a_c_tasks_fields_are_read_in_place_once_checked(runner: str) -> None:
    # Issue 19: the C paths learn where a C Task keeps its waiter, its
    # coroutine and its name from the first task they record, check it on
    # the next ones (names against get_name(), waiters against
    # _fut_waiter), and read them in place from then on. Every name they
    # read is the one get_name() gives: the counter's "Task-<n>", a name
    # given, one set later, one that is no str.
    if runner == "asyncio-eager" and sys.version_info < (3, 12):
        pytest.skip("eager tasks are new in 3.12")
    require_c_paths()
    backend = Backend("asyncio" if runner == "asyncio-eager" else runner)

    async def child(ev: asyncio.Event) -> None:
        await ev.wait()

    async def parent() -> list[str]:
        names: list[str] = []
        for i in range(24):  # past the 8 checks of each kind, wherever an earlier test left them
            ev = asyncio.Event()
            t = asyncio.get_running_loop().call_later(0.002, ev.set)
            if i % 4 == 0:
                kid = asyncio.create_task(child(ev), name=f"named-{i}é")
            elif i == 7:  # the counter's name, whatever the task factory does with a missing one
                kid = asyncio.Task(child(ev))
            else:
                kid = asyncio.create_task(child(ev))
            if i == 5:
                kid.set_name(12345)
            await kid  # a long wait on a child task: described, its waiter read
            t.cancel()
            names.append(kid.get_name())
        return names

    async def main() -> tuple[Any, list[str]]:
        if runner == "asyncio-eager":
            asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
        async with aprof.profile() as prof:
            names = await asyncio.create_task(parent())
        return prof, names

    prof, names = backend.run(main)
    off, checks, waiter_checks, bad = _layout()
    assert not bad
    assert off > 0
    assert checks == 0
    assert waiter_checks == 0
    traced = [e.name for e in prof.events() if e.scope is TASK and e.extra.get("coro", "").endswith(".child")]
    assert traced == names
    assert names[5] == "12345"
    assert names[4] == "named-4é"
    assert names[7].startswith("Task-")
    waits = [w[5] for e in prof.events() if e.scope is TASK for w in e.extra.get("waits", ())]
    for name in names:
        assert any(w.startswith(f"task {name!r} (") for w in waits), (name, waits)


def test_a_task_renamed_while_it_runs_ends_under_its_last_name(backend: Backend) -> None:
    # SPEC 7.1: a task's TASK range is named as the task is when it ends,
    # read in place or asked (every backend).
    async def child(i: int) -> None:
        await backend.checkpoint()
        if not backend.is_trio:
            asyncio.current_task().set_name(f"renamed-{i}")  # type: ignore[union-attr]

    async def main() -> Any:
        async with aprof.profile() as prof:
            async with named_group(backend) as spawn:
                for i in range(12):
                    spawn(child, i, name=f"kid-{i}")
        return prof

    prof = backend.run(main)
    got = sorted(e.name for e in prof.events() if e.scope is TASK and e.name.startswith(("kid-", "renamed-")))
    want = sorted(f"{'kid' if backend.is_trio else 'renamed'}-{i}" for i in range(12))
    assert got == want
