"""Logical threads and context-local state (SPEC 1, 2.1-2.4).

Logical thread ids, debug-info slots and their guards, what spawned tasks and
propagated work inherit, guards exited in the wrong context, ContextState
snapshots, and context callbacks that follow their context (CI-07) on every
backend.
"""

from __future__ import annotations

import contextvars
import gc
import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest

import aprof

from .conftest import Backend

TEST = aprof.DebugInfoKind.TEST_INFO
TEST2 = aprof.DebugInfoKind.TEST_INFO_2
USER = aprof.RecordScope.USER_SCOPE


async def wait_until(backend: Backend, cond: Callable[[], bool]) -> None:
    """Yield to the other tasks until ``cond()`` holds (no timing involved)."""
    for _ in range(10_000):
        if cond():
            return
        await backend.checkpoint()
    raise AssertionError("the other task never got there")


def run_in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a fresh OS thread (with an empty context) and return its result."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return out[0]


def user_events(prof: aprof.profile) -> list[aprof.FunctionEvent]:
    return [e for e in prof.events() if e.scope is USER]


# ---------------------------------------------------------------------------
# SPEC 1: logical thread ids
# ---------------------------------------------------------------------------


def test_thread_ids_unique_per_task_and_stable_within_one(backend: Backend) -> None:
    # SPEC 1: one id per task, stable across its awaits; the worker thread of
    # to_thread is another logical thread; RecordFunction agrees.
    async def child(ids: dict[str, int], name: str) -> None:
        first = aprof.current_thread_id()
        await backend.checkpoint()
        await backend.sleep(0.001)
        assert aprof.current_thread_id() == first
        assert aprof.RecordFunction.current_thread_id() == first
        ids[name] = first

    async def main() -> dict[str, int]:
        ids: dict[str, int] = {"main": aprof.current_thread_id()}
        await backend.checkpoint()
        assert aprof.current_thread_id() == ids["main"]
        async with backend.group() as g:
            for i in range(3):
                g.start_soon(child, ids, f"child-{i}")
        assert aprof.current_thread_id() == ids["main"]
        ids["worker"] = await backend.to_thread(aprof.current_thread_id)
        return ids

    first = backend.run(main)
    assert all(isinstance(i, int) and i > 0 for i in first.values())
    assert len(set(first.values())) == len(first) == 5, first
    # Unique for the life of the process: a new run's tasks get new ids.
    second = backend.run(main)
    tasks_first = {v for k, v in first.items() if k != "worker"}
    tasks_second = {v for k, v in second.items() if k != "worker"}
    assert not tasks_first & tasks_second


def test_thread_ids_match_the_tracks_of_recorded_events(backend: Backend) -> None:
    # SPEC 1, 6.2: the id seen inside a task is the thread_id of its events.
    async def child(seen: dict[str, int], name: str) -> None:
        seen[name] = aprof.current_thread_id()
        with aprof.record_function(name):
            await backend.checkpoint()

    async def main() -> tuple[aprof.profile, dict[str, int]]:
        seen: dict[str, int] = {}
        async with aprof.profile() as prof:
            seen["main"] = aprof.current_thread_id()
            with aprof.record_function("main"):
                async with backend.group() as g:
                    g.start_soon(child, seen, "a")
                    g.start_soon(child, seen, "b")
        return prof, seen

    prof, seen = backend.run(main)
    events = {e.name: e for e in user_events(prof)}
    assert set(events) == {"main", "a", "b"}
    for name, ev in events.items():
        assert ev.thread_id == seen[name]


def test_os_threads_get_their_own_ids() -> None:
    # SPEC 1: outside any task, each OS thread is one logical thread, stable
    # within it; a thread started after another ended gets a new id even if
    # the OS reuses the thread ident.
    main = aprof.current_thread_id()
    assert aprof.current_thread_id() == main

    def twice() -> tuple[int, int]:
        return aprof.current_thread_id(), aprof.current_thread_id()

    a1, a2 = run_in_thread(twice)
    b1, b2 = run_in_thread(twice)
    assert a1 == a2
    assert b1 == b2
    assert len({main, a1, b1}) == 3


# ---------------------------------------------------------------------------
# SPEC 2.1: debug-info slots and DebugInfoGuard
# ---------------------------------------------------------------------------


def test_debug_info_kinds() -> None:
    # SPEC 2.1: at least PROFILER_STATE and two test slots, all distinct.
    kinds = {aprof.DebugInfoKind.PROFILER_STATE, TEST, TEST2}
    assert len(kinds) == 3
    assert all(isinstance(k, aprof.DebugInfoKind) for k in kinds)


def test_debug_info_guard_nests_and_restores_in_sync_code() -> None:
    # SPEC 2.1: the innermost info wins; each exit restores the outer value;
    # slots are independent; None outside any guard.
    assert aprof.get_debug_info(TEST) is None
    outer, inner, other = object(), object(), object()
    with aprof.DebugInfoGuard(TEST, outer) as g:
        assert isinstance(g, aprof.DebugInfoGuard)
        assert aprof.get_debug_info(TEST) is outer
        with aprof.DebugInfoGuard(TEST2, other):
            with aprof.DebugInfoGuard(TEST, inner):
                assert aprof.get_debug_info(TEST) is inner
                assert aprof.get_debug_info(TEST2) is other
            assert aprof.get_debug_info(TEST) is outer
        assert aprof.get_debug_info(TEST2) is None
        assert aprof.get_debug_info(TEST) is outer
    assert aprof.get_debug_info(TEST) is None
    assert aprof.get_debug_info(aprof.DebugInfoKind.PROFILER_STATE) is None


def test_debug_info_guard_restores_on_exception() -> None:
    # SPEC 2.1, 4.2: an exception leaving the body restores the slot and
    # propagates unchanged.
    err = KeyError("boom")
    with pytest.raises(KeyError) as info, aprof.DebugInfoGuard(TEST, "x"):
        raise err
    assert info.value is err
    assert aprof.get_debug_info(TEST) is None


def test_debug_info_rejects_a_bad_kind() -> None:
    # SPEC 2.1, 12: a slot that is not a DebugInfoKind is a TypeError naming it.
    with pytest.raises(TypeError, match="DebugInfoKind"):
        aprof.get_debug_info(2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="DebugInfoKind"):
        aprof.DebugInfoGuard("TEST_INFO", 1)  # type: ignore[arg-type]


def test_debug_info_guard_across_awaits(backend: Backend) -> None:
    # SPEC 2.1: a guard held across awaits keeps its value in the task, and is
    # restored at its exit.
    async def main() -> None:
        async with backend.group() as g:
            g.start_soon(backend.sleep, 0.001)  # another task runs meanwhile
            with aprof.DebugInfoGuard(TEST, "held"):
                await backend.sleep(0.002)
                assert aprof.get_debug_info(TEST) == "held"
                await backend.checkpoint()
                assert aprof.get_debug_info(TEST) == "held"
            assert aprof.get_debug_info(TEST) is None

    backend.run(main)


# ---------------------------------------------------------------------------
# SPEC 2.2: what tasks and propagated work inherit
# ---------------------------------------------------------------------------


def test_child_task_inherits_but_is_isolated(backend: Backend) -> None:
    # SPEC 2.2: the child sees what the parent set before the spawn; what the
    # child pushes is invisible to the parent; what the parent pushes after
    # the spawn is invisible to the child.
    state: dict[str, Any] = {}

    async def child() -> None:
        state["child saw at start"] = aprof.get_debug_info(TEST)
        with aprof.DebugInfoGuard(TEST2, "child's"):
            state["child pushed"] = True
            await wait_until(backend, lambda: "parent pushed" in state)
            state["child saw parent's later push"] = aprof.get_debug_info(TEST)
            state["child's own"] = aprof.get_debug_info(TEST2)
        with aprof.DebugInfoGuard(TEST, "child's override"):
            await backend.checkpoint()
        state["child done"] = True

    async def main() -> None:
        with aprof.DebugInfoGuard(TEST, "parent's"):
            async with backend.group() as g:
                g.start_soon(child)
                await wait_until(backend, lambda: "child pushed" in state)
                state["parent saw child's push"] = aprof.get_debug_info(TEST2)
                with aprof.DebugInfoGuard(TEST, "parent's later"):
                    state["parent pushed"] = True
                    await wait_until(backend, lambda: "child done" in state)
                    state["parent after child popped"] = aprof.get_debug_info(TEST)
            state["parent at end"] = aprof.get_debug_info(TEST)

    backend.run(main)
    assert state["child saw at start"] == "parent's"
    assert state["parent saw child's push"] is None
    assert state["child saw parent's later push"] == "parent's"
    assert state["child's own"] == "child's"
    assert state["parent after child popped"] == "parent's later"
    assert state["parent at end"] == "parent's"


def test_to_thread_inherits_the_callers_slots(backend: Backend) -> None:
    # SPEC 1, 2.2: the runtimes' to_thread copy the context; the worker's
    # pushes stay in the worker.
    def worker() -> Any:
        seen = aprof.get_debug_info(TEST)
        with aprof.DebugInfoGuard(TEST, "worker's"):
            pass
        with aprof.DebugInfoGuard(TEST2, "worker's leak?"):
            return seen

    async def main() -> None:
        with aprof.DebugInfoGuard(TEST, "caller's"):
            assert await backend.to_thread(worker) == "caller's"
            assert aprof.get_debug_info(TEST) == "caller's"
            assert aprof.get_debug_info(TEST2) is None

    backend.run(main)


@pytest.mark.parametrize("how", ["wrap", "launch", "propagating"])
def test_propagated_submission_inherits_but_is_isolated(how: str) -> None:
    # SPEC 2.2, 2.5: a submission sees the slots set before it was made; the
    # submitter's later pushes are invisible to it and its pushes to the
    # submitter.
    from concurrent.futures import ThreadPoolExecutor

    def work() -> Any:
        seen = aprof.get_debug_info(TEST)
        with aprof.DebugInfoGuard(TEST2, "worker's"):
            return seen, aprof.get_debug_info(TEST2)

    with aprof.DebugInfoGuard(TEST, "before"):
        if how == "wrap":
            wrapped = aprof.wrap(work)
            with aprof.DebugInfoGuard(TEST, "after"):
                result = run_in_thread(wrapped)
        elif how == "launch":
            fut = aprof.launch(work)
            with aprof.DebugInfoGuard(TEST, "after"):
                result = fut.result()
        else:
            with aprof.propagating(ThreadPoolExecutor(1)) as pool:
                fut = pool.submit(work)
                with aprof.DebugInfoGuard(TEST, "after"):
                    result = fut.result()
        assert aprof.get_debug_info(TEST2) is None
    assert result == ("before", "worker's")


# ---------------------------------------------------------------------------
# Guards exited out of order (issue 15 item 3)
# ---------------------------------------------------------------------------


def applied_state(info: str, enabled: bool) -> Any:
    """``ContextState.applied()`` of a snapshot with TEST = info and recording switched as asked."""

    def capture() -> aprof.ContextState:
        aprof.enable_record_function(enabled)
        with aprof.DebugInfoGuard(TEST, info):
            return aprof.ContextState.capture()

    return contextvars.copy_context().run(capture).applied()


# For each guard type: make the i-th guard, and read the value it sets.
GUARD_KINDS: dict[str, tuple[Callable[[int], Any], Callable[[], Any]]] = {
    "RecordFunctionGuard": (lambda i: aprof.RecordFunctionGuard(enabled=i % 2 == 1), aprof.is_record_function_enabled),
    "DisableRecordFunctionGuard": (
        lambda i: aprof.DisableRecordFunctionGuard() if i % 2 == 0 else aprof.RecordFunctionGuard(),
        aprof.is_record_function_enabled,
    ),
    "DebugInfoGuard": (lambda i: aprof.DebugInfoGuard(TEST, f"g{i}"), lambda: aprof.get_debug_info(TEST)),
    "ContextState.applied": (
        lambda i: applied_state(f"s{i}", enabled=i % 2 == 1),
        lambda: (aprof.get_debug_info(TEST), aprof.is_record_function_enabled()),
    ),
}


@pytest.mark.parametrize("exits", list(itertools.permutations(range(3))), ids=lambda p: "".join(map(str, p)))
@pytest.mark.parametrize("kind", sorted(GUARD_KINDS))
def test_guards_exited_in_any_order_never_leave_state_stuck(kind: str, exits: tuple[int, ...]) -> None:
    # SPEC 2.1, 2.4, 3.4 (issue 15 item 3, RELIABILITY CP-11 for guards):
    # three guards entered in order and exited in any order. While some are
    # open, the value is that of the innermost one still open; once all have
    # exited, it is what it was before the first entered.
    make, value = GUARD_KINDS[kind]

    def run() -> None:
        base = value()
        guards = [make(i) for i in range(3)]
        seen = []
        for g in guards:
            g.__enter__()
            seen.append(value())
        assert len(set(map(repr, seen[:2]))) == 2  # consecutive guards set different values
        open_ = [0, 1, 2]
        for i in exits:
            guards[i].__exit__(None, None, None)
            open_.remove(i)
            assert value() == (seen[open_[-1]] if open_ else base), (i, open_)
        assert value() == base

    contextvars.copy_context().run(run)


def test_guards_of_different_kinds_exited_out_of_order() -> None:
    # SPEC 2.4, 3.4: applied() covers every field, RecordFunctionGuard and
    # DebugInfoGuard one each; exits crossing each other still end where
    # things started.
    def run() -> None:
        g1 = aprof.DisableRecordFunctionGuard()
        g2 = applied_state("applied", enabled=True)
        g3 = aprof.DebugInfoGuard(TEST, "inner")
        g1.__enter__()
        g2.__enter__()
        g3.__enter__()
        assert (aprof.get_debug_info(TEST), aprof.is_record_function_enabled()) == ("inner", True)
        g1.__exit__(None, None, None)
        assert (aprof.get_debug_info(TEST), aprof.is_record_function_enabled()) == ("inner", True)
        g2.__exit__(None, None, None)
        # applied()'s other fields go back; the slot stays with the inner guard.
        assert (aprof.get_debug_info(TEST), aprof.is_record_function_enabled()) == ("inner", True)
        g3.__exit__(None, None, None)
        assert (aprof.get_debug_info(TEST), aprof.is_record_function_enabled()) == (None, True)

    contextvars.copy_context().run(run)


@pytest.mark.parametrize("kind", sorted(GUARD_KINDS))
def test_interleaved_async_generators_each_holding_a_guard(backend: Backend, kind: str) -> None:
    # SPEC 2.1, 3.4 (issue 15 item 3): two async generators, iterated by one
    # task, each hold a guard across their yields; the first finishes
    # first. Afterwards the task's state is what it was, and ranges are
    # recorded again.
    make, value = GUARD_KINDS[kind]

    async def holding(i: int) -> Any:
        with make(i):
            yield value()
            yield value()

    async def main() -> tuple[Any, Any, Any]:
        base = value()
        a, b = holding(0), holding(1)
        await a.__anext__()
        inside = await b.__anext__()
        await a.__anext__()
        with pytest.raises(StopAsyncIteration):
            await a.__anext__()
        middle = value()
        await b.__anext__()
        with pytest.raises(StopAsyncIteration):
            await b.__anext__()
        assert middle == inside
        with aprof.record_function("after-the-generators"):
            pass
        return base, value(), aprof.is_record_function_enabled()

    with aprof.profile() as prof:
        base, after, enabled = backend.run(main)
    assert after == base
    assert enabled
    assert [e.name for e in user_events(prof)] == ["after-the-generators"]


# ---------------------------------------------------------------------------
# SPEC 2.3: a guard exited in another context
# ---------------------------------------------------------------------------


def make_guard(kind: str) -> Any:
    if kind == "DebugInfoGuard":
        return aprof.DebugInfoGuard(TEST, "handed")
    return aprof.DisableRecordFunctionGuard()


@pytest.mark.parametrize("guard_kind", ["DebugInfoGuard", "DisableRecordFunctionGuard"])
@pytest.mark.parametrize("relation", ["sibling", "child"])
def test_guard_exited_in_another_task(backend: Backend, relation: str, guard_kind: str) -> None:
    # SPEC 2.3: a guard entered in task A and exited in task B (a sibling, or
    # a child spawned inside the guard) raises a RuntimeError naming the
    # guard, never contextvars' ValueError; A's own later code still works.
    shared: dict[str, Any] = {}

    async def exiter() -> None:
        await wait_until(backend, lambda: "guard" in shared)
        try:
            shared["guard"].__exit__(None, None, None)
        except BaseException as exc:
            shared["error"] = exc
        shared["exited"] = True

    async def owner(g: Any) -> None:
        guard = make_guard(guard_kind)
        guard.__enter__()
        if relation == "child":
            g.start_soon(exiter)
        shared["guard"] = guard
        await wait_until(backend, lambda: "exited" in shared)
        with aprof.DebugInfoGuard(TEST2, "after"):  # A's context is still usable
            assert aprof.get_debug_info(TEST2) == "after"

    async def main() -> None:
        async with backend.group() as g:
            g.start_soon(owner, g)
            if relation == "sibling":
                g.start_soon(exiter)
        # Nothing leaked into the parent's context.
        assert aprof.get_debug_info(TEST) is None
        assert aprof.is_record_function_enabled()

    backend.run(main)
    err = shared["error"]
    assert type(err) is RuntimeError, repr(err)
    assert guard_kind in str(err)
    if guard_kind == "DebugInfoGuard":
        assert "'handed'" in str(err)


def test_guard_in_a_generator_closed_in_another_context() -> None:
    # SPEC 2.3, CP-13: a guard held across a generator's yields, started in
    # one context and closed in another, raises a clear RuntimeError naming
    # the guard, not contextvars' ValueError.
    def gen() -> Any:
        with aprof.DebugInfoGuard(TEST, "in-gen"):
            yield 1
            yield 2

    g = gen()
    assert contextvars.copy_context().run(next, g) == 1
    with pytest.raises(RuntimeError, match="DebugInfoGuard") as info:
        contextvars.copy_context().run(g.close)
    assert not isinstance(info.value, ValueError)
    assert aprof.get_debug_info(TEST) is None


def test_context_state_applied_exited_in_another_context() -> None:
    # SPEC 2.3, 2.4: applied() is a guard too: exited in another context it
    # raises a RuntimeError naming it, not contextvars' ValueError.
    with aprof.DebugInfoGuard(TEST, "captured"):
        state = aprof.ContextState.capture()
    cm = state.applied()
    ctx = contextvars.copy_context()
    ctx.run(cm.__enter__)
    assert ctx.run(aprof.get_debug_info, TEST) == "captured"
    with pytest.raises(RuntimeError, match="applied|ContextState"):
        contextvars.copy_context().run(cm.__exit__, None, None, None)
    assert aprof.get_debug_info(TEST) is None


def test_decorated_generator_dropped_in_another_context(backend: Backend) -> None:
    # CP-13, SPEC 2.3, 4.1: a @record_function generator suspended in task A
    # and closed in task B, or collected in another OS thread: no ValueError,
    # no unraisable traceback (pytest turns those into errors), one event each
    # on A's track, and A's context holds the same aprof state as before.
    @aprof.record_function("gen")
    def gen() -> Any:
        yield 1
        yield 2

    shared: dict[str, Any] = {}

    def state_of_context() -> tuple[Any, ...]:
        return (
            tuple(aprof.get_debug_info(k) for k in aprof.DebugInfoKind),
            aprof.is_record_function_enabled(),
            aprof.has_context_callbacks(),
        )

    async def owner() -> None:
        shared["owner"] = aprof.current_thread_id()
        before = state_of_context()
        g1, g2 = gen(), gen()
        assert next(g1) == 1
        assert next(g2) == 1
        shared["g1"] = g1
        holder = [g2]
        del g1, g2
        await wait_until(backend, lambda: "closed" in shared)
        t = threading.Thread(target=lambda: (holder.clear(), gc.collect()))
        t.start()
        t.join()
        assert state_of_context() == before
        shared["after"] = state_of_context()

    async def closer() -> None:
        await wait_until(backend, lambda: "g1" in shared)
        shared.pop("g1").close()
        shared["closer"] = aprof.current_thread_id()
        shared["closed"] = True

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                g.start_soon(owner)
                g.start_soon(closer)
        return prof

    prof = backend.run(main)
    events = [e for e in user_events(prof) if e.name == "gen"]
    assert len(events) == 2
    assert all(e.thread_id == shared["owner"] for e in events)
    assert all(e.exception == "GeneratorExit" or e.unfinished for e in events)
    closed_in_b = [e for e in events if e.end_thread_id == shared["closer"]]
    assert len(closed_in_b) == 1
    assert closed_in_b[0].is_async


# ---------------------------------------------------------------------------
# SPEC 2.4: ContextState
# ---------------------------------------------------------------------------


def test_context_state_applied_in_a_plain_thread() -> None:
    # SPEC 2.4: a snapshot applied in another thread sends that thread's
    # ranges to the capturing context's profile (on the thread's own track),
    # and what the thread had installed is back after.
    with aprof.profile() as prof, aprof.DebugInfoGuard(TEST, "request-7"):
        main_id = aprof.current_thread_id()
        state = aprof.ContextState.capture()

        def worker() -> tuple[Any, ...]:
            with aprof.DebugInfoGuard(TEST, "thread's own"):
                with aprof.record_function("before-apply"):
                    pass
                with state.applied() as applied:
                    assert applied is state
                    inside = aprof.get_debug_info(TEST)
                    has_profile = aprof.get_debug_info(aprof.DebugInfoKind.PROFILER_STATE) is not None
                    with aprof.record_function("applied"):
                        pass
                after = aprof.get_debug_info(TEST)
                after_profile = aprof.get_debug_info(aprof.DebugInfoKind.PROFILER_STATE)
                with aprof.record_function("after-apply"):
                    pass
            return inside, has_profile, after, after_profile, aprof.current_thread_id()

        inside, has_profile, after, after_profile, worker_id = run_in_thread(worker)
    assert inside == "request-7"
    assert has_profile
    assert after == "thread's own"
    assert after_profile is None
    events = user_events(prof)
    assert [e.name for e in events] == ["applied"]
    assert events[0].thread_id == worker_id != main_id


def test_context_state_is_a_snapshot() -> None:
    # SPEC 2.4: later changes in the capturing context do not alter the snapshot.
    with aprof.DebugInfoGuard(TEST, "at capture"):
        state = aprof.ContextState.capture()
        with aprof.DebugInfoGuard(TEST, "later"), state.applied():
            assert aprof.get_debug_info(TEST) == "at capture"
        assert aprof.get_debug_info(TEST) == "at capture"
    assert aprof.get_debug_info(TEST) is None
    with state.applied():
        assert aprof.get_debug_info(TEST) == "at capture"
    assert aprof.get_debug_info(TEST) is None


def test_context_state_carries_switch_and_context_callbacks() -> None:
    # SPEC 2.4, 3.3, 3.4: the snapshot carries whether recording is enabled
    # and the context callbacks; applying it restores the thread's own after.
    seen: list[tuple[str, str]] = []
    cb = aprof.RecordFunctionCallback(lambda rf: seen.append((rf.name, threading.current_thread().name)))
    ctx = contextvars.copy_context()

    def capture() -> tuple[aprof.ContextState, aprof.ContextState]:
        aprof.add_context_callback(cb.scopes({USER}))
        on = aprof.ContextState.capture()
        with aprof.DisableRecordFunctionGuard():
            off = aprof.ContextState.capture()
        return on, off

    on, off = ctx.run(capture)
    assert not aprof.has_context_callbacks()

    def worker() -> tuple[bool, bool, bool]:
        with on.applied():
            has_cb = aprof.has_context_callbacks()
            with aprof.record_function("on"):
                pass
        with off.applied():
            disabled = not aprof.is_record_function_enabled()
            with aprof.record_function("off"):
                pass
        with aprof.record_function("bare"):
            pass
        return has_cb, disabled, aprof.has_context_callbacks() or not aprof.is_record_function_enabled()

    t = threading.Thread(target=lambda: seen.append(("result", repr(worker()))), name="state-worker")
    t.start()
    t.join()
    assert seen == [("on", "state-worker"), ("result", repr((True, True, False)))]
    ctx.run(aprof.clear_context_callbacks)


def test_context_state_applied_in_a_sibling_task(backend: Backend) -> None:
    # SPEC 2.4: applied in another task, the task's ranges reach the
    # capturing task's profile, on the applying task's track; the task's own
    # state is back after.
    shared: dict[str, Any] = {}

    async def profiled() -> None:
        async with aprof.profile() as prof:
            with aprof.DebugInfoGuard(TEST, "captured"):
                shared["state"] = aprof.ContextState.capture()
            await wait_until(backend, lambda: "done" in shared)
        shared["prof"] = prof

    async def other() -> None:
        await wait_until(backend, lambda: "state" in shared)
        shared["other"] = aprof.current_thread_id()
        with aprof.record_function("unprofiled"):
            pass
        with shared["state"].applied():
            assert aprof.get_debug_info(TEST) == "captured"
            with aprof.record_function("applied"):
                await backend.checkpoint()
        assert aprof.get_debug_info(TEST) is None
        assert aprof.get_debug_info(aprof.DebugInfoKind.PROFILER_STATE) is None
        shared["done"] = True

    async def main() -> None:
        async with backend.group() as g:
            g.start_soon(profiled)
            g.start_soon(other)

    backend.run(main)
    events = user_events(shared["prof"])
    assert [e.name for e in events] == ["applied"]
    assert events[0].thread_id == shared["other"]
    assert not events[0].unfinished


# ---------------------------------------------------------------------------
# CI-07: context callbacks follow their context
# ---------------------------------------------------------------------------


def test_context_callback_follows_its_context(backend: Backend) -> None:
    # CI-07, SPEC 3.3: a context callback registered in task A sees A's
    # ranges, its children's, its to_thread's and its aprof.wrap / launch
    # submissions'; never sibling B's nor B's to_thread's.
    seen: list[str] = []
    lock = threading.Lock()
    shared: dict[str, bool] = {}

    def on_start(rf: aprof.RecordFunction) -> None:
        with lock:
            seen.append(rf.name)

    def ranged(name: str) -> None:
        with aprof.record_function(name):
            pass

    async def a_child() -> None:
        ranged("A-child")

    async def task_a() -> None:
        handle = aprof.add_context_callback(aprof.RecordFunctionCallback(on_start).scopes({USER}))
        shared["registered"] = True
        ranged("A")
        async with backend.group() as g:
            g.start_soon(a_child)
        await backend.to_thread(ranged, "A-to-thread")
        t = threading.Thread(target=aprof.wrap(ranged), args=("A-wrap",))
        t.start()
        t.join()
        aprof.launch(ranged, "A-launch").result()
        await wait_until(backend, lambda: "b done" in shared)
        aprof.remove_callback(handle)
        assert not aprof.has_context_callbacks()

    async def task_b() -> None:
        await wait_until(backend, lambda: "registered" in shared)
        assert not aprof.has_context_callbacks()
        ranged("B")
        await backend.to_thread(ranged, "B-to-thread")
        t = threading.Thread(target=aprof.wrap(ranged), args=("B-wrap",))
        t.start()
        t.join()
        shared["b done"] = True

    async def main() -> None:
        async with backend.group() as g:
            g.start_soon(task_a)
            g.start_soon(task_b)
        ranged("main")

    backend.run(main)
    assert sorted(seen) == ["A", "A-child", "A-launch", "A-to-thread", "A-wrap"]
