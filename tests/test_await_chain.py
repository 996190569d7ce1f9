"""What a suspended task waits on (issue 16 item 3): the await-chain walk.

Each scenario suspends a task on one kind of thing, then describes the
task's coroutine from another task, on every backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from typing import Any

import pytest

from aprof._integrations._await_chain import WaitLog, describe_wait

from .conftest import BACKENDS, Backend, require_c_extension, require_c_paths


@pytest.fixture(params=["C", "twin"])
def chain_key(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Key the chain with the C walk, then with its pure-Python twin (each
    with an empty cache of call sites): the descriptions must not differ."""
    from aprof._integrations import _await_chain

    walk = require_c_extension().await_key if request.param == "C" else _await_chain._await_key_py
    monkeypatch.setattr(_await_chain, "_await_key", walk)
    monkeypatch.setattr(_await_chain, "_sites", {})
    return str(request.param)


def _me(backend) -> tuple[Any, Any]:
    """(coroutine, asyncio task or None) of the running task."""
    if backend.is_trio:
        import trio

        task = trio.lowlevel.current_task()
        return task.coro, None
    task = asyncio.current_task()
    assert task is not None
    return task.get_coro(), task


class Prims:
    """The backend's lock, event and queue, and their blocking operations."""

    def __init__(self, backend) -> None:
        self.backend = backend
        if backend.is_anyio:
            import anyio

            self.lock = anyio.Lock()
            self.event = anyio.Event()
            self.send, self.recv = anyio.create_memory_object_stream(0)
        elif backend.is_trio:
            import trio

            self.lock = trio.Lock()
            self.event = trio.Event()
            self.send, self.recv = trio.open_memory_channel(0)
        else:
            self.lock = asyncio.Lock()
            self.event = asyncio.Event()
            self.queue: asyncio.Queue[int] = asyncio.Queue()

    async def get(self) -> None:
        if self.backend.is_anyio or self.backend.is_trio:
            await self.recv.receive()
        else:
            await self.queue.get()

    async def put(self) -> None:
        if self.backend.is_anyio or self.backend.is_trio:
            await self.send.send(1)
        else:
            await self.queue.put(1)

    def close(self) -> None:
        if self.backend.is_anyio or self.backend.is_trio:
            self.send.close()
            self.recv.close()


def _cancel_scope(backend) -> Any:
    if backend.is_anyio:
        import anyio

        return anyio.CancelScope()
    import trio

    return trio.CancelScope()


async def _until(backend, seen: list[Any]) -> None:
    """Until the waiter has said it is about to wait: it then is (one thread)."""
    while not seen:
        await backend.sleep(0.001)


def _scenario(backend, kind: str) -> tuple[str, str, str, str]:
    """Suspend a task on ``kind``; its description, seen from the main task."""
    seen: list[Any] = []
    scopes: list[Any] = []
    release = threading.Event()

    async def waiter_in_user_code(prims: Prims) -> None:
        seen.append(_me(backend))
        if kind == "sleep":
            if backend.is_trio or backend.is_anyio:
                scope = _cancel_scope(backend)
                scopes.append(scope)
                with scope:
                    await backend.sleep(30)
            else:
                try:
                    await backend.sleep(30)
                except asyncio.CancelledError:
                    pass
        elif kind == "lock":
            async with prims.lock:
                pass
        elif kind == "event":
            await prims.event.wait()
        elif kind == "queue":
            await prims.get()
        elif kind == "executor":
            await backend.to_thread(release.wait, 30)

    async def main() -> tuple[str, str, str, str]:
        prims = Prims(backend)
        async with backend.group() as g:
            if kind == "lock":
                await prims.lock.acquire()
            g.start_soon(waiter_in_user_code, prims)
            await _until(backend, seen)
            coro, task = seen[0]
            result = describe_wait(coro, task)
            # let it go
            if kind == "lock":
                prims.lock.release()
            elif kind == "event":
                prims.event.set()
            elif kind == "executor":
                release.set()
            elif kind == "queue":
                await prims.put()
            elif kind == "sleep":
                if scopes:
                    scopes[0].cancel()
                else:
                    task.cancel()
        prims.close()
        assert result is not None
        return result

    return backend.run(main)


@pytest.mark.parametrize("kind", ["sleep", "lock", "event", "queue", "executor"])
def test_a_suspended_task_says_what_it_waits_on(backend, kind: str, chain_key: str) -> None:
    # Issue 16 item 3: the chain is walked down to the library call the
    # user's code made; the kind names the family, the place the user's line.
    what, got_kind, where, caller = _scenario(backend, kind)
    assert got_kind == kind, (what, got_kind, where)
    # The innermost user frame is the test's (or the Backend helper's, whose
    # caller is then the test's).
    mine = where if where.endswith(".waiter_in_user_code") else caller
    assert mine.startswith("tests/test_await_chain.py:"), (where, caller)
    assert mine.endswith(".waiter_in_user_code"), (where, caller)
    package = "anyio" if backend.is_anyio else "trio" if backend.is_trio else "asyncio"
    if kind != "executor" or not backend.is_anyio:
        assert what.startswith(f"{package}."), what


ASYNCIO_LOOPS = [b for b in BACKENDS if not b.startswith(("trio", "anyio"))]


@pytest.mark.parametrize("loop", ASYNCIO_LOOPS)
@pytest.mark.parametrize("kind", ["task", "executor", "children"])
def test_an_asyncio_task_awaiting_a_future_names_the_future(loop: str, kind: str, chain_key: str) -> None:
    # Issue 16 item 3: user code that awaits a future itself (a task, an
    # executor job, a gather; asyncio only) is described by the future: the
    # child task by name and coroutine.
    backend = Backend(loop)
    release = threading.Event()

    kid_release = asyncio.Event()
    started: list[bool] = []

    async def kid() -> None:
        await kid_release.wait()

    async def parent() -> None:
        loop = asyncio.get_running_loop()
        started.append(True)
        if kind == "task":
            await asyncio.create_task(kid(), name="kid-1")
        elif kind == "executor":
            await loop.run_in_executor(None, release.wait, 30)
        else:
            await asyncio.gather(kid(), kid())

    async def main() -> tuple[str, str, str, str] | None:
        task = asyncio.create_task(parent())
        while not started:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.001)  # the kids' first steps, on the loop after the parent's
        result = describe_wait(task.get_coro(), task)
        release.set()
        kid_release.set()
        await task
        return result

    result = backend.run(main)
    assert result is not None
    what, got_kind, where, _ = result
    assert got_kind == kind, result
    assert where.endswith(".parent"), result
    if kind == "task":
        assert what == "task 'kid-1' (test_an_asyncio_task_awaiting_a_future_names_the_future.<locals>.kid)"
    elif kind == "children":
        assert what == "asyncio.gather of 2"


def test_two_waits_in_one_coroutine_are_told_apart_by_where_they_wait(backend, chain_key: str) -> None:
    # The cache of call sites is keyed by each frame's code and instruction
    # offset: the same coroutine suspended at another line is another site.
    seen: list[Any] = []
    go: list[bool] = []

    async def two_waits() -> None:
        seen.append(_me(backend))
        while not go:
            await backend.sleep(0.001)  # first site
        seen.append(_me(backend))
        while len(go) < 2:
            await backend.sleep(0.001)  # second site

    async def main() -> list[Any]:
        got = []
        async with backend.group() as g:
            g.start_soon(two_waits)
            await _until(backend, seen)
            got.append(describe_wait(*seen[0]))
            got.append(describe_wait(*seen[0]))  # the cached one
            go.append(True)
            while len(seen) < 2:
                await backend.sleep(0.001)
            await backend.sleep(0.002)
            got.append(describe_wait(*seen[1]))
            go.append(True)
        return got

    first, again, second = backend.run(main)
    assert first == again
    assert first is not None
    assert second is not None
    assert first[1] == second[1] == "sleep"

    def line_in_two_waits(wait: tuple[str, str, str, str]) -> int:
        # where (or, under a Backend helper, its caller): "file:line func"
        label = wait[2] if wait[2].endswith(".two_waits") else wait[3]
        return int(label.split(":")[1].split()[0])

    assert line_in_two_waits(second) > line_in_two_waits(first), (first, second)


@pytest.mark.parametrize("loop", ASYNCIO_LOOPS)
def test_a_wait_inside_an_async_context_manager_is_described(loop: str, chain_key: str) -> None:
    # `async with cm():` where cm is an @asynccontextmanager awaits the
    # generator's asend(): the C walk leaves that chain to the Python one,
    # which names what the generator waits on.
    import contextlib

    backend = Backend(loop)
    started: list[bool] = []

    @contextlib.asynccontextmanager
    async def slow_enter() -> Any:
        started.append(True)
        await asyncio.sleep(30)
        yield

    async def user() -> None:
        async with slow_enter():
            pass

    async def main() -> tuple[str, str, str, str] | None:
        task = asyncio.create_task(user())
        while not started:
            await asyncio.sleep(0.001)
        result = describe_wait(task.get_coro(), task)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return result

    result = backend.run(main)
    assert result is not None
    assert result[:2] == ("asyncio.sleep", "sleep"), result
    assert result[2].endswith(".slow_enter"), result


def test_not_a_coroutine_is_no_wait() -> None:
    assert describe_wait(object()) is None


@pytest.fixture(params=["twin", "C"])
def new_log(request: pytest.FixtureRequest) -> Any:
    """A wait log: the pure-Python twin, then the extension's (what a task's
    long waits go to with the extension)."""
    if request.param == "twin":
        return WaitLog
    return require_c_extension().WaitLog


def test_the_wait_log_merges_consecutive_waits_on_the_same_call(new_log: Any) -> None:
    # The N+1 pattern stays one run however many times it repeats.
    log = new_log()
    fetch = ("asyncio.sleep", "sleep", "db.py:9 Database.fetch", "orders.py:4 recent_orders")
    for i in range(360):
        log.add(i * 10, i * 10 + (6 if i == 100 else 4), fetch)  # the 101st is the longest
    log.add(4000, 4100, ("asyncio.Lock.acquire", "lock", "orders.py:9 save", ""))
    assert [r[2] for r in log.runs] == [360, 1]
    first = log.runs[0]
    assert first[:5] == [0, 3594, 360, 359 * 4 + 6, 6]
    assert first[5:9] == list(fetch)
    assert first[9] == 1006  # when the longest wait ended: the summary's window for it


def test_the_wait_log_keeps_the_longest_runs_of_a_long_lived_task(new_log: Any) -> None:
    # A keep-alive connection's task waits thousands of times on alternating
    # calls: the log keeps max_runs runs, dropping the one whose longest wait
    # is shortest (the first of equals), never the open run, which may still grow.
    import random

    def reference(waits: list[tuple[int, int, tuple[str, str, str, str]]]) -> list[list[Any]]:
        runs: list[list[Any]] = []
        for start, end, (what, kind, where, caller) in waits:
            waited = end - start
            if runs and runs[-1][5] == what and runs[-1][7] == where:
                last = runs[-1]
                last[1] = end
                last[2] += 1
                last[3] += waited
                if waited > last[4]:
                    last[4] = waited
                    last[9] = end
                continue
            runs.append([start, end, 1, waited, waited, what, kind, where, caller, end])
            if len(runs) > WaitLog.max_runs:
                shortest = min(r[4] for r in runs[:-1])
                del runs[next(k for k, r in enumerate(runs[:-1]) if r[4] == shortest)]
        return runs

    rng = random.Random(19)
    calls = [(f"asyncio.sleep#{k}", "sleep", f"app.py:{k} handler", "") for k in range(5)]
    waits = []
    t = 0
    for _ in range(3000):
        waited = rng.choice([1, 2, 2, 3, 5, 8, 8, 13]) * 1_000_000  # many ties
        waits.append((t, t + waited, rng.choice(calls)))
        t += waited + 10
    log = new_log()
    for start, end, wait in waits:
        log.add(start, end, wait)
    want = reference(waits)
    assert len(log.runs) == WaitLog.max_runs
    assert log.runs == want
    # The open run is kept though its wait is the shortest of all; once
    # closed, it is the first to go.
    tail = [(t, t + 1, ("asyncio.Event.wait", "event", "app.py:99 tail", ""))]
    log.add(*tail[0])
    assert log.runs[-1][5] == "asyncio.Event.wait"
    assert log.runs == reference(waits + tail)
    tail.append((t + 5, t + 6, ("asyncio.Lock.acquire", "lock", "app.py:98 tail", "")))
    log.add(*tail[1])
    assert "asyncio.Event.wait" not in [r[5] for r in log.runs]
    assert log.runs == reference(waits + tail)


def test_the_c_wait_log_keeps_the_runs_the_twin_keeps() -> None:
    # Issue 19: the C log keeps its runs as structs (no int, no list made
    # per wait); fed the same waits as the twin, at random lengths with
    # many ties, it keeps exactly the same runs at every step, a run read
    # earlier is a copy that never changes, and iterating the log gives its
    # runs (a finished task's record holds the log itself).
    import random
    import sys

    ext = require_c_extension()
    rng = random.Random(1919)
    calls = [(f"call#{k}", "sleep", f"app.py:{k} handler", "") for k in range(3)]
    twin, c = WaitLog(), ext.WaitLog()
    assert not c  # empty
    t = 0
    held: list[tuple[list[Any], list[Any]]] = []
    for i in range(2000):
        waited = rng.choice([1, 2, 3, 5, 8, 1000, rng.randint(1, 10**6)])
        wait = rng.choice(calls)
        twin.add(t, t + waited, wait)
        c.add(t, t + waited, wait)
        t += 10**7
        assert c.runs == twin.runs, i
        if rng.random() < 0.05 and len(c) > 1:
            run = rng.choice(c.runs[:-1])
            held.append((run, run[:]))
    assert held
    assert all(run == was for run, was in held)
    assert len(c) == len(twin) == WaitLog.max_runs
    assert list(c) == list(twin) == twin.runs
    assert not gc.is_tracked(c)
    assert sys.getsizeof(c) >= 64 * WaitLog.max_runs  # its runs' room is counted
    assert repr(c) == f"<WaitLog of {WaitLog.max_runs} runs>"


def test_the_c_wait_log_takes_a_wait_of_four_texts() -> None:
    ext = require_c_extension()
    log = ext.WaitLog()
    with pytest.raises(TypeError, match="what, kind, where, caller"):
        log.add(0, 1, ("a", "b", "c"))
    with pytest.raises(TypeError, match="what, kind, where, caller"):
        log.add(0, 1, ["a", "b", "c", "d"])
    with pytest.raises(OverflowError):
        log.add(-1, 1, ("a", "b", "c", "d"))
    with pytest.raises(TypeError, match="no arguments"):
        ext.WaitLog(1)
    assert log.runs == []  # nothing kept from a refused wait
    log.add(0, 5, ("a", 1, "c", None))  # texts as str() says them: the log holds plain data
    assert log.runs == [[0, 5, 1, 5, 5, "a", "1", "c", "None", 5]]


def test_describe_task_takes_the_task_itself(backend) -> None:
    # Issue 16 item 7: at stop, a pending task is described from its task
    # object (asyncio's get_coro and _fut_waiter, trio's coro).
    from aprof._integrations._await_chain import describe_task

    tasks: list[Any] = []

    async def parked(ev: Any) -> None:
        if backend.is_trio:
            import trio

            tasks.append(trio.lowlevel.current_task())
        else:
            tasks.append(asyncio.current_task())
        await ev.wait()

    async def main() -> Any:
        prims = Prims(backend)
        async with backend.group() as g:
            g.start_soon(parked, prims.event)
            await _until(backend, tasks)
            wait = describe_task(tasks[0])
            prims.event.set()
        prims.close()
        return wait

    wait = backend.run(main)
    assert wait is not None
    assert wait[1] == "event"
    assert describe_task(object()) is None



def _current_task(backend) -> Any:
    if backend.is_trio:
        import trio

        return trio.lowlevel.current_task()
    return asyncio.current_task()


@pytest.mark.parametrize(
    "kind", ["sleep", "lock", "event", "queue", "executor", "task", "future", "executor-future", "children"]
)
def test_a_long_wait_is_logged_alike_by_the_c_path_and_its_twin(backend, kind: str) -> None:
    # Issue 19: a C Task's long wait at a call site already described is
    # logged in C (note_wait, wait_at and WaitLog.add). Fed the same waits
    # as the Python twin, on the same suspended tasks, its log must be the
    # twin's, drops of a full log included. A trio task is the twin's.
    ext = require_c_extension()
    require_c_paths()
    import aprof._integrations._asyncio  # noqa: F401  (sets the C path up)
    from aprof._integrations._tasks import TaskThread, note_wait

    if backend.is_trio and kind in ("task", "future", "executor-future", "children"):
        return  # an asyncio future the user's code awaits: asyncio only (the other kinds cover trio)
    tasks: list[Any] = []
    scopes: list[Any] = []
    release = threading.Event()
    futures: list[Any] = []

    async def waiter(prims: Prims) -> None:
        tasks.append(_current_task(backend))
        if kind == "sleep":
            if backend.is_trio or backend.is_anyio:
                scope = _cancel_scope(backend)
                scopes.append(scope)
                with scope:
                    await backend.sleep(30)
            else:
                with contextlib.suppress(asyncio.CancelledError):
                    await backend.sleep(30)
        elif kind == "lock":
            async with prims.lock:
                pass
        elif kind == "event":
            await prims.event.wait()
        elif kind == "queue":
            await prims.get()
        elif kind == "executor":
            await backend.to_thread(release.wait, 30)
        elif kind == "task":
            await asyncio.create_task(other_waiter(prims), name="kid-1")
        elif kind == "future":
            futures.append(asyncio.get_running_loop().create_future())
            await futures[0]
        elif kind == "executor-future":
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)
        else:
            await asyncio.gather(other_waiter(prims), other_waiter(prims))

    async def other_waiter(prims: Prims) -> None:  # a second call site, for runs by turns
        await prims.event.wait()

    async def main() -> tuple[list[Any], list[Any], list[bool]]:
        prims = Prims(backend)
        if kind == "lock":
            await prims.lock.acquire()
        async with backend.group() as g:
            g.start_soon(waiter, prims)
            g.start_soon(other_waiter, prims)
            await _until(backend, tasks)
            await backend.sleep(0.005)  # every task is in its wait
            waiting = tasks[0]
            other = next(t for t in _group_tasks(backend, waiting) if t is not waiting)
            twin, c = TaskThread.__new__(TaskThread), TaskThread.__new__(TaskThread)
            twin.waits = c.waits = None
            handled = []
            # The two tasks' waits by turns, so that the log fills and drops
            # runs; the first of each is the twin's in both logs (it
            # describes the call site and caches it).
            for i in range(3 * WaitLog.max_runs):
                who = waiting if i % 2 == 0 else other
                start, end = i * 100_000_000, i * 100_000_000 + (i * 7919 % 13 + 1) * 1_000_000
                note_wait(twin, who, start, end)
                if i < 2:
                    note_wait(c, who, start, end)
                else:
                    handled.append(ext._note_wait(c, who, start, end))
                    if not handled[-1]:  # as in the step hook: the twin's case
                        note_wait(c, who, start, end)
            # let them go
            prims.event.set()
            if kind == "lock":
                prims.lock.release()
            elif kind in ("executor", "executor-future"):
                release.set()
            elif kind == "queue":
                await prims.put()
            elif kind == "future":
                futures[0].set_result(None)
            elif kind == "sleep":
                if scopes:
                    scopes[0].cancel()
                else:
                    waiting.cancel()
        prims.close()
        assert twin.waits is not None
        assert c.waits is not None
        return twin.waits.runs, c.waits.runs, handled

    twin_runs, c_runs, handled = backend.run(main)
    assert len(twin_runs) == WaitLog.max_runs
    assert c_runs == twin_runs
    want = {"executor-future": "executor"}.get(kind, kind)
    assert want in {run[6] for run in twin_runs}, twin_runs
    assert len({(run[5], run[7]) for run in twin_runs}) == 2, twin_runs  # the two tasks' waits, by turns
    if backend.is_trio:
        assert not any(handled)  # trio's tasks are the twin's
    else:
        assert all(handled), handled


@pytest.mark.parametrize("name", ["kid-1", "it's", 'say "hi"', "naïve", "tab\there", "back\\slash"])
def test_a_child_tasks_name_is_quoted_alike_by_the_c_path_and_its_twin(backend, name: str) -> None:
    # Issue 19: the C path writes "task 'kid-1' (coro)" out itself when
    # repr() would quote the name as it is; any other name (a quote, a
    # backslash, a tab, beyond ASCII) goes through repr(), as the twin's.
    ext = require_c_extension()
    require_c_paths()
    import aprof._integrations._asyncio  # noqa: F401  (sets the C path up)
    from aprof._integrations._tasks import TaskThread, note_wait

    async def kid(ev: Any) -> None:
        await ev.wait()

    async def parent(ev: Any, seen: list[Any]) -> None:
        seen.append(_current_task(backend))
        if backend.is_trio:  # a trio task waits on no asyncio task: the twin's
            await ev.wait()
        else:
            await asyncio.create_task(kid(ev), name=name)

    async def main() -> tuple[Any, Any, list[bool]]:
        prims = Prims(backend)
        seen: list[Any] = []
        async with backend.group() as g:
            g.start_soon(parent, prims.event, seen)
            await _until(backend, seen)
            await backend.sleep(0.005)  # in its wait
            twin, c = TaskThread.__new__(TaskThread), TaskThread.__new__(TaskThread)
            twin.waits = c.waits = None
            note_wait(twin, seen[0], 0, 2_000_000)  # describes the call site and caches it
            note_wait(twin, seen[0], 3_000_000, 5_000_000)
            note_wait(c, seen[0], 0, 2_000_000)
            handled = [ext._note_wait(c, seen[0], 3_000_000, 5_000_000)]
            if not handled[0]:
                note_wait(c, seen[0], 3_000_000, 5_000_000)
            prims.event.set()
        prims.close()
        return twin.waits.runs, c.waits.runs, handled

    twin_runs, c_runs, handled = backend.run(main)
    assert c_runs == twin_runs
    if backend.is_trio:
        assert handled == [False]
    else:
        assert handled == [True]
        assert twin_runs[0][5] == f"task {name!r} (test_a_child_tasks_name_is_quoted_alike_by_the_c_path_and_its_twin.<locals>.kid)"


def test_the_c_path_keeps_each_call_site_of_a_coroutine_apart_and_outlives_the_site_cache(backend) -> None:
    # Issue 19: the C path finds a chain's call site by its walk (codes and
    # offsets) in a cache of its own before _await_chain._sites. Two awaits
    # of the same coroutine are two sites; once both are known, clearing
    # _sites (as it is at _MAX_CACHED) changes nothing the C path says.
    ext = require_c_extension()
    require_c_paths()
    import aprof._integrations._asyncio  # noqa: F401  (sets the C path up)
    from aprof._integrations import _await_chain
    from aprof._integrations._tasks import TaskThread, note_wait

    at: list[str] = []

    async def two_sites(a: Prims, b: Prims, seen: list[Any]) -> None:
        seen.append(_current_task(backend))
        channels = not hasattr(a, "queue")  # anyio's or trio's memory channels
        for _ in range(3):  # the awaits in this frame: each its own `where`
            at.append("a")
            await (a.recv.receive() if channels else a.queue.get())
            at.append("b")
            await (b.recv.receive() if channels else b.queue.get())

    async def main() -> tuple[Any, Any, list[bool]]:
        a, b = Prims(backend), Prims(backend)
        seen: list[Any] = []
        twin, c = TaskThread.__new__(TaskThread), TaskThread.__new__(TaskThread)
        twin.waits = c.waits = None
        handled: list[bool] = []
        async with backend.group() as g:
            g.start_soon(two_sites, a, b, seen)
            await _until(backend, seen)
            t = 0
            for round_ in range(3):
                for prims, site in ((a, "a"), (b, "b")):
                    while at[-1] != site:
                        await backend.sleep(0.001)
                    await backend.sleep(0.002)  # in its wait
                    if round_ == 2 and site == "a":
                        _await_chain._sites.clear()  # both sites known to the C path by now
                    note_wait(twin, seen[0], t, t + 2_000_000)
                    if round_ == 0:  # the first wait at each site: the twin's, which caches it
                        note_wait(c, seen[0], t, t + 2_000_000)
                    else:
                        handled.append(ext._note_wait(c, seen[0], t, t + 2_000_000))
                        if not handled[-1]:
                            note_wait(c, seen[0], t, t + 2_000_000)
                    t += 3_000_000
                    await prims.put()  # on to the other await
        a.close()
        b.close()
        return twin.waits.runs, c.waits.runs, handled

    twin_runs, c_runs, handled = backend.run(main)
    assert c_runs == twin_runs
    sites = [(run[7], run[8]) for run in twin_runs]  # (where, caller): a's and b's by turns
    assert len(sites) == 6, sites
    assert sites[0] != sites[1], sites
    assert sites[0::2] == [sites[0]] * 3, sites
    assert sites[1::2] == [sites[1]] * 3, sites
    assert handled == ([False] * 4 if backend.is_trio else [True] * 4)


def _group_tasks(backend, one: Any) -> list[Any]:
    """The tasks of the group ``one`` was started in (its siblings too)."""
    if backend.is_trio:
        return list(one.parent_nursery.child_tasks)
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
