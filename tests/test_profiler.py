"""The profiler: forms, scopes, errors and stopping (SPEC 5.1 to 5.5).

Also the RELIABILITY cases about whole profiles: concurrent profiles
(CI-01), nested and repeated starts (CI-02), stopping from elsewhere (CI-03),
many tasks at once (CI-04), SIGINT (FA-06), misuse (BI-02, BI-03), and
profiles or loops that go away while work is still open (LC-04, LC-05).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import json
import logging
import random
import subprocess
import sys
import textwrap
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest

import aprof

from .conftest import sigint_as_from_a_terminal
from .tracecheck import validate_trace

USER = aprof.RecordScope.USER_SCOPE
TASK = aprof.RecordScope.TASK
STATE = aprof.DebugInfoKind.PROFILER_STATE

LOOPS = [pytest.param(asyncio.new_event_loop, id="asyncio")]
with contextlib.suppress(ImportError):
    import uvloop

    LOOPS.append(pytest.param(uvloop.new_event_loop, id="uvloop"))


def names(prof: aprof.profile | aprof.Session, scope: aprof.RecordScope = USER) -> list[str]:
    return [e.name for e in prof.events() if e.scope is scope]


def one(prof: aprof.profile, name: str) -> aprof.FunctionEvent:
    found = [e for e in prof.events() if e.name == name]
    assert len(found) == 1, f"expected one {name!r}, got {found}"
    return found[0]


def drop(objects: list[Any]) -> None:
    """Let go of the only references to ``objects`` and collect them."""
    objects.clear()
    gc.collect()


async def wait_for(backend: Any, condition: Any) -> None:
    """Yield to the loop until ``condition()`` holds (bounded by the test timeout)."""
    while not condition():
        await backend.sleep(0.001)


# ---------------------------------------------------------------------------
# 5.1: forms and options
# ---------------------------------------------------------------------------


def test_with_and_explicit_start_stop() -> None:
    # SPEC 5.1: `with`, and start()/stop() returning the profile.
    with aprof.profile() as prof:
        assert prof.running is True
        with aprof.record_function("in-with"):
            pass
    assert prof.running is False
    assert names(prof) == ["in-with"]

    prof2 = aprof.profile()
    assert prof2.running is False
    assert prof2.start() is prof2
    with aprof.record_function("in-start-stop"):
        pass
    assert prof2.stop() is prof2
    with aprof.record_function("after-stop"):
        pass
    assert names(prof2) == ["in-start-stop"]


def test_async_with_records_ranges_and_tasks(backend) -> None:
    # SPEC 5.1, 7.1: `async with`; tasks are on by default, off with tasks=False.
    async def child() -> None:
        with aprof.record_function("child"):
            await backend.checkpoint()

    async def main() -> tuple[aprof.profile, aprof.profile]:
        async with aprof.profile() as with_tasks:
            async with backend.group() as g:
                g.start_soon(child)
        async with aprof.profile(tasks=False) as without_tasks:
            async with backend.group() as g:
                g.start_soon(child)
        return with_tasks, without_tasks

    with_tasks, without_tasks = backend.run(main)
    assert names(with_tasks) == ["child"]
    assert len(names(with_tasks, TASK)) == 1
    assert names(without_tasks) == ["child"]
    assert names(without_tasks, TASK) == []


def test_options_are_keyword_only() -> None:
    # SPEC 5.1: all options are keywords.
    with pytest.raises(TypeError):
        aprof.profile(True)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"foo": 1}, TypeError, "foo"),
        ({"scope": "bogus"}, ValueError, "scope"),
        ({"scope": None}, ValueError, "scope"),
        ({"record_inputs": "yes"}, TypeError, "record_inputs"),
        ({"with_stack": 1}, TypeError, "with_stack"),
        ({"tasks": None}, TypeError, "tasks"),
    ],
)
def test_bad_options_name_the_option(kwargs: dict[str, Any], error: type[Exception], named: str) -> None:
    # SPEC 5.1, 12, BI-03: a clear error naming the option; nothing starts.
    with pytest.raises(error, match=named):
        aprof.profile(**kwargs)
    assert aprof.get_debug_info(STATE) is None
    assert not aprof.has_callbacks()


# ---------------------------------------------------------------------------
# 5.2: context scope and isolation
# ---------------------------------------------------------------------------


def test_state_slot_follows_spawned_work(backend) -> None:
    # SPEC 5.2: start pushes the state into PROFILER_STATE; tasks and
    # to_thread work spawned afterwards see the same state; stop empties it.
    seen: dict[str, Any] = {}

    async def child() -> None:
        seen["child"] = aprof.get_debug_info(STATE)

    async def main() -> None:
        seen["before"] = aprof.get_debug_info(STATE)
        async with aprof.profile():
            seen["inside"] = aprof.get_debug_info(STATE)
            async with backend.group() as g:
                g.start_soon(child)
            seen["thread"] = await backend.to_thread(aprof.get_debug_info, STATE)
        seen["after"] = aprof.get_debug_info(STATE)

    backend.run(main)
    assert seen["before"] is None
    assert seen["inside"] is not None
    assert seen["child"] is seen["inside"]
    assert seen["thread"] is seen["inside"]
    assert seen["after"] is None


def test_work_outside_the_profiled_context_is_not_recorded(backend) -> None:
    # SPEC 5.2: a sibling task started before the profile and a thread that
    # runs meanwhile record nothing, even on the same loop; work spawned from
    # the profiled context (a task, to_thread) is recorded.
    state = {"profiling": False, "done": False, "sibling": 0, "thread": 0}

    async def sibling() -> None:
        while not state["done"]:
            with aprof.record_function("sibling"):
                await backend.sleep(0.001)
            state["sibling"] += state["profiling"]

    def outside_thread() -> None:
        while not state["done"]:
            with aprof.record_function("thread"):
                pass
            state["thread"] += state["profiling"]

    async def spawned() -> None:
        with aprof.record_function("spawned"):
            await backend.checkpoint()

    def in_worker() -> None:
        with aprof.record_function("worker"):
            pass

    async def main() -> aprof.profile:
        t = threading.Thread(target=outside_thread)
        t.start()
        try:
            async with backend.group() as g:
                g.start_soon(sibling)
                await backend.sleep(0.002)
                async with aprof.profile() as prof:
                    state["profiling"] = True
                    for _ in range(5):
                        with aprof.record_function("mine"):
                            await backend.sleep(0.001)
                    async with backend.group() as inner:
                        inner.start_soon(spawned)
                    await backend.to_thread(in_worker)
                    await wait_for(backend, lambda: state["sibling"] >= 2 and state["thread"] >= 2)
                    state["profiling"] = False
                state["done"] = True
        finally:
            state["done"] = True
            t.join()
        return prof

    prof = backend.run(main)
    assert sorted(set(names(prof))) == ["mine", "spawned", "worker"]
    assert names(prof).count("mine") == 5
    assert len(names(prof, TASK)) == 1  # the spawned task, not the sibling


def test_profile_in_a_child_task_takes_its_subtree(backend, tmp_path: Path) -> None:
    # SPEC 5.2, CI-02: a profile started in a spawned task takes that task's
    # subtree; the outer profile records none of it while it runs, and gets
    # the child back after it stops.
    inner_profiles: list[aprof.profile] = []

    async def grandchild() -> None:
        with aprof.record_function("grandchild"):
            await backend.checkpoint()

    async def child() -> None:
        with aprof.record_function("child-before"):
            pass
        async with aprof.profile() as inner:
            with aprof.record_function("child-inside"):
                async with backend.group() as g:
                    g.start_soon(grandchild)
                await backend.to_thread(
                    lambda: aprof.record_function("child-thread").__enter__().__exit__(None, None, None)
                )
        inner_profiles.append(inner)
        with aprof.record_function("child-after"):
            pass

    async def main() -> aprof.profile:
        async with aprof.profile() as outer:
            with aprof.record_function("outer"):
                async with backend.group() as g:
                    g.start_soon(child)
        return outer

    outer = backend.run(main)
    (inner,) = inner_profiles
    assert sorted(names(inner)) == ["child-inside", "child-thread", "grandchild"]
    assert len(names(inner, TASK)) == 1  # the grandchild
    assert sorted(names(outer)) == ["child-after", "child-before", "outer"]
    assert len(names(outer, TASK)) == 1  # the child, spawned in outer's context
    for p, f in ((inner, "inner.json"), (outer, "outer.json")):
        p.export_chrome_trace(tmp_path / f)
        validate_trace(tmp_path / f)


def test_two_concurrent_profiles_keep_their_own_events(backend, tmp_path: Path) -> None:
    # SPEC 5.2, CI-01: two profiles in two concurrent tasks, interleaving
    # same-named ranges: each holds exactly its own events.
    repeat = 1_000
    results: dict[str, aprof.profile] = {}
    ids: dict[str, int] = {}
    spans: dict[str, tuple[int, int]] = {}

    async def helper() -> None:
        for _ in range(10):
            with aprof.record_function("same-name"):
                await backend.checkpoint()

    async def request(who: str) -> None:
        async with aprof.profile() as prof:
            ids[who] = aprof.current_thread_id()
            async with backend.group() as g:
                g.start_soon(helper)
                for _ in range(repeat):
                    with aprof.record_function("same-name"):
                        await backend.checkpoint()
        results[who] = prof

    async def main() -> None:
        async with backend.group() as g:
            g.start_soon(request, "a")
            g.start_soon(request, "b")

    backend.run(main)
    for who, other in (("a", "b"), ("b", "a")):
        prof = results[who]
        user = [e for e in prof.events() if e.scope is USER]
        assert len(user) == repeat + 10
        assert {e.name for e in user} == {"same-name"}
        own = [e for e in user if e.thread_id == ids[who]]
        assert len(own) == repeat
        assert all(e.thread_id != ids[other] for e in prof.events())
        assert len(names(prof, TASK)) == 1
        assert not any(e.unfinished or e.is_async for e in prof.events())
        spans[who] = (min(e.start_ns for e in own), max(e.end_ns for e in own))
        prof.export_chrome_trace(tmp_path / f"{who}.json")
        doc = validate_trace(tmp_path / f"{who}.json")
        assert sum(1 for e in doc["traceEvents"] if e.get("name") == "same-name") == repeat + 10
    # The two request loops really ran interleaved.
    assert spans["a"][0] < spans["b"][1]
    assert spans["b"][0] < spans["a"][1]


def test_many_tasks_each_get_exactly_their_nested_ranges(backend) -> None:
    # SPEC 6.2, CI-04: 100 tasks x 10 ranges with random sleeps: each track
    # holds exactly its task's 10 ranges, properly nested.
    rng = random.Random(1234)
    delays = [[rng.uniform(0, 0.002) for _ in range(10)] for _ in range(100)]
    ids: dict[int, int] = {}

    async def worker(i: int) -> None:
        ids[i] = aprof.current_thread_id()
        for j in range(5):
            with aprof.record_function(f"t{i}-outer{j}"):
                await backend.sleep(delays[i][2 * j])
                with aprof.record_function(f"t{i}-inner{j}"):
                    await backend.sleep(delays[i][2 * j + 1])

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                for i in range(100):
                    g.start_soon(worker, i)
        return prof

    prof = backend.run(main)
    assert len(set(ids.values())) == 100
    by_track: dict[int, list[aprof.FunctionEvent]] = {}
    for e in prof.events():
        if e.scope is USER:
            by_track.setdefault(e.thread_id, []).append(e)
    assert set(by_track) == set(ids.values())
    for i, tid in ids.items():
        evs = by_track[tid]
        assert [e.name for e in evs] == [f"t{i}-{kind}{j}" for j in range(5) for kind in ("outer", "inner")]
        assert not any(e.is_async or e.unfinished for e in evs)
        task_ev = next(e for e in prof.events() if e.scope is TASK and e.thread_id == tid)
        for j in range(5):
            outer, inner = evs[2 * j], evs[2 * j + 1]
            assert outer.parent is task_ev
            assert inner.parent is outer
            assert outer.children == [inner]
            assert outer.start_ns <= inner.start_ns <= inner.end_ns <= outer.end_ns
        for a, b in zip(evs[::2], evs[2::2], strict=False):
            assert a.end_ns <= b.start_ns


# ---------------------------------------------------------------------------
# 5.3: global scope
# ---------------------------------------------------------------------------


def test_global_scope_records_tasks_and_threads_that_existed_before(backend) -> None:
    # SPEC 5.3: every logical thread in the process, including a task and a
    # thread started before the profile.
    state = {"profiling": False, "done": False, "task": 0, "thread": 0}
    ids: dict[str, int] = {}

    async def old_task() -> None:
        ids["task"] = aprof.current_thread_id()
        while not state["done"]:
            with aprof.record_function("old-task"):
                await backend.sleep(0.001)
            state["task"] += state["profiling"]

    def old_thread() -> None:
        ids["thread"] = aprof.current_thread_id()
        while not state["done"]:
            with aprof.record_function("old-thread"):
                pass
            state["thread"] += state["profiling"]

    async def main() -> aprof.profile:
        t = threading.Thread(target=old_thread, name="old-thread")
        t.start()
        try:
            async with backend.group() as g:
                g.start_soon(old_task)
                await backend.sleep(0.002)
                async with aprof.profile(scope="global") as prof:
                    state["profiling"] = True
                    with aprof.record_function("mine"):
                        await wait_for(backend, lambda: state["task"] >= 3 and state["thread"] >= 3)
                    state["profiling"] = False
                state["done"] = True
        finally:
            state["done"] = True
            t.join()
        return prof

    prof = backend.run(main)
    evs = [e for e in prof.events() if e.scope is USER]
    assert {e.name for e in evs} == {"mine", "old-task", "old-thread"}
    assert {e.thread_id for e in evs if e.name == "old-task"} == {ids["task"]}
    assert {e.thread_id for e in evs if e.name == "old-thread"} == {ids["thread"]}
    assert {e.track for e in evs if e.name == "old-thread"} == {"old-thread"}
    assert sum(e.name == "old-task" for e in evs) >= 2
    assert sum(e.name == "old-thread" for e in evs) >= 2


# ---------------------------------------------------------------------------
# 5.4: errors, and stopping from elsewhere
# ---------------------------------------------------------------------------


def test_start_twice_raises_and_the_first_keeps_recording() -> None:
    # SPEC 5.4, CI-02: a second start in one context raises "already"; the
    # first profile is untouched and keeps recording.
    with aprof.profile() as first:
        with aprof.record_function("before"):
            pass
        second = aprof.profile()
        with pytest.raises(RuntimeError, match="already"):
            second.start()
        with pytest.raises(RuntimeError, match="already"):
            first.start()
        assert second.running is False
        with aprof.record_function("after"):
            pass
    assert names(first) == ["before", "after"]
    with pytest.raises(RuntimeError, match="not running"):
        second.stop()


def test_stop_when_not_running_raises_and_keeps_the_data() -> None:
    # SPEC 5.4, BI-02: stop() before start() and a second stop() both say
    # the profile is not running; the results stay as they were.
    prof = aprof.profile()
    with pytest.raises(RuntimeError, match="not running"):
        prof.stop()
    prof.start()
    with aprof.record_function("kept"):
        pass
    prof.stop()
    before = [(e.name, e.start_ns, e.end_ns) for e in prof.events()]
    with pytest.raises(RuntimeError, match="not running"):
        prof.stop()
    assert [(e.name, e.start_ns, e.end_ns) for e in prof.events()] == before == [("kept", before[0][1], before[0][2])]


def test_a_stopped_profile_can_start_again() -> None:
    # SPEC 5.1, 5.4: start after stop is a fresh run in the same context.
    prof = aprof.profile()
    for name in ("first-run", "second-run"):
        prof.start()
        with aprof.record_function(name):
            pass
        prof.stop()
        assert names(prof) == [name]


class Interrupt:
    """Replace ``attr`` of ``module`` with a function that raises
    KeyboardInterrupt on its first call (Ctrl-C landing there: before the
    original runs, or ``after`` it did its work) and then behaves as the
    original."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any, attr: str, after: bool = False) -> None:
        self.original = getattr(module, attr)
        self.after = after
        self.calls = 0
        monkeypatch.setattr(module, attr, self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            if self.after:
                self.original(*args, **kwargs)
            raise KeyboardInterrupt
        return self.original(*args, **kwargs)


@pytest.mark.parametrize("where", ["consolidate", "replay", "after-replay"])
@pytest.mark.parametrize("retry", ["stop", "events"])
def test_ctrl_c_during_stop_loses_nothing(monkeypatch: pytest.MonkeyPatch, where: str, retry: str) -> None:
    # SPEC 5.5, 12 (issue 15 item 18): a KeyboardInterrupt inside stop()
    # propagates, and a second stop() (or reading the results) finishes the
    # stop with every event, on_trace_ready called once, and no hook left.
    from aprof._post import _replay, _session

    ready: list[list[str]] = []

    async def child() -> None:
        with aprof.record_function("in-task"):
            await asyncio.sleep(0)

    def python_call() -> int:
        return 1

    async def main() -> aprof.profile:
        prof = aprof.profile(python_tracer="replay" in where, on_trace_ready=lambda p: ready.append(names(p)))
        prof.start()
        with aprof.record_function("outer"):
            python_call()
            await asyncio.create_task(child())
        if where == "consolidate":
            hit = Interrupt(monkeypatch, _session, "consolidate")
        else:  # the replay appends to the raw lists: a retry must not append twice
            hit = Interrupt(monkeypatch, _replay, "replay", after=where == "after-replay")
        with pytest.raises(KeyboardInterrupt):
            prof.stop()
        assert hit.calls == 1
        assert prof.running is False
        assert ready == []
        if retry == "stop":
            assert prof.stop() is prof
        evs = prof.events()
        # Finished once: a third stop() has nothing left to do.
        with pytest.raises(RuntimeError, match="not running"):
            prof.stop()
        assert sorted(e.name for e in evs if e.scope is USER) == ["in-task", "outer"]
        assert len([e for e in evs if e.scope is TASK]) == 1
        if "replay" in where:
            calls = [e for e in evs if e.scope is aprof.RecordScope.PYTHON_FUNCTION and "python_call" in e.name]
            assert len(calls) == 1
        assert not any(e.unfinished for e in evs if e.scope is USER)
        assert ready == [names(prof)]
        assert asyncio.get_running_loop().get_task_factory() is None
        return prof

    asyncio.run(main())
    assert aprof.get_debug_info(STATE) is None


STOPPERS = ["sibling-task", "to_thread", "plain-thread"]


@pytest.mark.parametrize("stopper", STOPPERS)
def test_stop_from_another_task_or_thread(backend, stopper: str, tmp_path: Path) -> None:
    # SPEC 5.4, 5.5, CI-03 (pyinstrument #139, torch #64795): a profile
    # started in one task and stopped from a sibling task, a to_thread
    # worker or a plain thread: no error or warning, complete results, and
    # the starting task records nothing more and holds no state.
    shared: dict[str, Any] = {}

    async def owner() -> None:
        prof = aprof.profile().start()
        shared["prof"] = prof
        shared["owner"] = aprof.current_thread_id()
        for i in range(3):
            with aprof.record_function(f"done-{i}"):
                await backend.checkpoint()
        with aprof.record_function("open-at-stop"):
            shared["ready"] = True
            await wait_for(backend, lambda: "stopped" in shared)
            aprof.mark("after-stop-mark")
        with aprof.record_function("after-stop"):
            await backend.checkpoint()
        shared["owner-state"] = aprof.get_debug_info(STATE)
        again = aprof.profile().start()  # the owner's context is free again
        with aprof.record_function("next-profile"):
            pass
        shared["next"] = again.stop()

    def stop_here() -> None:
        shared["stopper"] = aprof.current_thread_id()
        shared["prof"].stop()

    async def other() -> None:
        await wait_for(backend, lambda: "ready" in shared)
        if stopper == "sibling-task":
            stop_here()
        elif stopper == "to_thread":
            await backend.to_thread(stop_here)
        else:
            t = threading.Thread(target=stop_here)
            t.start()
            t.join()
        shared["stopped"] = True

    async def main() -> None:
        async with backend.group() as g:
            g.start_soon(owner)
            g.start_soon(other)

    backend.run(main)
    prof = shared["prof"]
    assert shared["stopper"] != shared["owner"]
    assert prof.running is False
    assert names(prof) == ["done-0", "done-1", "done-2", "open-at-stop"]
    assert [one(prof, f"done-{i}").unfinished for i in range(3)] == [False] * 3
    open_ev = one(prof, "open-at-stop")
    assert open_ev.unfinished is True
    assert open_ev.end_ns == prof.session.metadata["stop_ns"]
    assert shared["owner-state"] is None
    assert names(shared["next"]) == ["next-profile"]
    prof.export_chrome_trace(tmp_path / "t.json")
    validate_trace(tmp_path / "t.json")


# ---------------------------------------------------------------------------
# 5.5: unfinished ranges and late events
# ---------------------------------------------------------------------------


def test_late_events_are_dropped_and_reach_no_later_profile(backend) -> None:
    # SPEC 5.5: a task outliving its profile keeps opening and closing
    # ranges; nothing raises, the stopped profile shows what was open as
    # unfinished, and a profile started afterwards sees none of it.
    shared: dict[str, Any] = {"stopped": False}

    async def outliving() -> None:
        shared["task"] = aprof.current_thread_id()
        with aprof.record_function("open-across-stop"):
            await wait_for(backend, lambda: shared["stopped"])
            with aprof.record_function("late-inner"):
                await backend.checkpoint()
            aprof.mark("late-mark")
        with aprof.record_function("late"):
            await backend.checkpoint()
        shared["finished"] = True

    async def main() -> tuple[aprof.profile, aprof.profile]:
        async with backend.group() as g:
            async with aprof.profile() as first:
                g.start_soon(outliving)
                await wait_for(backend, lambda: "task" in shared)
            async with aprof.profile() as second:
                shared["stopped"] = True
                await wait_for(backend, lambda: "finished" in shared)
                with aprof.record_function("second-own"):
                    pass
        return first, second

    first, second = backend.run(main)
    assert names(first) == ["open-across-stop"]
    ev = one(first, "open-across-stop")
    assert ev.unfinished is True
    assert ev.thread_id == shared["task"]
    (task_ev,) = [e for e in first.events() if e.scope is TASK]
    assert task_ev.unfinished is True
    assert names(second) == ["second-own"]
    assert all(e.thread_id != shared["task"] for e in second.events())


# ---------------------------------------------------------------------------
# FA-06: SIGINT during asyncio.run
# ---------------------------------------------------------------------------

SIGINT_SCRIPT = """
import json, os, signal, sys, threading
import aprof

kind = sys.argv[1]
holder = {}

if kind == "trio":
    import trio
    sleep = trio.sleep
else:
    import asyncio
    sleep = asyncio.sleep

async def main():
    async with aprof.profile() as prof:
        holder["prof"] = prof
        with aprof.record_function("outer"):
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
            with aprof.record_function("inner"):
                await sleep(30)

try:
    if kind == "trio":
        trio.run(main)
    elif kind == "uvloop":
        import uvloop
        uvloop.run(main())
    else:
        asyncio.run(main())
except KeyboardInterrupt:
    print("KeyboardInterrupt")
else:
    print("no KeyboardInterrupt")

prof = holder["prof"]
prof.export_chrome_trace("trace.json")
print(json.dumps({
    "running": prof.running,
    "events": [[e.name, e.exception, e.unfinished] for e in prof.events() if e.scope is aprof.RecordScope.USER_SCOPE],
    "profile_hook": sys.getprofile() is None and sys.gettrace() is None,
    "callbacks": aprof.has_callbacks(),
    "state": aprof.get_debug_info(aprof.DebugInfoKind.PROFILER_STATE) is None,
}))
"""


@pytest.mark.parametrize("kind", ["asyncio", "uvloop", "trio"])
def test_sigint_during_run_stops_the_profile(kind: str, tmp_path: Path) -> None:
    # SPEC 5.5, 12, FA-06 (bpo-30679): SIGINT while main holds
    # `async with profile()`: KeyboardInterrupt reaches the caller, the
    # ranges are closed, the results are there and every hook is gone.
    script = tmp_path / "sigint.py"
    script.write_text(textwrap.dedent(SIGINT_SCRIPT))
    proc = subprocess.run(
        [sys.executable, str(script), kind],
        cwd=tmp_path, capture_output=True, text=True, timeout=30, check=False, preexec_fn=sigint_as_from_a_terminal,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    first, report = proc.stdout.strip().splitlines()
    assert first == "KeyboardInterrupt"
    result = json.loads(report)
    assert result["running"] is False
    assert [name for name, _, _ in result["events"]] == ["outer", "inner"]
    for _name, exception, unfinished in result["events"]:
        assert unfinished is False
        # asyncio cancels the main task; trio raises KeyboardInterrupt in it.
        assert exception == ("KeyboardInterrupt" if kind == "trio" else "CancelledError")
    assert result["profile_hook"] is True
    assert result["callbacks"] is False
    assert result["state"] is True
    validate_trace(tmp_path / "trace.json")
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------
# LC-04: a profile dropped without stop()
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["context", "global"])
def test_profile_dropped_without_stop(scope: str) -> None:
    # SPEC 5.5, 12, LC-04: collected while running, it stops itself: one
    # AprofWarning, no callback left, its state freed; a range still open in
    # that context ends later without error.
    def run() -> None:
        prof = aprof.profile(scope=scope).start()
        # A global profile pushes no slot: reach its state directly.
        state_ref = weakref.ref(aprof.get_debug_info(STATE) or prof._state)
        r = aprof.record_function("open").start()
        holder = [prof]
        del prof
        with pytest.warns(aprof.AprofWarning, match="without stop") as record:
            drop(holder)
        assert len([w for w in record if issubclass(w.category, aprof.AprofWarning)]) == 1
        assert state_ref() is None
        assert aprof.get_debug_info(STATE) is None
        assert not aprof.has_callbacks()
        r.end()
        with aprof.record_function("after"):
            pass
        with aprof.profile() as fresh:  # the context can profile again
            with aprof.record_function("fresh"):
                pass
        assert names(fresh) == ["fresh"]

    contextvars.copy_context().run(run)


def test_profile_dropped_in_a_task_removes_its_task_hooks(backend) -> None:
    # SPEC 5.5, 7.1, LC-04: the task hooks a dropped profile installed are
    # removed; the loop's task factory is what it was.
    seen: dict[str, Any] = {}

    def factory() -> Any:
        if backend.is_trio:
            return None
        return asyncio.get_running_loop().get_task_factory()

    async def child() -> None:
        await backend.checkpoint()

    async def main() -> None:
        seen["before"] = factory()
        prof = aprof.profile().start()
        async with backend.group() as g:
            g.start_soon(child)
        holder = [prof]
        del prof
        with pytest.warns(aprof.AprofWarning, match="without stop"):
            drop(holder)
        seen["after"] = factory()
        async with backend.group() as g:
            g.start_soon(child)
        async with aprof.profile() as fresh:
            async with backend.group() as g:
                g.start_soon(child)
        seen["fresh"] = fresh

    backend.run(main)
    assert seen["after"] is seen["before"]
    assert len(names(seen["fresh"], TASK)) == 1
    if backend.is_trio:
        from aprof._integrations import _trio

        assert _trio._installed == {}


# ---------------------------------------------------------------------------
# LC-05: the loop closes with tasks still inside ranges
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("new_loop", LOOPS)
def test_loop_closed_with_pending_tasks_in_ranges(
    new_loop: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # SPEC 5.5, LC-05: the loop closes while tasks hold open ranges: stop
    # shows them unfinished, export works after the close, and the ends
    # that arrive when the tasks are destroyed are dropped without raising.
    tasks: list[asyncio.Task[None]] = []
    ids: list[int] = []

    closed: list[int] = []

    async def worker(i: int) -> None:
        ids.append(aprof.current_thread_id())
        try:
            with aprof.record_function(f"pending-{i}"):
                await asyncio.sleep(30)
        finally:
            closed.append(i)

    async def main() -> aprof.profile:
        prof = aprof.profile().start()
        with aprof.record_function("main"):
            for i in range(3):
                tasks.append(asyncio.create_task(worker(i)))
            await asyncio.sleep(0.01)
        return prof

    loop = new_loop()
    try:
        prof = loop.run_until_complete(main())
    finally:
        loop.close()
    assert not any(t.done() for t in tasks)
    prof.stop()
    prof.export_chrome_trace(tmp_path / "t.json")
    validate_trace(tmp_path / "t.json")
    assert one(prof, "main").unfinished is False
    for i in range(3):
        ev = one(prof, f"pending-{i}")
        assert ev.unfinished is True
        assert ev.thread_id == ids[i]
    assert sum(e.unfinished for e in prof.events() if e.scope is TASK) == 3

    assert closed == []
    with aprof.profile() as later:
        drop(tasks)  # each coroutine is closed: its range's end arrives now
    assert sorted(closed) == [0, 1, 2]
    assert names(later) == []
    assert [e.name for e in prof.events() if e.scope is USER] == ["main", "pending-0", "pending-1", "pending-2"]
    # asyncio's own complaint, once per task, is the only thing logged.
    complaints = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(complaints) == 3
    assert all("destroyed but it is pending" in m for m in complaints)


def test_no_profile_option_is_a_stub() -> None:
    # SPEC 5.1, 15.5: every option profile() accepts does what it says; none
    # only raises NotImplementedError (profile_memory did, until issue 21).
    import inspect

    from aprof._core import _native

    for name, param in inspect.signature(aprof.profile).parameters.items():
        if isinstance(param.default, bool):
            if name == "profile_memory" and _native.extension is None:
                continue  # needs the extension: checked below
            prof = aprof.profile(**{name: not param.default})
            assert getattr(prof, name) is (not param.default), name
    if _native.extension is None:
        # issue 21: without the allocator hooks it says why, never a silent zero
        with pytest.raises(RuntimeError, match="profile_memory needs aprof's C extension"):
            aprof.profile(profile_memory=True)
    else:
        with aprof.profile(profile_memory=True, memory_interval=0) as prof:
            keep = bytes(100_000)
        assert prof.session.memory is not None
        assert prof.session.memory.total().allocated >= 100_000
        del keep
