"""The summary under the table: what was slow, in which task, and why
(issue 16 items 1, 7; SPEC 6.4, 7.3-7.5), on every backend."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._frames import innermost_user_frame, is_library_file, shown_stack
from aprof._post._analysis import max_step_ns
from aprof._post._readers import read_profile

from .conftest import require_c_extension


@pytest.fixture(autouse=True)
def _cheap_gc() -> Any:
    """A full collection of the whole test session's heap can hold the loop
    longer than these tests' thresholds: a real loop block, but not the one
    under test. Freezing the heap first keeps collections to new objects."""
    import gc

    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def _hog(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _tasks(prof: Any) -> dict[str, aprof.FunctionEvent]:
    return {e.extra["coro"].rsplit(".", 1)[-1]: e for e in prof.events() if e.scope is aprof.RecordScope.TASK}


def test_max_step_is_the_longest_step_of_the_group(backend) -> None:
    # SPEC 6.4, 7.3: "Max step" is the longest single step of the row's tasks
    # (a loop hog shows even without the watchdog); other rows show "-".
    async def hogger() -> None:
        await backend.sleep(0.001)
        _hog(0.03)
        await backend.sleep(0.001)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            with aprof.record_function("outer"):
                async with backend.group() as g:
                    g.start_soon(hogger)
                    g.start_soon(hogger)
        return prof

    prof = backend.run(main)
    avgs = prof.key_averages()
    row = next(r for r in avgs if r.key.startswith("task") and r.key.endswith("hogger"))
    steps = [e.extra["steps"] for e in prof.events() if e.scope is aprof.RecordScope.TASK]
    assert row.max_step_ns == max(max_step_ns(s) for s in steps)
    assert row.max_step_ns > 0.02e9
    table = avgs.table()
    header = table.splitlines()[1]
    assert header.split()[-2:] == ["Max", "step"]
    outer = next(line for line in table.splitlines() if line.startswith("outer"))
    assert outer.split()[-1] == "-"
    assert avgs.table(sort_by="max_step").splitlines()[3].startswith("task")


def _limited_to_thread(backend, fn: Any) -> Any:
    """Run ``fn`` in a worker thread, one job at a time."""
    if backend.is_anyio:
        import anyio.to_thread

        limiter = anyio.CapacityLimiter(1)
        return lambda: anyio.to_thread.run_sync(fn, limiter=limiter)
    if backend.is_trio:
        import trio

        limiter = trio.CapacityLimiter(1)
        return lambda: trio.to_thread.run_sync(fn, limiter=limiter)
    pool = ThreadPoolExecutor(1)

    async def run() -> None:
        await asyncio.get_running_loop().run_in_executor(pool, aprof.wrap(fn))

    return run


def test_queued_is_submit_to_start_of_executor_jobs(backend) -> None:
    # Issue 16 item 7, SPEC 7.4: work serialised by a one-worker pool or a
    # CapacityLimiter(1) reads as queued, in the table and in the section.
    def slow_job() -> None:
        time.sleep(0.02)

    async def main() -> aprof.profile:
        run = _limited_to_thread(backend, slow_job)
        async with aprof.profile() as prof:
            async with backend.group() as g:
                for _ in range(4):
                    g.start_soon(run)
        return prof

    prof = backend.run(main)
    jobs = [e for e in prof.events() if e.scope is aprof.RecordScope.EXECUTOR]
    assert len(jobs) == 4
    (row,) = [r for r in prof.key_averages() if r.key.startswith("executor") and r.key.endswith("slow_job")]
    assert row.queued_count == 4
    assert row.queued_ns == sum(e.start_ns - e.extra["submit_ns"] for e in jobs)
    assert "Queued" in prof.key_averages().table().splitlines()[1]
    (line,) = prof.summary().executor_queueing
    assert line.function.endswith("slow_job")
    assert line.jobs == 4
    assert line.queued_max_ns >= 0.04e9  # the last of four 20 ms jobs waited for three
    assert "queued mean" in prof.summary().render()


def test_blocks_group_by_coroutine_and_function_with_hot_frames(backend) -> None:
    # Issue 16 items 1, 7: two tasks blocking in the same function are one
    # line naming the function; the watchdog's samples put the function
    # below the task level.
    def verify_password() -> None:
        end = time.perf_counter() + 0.12
        while time.perf_counter() < end:
            pass

    async def login() -> None:
        await backend.sleep(0.005)
        verify_password()

    async def main() -> aprof.profile:
        async with aprof.profile(loop_block_threshold=0.04) as prof:
            async with backend.group() as g:
                g.start_soon(login)
                g.start_soon(login)
        return prof

    prof = backend.run(main)
    summary = prof.summary()
    assert summary.loop_block_count == 2
    (line,) = summary.loop_blocks
    assert line.count == 2
    assert line.coro is not None
    assert line.coro.endswith("login")
    assert line.culprit is not None
    assert line.culprit.endswith("verify_password")
    assert line.culprit.startswith("tests/test_summary.py:")
    assert line.stack[-1] == line.culprit  # outermost first, the culprit last
    assert all("asyncio" not in s and "trio" not in s for s in line.stack)  # the loop's frames are not the task's
    hot = summary.hot_frames[0]
    assert hot.frame.endswith("verify_password")
    assert hot.coro.endswith("login")
    assert hot.tasks == 2
    text = summary.render()
    assert "What blocked the loop: 2 steps or callbacks longer than 40.000ms" in text
    assert "verify_password" in text


def test_longest_wait_of_a_parent_is_its_slow_child(backend) -> None:
    # Issue 16 item 1: a parent waiting for its children waited on the
    # slowest one, named with its coroutine.
    async def fast() -> None:
        await backend.sleep(0.005)

    async def slow_child() -> None:
        await backend.sleep(0.15)

    async def parent() -> None:
        async with backend.group() as g:
            for _ in range(3):
                g.start_soon(fast)
            g.start_soon(slow_child)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                g.start_soon(parent)
        return prof

    prof = backend.run(main)
    waits = {w.coro.rsplit(".", 1)[-1]: w for w in prof.summary(limit=10).longest_waits}
    assert waits["parent"].kind == "task"
    assert waits["parent"].what.startswith("task ")
    assert waits["parent"].what.rstrip(")").endswith("slow_child")
    slowest = prof.summary().slowest_tasks
    assert [t.coro.rsplit(".", 1)[-1] for t in slowest[:2]] == ["parent", "slow_child"]
    for t in slowest:
        assert t.running_ns + t.waiting_ns == t.total_ns


@pytest.mark.parametrize("runner", ["asyncio", "uvloop"])
def test_an_executor_job_submitted_early_in_a_long_step_is_what_the_wait_was_on(runner: str) -> None:
    # Issue 16 item 3: once an executor job's future is done it no longer
    # says what it was, so the summary looks for the job the task submitted.
    # The job is found when it was submitted anywhere in the step before
    # the wait, here 20 ms before that step ended (a thread pool starting a
    # worker can take that long), not only just before the wait.
    def render() -> None:
        time.sleep(0.03)

    async def handle() -> None:
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(None, aprof.wrap(render))
        time.sleep(0.02)  # the step goes on after the submit
        await job

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            await asyncio.get_running_loop().create_task(handle())
        return prof

    if runner == "uvloop":
        import uvloop

        prof = uvloop.run(main())
    else:
        prof = asyncio.run(main())
    waits = {w.coro.rsplit(".", 1)[-1]: w for w in prof.summary(limit=10).longest_waits}
    wait = waits["handle"]
    assert wait.kind == "executor", wait
    assert wait.what.startswith("executor job "), wait
    assert wait.what.endswith(".render"), wait


def test_tasks_still_pending_when_the_profile_stops(backend) -> None:
    # Issue 16 item 7: tasks that had not finished are counted, grouped by coroutine.
    async def deliver(release: Any) -> None:
        await release.wait()

    async def main() -> aprof.profile:
        release = _event(backend)
        prof = aprof.profile()
        async with backend.group() as g:
            prof.start()
            for _ in range(5):
                g.start_soon(deliver, release)
            await backend.sleep(0.01)
            prof.stop()
            release.set()
        return prof

    prof = backend.run(main)
    summary = prof.summary()
    assert summary.pending_count == 5
    (line,) = summary.pending
    assert line.coro.endswith("deliver")
    assert line.count == 5
    assert "Tasks pending at exit: 5" in summary.render()


def _event(backend) -> Any:
    if backend.is_anyio:
        import anyio

        return anyio.Event()
    if backend.is_trio:
        import trio

        return trio.Event()
    return asyncio.Event()


def test_sequential_same_named_ranges_are_an_n_plus_one(backend) -> None:
    # Issue 16 item 7: one task awaiting the same thing again and again.
    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                g.start_soon(recent_orders)
        return prof

    async def recent_orders() -> None:
        with aprof.record_function("recent_orders"):
            for _ in range(12):
                with aprof.record_function("Database.fetch"):
                    await backend.sleep(0.001)

    prof = backend.run(main)
    (line,) = prof.summary().repeated_awaits
    assert (line.count, line.what, line.where) == (12, "Database.fetch", "recent_orders")
    assert "12  sequential awaits of Database.fetch in recent_orders" in prof.summary().render()


def test_per_wait_records_are_read(backend) -> None:
    # Issue 16 item 3: the documented per-wait record (a TASK event's
    # extra["waits"], written by the step hook) names what a task waited on
    # longest and its N+1 runs.
    async def worker() -> None:
        await backend.sleep(0.002)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                g.start_soon(worker)
        return prof

    prof = backend.run(main)
    (task,) = [e for e in prof.events() if e.scope is aprof.RecordScope.TASK]
    t0 = task.start_ns
    task.extra["waits"] = [
        [t0, t0 + 360 * 3_000_000, 360, 360 * 2_000_000, 2_500_000, "asyncio.sleep", "sleep", "db.py:9 Database.fetch", "orders.py:4 recent_orders"],
        [t0, t0 + 90_000_000, 1, 80_000_000, 80_000_000, "asyncio.Lock.acquire", "lock", "orders.py:12 save", ""],
    ]
    summary = prof.session.summary()
    (wait,) = summary.longest_waits
    assert (wait.what, wait.kind, wait.where, wait.duration_ns) == ("asyncio.Lock.acquire", "lock", "orders.py:12 save", 80_000_000)
    (rep,) = summary.repeated_awaits
    assert (rep.count, rep.what, rep.where) == (360, "asyncio.sleep", "Database.fetch, called from recent_orders")


@pytest.mark.parametrize("fmt", [".aprof", ".json", ".html"])
def test_the_summary_reads_the_same_from_every_format(tmp_path: Path, fmt: str) -> None:
    # SPEC 6.5, 10.1: `aprof report` on a saved file says what the run said.
    def job() -> None:
        time.sleep(0.01)

    async def child() -> None:
        await asyncio.sleep(0.01)
        _hog(0.08)

    async def main() -> aprof.profile:
        pool = ThreadPoolExecutor(1)
        loop = asyncio.get_running_loop()
        async with aprof.profile(loop_block_threshold=0.04) as prof:
            await asyncio.gather(
                asyncio.create_task(child(), name="kid"), *(loop.run_in_executor(pool, aprof.wrap(job)) for _ in range(3))
            )
        pool.shutdown()
        return prof

    prof = asyncio.run(main())
    path = tmp_path / f"t{fmt}"
    if fmt == ".aprof":
        prof.save(path)
    elif fmt == ".json":
        prof.export_chrome_trace(path)
    else:
        prof.export_html(path)
    again = read_profile(str(path)).summary()
    assert again.render() == prof.summary().render()
    assert again.loop_blocks == prof.summary().loop_blocks


def test_summary_limit_is_checked() -> None:
    with aprof.profile() as prof:
        pass
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="summary: limit"):
            prof.summary(limit=bad)  # type: ignore[arg-type]
    assert prof.summary().render() == ""


def test_library_frames_are_told_from_the_users() -> None:
    import json as stdlib_json

    import trio as installed

    assert is_library_file(stdlib_json.__file__)
    assert is_library_file(installed.__file__)
    assert is_library_file(aprof.__file__)
    assert is_library_file("<frozen importlib._bootstrap>")
    assert not is_library_file(__file__)
    stack = [
        (stdlib_json.__file__, 10, "loads"),
        (__file__, 20, "parse"),
        (__file__, 30, "handler"),
        (asyncio.__file__, 40, "run"),
        (threading.__file__, 41, "start"),
    ]
    assert innermost_user_frame(stack) == (__file__, 20, "parse")
    assert shown_stack(stack) == [
        "... 2 library frames (threading, __init__)",
        "tests/test_summary.py:30 handler",
        "tests/test_summary.py:20 parse",
        "-> json/__init__.py:10 loads",
    ]


def test_user_site_is_the_nearest_frame_of_the_users_code() -> None:
    # Issue 16 item 1: a spawn or submit hook names the user's line past the
    # library frames between it and the user's call (asyncio.create_task ...).
    from aprof._frames import user_site

    namespace: dict[str, Any] = {"user_site": user_site}
    library = compile("def create_task():\n    return user_site()\n", asyncio.__file__, "exec")
    exec(library, namespace)  # a function that lives in asyncio's file

    def spawner() -> Any:
        return namespace["create_task"]()

    site = spawner()
    assert site is not None
    assert site[0] == __file__
    assert site[2].endswith("spawner")


def test_the_c_spawn_site_walk_finds_the_same_frame_as_the_python_one() -> None:
    # TaskThread takes its spawn site with the C walk when the extension is
    # built: past the same library frames, to the same (file, line, function).
    from aprof._frames import _library_cache, is_library_cached, user_site

    ext = require_c_extension()
    namespace: dict[str, Any] = {
        "user_site": user_site, "c_user_site": ext.user_site, "cache": _library_cache, "is_library": is_library_cached,
    }  # fmt: skip
    library = compile(
        "def create_task():\n    return user_site(), c_user_site(cache, is_library)\n", asyncio.__file__, "exec"
    )
    exec(library, namespace)

    def spawner() -> Any:
        return namespace["create_task"]()  # one line: the same line for both

    py_site, c_site = spawner()
    assert py_site is not None
    assert py_site[2].endswith("spawner")
    assert c_site == py_site
    _library_cache.clear()  # a name not cached yet is decided (and cached) through is_library
    assert spawner()[1] == py_site
    assert _library_cache[asyncio.__file__] is True

    def two_spawns() -> list[Any]:
        first = [namespace["create_task"]() for _ in range(2)]
        second = namespace["create_task"]()
        return [*first, second]

    # Sites are cached by (code, instruction): the same line twice, then the next one.
    (py1, c1), (py2, c2), (py3, c3) = two_spawns()
    assert py1 == c1 == py2 == c2
    assert py3 == c3
    assert c3[1] == c1[1] + 1, (c1, c3)


def test_spawn_sites_and_waits_read_from_the_task_records() -> None:
    # Issue 16 items 1, 7: a recorded spawn site and what a pending task
    # waits on (extra["spawn_site"], extra["waiting_on"]) are shown.
    async def deliver(ev: asyncio.Event) -> None:
        await ev.wait()

    async def main() -> aprof.profile:
        ev = asyncio.Event()
        prof = aprof.profile()
        prof.start()
        tasks = [asyncio.create_task(deliver(ev)) for _ in range(3)]
        await asyncio.sleep(0.01)
        prof.stop()
        ev.set()
        await asyncio.gather(*tasks)
        return prof

    prof = asyncio.run(main())
    for e in prof.events():
        if e.scope is aprof.RecordScope.TASK:
            e.extra["spawn_site"] = ["/srv/app/bus.py", 40, "EventBus.publish"]
            e.extra["waiting_on"] = ["asyncio.Queue.put", "queue", "app/bus.py:52 EventBus._deliver", ""]
    summary = prof.session.summary()
    (line,) = summary.pending
    assert (line.count, line.spawned_at, line.waiting_on) == (3, "app/bus.py:40 EventBus.publish", "asyncio.Queue.put at app/bus.py:52 EventBus._deliver")
    assert summary.slowest_tasks[0].spawned_at == "app/bus.py:40 EventBus.publish"
    assert "3  " in summary.render()
